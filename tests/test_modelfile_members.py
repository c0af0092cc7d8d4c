"""The model loader refuses what it does not know: members no model file has (a pickle, an
extra array) and members whose zip header lies about their uncompressed size, from
``GatingModel.load`` and from ``gate --model``; model files as every format wrote them still load.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from gating_core.model import GatingModel
from gating_core.model.file_checks import ModelFileError
from gating_core.synthetic import simulate_patient
from helpers import SAMPLE_DATA, quick_model_file, run_cli

NEW_PATIENT = SAMPLE_DATA / "new" / "new_patient_01.fcs"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return quick_model_file(tmp_path_factory.mktemp("members"))


@pytest.fixture(scope="module")
def small_sample():
    sample, _ = simulate_patient(5, n_events=400)
    return sample


def _arrays(path) -> dict:
    with np.load(path, allow_pickle=False) as archive:
        return {k: archive[k] for k in archive.files}


def _npy(value) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, value, allow_pickle=False)
    return buffer.getvalue()


def _write_zip(path, members: dict, compression=zipfile.ZIP_DEFLATED, force_zip64=False) -> Path:
    """``members``: member name -> bytes."""
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = compression
            with archive.open(info, "w", force_zip64=force_zip64) as stream:
                stream.write(data)
    return path


def _with_extra(model_file, tmp_path, name: str, data: bytes) -> Path:
    path = tmp_path / "extra.npz"
    path.write_bytes(model_file.read_bytes())
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
    return path


def _lying_about_size(model_file, tmp_path, member: str, extra: bytes) -> Path:
    """A model whose ``member`` deflates to its true bytes plus ``extra``, while its zip headers
    (local and central) declare only the true size and carry the true bytes' CRC."""
    members = {f"{k}.npy": _npy(v) for k, v in _arrays(model_file).items()}
    true = members[f"{member}.npy"]
    members[f"{member}.npy"] = true + extra
    path = _write_zip(tmp_path / "lying.npz", members)
    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{member}.npy")
    crc, size = zlib.crc32(true), len(true)
    local = info.header_offset
    assert blob[local:local + 4] == b"PK\x03\x04"
    struct.pack_into("<I", blob, local + 14, crc)
    struct.pack_into("<I", blob, local + 22, size)
    name = f"{member}.npy".encode()
    central = blob.find(b"PK\x01\x02")
    while blob[central + 46:central + 46 + len(name)] != name:
        central = blob.find(b"PK\x01\x02", central + 4)
        assert central > 0
    struct.pack_into("<I", blob, central + 16, crc)
    struct.pack_into("<I", blob, central + 24, size)
    path.write_bytes(bytes(blob))
    with zipfile.ZipFile(path) as archive:  # the forgery: zipfile believes the headers
        assert archive.getinfo(f"{member}.npy").file_size == size
    return path


def _refused(path: Path, *words: str) -> ModelFileError:
    with pytest.raises(ModelFileError) as err:
        GatingModel.load(path)
    assert str(err.value).startswith(f"{path.name}: "), str(err.value)
    for word in words:
        assert word in str(err.value), str(err.value)
    return err.value


def _gate_refuses(path: Path, tmp_path: Path, *words: str) -> None:
    out = tmp_path / "out"
    result = run_cli("gate", "--model", path, "--out-dir", out, NEW_PATIENT)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stderr.startswith(f"error: {path}: ") and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    assert not out.exists() or list(out.iterdir()) == []


class _Trap:
    """Unpickling this creates ``marker``: a pickle that runs code if it is ever loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_model_with_a_pickle_member_is_refused_and_the_pickle_never_loaded(model_file, tmp_path):
    marker = tmp_path / "pickle-ran"
    path = _with_extra(model_file, tmp_path, "evil.pkl", pickle.dumps(_Trap(marker)))
    _refused(path, "'evil.pkl'", "refused unread")
    _gate_refuses(path, tmp_path, "'evil.pkl'")
    assert not marker.exists()


def test_a_model_with_an_unknown_array_is_refused(model_file, tmp_path):
    path = _with_extra(model_file, tmp_path, "extra.npy", _npy(np.arange(10.0)))
    _refused(path, "'extra.npy'", "no model file has")
    _gate_refuses(path, tmp_path, "'extra.npy'")


def test_an_array_of_the_other_model_format_is_refused(model_file, tmp_path):
    """An array of the other model format (an iw-nystroem file's training cells) does not belong
    in this one either."""
    path = _with_extra(model_file, tmp_path, "cells.npy", _npy(np.zeros((4, 2))))
    _refused(path, "'cells.npy'")


@pytest.mark.parametrize("member", ["coef", "meta"])
def test_a_member_that_inflates_beyond_its_declared_size_is_refused(model_file, tmp_path, member):
    extra = bytes(range(256)) * 64  # 16 KiB more than the headers declare
    path = _lying_about_size(model_file, tmp_path, member, extra)
    _refused(path, f"'{member}.npy'", "inflates beyond")
    _gate_refuses(path, tmp_path, f"'{member}.npy'", "inflates beyond")


def test_a_member_shorter_than_declared_is_refused(model_file, tmp_path):
    members = {f"{k}.npy": _npy(v) for k, v in _arrays(model_file).items()}
    true = members["coef.npy"]
    path = _write_zip(tmp_path / "short.npz", {**members, "coef.npy": true[:-40]})
    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("coef.npy")
    struct.pack_into("<I", blob, info.header_offset + 22, len(true))
    central = blob.find(b"PK\x01\x02")
    while blob[central + 46:central + 54] != b"coef.npy":
        central = blob.find(b"PK\x01\x02", central + 4)
    struct.pack_into("<I", blob, central + 24, len(true))
    path.write_bytes(bytes(blob))
    _refused(path, "'coef.npy'")


def test_reading_a_lying_member_stops_one_byte_past_its_declared_size(model_file, tmp_path, monkeypatch):
    """Memory-safe: however far the stream would inflate, at most the declared size + 1 byte is
    decompressed."""
    import gating_core.model.file_checks as modelfile

    path = _lying_about_size(model_file, tmp_path, "coef", bytes(8 << 20))  # 8 MiB of hidden zeros
    declared = {}
    inflated = {}
    original = zlib.decompressobj

    class Counting:
        def __init__(self, *args):
            self._inner = original(*args)
            self.key = len(inflated)
            inflated[self.key] = 0

        def decompress(self, data, max_length=0):
            out = self._inner.decompress(data, max_length)
            inflated[self.key] += len(out)
            return out

        def __getattr__(self, name):
            return getattr(self._inner, name)

    monkeypatch.setattr(modelfile.zlib, "decompressobj", Counting)
    with zipfile.ZipFile(path) as archive:
        declared = {i: info.file_size for i, info in enumerate(archive.infolist())}
    with pytest.raises(ModelFileError, match="inflates beyond"):
        GatingModel.load(path)
    assert inflated and max(inflated.values()) <= max(declared.values()) + 1


# -- model files as written still load -------------------------------------------------------------


@pytest.mark.parametrize("layout", ["savez_compressed", "savez", "zip64", "stored_zip64"])
def test_model_files_of_every_zip_layout_still_load(model_file, tmp_path, small_sample, layout):
    arrays = _arrays(model_file)
    reference = GatingModel.load(model_file).gate(small_sample)
    path = tmp_path / f"{layout}.npz"
    if layout == "savez_compressed":
        np.savez_compressed(path, **arrays)
    elif layout == "savez":
        np.savez(path, **arrays)
    else:
        compression = zipfile.ZIP_DEFLATED if layout == "zip64" else zipfile.ZIP_STORED
        _write_zip(path, {f"{k}.npy": _npy(v) for k, v in arrays.items()}, compression, force_zip64=True)
    result = GatingModel.load(path).gate(small_sample)
    np.testing.assert_array_equal(result.populations, reference.populations)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_older_format_versions_still_load(model_file, tmp_path, small_sample, version):
    """A file of an older format: its format_version, without the parts later formats added."""
    arrays = _arrays(model_file)
    meta = json.loads(str(arrays["meta"]))
    meta["format_version"] = version
    # These formats stored the research options (now ResearchGatingModel's) among the
    # parameters, at their defaults unless asked for: such a file is a GatingModel's.
    meta["params"].update(n_augment=0, augment_gain=0.08, augment_shift=0.15, bandwidth_x_hedge=None)
    meta["params"].pop("self_training", None)  # format 5
    if version < 4:
        meta.pop("hedge", None)
        for name in [k for k in arrays if k.startswith("hedge_")]:
            del arrays[name]
        meta["params"].pop("bandwidth_x_hedge", None)
    if version < 2:
        meta.pop("pooled", None)
        for name in [k for k in arrays if k.startswith("pooled_")]:
            del arrays[name]
        meta["params"].pop("pooled_weight", None)
    arrays["meta"] = np.array(json.dumps(meta))
    path = tmp_path / f"format{version}.npz"
    np.savez_compressed(path, **arrays)
    loaded = GatingModel.load(path)
    assert type(loaded) is GatingModel and "n_augment" not in loaded.get_params()
    result = loaded.gate(small_sample)
    assert len(result.populations) == small_sample.n_events
    np.testing.assert_array_equal(result.populations, GatingModel.load(model_file).gate(small_sample).populations)
