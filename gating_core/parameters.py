"""What an estimator's parameters may hold, checked once when it is fitted.

An estimator declares ``_parameter_constraints``: parameter name -> list of constraints, any of
which the value may satisfy (as scikit-learn's estimators declare theirs). :func:`validate_parameters`
checks every declared parameter of ``get_params(deep=False)`` and raises one ``ValueError`` that
names the parameter, what it may be and what it got::

    adaptive_weight must be 'auto' or a number within [0, 1], got 1.5

Constraints are small objects with ``accepts(value)`` and ``describe()``: :class:`Options`
(given values), :class:`Interval` (numbers in a range; booleans are never numbers here),
:class:`InstanceOf` (a type) and the constants :data:`BOOLEAN` and :data:`NONE`.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["BOOLEAN", "NONE", "InstanceOf", "Interval", "Options", "validate_parameters"]


class Options:
    """One of the given values (compared with ``==``; strings are not matched case-insensitively)."""

    def __init__(self, *values):
        self.values = values

    def accepts(self, value) -> bool:
        return isinstance(value, (str, type(None), bool, numbers.Number)) and any(
            type(value) is type(v) and value == v for v in self.values)

    def describe(self) -> str:
        if len(self.values) == 1:
            return repr(self.values[0])
        return "one of (" + ", ".join(repr(v) for v in self.values) + ")"


class Interval:
    """A number of ``kind`` (``numbers.Integral`` or ``numbers.Real``) between ``low`` and
    ``high`` (None: unbounded), each end included or not as ``closed`` says: "both", "left",
    "right" or "neither". NaN is never within an interval."""

    def __init__(self, kind, low=None, high=None, closed="both"):
        if closed not in ("both", "left", "right", "neither"):
            raise ValueError(f"closed must be 'both', 'left', 'right' or 'neither', got {closed!r}")
        self.kind, self.low, self.high, self.closed = kind, low, high, closed

    def accepts(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, self.kind):
            return False
        value = float(value)
        if math.isnan(value):
            return False
        if self.low is not None:
            if value < self.low or (value == self.low and self.closed in ("right", "neither")):
                return False
        if self.high is not None:
            if value > self.high or (value == self.high and self.closed in ("left", "neither")):
                return False
        return True

    def describe(self) -> str:
        noun = "an integer" if self.kind is numbers.Integral else "a number"
        if self.low is not None and self.high is not None:
            left = "[" if self.closed in ("both", "left") else "("
            right = "]" if self.closed in ("both", "right") else ")"
            return f"{noun} within {left}{_number(self.low)}, {_number(self.high)}{right}"
        if self.low is not None:
            return f"{noun} {'>=' if self.closed in ('both', 'left') else '>'} {_number(self.low)}"
        if self.high is not None:
            return f"{noun} {'<=' if self.closed in ('both', 'right') else '<'} {_number(self.high)}"
        return noun


class InstanceOf:
    """An instance of ``kind`` (a type or a tuple of types), described as ``description``."""

    def __init__(self, kind, description: str):
        self.kind, self.description = kind, description

    def accepts(self, value) -> bool:
        return isinstance(value, self.kind)

    def describe(self) -> str:
        return self.description


class _Boolean:
    def accepts(self, value) -> bool:
        return isinstance(value, (bool, np.bool_))

    def describe(self) -> str:
        return "True or False"


class _None:
    def accepts(self, value) -> bool:
        return value is None

    def describe(self) -> str:
        return "None"


BOOLEAN = _Boolean()
NONE = _None()


def _number(x) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def validate_parameters(estimator) -> None:
    """Raise ``ValueError`` for the first parameter of ``estimator`` (in the order of
    ``_parameter_constraints``) that none of its constraints accepts."""
    params = estimator.get_params(deep=False)
    for name, constraints in estimator._parameter_constraints.items():
        value = params[name]
        if not any(c.accepts(value) for c in constraints):
            described = [c.describe() for c in constraints]
            allowed = described[0] if len(described) == 1 else ", ".join(described[:-1]) + " or " + described[-1]
            raise ValueError(f"{name} must be {allowed}, got {value!r}")
