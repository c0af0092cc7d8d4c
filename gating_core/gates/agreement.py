"""How well an auto-gated patient's gates hold the cells predicted in them, as tables.

:func:`agreement`: one row per gate -- counts, shares, and the F1 of the gate's membership
against the cells predicted in its populations; :func:`flat_statistics`: a result whose
training labels were flat (every population a child of all events) as a one-level table.
"""

from __future__ import annotations

import numpy as np

from gating_core.gates import OTHER, GateTree
from gating_core.gates.autogates import ALL_EVENTS, UNASSIGNED, gate_populations


def agreement(tree: GateTree, sample, populations, memberships=None, unassigned=UNASSIGNED, counted=None):
    """How well the gates hold the cells predicted in them: DataFrame, one row per gate in
    depth-first order, with gate, parent, populations, count, % of parent, % of total, in gate
    (events inside the gate), predicted (cells predicted in the gate's populations), both
    (those also in the gate), precision, recall, F1 (NaN for a gate with no population). For a
    gate with children, cells predicted in an ``unassigned`` population are left out of
    predicted / both / precision / recall / F1, as they are left out of its fit.

    counted : dict gate name -> bool mask, optional
        The cells each gate counts (:func:`counted_cells`); count and the percentages come from
        them. Default: from the gates (count = in gate).
    """
    import pandas as pd

    populations = np.asarray(populations).astype(str)
    masks = memberships if memberships is not None else tree.memberships(sample)
    counts = counted if counted is not None else masks
    wanted = gate_populations(tree, np.unique(populations))
    total = sample.n_events
    rows = []
    for gate in tree.depth_first():
        inside = masks[gate.name]
        count = int(np.count_nonzero(counts[gate.name]))
        parent_count = total if gate.parent is None else int(np.count_nonzero(counts[gate.parent]))
        pops = sorted(wanted[gate.name])
        row = {"gate": gate.name, "parent": gate.parent or ALL_EVENTS, "populations": ", ".join(pops),
               "count": count, "% of parent": 100.0 * count / parent_count if parent_count else 0.0,
               "% of total": 100.0 * count / total if total else 0.0, "in gate": int(inside.sum())}
        if pops:
            target = np.isin(populations, pops)
            if tree.children(gate.name):
                kept = ~np.isin(populations, list(unassigned))
                inside, target = inside & kept, target & kept
            both = int((inside & target).sum())
            n_t, n_g = int(target.sum()), int(inside.sum())
            precision = both / n_g if n_g else float("nan")
            recall = both / n_t if n_t else float("nan")
            f1 = 2 * both / (n_t + n_g) if (n_t + n_g) else float("nan")
            row.update(predicted=n_t, both=both, precision=precision, recall=recall, F1=f1)
        else:
            row.update(predicted=0, both=0, precision=float("nan"), recall=float("nan"), F1=float("nan"))
        rows.append(row)
    return pd.DataFrame(rows, columns=["gate", "parent", "populations", "count", "% of parent", "% of total",
                                       "in gate", "predicted", "both", "precision", "recall", "F1"])


def flat_statistics(populations):
    """A flat result presented as a one-level tree: DataFrame (population, parent = "(all
    events)", count, % of parent, % of total), one row per population, largest first. With no
    gate tree, % of parent is % of total: there is no intermediate gate to be a parent."""
    import pandas as pd

    populations = np.asarray(populations).astype(str)
    names, counts = np.unique(populations, return_counts=True)
    order = sorted(range(len(names)), key=lambda i: (names[i] == OTHER, -counts[i], names[i]))
    total = max(int(populations.size), 1)
    rows = [{"population": str(names[i]), "parent": ALL_EVENTS, "count": int(counts[i]),
             "% of parent": 100.0 * counts[i] / total, "% of total": 100.0 * counts[i] / total} for i in order]
    return pd.DataFrame(rows, columns=["population", "parent", "count", "% of parent", "% of total"])
