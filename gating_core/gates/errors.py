"""Errors of gates and gate trees: :class:`GateError` and :class:`GateImportError`, defined with
every other error in :mod:`gating_core.errors` and importable from here and from
:mod:`gating_core.gates`."""

from __future__ import annotations

from gating_core.errors import GateError, GateImportError

__all__ = ["GateError", "GateImportError"]
