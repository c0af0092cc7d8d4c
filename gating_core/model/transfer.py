"""The transfer model's part of :class:`~gating_core.model.estimator.GatingModel` (a mixin):
model selection over groups of patients, the marginal classifier with its second fit and its
pooled companion, and their blended probabilities for one patient -- the companion's share
growing as the patient leaves the embedding's reach."""

from __future__ import annotations

import numpy as np

from gating_core.method.classifier import MarginalTransferClassifier
from gating_core.method.losses import loss_for
from gating_core.model.digest import infer_cell_groups

#: Penalty of the pooled companion's logistic fit: light, as a user would fit the plain baseline.
POOLED_ALPHA = 1e-5
#: Model selection runs on at most this many patients (a seeded draw beyond: selection_patients).
SELECTION_MAX_PATIENTS = 50


class TransferFit:
    """Selection, the marginal classifier, its second fit and the pooled companion (mixed into
    GatingModel, whose parameters and fitted attributes it reads)."""

    def _select(self, cells, embedding_cells, labels, report) -> dict:
        """The classifier's parameters, those left None chosen by cross-validation over groups
        (bandwidths, penalty; the logistic loss's own penalty search); ``selection_`` records
        what was chosen."""
        params = self._classifier_params()
        self.selection_ = {}
        if self.select and len(cells) >= 2 and self._wants_search():
            from gating_core.method.selection import select_hyperparameters

            report("Model selection (cross-validation over patients)", 0.15)
            chosen = self.selection_patients(len(cells))
            result = select_hyperparameters(
                [cells[i] for i in chosen], [labels[i] for i in chosen], MarginalTransferClassifier(**params),
                embedding_samples=[embedding_cells[i] for i in chosen],
                cv_folds=self.cv_folds, cv_repeats=self.cv_repeats, cells_per_patient=self.selection_cells_per_patient,
                progress=lambda f: report("Model selection (cross-validation over patients)", 0.15 + 0.65 * f),
                groups=[self.groups_[i] for i in chosen], objective=self.selection_objective,
                embedding_factors=self._embedding_factors())
            self.selection_ = self._apply_selection(params, result)
            self.selection_["n_patients"] = len(chosen)
        if self.alpha is None and loss_for(self.loss).searches_own_penalty:
            from gating_core.method.companion_selection import select_logistic_alpha

            report("Choosing the logistic penalty (cross-validation over groups)", 0.7)
            params["alpha"] = select_logistic_alpha(cells, labels, MarginalTransferClassifier(**params),
                                                    embedding_samples=embedding_cells, groups=self.groups_,
                                                    cv_folds=self.cv_folds,
                                                    cells_per_patient=self.selection_cells_per_patient)
            self.selection_.setdefault("params", {})["alpha"] = params["alpha"]
        if params["alpha"] is None:
            params["alpha"] = 1e-4
        return params

    def selection_patients(self, n_patients: int) -> list[int]:
        """Indices of the patients the hyperparameter search runs on: all of them up to
        ``SELECTION_MAX_PATIENTS``, beyond that a seeded draw of that many (sorted).

        Why: the search is 39-45% of a training at up to 50 patients and grows with them; on a
        seeded half of the patients it chose parameters of the same held-out accuracy where
        that could be compared with a full search (docs/scaling.md,
        bench/bench_selection_subset.py). The final fit still uses every patient. Up to
        ``SELECTION_MAX_PATIENTS`` patients nothing changes."""
        if n_patients <= SELECTION_MAX_PATIENTS:
            return list(range(n_patients))
        rng = np.random.default_rng(np.random.SeedSequence([int(self.random_state or 0), 12]))
        return sorted(int(i) for i in rng.choice(n_patients, SELECTION_MAX_PATIENTS, replace=False))

    def _wants_search(self) -> bool:
        """Whether a hyperparameter is left to model selection."""
        wants_x = self.bandwidth_x is None and self.kernel_x != "linear"  # the linear k_X has no sigma_X
        return wants_x or self.alpha is None or (self.method == "marginal" and self.bandwidth_p is None)

    def _embedding_factors(self):
        """The sigma' grid the selection searches (None: sigma' is not selected)."""
        from gating_core.method.selection import DEFAULT_EMBEDDING_FACTORS

        return DEFAULT_EMBEDDING_FACTORS if self.select_embedding_bandwidth else None

    def _apply_selection(self, params: dict, result) -> dict:
        """Fill the classifier ``params`` the user left None from a selection ``result`` (in
        place; the embedding dropped when selection fell back to pooling) and return the
        ``selection_`` record."""
        for key in ("bandwidth_x", "bandwidth_p", "alpha"):
            if params[key] is None:
                params[key] = result.params[key]
        if self.bandwidth_p is None and not result.params["use_embedding"]:
            params["use_embedding"], params["bandwidth_p"] = False, None
        record = {"params": {k: params[k] for k in ("bandwidth_x", "bandwidth_p", "alpha")},
                  "embedding_kept": bool(params["use_embedding"]), "cv_accuracy": result.score,
                  "median_x": result.median_x, "median_p": result.median_p, "table": result.table}
        # sigma' only when the search chose it (its table rows carry an e_factor)
        if params["use_embedding"] and any("e_factor" in row for row in result.table):
            params["bandwidth_embedding"] = result.params["bandwidth_embedding"]
            record["bandwidth_embedding"] = float(params["bandwidth_embedding"])
        return record

    def _set_groups(self, groups, embedding_cells, names):
        if groups is not None:
            groups = [str(g) for g in groups]
            if len(groups) != len(names):
                raise ValueError(f"{len(groups)} group labels for {len(names)} patients")
            if len(set(groups)) > 1 or len(groups) < 2:
                self.groups_, self.groups_inferred_ = groups, False
                return
        # No groups, or one for every patient (training on a single center or batch): which
        # patients may validate which is then found from the embeddings, so that replicate twins
        # are never on both sides of a selection fold. Folding one batch's patients one by one
        # chose, on the shared data, a model that gated the other batch at 0.897 in worst
        # patient, against 0.9125 with its near-duplicate pairs kept together.
        inferred = infer_cell_groups(embedding_cells, names, self.n_embedding_features, self.random_state)
        self.groups_ = inferred if groups is None else [f"{g}/{i}" for g, i in zip(groups, inferred)]
        self.groups_inferred_ = True

    def _classifier_params(self) -> dict:
        return dict(use_embedding=self.method == "marginal", solver=self.solver, n_features=self.n_features,
                    n_embedding_features=self.n_embedding_features, bandwidth_x=self.bandwidth_x,
                    bandwidth_p=self.bandwidth_p if self.method == "marginal" else None, alpha=self.alpha,
                    loss=self.loss, n_augment=self.n_augment, augment_gain=self.augment_gain,
                    augment_shift=self.augment_shift, patient_weighting=self.patient_weighting,
                    cells_per_patient=self.cells_per_patient, embedding_cells=self.embedding_cells,
                    random_state=self.random_state,
                    task_similarity=self.task_similarity if self.method == "multitask" else None,
                    kernel_x=self.kernel_x)

    def _fit_transfer(self, cells, embedding_cells, labels, params, report, fixed=None):
        """The transfer model: the classifier, its second fit and its pooled companion.
        ``fixed`` ({"companion_bandwidth_x", "pooled_weight"}) takes the companion's settings as
        given instead of choosing them (the folds of :meth:`_choose_adaptive_weight`)."""
        report("Fitting the final model", 0.8)
        self.classifier_ = MarginalTransferClassifier(**params).fit(cells, labels, embedding_samples=embedding_cells,
                                                                    groups=self.groups_)
        self.hedge_classifier_ = None
        hedge = self._hedge_params(params, self.selection_)
        if hedge is not None:
            report("Fitting the second model (the narrower cell bandwidth)", 0.8)
            self.hedge_classifier_ = MarginalTransferClassifier(**hedge).fit(
                cells, labels, embedding_samples=embedding_cells, groups=self.groups_)
        self.pooled_classifier_, self.pooled_weight_, self.companion_bandwidth_x_ = None, 0.0, None
        if fixed is not None:
            self.companion_bandwidth_x_, self.pooled_weight_ = fixed["companion_bandwidth_x"], fixed["pooled_weight"]
        elif self._wants_companion():
            self.companion_bandwidth_x_ = self._select_companion_bandwidth(cells, labels, embedding_cells, params,
                                                                           report)
            self.pooled_weight_ = self._choose_pooled_weight(cells, labels, embedding_cells, params, report)
        if self.pooled_weight_ > 0:
            report("Fitting the pooled companion", 0.9)
            self.pooled_classifier_ = MarginalTransferClassifier(**self._companion_params(params)).fit(
                cells, labels, embedding_samples=embedding_cells, groups=self.groups_)

    def _hedge_params(self, params: dict, selection: dict):
        """Parameters of the marginal method's second fit (``bandwidth_x_hedge``), or None when it
        has none: sigma_X given by the user or not selected, another method, solver or cell kernel,
        or a second bandwidth equal to the selected one."""
        f = self.bandwidth_x_hedge
        if f is None:
            return None
        if (self.method != "marginal" or self.solver != "rff" or self.kernel_x != "gaussian"
                or self.bandwidth_x is not None or "median_x" not in selection):
            return None
        chosen = float(params["bandwidth_x"])
        other = f * max(chosen, float(selection["median_x"]))
        if abs(np.log(other / chosen)) < 1e-9:
            return None
        return {**params, "bandwidth_x": other}

    def _wants_companion(self) -> bool:
        return self.method == "marginal" and self.solver == "rff" and self.pooled_weight != 0

    def _choose_pooled_weight(self, cells, labels, embedding_cells, params, report) -> float:
        if self.pooled_weight != "auto":
            return float(self.pooled_weight)
        from gating_core.method.companion_selection import PREFERRED_POOLED_WEIGHT, select_pooled_weight

        if not self.select:
            return PREFERRED_POOLED_WEIGHT
        report("Weighing the pooled companion (cross-validation over groups)", 0.82)
        result = select_pooled_weight(
            cells, labels, MarginalTransferClassifier(**params),
            MarginalTransferClassifier(**self._companion_params(params)), embedding_samples=embedding_cells,
            groups=self.groups_, cv_folds=self.cv_folds, cells_per_patient=self.selection_cells_per_patient,
            objective=self.selection_objective,
            progress=lambda f: report("Weighing the pooled companion (cross-validation over groups)", 0.82 + 0.07 * f))
        self.selection_["pooled_weight"] = {"chosen": result.weight, "folds": result.n_folds,
                                            "cv_accuracy": {str(w): s for w, s in result.table.items()}}
        return result.weight

    def _companion_params(self, params: dict, bandwidth_x=None) -> dict:
        """The pooled companion: the main model's features without the embedding, logistic
        loss, no augmentation, every patient weighing the same; its own selected cell bandwidth
        (``companion_bandwidth_x_``), else the main model's."""
        if bandwidth_x is None:
            bandwidth_x = getattr(self, "companion_bandwidth_x_", None) or self.classifier_.bandwidth_x_
        return {**params, "use_embedding": False, "bandwidth_p": None, "loss": "logistic", "alpha": POOLED_ALPHA,
                "n_augment": 0, "patient_weighting": "uniform", "bandwidth_x": bandwidth_x}

    def _companion_search_base(self, params: dict):
        """The classifier whose sigma_X the companion's selection chooses, or None when the
        companion takes the main model's (sigma_X given by the user, or no selection)."""
        if not self.select or self.bandwidth_x is not None or self.kernel_x == "linear":
            return None
        return MarginalTransferClassifier(**{**self._companion_params(params, bandwidth_x=1.0), "bandwidth_x": None})

    def _select_companion_bandwidth(self, cells, labels, embedding_cells, params, report):
        base = self._companion_search_base(params)
        if base is None or len(cells) < 2:
            return None
        from gating_core.method.selection import select_hyperparameters

        report("Choosing the pooled companion's bandwidth (cross-validation over groups)", 0.88)
        chosen = self.selection_patients(len(cells))
        result = select_hyperparameters([cells[i] for i in chosen], [labels[i] for i in chosen], base,
                                        embedding_samples=[embedding_cells[i] for i in chosen],
                                        cv_folds=self.cv_folds, cv_repeats=self.cv_repeats,
                                        cells_per_patient=self.selection_cells_per_patient,
                                        groups=[self.groups_[i] for i in chosen], objective=self.selection_objective)
        self.selection_["companion"] = {"bandwidth_x": result.params["bandwidth_x"], "cv_accuracy": result.score}
        return result.params["bandwidth_x"]

    def _proba(self, cells, embedding, chunk_size, project=None):
        """Probabilities of standardised cells of one patient: the marginal model's (the mean of
        its two fits when it has a second, ``bandwidth_x_hedge``), blended with the pooled
        companion's (:meth:`companion_weight`) when there is one. With ``project`` (D, k2), also
        the marginal classifier's features of the cells projected on it, from the same
        features: (probabilities, projection)."""
        if project is None:
            proba = self.classifier_.predict_proba(cells, embedding, chunk_size=chunk_size)
        else:
            proba, projected = self.classifier_.predict_proba_and_project(cells, embedding, project)
        hedge = getattr(self, "hedge_classifier_", None)
        if hedge is not None:
            proba += hedge.predict_proba(cells, embedding, chunk_size=chunk_size)
            proba *= np.float32(0.5)
        companion = getattr(self, "pooled_classifier_", None)
        if companion is not None:
            weight = np.float32(self.companion_weight(embedding))
            proba *= np.float32(1.0) - weight
            proba += weight * companion.predict_proba(cells, embedding, chunk_size=chunk_size)
        return proba if project is None else (proba, projected)

    def embedding_support(self, embedding) -> float:
        """How far the marginal model's training reaches to a patient of embedding Psi (2L,):
        k_P(Psi, Psi_i) = exp(-||Psi - Psi_i||^2 / (2 sigma_P^2)) for the nearest real training
        patient i, in [0, 1]; 1 when the model does not use the embedding (k_P = 1).

        The kernel machine's decision for a patient is a sum over training patients weighted
        by k_P, so it fades as k_P does; its random-feature approximation does not fade, it
        turns to noise. Trained on one replicate pair (sigma_P then chosen narrow) and asked
        to gate eight patients of another batch at 2-4 sigma_P away, the marginal model alone
        gated them at 0.12-0.22 accuracy (docs/method.md, "The pooled companion")."""
        self._check_fitted()
        clf = self.classifier_
        if not clf.use_embedding or clf.bandwidth_p_ is None or embedding is None:
            return 1.0
        squared = self._nearest_training_patient(embedding)[1]
        return float(np.exp(-squared / (2.0 * float(clf.bandwidth_p_) ** 2)))

    def companion_weight(self, embedding) -> float:
        """The pooled companion's share of the blend for a patient of embedding Psi:
        ``1 - (1 - pooled_weight_) * s`` with s = :meth:`embedding_support`. Among patients
        like the training ones (s = 1) it is ``pooled_weight_``; as a patient leaves what
        the embedding was trained on, the marginal model's share fades with k_P, as the
        exact kernel machine's would, and the gates become the pooled companion's. 0 when
        there is no companion."""
        if getattr(self, "pooled_classifier_", None) is None:
            return 0.0
        keep = 1.0 - float(self.pooled_weight_)
        return 1.0 - keep * self.embedding_support(embedding)
