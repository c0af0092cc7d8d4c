"""The app's logic without Streamlit (tests import it without a browser): channels across
patients, chart selections as gates, label-change tables, gate templates, zip downloads.
Uploads into patients are :mod:`ui.ingest`.
"""

from __future__ import annotations

import io
import zipfile
from functools import partial

import numpy as np


def missing_model_channels(model, channels) -> list[str]:
    """The model's channels that ``channels`` (a patient's :class:`~gating_core.fcs.Channel` list)
    lacks, matched as the model matches them: same $PnN, else same marker ($PnS),
    case-insensitively. Empty when the model can gate the patient."""
    have = {c.pnn.casefold() for c in channels} | {c.pns.casefold() for c in channels if c.pns}
    markers = list(getattr(model, "channel_markers_", None) or [])
    markers += [""] * (len(model.channels_) - len(markers))
    return [pnn for pnn, pns in zip(model.channels_, markers)
            if pnn.casefold() not in have and not (pns and pns.casefold() in have)]


def later_twins(candidates, order, twins: dict) -> dict[str, str]:
    """The ``candidates`` whose events a patient earlier in ``order`` (the loaded patients, as
    added) already holds: {candidate: that earlier patient}. ``twins``: :meth:`Store.same_events`
    of the candidates. Gating both would count one patient twice in a batch's statistics."""
    position = {name: i for i, name in enumerate(order)}
    later = {}
    for name in candidates:
        earlier = [t for t in twins.get(name, ()) if position.get(t, len(position)) < position.get(name, -1)]
        if earlier:
            later[name] = min(earlier, key=position.__getitem__)
    return later


#: The Train check names a worst patient when its score is this far below the other patients'
#: median (macro-F1 or accuracy, 0-1): nearer, the lowest score is the spread of any cohort.
WORST_PATIENT_GAP = 0.05


def worst_patient_note(scores, title: str):
    """What the Train check says of the held-out patients' ``scores`` (a Series indexed by
    patient, in ``title``'s metric): ("success" | "info" | "warning", text, the patient to mark or
    None). A patient is pointed at only when it stands out from the others."""
    shown = scores.round(3)
    if shown.nunique() == 1:
        return "success", f"All {len(scores)} patients scored {scores.iloc[0]:.3f} ({title}).", None
    worst = scores.idxmin()
    others = scores.drop(worst).median()
    if others - scores[worst] > WORST_PATIENT_GAP:
        return "warning", (f"Worst patient: **{worst}** ({title} {scores[worst]:.3f} when held out): its labels "
                           "agree least with what the other patients taught the model. Look at its labels first: a "
                           "population drawn differently from the others', or one the others lack?"), worst
    return "info", (f"Lowest: {worst} ({title} {scores[worst]:.3f} when held out), within "
                    f"{others - scores[worst]:.3f} of the other patients' median ({others:.3f}): no patient "
                    "stands out."), None


def twin_labels_note(name: str, first: str, labels, first_labels, chosen: bool) -> str:
    """What the Train page says of ``name``, a labeled patient holding exactly the events of the
    labeled patient ``first``: whether their labels agree, and what training on both would do
    (``chosen``: both are among the patients to learn from)."""
    differ = int((np.asarray(labels).astype(str) != np.asarray(first_labels).astype(str)).sum())
    same = f"{name} holds exactly the events of {first}"
    if differ:
        same += (f", with other labels on {differ:,} of its {len(labels):,} cells: one of the two label files "
                 "may belong to another patient")
    else:
        same += ", with the same labels (the same file loaded twice?)"
    if chosen:
        return same + (": learned from both, the model is taught two labelings of the same cells."
                       if differ else ": learned from both, that patient counts twice.")
    return f"{same}. It is not chosen."


def channel_presence(samples: dict):
    """DataFrame: one row per channel name ($PnN, with marker), one column per patient, bool."""
    import pandas as pd

    names: list[str] = []
    for sample in samples.values():
        for ch in sample.pnn:
            if ch not in names:
                names.append(ch)
    table = {patient: [ch in set(s.pnn) for ch in names] for patient, s in samples.items()}
    frame = pd.DataFrame(table, index=names)
    frame.index.name = "channel"
    return frame


def unrelated_panels(channels_of: dict) -> list[list[str]]:
    """The patients split into panels that share no channel name with each other: ``channels_of``
    maps each patient to its channel names ($PnN). Patients linked by shared names, directly or
    through others, are one panel. One list (every patient) when all are linked; in first-seen
    order."""
    names = list(channels_of)
    parent = list(range(len(names)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    holder: dict[str, int] = {}
    for i, name in enumerate(names):
        for channel in channels_of[name]:
            if channel in holder:
                parent[root(i)] = root(holder[channel])
            else:
                holder[channel] = i
    panels: dict[int, list[str]] = {}
    for i, name in enumerate(names):
        panels.setdefault(root(i), []).append(name)
    return list(panels.values())


def common_channels(samples) -> list[str]:
    """Channel names ($PnN) present in every sample, in the first sample's order."""
    samples = list(samples)
    if not samples:
        return []
    shared = set(samples[0].pnn)
    for s in samples[1:]:
        shared &= set(s.pnn)
    return [c for c in samples[0].pnn if c in shared]


def training_panel(channels_of: dict, model_patients=()) -> tuple[list[str], dict[str, str]]:
    """The patients a training starts from, one panel of them: ``channels_of`` maps each labeled
    patient to its channel names ($PnN). The panel is the channel set of the current model's
    training patients (``model_patients``, the most of them when they differ), else the channel
    set most patients share (the first such group on a tie). Returns the patients of that panel
    in order, and for each other patient why it is left out."""
    groups: dict[frozenset, list[str]] = {}
    for name, channels in channels_of.items():
        groups.setdefault(frozenset(channels), []).append(name)
    if not groups:
        return [], {}
    of_model = [frozenset(channels_of[n]) for n in model_patients if n in channels_of]
    if of_model:
        panel = max(set(of_model), key=of_model.count)
    else:
        panel = max(groups, key=lambda key: len(groups[key]))  # max keeps the first of equals
    by = "the current model's panel" if of_model else "the panel most labeled patients share"
    left_out = {}
    for name, channels in channels_of.items():
        if frozenset(channels) == panel:
            continue
        missing = [c for c in sorted(panel) if c not in set(channels)]
        extra = [c for c in channels if c not in panel]
        parts = [f"{len(channels)} channels against {len(panel)}"]
        if missing:
            parts.append("lacks " + some_names(missing))
        if extra:
            parts.append("has " + some_names(extra))
        left_out[name] = f"another panel than {by} ({'; '.join(parts)})"
    return [n for n in channels_of if n not in left_out], left_out


def some_names(names: list) -> str:
    """Up to four names, then how many more."""
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def rename_channels(sample, mapping: dict):
    """Copy of ``sample`` with channels renamed ($PnN old -> new); events are shared, not copied.

    Raises ValueError when a renamed channel would clash with an existing one.
    """
    from gating_core.fcs import Channel, Sample

    new_names = [mapping.get(c.pnn, c.pnn) for c in sample.channels]
    if len(set(new_names)) != len(new_names):
        dupes = sorted({n for n in new_names if new_names.count(n) > 1})
        raise ValueError(f"{sample.name}: renaming would give two channels named {', '.join(dupes)}")
    channels = [Channel(mapping.get(c.pnn, c.pnn), c.pns, c.range) for c in sample.channels]
    spill = [mapping.get(c, c) for c in sample.spillover_channels]
    return Sample(sample.name, sample.events, channels, dict(sample.keywords), sample.spillover, spill,
                  sample.version, sample.path, sample.compensated)


def zip_files(files: dict) -> bytes:
    """A zip archive (bytes) of ``{archive name: bytes}``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def shape_from_selection(selection) -> dict | None:
    """The latest box or lasso of a plotly chart selection, in the chart's axis coordinates.

    ``selection`` is what ``st.plotly_chart(..., on_select="rerun")`` reports: a mapping with
    ``"box"`` (list of ``{"x": [x0, x1], "y": [y0, y1]}``) and ``"lasso"`` (list of ``{"x": [...],
    "y": [...]}``). A lasso wins over a box (a chart reports one kind at a time). Returns
    ``{"kind": "polygon" | "rectangle", "vertices": [(x, y), ...]}`` or None.
    """
    if not selection:
        return None
    lasso = selection.get("lasso") or []
    box = selection.get("box") or []
    if lasso:
        last = lasso[-1]
        xs, ys = list(last.get("x") or []), list(last.get("y") or [])
        if len(xs) >= 3 and len(xs) == len(ys):
            return {"kind": "polygon", "vertices": [(float(x), float(y)) for x, y in zip(xs, ys)]}
    if box:
        last = box[-1]
        xs, ys = list(last.get("x") or []), list(last.get("y") or [])
        if len(xs) == 2 and len(ys) == 2:
            return {"kind": "rectangle", "vertices": [(float(min(xs)), float(min(ys))), (float(max(xs)), float(max(ys)))]}
    return None


def label_change_table(before, after):
    """What replacing a patient's labels ``before`` by ``after`` does, population by population.

    Returns a DataFrame with columns ``population``, ``before``, ``after``, ``change`` (counts;
    ``before`` is all zero when the patient had no labels), populations of either side, the
    largest first. Shown before the replacement is confirmed.
    """
    import pandas as pd

    after_counts = pd.Series(np.asarray(after).astype(str)).value_counts()
    before_counts = (pd.Series(np.asarray(before).astype(str)).value_counts() if before is not None
                     else pd.Series(dtype="int64"))
    names = list(dict.fromkeys([*before_counts.index, *after_counts.index]))
    table = pd.DataFrame({"population": names,
                          "before": [int(before_counts.get(n, 0)) for n in names],
                          "after": [int(after_counts.get(n, 0)) for n in names]})
    table["change"] = table["after"] - table["before"]
    return table


def lost_populations(before, after) -> list[str]:
    """Populations the patient has in ``before`` and no longer in ``after`` (learned as nothing,
    or as "other", by the next training)."""
    if before is None:
        return []
    kept = set(np.asarray(after).astype(str))
    return sorted(set(np.asarray(before).astype(str)) - kept)


def label_set_disagreements(label_sets: dict) -> dict:
    """Which populations some training patients have and others lack.

    ``label_sets``: patient -> iterable of population names. Returns population -> sorted list
    of the patients that lack it, for every population not shared by all (empty when all agree).
    Training on such patients teaches the model that the missing population is "other".
    """
    sets = {p: {str(n) for n in names} for p, names in label_sets.items()}
    every = set().union(*sets.values()) if sets else set()
    return {pop: sorted(p for p, names in sets.items() if pop not in names)
            for pop in sorted(every) if any(pop not in names for names in sets.values())}


def incompatible_label_sets(label_sets: dict) -> list[str]:
    """Patients whose labels are not the same kind of labeling as the others': they name a
    population no other patient has, or lack more than half of all the populations named.

    A patient lacking one or two populations is often biology (a B-cell-depleted patient has no
    B cells), so that alone only deserves a warning; a patient labeled "Cells" / "other" beside
    patients labeled with eight populations is a different labeling, and training on both
    teaches the model that every other population is "other".
    """
    sets = {p: {str(n) for n in names} for p, names in label_sets.items()}
    every = set().union(*sets.values()) if sets else set()
    odd = []
    for patient, names in sets.items():
        others = set().union(*(n for p, n in sets.items() if p != patient)) if len(sets) > 1 else names
        if names - others or len(every - names) > len(every) / 2:
            odd.append(patient)
    return sorted(odd)


def autogate_templates(gate_trees: dict, populations, trained_on=()) -> list[str]:
    """Patients whose gate tree can shape an auto-gate result: those with at least one leaf gate
    named like one of ``populations`` (a model's); the patients the model was trained on
    (``trained_on``) first -- the tree a lab drew, not one a review accepted since -- then most
    matching leaves first, then by name.

    ``gate_trees``: patient name -> GateTree (the labeled patients')."""
    from gating_core.gates.autogates import template_matches

    trained_on = set(trained_on)
    scored = [(len(template_matches(tree, populations)), name) for name, tree in gate_trees.items() if len(tree)]
    return [name for n, name in sorted(scored, key=lambda t: (t[1] not in trained_on, -t[0], t[1])) if n > 0]


def unknown_cells_notice(patient: str, populations, model_populations=()) -> str | None:
    """What the Auto-gate page says when a model gated cells of ``patient`` as "unknown" (beyond
    every population it was trained on), or None when it gated none. ``model_populations``: the
    model's populations (a model trained on a population the lab named "unknown" has no such
    cells to report)."""
    from gating_core.model import UNKNOWN

    if UNKNOWN in {str(p) for p in model_populations}:
        return None
    values = np.asarray(populations).astype(str, copy=False)
    n = int(np.count_nonzero(values == UNKNOWN))
    if n == 0:
        return None
    return (f"**{n:,} cells of {patient} ({100.0 * n / len(values):.2g}%) lie beyond every population the model "
            f"was trained on** and are gated as '{UNKNOWN}': a population the training patients lacked, or "
            "debris or an instrument fault. Review them: reassigned to a population, or named as a new one "
            "(Reassign to, New population…), they count as it.")


def review_notice(patient: str, novelty) -> tuple[str, str] | None:
    """What the Auto-gate page says of a gated patient's novelty and of how much the model's parts
    disagree on its cells: ("warning" or "success", markdown), or None without a novelty (a
    result stored before either was measured gives what it has)."""
    from gating_core.model.result import constant_channel_names, novelty_field, review_flags

    if novelty is None:
        return None
    novel, disagree = review_flags(novelty)
    get = partial(novelty_field, novelty)
    disagreement, threshold = get("disagreement"), get("disagreement_threshold")
    parts = ""
    if disagreement is not None:
        parts = (f"The transfer model and {patient}'s own populations name different populations for "
                 f"{float(disagreement):.1%} of its cells (review above {float(threshold):.0%}).")
    kind, text = _novelty_notice(patient, novel, disagree, get, parts)
    constant = constant_channel_names(novelty)
    if constant:
        one = len(constant) == 1
        return "warning", (f"**{', '.join(constant)} {'holds' if one else 'hold'} one value on every event of "
                           f"{patient}**: a detector off or a channel not recorded? The gates that use "
                           f"{'it' if one else 'them'} are guesses: review them by hand. {text}")
    return kind, text


def _novelty_notice(patient: str, novel: bool, disagree: bool, get, parts: str) -> tuple[str, str]:
    """:func:`review_notice` from the novelty and the parts' disagreement alone."""
    if novel:
        return "warning", " ".join(
            [f"**{patient} is unlike the training patients** (novelty score {float(get('score')):.2f}, threshold "
             f"{float(get('threshold')):.2f}): review its populations by hand."] + ([parts] if parts else [])
            + (["Compare the model's two parts (below) to start from the one that looks right."] if disagree else []))
    if disagree:
        return "warning", (f"**The model's parts disagree on {patient}.** {parts} Patients with this much "
                           "disagreement were gated less accurately: review its populations by hand, and compare the two parts "
                           "(below) to start from the one that looks right.")
    return "success", " ".join(
        [f"{patient} resembles the training patients (novelty score {float(get('score')):.2f}, threshold "
         f"{float(get('threshold')):.2f})."] + ([parts] if parts else []))


def review_worklist(novelties: dict, accepted=()):
    """The gated patients, those to review first on top: a DataFrame with columns patient,
    review (why, or empty), disagreement (the share of cells the model's parts disagree on, NaN
    where not measured), novelty and accepted, from ``{patient: novelty}`` (a Novelty, its stored
    dict or None). Patients unlike the training ones first, then those the parts disagree on, each
    by decreasing disagreement. A patient in ``accepted`` was reviewed and accepted: it is no
    longer to review, and comes last."""
    import pandas as pd

    from gating_core.model.result import constant_channel_names, novelty_field, review_flags, review_order

    accepted = set(accepted)
    rows = []
    for patient in review_order(novelties):
        novelty = novelties[patient]
        novel, disagree = review_flags(novelty)
        get = partial(novelty_field, novelty)
        constant = constant_channel_names(novelty)
        reasons = ((["unlike the training patients"] if novel else []) + (["the model's parts disagree"]
                                                                         if disagree else [])
                   + ([f"{', '.join(constant)}: one value on every event"] if constant else []))
        disagreement, score = get("disagreement"), get("score")
        rows.append({"patient": patient, "review": "" if patient in accepted else "; ".join(reasons),
                     "disagreement": float("nan") if disagreement is None else float(disagreement),
                     "novelty": float("nan") if score is None else float(score),
                     "accepted": patient in accepted})
    rows.sort(key=lambda row: row["accepted"])  # stable: the order above within each
    return pd.DataFrame(rows, columns=["patient", "review", "disagreement", "novelty", "accepted"])


def worklist_display(worklist):
    """:func:`review_worklist` as shown: the disagreement in percent, novelty to two decimals,
    a dash where not measured; indexed by patient."""
    def shown(value, form):
        return "—" if value != value else format(value, form)  # NaN: not measured

    return worklist.assign(disagreement=[shown(v, ".1%") for v in worklist["disagreement"]],
                           novelty=[shown(v, ".2f") for v in worklist["novelty"]],
                           accepted=["yes" if v else "" for v in worklist["accepted"]]).rename(
        columns={"disagreement": "parts disagree on"}).set_index("patient")


def new_population_name(text, populations) -> tuple[str | None, str | None]:
    """A population name typed in review: (the name, None), or (None, why it cannot be one). A
    name that is one of ``populations`` but for its case is that population; a new one follows
    the rule of gate names (so that a gate can be drawn for it) and is not 'unknown'."""
    from gating_core.gates import is_gate_name
    from gating_core.model import UNKNOWN

    name = str(text or "").strip()
    if not name:
        return None, "Type the new population's name."
    # before the names in use: a patient with unknown cells has 'unknown' among its populations
    if name.casefold() == UNKNOWN.casefold():
        return None, f"'{UNKNOWN}' is what the model calls cells beyond every population: give them a name."
    same = next((p for p in populations if str(p).casefold() == name.casefold()), None)
    if same is not None:
        return str(same), None
    if not is_gate_name(name):
        return None, "A population's name is 1-80 printable characters, without '/', and not 'other'."
    return name, None


def acceptance_acknowledgement(patient: str, is_novel: bool, populations, model_populations=(),
                               parts_disagree: bool = False) -> str | None:
    """The box to tick before accepting ``patient``'s reviewed populations as labels, or None:
    when the patient is unlike every training patient, when the model's parts disagree on many
    of its cells, or when cells are still "unknown" (as labels they would become a population of
    that name in the next training), or when a population named in review is new to the model."""
    from gating_core.model import UNKNOWN

    reasons = []
    if is_novel:
        reasons.append(f"{patient} is unlike every training patient; I reviewed its populations by hand")
    elif parts_disagree:
        reasons.append(f"the model's parts disagree on many of {patient}'s cells; I reviewed its populations by hand")
    if unknown_cells_notice(patient, populations, model_populations) is not None:
        reasons.append(f"its '{UNKNOWN}' cells become a population '{UNKNOWN}' of the next training")
    named = sorted(set(np.asarray(populations).astype(str)) - {str(p) for p in model_populations} - {UNKNOWN})
    if len(model_populations) and named:
        reasons.append(f"{', '.join(named)}, named in this review, "
                       + ("is a new population" if len(named) == 1 else "are new populations")
                       + " the next training learns from the patients that have "
                       + ("it" if len(named) == 1 else "them"))
    return ("; ".join(reasons) + ".") if reasons else None
