"""What the model-file tests share: writing a saved model's arrays back with a changed description."""

from __future__ import annotations

import json
import zipfile

import numpy as np


def saved_arrays(model, path) -> tuple[dict, dict]:
    """Save ``model`` to ``path`` and read it back as (its members but the description, the
    description as a dict)."""
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        arrays = {name[:-4]: np.load(archive.open(name), allow_pickle=False) for name in archive.namelist()}
    return arrays, json.loads(str(arrays.pop("meta")))


def rewrite_model_file(arrays: dict, out, meta: dict, drop=()):
    """Write ``arrays`` (a saved model's members) to ``out`` without the members in ``drop`` and
    with ``meta`` as its JSON description; returns ``out``."""
    members = {k: v for k, v in arrays.items() if k not in drop}
    members["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(out, **members)
    return out
