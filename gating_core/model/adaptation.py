"""What gating does per new patient beyond the transfer model, in
:class:`~gating_core.model.estimator.GatingModel` (a mixin): the patient's own populations
adapted by EM (two generative fits: one covariance shared by all populations, and each
population's own shape), the pooled trees beside the transfer model (their weight and the trees
are chosen by :mod:`~gating_core.model.weight_check`), the populations' reach that calls cells beyond all of
them unknown, the EM prior ratio and the self-training step."""

from __future__ import annotations

import numpy as np

from gating_core.method.adaptive_lda import AdaptiveLDA
from gating_core.method.boosted_trees import PooledTrees
from gating_core.method.features import content_hashes
from gating_core.method.population_components import adapted_fits, component_start, population_starts, split_populations
from gating_core.method.saturation import without_piles
from gating_core.method.priors import reestimate_prior
from gating_core.method.self_training import PatientAdjustment, self_training_coef
from gating_core.method.swollen_populations import (PARTING_SHARE, called_shares, disagreement_beside,
                                                     swollen_populations)
from gating_core.method.ties import parts_disagreement, ties_broken
from gating_core.method.unknown_cells import UNKNOWN_MARGIN, PopulationReach
from gating_core.model.result import GATING_PARTS
from gating_core.model.weight_check import TREES_SHARE, WeightCheck

#: How far within the trees' bound (docs/method.md, pooled trees) a cell is still scored by them:
#: the float32 mix rounds each probability to about 6e-8.
BOUND_SLACK = np.float32(1e-6)


class PatientAdaptation(WeightCheck):
    """The adapted populations, the unknown-cell reach and the per-patient adjustment (mixed
    into GatingModel, whose parameters and fitted attributes it reads)."""

    def _shared_fit_cells(self, cells, parts) -> tuple:
        """The training cells and their components the shared-covariance fit is fitted on: without
        the cells piled at a channel's top value (:func:`~gating_core.method.saturation.without_piles`),
        recorded in ``selection_["saturated"]`` (a list, one entry per patient concerned). All of
        them with a DICA projection, whose coordinates are no channels."""
        if getattr(self, "dica_", None) is not None:
            return cells, parts
        kept_cells, kept_parts, left_out = without_piles(cells, parts)
        if left_out:
            channels = np.asarray(self.channels_)
            self.selection_["saturated"] = [
                {"patient": self.training_patients_[i], "cells": n, "channels": [str(c) for c in channels[piles]]}
                for i, (n, piles) in left_out.items()]
        return kept_cells, kept_parts

    def _fit_adaptive(self, cells, embedding_cells, labels, params, report):
        """The adapted populations (``adaptive_lda_``, fitted without the cells piled at a
        channel's top value, :meth:`_shared_fit_cells`; the own-shape fit, ``adaptive_shapes_``,
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
        self.adaptive_lda_ = AdaptiveLDA().fit(*self._shared_fit_cells(cells, parts), classes=names)
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

    def _adjusted_proba(self, cells, embedding, chunk_size, adjust: PatientAdjustment, part=None) -> np.ndarray:
        """The final probabilities of standardised (registered) cells of one patient: the blend
        (:meth:`_proba`), then ``adjust`` (its prior ratio and self-training step), then the
        patient's adapted populations mixed in (``adaptive_weight_``). ``part`` ("transfer" or
        "adapted", :meth:`gating_parts`) gives that part alone. The adapted populations alone
        (``part="adapted"``, or a weight of 1) break their ties with the transfer model
        (:func:`~gating_core.method.ties.ties_broken`), not by population name."""
        weight = float(getattr(self, "adaptive_weight_", 0.0))
        if part == "adapted" or (part is None and weight >= 1.0 and adjust.gaussians is not None):
            # The transfer model's share is 0: it is scored only where it breaks a tie.
            return ties_broken(adjust.adapted(cells),
                               lambda rows: self._transfer_proba(cells[rows], embedding, chunk_size, adjust))
        proba = self._transfer_proba(cells, embedding, chunk_size, adjust)
        if part == "transfer":
            return proba
        if getattr(self, "pooled_trees_", None) is None:
            return adjust.mix(proba, cells, weight)
        return self._mixed_with_trees(proba, cells, adjust, weight)

    def _transfer_proba(self, cells, embedding, chunk_size, adjust: PatientAdjustment) -> np.ndarray:
        """The transfer model's probabilities of cells (n, d) after ``adjust``'s prior ratio and
        self-training step: (n, k)."""
        if adjust.coef is None:
            return adjust(self._proba(cells, embedding, chunk_size))
        return adjust(*self._proba(cells, embedding, chunk_size, project=adjust.coef))

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
        adapted = adjust.gaussians is not None and weight > 0
        posteriors = adjust.adapted(cells) if adapted else None  # once, for both mixes
        final = adjust.mix(transfer.copy(), cells, weight, posteriors)
        share = np.float32(TREES_SHARE * ((1.0 - weight) if adapted else 1.0))
        if adapted and adjust.transfer_columns is not None:
            rows = np.arange(len(cells))
        else:
            lead = final - share * transfer
            top = np.argmax(final, axis=1)
            rows_all = np.arange(len(final))
            leader = lead[rows_all, top]
            lead[rows_all, top] = -np.inf
            # float32 rounding of the mix: a cell within a few steps of the bound is scored too
            rows = np.flatnonzero(lead.max(axis=1) >= leader - share - BOUND_SLACK)
        if len(rows):
            beside = (1.0 - TREES_SHARE) * transfer[rows] + TREES_SHARE * self.pooled_trees_.proba(cells[rows])
            final[rows] = adjust.mix(beside.astype(np.float32), cells[rows], weight,
                                     None if posteriors is None else posteriors[rows])
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
            adjust.gaussians, patient = adapted_fits(lda, own_em, ordered, self._reach_margin(), start,
                                                      adjust.components, getattr(self, "largest_shares_", None))
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
        :mod:`gating_core.method.swollen_populations`), unless the halves part ways on more than
        ``PARTING_SHARE`` of the other cells (:func:`disagreement_beside`). The shares and the
        parting count a cell whose top populations tie evenly to each of them
        (:func:`~gating_core.method.ties.call_weights`), whatever the populations' names."""
        if not 0.0 < float(getattr(self, "adaptive_weight_", 0.0)) < 1.0:
            return
        transfer, adapted = self._halves(chosen, embedding, adjust)
        adjust.disagreement = parts_disagreement(transfer, adapted)
        largest = getattr(self, "largest_shares_", None)
        if largest is None:
            return
        # The halves' ties are counted evenly, not broken by the transfer model: broken so, they
        # agree with it by construction, and a patient of a model of one center whose parting
        # then fell below the bound was gated at 0.68 instead of 0.87.
        swollen = swollen_populations(self.class_prior_, largest, called_shares(adapted), called_shares(transfer))
        # The transfer model's share is no reference where the halves part ways on the rest of
        # the patient (a model of one center gating another took a population that grew there
        # for a swollen one).
        if swollen.any() and disagreement_beside(transfer, adapted, swollen) > PARTING_SHARE:
            return
        adjust.transfer_columns = swollen if swollen.any() else None

    def _halves(self, chosen, embedding, adjust: PatientAdjustment) -> tuple:
        """The transfer model's probabilities of cells ``chosen`` (m, d), after ``adjust``'s prior
        ratio and self-training step, and the adapted populations': two (m, k)."""
        return self._transfer_proba(chosen, embedding, 50_000, adjust), adjust.adapted(chosen)

    def _parts_disagreement(self, chosen, embedding, adjust: PatientAdjustment):
        """The share of the content-chosen cells ``chosen`` (m, d) on which the transfer model
        (after ``adjust``'s prior ratio and self-training step) and the patient's adapted
        populations do not name the same population (:func:`~gating_core.method.ties.parts_disagreement`:
        a cell the adapted populations tie on counts); None unless both are mixed (a weight strictly
        between 0 and 1). Patients on which they disagree are gated worse, whichever is right
        (docs/unseen_data.md, "Which patients to review first")."""
        weight = float(getattr(self, "adaptive_weight_", 0.0))
        if adjust.gaussians is None or not 0.0 < weight < 1.0 or len(chosen) == 0:
            return None
        if adjust.disagreement is not None:  # _patient_adjustment's, from the same cells
            return adjust.disagreement
        return parts_disagreement(*self._halves(chosen, embedding, adjust))

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
