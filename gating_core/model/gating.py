"""Gating one patient in memory, in :class:`~gating_core.model.estimator.GatingModel` (a mixin):
its content-chosen cells (the embedding's, registration's and EM's, the same whatever the
chunking), then every event scored chunk by chunk. The streamed half, for files read in
windows, is :mod:`gating_core.model.streaming`."""

from __future__ import annotations

import numpy as np

from gating_core.method.prediction import SCORE_BLOCK
from gating_core.method.features import content_subsample
from gating_core.model.preprocessing import CONSTANT_HEAD_EVENTS, check_finite, constant_channels, refuse_unmeasured
from gating_core.model.result import GateResult


class PatientGating:
    """``gate``, ``predict`` and ``predict_proba`` (mixed into GatingModel, whose fitted
    attributes and per-patient steps it uses)."""

    def _patient_frame(self, events, indices):
        """What gating one patient needs from its content-chosen cells (the same whatever the
        chunking): its registration (``align="quantile"``, else None), its embedding Psi (2L,)
        and those cells, standardised and registered (m, d)."""
        registration, chosen = self._chosen_cells(events, indices)
        return registration, self.classifier_.embed(chosen), chosen

    def _chosen_cells(self, events, indices):
        """The patient's registration (or None) and its content-chosen cells, registered."""
        raw = events[:, indices]
        chosen = self._standardise(raw[content_subsample(raw, self.embedding_cells, parallel=True)])
        registration = self._patient_registration(chosen)  # gating_core.model.preprocessing
        return registration, self._registered(chosen, registration)

    @staticmethod
    def _registered(cells, registration):
        return cells if registration is None else registration.transform(cells)

    def gate(self, sample, chunk_size=50_000, part=None) -> GateResult:
        """Gate one patient: population and confidence of every event, in file order.

        ``sample``: a :class:`~gating_core.fcs.Sample`, a ``flowkit.Sample`` or an AnnData
        (converted by :func:`gating_core.io.interop.as_sample`). ``part``: None for the model's
        gating, or one of :meth:`gating_parts` for that part alone (a reviewer's alternative where
        the parts disagree; the novelty is the same)."""
        self._check_fitted()
        self._check_part(part)
        sample = self._compensated(sample)
        indices = self._channel_indices(sample)
        events = sample.events
        if sample.n_events == 0:
            raise ValueError(f"{sample.name}: the sample holds no events")
        check_finite(sample.name, events, indices, sample.pnn)
        constant = constant_channels(sample, [events], indices, events[:CONSTANT_HEAD_EVENTS])
        refuse_unmeasured(sample.name, constant, len(indices), sample.n_events)
        registration, embedding, chosen = self._patient_frame(events, indices)
        adjust = self._patient_adjustment(chosen, embedding)
        n = sample.n_events
        # Chunks are whole multiples of the scoring block, so with random features (the default
        # solver) every cell is scored in the same block whatever chunk_size is: results are
        # bitwise independent of it. The linear cell kernel (products of up to 65,536 rows from
        # the chunk's start) and the Nystroem / exact solvers (one product per chunk) put a cell
        # in another product when chunk_size changes, which BLAS may round differently:
        # independent of chunk_size to float32 rounding only. So is the unknown-cell call (one
        # product per chunk): a cell within float32 rounding of the margin may fall either way.
        # The adapted populations alone ask the transfer model only about their tied cells, in a
        # product of those: a tie the transfer model too holds within rounding may go either way.
        chunk_size = max(1, -(-int(chunk_size) // SCORE_BLOCK)) * SCORE_BLOCK
        codes = np.empty(n, dtype=np.int16)
        confidence = np.empty(n, dtype=np.float32)
        for start in range(0, n, chunk_size):
            cells = self._registered(self._standardise(events[start:start + chunk_size][:, indices]), registration)
            proba = self._adjusted_proba(cells, embedding, chunk_size, adjust, part)
            codes[start:start + len(cells)], confidence[start:start + len(cells)] = self._assign(proba, cells, adjust)
        # An object array shares one str per population: 8 bytes per event instead of 4 x the
        # longest name, which matters on files of millions of events.
        names = self.gated_populations()
        populations = np.asarray(names, dtype=object)[codes] if n else np.array([], dtype=object)
        counts = np.bincount(codes, minlength=len(names)) if n else np.zeros(len(names), int)
        novelty = self.novelty(sample, embedding, self._parts_disagreement(chosen, embedding, adjust), constant)
        return GateResult(populations, confidence, novelty, names,
                          {name: int(c) for name, c in zip(names, counts)}, part)

    def predict(self, sample) -> np.ndarray:
        """Population of every event of ``sample``: (n_events,) str."""
        return self.gate(sample).populations

    def predict_proba(self, sample, part=None) -> np.ndarray:
        """Probability of each population (columns in ``populations_`` order): (n_events, k).
        ``part``: as in :meth:`gate`."""
        self._check_fitted()
        self._check_part(part)
        cells, embedding, adjust = self._patient_parts(sample)
        return self._adjusted_proba(cells, embedding, 50_000, adjust, part)

    def _patient_parts(self, sample):
        """Every event of one patient standardised and registered (n, d), its embedding Psi and
        its :class:`~gating_core.method.self_training.PatientAdjustment`: what scoring it needs."""
        sample = self._compensated(sample)
        indices = self._channel_indices(sample)
        registration, embedding, chosen = self._patient_frame(sample.events, indices)
        cells = self._registered(self._standardise(sample.events[:, indices]), registration)
        return cells, embedding, self._patient_adjustment(chosen, embedding)
