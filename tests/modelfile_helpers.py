"""What the model-file tests share: writing a saved model's arrays back with a changed description."""

from __future__ import annotations

import json

import numpy as np


def rewrite_model_file(arrays: dict, out, meta: dict, drop=()):
    """Write ``arrays`` (a saved model's members) to ``out`` without the members in ``drop`` and
    with ``meta`` as its JSON description; returns ``out``."""
    members = {k: v for k, v in arrays.items() if k not in drop}
    members["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(out, **members)
    return out
