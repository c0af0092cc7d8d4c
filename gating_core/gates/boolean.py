"""The boolean gate: AND / OR of two or more gates' populations, or NOT of one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gating_core.gates.base import Gate
from gating_core.gates.errors import GateError

BOOLEAN_OPERATORS = ("and", "or", "not")


@dataclass(kw_only=True)
class BooleanGate(Gate):
    """A population computed from other gates' populations, then restricted to the parent.

    Parameters
    ----------
    operator : {"and", "or", "not"}
        "not" takes one operand, "and" / "or" at least two (case does not matter).
    operands : list of str
        Names of gates of the same tree, each meaning its population (the gate and all its
        ancestors).
    """

    operator: str
    operands: list

    kind = "boolean"

    def __post_init__(self):
        super().__post_init__()
        self.operator = str(self.operator or "").lower()
        if self.operator not in BOOLEAN_OPERATORS:
            raise GateError(f"gate {self.name!r}: boolean operator must be one of {BOOLEAN_OPERATORS}, "
                            f"got {self.operator!r}")
        if isinstance(self.operands, str) or not isinstance(self.operands, (list, tuple)):
            raise GateError(f"gate {self.name!r}: a boolean gate needs a list of operand gate names")
        self.operands = [str(o) for o in self.operands]
        if len(set(self.operands)) != len(self.operands):
            raise GateError(f"gate {self.name!r}: an operand is named twice")
        if self.operator == "not" and len(self.operands) != 1:
            raise GateError(f"gate {self.name!r}: NOT takes exactly one gate, got {len(self.operands)}")
        if self.operator != "not" and len(self.operands) < 2:
            raise GateError(f"gate {self.name!r}: {self.operator.upper()} needs at least two gates")
        if self.name in self.operands:
            raise GateError(f"gate {self.name!r}: a boolean gate cannot refer to itself")

    @property
    def references(self) -> tuple:
        return tuple(self.operands)

    def rename_reference(self, old: str, new: str) -> None:
        super().rename_reference(old, new)
        self.operands = [new if o == old else o for o in self.operands]

    def combine(self, populations: dict) -> np.ndarray:
        operands = [np.asarray(populations[o], dtype=bool) for o in self.operands]
        if self.operator == "not":
            return ~operands[0]
        reduce = np.logical_and.reduce if self.operator == "and" else np.logical_or.reduce
        return np.array(reduce(operands), dtype=bool)

    def events_inside(self, sample, memberships: dict) -> np.ndarray:
        try:
            return self.combine(memberships)
        except KeyError as exc:
            raise GateError(f"gate {self.name!r}: gate {exc} must come before it") from None

    def describe(self, channel_name=str) -> str:
        if self.operator == "not":
            return f"NOT {self.operands[0]}"
        return f" {self.operator.upper()} ".join(self.operands)

    def drawing(self, x_scale=None, y_scale=None) -> None:
        return None  # no axes: its cells show on its operands' plots (back-gating)

    def flowkit_gate(self, writer):
        """A GatingML BooleanGate referring to its operands by path."""
        from flowkit import gates as fk_gates

        return fk_gates.BooleanGate(writer.gate_id(self.name), self.operator,
                                    [writer.reference(o) for o in self.operands])

    def to_dict(self) -> dict:
        return self._stored(operator=self.operator, operands=list(self.operands))

    @classmethod
    def from_fields(cls, fields: dict) -> "BooleanGate":
        if fields.get("vertices") not in ([], (), None):
            raise GateError(f"gate {fields['name']!r}: a boolean gate has no vertices")
        return cls(name=fields["name"], operator=fields.get("operator"), operands=fields.get("operands"),
                   parent=fields.get("parent"))


def boolean_gate(name, operator, operands, parent=None) -> BooleanGate:
    """A boolean gate: "and" / "or" of two or more gates' populations, or "not" of one."""
    return BooleanGate(name=name, operator=operator, operands=list(operands), parent=parent)
