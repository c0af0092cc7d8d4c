"""Expert gates from FlowJo workspaces and GatingML 2.0 files (via FlowKit), as leaf labels."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

from gating_core.gates.errors import GateImportError
from gating_core.gates.base import OTHER


def _flowkit_sample(sample, sample_id: str):
    """FlowKit's view of a sample as its file holds it: the raw events and, where the file has
    one, its spillover matrix, so FlowKit resolves each gate's compensation reference
    (``uncompensated``, ``FCS``, a workspace's matrix) as on the file itself. A sample read
    compensated has its compensation taken back out first (:meth:`Sample.uncompensated`)."""
    import flowkit

    if sample.spillover is None:
        return flowkit.Sample(np.asarray(sample.events, dtype=np.float64), sample_id=sample_id,
                              channel_labels=list(sample.pnn), subsample=0)
    from gating_core.io.flowkit_interop import flowkit_sample_via_fcs

    # Through an FCS file: its $SPILLOVER is what FlowKit reads the file's matrix from.
    return flowkit_sample_via_fcs(sample.uncompensated(), sample_id, include_identifying=False)


_XML_ESCAPE = re.compile(r"_x([0-9A-F]{4,6})_")
#: FlowKit's warning for each sample a workspace refers to that was not given to it.
_NOT_LOADED = re.compile(r"WSP references (.*), but sample was not loaded\.$")
_XML_NAME_CHAR = re.compile(r"[A-Za-z0-9._-]")


def xml_gate_id(name: str) -> str:
    """A gate name as a GatingML id (an XML NCName): characters an NCName cannot hold become
    ``_xHHHH_`` (XML's usual name escape), so ``"T cells"`` is ``"T_x0020_cells"``.
    :func:`gate_name_from_xml` reverses it; the importers below apply that to every gate id."""
    out = []
    for i, char in enumerate(name):
        escape = not _XML_NAME_CHAR.match(char) or (i == 0 and not (char.isalpha() or char == "_")) \
            or (char == "_" and _XML_ESCAPE.match(name, i))
        out.append(f"_x{ord(char):04X}_" if escape else char)
    return "".join(out)


def gate_name_from_xml(gate_id: str) -> str:
    """The gate name behind a GatingML id written by :func:`xml_gate_id` (others unchanged)."""
    return _XML_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), gate_id)


def _leaf_labels(gate_ids, membership, n_events: int) -> tuple[np.ndarray, list[str]]:
    """Flatten flowkit (name, path) gate ids into leaf labels; duplicate leaf names get their parent."""
    ids = [(name, tuple(path)) for name, path in gate_ids]
    parent_paths = {other_path for _, other_path in ids}
    leaves = [(name, path) for name, path in ids if path + (name,) not in parent_paths]
    counts: dict[str, int] = {}
    for name, _ in leaves:
        counts[name] = counts.get(name, 0) + 1
    labels = np.full(n_events, OTHER, dtype=object)
    assigned = np.zeros(n_events, dtype=bool)
    names = []
    for name, path in leaves:
        label = gate_name_from_xml(name) if counts[name] == 1 else \
            "/".join(gate_name_from_xml(part) for part in [*path[1:], name])
        mask = np.asarray(membership(name, path), dtype=bool)
        if mask.shape[0] != n_events:
            raise ValueError(f"gate {name!r} returned {mask.shape[0]} memberships for {n_events} events")
        take = mask & ~assigned
        labels[take] = label
        assigned |= take
        names.append(label)
    return labels, names


def apply_gatingml(gatingml_path, sample) -> np.ndarray:
    """Apply a GatingML 2.0 file's gates to a Sample; returns leaf labels (n_events,) of str.

    The sample may be read compensated or not: a gate on compensated values (``compensation-ref``
    ``FCS`` or a matrix of the file) is applied to the events compensated as the gate says, one on
    ``uncompensated`` values to the events as the file holds them (:func:`_flowkit_sample`).

    Raises GateImportError naming the file when it cannot be parsed or applied.
    """
    import flowkit

    path = Path(gatingml_path)
    try:
        strategy = flowkit.parse_gating_xml(str(path))
    except Exception as exc:
        raise GateImportError(path, f"not a readable GatingML 2.0 file ({exc})") from None
    gate_ids = strategy.get_gate_ids()
    if not gate_ids:
        raise GateImportError(path, "the file defines no gates")
    try:
        results = strategy.gate_sample(_flowkit_sample(sample, sample.name))
        labels, _ = _leaf_labels(gate_ids, lambda n, p: results.get_gate_membership(n, gate_path=p),
                                 sample.n_events)
    except Exception as exc:
        raise GateImportError(path, f"its gates could not be applied to {sample.name} ({exc})") from None
    return labels


def apply_workspace(wsp_path, samples: dict) -> dict:
    """Apply a FlowJo workspace's gates to the samples it names.

    Parameters
    ----------
    wsp_path : path of the .wsp file
    samples : dict of str -> Sample
        Keyed by the FCS file name the workspace refers to (for example ``"patient_01.fcs"``);
        read compensated or not: each gate is applied to the events compensated by the
        workspace's matrix where its channels are compensated, as FlowJo does.

    Returns
    -------
    dict of str -> ndarray of str
        Sample key -> leaf labels (n_events,), for every sample the workspace gates.
        Raises GateImportError when the workspace cannot be read or matches none of the samples.
    """
    import flowkit

    path = Path(wsp_path)
    fk_samples = [_flowkit_sample(s, key) for key, s in samples.items()]
    try:
        with warnings.catch_warnings(record=True) as caught:
            # A workspace of more samples than were loaded with it is usual; which ones match is
            # decided (and an empty match reported, naming the samples it refers to) below.
            warnings.simplefilter("always")
            workspace = flowkit.Workspace(str(path), fcs_samples=fk_samples)
    except Exception as exc:
        raise GateImportError(path, f"not a readable FlowJo workspace ({exc})") from None
    unloaded = []
    for warning in caught:
        match = _NOT_LOADED.match(str(warning.message))
        if match and issubclass(warning.category, UserWarning):
            unloaded.append(match.group(1))
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    known = set(workspace.get_sample_ids())
    matched = [key for key in samples if key in known]
    if not matched:
        named = sorted(known | set(unloaded))
        raise GateImportError(path, f"the workspace names samples {named[:5]} but none of the "
                                    f"loaded files ({sorted(samples)[:5]})")
    out = {}
    for key in matched:
        try:
            workspace.analyze_samples(sample_id=key, use_mp=False)
            gate_ids = workspace.get_gate_ids(key)
            labels, _ = _leaf_labels(gate_ids, lambda n, p, k=key: workspace.get_gate_membership(k, n, gate_path=p),
                                     samples[key].n_events)
        except Exception as exc:
            raise GateImportError(path, f"its gates could not be applied to {key} ({exc})") from None
        out[key] = labels
    return out
