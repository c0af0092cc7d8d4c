"""Every error gating_core raises for bad input, under one root: :class:`GatingCoreError`.

Every error a bad input can cause (an unreadable FCS file, a damaged model, a labels file of
the wrong length, a refused library operation, a missing channel, ...) is a subclass defined
here, so a caller, and the command line above all, can catch one type and show ``str(err)``:
the file's name (when there is one) and the problem, never a traceback. Subclasses keep their
older base classes (``ValueError``, ``RuntimeError``) so code that catches those still works,
and each stays importable from the module that raises it (``from gating_core.fcs import
FCSError``, ``from gating_core.model.file_checks import ModelFileError``, ...).

``path`` is the file concerned (``None`` when there is none), ``problem`` the message without it.

This module imports nothing of gating_core: every other module may import it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["GatingCoreError", "PathError", "FCSError", "LabelError", "GroupsError", "GateError", "GateImportError",
           "ChannelMismatchError", "ModelFileError", "LibraryError", "ConflictError", "CatalogVersionError",
           "ClusterError", "describe_error", "printable", "print_error", "open_input"]


class GatingCoreError(Exception):
    """Root of the errors gating_core raises for bad input; ``str(err)`` is ``"<file>: <problem>"``."""

    path: str | None = None
    problem: str | None = None


class PathError(GatingCoreError):
    """An error about one file: ``PathError(path, problem)`` reads ``"<file name>: <problem>"``."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{Path(self.path).name}: {problem}")


# -- input files -------------------------------------------------------------------------------

class FCSError(PathError):
    """An FCS file could not be read (or written); ``str(err)`` names the file and the problem."""


class LabelError(PathError, ValueError):
    """A labels file or gated CSV is missing or unusable; ``str(err)`` names the file and problem."""


class GroupsError(PathError, ValueError):
    """A groups table or keyword could not be used; ``str(err)`` names the file and problem."""


# -- gates -------------------------------------------------------------------------------------

class GateError(GatingCoreError, ValueError):
    """A gate or gate tree is invalid (bad geometry, unknown parent, duplicate name, ...)."""


class GateImportError(PathError, ValueError):
    """A FlowJo workspace or GatingML file could not be applied; ``str(err)`` names the file."""


# -- models ------------------------------------------------------------------------------------

class ChannelMismatchError(GatingCoreError, ValueError):
    """A sample lacks a channel the model needs (named in the message)."""


class ModelFileError(PathError, ValueError):
    """A model file could not be read; ``str(err)`` names the file and the problem."""


# -- the patient library -----------------------------------------------------------------------

class LibraryError(GatingCoreError):
    """A library operation was refused or failed (nothing changed); ``str(err)`` names ``.path`` / ``.patient``."""

    def __init__(self, problem: str, *, path=None, patient: str | None = None):
        self.problem = problem
        self.path = None if path is None else str(path)
        self.patient = patient
        prefix = ""
        if self.path is not None:
            prefix += f"{Path(self.path).name}: "
        if patient is not None:
            prefix += f"patient {patient!r}: "
        super().__init__(prefix + problem)


class ConflictError(LibraryError):
    """Refused: another session changed the same thing first (a patient's name, its labels); nothing changed."""


class CatalogVersionError(GatingCoreError, RuntimeError):
    """The library's catalog was written by a newer gating_core (a newer schema version)."""


# -- work on a cluster -------------------------------------------------------------------------

class ClusterError(GatingCoreError, RuntimeError):
    """The Dask cluster could not be started or reached (the message says which and why)."""


# -- showing an error --------------------------------------------------------------------------

def describe_error(exc: BaseException) -> str:
    """A one-line ``"<path>: <problem>"`` for an error shown to a user (no traceback).

    A PathError names its file by the path it was given (as typed on a command line: two
    inputs of one name in different folders are told apart), other GatingCoreErrors as their
    ``str``; OSError names ``exc.filename`` and its strerror; UnicodeError says which text (a
    file name, usually) was not valid UTF-8; any other error is its own message.
    """
    if isinstance(exc, PathError) and exc.path:
        return f"{exc.path}: {exc.problem}"
    if isinstance(exc, GatingCoreError):
        return str(exc)
    if isinstance(exc, OSError):
        names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
        problem = exc.strerror or str(exc)
        return f"{' -> '.join(names)}: {problem}" if names else problem
    if isinstance(exc, UnicodeError):
        text = getattr(exc, "object", None)
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "backslashreplace")
        elif isinstance(text, str):
            text = printable(text)
        where = f"{text[:200]}: " if text else ""
        return f"{where}not valid UTF-8 text ({getattr(exc, 'reason', exc)}); rename the file or give plain text"
    return str(exc) or type(exc).__name__  # a ValueError of ours names its patient or file itself


def printable(text: str) -> str:
    """``text`` with undecodable bytes of a file name (surrogate escapes) shown as ``\\xff``."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def print_error(message) -> None:
    """``error: <message>`` on stderr, file names that are not UTF-8 shown escaped."""
    import sys

    print(f"error: {printable(str(message))}", file=sys.stderr)


def open_input(path, error_type, folder_problem: str):
    """Open ``path`` for binary reading; any failure becomes ``error_type(path, problem)``.

    ``folder_problem`` is the problem reported when ``path`` is a folder.
    """
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise error_type(path, "file not found") from None
    except IsADirectoryError:
        raise error_type(path, folder_problem) from None
    except OSError as exc:
        raise error_type(path, f"cannot be opened ({exc.strerror or exc})") from None
