"""Reading a model file (``.npz``) without trusting it: bounded memory, no pickle.

A model file may come from anyone (the app accepts uploads), so :func:`read_archive` checks
what the file declares before it decompresses anything:

1. the zip's central directory is small (at most ``MAX_DIRECTORY_BYTES``, ``MAX_ENTRIES``
   entries), checked on the end-of-directory records before :mod:`zipfile` parses it;
2. only the members named in the schema (a table ``name -> Member``) may be there: any other
   member (a pickle, an extra or oversized array, a folder) is refused by its name from the zip
   directory, never decompressed; a name that appears twice is refused;
3. each member's ``.npy`` header is parsed from the zip stream (no data read): dtype kind,
   item size and number of dimensions must match the schema; object, structured and
   sub-array dtypes are refused; the declared uncompressed size in the zip directory must
   equal header + prod(shape) * itemsize exactly;
4. the sum of the declared uncompressed sizes must stay within the limits below, before any
   array is allocated. Each member is inflated here, never past its declared size plus one
   byte: a deflate stream that would inflate further than its zip header declares is refused,
   not followed, and so is one that ends early or whose CRC differs.

Limits (a model is a few MB: an ``rff`` model with D=512 is about 1 MB, the ``exact`` solver's
``landmark_projection`` is n_landmarks^2 float64, 288 MB for 6,000 landmarks):

- ``MAX_ARRAY_BYTES`` = 2 GiB uncompressed in all: the app's upload limit; an exact model of up
  to about 16,000 landmarks;
- ``MAX_EXPANSION`` = 16 x the file's size, or ``EXPANSION_FLOOR`` = 64 MiB whichever is larger:
  random-feature weights and landmark projections do not compress (ratio about 1.1); the
  largest legitimate ratio seen is landmark_embeddings (rows repeated per patient), which the
  incompressible projection beside it dominates. A file claiming more is refused; a hostile file
  can therefore cost at most max(64 MiB, 16 x its size) while being read;
- ``MAX_META_CHARS`` = 1,000,000 characters of JSON, nested at most ``MAX_JSON_DEPTH`` = 32.

Every problem is a :class:`ModelFileError` naming the file. The JSON description (the ``meta``
member) is parsed and checked field by field by :mod:`gating_core.model.file_fields`, within the
last two limits.
"""

from __future__ import annotations

import math
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gating_core.errors import ModelFileError, open_input

MAX_ARRAY_BYTES = 2 * 1024 ** 3
MAX_EXPANSION = 16
EXPANSION_FLOOR = 64 * 1024 ** 2
MAX_ENTRIES = 256
MAX_DIRECTORY_BYTES = 64 * 1024
MAX_HEADER_BYTES = 10_000
MAX_META_CHARS = 1_000_000
MAX_JSON_DEPTH = 32
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Member:
    """What one array of the archive may be: dtype kinds (``"f"``, ``"U"``, ...), item sizes
    (None: any) and number of dimensions. ``finite``: float values must be finite."""

    kinds: str
    ndim: int
    itemsizes: tuple | None = (4, 8)
    finite: bool = True


# The arrays a model file may hold. Which ones a model needs depends on its solver (checked by
# GatingModel.load); a new saved array is one more line here.
MODEL_MEMBERS = {
    "meta": Member("U", 0, itemsizes=None, finite=False),
    "center": Member("f", 1),
    "scale": Member("f", 1),
    "coef": Member("f", 2),
    "intercept": Member("f", 1),
    "train_embeddings": Member("f", 2),
    "embedding_frequencies": Member("f", 2),
    "novelty_nn": Member("f", 1),
    "class_prior": Member("f", 1),
    "largest_shares": Member("f", 1),
    "reference_quantiles": Member("f", 2),
    # align="landmarks": each channel's reference peaks (zero-padded) and how many it has
    "reference_peaks": Member("f", 2),
    "reference_peak_counts": Member("i", 1),
    # solver "rff"
    "cell_weights": Member("f", 2),
    "offsets": Member("f", 1),
    "embedding_weights": Member("f", 2),
    # solvers "exact" / "nystroem"
    "landmark_cells": Member("f", 2),
    "landmark_embeddings": Member("f", 2),
    "landmark_projection": Member("f", 2),
    # the pooled companion of the marginal method (format 2)
    "pooled_coef": Member("f", 2),
    "pooled_intercept": Member("f", 1),
    "pooled_cell_weights": Member("f", 2),
    "pooled_offsets": Member("f", 1),
    # the marginal model's second fit at the hedge bandwidth (format 4)
    "hedge_coef": Member("f", 2),
    "hedge_intercept": Member("f", 1),
    "hedge_cell_weights": Member("f", 2),
    "hedge_offsets": Member("f", 1),
    "hedge_embedding_weights": Member("f", 2),
    # the populations adapted to each gated patient (format 6)
    "adaptive_means": Member("f", 2),
    "adaptive_covariance": Member("f", 2),
    "adaptive_priors": Member("f", 1),
    # the population of each component of the adapted populations (format 11)
    "adaptive_components": Member("i", 1),
    # each population's reach, beyond which cells are unknown (format 7)
    "reach_means": Member("f", 2),
    "reach_whitening": Member("f", 3),
    "reach_log_dets": Member("f", 1),
    "reach_priors": Member("f", 1),
    "reach_distances": Member("f", 1),
    "reach_typical": Member("f", 1),
    "reach_patient_means": Member("f", 3),
    # pooled gradient-boosted trees beside the transfer model (format 14)
    "trees_columns": Member("i", 1),
    "trees_feature": Member("i", 1),
    "trees_threshold": Member("f", 1),
    "trees_left": Member("i", 1),
    "trees_right": Member("i", 1),
    "trees_value": Member("f", 1),
    "trees_roots": Member("i", 2),
    "trees_baseline": Member("f", 1),
    # the DICA projection after standardisation (GatingModel's ``dica``)
    "dica_frequencies": Member("f", 2),
    "dica_feature_mean": Member("f", 1),
    "dica_projection": Member("f", 2),
}


def expansion_limit(file_size: int) -> int:
    """Most uncompressed array bytes a file of ``file_size`` bytes may declare."""
    return min(MAX_ARRAY_BYTES, max(EXPANSION_FLOOR, MAX_EXPANSION * int(file_size)))


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


# -- the archive -----------------------------------------------------------------------------

def archive_array(path, arrays: dict, name: str, *shape) -> np.ndarray:
    """``arrays[name]`` with its shape checked against the model description's ``shape``
    (None takes any length there); a ModelFileError when it is missing or shaped otherwise."""
    if name not in arrays:
        raise ModelFileError(path, f"model file is incomplete (no array {name!r})")
    value = arrays[name]
    if len(value.shape) != len(shape) or any(want is not None and got != want
                                             for got, want in zip(value.shape, shape)):
        expected = "(" + ", ".join("n" if s is None else str(s) for s in shape) + ")"
        raise ModelFileError(path, f"model file is inconsistent: array {name!r} has shape "
                                   f"{value.shape}, expected {expected} from its description")
    return value


def read_archive(path, schema: dict = MODEL_MEMBERS, only=None) -> dict:
    """The arrays of ``schema`` that the ``.npz`` at ``path`` holds, read within the limits above.

    Returns ``{name: ndarray}`` (native byte order). A member not in ``schema`` is refused
    (never decompressed); ``only``: the names to read (default all), the others are checked
    by name and left unread. Raises :class:`ModelFileError` for anything else than a
    well-formed archive.
    """
    path = Path(path)
    handle = open_input(path, ModelFileError, "is a folder, not a model file")
    with handle:
        try:
            size = handle.seek(0, 2)
            _check_directory(path, handle, size)
            with zipfile.ZipFile(handle) as archive:
                members = _plan(path, archive, schema, size)
                return {name: _read_member(path, handle, size, info, schema[name])
                        for name, info in members.items() if only is None or name in only}
        except ModelFileError:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error, EOFError, OSError,
                ValueError, NotImplementedError, RuntimeError, OverflowError, IndexError, KeyError) as exc:
            raise ModelFileError(path, f"not a gating model file (damaged or another format: {exc})") from None


def _check_directory(path, handle, size: int) -> None:
    """Refuse a zip whose central directory is large, before zipfile reads it into memory.

    Looks at every end-of-directory record zipfile may use (the plain one and the zip64 one
    it points to) and checks their entry counts and directory sizes.
    """
    not_zip = ModelFileError(path, "not a gating model file (not a zip archive)")
    if size < 22:
        raise not_zip
    tail_len = min(size, 22 + 0xFFFF)
    handle.seek(size - tail_len)
    tail = handle.read(tail_len)
    candidates = [i for i in range(len(tail) - 22, -1, -1) if tail.startswith(b"PK\x05\x06", i)] \
        if b"PK\x05\x06" in tail else []
    if not candidates:
        raise not_zip
    for pos in candidates[:4]:  # the one zipfile picks is the last whose comment fits; check a few
        _disk, _cd_disk, n_disk, n_total, cd_size, _cd_offset, _comment = struct.unpack(
            "<HHHHIIH", tail[pos + 4: pos + 22])
        _check_counts(path, max(n_disk, n_total), cd_size)
        locator_at = size - tail_len + pos - 20
        if locator_at >= 56:
            handle.seek(locator_at)
            locator = handle.read(20)
            if locator[:4] == b"PK\x06\x07":
                handle.seek(locator_at - 56)
                record = handle.read(56)
                if record[:4] == b"PK\x06\x06":
                    n64_disk, n64_total, cd64_size = struct.unpack("<QQQ", record[24:48])
                    _check_counts(path, max(n64_disk, n64_total), cd64_size)


def _check_counts(path, entries: int, directory_bytes: int) -> None:
    if entries > MAX_ENTRIES or directory_bytes > MAX_DIRECTORY_BYTES:
        raise ModelFileError(path, f"not a gating model file (its zip directory declares {entries:,} entries "
                                   f"in {directory_bytes:,} bytes; a model has a few dozen at most)")


def _plan(path, archive: zipfile.ZipFile, schema: dict, file_size: int) -> dict:
    """The zip entries to read, by array name, after checking names and declared sizes."""
    seen, members = set(), {}
    for info in archive.infolist():
        if info.filename in seen:
            raise ModelFileError(path, f"not a gating model file (member {info.filename!r} appears twice)")
        seen.add(info.filename)
        name = info.filename[:-4] if info.filename.endswith(".npy") else None
        if name not in schema:
            # Not an array of a model file (a pickle, an extra array, a folder): refused from its
            # name in the directory, never decompressed.
            raise ModelFileError(path, f"not a gating model file: it holds a member {info.filename!r} "
                                       f"({info.file_size:,} bytes) that no model file has; refused unread")
        if info.flag_bits & 0x1:
            raise ModelFileError(path, f"member {info.filename!r} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ModelFileError(path, f"member {info.filename!r} uses an unsupported compression ({info.compress_type})")
        if info.compress_size > file_size:
            raise ModelFileError(path, f"member {info.filename!r} claims {info.compress_size:,} compressed bytes "
                                       f"in a file of {file_size:,}: damaged")
        members[name] = info
    declared = sum(info.file_size for info in members.values())
    limit = expansion_limit(file_size)
    if declared > limit:
        raise ModelFileError(
            path, f"its arrays declare {_mb(declared)} uncompressed in a {_mb(file_size)} file; refused above "
                  f"{_mb(limit)} (max({_mb(EXPANSION_FLOOR)}, {MAX_EXPANSION} x the file size), at most "
                  f"{_mb(MAX_ARRAY_BYTES)})")
    return members


class _MemberReader:
    """The uncompressed bytes of one zip member, inflated here from its compressed bytes, never
    more than its declared size: :meth:`read` stops there, :meth:`finish` then checks that the
    stream ends exactly there (inflating at most one byte more) and that the CRC matches."""

    def __init__(self, path, handle, file_size: int, info: zipfile.ZipInfo):
        self.path, self.name, self.info = path, info.filename, info
        handle.seek(info.header_offset)
        local = handle.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise ModelFileError(path, f"member {self.name!r} has no valid local zip header: damaged")
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        stored_name = handle.read(name_length)
        expected_name = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
        if stored_name != expected_name:
            raise ModelFileError(path, f"member {self.name!r} is named {stored_name[:60]!r} in its local zip "
                                       "header: damaged or forged")
        self._handle = handle
        self._position = info.header_offset + 30 + name_length + extra_length
        self._compressed_left = info.compress_size
        if self._position + info.compress_size > file_size:
            raise ModelFileError(path, f"member {self.name!r} claims {info.compress_size:,} compressed bytes "
                                       f"past the end of the file: damaged")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise ModelFileError(path, f"member {self.name!r} is stored uncompressed in {info.compress_size:,} "
                                       f"bytes but declares {info.file_size:,}: damaged or forged")
        self._inflater = zlib.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
        self._declared = info.file_size
        self._produced = 0
        self._crc = 0

    def _compressed(self, n: int = READ_CHUNK) -> bytes:
        """Up to ``n`` more of the member's compressed (or stored) bytes."""
        n = min(n, self._compressed_left)
        if n <= 0:
            return b""
        self._handle.seek(self._position)
        data = self._handle.read(n)
        self._position += len(data)
        self._compressed_left = self._compressed_left - len(data) if data else 0
        return data

    def _inflate(self, limit: int) -> bytes:
        """Up to ``limit`` bytes more of the member (fewer at its end)."""
        if self._inflater is None:
            return self._compressed(limit)
        out = []
        wanted = limit
        while wanted > 0 and not self._inflater.eof:
            source = self._inflater.unconsumed_tail or self._compressed()
            if not source:
                break
            data = self._inflater.decompress(source, wanted)
            out.append(data)
            wanted -= len(data)
        return b"".join(out)

    def read(self, n: int = -1) -> bytes:
        n = self._declared - self._produced if n is None or n < 0 else min(n, self._declared - self._produced)
        parts = []
        while n > 0:
            data = self._inflate(min(n, READ_CHUNK))
            if not data:
                break
            parts.append(data)
            n -= len(data)
            self._produced += len(data)
            self._crc = zlib.crc32(data, self._crc)
        return b"".join(parts)

    def finish(self) -> None:
        """After the declared bytes: the member must end here and its CRC must match."""
        if self._produced != self._declared:
            raise ModelFileError(self.path, f"member {self.name!r} is truncated ({self._produced:,} of "
                                            f"{self._declared:,} declared bytes)")
        if self._inflater is not None:
            if self._inflate(1):
                raise ModelFileError(self.path, f"member {self.name!r} inflates beyond the {self._declared:,} "
                                                "bytes its zip header declares: damaged or forged; refused")
            if not self._inflater.eof:
                raise ModelFileError(self.path, f"member {self.name!r} is truncated (its compressed data ends "
                                                "before the deflate stream does)")
        if self._crc != self.info.CRC:
            raise ModelFileError(self.path, f"member {self.name!r} fails its CRC check: damaged")


def _read_member(path, handle, file_size: int, info: zipfile.ZipInfo, spec: Member) -> np.ndarray:
    name = info.filename
    stream = _MemberReader(path, handle, file_size, info)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream, max_header_size=MAX_HEADER_BYTES)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream, max_header_size=MAX_HEADER_BYTES)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except ModelFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy parses the header text with ast / tokenize, which raise
        # assorted types on garbage (ValueError, SyntaxError, tokenize.TokenError, RecursionError, ...)
        raise ModelFileError(path, f"member {name!r} has no valid array header ({str(exc)[:200]})") from None
    header_bytes = stream._produced
    _check_dtype(path, name, dtype, shape, spec)
    count = math.prod(shape)
    expected = header_bytes + count * dtype.itemsize
    if expected != info.file_size:
        raise ModelFileError(path, f"member {name!r} declares shape {shape} of {dtype.str} ({expected:,} bytes) "
                                   f"but the zip directory says {info.file_size:,} bytes: damaged or forged")
    out = np.empty(count, dtype=dtype)
    raw = out.view(np.uint8)
    position = 0
    while position < raw.size:
        data = stream.read(min(READ_CHUNK, raw.size - position))
        if not data:
            raise ModelFileError(path, f"member {name!r} is truncated ({position:,} of {raw.size:,} data bytes)")
        raw[position:position + len(data)] = np.frombuffer(data, dtype=np.uint8)
        position += len(data)
    stream.finish()
    if not out.dtype.isnative:
        out = out.byteswap().view(out.dtype.newbyteorder("="))
    if spec.finite and out.dtype.kind == "f" and not _all_finite(out):
        raise ModelFileError(path, f"member {name!r} holds NaN or infinite values")
    # Fortran-ordered arrays (numpy writes those as stored) keep their layout: no copy.
    return out.reshape(shape[::-1]).T if fortran else out.reshape(shape)


def _check_dtype(path, name, dtype: np.dtype, shape: tuple, spec: Member) -> None:
    if dtype.hasobject or dtype.names is not None or dtype.subdtype is not None:
        raise ModelFileError(path, f"member {name!r} has dtype {dtype}, not a plain numeric array (refused, "
                                   "a model never holds Python objects)")
    if dtype.kind not in spec.kinds:
        raise ModelFileError(path, f"member {name!r} has dtype {dtype.str}; expected kind {spec.kinds!r}")
    if spec.itemsizes is not None and dtype.itemsize not in spec.itemsizes:
        raise ModelFileError(path, f"member {name!r} has dtype {dtype.str}; expected {spec.itemsizes} bytes per item")
    if dtype.kind == "U" and dtype.itemsize > 4 * MAX_META_CHARS:
        raise ModelFileError(path, f"member {name!r} holds {dtype.itemsize // 4:,} characters; "
                                   f"at most {MAX_META_CHARS:,} allowed")
    if len(shape) != spec.ndim:
        raise ModelFileError(path, f"member {name!r} has shape {shape}; expected {spec.ndim} dimension(s)")
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise ModelFileError(path, f"member {name!r} has an invalid shape {shape}")


def _all_finite(flat: np.ndarray) -> bool:
    """Whether a 1-d array is finite, checked in chunks (no full-size temporary)."""
    step = READ_CHUNK
    return all(bool(np.isfinite(flat[i:i + step]).all()) for i in range(0, flat.size, step))
