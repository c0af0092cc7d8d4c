"""Undo for the Gate page: snapshots of a patient's gate tree (a session's state, not the library's)."""

from __future__ import annotations

from gating_core.gates import GateError, GateTree


class GateHistory:
    """Undo stack of gate-tree snapshots (JSON dicts, so snapshots never alias)."""

    def __init__(self, limit: int = 50):
        self.limit = limit
        self._snapshots: list[dict] = []

    def push(self, tree: GateTree) -> None:
        self._snapshots.append(tree.to_dict())
        del self._snapshots[:-self.limit]

    def can_undo(self) -> bool:
        return bool(self._snapshots)

    def undo(self) -> GateTree:
        if not self._snapshots:
            raise GateError("nothing to undo")
        return GateTree.from_dict(self._snapshots.pop())
