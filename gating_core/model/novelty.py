"""How far a patient lies from the training patients, in
:class:`~gating_core.model.estimator.GatingModel` (a mixin): its embedding, the distance to the
nearest training patient's, and the novelty score and warning built on it."""

from __future__ import annotations

import numpy as np

from gating_core.model.result import Novelty


class PatientNovelty:
    """Embeddings and novelty (mixed into GatingModel, whose fitted attributes it reads)."""

    def _fit_novelty(self):
        embeddings = self._patient_embeddings()
        if len(embeddings) < 2:
            self.novelty_nn_ = np.zeros(len(embeddings))
            self.novelty_reference_ = 1.0
            self.novelty_threshold_ = np.inf
            return
        d = np.sqrt(((embeddings[:, None] - embeddings[None]) ** 2).sum(-1))
        np.fill_diagonal(d, np.inf)
        nn = d.min(axis=1)
        self.novelty_nn_ = nn
        self.novelty_reference_ = float(np.median(nn)) or 1e-12
        # A training patient's own distance to its nearest peer, in reference units, is what
        # "seen before" looks like; beyond the farthest of those (with a margin) is new.
        self.novelty_threshold_ = float(max(1.5, 1.25 * nn.max() / self.novelty_reference_))

    def _nearest_training_patient(self, embedding) -> tuple[int, float]:
        """(index, squared Euclidean distance) of the real training patient whose embedding is
        nearest Psi (what novelty and the companion's share per patient both measure)."""
        squared = ((self._patient_embeddings() - np.asarray(embedding, dtype=np.float64)) ** 2).sum(axis=1)
        nearest = int(np.argmin(squared))
        return nearest, float(squared[nearest])

    def _patient_embeddings(self) -> np.ndarray:
        """Embeddings of the real training patients (augmented copies excluded)."""
        return self.classifier_.train_embeddings_[: len(self.training_patients_)]

    def patient_embedding(self, sample) -> np.ndarray:
        """Psi of a patient (after compensation): ndarray (2L,)."""
        self._check_fitted()
        sample = self._compensated(sample)
        return self._embedding(sample.events, self._channel_indices(sample))

    def _embedding(self, events, indices) -> np.ndarray:
        """Psi from the content-chosen cells of ``events`` (n, all channels) on ``indices``."""
        return self._patient_frame(events, indices)[1]

    def novelty(self, sample=None, embedding=None, disagreement=None, constant_channels=None) -> Novelty:
        """Novelty of a patient relative to the training patients (see :class:`Novelty`), with
        the share of its cells on which the model's parts disagree and the channels that hold
        one value on all its events ({$PnN: value}), when gating measured them
        (``disagreement``, ``constant_channels``; :meth:`gate` and :meth:`gate_chunks` do)."""
        self._check_fitted()
        if embedding is None:
            embedding = self.patient_embedding(sample)
        nearest, squared = self._nearest_training_patient(embedding)
        score = float(np.sqrt(squared) / self.novelty_reference_)
        is_novel = bool(score > self.novelty_threshold_)
        name = getattr(sample, "name", "this patient")
        # two decimals: a score of 1.47 against a threshold of 1.5 must not read "1.5 <= 1.5"
        if is_novel:
            message = (f"{name} is unlike every training patient (novelty {score:.2f}, threshold "
                       f"{self.novelty_threshold_:.2f}; nearest: {self.training_patients_[nearest]}). "
                       "Review its populations by hand.")
        else:
            message = (f"{name} resembles the training patients (novelty {score:.2f} <= "
                       f"{self.novelty_threshold_:.2f}; nearest: {self.training_patients_[nearest]}).")
        novelty = Novelty(score, self.novelty_threshold_, is_novel, self.training_patients_[nearest], message,
                          None if disagreement is None else float(disagreement))
        if disagreement is not None:
            parts = (f"The transfer model and {name}'s own populations name different populations for "
                     f"{disagreement:.1%} of its cells (review above {novelty.disagreement_threshold:.0%})")
            if novelty.parts_disagree and not is_novel:  # the warning leads with its reason
                novelty.message = f"{parts}: review its populations by hand. {message}"
            else:
                novelty.message += f" {parts}" + (": review its populations by hand." if novelty.parts_disagree else ".")
        novelty.note_constant_channels(constant_channels, name)
        return novelty
