"""Gates drawn in the product, written for other tools: GatingML 2.0 and FlowJo workspaces.

A :class:`~gating_core.gates.GateTree` becomes a ``flowkit.GatingStrategy`` and FlowKit writes
the file, so the result is what FlowKit itself would export. Each gate type builds its own FlowKit
gate (``Gate.flowkit_gate``) through a :class:`StrategyWriter`, which holds the axes, transforms
and node paths. The geometry is carried exactly:

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

The gates apply to the events as the product gated them: compensated by the file's own spillover
matrix when it has one and compensation is on (the sample given is then compensated). Such gates
are written on compensated values, so that FlowJo, FlowKit or any GatingML reader applies them
to the file as the product did: GatingML dimensions refer to the file's matrix
(``compensation-ref="FCS"``); a FlowJo workspace carries the matrix (as FlowJo's
``Acquisition-defined`` one, each sample its own file's, whose ``Comp-`` channels the gates are
drawn on). Gates drawn on a
file without a matrix, or with compensation off, are written ``uncompensated``. Re-imported with
:func:`gating_core.gates.apply_gatingml` / :func:`~gating_core.gates.apply_workspace` (given the
sample read compensated or not) they label every event as :meth:`GateTree.labels` does.

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

from gating_core.gates import GATE_KINDS, AxisScale, GateError, GateTree, xml_gate_id
from gating_core.io.flowkit_interop import flowkit_sample_via_fcs

__all__ = ["StrategyWriter", "gating_strategy", "export_gatingml", "export_flowjo_workspace"]

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


#: The compensation reference of gates drawn on the file's own matrix, in GatingML.
FILE_MATRIX = "FCS"
#: FlowJo's name for the matrix a file carries, the one a workspace export writes.
WORKSPACE_MATRIX = "Acquisition-defined"
#: FlowJo's name of a compensated channel: the prefix, then the channel's $PnN (FlowKit's too).
COMPENSATED_PREFIX = "Comp-"


def drawn_compensated(sample) -> bool:
    """Whether gates drawn on ``sample`` are on values compensated by its file's matrix."""
    return sample is not None and bool(getattr(sample, "compensated", False)) \
        and getattr(sample, "spillover", None) is not None


class _Axis:
    """One gate axis in FlowKit terms: its transform (or None) and how our coordinates map to it."""

    def __init__(self, pnn: str, scale: AxisScale, top: float, compensation_ref: str = "uncompensated"):
        from flowkit import transforms

        self.pnn, self.scale, self.compensation_ref = pnn, scale, compensation_ref
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

    def dimension(self, low: float | None = None, high: float | None = None):
        """The FlowKit Dimension of this axis, bounded by [low, high] when given. Our bounds
        include the upper edge, GatingML's exclude it: the maximum written is the next float up."""
        from flowkit import Dimension

        range_min = None if low is None else self.coordinate(low)
        range_max = None if high is None else float(np.nextafter(self.coordinate(high), np.inf))
        return Dimension(self.pnn, self.compensation_ref, self.transform_id, range_min=range_min, range_max=range_max)


class StrategyWriter:
    """Builds a ``flowkit.GatingStrategy`` from a gate tree: each gate adds itself
    (:meth:`~gating_core.gates.Gate.write_flowkit`) through what this offers.

    Attributes
    ----------
    tree : GateTree
        The gates being written.
    strategy : flowkit.GatingStrategy
    channel_of : dict
        Transform id -> $PnN of the channel it transforms.
    compensation_ref : str
        What every dimension's values are: ``"uncompensated"``, or compensated by the matrix of
        that id (``"FCS"``: the file's own).
    """

    def __init__(self, tree: GateTree, sample, xml_ids: bool, compensation_ref: str = "uncompensated"):
        import flowkit

        self.tree, self.sample, self.compensation_ref = tree, sample, compensation_ref
        self.strategy = flowkit.GatingStrategy()
        self.gate_id = xml_gate_id if xml_ids else str
        self.channel_of: dict = {}
        self._transform_ids: dict = {}  # (channel, scale) -> transform id
        self._node_path: dict = {}  # gate name -> its node's full path in the strategy, itself included
        self._taken = set(tree.names)
        self._containers: dict = {}  # container id prefix -> how many were written

    def write(self):
        """The strategy with every gate of the tree, in tree order."""
        for gate in self.tree.gates:
            if gate.name not in self._node_path:  # a quadrant is written with the first of its split
                gate.write_flowkit(self)
        return self.strategy

    def axis(self, channel: str, scale: AxisScale) -> _Axis:
        """The axis of ``channel`` drawn on ``scale``, its transform added to the strategy once."""
        pnn = _channel_pnn(channel, self.sample)
        axis = _Axis(pnn, scale, _channel_top(pnn, self.sample), self.compensation_ref)
        if axis.transform is not None:
            key = (pnn, scale)
            if key not in self._transform_ids:
                # Plain ids (the channel name may hold characters an XML id cannot).
                transform_id = f"{scale.kind}_{len(self._transform_ids) + 1}"
                self._transform_ids[key] = transform_id
                self.channel_of[transform_id] = pnn
                self.strategy.add_transform(transform_id, axis.transform)
            axis.transform_id = self._transform_ids[key]
        return axis

    def reference(self, name: str) -> dict:
        """A BooleanGate's reference to gate ``name`` (written before it)."""
        return {"ref": self.gate_id(name), "path": self._node_path[name][:-1], "complement": False}

    def container_id(self, base: str) -> str:
        """The id of a gate holding populations (a QuadrantGate) no gate of the tree has:
        ``"{base} 1"``, ``"{base} 2"``, ... (the populations inside carry the tree's names)."""
        self._containers[base] = self._containers.get(base, 0) + 1
        name, k = f"{base} {self._containers[base]}", 1
        while name in self._taken:
            k += 1
            name = f"{base} {self._containers[base]} ({k})"
        self._taken.add(name)
        return self.gate_id(name)

    def add(self, gate, fk_gate) -> None:
        """Add ``fk_gate``, written for ``gate``, under the node of gate's parent."""
        path = self._parent_path(gate)
        self.strategy.add_gate(fk_gate, gate_path=path)
        self._node_path[gate.name] = (*path, self.gate_id(gate.name))

    def add_container(self, fk_gate, gate, members) -> None:
        """Add ``fk_gate`` (a QuadrantGate) under ``gate``'s parent, holding ``members``' populations."""
        path = self._parent_path(gate)
        self.strategy.add_gate(fk_gate, gate_path=path)
        for member in members:
            self._node_path[member.name] = (*path, fk_gate.gate_name, self.gate_id(member.name))

    def _parent_path(self, gate) -> tuple:
        return self._node_path[gate.parent] if gate.parent is not None else ("root",)


def gating_strategy(tree: GateTree, sample=None, *, xml_ids: bool = False):
    """The ``flowkit.GatingStrategy`` of a gate tree.

    ``sample`` (optional) resolves channel names given as markers ($PnS) to $PnN and gives each
    arcsinh axis its channel's range; without it the names are used as they are. ``xml_ids``
    writes gate names as GatingML ids (:func:`~gating_core.gates.xml_gate_id`: GatingML ids are
    XML NCNames, so ``"T cells"`` becomes ``"T_x0020_cells"``; the importers decode them).
    Raises GateError for an empty tree or a channel the sample lacks.
    """
    return _strategy_and_channels(tree, sample, xml_ids)[0]


def _strategy_and_channels(tree: GateTree, sample, xml_ids: bool, compensation_ref=None):
    """(GatingStrategy, {transform id: $PnN of the channel it transforms}). ``compensation_ref``
    None: ``"FCS"`` for gates drawn on a compensated sample (:func:`drawn_compensated`), else
    ``"uncompensated"``."""
    if len(tree) == 0:
        raise GateError("there are no gates to export")
    if compensation_ref is None:
        compensation_ref = FILE_MATRIX if drawn_compensated(sample) else "uncompensated"
    writer = StrategyWriter(tree, sample, xml_ids, compensation_ref)
    return writer.write(), writer.channel_of


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
        export of it would (:func:`gating_core.io.export.export_keywords`): only those needed to
        read the data, plus ``keep_keywords``, or every keyword with ``include_identifying``.

    Re-import with :func:`gating_core.gates.apply_workspace`. Raises GateError when the gates
    cannot be expressed in a workspace (one channel drawn on two different scales).
    """
    import flowkit

    samples = list(samples)
    if not samples:
        raise GateError("a FlowJo workspace needs at least one sample")
    unsupported = [g for g in tree.gates if not g.flowjo_workspace]
    if unsupported:  # FlowKit's workspace writer knows polygon and rectangle gates (a range is a rectangle)
        kinds = " or ".join(k for k in GATE_KINDS if k in {g.kind for g in unsupported})
        raise GateError(f"the gates cannot be written as a FlowJo workspace: "
                        f"{', '.join(g.name for g in unsupported)} are {kinds} gates, which FlowKit's "
                        f"workspace writer lacks; export GatingML instead")
    ids = [workspace_sample_id(s) for s in samples]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise GateError(f"two samples would have the same name in the workspace: {', '.join(duplicates)}")
    compensated = [drawn_compensated(s) for s in samples]
    if any(compensated) and not all(compensated):
        # The gates are written on the Comp- channels of every sample or of none.
        raise GateError("some of the samples are compensated and some are not, and one workspace's gates are "
                        "drawn on compensated channels for all its samples or for none: export them apart")
    strategy, channel_of = _strategy_and_channels(tree, samples[0], xml_ids=False,
                                                  compensation_ref=WORKSPACE_MATRIX if all(compensated) else None)
    if all(compensated):
        strategy.add_comp_matrix(WORKSPACE_MATRIX, _file_matrix(samples[0]))
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
    if all(compensated):
        document = _with_sample_matrices(document, samples)
    return _atomic_write(Path(path), lambda handle: handle.write(document))


def _file_matrix(sample):
    """The FlowKit Matrix of the sample's spillover (its channels' $PnN as detectors, their
    markers as fluorochromes)."""
    from flowkit import Matrix

    markers = [sample.channels[sample.channel_index(n)].pns or n for n in sample.spillover_channels]
    return Matrix(np.asarray(sample.spillover, dtype=np.float64), list(sample.spillover_channels), markers)


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


def _with_sample_matrices(document: bytes, samples) -> bytes:
    """The workspace with each sample's own matrix inside its Sample element, after its DataSet,
    where FlowJo keeps the matrix a sample is compensated with (and FlowKit's reader looks for
    it); FlowKit's writer puts the first sample's under Matrices alone."""
    from lxml import etree

    root = etree.fromstring(document)
    for element, sample in zip(root.iter("Sample"), samples):
        data_set = element.find("DataSet")
        matrix = etree.SubElement(element, f"{{{_TRANSFORMS_NS}}}spilloverMatrix")
        element.insert(0 if data_set is None else list(element).index(data_set) + 1, matrix)
        for name, value in (("spectral", "0"), ("prefix", COMPENSATED_PREFIX), ("name", WORKSPACE_MATRIX),
                            ("version", "FlowJo-10.7.1"), ("suffix", "")):
            matrix.set(name, value)
        channels, spillover = list(sample.spillover_channels), np.asarray(sample.spillover, dtype=np.float64)
        parameters = etree.SubElement(matrix, f"{{{_DATATYPE_NS}}}parameters")
        for channel in channels:
            parameter = etree.SubElement(parameters, f"{{{_DATATYPE_NS}}}parameter")
            parameter.set(f"{{{_DATATYPE_NS}}}name", channel)
            parameter.set("userProvidedCompInfix", COMPENSATED_PREFIX + channel)
        for channel, row in zip(channels, spillover):  # a row: what the channel's dye spills into each
            spill = etree.SubElement(matrix, f"{{{_TRANSFORMS_NS}}}spillover")
            spill.set(f"{{{_DATATYPE_NS}}}parameter", channel)
            spill.set("userProvidedCompInfix", COMPENSATED_PREFIX + channel)
            for other, value in zip(channels, row):
                coefficient = etree.SubElement(spill, f"{{{_TRANSFORMS_NS}}}coefficient")
                coefficient.set(f"{{{_DATATYPE_NS}}}parameter", other)
                coefficient.set(f"{{{_TRANSFORMS_NS}}}value", repr(float(value)))
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
