"""Gates drawn in the product, written for other tools: GatingML 2.0 and FlowJo workspaces.

A :class:`~gating_core.gates.GateTree` becomes a ``flowkit.GatingStrategy`` and FlowKit writes
the file, so the result is what FlowKit itself would export. The geometry is carried exactly:

* a linear axis is an untransformed GatingML dimension (raw values);
* a logicle axis is GatingML's logicle with the same T, W, M and A = 0 (FlowUtils computes
  both, so the display coordinates are identical);
* an arcsinh axis ``asinh(x / c)`` is GatingML's ``fasinh`` with A = 0, T the channel's range
  (262144 when unknown) and M = asinh(T / c) / ln 10, which maps a value to
  ``asinh(x / c) / (M ln 10)``; the vertices are divided by ``M ln 10`` to match;
* a rectangle includes its upper edge here, GatingML's excludes it: the exported maximum is the
  next float above ours, so an event on the edge stays inside;
* a range gate is a GatingML rectangle with one dimension (upper edge as above);
* the quadrant gates split at one point become one GatingML QuadrantGate (two dividers, one
  Quadrant per population; "+" is [split, inf), "-" is (-inf, split), as here); gates nested in
  a quadrant sit under the QuadrantGate and that Quadrant, as GatingML wants;
* a boolean gate is a GatingML BooleanGate (and / or / not) referring to its operands by path.

The gates apply to the events as the product gated them (compensated when the patient's file
has a spillover matrix and compensation is on), so the dimensions are written uncompensated.
Re-imported with :func:`gating_core.gates.apply_gatingml` / :func:`~gating_core.gates.apply_workspace`
they label every event as :meth:`GateTree.labels` does.

FlowJo workspaces: FlowKit's writer knows linear and logicle axes; an arcsinh axis is written
as FlowJo's ``fasinh`` transform (which FlowKit reads back as GatingML's asinh). A workspace
allows one transform per channel, so a channel drawn on two different scales cannot be written.
"""

from __future__ import annotations

import functools
import io
import math
import os
from pathlib import Path

import numpy as np

from gating_core.gates import AxisScale, GateError, GateTree, xml_gate_id

__all__ = ["gating_strategy", "export_gatingml", "export_flowjo_workspace"]

LN10 = math.log(10.0)
DEFAULT_TOP = 262144.0


def _channel_pnn(name: str, sample) -> str:
    if sample is None:
        return name
    try:
        return sample.pnn[sample.channel_index(name)]
    except KeyError:
        raise GateError(f"{sample.name}: the gates need channel {name!r}, which this sample lacks") from None


def _channel_top(pnn: str, sample) -> float:
    if sample is not None:
        value = sample.channels[sample.pnn.index(pnn)].range
        if value is not None and np.isfinite(value) and value > 1:
            return float(value)
    return DEFAULT_TOP


class _Axis:
    """One gate axis in FlowKit terms: its transform (or None) and how our coordinates map to it."""

    def __init__(self, pnn: str, scale: AxisScale, top: float):
        from flowkit import transforms

        self.pnn, self.scale = pnn, scale
        self.transform_id = None  # set when the transform is added to a strategy
        self.divisor = 1.0
        if scale.kind == "linear":
            self.transform = None
        elif scale.kind == "logicle":
            self.transform = transforms.LogicleTransform(param_t=scale.top, param_w=scale.width,
                                                         param_m=scale.decades, param_a=0.0)
        else:
            decades = math.asinh(top / scale.cofactor) / LN10
            self.transform = transforms.AsinhTransform(param_t=top, param_m=decades, param_a=0.0)
            self.divisor = decades * LN10

    def coordinate(self, value: float) -> float:
        return float(value) / self.divisor


def gating_strategy(tree: GateTree, sample=None, *, xml_ids: bool = False):
    """The ``flowkit.GatingStrategy`` of a gate tree.

    ``sample`` (optional) resolves channel names given as markers ($PnS) to $PnN and gives each
    arcsinh axis its channel's range; without it the names are used as they are. ``xml_ids``
    writes gate names as GatingML ids (:func:`~gating_core.gates.xml_gate_id`: GatingML ids are
    XML NCNames, so ``"T cells"`` becomes ``"T_x0020_cells"``; the importers decode them).
    Raises GateError for an empty tree or a channel the sample lacks.
    """
    return _strategy_and_channels(tree, sample, xml_ids)[0]


def _strategy_and_channels(tree: GateTree, sample, xml_ids: bool):
    """(GatingStrategy, {transform id: $PnN of the channel it transforms})."""
    import flowkit
    from flowkit import Dimension, QuadrantDivider, gates as fk_gates

    if len(tree) == 0:
        raise GateError("there are no gates to export")
    strategy = flowkit.GatingStrategy()
    gate_id = xml_gate_id if xml_ids else str
    transform_ids: dict = {}  # (channel, scale) -> transform id
    channel_of: dict = {}  # transform id -> channel
    node_path: dict = {}  # gate name -> its node's full path in the strategy, itself included
    taken = set(tree.names)
    quadrant_sets = 0

    def axis_of(channel, scale):
        pnn = _channel_pnn(channel, sample)
        axis = _Axis(pnn, scale, _channel_top(pnn, sample))
        if axis.transform is not None:
            key = (pnn, scale)
            if key not in transform_ids:
                # Plain ids (the channel name may hold characters an XML id cannot).
                transform_ids[key] = f"{scale.kind}_{len(transform_ids) + 1}"
                channel_of[transform_ids[key]] = pnn
                strategy.add_transform(transform_ids[key], axis.transform)
            axis.transform_id = transform_ids[key]
        return axis

    def upper(axis, value):
        # ours includes the upper edge, GatingML's excludes it
        return float(np.nextafter(axis.coordinate(value), np.inf))

    for gate in tree.gates:
        if gate.name in node_path:
            continue  # a quadrant written with the first gate of its set
        gate_path = node_path[gate.parent] if gate.parent is not None else ("root",)
        vertices = np.asarray(gate.vertices, dtype=np.float64)
        if gate.kind == "quadrant":
            members = [tree[name] for name in tree.quadrant_set(gate.name)]
            x_axis, y_axis = axis_of(gate.x_channel, gate.x_scale), axis_of(gate.y_channel, gate.y_scale)
            (x, y), = vertices
            dividers = [QuadrantDivider("x_divider", x_axis.pnn, "uncompensated", [x_axis.coordinate(x)],
                                        x_axis.transform_id),
                        QuadrantDivider("y_divider", y_axis.pnn, "uncompensated", [y_axis.coordinate(y)],
                                        y_axis.transform_id)]
            quadrants = []
            for member in members:
                bounds = [(axis.coordinate(v), None) if sign == "+" else (None, axis.coordinate(v))
                          for axis, v, sign in ((x_axis, x, member.quadrant[0]), (y_axis, y, member.quadrant[1]))]
                quadrants.append(fk_gates.Quadrant(gate_id(member.name), ["x_divider", "y_divider"], bounds))
            quadrant_sets += 1
            set_id = _unused_id(f"Quadrants {quadrant_sets}", taken, gate_id)
            strategy.add_gate(fk_gates.QuadrantGate(set_id, dividers, quadrants), gate_path=gate_path)
            for member in members:
                node_path[member.name] = (*gate_path, set_id, gate_id(member.name))
            continue
        if gate.kind == "boolean":
            refs = [{"ref": gate_id(o), "path": node_path[o][:-1], "complement": False} for o in gate.operands]
            fk_gate = fk_gates.BooleanGate(gate_id(gate.name), gate.operator, refs)
        elif gate.kind == "range":
            axis = axis_of(gate.x_channel, gate.x_scale)
            (lo, hi), = vertices
            fk_gate = fk_gates.RectangleGate(gate_id(gate.name), [
                Dimension(axis.pnn, "uncompensated", axis.transform_id, range_min=axis.coordinate(lo),
                          range_max=upper(axis, hi))])
        elif gate.kind == "rectangle":
            axes = [axis_of(gate.x_channel, gate.x_scale), axis_of(gate.y_channel, gate.y_scale)]
            (x0, y0), (x1, y1) = vertices
            dims = [Dimension(axis.pnn, "uncompensated", axis.transform_id, range_min=axis.coordinate(lo),
                              range_max=upper(axis, hi))
                    for axis, lo, hi in ((axes[0], x0, x1), (axes[1], y0, y1))]
            fk_gate = fk_gates.RectangleGate(gate_id(gate.name), dims)
        else:
            axes = [axis_of(gate.x_channel, gate.x_scale), axis_of(gate.y_channel, gate.y_scale)]
            dims = [Dimension(axis.pnn, "uncompensated", axis.transform_id) for axis in axes]
            points = [[axes[0].coordinate(x), axes[1].coordinate(y)] for x, y in vertices]
            fk_gate = fk_gates.PolygonGate(gate_id(gate.name), dims, points)
        strategy.add_gate(fk_gate, gate_path=gate_path)
        node_path[gate.name] = (*gate_path, gate_id(gate.name))
    return strategy, channel_of


def _unused_id(base: str, taken: set, gate_id) -> str:
    """A QuadrantGate id no gate of the tree has (the quadrants carry the population names)."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base} ({k})"
    taken.add(name)
    return gate_id(name)


def _atomic_write(path: Path, write) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def export_gatingml(tree: GateTree, path: str | os.PathLike, sample=None) -> Path:
    """Write the gate tree as a GatingML 2.0 file (through FlowKit); returns the path.

    ``sample`` resolves marker names to $PnN and gives arcsinh axes their channel range (see
    :func:`gating_strategy`). Re-import with :func:`gating_core.gates.apply_gatingml`.
    """
    import flowkit

    strategy = gating_strategy(tree, sample, xml_ids=True)
    return _atomic_write(Path(path), lambda handle: flowkit.export_gatingml(strategy, handle))


def workspace_sample_id(sample) -> str:
    """The FCS file name a workspace refers to a sample by (the key :func:`apply_workspace` takes)."""
    if sample.path and Path(sample.path).suffix.lower() == ".fcs" and "#" not in sample.name:
        return Path(sample.path).name
    return f"{sample.name}.fcs"


def export_flowjo_workspace(tree: GateTree, path: str | os.PathLike, samples, *, group_name: str = "All Samples",
                            include_identifying: bool = False, keep_keywords=()) -> Path:
    """Write the gate tree, applied to ``samples``, as a FlowJo 10 workspace (.wsp) via FlowKit.

    Parameters
    ----------
    tree : the gates (the same for every sample).
    path : the .wsp file to write.
    samples : the patients (:class:`~gating_core.fcs.Sample`) the workspace lists; each is named
        by its FCS file name (:func:`workspace_sample_id`) and carries the keywords an FCS
        export of it would (:func:`gating_core.export.export_keywords`): only those needed to
        read the data, plus ``keep_keywords``, or every keyword with ``include_identifying``.

    Re-import with :func:`gating_core.gates.apply_workspace`. Raises GateError when the gates
    cannot be expressed in a workspace (one channel drawn on two different scales).
    """
    import flowkit

    from gating_core.interop import flowkit_sample_via_fcs

    samples = list(samples)
    if not samples:
        raise GateError("a FlowJo workspace needs at least one sample")
    unsupported = [g.name for g in tree.gates if g.kind in ("quadrant", "boolean")]
    if unsupported:  # FlowKit writes polygon and rectangle gates into workspaces, no others
        raise GateError(f"the gates cannot be written as a FlowJo workspace: {', '.join(unsupported)} "
                        f"are quadrant or boolean gates, which FlowKit's workspace writer lacks; "
                        f"export GatingML instead")
    ids = [workspace_sample_id(s) for s in samples]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise GateError(f"two samples would have the same name in the workspace: {', '.join(duplicates)}")
    strategy, channel_of = _strategy_and_channels(tree, samples[0], xml_ids=False)
    stand_in = _linear_stand_in_class()
    fasinh_by_channel = {}
    for transform_id, transform in list(strategy.transformations.items()):
        if isinstance(transform, flowkit.transforms.AsinhTransform):
            # FlowKit's workspace writer has no arcsinh: a linear stand-in carrying the arcsinh
            # maps lets it write the vertices (as raw values, as FlowJo stores them), and the
            # stand-in's XML element is rewritten as FlowJo's fasinh below.
            strategy.transformations[transform_id] = stand_in(transform)
            fasinh_by_channel[channel_of[transform_id]] = transform
    fk_samples = [flowkit_sample_via_fcs(s, i, include_identifying, keep_keywords) for s, i in zip(samples, ids)]
    session = flowkit.Session(gating_strategy=strategy, fcs_samples=fk_samples)
    buffer = io.BytesIO()
    try:
        session.export_wsp(buffer, group_name)
    except ValueError as exc:  # FlowKit: several transforms for one channel
        raise GateError(f"the gates cannot be written as a FlowJo workspace: {exc}") from None
    document = _with_fasinh(buffer.getvalue(), fasinh_by_channel)
    return _atomic_write(Path(path), lambda handle: handle.write(document))


_TRANSFORMS_NS = "http://www.isac-net.org/std/Gating-ML/v2.0/transformations"
_DATATYPE_NS = "http://www.isac-net.org/std/Gating-ML/v2.0/datatypes"


def _with_fasinh(document: bytes, fasinh_by_channel: dict) -> bytes:
    """The workspace with each stand-in ``linear`` transform of ``fasinh_by_channel``'s
    channels turned into FlowJo's ``fasinh`` (T, M, A; FlowKit ignores length/maxRange/W)."""
    if not fasinh_by_channel:
        return document
    from lxml import etree

    root = etree.fromstring(document)
    for element in root.iter(f"{{{_TRANSFORMS_NS}}}linear"):
        parameter = element.find(f"{{{_DATATYPE_NS}}}parameter")
        channel = None if parameter is None else parameter.get(f"{{{_DATATYPE_NS}}}name")
        transform = fasinh_by_channel.get(channel)
        if transform is None:
            continue
        element.tag = f"{{{_TRANSFORMS_NS}}}fasinh"
        element.attrib.clear()
        for name, value in (("length", 256), ("maxRange", transform.param_t), ("T", transform.param_t),
                            ("M", transform.param_m), ("A", transform.param_a), ("W", 1)):
            element.set(f"{{{_TRANSFORMS_NS}}}{name}", repr(float(value)) if name in "TMA" else str(value))
    return etree.tostring(root.getroottree(), xml_declaration=True, encoding="UTF-8", pretty_print=True)


@functools.lru_cache(maxsize=None)
def _linear_stand_in_class():
    """A FlowKit LinearTransform (so FlowKit's workspace writer accepts it) that maps like an
    arcsinh transform (so the vertices it writes are right). Built on first use: FlowKit is
    imported only when a workspace is written."""
    from flowkit import transforms

    class ArcsinhAsLinear(transforms.LinearTransform):
        def __init__(self, asinh):
            super().__init__(param_t=asinh.param_t, param_a=0.0)
            self.asinh = asinh

        def apply(self, events):
            return self.asinh.apply(events)

        def inverse(self, events):
            return self.asinh.inverse(events)

    return ArcsinhAsLinear
