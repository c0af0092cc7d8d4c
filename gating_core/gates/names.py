"""Names coming from users (patient names, uploaded file names) made safe to show, to key by and
to name files with.

One rule for every name that becomes (part of) a file name: Unicode letters, digits and their
combining marks are kept (NFC-normalised, so a name typed on macOS and on Windows is the same
name), as are ``. _ + -``; every run of other characters -- spaces, path separators, control
and format characters, punctuation -- becomes one ``_``. Leading and trailing dots and
underscores are dropped (no hidden files, no ``..``), runs of dots become one, Windows device
names (``CON``, ``NUL``, ``COM1``...) get a ``_``, and the result stays within a file name's
length in UTF-8. ``patient ü 東京 03.fcs`` is ``patient_ü_東京_03``, not ``patient_03``.
"""

from __future__ import annotations

import os
import re
import unicodedata

#: Most UTF-8 bytes of a stem: room for ``.gated.parquet`` and the like within 255 bytes.
MAX_STEM_BYTES = 200

_WINDOWS_DEVICES = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$",
                    *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10)),
                    *(f"COM{c}" for c in "¹²³"), *(f"LPT{c}" for c in "¹²³")}


def _kept(ch: str, previous_kept: bool) -> bool:
    if ch.isalnum() or ch in "._+-":
        return True
    # A combining mark (an accent NFC could not compose, a vowel sign of an Indic script)
    # belongs to the letter before it.
    return previous_kept and unicodedata.category(ch).startswith("M")


def safe_name(text: str, fallback: str = "file", max_bytes: int = MAX_STEM_BYTES,
              max_chars: int | None = None) -> str:
    """``text`` made safe as a file name stem (see the module docstring), at most ``max_bytes``
    in UTF-8 and ``max_chars`` characters (a Windows device name's ``_`` may add one);
    ``fallback`` when nothing is left."""
    text = unicodedata.normalize("NFC", str(text))
    out: list[str] = []
    previous = False
    for ch in text:
        keep = _kept(ch, previous)
        if keep:
            out.append(ch)
        elif not out or out[-1] != "\0":
            out.append("\0")  # one separator for a run of unsafe characters
        previous = keep
    name = "".join(out).replace("\0", "_")
    name = re.sub(r"\.{2,}", ".", name).strip("._")
    name = _truncate_utf8(name[:max_chars], max_bytes).rstrip("._")
    if not name:
        return fallback
    device = name.split(".", 1)[0]
    if device.upper() in _WINDOWS_DEVICES:
        name = device + "_" + name[len(device):]
    return name


def _truncate_utf8(text: str, max_bytes: int) -> str:
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text
    text = encoded[:max_bytes].decode("utf-8", "ignore")
    # do not leave a letter without the combining marks that followed it
    while text and unicodedata.category(text[-1]).startswith("M"):
        text = text[:-1]
    return text


def safe_stem(file_name: str, fallback: str = "file") -> str:
    """A display/identifier stem from an uploaded file name; never used as a path by itself.

    Drops any directory part and the extension(s) ``.fcs``/``.csv``/``.labels.csv``/
    ``.gated.csv``/..., then applies :func:`safe_name` (at most 80 characters).
    """
    base = os.path.basename(str(file_name).replace("\\", "/"))
    lowered = base.lower()
    for suffix in (".labels.csv", ".gated.csv", ".fcs", ".csv", ".wsp", ".xml", ".lmd"):
        if lowered.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return safe_name(base, fallback, max_chars=80)
