"""The model file's JSON description read without trusting it: :func:`parse_json` (at most
``MAX_META_CHARS`` characters nested ``MAX_JSON_DEPTH`` deep, NaN refused), :class:`Fields`
(typed access to one object of it) and :func:`check_scalar` (a value no specific rule covers).

Explicit type checks, so no malformed value reaches the model as a ``TypeError`` or
``RecursionError`` later; every problem is a :class:`~gating_core.errors.ModelFileError` naming
the file.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from gating_core.errors import ModelFileError
from gating_core.model.file_checks import MAX_JSON_DEPTH, MAX_META_CHARS

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def read_description(path, arrays: dict, tag: str, newest: int, not_ours: str) -> dict:
    """The description (``arrays["meta"]``, popped) of a model file of format ``tag``, checked:
    ``not_ours`` when it is missing or of another format, and a version the reader knows (1 to
    ``newest``)."""
    if "meta" not in arrays:
        raise ModelFileError(path, "not a gating model file (no model description inside)")
    meta = parse_json(path, str(arrays.pop("meta")))
    if meta.get("format") != tag:
        raise ModelFileError(path, not_ours)
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ModelFileError(path, f"model description: format_version must be a positive integer, got {version!r}"[:200])
    if version > newest:
        raise ModelFileError(path, f"written by a newer gating_core (format {version}); upgrade to read it")
    return meta


def parse_json(path, text: str) -> dict:
    """The model description: a JSON object of at most MAX_META_CHARS characters and
    MAX_JSON_DEPTH levels; NaN is refused (Infinity is allowed: a threshold may be infinite)."""
    if len(text) > MAX_META_CHARS:
        raise ModelFileError(path, f"model description is {len(text):,} characters long (at most {MAX_META_CHARS:,})")
    skeleton = np.frombuffer(_STRING.sub("", text).encode("utf-8", "replace"), dtype=np.uint8)
    depth = np.cumsum((skeleton == ord("[")) | (skeleton == ord("{")), dtype=np.int64) \
        - np.cumsum((skeleton == ord("]")) | (skeleton == ord("}")), dtype=np.int64)
    if depth.size and int(depth.max()) > MAX_JSON_DEPTH:
        raise ModelFileError(path, f"model description is nested {int(depth.max())} levels deep (at most {MAX_JSON_DEPTH})")

    def constant(name):
        if name == "Infinity":
            return math.inf
        raise ValueError(f"{name} is not allowed")

    try:
        meta = json.loads(text, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        raise ModelFileError(path, f"not a gating model file (its description is not valid JSON: {str(exc)[:200]})") from None
    if not isinstance(meta, dict):
        raise ModelFileError(path, "not a gating model file (its description is not a JSON object)")
    return meta


class Fields:
    """Typed access to one JSON object of the description; every failure is a ModelFileError.

    ``where`` names the object in messages (``"fitted"``, ``"transform.params[2]"``).
    """

    def __init__(self, path, data, where: str):
        if not isinstance(data, dict):
            raise ModelFileError(path, f"model description: {where} must be an object, got {_kind(data)}")
        self.path, self.data, self.where = path, data, where

    def _fail(self, key, expected, value):
        raise ModelFileError(self.path, f"model description: {self.where}.{key} must be {expected}, got {_short(value)}")

    def has(self, key) -> bool:
        return key in self.data

    def raw(self, key, default=None):
        return self.data.get(key, default)

    def _get(self, key, optional):
        if key not in self.data:
            if optional:
                return None, False
            raise ModelFileError(self.path, f"model description lacks {self.where}.{key}")
        return self.data[key], True

    def object(self, key, optional=False) -> "Fields | None":
        value, found = self._get(key, optional)
        return Fields(self.path, value, f"{self.where}.{key}") if found else None

    def string(self, key, choices=None, optional=False):
        value, found = self._get(key, optional)
        if not found:
            return None
        if not isinstance(value, str) or (choices is not None and value not in choices):
            self._fail(key, f"one of {list(choices)}" if choices is not None else "text", value)
        return value

    def boolean(self, key, optional=False):
        value, found = self._get(key, optional)
        if found and not isinstance(value, bool):
            self._fail(key, "true or false", value)
        return value

    def integer(self, key, minimum=None, maximum=None, optional=False, nullable=False):
        value, found = self._get(key, optional)
        if not found or (nullable and value is None):
            return None
        if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum) \
                or (maximum is not None and value > maximum):
            self._fail(key, f"an integer in [{minimum}, {maximum}]", value)
        return value

    def number(self, key, positive=False, allow_inf=False, optional=False, nullable=False, within=None):
        """A JSON number; ``within=(lo, hi)``: also lo <= value <= hi (e.g. representable in float32)."""
        value, found = self._get(key, optional)
        if not found or (nullable and value is None):
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value) \
            and (allow_inf or math.isfinite(value)) and (not positive or value > 0) \
            and (within is None or within[0] <= value <= within[1])
        if not ok:
            expected = ("a positive" if positive else "a") + (" " if allow_inf else " finite ") + "number"
            self._fail(key, expected + (f" in [{within[0]:g}, {within[1]:g}]" if within else ""), value)
        return float(value)

    def strings(self, key, min_length=0, unique=False, optional=False, nullable=False):
        value, found = self._get(key, optional)
        if not found or (nullable and value is None):
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) < min_length:
            self._fail(key, f"a list of at least {min_length} text value(s)", value)
        if unique and len(set(value)) != len(value):
            self._fail(key, "a list of distinct names", value)
        return list(value)


def check_scalar(path, where: str, value) -> None:
    """A hyperparameter this reader has no specific rule for: a JSON scalar or a flat list of them."""
    def scalar(v):
        return v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v))

    if not (scalar(value) or (isinstance(value, list) and all(scalar(v) for v in value))):
        raise ModelFileError(path, f"model description: {where} must be a number, text, true/false or null, "
                                   f"got {_short(value)}")


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return f"{_kind(value)} {text[:60]}{'...' if len(text) > 60 else ''}"
