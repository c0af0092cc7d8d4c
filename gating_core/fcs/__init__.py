"""Reading and writing FCS files (versions 2.0, 3.0, 3.1, 3.2).

The TEXT segment is tokenised here (FlowIO remains available as a second DATA reader,
``engine="flowio"``); this module adds what real instrument files need:

* keyword names normalised before lookup (case-folded, spaces around them removed, as Partec /
  Sysmex CyFlow pad them); in FCS 2.0 files a doubled delimiter right after a keyword and
  before another is an empty value (BD CellQuest), not an escaped delimiter;
* every number taken from the HEADER or TEXT is checked against the file size *before*
  anything is allocated, so a damaged keyword cannot ask for terabytes;
* the DATA segment is located from whichever of HEADER / TEXT offsets agrees with
  ``$TOT x bits per event`` (blank or zero HEADER offsets, off-by-one ``$ENDDATA``,
  HEADER/TEXT disagreements);
* several data sets per file (``$NEXTDATA``); one that cannot be read is reported and skipped
  when others can (``read_fcs_all(...).skipped``, notes, ``fcs_info``);
* any ``$BYTEORD`` permutation (one shorter than the values is applied by its direction, with
  a note) and any ``$PnB`` width: byte-aligned (8, 16, 24, 32, 64 bits, mixed), packed
  (e.g. 10-bit integers in one bit stream), FCS 3.2 ``$PnDATATYPE`` per channel, ASCII
  (``$DATATYPE A``, fixed width or delimited); integer data masked to ``$PnR``;
* ``$PnE`` log amplification decoded, ``$PnG`` gain and ``$TIMESTEP`` applied (as FlowIO and
  FlowKit do; non-positive ones are ignored with a note), duplicate ``$PnN`` names made unique;
* spillover from ``$SPILLOVER``, ``SPILL`` or ``$SPILL``.

The DATA segment of the common uniform-width files is read with one ``numpy.fromfile`` call
(the reading speed is then the disk's); unusual layouts go through a byte-level numpy path.
Every way a file can be unreadable becomes one exception type, :class:`FCSError`, whose message
names the file and the problem; what was tolerated is listed in ``Sample.notes``.

The package, one module per concept: ``sample`` (:class:`Sample`, :class:`Channel`,
:class:`FCSError`), ``text`` (HEADER and TEXT), ``layout`` (one data set's layout from its
keywords), ``locate`` (where its DATA is), ``data`` (DATA bytes to events), ``spillover``,
``reader`` (:func:`read_fcs`, :func:`read_fcs_all`, :func:`fcs_info`), ``stream``
(:class:`EventStream`, chunked reading) and ``writer`` (:func:`write_fcs`). Every public name
of these is importable from ``gating_core.fcs`` itself. Beside them, ``transforms``: the
per-channel arcsinh / logicle / linear transforms and their defaults, chosen from what a file's
channels and keywords say (imported from ``gating_core.fcs.transforms``, not re-exported).

:func:`write_fcs` writes FCS 3.1 (float32, or float64 when a value needs it) byte by byte, with
a TEXT delimiter that occurs in no keyword name or value (see :func:`choose_delimiter`).
"""

from __future__ import annotations

from gating_core.fcs.sample import Channel, FCSError, Sample, SampleList
from gating_core.fcs.text import HEADER_LENGTH, HEADER_OFFSET_LIMIT, MAX_DATA_SETS, SUPPORTED_VERSIONS
from gating_core.fcs.data import exact_in_float32
from gating_core.fcs.spillover import SPILLOVER_KEYWORDS
from gating_core.fcs.reader import fcs_info, read_fcs, read_fcs_all
from gating_core.fcs.writer import TEXT_DELIMITERS, choose_delimiter, write_fcs
from gating_core.fcs.stream import EventStream, stream_fcs_all

__all__ = ["FCSError", "Channel", "Sample", "SampleList", "read_fcs", "read_fcs_all", "write_fcs",
           "fcs_info", "EventStream", "stream_fcs_all", "choose_delimiter", "exact_in_float32",
           "TEXT_DELIMITERS", "SPILLOVER_KEYWORDS", "HEADER_LENGTH",
           "HEADER_OFFSET_LIMIT", "MAX_DATA_SETS", "SUPPORTED_VERSIONS"]
