"""What a fitted model does to a new patient beyond its transfer model, in sentences for its
user: the training summary of ``train`` and the app's list of models both print them."""

from __future__ import annotations

from collections import Counter

import numpy as np

from gating_core.model.weight_check import EVEN_ADAPTIVE_WEIGHT


def adapted_populations_text(model) -> str | None:
    """How the model refits each new patient's populations to its own cells (their weight, why
    that weight, where EM starts, which fits); why it does not when the held-out groups turned
    them off; None when they were set off, or the model has none."""
    describe = getattr(model, "describe", None)
    info = describe() if callable(describe) else {}
    chosen = getattr(model, "selection_", {}).get("adaptive_weight", {})
    if not info.get("adaptive_weight"):
        if chosen.get("folds") and chosen.get("chosen") == 0:
            # chosen, not set: the user should know what the model then lacks
            return ("off: every fold of held-out groups gated better with the transfer model alone, so a new "
                    "patient is gated by it alone (no review flag for disagreeing parts, no --part)")
        return None
    how = "as set"
    if chosen.get("folds"):
        how = ("a third each for the transfer model and the two fits; not every fold of held-out groups found "
               "that clearly worse"
               if chosen.get("chosen") == EVEN_ADAPTIVE_WEIGHT else
               "every fold of held-out groups found the even thirds clearly worse")
    elif chosen:
        how = chosen.get("reason", how).rstrip(".")
    start = ("EM started from the transfer model's posteriors" if info.get("adaptive_start") == "transfer"
             else "EM started from the training populations")
    fits = ("one covariance shared by all populations, and each population's own shape"
            if info.get("adaptive_shapes") else "one covariance shared by all populations")
    split = info.get("split_populations") or {}
    if split:
        fits += "; " + ", ".join(f"{name} as {count} clusters" for name, count in split.items())
    return (f"weight {info['adaptive_weight']:.3g} ({how}); each patient's populations are refitted to its own "
            f"cells by EM, {start}; {fits}")


def pooled_trees_text(model) -> str | None:
    """Whether gradient-boosted trees on the pooled training cells take half the transfer
    model's part, and the held-out groups' accuracy that decided it; None when not checked."""
    table = getattr(model, "selection_", {}).get("trees")
    if not table:
        return None
    if "reason" in table:
        return f"not taken: {table['reason']}"
    without = getattr(model, "selection_", {}).get("adaptive_weight", {}).get("cv_accuracy", {})
    plain = without.get(str(float(getattr(model, "adaptive_weight_", 0.0))))
    figures = (f"held-out groups {table['cv_accuracy']:.4f} with them, {plain:.4f} without"
               if plain is not None else f"held-out groups {table['cv_accuracy']:.4f} with them")
    if getattr(model, "pooled_trees_", None) is not None:
        return f"half the transfer model's part, for the close calls ({figures})"
    return f"not taken: the held-out groups were not gated better with them ({figures})"


def unknown_cells_text(model) -> str | None:
    """Which cells the model calls 'unknown', or None when it calls none."""
    describe = getattr(model, "describe", None)
    margin = (describe() if callable(describe) else {}).get("unknown_margin")
    if margin is None:
        return None
    return f"a gated cell beyond every population ({margin:g} x its reach) is called 'unknown'"


#: Up to this many training patients a model is said to have seen little: four biopsies of one run
#: gated the other run's worst patient far below LDA on nine draws of ten, six of both runs did not
#: (docs/unseen_data.md, "Few training patients").
FEW_TRAINING_PATIENTS = 4


def few_patients_note(model) -> str | None:
    """What a model trained on few patients should say of itself, or None."""
    patients = len(getattr(model, "training_patients_", None) or [])
    if not 0 < patients <= FEW_TRAINING_PATIENTS:
        return None
    return (f"{patients} training patient{'s' if patients > 1 else ''}: the model has seen little of how patients "
            "differ, and its review flags rest on as little; check every gated patient, and train again as more "
            "are gated")


def unknown_name_note(model) -> str | None:
    """What a model whose training labels hold a population named 'unknown' should say, or None:
    gating gives that name to cells beyond every population too, and the two cannot be told apart
    in a gating."""
    from gating_core.model.streaming import UNKNOWN

    if UNKNOWN not in [str(p) for p in getattr(model, "populations_", None) or []]:
        return None
    if unknown_cells_text(model) is None:
        return None
    return (f"a training population is named '{UNKNOWN}', the name gating gives cells beyond every population: "
            "in a gating the two share it; rename that population (e.g. 'unknown cells') to tell them apart")


#: A training patient of fewer events is pointed out: every patient weighs the same in training.
FEW_TRAINING_EVENTS = 100


def few_events_note(names, n_events) -> str | None:
    """What training should say about patients of fewer than FEW_TRAINING_EVENTS events, or None."""
    few = [f"{name} ({int(n):,})" for name, n in zip(names, n_events) if int(n) < FEW_TRAINING_EVENTS]
    if not few:
        return None
    return (f"training patients of few events: {_listed(few)}; every training patient weighs the same, so "
            "their few cells count as much as another patient's thousands")


def mismatched_labels_notes(names, labels) -> list[str]:
    """What training should say about labels that do not match across its patients (``names``:
    the patients; ``labels``: each one's training cells' populations, the cells training drew): a
    patient whose cells share no population with the others' (populations numbered file by file,
    as some experts number them), and, with three patients or more, a population whose training
    cells all come from one patient (a misspelt name, a population only that patient has, or one
    too rare elsewhere to be drawn). Each is learned as it is; the notes say so."""
    held = [set(map(str, np.unique(np.asarray(y).astype(str)))) for y in labels]
    if len(held) < 2:
        return []
    holders = Counter(population for own in held for population in own)  # patients holding each
    notes, alone = [], set()
    for i, (name, own) in enumerate(zip(names, held)):
        if own and all(holders[population] == 1 for population in own):
            alone.add(i)
            notes.append(f"{name}'s training cells share no population with the other patients' (its own: "
                         f"{_listed(sorted(own))}): if its labels name the same populations otherwise, "
                         "give each population one name in every patient's labels")
    if len(held) >= 3:
        owner = {population: i for i, own in enumerate(held) for population in own}  # the one, where one
        single = []
        for population in sorted(p for p, count in holders.items() if count == 1):
            i = owner[population]
            if i not in alone:
                cells = int(np.sum(np.asarray(labels[i]).astype(str) == population))
                single.append(f"'{population}' ({names[i]}, {cells:,} cell{'s' if cells != 1 else ''})")
        if single:
            notes.append(f"training cells of one patient only: {_listed(single)}; a misspelt name is "
                         "learned as a population of its own")
    return notes


def _listed(items, shown: int = 5) -> str:
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


def similar_names_note(model) -> str | None:
    """What a model should say when two of its training populations differ only in letter case
    or spaces ('Ungated' and 'ungated'), which are then learned as two populations, or None."""
    names = [str(p) for p in getattr(model, "populations_", None) or []]
    groups: dict = {}
    for name in names:
        groups.setdefault(" ".join(name.split()).casefold(), []).append(name)
    alike = [group for group in groups.values() if len(group) > 1]
    if not alike:
        return None
    listed = "; ".join(" and ".join(f"'{n}'" for n in group) for group in alike)
    return (f"training populations that differ only in letter case or spaces are learned apart ({listed}): "
            "if each pair is one population, give it one name in every patient's labels")


def saturated_note(model) -> str | None:
    """What a model should say of training patients whose cells pile at a channel's top value (a
    saturated detector), left out of its populations' shared-covariance fit
    (:mod:`gating_core.method.saturation`), or None."""
    saturated = (getattr(model, "selection_", None) or {}).get("saturated") or []
    if not saturated:
        return None
    listed = [f"{v['patient']} ({v['cells']:,} on {', '.join(v['channels'])})" for v in saturated]
    return (f"training cells piled at a channel's top value (a saturated detector) in {len(listed)} "
            f"patient{'s' if len(listed) > 1 else ''}: {_listed(listed)}; the populations' shared "
            "covariance is fitted without them, and gating still sees every cell")
