"""What gating does per new patient beyond the transfer model, in
:class:`~gating_core.model.estimator.GatingModel` (a mixin): the patient's own populations
adapted by EM (two generative fits: one covariance shared by all populations, and each
population's own shape) and their weight, the populations' reach that calls cells beyond all of
them unknown, the EM prior ratio and the self-training step."""

from __future__ import annotations

import numpy as np

from gating_core.method.adaptive_lda import AdaptiveLDA
from gating_core.method.boosted_trees import PooledTrees
from gating_core.method.features import content_hashes
from gating_core.method.population_components import adapted_fits, component_start, population_starts, split_populations
from gating_core.method.priors import reestimate_prior, training_prior
from gating_core.method.self_training import PatientAdjustment, self_training_coef
from gating_core.method.swollen_populations import called_shares, swollen_populations
from gating_core.method.unknown_cells import UNKNOWN_MARGIN, PopulationReach
from gating_core.model.result import GATING_PARTS

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


class PatientAdaptation:
    """The adapted populations, the unknown-cell reach and the per-patient adjustment (mixed
    into GatingModel, whose parameters and fitted attributes it reads)."""

    def _fit_adaptive(self, cells, embedding_cells, labels, params, report):
        """The adapted populations (``adaptive_lda_``; the own-shape fit, ``adaptive_shapes_``,
        uses ``population_reach_``), their Gaussian components (``adaptive_components_``), their
        share (``adaptive_weight_``) and where their EM starts for a new patient
        (``adaptive_start_``). Returns the training cells' components and their names for
        :meth:`_fit_reach` (None when the populations are not adapted)."""
        self.adaptive_lda_, self.adaptive_weight_, self.adaptive_start_ = None, 0.0, "training"
        self.adaptive_shapes_, self.adaptive_components_, self.pooled_trees_ = False, None, None
        if self.method != "marginal":  # the baselines (pooling, multitask) gate as fitted
            return None
        if self.transfer_start and self.adaptive_weight != "auto":
            raise ValueError("transfer_start is scored by the cross-validation of adaptive_weight='auto'; "
                             f"adaptive_weight is {self.adaptive_weight!r}")
        if self.adaptive_weight != "auto" and float(self.adaptive_weight) == 0.0:
            return None
        # The components are found once, on every training patient; the check's folds fit on
        # their patients' share of them, so that the weight is checked for the model it weighs.
        split = self._components(cells, labels, self.populations_)
        start, trees = "training", False
        if self.adaptive_weight == "auto":
            report("Weighing the adapted populations (cross-validation over groups)", 0.92)
            weight, start, trees = self._choose_adaptive_weight(cells, embedding_cells, labels, params, split)
        else:
            weight = float(self.adaptive_weight)
        if trees:
            self.pooled_trees_ = PooledTrees(random_state=self.random_state).fit(cells, labels, self.populations_)
        if weight <= 0:
            return None
        parts, names, self.adaptive_components_ = split
        self.adaptive_lda_ = AdaptiveLDA().fit(cells, parts, classes=names)
        self.adaptive_weight_, self.adaptive_start_ = weight, start
        self.adaptive_shapes_ = bool(self.adaptive_shapes)
        return parts, names

    def _fit_reach(self, cells, labels, components=None):
        """Each population as a Gaussian of its own shape, with its reach (``population_reach_``):
        the adapted populations' own-shape fit and the unknown-cell call (``unknown_margin``).
        None when neither is used. ``components``: the training cells' components and their names
        (:meth:`_fit_adaptive`), modelled in place of the populations when the populations are
        adapted."""
        used = self.unknown_margin is not None or getattr(self, "adaptive_shapes_", False)
        classes = self.populations_
        if used and components is not None and getattr(self, "adaptive_components_", None) is not None:
            labels, classes = components
        self.population_reach_ = PopulationReach().fit(cells, labels, classes) if used else None

    def _split_populations(self) -> dict:
        """The populations the adapted populations model as several Gaussian components: name ->
        number of components (empty when every population is one Gaussian)."""
        components = getattr(self, "adaptive_components_", None)
        if components is None or getattr(self, "adaptive_lda_", None) is None:
            return {}
        counts = np.bincount(np.asarray(components), minlength=len(self.populations_))
        return {str(p): int(c) for p, c in zip(self.populations_, counts) if c > 1}

    def _components(self, cells, labels, populations) -> tuple:
        """(component labels, component names, each component's population index) of the training
        cells (:func:`~gating_core.method.population_components.split_populations`); with
        ``population_components`` 1, the populations themselves and None."""
        if int(getattr(self, "population_components", 1)) <= 1:
            return labels, np.asarray(populations).astype(str), None
        return split_populations(cells, labels, populations, int(self.population_components), self.random_state)

    def _reach_margin(self) -> float:
        """The margin of the patient EM's trimming steps (:meth:`PopulationReach.patient_populations`):
        ``unknown_margin``, or its default when no cell is called unknown."""
        return UNKNOWN_MARGIN if self.unknown_margin is None else float(self.unknown_margin)

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
        for j in range(n_folds):
            held_groups = set(order[j::n_folds])
            train = [i for i, g in enumerate(groups) if g not in held_groups]
            held = [i for i, g in enumerate(groups) if g in held_groups]
            fold = self._fold_copy([self.groups_[i] for i in train], [self.training_patients_[i] for i in train])
            fold._fit_transfer([cells[i] for i in train], [embedding_cells[i] for i in train],
                               [labels[i] for i in train], fold_params, lambda stage, f: None, fixed=fixed)
            fold.populations_ = [str(c) for c in fold.classifier_.classes_]
            fold.class_prior_ = training_prior([labels[i] for i in train], fold.classifier_.classes_)
            parts, names, population_of = _fold_components(split, train, fold.populations_, self.populations_)
            starts = None if population_of is None else population_starts(population_of)
            gaussians = AdaptiveLDA().fit([cells[i] for i in train], parts, classes=names)
            shapes = PopulationReach().fit([cells[i] for i in train], parts, names) if self.adaptive_shapes else None
            columns = np.searchsorted(np.asarray(self.populations_), np.asarray(fold.populations_))
            trees = (PooledTrees(random_state=self.random_state).fit([cells[i] for i in train], [labels[i] for i in train],
                                                                    fold.populations_)
                     if self.trees_check else None)
            for i in held:
                embedding = fold.classifier_.embed(embedding_cells[i])
                adjust = fold._patient_adjustment(embedding_cells[i], embedding)
                transfer = fold._adjusted_proba(cells[i], embedding, 50_000, adjust)
                fitted, own = adapted_fits(gaussians, shapes, embedding_cells[i], self._reach_margin())
                patient = PatientAdjustment(gaussians=fitted, components=starts)
                if own is not None:
                    patient.shapes = (shapes, own)
                adapted = patient.adapted(cells[i])
                truth = np.asarray(labels[i]).astype(str)

                def accuracy_of(proba):
                    return float(np.mean(np.asarray(self.populations_)[columns[np.argmax(proba, axis=1)]] == truth))

                for w in ADAPTIVE_WEIGHTS:
                    accuracy[w].append(accuracy_of((1.0 - w) * transfer + w * adapted))
                if trees is not None:
                    beside = (1.0 - TREES_SHARE) * transfer + TREES_SHARE * trees.proba(cells[i])
                    for w in ADAPTIVE_WEIGHTS:
                        with_trees[w].append(accuracy_of((1.0 - w) * beside + w * adapted))
                fold_of.append(j)
                if self.transfer_start:
                    start = fold._adjusted_proba(embedding_cells[i], embedding, 50_000, adjust)
                    start = component_start(start, gaussians, embedding_cells[i], population_of)
                    patient.gaussians, own = adapted_fits(gaussians, shapes, embedding_cells[i], self._reach_margin(), start)
                    if own is not None:
                        patient.shapes = (shapes, own)
                    refined = patient.adapted(cells[i])
                    transfer_started.append(accuracy_of((1.0 - TRANSFER_START_WEIGHT) * transfer
                                                        + TRANSFER_START_WEIGHT * refined))
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
        table = {"chosen": chosen, "start": start, "folds": n_folds,
                 "cv_accuracy": {str(w): m for w, m in means.items()},
                 "cv_worst": {str(w): v for w, v in worst.items()},
                 "cv_score": {str(w): v for w, v in score.items()},
                 "cv_patients": {str(w): list(a) for w, a in accuracy.items()},
                 "cv_patient_folds": [int(j) for j in fold_of],
                 "cv_fold_accuracy": {str(w): m for w, m in fold_means.items()}}
        if transfer_started:
            table["cv_transfer_start"] = {"accuracy": float(np.mean(transfer_started)),
                                          "worst": float(np.min(transfer_started)),
                                          "score": check_score(transfer_started)}
        self.selection_["adaptive_weight"] = table
        trees = False
        if self.trees_check and start == "training" and chosen < 1.0:
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

    def _adjusted_proba(self, cells, embedding, chunk_size, adjust: PatientAdjustment, part=None) -> np.ndarray:
        """The final probabilities of standardised (registered) cells of one patient: the blend
        (:meth:`_proba`), then ``adjust`` (its prior ratio and self-training step), then the
        patient's adapted populations mixed in (``adaptive_weight_``). ``part`` ("transfer" or
        "adapted", :meth:`gating_parts`) gives that part alone."""
        weight = float(getattr(self, "adaptive_weight_", 0.0))
        if part == "adapted" or (part is None and weight >= 1.0 and adjust.gaussians is not None):
            # The transfer model's share is 0: scoring it would only be multiplied away.
            return adjust.adapted(cells)
        if adjust.coef is None:
            proba = adjust(self._proba(cells, embedding, chunk_size))
        else:
            proba = adjust(*self._proba(cells, embedding, chunk_size, project=adjust.coef))
        if part == "transfer":
            return proba
        if getattr(self, "pooled_trees_", None) is None:
            return adjust.mix(proba, cells, weight)
        return self._mixed_with_trees(proba, cells, adjust, weight)

    def _mixed_with_trees(self, transfer, cells, adjust: PatientAdjustment, weight: float) -> np.ndarray:
        """The mix with the pooled trees taking ``TREES_SHARE`` of the transfer model's part, from
        the transfer model's probabilities ``transfer`` (n, k) of ``cells`` (n, d).

        The trees move every probability by at most their share s of the final mix, so the gap
        between the likeliest population a and another b changes by s ((t_a - t_b) - (p_a - p_b))
        >= -s (1 + p_a - p_b) (p the transfer model's, t the trees'): a cell whose call they
        cannot change keeps the mix without them, and the trees score the others only (a few
        percent of the cells where the parts agree). Where rare populations' columns come from
        the transfer model alone (``transfer_columns``) the rows are normalised, and every cell is
        scored."""
        final = adjust.mix(transfer.copy(), cells, weight)
        adapted = adjust.gaussians is not None and weight > 0
        share = np.float32(TREES_SHARE * ((1.0 - weight) if adapted else 1.0))
        if adapted and adjust.transfer_columns is not None:
            rows = np.arange(len(cells))
        else:
            lead = final - share * transfer
            top = np.argmax(final, axis=1)
            rows_all = np.arange(len(final))
            leader = lead[rows_all, top]
            lead[rows_all, top] = -np.inf
            rows = np.flatnonzero(lead.max(axis=1) >= leader - share)
        if len(rows):
            beside = (1.0 - TREES_SHARE) * transfer[rows] + TREES_SHARE * self.pooled_trees_.proba(cells[rows])
            final[rows] = adjust.mix(beside.astype(np.float32), cells[rows], weight)
        return final

    def gating_parts(self) -> tuple:
        """The parts that ``gate(..., part=...)`` can give alone: ("transfer", "adapted") when the
        model mixes its transfer model with the patient's adapted populations (an adaptive weight
        strictly between 0 and 1), else none. Where the two disagree on many of a patient's cells
        it is flagged for review (:class:`~gating_core.model.result.Novelty`), and either can be
        the right one: a reviewer compares them and starts from the better."""
        weight = float(getattr(self, "adaptive_weight_", 0.0))
        if getattr(self, "adaptive_lda_", None) is None or not 0.0 < weight < 1.0:
            return ()
        return GATING_PARTS

    def _patient_adjustment(self, chosen, embedding) -> PatientAdjustment:
        """What gating this patient does after the blend (:class:`~gating_core.method.self_training.PatientAdjustment`):
        the EM prior ratio (``prior_shift="em"``), the self-training step (``self_training``)
        and the populations adapted by EM (``adaptive_weight_``), all from its content-chosen
        cells ``chosen`` (m, d), standardised and registered."""
        adjust = self._transfer_adjustment(chosen, embedding)
        lda = getattr(self, "adaptive_lda_", None)
        reach = getattr(self, "population_reach_", None)
        adapts = lda is not None and float(getattr(self, "adaptive_weight_", 0.0)) > 0
        shapes = adapts and getattr(self, "adaptive_shapes_", False) and reach is not None
        if not adapts and not self._unknown_called():
            return adjust
        # In the order of their content hashes: EM's sums, hence every bit of the adapted
        # populations and of the reach's means, then do not depend on the order of the events.
        ordered = chosen[np.argsort(content_hashes(chosen), kind="stable")] if len(chosen) else chosen
        components = getattr(self, "adaptive_components_", None)
        adjust.components = None if components is None else population_starts(components)
        # One EM serves both the own-shape fit's means and shares and the reach around them.
        own_em = reach if shapes or self._unknown_called() else None
        if adapts:
            start = None
            if getattr(self, "adaptive_start_", "training") == "transfer" and len(ordered):
                start = self._adjusted_proba(ordered, embedding, 50_000, adjust)  # no gaussians yet: unmixed
                start = component_start(start, lda, ordered, components)
            adjust.gaussians, patient = adapted_fits(lda, own_em, ordered, self._reach_margin(), start)
        elif own_em is not None:
            patient = reach.for_patient(ordered, self._reach_margin())
        if own_em is not None:
            adjust.shapes = (reach, patient) if shapes else None
            adjust.reach = patient if self._unknown_called() else None
        if adapts and len(chosen):
            self._check_swelling(chosen, embedding, adjust)
        return adjust

    def _check_swelling(self, chosen, embedding, adjust: PatientAdjustment) -> None:
        """Both halves' calls of the content-chosen cells ``chosen`` (m, d) where both are mixed
        (a weight strictly between 0 and 1): their disagreement (``adjust.disagreement``, the
        review flag's) and, with ``largest_shares_``, the rare populations the adapted ones let
        swell, whose columns gating takes from the transfer model (``adjust.transfer_columns``;
        :mod:`gating_core.method.swollen_populations`)."""
        if not 0.0 < float(getattr(self, "adaptive_weight_", 0.0)) < 1.0:
            return
        transfer, adapted = self._halves(chosen, embedding, adjust)
        adjust.disagreement = float(np.mean(np.argmax(transfer, axis=1) != np.argmax(adapted, axis=1)))
        largest = getattr(self, "largest_shares_", None)
        if largest is None:
            return
        swollen = swollen_populations(self.class_prior_, largest, called_shares(adapted), called_shares(transfer))
        adjust.transfer_columns = swollen if swollen.any() else None

    def _halves(self, chosen, embedding, adjust: PatientAdjustment) -> tuple:
        """The transfer model's probabilities of cells ``chosen`` (m, d), after ``adjust``'s prior
        ratio and self-training step, and the adapted populations': two (m, k)."""
        if adjust.coef is None:
            transfer = adjust(self._proba(chosen, embedding, 50_000))
        else:
            transfer = adjust(*self._proba(chosen, embedding, 50_000, project=adjust.coef))
        return transfer, adjust.adapted(chosen)

    def _parts_disagreement(self, chosen, embedding, adjust: PatientAdjustment):
        """The share of the content-chosen cells ``chosen`` (m, d) on which the transfer model
        (after ``adjust``'s prior ratio and self-training step) and the patient's adapted
        populations name different populations; None unless both are mixed (a weight strictly
        between 0 and 1). Patients on which they disagree are gated worse, whichever is right
        (docs/unseen_data.md, "Which patients to review first")."""
        weight = float(getattr(self, "adaptive_weight_", 0.0))
        if adjust.gaussians is None or not 0.0 < weight < 1.0 or len(chosen) == 0:
            return None
        if adjust.disagreement is not None:  # _patient_adjustment's, from the same cells
            return adjust.disagreement
        transfer, adapted = self._halves(chosen, embedding, adjust)
        return float(np.mean(np.argmax(transfer, axis=1) != np.argmax(adapted, axis=1)))

    def _transfer_adjustment(self, chosen, embedding) -> PatientAdjustment:
        """The transfer model's part of :meth:`_patient_adjustment`."""
        ratio = self._prior_ratio(chosen, embedding)
        if not self._self_trains() or len(chosen) == 0:
            return PatientAdjustment(ratio)
        # In the order of their content hashes: the pseudo-labels drawn (and, for the same
        # embedding and prior ratio, every bit of the fit) then do not depend on the order of
        # the patient's events.
        chosen = chosen[np.argsort(content_hashes(chosen), kind="stable")]
        proba = PatientAdjustment(ratio)(self._proba(chosen, embedding, 50_000))
        coef = self_training_coef(self.classifier_._features(chosen, embedding), proba, random_state=self.random_state)
        return PatientAdjustment(ratio, coef)

    def _self_trains(self) -> bool:
        """Whether gating takes the self-training step: ``self_training`` on a marginal model of
        random features (the baselines, pooling and multitask, are left as they are)."""
        return bool(getattr(self, "self_training", False)) and self.method == "marginal" and self.solver == "rff"

    def _prior_ratio(self, chosen, embedding):
        """New prior / training prior of this patient (``prior_shift="em"``), else None.

        Estimated on the content-chosen cells the embedding comes from (``chosen``, (m, d)),
        so it is bounded in cost and identical whatever the chunking."""
        if self.prior_shift == "none":
            return None
        prior = reestimate_prior(self._proba(chosen, embedding, 50_000), self.class_prior_)
        return (prior / self.class_prior_).astype(np.float32)
