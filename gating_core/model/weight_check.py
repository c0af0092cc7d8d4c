"""The check of ``adaptive_weight="auto"`` (a mixin of
:class:`~gating_core.model.estimator.GatingModel`): cross-validation over groups of the training
patients that weighs the adapted populations against the transfer model, chooses where their EM
starts (an option) and whether pooled gradient-boosted trees join the transfer model."""

from __future__ import annotations

import numpy as np

from gating_core.method.adaptive_lda import AdaptiveLDA
from gating_core.method.boosted_trees import PooledTrees
from gating_core.method.population_components import adapted_fits, component_start, population_starts
from gating_core.method.priors import training_prior
from gating_core.method.saturation import without_piles
from gating_core.method.self_training import PatientAdjustment
from gating_core.method.swollen_populations import largest_shares
from gating_core.method.ties import ties_broken
from gating_core.method.unknown_cells import PopulationReach


#: The adapted populations' share of the final probabilities (GatingModel's ``adaptive_weight``):
#: scored on these by cross-validation over groups ("auto").
ADAPTIVE_WEIGHTS = (0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0)
#: What "auto" keeps unless the held-out groups show it clearly worse: the transfer model and the
#: two generative fits a third each.
EVEN_ADAPTIVE_WEIGHT = 2.0 / 3.0
#: How much lower (:func:`check_score`: the held-out mean plus the next-to-worst patient's accuracy)
#: the even weight must score than the best weight to be left; the best weight must also gate
#: every fold's held-out patients at least as well on average. The folds hold out a few patients
#: of the training groups: a weight that scored better there by less than this gated the new
#: groups no better (docs/unseen_data.md), while populations that are no Gaussians at all (the
#: halves of one cluster) cost the generative fits far more than this. With a few training
#: patients, each fold's models learn from fewer still: one fold alone (three biopsies of one
#: batch gated by three of the other) once decided the weight, where the other fold and the new
#: biopsies gated better at the even weight.
EVEN_WEIGHT_MARGIN = 0.2
#: With nothing to hold out (one training patient), "auto" takes this weight.
FALLBACK_ADAPTIVE_WEIGHT = EVEN_ADAPTIVE_WEIGHT
#: The second start of EM (``transfer_start``) is taken when it beats every weight by more than
#: this.
ADAPTIVE_WEIGHT_TOLERANCE = 0.01
#: Where EM starts from for each new patient (``adaptive_start_``): the training populations, or
#: (ResearchGatingModel's ``transfer_start`` option) the transfer model's posteriors of the
#: patient's cells, then mixed in at TRANSFER_START_WEIGHT.
ADAPTIVE_STARTS = ("training", "transfer")
TRANSFER_START_WEIGHT = 0.5
#: The pooled trees' share of the transfer model's part of the mix, where the check takes them
#: (``pooled_trees_``): half trees.
TREES_SHARE = 0.5


def check_score(accuracies) -> float:
    """A weight's score in the check of ``adaptive_weight="auto"``: the held-out training
    patients' mean accuracy plus the next-to-worst one's (the worst one's when fewer than three
    are held out). A lab signs every patient, so the weak ones count as much as the mean; but a
    single patient unlike every other (a biopsy almost all 'other') is no evidence that a weight
    fails the next patients: on the DLBCL set one such held-out biopsy alone moved the weight from
    2/3 to 1/3, which cost a new biopsy 47 points (docs/unseen_data.md)."""
    ordered = np.sort(np.asarray(accuracies, dtype=np.float64))
    return float(ordered.mean() + ordered[1 if len(ordered) >= 3 else 0])


def weight_choice(accuracy: dict, folds) -> tuple:
    """The weight "auto" takes from the check's held-out patients: (chosen, score, fold means).

    ``accuracy`` maps each weight of ``ADAPTIVE_WEIGHTS`` to the held-out training patients'
    accuracies at that weight; ``folds`` gives each of those patients' fold, in the same order.
    ``EVEN_ADAPTIVE_WEIGHT`` stays unless the best :func:`check_score` beats its score by more
    than ``EVEN_WEIGHT_MARGIN`` and the best weight's mean accuracy is at least the even
    weight's in every fold; then the best weight (the most adapted of ties)."""
    folds = np.asarray(folds)
    score = {w: check_score(a) for w, a in accuracy.items()}
    fold_means = {w: [float(np.mean(np.asarray(a)[folds == j])) for j in np.unique(folds)]
                  for w, a in accuracy.items()}
    best = max(score.values())
    chosen = EVEN_ADAPTIVE_WEIGHT
    if score[EVEN_ADAPTIVE_WEIGHT] < best - EVEN_WEIGHT_MARGIN:
        candidate = max(w for w, v in score.items() if v == best)
        if all(c >= e for c, e in zip(fold_means[candidate], fold_means[EVEN_ADAPTIVE_WEIGHT])):
            chosen = candidate
    return chosen, score, fold_means


def trees_choice(without, with_trees, folds) -> bool:
    """Whether the check takes the pooled trees: the held-out training patients' accuracies at the
    chosen weight ``without`` them and ``with_trees`` (``folds``: each one's fold). They are taken
    when they raise :func:`check_score` and no fold's held-out mean falls, as a weight must. Trees
    gate a patient of a run they were trained on better than a kernel machine does, and a
    population that moved beyond the training range worse; the check's folds hold out the
    training groups, so they take trees where the groups are alike enough for them to help
    (docs/unseen_data.md, "Trees where the training groups ask for them")."""
    folds = np.asarray(folds)
    without, with_trees = np.asarray(without, np.float64), np.asarray(with_trees, np.float64)
    if check_score(with_trees) <= check_score(without):
        return False
    return all(with_trees[folds == j].mean() >= without[folds == j].mean() for j in np.unique(folds))


def _fold_components(split, train, fold_populations, populations) -> tuple:
    """A check fold's share of the training cells' components (``split``: labels, names and
    populations of :func:`~gating_core.method.population_components.split_populations`, or the
    populations and None): its patients' (``train``) labels, the components they hold and each
    one's index in ``fold_populations`` (None without components)."""
    labels, names, population_of = split
    parts = [labels[i] for i in train]
    if population_of is None:
        return parts, np.asarray(fold_populations).astype(str), None
    held = set(np.unique(np.concatenate(parts))) if parts else set()
    position = {str(p): j for j, p in enumerate(fold_populations)}
    kept = [(n, position[str(populations[j])]) for n, j in zip(names, population_of) if n in held]
    return parts, np.asarray([n for n, _ in kept]), np.array([j for _, j in kept], dtype=np.int64)




class WeightCheck:
    """The check's folds (mixed into GatingModel through PatientAdaptation, whose fits they
    refit on each fold's patients)."""

    def _fold_shared_fit_cells(self, cells, parts) -> tuple:
        """A fold's training cells and components for its shared-covariance fit, as the final fit
        takes them (``_shared_fit_cells``: without the piled cells, unless the cells are a DICA
        projection), nothing recorded."""
        if getattr(self, "dica_", None) is not None:
            return cells, parts
        return without_piles(cells, parts)[:2]

    def _choose_adaptive_weight(self, cells, embedding_cells, labels, params, split) -> tuple:
        """``adaptive_weight="auto"``: (weight, start, trees). ``EVEN_ADAPTIVE_WEIGHT`` unless another
        weight of ``ADAPTIVE_WEIGHTS`` gates the held-out groups' patients better by more than
        ``EVEN_WEIGHT_MARGIN`` (:func:`check_score`) and gates each fold's held-out patients
        at least as well on average (:func:`weight_choice`), EM started from the training
        populations; then that one. With ``transfer_start`` (ResearchGatingModel's option),
        (``TRANSFER_START_WEIGHT``, "transfer") when EM started from the transfer model's
        posteriors gates them better than every weight by more than ``ADAPTIVE_WEIGHT_TOLERANCE``.
        ``trees``: whether pooled gradient-boosted trees take ``TREES_SHARE`` of the transfer
        model's part (:func:`trees_choice`, with ``trees_check``; each fold fits them on its
        patients' training cells).

        Each start fails somewhere. From the training populations, EM follows populations that
        moved beyond the training range (a new batch), where the transfer model's posteriors
        are wrong and would lead EM astray; on a simulated center whose populations are no
        single Gaussians it can let one population take cells of a large neighbour, where the
        transfer model's posteriors give EM the better start. On the real sets the second start
        never gated better, and where the transfer model fails on a patient unlike every training
        one (a biopsy almost all 'other') it follows that failure: an option, not the default.

        Each fold holds out whole groups and refits the transfer model on the others with the
        hyperparameters selected on all patients (refitting the search in every fold would
        multiply training by the folds), and the Gaussians likewise; each held-out patient is
        gated as a new one (its embedding, self-training and EM from its content-chosen cells)
        on its labeled training cells. The table is ``selection_["adaptive_weight"]``: the mean and
        worst held-out accuracy at each weight, its score (``cv_score``), under ``cv_patients``
        each held-out patient's accuracy (``cv_patient_folds``: their folds) and under
        ``cv_fold_accuracy`` each fold's mean (:func:`weight_choice`); ``selection_["trees"]`` the
        held-out patients' accuracies with the trees at the chosen weight and whether they were
        taken."""
        groups = list(self.groups_)
        if len(set(groups)) < 2:
            # One group (every patient near-duplicates of the others, or one center given):
            # patients are then the only units to hold out.
            groups = list(self.training_patients_)
        unique = sorted(set(groups))
        if len(unique) < 2:
            self.selection_["adaptive_weight"] = {"chosen": FALLBACK_ADAPTIVE_WEIGHT, "start": "training", "folds": 0,
                                                  "reason": "fewer than two patients to hold out"}
            return FALLBACK_ADAPTIVE_WEIGHT, "training", False
        rng = np.random.default_rng(np.random.SeedSequence([int(self.random_state or 0), 31]))
        order = [unique[i] for i in rng.permutation(len(unique))]
        n_folds = min(int(self.cv_folds), len(unique))
        accuracy = {w: [] for w in ADAPTIVE_WEIGHTS}
        with_trees = {w: [] for w in ADAPTIVE_WEIGHTS}
        fold_of = []  # the fold of each held-out patient, in the order of ``accuracy``'s lists
        transfer_started = []
        fixed = {"companion_bandwidth_x": self.companion_bandwidth_x_, "pooled_weight": self.pooled_weight_}
        fold_params = dict(params)  # the selected hyperparameters, kept in every fold
        skipped = []  # folds whose training patients hold a single population: nothing to refit
        trees_unfit = False  # a fold's training cells too few for trees: they cannot be judged
        for j in range(n_folds):
            held_groups = set(order[j::n_folds])
            train = [i for i, g in enumerate(groups) if g not in held_groups]
            held = [i for i, g in enumerate(groups) if g in held_groups]
            if len(np.unique(np.concatenate([np.asarray(labels[i]).astype(str) for i in train]))) < 2:
                skipped.append(j)
                continue
            fold = self._fold_copy([self.groups_[i] for i in train], [self.training_patients_[i] for i in train])
            fold._fit_transfer([cells[i] for i in train], [embedding_cells[i] for i in train],
                               [labels[i] for i in train], fold_params, lambda stage, f: None, fixed=fixed)
            fold.populations_ = [str(c) for c in fold.classifier_.classes_]
            fold.class_prior_ = training_prior([labels[i] for i in train], fold.classifier_.classes_)
            parts, names, population_of = _fold_components(split, train, fold.populations_, self.populations_)
            starts = None if population_of is None else population_starts(population_of)
            largest = (largest_shares([labels[i] for i in train], fold.populations_)
                       if getattr(self, "swollen_check", False) else None)
            gaussians = AdaptiveLDA().fit(*self._fold_shared_fit_cells([cells[i] for i in train], parts),
                                          classes=names)
            shapes = PopulationReach().fit([cells[i] for i in train], parts, names) if self.adaptive_shapes else None
            columns = np.searchsorted(np.asarray(self.populations_), np.asarray(fold.populations_))
            fold_trees = None
            if self.trees_check and PooledTrees.can_fit([labels[i] for i in train]):
                fold_trees = PooledTrees(random_state=self.random_state).fit(
                    [cells[i] for i in train], [labels[i] for i in train], fold.populations_)
            elif self.trees_check:
                trees_unfit = True
            for i in held:
                embedding = fold.classifier_.embed(embedding_cells[i])
                adjust = fold._patient_adjustment(embedding_cells[i], embedding)
                transfer = fold._adjusted_proba(cells[i], embedding, 50_000, adjust)
                fitted, own = adapted_fits(gaussians, shapes, embedding_cells[i], self._reach_margin(), starts=starts,
                                           largest=largest)
                patient = PatientAdjustment(gaussians=fitted, components=starts)
                if own is not None:
                    patient.shapes = (shapes, own)
                adapted = patient.adapted(cells[i])
                truth = np.asarray(labels[i]).astype(str)

                def accuracy_of(proba):
                    return float(np.mean(np.asarray(self.populations_)[columns[np.argmax(proba, axis=1)]] == truth))

                # Alone, the adapted populations break their ties as gating does.
                alone = ties_broken(adapted.copy(), lambda rows: transfer[rows])
                for w in ADAPTIVE_WEIGHTS:
                    accuracy[w].append(accuracy_of(alone if w >= 1.0 else (1.0 - w) * transfer + w * adapted))
                if fold_trees is not None:
                    beside = (1.0 - TREES_SHARE) * transfer + TREES_SHARE * fold_trees.proba(cells[i])
                    for w in ADAPTIVE_WEIGHTS:
                        with_trees[w].append(accuracy_of(alone if w >= 1.0 else (1.0 - w) * beside + w * adapted))
                fold_of.append(j)
                if self.transfer_start:
                    start = fold._adjusted_proba(embedding_cells[i], embedding, 50_000, adjust)
                    start = component_start(start, gaussians, embedding_cells[i], population_of)
                    patient.gaussians, own = adapted_fits(gaussians, shapes, embedding_cells[i], self._reach_margin(),
                                                           start, starts, largest)
                    if own is not None:
                        patient.shapes = (shapes, own)
                    refined = patient.adapted(cells[i])
                    transfer_started.append(accuracy_of((1.0 - TRANSFER_START_WEIGHT) * transfer
                                                        + TRANSFER_START_WEIGHT * refined))
        if not fold_of:
            self.selection_["adaptive_weight"] = {
                "chosen": FALLBACK_ADAPTIVE_WEIGHT, "start": "training", "folds": 0,
                "reason": "the training patients of every fold held a single population"}
            return FALLBACK_ADAPTIVE_WEIGHT, "training", False
        means = {w: float(np.mean(a)) for w, a in accuracy.items()}
        worst = {w: float(np.min(a)) for w, a in accuracy.items()}
        # The held-out patients come from the training groups, so the folds see only the shifts
        # between those groups, and a new run can move further: the even weight stays unless the
        # folds say clearly, and every one of them, that it fails.
        chosen, score, fold_means = weight_choice(accuracy, fold_of)
        best = max(score.values())
        start = "training"
        if transfer_started and check_score(transfer_started) > best + ADAPTIVE_WEIGHT_TOLERANCE:
            chosen, start = TRANSFER_START_WEIGHT, "transfer"
        table = {"chosen": chosen, "start": start, "folds": n_folds - len(skipped),
                 "cv_accuracy": {str(w): m for w, m in means.items()},
                 "cv_worst": {str(w): v for w, v in worst.items()},
                 "cv_score": {str(w): v for w, v in score.items()},
                 "cv_patients": {str(w): list(a) for w, a in accuracy.items()},
                 "cv_patient_folds": [int(j) for j in fold_of],
                 "cv_fold_accuracy": {str(w): m for w, m in fold_means.items()}}
        if skipped:
            table["skipped_folds"] = {"folds": skipped, "reason": "their training patients held a single population"}
        if transfer_started:
            table["cv_transfer_start"] = {"accuracy": float(np.mean(transfer_started)),
                                          "worst": float(np.min(transfer_started)),
                                          "score": check_score(transfer_started)}
        self.selection_["adaptive_weight"] = table
        trees = False
        if not (self.trees_check and start == "training" and chosen < 1.0):
            return chosen, start, trees
        if trees_unfit:
            self.selection_["trees"] = {"taken": False, "share": TREES_SHARE,
                                        "reason": "a fold's training cells held fewer than two populations "
                                                  "of two cells or more"}
        else:
            trees = trees_choice(accuracy[chosen], with_trees[chosen], fold_of)
            self.selection_["trees"] = {
                "taken": trees, "share": TREES_SHARE,
                "cv_accuracy": float(np.mean(with_trees[chosen])), "cv_worst": float(np.min(with_trees[chosen])),
                "cv_score": check_score(with_trees[chosen]), "cv_patients": list(with_trees[chosen]),
                "cv_fold_accuracy": [float(np.mean(np.asarray(with_trees[chosen])[np.asarray(fold_of) == j]))
                                     for j in np.unique(fold_of)]}
        return chosen, start, trees

    def _fold_copy(self, groups, patients):
        """A model of this one's class, parameters and preprocessing, to fit on some patients only."""
        fold = type(self)(**self.get_params(deep=False))  # a subclass's folds keep its options
        for name in ("channels_", "channel_markers_", "transform_", "center_", "scale_", "dica_",
                     "reference_quantiles_", "reference_landmarks_"):
            setattr(fold, name, getattr(self, name, None))
        fold.groups_, fold.groups_inferred_ = list(groups), self.groups_inferred_
        fold.selection_ = dict(self.selection_)
        fold.training_patients_ = list(patients)
        return fold
