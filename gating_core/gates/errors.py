"""Errors of gates and gate trees."""

from __future__ import annotations

from pathlib import Path

from gating_core.errors import GatingCoreError


class GateError(GatingCoreError, ValueError):
    """A gate or gate tree is invalid (bad geometry, unknown parent, duplicate name, ...)."""


class GateImportError(GatingCoreError, ValueError):
    """A FlowJo workspace or GatingML file could not be applied. ``str()`` names the file."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{Path(self.path).name}: {problem}")
