"""Gate trees: nested gates, their memberships, labels and statistics; the undo history."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np

from gating_core.gates.base import OTHER, Gate
from gating_core.gates.errors import GateError
from gating_core.gates.quadrant import QuadrantGate
from gating_core.gates.scales import AxisScale


class GateTree:
    """An ordered set of nested gates. Parents always come before their children.

    Examples
    --------
    >>> tree = GateTree()
    >>> tree.add(rectangle_gate("Lymphocytes", "FSC-A", "SSC-A", (0, 5e4), (0, 3e4)))
    >>> tree.add(polygon_gate("T cells", "CD3", "CD19", [(2, 0), (6, 0), (6, 1.5)], parent="Lymphocytes"))
    >>> labels = tree.labels(sample)   # "T cells" or "other" per event
    """

    def __init__(self, gates=None):
        self._gates: list[Gate] = []
        for gate in gates or []:
            self.add(gate)

    # structure -------------------------------------------------------------------------
    @property
    def gates(self) -> list[Gate]:
        return list(self._gates)

    @property
    def names(self) -> list[str]:
        return [g.name for g in self._gates]

    def __len__(self) -> int:
        return len(self._gates)

    def __contains__(self, name) -> bool:
        return any(g.name == name for g in self._gates)

    def __getitem__(self, name: str) -> Gate:
        for gate in self._gates:
            if gate.name == name:
                return gate
        raise KeyError(name)

    def children(self, name: str | None) -> list[Gate]:
        return [g for g in self._gates if g.parent == name]

    def leaves(self) -> list[Gate]:
        parents = {g.parent for g in self._gates}
        return [g for g in self._gates if g.name not in parents]

    def depth(self, name: str) -> int:
        depth, gate = 0, self[name]
        while gate.parent is not None:
            depth, gate = depth + 1, self[gate.parent]
        return depth

    def descendants(self, name: str) -> list[str]:
        out, frontier = [], [name]
        while frontier:
            current = frontier.pop()
            for child in self.children(current):
                out.append(child.name)
                frontier.append(child.name)
        return out

    def depth_first(self) -> list[Gate]:
        """The gates in depth-first order (each gate followed by everything nested in it,
        siblings in the order they were added): the order a lab reads a hierarchy in. The
        stored order (:attr:`gates`) stays the order gates were added, which memberships are
        evaluated in: a boolean gate may use a gate of a later branch."""
        order: list[Gate] = []

        def visit(parent):
            for child in self.children(parent):
                order.append(child)
                visit(child.name)

        visit(None)
        return order

    def add(self, gate: Gate) -> None:
        """Add a gate. Raises GateError for a duplicate name or an unknown parent."""
        if not isinstance(gate, Gate):
            raise GateError(f"expected a Gate, got {type(gate).__name__}")
        if gate.name in self:
            raise GateError(f"a gate named {gate.name!r} already exists")
        if gate.parent is not None and gate.parent not in self:
            raise GateError(f"gate {gate.name!r}: parent gate {gate.parent!r} does not exist")
        unknown = [o for o in gate.references if o not in self]
        if unknown:
            raise GateError(f"gate {gate.name!r}: no gate named {', '.join(map(repr, unknown))} to combine")
        self._gates.append(gate)

    def removal(self, name: str) -> list[str]:
        """The gates :meth:`remove` would delete with ``name``, in tree order: the gate, the
        gates nested inside it, and every boolean gate built on one of those (with its own
        nested gates), which would otherwise refer to a population that no longer exists."""
        if name not in self:
            raise GateError(f"no gate named {name!r}")
        doomed = {name}
        changed = True
        while changed:
            changed = False
            for gate in self._gates:  # parents and operands precede the gates that use them
                if gate.name not in doomed and (gate.parent in doomed or doomed & set(gate.references)):
                    doomed.add(gate.name)
                    changed = True
        return [g.name for g in self._gates if g.name in doomed]

    def remove(self, name: str) -> list[str]:
        """Delete a gate, all gates nested inside it and the boolean gates built on them;
        returns the deleted names (tree order, see :meth:`removal`)."""
        doomed = self.removal(name)
        self._gates = [g for g in self._gates if g.name not in set(doomed)]
        return doomed

    def quadrant_set(self, name: str) -> list[str]:
        """Names of the quadrant gates split at the same point as quadrant gate ``name``
        (same parent, channels, scales and point), itself included, in tree order."""
        if not isinstance(self[name], QuadrantGate):
            raise GateError(f"gate {name!r} is not a quadrant gate")
        return self.sharing_geometry(name)

    def sharing_geometry(self, name: str) -> list[str]:
        """Names of the gates drawn and moved with gate ``name``, itself included, in tree order:
        the four quadrants of a split, or the gate alone."""
        gate = self[name]
        return [g.name for g in self._gates if g is gate or gate.shares_geometry_with(g)]

    def rename(self, old: str, new: str) -> None:
        if old not in self:
            raise GateError(f"no gate named {old!r}")
        if new != old and new in self:
            raise GateError(f"a gate named {new!r} already exists")
        gate = self[old]
        replacement = dataclasses.replace(gate, name=new)  # re-validates the new name
        self._gates = [replacement if g.name == old else g for g in self._gates]
        for g in self._gates:
            g.rename_reference(old, replacement.name)

    def replace_geometry(self, name: str, vertices, kind: str | None = None, x_scale: AxisScale | None = None,
                         y_scale: AxisScale | None = None) -> None:
        """Adjust one gate's shape (used after copying a tree to another patient). ``vertices``
        are in the display coordinates of ``x_scale`` / ``y_scale`` (default: the gate's own),
        which the gate keeps from then on; ``kind`` makes it a gate of another type (a rectangle
        with a moved corner is a polygon).

        The gates drawn with it move with it (one split point serves a quadrant's four
        populations) and keep their own type.
        """
        members = self.sharing_geometry(name)
        if len(members) > 1:
            kind = None
        self._gates = [g.reshaped(list(vertices), kind, x_scale, y_scale) if g.name in members else g
                       for g in self._gates]

    def copy(self) -> "GateTree":
        return GateTree(copy.deepcopy(self._gates))

    # evaluation ------------------------------------------------------------------------
    def memberships(self, sample) -> dict[str, np.ndarray]:
        """Gate name -> boolean mask (n_events,) of events in the gate AND all its ancestors."""
        masks: dict[str, np.ndarray] = {}
        for gate in self._gates:  # parents and operands precede the gates that use them
            masks[gate.name] = gate_membership(gate, sample, masks)
        return masks

    def labels(self, sample, memberships=None) -> np.ndarray:
        """Per-event training labels: the leaf gate each event falls in, else ``"other"``.

        Where sibling leaves overlap, the leaf added first wins, so labels stay deterministic.
        Returns an object ndarray of str, shape (n_events,).
        """
        masks = memberships if memberships is not None else self.memberships(sample)
        labels = np.full(sample.n_events, OTHER, dtype=object)
        assigned = np.zeros(sample.n_events, dtype=bool)
        for leaf in self.leaves():
            take = masks[leaf.name] & ~assigned
            labels[take] = leaf.name
            assigned |= take
        return labels

    def statistics(self, sample, memberships=None, channel_label=None):
        """DataFrame: gate, parent, depth, axes, count, % of parent, % of total, one row per gate,
        in depth-first order.

        ``channel_label(sample, pnn)`` names the channels in ``axes`` (default: the $PnN).
        """
        import pandas as pd

        name_of = (lambda ch: channel_label(sample, ch)) if channel_label is not None else str
        masks = memberships if memberships is not None else self.memberships(sample)
        total = sample.n_events
        rows = []
        for gate in self.depth_first():
            count = int(masks[gate.name].sum())
            parent_count = total if gate.parent is None else int(masks[gate.parent].sum())
            rows.append({
                "gate": gate.name,
                "parent": gate.parent or "(all events)",
                "depth": self.depth(gate.name),
                "axes": gate.describe(name_of),
                "count": count,
                "% of parent": 100.0 * count / parent_count if parent_count else 0.0,
                "% of total": 100.0 * count / total if total else 0.0,
            })
        return pd.DataFrame(rows, columns=["gate", "parent", "depth", "axes", "count", "% of parent", "% of total"])

    def check_channels(self, sample) -> list[str]:
        """Names of channels the tree needs that the sample lacks (empty when it fits)."""
        missing = []
        for gate in self._gates:
            for ch in gate.channels:
                try:
                    sample.channel_index(ch)
                except KeyError:
                    if ch not in missing:
                        missing.append(ch)
        return missing

    # serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": "gating_core.gate_tree", "version": 1, "gates": [g.to_dict() for g in self._gates]}

    @classmethod
    def from_dict(cls, data: dict) -> "GateTree":
        if not isinstance(data, dict) or not isinstance(data.get("gates"), list):
            raise GateError("not a gate tree: expected an object with a 'gates' list")
        return cls([Gate.from_dict(g) for g in data["gates"]])

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "GateTree":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GateError(f"gate tree is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def __eq__(self, other) -> bool:
        return isinstance(other, GateTree) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"GateTree({self.names})"


def gate_membership(gate: Gate, sample, masks: dict) -> np.ndarray:
    """Boolean mask (n_events,) of the events in ``gate`` and all its ancestors, given the
    memberships ``masks`` of the gates before it (its parent and, for a boolean gate, its
    operands)."""
    inside = gate.events_inside(sample, masks)
    if gate.parent is not None:
        inside &= masks[gate.parent]
    return inside
