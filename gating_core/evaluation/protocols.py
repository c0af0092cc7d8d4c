"""Evaluation beside the baselines (design.md section 3): leave one GROUP out, and one patient.

A new patient usually comes from a center, batch or run the model has never seen, so the
protocol that tells the truth holds out whole groups (:func:`leave_one_group_out`); leaving
one patient out (:func:`leave_one_patient_out`) is reported beside it and flatters every method
whenever a held-out patient's twin stays in training.

Every method is measured in the same run on the same split: marginal transfer (the product's
default), pooling (the same estimator without the embedding), a plain pooled logistic
regression on the same random features (every patient weighing the same, no augmentation) and
linear discriminant analysis on the transformed channels (Abdelaal et al., Cytometry A 2019:
the strongest simple published baseline for transferring cell types between cytometry
samples). Reported per patient: accuracy, F1 per population and macro-F1, novelty; then the
mean and the worst patient of each method.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gating_core.evaluation.baselines import DICAPooling, PooledBaseline
from gating_core.model.digest import digest_patient, infer_cell_groups
from gating_core.model.estimator import EVEN_ADAPTIVE_WEIGHT, UNKNOWN, GatingModel
from gating_core.model.research import build_model

METHODS = ("marginal", "pooling", "pooled-ridge", "pooled-logistic", "lda")
#: Every method evaluate can run (METHODS are the default set).
ALL_METHODS = METHODS + ("marginal-alone", "marginal-auto", "marginal-em", "marginal-quantile", "dica-pooling")
#: Methods that are not a GatingModel: fitted per fold, ``predict(sample)`` gives labels.
PREDICTOR_METHODS = ("lda", "qda", "trees", "dica-pooling")
# Standard methods beside LDA: quadratic discriminant analysis and gradient-boosted trees
# (scikit-learn's HistGradientBoostingClassifier), on the same cells.
ALL_METHODS += ("qda", "trees")
# What each part adds: the default without the adapted populations, with them alone; the default
# with each option that is not in it (shift augmentation, a second cell bandwidth, self-training,
# a second start for EM), and the previous default (the first three, no adapted populations).
ALL_METHODS += ("marginal-no-adaptive", "adaptive-lda", "marginal-augment", "marginal-second-bandwidth",
                "marginal-self-training", "previous-default", "marginal-transfer-start")
# The method's family: the papers' hinge loss and multitask kernel, DICA before marginal transfer
# (the distributional variant), importance-weighted Nystroem KRR refitted for each held-out
# patient on its own unlabeled cells (gating_core.model.iw_model, the command line's defaults), linear
# k_X / k'_X as in the JMLR flow-cytometry experiment, and for the worst patient the agnostic
# patient weighting and selection on the worst held-out group.
ALL_METHODS += ("marginal-hinge", "multitask-0.01", "multitask-0.5", "dica-marginal", "iw-nystroem",
                "marginal-linear", "marginal-agnostic", "marginal-select-worst")
# Landmark (peak) registration of each channel, with its skip rule (gating_core.method.alignment).
# The adapted populations with every population one Gaussian (the default splits a population
# made of separate clusters into components).
ALL_METHODS += ("marginal-whole-populations",)
ALL_METHODS += ("marginal-landmarks",)
# The adapted populations' parts: without the own-shape fit (the shared-covariance fit alone), and
# at the even thirds whatever the held-out groups say.
ALL_METHODS += ("marginal-shared-covariance", "marginal-even-weight")
# The default without the check of rare populations the adapted populations let swell, and
# without the pooled trees its weight's check may take.
ALL_METHODS += ("marginal-no-swollen-check", "marginal-no-trees")
#: GatingModel settings of each kernel method (on top of the user's model parameters); a method
#: whose settings name a research option (n_augment, augment_gain, augment_shift,
#: bandwidth_x_hedge, self_training, transfer_start) is a ResearchGatingModel (model.research.build_model). The
#: method's family (hinge, linear kernel, agnostic weighting, selection for the worst group, DICA)
#: is measured as the papers' systems: without the adapted populations.
METHOD_SETTINGS = {
    "marginal": {"method": "marginal"},
    # The marginal model without its pooled companion (pooled_weight=0): what the blend adds.
    "marginal-alone": {"method": "marginal", "pooled_weight": 0.0},
    # The companion's weight chosen by cross-validation over groups instead of the even blend.
    "marginal-auto": {"method": "marginal", "pooled_weight": "auto"},
    # Options fitted on the new patient's unlabeled cells only.
    "marginal-em": {"method": "marginal", "prior_shift": "em"},
    "marginal-quantile": {"method": "marginal", "align": "quantile"},
    "marginal-landmarks": {"method": "marginal", "align": "landmarks"},
    "pooling": {"method": "pooling"},
    # The papers' loss: a cost-sensitive linear SVM on the same features (penalty and bandwidths
    # from the squared loss's selection).
    "marginal-hinge": {"method": "marginal", "loss": "hinge", "adaptive_weight": 0.0},
    # The multitask kernel k_P = tau between training patients (NIPS 2011 table: 0.01 and 0.5);
    # a new patient is gated by the part shared across patients.
    "multitask-0.01": {"method": "multitask", "task_similarity": 0.01},
    "multitask-0.5": {"method": "multitask", "task_similarity": 0.5},
    # Linear k_X and k'_X (JMLR section 8.5): the embedding is the mean cell, each patient's gate
    # linear in the cell, k_P Gaussian on the means; its pooled companion is linear logistic.
    "marginal-linear": {"method": "marginal", "kernel_x": "linear", "adaptive_weight": 0.0},
    # Exponentiated-gradient patient weights towards the worst mixture of training patients.
    "marginal-agnostic": {"method": "marginal", "patient_weighting": "agnostic", "adaptive_weight": 0.0},
    # The transfer model alone, without the populations adapted to each patient.
    "marginal-no-adaptive": {"method": "marginal", "adaptive_weight": 0.0},
    # The adapted populations alone (both generative fits, refitted to each patient by EM).
    "adaptive-lda": {"method": "marginal", "adaptive_weight": 1.0},
    # The adapted populations without their own-shape fit; at the even thirds without the folds' check.
    "marginal-shared-covariance": {"method": "marginal", "adaptive_shapes": False},
    "marginal-whole-populations": {"method": "marginal", "population_components": 1},
    "marginal-even-weight": {"method": "marginal", "adaptive_weight": EVEN_ADAPTIVE_WEIGHT},
    "marginal-no-swollen-check": {"method": "marginal", "swollen_check": False},
    "marginal-no-trees": {"method": "marginal", "trees_check": False},
    # The default with each option it leaves out.
    "marginal-augment": {"method": "marginal", "n_augment": 4},
    "marginal-second-bandwidth": {"method": "marginal", "bandwidth_x_hedge": 0.5},
    "marginal-self-training": {"method": "marginal", "self_training": True},
    "marginal-transfer-start": {"method": "marginal", "transfer_start": True},
    # The previous default: shift augmentation, a second cell bandwidth and self-training, no
    # adapted populations.
    "previous-default": {"method": "marginal", "n_augment": 4, "bandwidth_x_hedge": 0.5, "self_training": True,
                         "adaptive_weight": 0.0},
    # Every hyperparameter chosen for the worst held-out group of the cross-validation.
    "marginal-select-worst": {"method": "marginal", "selection_objective": "worst", "adaptive_weight": 0.0},
    # Supervised DICA on the fold's training patients, then the default marginal model on the
    # projected cells: the embedding is of the projected cells (GatingModel's ``dica``).
    "dica-marginal": {"method": "marginal", "dica": "supervised", "adaptive_weight": 0.0},
    # The product's pooling before shift augmentation: one ridge classifier on all cells
    # (uniformly drawn, as it was).
    "pooled-ridge": {"method": "pooling", "n_augment": 0, "class_balance": 0.0},
    # The plain baseline: logistic loss on the same random features, 1/n_i weights, nothing else.
    # A fixed light penalty: the baseline as a user would fit it, without a penalty search;
    # uniformly drawn training cells.
    "pooled-logistic": {"method": "pooling", "loss": "logistic", "n_augment": 0,
                        "patient_weighting": "uniform", "alpha": 1e-5, "class_balance": 0.0},
}


def infer_patient_groups(samples, labels, random_state=0) -> list[str]:
    """Groups of near-duplicate patients (see :func:`gating_core.method.groups.infer_groups`), found
    on the same transformed channels and embedding a GatingModel would use."""
    model = GatingModel(random_state=random_state)
    digests = [digest_patient(s, y, 500, model.embedding_cells, seed=model.digest_seed(i), compensate=model.compensate)
               for i, (s, y) in enumerate(zip(samples, labels))]
    _, embedding_cells, _ = model.prepare_digests(digests)
    return infer_cell_groups(embedding_cells, [s.name for s in samples], model.n_embedding_features, random_state)


def patient_scores(truth, predicted, populations) -> dict:
    """Accuracy, macro-F1 (over the populations present in ``truth``) and F1 of each population
    for one patient; a population absent from ``truth`` has F1 NaN.

    F1 = 2 TP / (|truth = p| + |predicted = p|), 0 when both are empty: scikit-learn's
    ``f1_score`` with ``zero_division=0``, from one confusion count on integer codes (string
    labels made f1_score about 1 s per 65,000-event patient, a tenth of the held-out check)."""
    truth = np.asarray(truth).astype(str)
    predicted = np.asarray(predicted).astype(str)
    names, codes = np.unique(np.concatenate([truth, predicted]), return_inverse=True)
    true_codes, predicted_codes = codes[: len(truth)], codes[len(truth):]
    k = len(names)
    hits = np.bincount(true_codes[true_codes == predicted_codes], minlength=k)
    true_sum, predicted_sum = np.bincount(true_codes, minlength=k), np.bincount(predicted_codes, minlength=k)
    denominator = true_sum + predicted_sum
    f1 = np.where(denominator > 0, 2.0 * hits / np.maximum(denominator, 1), 0.0)
    index = {str(name): j for j, name in enumerate(names)}
    present = true_sum > 0
    row = {"accuracy": float(np.mean(truth == predicted)), "macro_f1": float(np.mean(f1[present]))}
    for name in populations:
        j = index.get(str(name))
        row[f"f1:{name}"] = float(f1[j]) if j is not None and present[j] else np.nan
    return row


def leave_one_patient_out(samples, labels, methods=METHODS, model_params=None, progress=None,
                          groups=None, refit="subtract") -> pd.DataFrame:
    """Train on all patients but one, gate that one; for every patient and method.

    Parameters
    ----------
    samples : list of Sample;  labels : list of ndarray (n_i,)
    methods : iterable of :data:`METHODS`
    model_params : dict or None, extra GatingModel parameters (for the kernel methods; naming a
        research option makes every kernel method a ResearchGatingModel)
    progress : callable(stage: str, fraction: float) or None
    groups : sequence or None
        Groups of the patients, passed to model selection inside each training set.
    refit : {"subtract", "full"}, default="subtract"
        How each fold's kernel model is fitted. "subtract": from the statistics of all
        patients, computed once, minus the held-out one (:func:`gating_core.evaluation.held_out.fold_models`;
        selection included, per fold; about the cost of one training). The held-out patient's
        labels never reach its fold, but its unlabeled cells take a 1/N share in the channels'
        transform and standardisation. "full": a new GatingModel per fold from its training
        patients' files alone (the cost of one training per fold).

    Returns
    -------
    DataFrame with one row per (patient, method): protocol ("leave-one-patient-out"), held_out,
    patient, method, accuracy, macro_f1, novelty and novelty_threshold (the model's: above it, the
    patient is warned of), unknown (the share of cells called unknown),
    disagreement (:attr:`~gating_core.model.result.Novelty.disagreement`, NaN where not measured)
    and ``f1:<population>`` columns (NaN where the patient has no such cells).
    """
    if len(samples) < 3:
        raise ValueError("leave-one-patient-out needs at least three labeled patients")
    return _held_out_runs(samples, labels, [[i] for i in range(len(samples))], methods, model_params,
                          progress, groups, "leave-one-patient-out", refit=refit)


def _distinct_groups(groups, n_patients: int, protocol: str):
    """The groups as strings and the distinct ones in order of appearance; a ValueError naming
    ``protocol`` when they do not label every patient or are fewer than two."""
    groups = [str(g) for g in groups]
    if len(groups) != n_patients:
        raise ValueError(f"{len(groups)} group labels for {n_patients} patients")
    distinct = sorted(set(groups), key=groups.index)
    if len(distinct) < 2:
        raise ValueError(f"{protocol} needs patients from at least two groups")
    return groups, distinct


def leave_one_group_out(samples, labels, groups, methods=METHODS, model_params=None, progress=None,
                        refit="full") -> pd.DataFrame:
    """Train on all groups but one (center, batch, run), gate every patient of that one.

    ``groups``: one label per patient. The training patients' own groups go to model
    selection, so that it too holds out whole groups. Same columns as
    :func:`leave_one_patient_out`, protocol "leave-one-group-out" and held_out the group.

    ``refit`` as in :func:`leave_one_patient_out`, but "full" by default: subtraction shares
    the channels' transform and standardisation, fitted on every patient's unlabeled cells, and
    a whole held-out center pulls them towards itself (on a 3-center simulated cohort that
    flattered the held-out center by up to 22 points, ``tests/test_held_out.py``).
    """
    groups = [str(g) for g in groups]
    held = group_held_out_sets(groups, len(samples))
    return _held_out_runs(samples, labels, held, methods, model_params, progress, groups, "leave-one-group-out",
                          refit=refit)


def train_on_one_group(samples, labels, groups, methods=METHODS, model_params=None, progress=None) -> pd.DataFrame:
    """Train on ONE group (center, batch, run), gate every patient of the others; each group in
    turn. With two groups this is leaving one group out, both ways; with more, the hardest
    direction: everything the model knows comes from one run. Protocol "train-on-one-group",
    held_out the group trained on (prefixed "trained on ")."""
    groups, distinct = _distinct_groups(groups, len(samples), "training on one group")
    held = one_group_held_out_sets(groups, len(samples))
    return _held_out_runs(samples, labels, held, methods, model_params, progress, groups, "train-on-one-group",
                          [f"trained on {name}" for name in distinct], refit="full")


def patient_folds(samples, labels, n_folds=2, methods=METHODS, model_params=None, progress=None, groups=None,
                  seed=0) -> pd.DataFrame:
    """K-fold over patients: the patients split at random (seeded) into ``n_folds`` folds, each
    gated by a model trained on the others. Protocol "<K>-fold-over-patients"."""
    held = patient_fold_sets(len(samples), n_folds, seed)
    return _held_out_runs(samples, labels, held, methods, model_params, progress, groups,
                          f"{n_folds}-fold-over-patients", [f"fold {k + 1}" for k in range(n_folds)], refit="full")


def group_held_out_sets(groups, n_patients: int) -> list[list[int]]:
    """Leaving one group out: the patients' indices of each group, groups in order of appearance."""
    groups, distinct = _distinct_groups(groups, n_patients, "leave-one-group-out")
    return [[i for i, g in enumerate(groups) if g == name] for name in distinct]


def one_group_held_out_sets(groups, n_patients: int) -> list[list[int]]:
    """Training on one group: for each group in order of appearance, the indices of every patient
    of the others (the held-out set)."""
    groups, distinct = _distinct_groups(groups, n_patients, "training on one group")
    small = [g for g in distinct if groups.count(g) < 2]
    if small:
        raise ValueError(f"training on one group needs two or more patients in each group: {', '.join(small)}")
    return [[i for i, g in enumerate(groups) if g != name] for name in distinct]


def patient_fold_sets(n_patients: int, n_folds=2, seed=0) -> list[list[int]]:
    """K folds over patients: the indices held out by each fold, the patients split at random
    (seeded)."""
    if not 2 <= n_folds <= n_patients:
        raise ValueError(f"{n_folds} folds over {n_patients} patients")
    order = np.random.default_rng(np.random.SeedSequence([int(seed), 41])).permutation(n_patients)
    held = [sorted(int(i) for i in order[k::n_folds]) for k in range(n_folds)]
    if min(n_patients - len(h) for h in held) < 2:
        raise ValueError("every fold needs at least two training patients")
    return held


def held_out_evaluation(samples, labels, held_out_sets, protocol: str, methods=METHODS, model_params=None,
                        progress=None, groups=None, names=None, refit="full") -> pd.DataFrame:
    """Train without each set of patients in ``held_out_sets`` (lists of indices), gate that set.

    The general form of the protocols above, for splits they do not cover (for example:
    train on the earlier batch, test on the later one only). ``names``: a name per set for
    the ``held_out`` column (default: the group of its first patient, or its first patient);
    ``refit`` as in :func:`leave_one_patient_out`.
    """
    return _held_out_runs(samples, labels, held_out_sets, methods, model_params, progress, groups, protocol, names,
                          refit)


REFITS = ("subtract", "full")


def _held_out_runs(samples, labels, held_out_sets, methods, model_params, progress, groups, protocol, names=None,
                   refit="subtract"):
    for m in methods:
        if m not in ALL_METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {', '.join(ALL_METHODS)}")
    if refit not in REFITS:
        raise ValueError(f"refit must be one of {REFITS}, got {refit!r}")
    labels = [np.asarray(y).astype(str) for y in labels]
    populations = sorted(set(np.concatenate(labels).tolist()))
    steps = len(held_out_sets) * len(methods)
    say = progress or (lambda stage, fraction: None)
    names = [str(names[k]) if names is not None else
             str(groups[held[0]]) if groups is not None and len(held) > 1 else samples[held[0]].name
             for k, held in enumerate(held_out_sets)]
    rows = {}
    for m, method in enumerate(methods):
        for k, model in enumerate(_fold_models(method, samples, labels, held_out_sets, model_params, groups, refit,
                                               lambda stage, f: say(f"{method}: {stage}",
                                                                    (m + f) / len(methods)))):
            if refit == "full":
                say(f"{method}: testing on {names[k]}", (m * len(held_out_sets) + k) / steps)
            for i in held_out_sets[k]:
                if method in PREDICTOR_METHODS:
                    predicted, novelty, threshold, disagreement = model.predict(samples[i]), np.nan, np.nan, None
                else:
                    result = model.gate(samples[i])
                    predicted, novelty = result.populations, result.novelty.score
                    threshold, disagreement = result.novelty.threshold, result.novelty.disagreement
                rows[(k, m, i)] = {"protocol": protocol, "held_out": names[k], "patient": samples[i].name,
                                   "method": method, **patient_scores(labels[i], predicted, populations),
                                   "novelty": novelty, "novelty_threshold": threshold,
                                   "unknown": _unknown_share(predicted, populations),
                                   "disagreement": np.nan if disagreement is None else disagreement}
    say("done", 1.0)
    # Rows in fold, method, patient order whatever the order of fitting.
    return pd.DataFrame([rows[key] for key in sorted(rows)])


def _unknown_share(predicted, populations) -> float:
    """Share of a patient's cells gated as ``"unknown"`` (beyond every training population),
    0 when the patient's expert labels name a population so."""
    if UNKNOWN in populations or not len(predicted):
        return 0.0
    return float(np.mean(np.asarray(predicted).astype(str) == UNKNOWN))


#: The model settings a standard method shares with the model beside it (PooledBaseline's).
BASELINE_SETTINGS = ("cells_per_patient", "compensate", "random_state", "channels", "transform")


def _fold_models(method, samples, labels, held_out_sets, model_params, groups, refit, progress):
    """The fitted model of each fold, lazily for full refits (one at a time in memory)."""
    settings = {**(model_params or {}), **METHOD_SETTINGS.get(method, {})}
    by_subtraction = (refit == "subtract" and method not in PREDICTOR_METHODS + ("iw-nystroem",)
                      and settings.get("solver", "rff") == "rff")
    # DICA is fitted on labeled cells: from all patients it would see the held-out one's labels.
    by_subtraction = by_subtraction and settings.get("dica") is None
    if by_subtraction:
        from gating_core.evaluation.held_out import fold_models

        yield from fold_models(samples, labels, held_out_sets, settings, groups, progress=progress)
        return
    for k, held in enumerate(held_out_sets):
        train = [i for i in range(len(samples)) if i not in held]
        train_samples = [samples[i] for i in train]
        train_labels = [labels[i] for i in train]
        progress(f"fold {k + 1} of {len(held_out_sets)}", k / len(held_out_sets))
        if method in ("lda", "qda", "trees"):
            # on the cells the model beside it sees: its channels, transform, compensation and draw
            shared = {k: v for k, v in (model_params or {}).items() if k in BASELINE_SETTINGS}
            yield PooledBaseline(method, **shared).fit(train_samples, train_labels)
        elif method == "iw-nystroem":
            from gating_core.model.iw_model import IWNystroemGatingModel

            params = model_params or {}
            yield IWNystroemGatingModel(channels=params.get("channels"), compensate=params.get("compensate", True),
                                        random_state=params.get("random_state", 0)).fit(train_samples, train_labels)
        elif method == "dica-pooling":  # DICA (Muandet et al. 2013) on the fold's patients, then pooling
            yield DICAPooling(random_state=(model_params or {}).get("random_state", 0)).fit(train_samples,
                                                                                          train_labels)
        else:
            train_groups = None if groups is None else [groups[i] for i in train]
            yield build_model(settings).fit(train_samples, train_labels, groups=train_groups)


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per protocol and method (and model seed, when the table has several): mean and
    worst-patient accuracy and macro-F1, the worst patient."""
    out = []
    keys = [k for k in ("protocol", "method", "seed") if k in table.columns]
    for key, group in table.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        worst = group.loc[group["accuracy"].idxmin()]
        out.append({**dict(zip(keys, key)), "mean_accuracy": group["accuracy"].mean(),
                    "worst_accuracy": group["accuracy"].min(), "worst_patient": worst["patient"],
                    "mean_macro_f1": group["macro_f1"].mean(), "worst_macro_f1": group["macro_f1"].min(),
                    **({"mean_unknown": group["unknown"].mean(), "max_unknown": group["unknown"].max()}
                       if "unknown" in group else {})})
    return pd.DataFrame(out)


def summarize_seeds(table: pd.DataFrame) -> pd.DataFrame:
    """What stays when the model's seed changes: per protocol and method, the mean over seeds
    (and its standard deviation) of each seed's mean and worst-patient accuracy and macro-F1,
    and in how many seeds the method had the highest mean and the highest worst-patient
    accuracy of the methods compared (ties count for each).

    ``table`` holds a ``seed`` column (:func:`repeat_over_seeds`). The seed draws the training
    cells, the random features and the selection folds: on held-out centers the worst
    patient's accuracy moved between seeds of the same model by 1.7 points on the real data and
    with a standard deviation of 7 points on a simulated cohort, so one
    seed's ranking of methods is weak evidence."""
    per_seed = summarize(table)
    keys = [k for k in ("protocol", "method") if k in per_seed.columns]
    group_keys = [k for k in ("protocol", "seed") if k in per_seed.columns]
    for column in ("mean_accuracy", "worst_accuracy"):
        best = per_seed.groupby(group_keys)[column].transform("max")
        per_seed[f"best_{column}"] = per_seed[column] >= best - 1e-12
    out = per_seed.groupby(keys, sort=False).agg(
        seeds=("seed", "nunique"), mean_accuracy=("mean_accuracy", "mean"), mean_accuracy_sd=("mean_accuracy", "std"),
        worst_accuracy=("worst_accuracy", "mean"), worst_accuracy_sd=("worst_accuracy", "std"),
        mean_macro_f1=("mean_macro_f1", "mean"), worst_macro_f1=("worst_macro_f1", "mean"),
        best_mean_in=("best_mean_accuracy", "sum"), best_worst_in=("best_worst_accuracy", "sum"))
    return out.reset_index()


def repeat_over_seeds(run, seeds, model_params=None) -> pd.DataFrame:
    """``run(model_params)`` (an evaluation returning a per-patient table) once per model seed,
    the tables stacked with a ``seed`` column: ``model_params`` with ``random_state`` set to
    each seed in turn."""
    tables = []
    for seed in seeds:
        table = run({**(model_params or {}), "random_state": int(seed)})
        table.insert(0, "seed", int(seed))
        tables.append(table)
    return pd.concat(tables, ignore_index=True)


def novelty_curve(table: pd.DataFrame, bins=(0, 1, 1.5, 2, 3, 5, np.inf)) -> pd.DataFrame:
    """Accuracy against novelty: per novelty bin (of the marginal model) and method, the mean
    accuracy and the number of patients. Rows of the same held-out patient and protocol are
    binned by the novelty the marginal model reported for it."""
    if "marginal" not in set(table["method"]):
        raise ValueError("the novelty curve needs the marginal method's rows")
    keys = [k for k in ("seed", "protocol", "patient") if k in table.columns]
    novelty = table[table["method"] == "marginal"].set_index(keys)["novelty"]
    joined = table.join(novelty.rename("marginal_novelty"), on=keys)
    joined["novelty_bin"] = pd.cut(joined["marginal_novelty"], list(bins), right=False)
    curve = (joined.groupby(["novelty_bin", "method"], observed=True)["accuracy"]
             .agg(["mean", "count"]).reset_index())
    return curve.rename(columns={"mean": "mean_accuracy", "count": "patients"})


def review_split(table: pd.DataFrame, threshold: float | None = None) -> pd.DataFrame | None:
    """The marginal model's held-out patients split by whether gating flagged them for review
    because its parts disagree (``disagreement`` above ``threshold``, by default
    :data:`~gating_core.model.result.DISAGREEMENT_THRESHOLD`): per protocol and flag, the number of
    patients, their mean and worst accuracy. None when no row measured a disagreement."""
    from gating_core.model.result import DISAGREEMENT_THRESHOLD

    threshold = DISAGREEMENT_THRESHOLD if threshold is None else float(threshold)
    if "disagreement" not in table.columns:
        return None
    rows = table[(table["method"] == "marginal") & table["disagreement"].notna()]
    if rows.empty:
        return None
    flagged = np.where(rows["disagreement"] > threshold, "review", "agree")
    split = (rows.assign(parts=flagged).groupby(["protocol", "parts"], sort=False)["accuracy"]
             .agg(patients="count", mean_accuracy="mean", worst_accuracy="min").reset_index())
    return split
