"""Loading untrusted model files: bounded memory, typed description, only ModelFileError.

A model file may come from anyone (the app accepts uploads). These tests build hostile files
from a real saved model: a zip bomb, forged .npy headers, bad JSON descriptions, and random
damage (byte flips, truncations, member swaps, JSON mutations) under hypothesis.
"""

from __future__ import annotations

import io
import json
import math
import os
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gating_core.model.research import ResearchGatingModel, load_gating_model
from gating_core.errors import GatingCoreError
from gating_core.model import GatingModel
from gating_core.model.file_checks import ModelFileError
from gating_core.model.file_checks import MODEL_MEMBERS, expansion_limit
from gating_core.synthetic import simulate_patient
from helpers import sample_cohort

FUZZ = settings(max_examples=int(os.environ.get("GATING_FUZZ_EXAMPLES", 80)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MEMORY_BOUND = 50 * 1024 ** 2


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory) -> bytes:
    """A small real model (marginal transfer, random features), as saved by GatingModel.save."""
    model = GatingModel(select=False, n_features=64, n_embedding_features=16, cells_per_patient=500,
                        embedding_cells=2000).fit(*sample_cohort(range(1, 5)))
    path = tmp_path_factory.mktemp("modelfile") / "model.npz"
    model.save(path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def small_sample():
    sample, _ = simulate_patient(5, n_events=400)
    return sample


def _members(data: bytes) -> dict:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {k: archive[k] for k in archive.files}


def _save(path, arrays: dict) -> None:
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def _with_meta(data: bytes, change) -> dict:
    arrays = _members(data)
    meta = json.loads(str(arrays["meta"]))
    changed = change(meta)
    arrays["meta"] = np.array(changed if isinstance(changed, str) else json.dumps(meta if changed is None else changed))
    return arrays


def _zeros_member(archive: zipfile.ZipFile, name: str, shape: tuple, dtype="<f4") -> None:
    """Write ``name`` as a deflated .npy of zeros of ``shape`` without compressing gigabytes.

    After a full flush, deflate encodes every further 4 MiB of zeros as the same bytes: the block
    is computed once and repeated (the CRC is still computed by zipfile on the real zeros).
    """
    chunk = bytes(4 << 20)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False, "shape": shape})
    header = header.getvalue()
    total = math.prod(shape) * np.dtype(dtype).itemsize
    assert total % len(chunk) == 0
    real = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = real.compress(header) + real.flush(zlib.Z_FULL_FLUSH)
    block = real.compress(chunk) + real.flush(zlib.Z_FULL_FLUSH)
    tail = real.flush(zlib.Z_FINISH)

    class Repeating:
        def compress(self, data):
            return block if data is chunk else head

        def flush(self):
            return tail

    info = zipfile.ZipInfo(name + ".npy", date_time=(2024, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    with archive.open(info, "w", force_zip64=True) as stream:
        stream._compressor = Repeating()
        stream.write(header)
        for _ in range(total // len(chunk)):
            stream.write(chunk)


def _peak_while(call) -> tuple[int, BaseException | None]:
    """Peak traced memory (numpy buffers and Python objects) while ``call()`` runs."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    error = None
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        error = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, error


# -- bounded memory -------------------------------------------------------------------------------


def test_zip_bomb_model_is_refused_before_inflating_with_bounded_memory(model_bytes, tmp_path):
    """A ~1 MB file whose coef array inflates to 1 GiB of zeros: refused from the zip directory."""
    arrays = _members(model_bytes)
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, value in arrays.items():
            if name != "coef":
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, value, allow_pickle=False)
                archive.writestr(name + ".npy", buffer.getvalue())
        _zeros_member(archive, "coef", (2 ** 30 // 4 // 8, 8))
    size = bomb.stat().st_size
    assert size < 2 * 1024 ** 2
    with zipfile.ZipFile(bomb) as archive:  # a real bomb: the directory declares the full size
        assert archive.getinfo("coef.npy").file_size > 2 ** 30
    peak, error = _peak_while(lambda: GatingModel.load(bomb))
    assert isinstance(error, ModelFileError), error
    assert "declare" in str(error) and "bomb.npz" in str(error)
    assert peak < MEMORY_BOUND, f"{peak / 1e6:.1f} MB traced while refusing the bomb"


def test_forged_npy_header_disagreeing_with_the_zip_directory_is_refused(model_bytes, tmp_path):
    """The .npy header claims 10^9 x 8 float32 but the member holds a few bytes: refused unread."""
    arrays = _members(model_bytes)
    forged = tmp_path / "forged.npz"
    with zipfile.ZipFile(forged, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, value in arrays.items():
            buffer = io.BytesIO()
            if name == "coef":
                np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                              "shape": (10 ** 9, 8)})
                buffer.write(bytes(64))
            else:
                np.lib.format.write_array(buffer, value, allow_pickle=False)
            archive.writestr(name + ".npy", buffer.getvalue())
    peak, error = _peak_while(lambda: GatingModel.load(forged))
    assert isinstance(error, ModelFileError), error
    assert "zip directory says" in str(error)
    assert peak < MEMORY_BOUND


def test_members_a_model_does_not_have_are_refused_without_being_decompressed(model_bytes, tmp_path):
    """An extra 1 GiB member is refused by its name from the zip directory: never read, memory
    stays small."""
    path = tmp_path / "extra.npz"
    path.write_bytes(model_bytes)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive:
        _zeros_member(archive, "extra_payload", (2 ** 30 // 4 // 8, 8))
    peak, error = _peak_while(lambda: GatingModel.load(path))
    assert isinstance(error, ModelFileError), error
    assert "extra.npz" in str(error) and "'extra_payload.npy'" in str(error) and "refused unread" in str(error)
    assert peak < MEMORY_BOUND


def test_a_zip_directory_with_very_many_entries_is_refused_before_parsing(model_bytes, tmp_path):
    path = tmp_path / "many.npz"
    path.write_bytes(model_bytes)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_STORED) as archive:
        for i in range(3000):
            archive.writestr(f"x{i}", b"")
    with pytest.raises(ModelFileError, match="zip directory declares"):
        GatingModel.load(path)


@pytest.mark.parametrize("dtype, shape, message", [
    ("|O", (3,), "Python objects"),
    ("<i8", (9,), "expected kind 'f'"),
    ("<f4", (3, 3), "expected 1 dimension"),
    ("<f2", (9,), "bytes per item"),
    ([("a", "<f4")], (9,), "not a plain numeric array"),
])
def test_members_of_the_wrong_dtype_or_dimensions_are_refused(model_bytes, tmp_path, dtype, shape, message):
    arrays = _members(model_bytes)
    path = tmp_path / "dtype.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, value in arrays.items():
            buffer = io.BytesIO()
            if name == "center":
                np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
                buffer.write(bytes(math.prod(shape) * np.dtype(dtype).itemsize if dtype != "|O" else 24))
            else:
                np.lib.format.write_array(buffer, value, allow_pickle=False)
            archive.writestr(name + ".npy", buffer.getvalue())
    with pytest.raises(ModelFileError, match=message):
        GatingModel.load(path)


def test_limits_let_a_large_legitimate_model_through():
    # exact solver, 6,000 landmarks: a 288 MB incompressible projection in a ~290 MB file
    assert expansion_limit(290 * 10 ** 6) >= 6000 * 6000 * 8 + 6000 * 256 * 8
    # a 1 MB file may not claim more than 64 MiB; a 6.4 MB one not 6.3 GB
    assert expansion_limit(10 ** 6) == 64 * 1024 ** 2
    assert expansion_limit(6.4e6) < 200e6
    assert set(MODEL_MEMBERS) >= {"meta", "coef", "cell_weights", "landmark_projection"}


def test_a_saved_exact_solver_model_round_trips(tmp_path):
    samples, labels = sample_cohort(range(1, 4))
    model = ResearchGatingModel(select=False, solver="exact", cells_per_patient=200, n_embedding_features=16,
                        embedding_cells=1000).fit(samples, labels)
    model.save(tmp_path / "exact.npz")
    loaded = ResearchGatingModel.load(tmp_path / "exact.npz")
    np.testing.assert_array_equal(loaded.gate(samples[0]).populations, model.gate(samples[0]).populations)


# -- the JSON description --------------------------------------------------------------------------


def _set(path, value):
    def change(meta):
        target = meta
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


BAD_DESCRIPTIONS = {
    "format_version string": _set(["format_version"], "1"),
    "format_version null": _set(["format_version"], None),
    "format_version float": _set(["format_version"], 1.5),
    "format_version bool": _set(["format_version"], True),
    "format_version newer": _set(["format_version"], 99),
    "method unknown": _set(["params", "method"], "magic"),
    "solver unknown": _set(["classifier", "solver"], "magic"),
    "unknown parameter": _set(["params", "not_a_parameter"], 1),
    "n_features string": _set(["classifier", "n_features"], "512"),
    "channels a string": _set(["channels"], "FSC-A"),
    "channels with a number": _set(["channels", 0], 7),
    "channels duplicated": lambda m: m["channels"].__setitem__(1, m["channels"][0]),
    "markers too short": lambda m: m["channel_markers"].pop(),
    "novelty NaN": _set(["novelty", "reference"], float("nan")),
    "novelty negative": _set(["novelty", "threshold"], -1.0),
    "novelty a string": _set(["novelty"], "high"),
    "populations numbers": _set(["populations"], [1, 2, 3]),
    "populations a string": _set(["populations"], "B cells"),
    "populations too few": lambda m: m.__setitem__("populations", m["populations"][:3]),
    "training patients wrong count": lambda m: m["training_patients"].pop(),
    "transform kind unknown": _set(["transform", "kinds", 0], "log"),
    "transform params missing": lambda m: m["transform"]["params"].pop(),
    "transform cofactor zero": lambda m: m["transform"]["params"][-1].__setitem__("cofactor", 0),
    "logicle invalid": lambda m: (m["transform"]["kinds"].__setitem__(-1, "logicle"),
                                  m["transform"]["params"].__setitem__(-1, {"T": 1, "W": 5, "M": 4, "A": 0})),
    "temperature infinite": _set(["fitted", "temperature"], float("inf")),
    "n_features_in wrong": _set(["fitted", "n_features_in"], 3),
    "bandwidth a list": _set(["fitted", "bandwidth_x"], [1.0]),
    "selection cv string": _set(["selection"], {"cv_accuracy": "high"}),
    "deep nesting": _set(["selection"], "__DEEP__"),
    "not an object": lambda m: [m],
    "not JSON": lambda m: "{'format': 'gating_core.model'",
    "too long": lambda m: " " * 1_000_001 + json.dumps(m),
    "random_state negative": _set(["params", "random_state"], -1),
    "class_balance above 1": _set(["params", "class_balance"], 1.5),
    "class_balance a string": _set(["params", "class_balance"], "balanced"),
    "unknown extra parameter kind": _set(["params", "alpha"], {"a": 1}),
}


@pytest.mark.parametrize("case", sorted(BAD_DESCRIPTIONS))
def test_bad_model_descriptions_are_model_file_errors(model_bytes, tmp_path, case):
    arrays = _with_meta(model_bytes, BAD_DESCRIPTIONS[case])
    text = str(arrays["meta"])
    if "__DEEP__" in text:
        arrays["meta"] = np.array(text.replace('"__DEEP__"', "[" * 50_000 + "]" * 50_000))
    path = tmp_path / "bad.npz"
    _save(path, arrays)
    with pytest.raises(ModelFileError, match="bad.npz"):
        GatingModel.load(path)


def test_a_file_without_class_balance_loads_as_a_uniform_draw(model_bytes, tmp_path):
    # GatingModel's files store no class_balance (a ResearchGatingModel's parameter); files
    # written before it existed drew uniformly too. A file storing another value is a
    # ResearchGatingModel's.
    assert "class_balance" not in json.loads(str(_members(model_bytes)["meta"]))["params"]
    _save(tmp_path / "old.npz", _members(model_bytes))
    assert GatingModel.load(tmp_path / "old.npz").class_balance == 0.0
    assert GatingModel.load(tmp_path / "old.npz").describe()["class_balance"] == 0.0
    with_it = _with_meta(model_bytes, _set(["params", "class_balance"], 0.75))
    _save(tmp_path / "new.npz", with_it)
    with pytest.raises(ModelFileError, match="a ResearchGatingModel's file \\(class_balance=0.75\\)"):
        GatingModel.load(tmp_path / "new.npz")
    assert load_gating_model(tmp_path / "new.npz").class_balance == 0.75
    assert load_gating_model(tmp_path / "new.npz").describe()["class_balance"] == 0.75


def test_missing_solver_arrays_are_named(model_bytes, tmp_path):
    arrays = _members(model_bytes)
    del arrays["cell_weights"]
    _save(tmp_path / "m.npz", arrays)
    with pytest.raises(ModelFileError, match="no array 'cell_weights'"):
        GatingModel.load(tmp_path / "m.npz")


def test_nan_in_an_array_is_refused(model_bytes, tmp_path):
    arrays = _members(model_bytes)
    arrays["coef"][0, 0] = np.nan
    _save(tmp_path / "m.npz", arrays)
    with pytest.raises(ModelFileError, match="NaN"):
        GatingModel.load(tmp_path / "m.npz")


def test_big_endian_and_fortran_arrays_still_load(model_bytes, tmp_path, small_sample):
    arrays = _members(model_bytes)
    reference = GatingModel.load(_write(tmp_path / "ref.npz", model_bytes)).gate(small_sample)
    arrays["coef"] = np.asfortranarray(arrays["coef"].astype(">f4"))
    arrays["cell_weights"] = arrays["cell_weights"].astype(">f4")
    _save(tmp_path / "m.npz", arrays)
    result = GatingModel.load(tmp_path / "m.npz").gate(small_sample)
    np.testing.assert_array_equal(result.populations, reference.populations)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


# -- random damage --------------------------------------------------------------------------------


def _json_values():
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 20, 10 ** 20),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                        max_leaves=6)


def _paths(meta, prefix=()):
    yield prefix
    if isinstance(meta, dict):
        for key, value in meta.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(meta, list):
        for i, value in enumerate(meta):
            yield from _paths(value, prefix + (i,))


def _mutate_json(data: bytes, choice: int, value) -> bytes:
    arrays = _members(data)
    meta = json.loads(str(arrays["meta"]))
    paths = [p for p in _paths(meta) if p]
    path = paths[choice % len(paths)]
    target = meta
    for key in path[:-1]:
        target = target[key]
    if choice % 7 == 0 and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    arrays["meta"] = np.array(json.dumps(meta))
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def _swap_members(data: bytes, a: int, b: int, mode: int) -> bytes:
    arrays = _members(data)
    names = sorted(arrays)
    first, second = names[a % len(names)], names[b % len(names)]
    if mode == 0:
        arrays[first], arrays[second] = arrays[second], arrays[first]
    elif mode == 1:
        del arrays[first]
    else:
        arrays[first] = arrays[second]
    out = io.BytesIO()
    np.savez_compressed(out, **arrays)
    return out.getvalue()


DAMAGE = st.one_of(
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 10 ** 9), st.integers(1, 255)), min_size=1, max_size=8)),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("swap"), st.tuples(st.integers(0, 50), st.integers(0, 50), st.integers(0, 2))),
    st.tuples(st.just("json"), st.tuples(st.integers(0, 10 ** 6), _json_values())),
)


@FUZZ
@given(damage=DAMAGE)
def test_damaged_models_raise_only_model_file_error(model_bytes, small_sample, tmp_path, damage):
    kind, how = damage
    if kind == "flip":
        data = bytearray(model_bytes)
        for position, mask in how:
            data[position % len(data)] ^= mask
        data = bytes(data)
    elif kind == "truncate":
        data = model_bytes[: int(how * len(model_bytes))]
    elif kind == "swap":
        data = _swap_members(model_bytes, *how)
    else:
        data = _mutate_json(model_bytes, *how)
    path = tmp_path / "damaged.npz"
    path.write_bytes(data)
    try:
        model = GatingModel.load(path)
    except ModelFileError as exc:
        assert "damaged.npz" in str(exc)
        return
    # Damage the reader let through (a flipped timestamp, a harmless JSON value) must still
    # leave a model that gates, or fails with the library's own errors.
    try:
        result = model.gate(small_sample)
    except GatingCoreError:
        return
    assert len(result.populations) == small_sample.n_events
    assert np.isfinite(result.confidence).all() and np.isfinite(result.novelty.score)
