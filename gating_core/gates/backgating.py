"""Back-gating: where a population's cells sit on the plots of the gates above it.

A gate is drawn on its parent's plot: the parent population's events on the gate's two channels
(one for a range gate). Back-gating a population highlights its cells on every such plot along
its path from all events down to it, so a lab checks that, say, the CD4 T cells really sit in the
lymphocyte cloud on FSC / SSC. A boolean gate has no plot of its own; its operands' paths stand
in for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gating_core.gates import AxisScale, GateError, GateTree

__all__ = ["BackgatePlot", "backgating", "gate_path"]


@dataclass
class BackgatePlot:
    """One ancestor plot of a back-gated population.

    Attributes
    ----------
    gate : str
        The gate drawn on this plot.
    parent : str or None
        The population the plot shows (None: all events).
    x_channel, y_channel : str, str or None
        The plot's channels (``y_channel`` None: a histogram, for a range gate).
    x_scale, y_scale : AxisScale
        The gate's own axes.
    events : ndarray of bool, shape (n_events,)
        The plot's events (the parent population).
    highlight : ndarray of bool, shape (n_events,)
        The back-gated population's cells among them (a subset of ``events``).
    """

    gate: str
    parent: str | None
    x_channel: str
    y_channel: str | None
    x_scale: AxisScale
    y_scale: AxisScale
    events: np.ndarray
    highlight: np.ndarray

    @property
    def count(self) -> int:
        """Cells of the population on this plot."""
        return int(self.highlight.sum())


def gate_path(tree: GateTree, name: str) -> list[str]:
    """The gates with a plot from all events down to ``name``, in tree order: ``name``, its
    ancestors, and for each boolean gate among them, the paths of its operands."""
    if name not in tree:
        raise GateError(f"no gate named {name!r}")
    wanted: set[str] = set()
    frontier = [name]
    while frontier:
        current = frontier.pop()
        if current in wanted:
            continue
        wanted.add(current)
        gate = tree[current]
        if gate.parent is not None:
            frontier.append(gate.parent)
        frontier.extend(gate.references)
    return [g.name for g in tree.gates if g.name in wanted and g.channels]


def backgating(tree: GateTree, name: str, sample, memberships=None) -> list[BackgatePlot]:
    """The ancestor plots of population ``name``, each with the mask of the population's cells.

    Parameters
    ----------
    tree : GateTree
    name : str
        The population (gate) to back-gate.
    sample : Sample
    memberships : dict, optional
        ``tree.memberships(sample)`` when already computed.

    Returns
    -------
    list of BackgatePlot, from the top of the tree down (empty when no gate on the path has
    axes, e.g. a boolean gate of boolean gates).
    """
    masks = memberships if memberships is not None else tree.memberships(sample)
    population = np.asarray(masks[name], dtype=bool)
    everything = np.ones(sample.n_events, dtype=bool)
    plots = []
    for gate_name in gate_path(tree, name):
        gate = tree[gate_name]
        events = masks[gate.parent] if gate.parent is not None else everything
        plots.append(BackgatePlot(gate.name, gate.parent, gate.x_channel, gate.y_channel, gate.x_scale,
                                  gate.y_scale, events, population & events))
    return plots
