"""Every --json output is one valid JSON document: NaN and infinities as null, numpy values as numbers."""

import json
import math

import numpy as np

from gating_core.commands import json_safe, print_json


def test_print_json_writes_valid_json_for_nan_infinity_and_numpy_values(capsys):
    document = {"accuracy": float("nan"), "novelty": np.float64(np.inf), "counts": {"T": np.int64(3)},
                "confidence": np.array([0.5, np.nan], dtype=np.float32), "names": ("a", "b"), 7: -math.inf}
    print_json(document)
    text = capsys.readouterr().out
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"accuracy": None, "novelty": None, "counts": {"T": 3}, "confidence": [0.5, None],
                                "names": ["a", "b"], "7": None}


def test_json_safe_keeps_finite_values_as_they_are():
    assert json_safe({"x": 1.25, "ok": True, "none": None, "text": "é"}) == {"x": 1.25, "ok": True, "none": None,
                                                                             "text": "é"}
