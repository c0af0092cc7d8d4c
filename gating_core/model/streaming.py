"""Gating a patient whose events arrive in chunks (GatingModel's streamed half).

:class:`StreamedGating` is mixed into :class:`~gating_core.model.estimator.GatingModel`: two passes over
the chunks -- the content-chosen cells of the embedding first, then scoring -- give exactly what
:meth:`GatingModel.gate` gives on the whole sample, with memory bounded by a few chunks.
"""

from __future__ import annotations

import numpy as np

from gating_core.cpus import parallel_rows, with_blas_threads
from gating_core.method.features import content_hashes
from gating_core.method.prediction import SCORE_BLOCK
from gating_core.method.self_training import PatientAdjustment
from gating_core.model.preprocessing import (CONSTANT_HEAD_EVENTS, constant_channels, nonfinite_events,
                                             refuse_nonfinite, refuse_unmeasured)
from gating_core.model.result import GATING_PARTS, Novelty, StreamedGate

#: The population of cells beyond every training population (GatingModel's ``unknown_margin``).
UNKNOWN = "unknown"


class StreamedGating:
    """:meth:`gate_chunks` and what it needs (a mixin of GatingModel)."""

    @with_blas_threads
    def gate_chunks(self, sample, chunks, chunk_size=50_000, sink=None, part=None) -> "StreamedGate":
        """Gate one patient whose events arrive in chunks: memory bounded by a few chunks and
        the ``embedding_cells`` content-chosen cells, whatever the number of events.

        The result equals :meth:`gate` on the whole sample with the same ``chunk_size`` bit for
        bit (any ``chunk_size`` with random features, see :meth:`gate`): a first pass keeps the
        rows with the smallest content hashes (the cells :func:`content_subsample` chooses),
        from which the embedding, registration and prior ratio follow; a second pass scores
        every chunk.

        Parameters
        ----------
        sample : Sample
            Describes the patient (name, channels, spillover); its ``events`` are not used.
            The chunks must already be compensated when the model compensates.
        chunks : callable(chunk_events) -> iterable of (start, events)
            Called twice (two passes over the file). Yields the events (m, n_channels) in file
            order, ``m == chunk_events`` except for the last window
            (:meth:`gating_core.fcs.EventStream.chunks` does).
        chunk_size : int
            Events scored at a time (rounded up to whole scoring blocks, as in :meth:`gate`).
        sink : callable(start, events, codes, confidence) or None
            Receives each scored chunk: the events as read (m, n_channels), the population
            codes (m,) int16 into :meth:`gated_populations` and the confidences (m,) float32.
        part : str or None
            None: the model's gating. One of :meth:`gating_parts`: that part of the model alone
            (the novelty and the parts' disagreement are the patient's all the same).

        Returns
        -------
        StreamedGate (novelty, counts, number of events, mean confidence).
        """
        self._check_fitted()
        self._check_part(part)
        if self.compensate and sample.has_spillover and not sample.compensated:
            raise ValueError(f"{sample.name}: gate_chunks needs compensated chunks (the model compensates)")
        indices = self._channel_indices(sample)
        bad = [0, set()]  # events and channels holding NaN or infinite values, over every chunk
        head = []  # the file's first events, for the constant channels (as gate() takes them)

        def checked(size):
            for start, events in chunks(size):
                rows, channels = nonfinite_events(events, indices)
                bad[0] += rows
                bad[1] |= channels
                taken = sum(len(h) for h in head)
                if taken < CONSTANT_HEAD_EVENTS:
                    head.append(np.array(events[:CONSTANT_HEAD_EVENTS - taken]))
                yield start, events

        chosen_raw, n = self._content_chosen_rows(checked, indices, max(SCORE_BLOCK, int(chunk_size)))
        refuse_nonfinite(sample.name, bad[0], bad[1], sample.pnn)  # as gate() refuses them
        if n == 0:
            raise ValueError(f"{sample.name}: the sample holds no events")
        # As gate(): channels of one value in the first events are checked on every event (one
        # more pass over the file, only for a patient that has such a channel).
        constant = constant_channels(sample, (events for _, events in chunks(max(SCORE_BLOCK, int(chunk_size)))),
                                     indices, np.concatenate(head) if head else np.empty((0, 0)))
        refuse_unmeasured(sample.name, constant, len(indices), n)
        registration, embedding, chosen = self._patient_frame(chosen_raw, list(range(len(indices))))
        adjust = self._patient_adjustment(chosen, embedding)
        chunk_size = max(1, -(-int(chunk_size) // SCORE_BLOCK)) * SCORE_BLOCK
        names = self.gated_populations()
        counts = np.zeros(len(names), dtype=np.int64)
        total_confidence, seen = 0.0, 0
        for start, events in chunks(chunk_size):
            if start != seen or (len(events) != chunk_size and start + len(events) != n):
                raise ValueError(f"{sample.name}: chunks must come in order, {chunk_size} events each")
            cells = self._registered(self._standardised_rows(events, indices), registration)
            proba = self._adjusted_proba(cells, embedding, chunk_size, adjust, part)
            codes, confidence = self._assign(proba, cells, adjust)
            counts += np.bincount(codes, minlength=len(names))
            total_confidence += float(confidence.sum(dtype=np.float64))
            seen += len(events)
            if sink is not None:
                sink(start, events, codes, confidence)
        if seen != n:
            raise ValueError(f"{sample.name}: the second pass gave {seen} events, the first {n}")
        disagreement = self._parts_disagreement(chosen, embedding, adjust)
        novelty = self._streamed_novelty(sample, embedding, disagreement, constant)
        return StreamedGate(novelty, {p: int(c) for p, c in zip(names, counts)},
                            n, total_confidence / n if n else 0.0, names, part)

    def gating_parts(self) -> tuple:
        """The parts of the model that gating can give alone (``part=`` of :meth:`gate`): none
        here; GatingModel's transfer model and adapted populations when it mixes both."""
        return ()

    def _check_part(self, part) -> None:
        if part is None:
            return
        parts = self.gating_parts()
        if part not in parts:
            if not parts:
                raise ValueError(f"part={part!r}: this model gates with one part (it mixes none of "
                                 f"{', '.join(GATING_PARTS)}); leave part at None")
            raise ValueError(f"part={part!r}: one of {', '.join(parts)}, or None for the model's own gating")

    def gated_populations(self) -> list:
        """The populations gating gives, in code order: ``populations_``, then ``"unknown"``
        when the model calls cells beyond every population unknown (``population_reach_``) and
        no training population has that name."""
        names = [str(p) for p in self.populations_]
        if self._unknown_called() and UNKNOWN not in names:
            names.append(UNKNOWN)
        return names

    def _unknown_called(self) -> bool:
        """Whether gating calls cells beyond every population's reach unknown (the reach also
        serves the adapted populations' own-shape fit, with or without the unknown call)."""
        return getattr(self, "population_reach_", None) is not None and getattr(self, "unknown_margin", None) is not None

    def _assign(self, proba, cells, adjust: PatientAdjustment):
        """Population codes (n,) int16 into :meth:`gated_populations` and confidences (n,)
        float32 of cells from their probabilities (n, k): the most probable population, or
        ``"unknown"`` (confidence 0: no population's) for a cell beyond every population."""
        codes = np.argmax(proba, axis=1).astype(np.int16)
        confidence = proba[np.arange(len(codes)), codes].astype(np.float32, copy=False)
        reach = getattr(self, "population_reach_", None)
        if self._unknown_called() and adjust.reach is not None and len(codes):
            far = reach.unknown(cells, adjust.reach)
            if far.any():
                codes[far] = self.gated_populations().index(UNKNOWN)
                confidence[far] = 0.0
        return codes, confidence

    def _patient_adjustment(self, chosen, frame) -> PatientAdjustment:
        """What scoring does to the model's probabilities of this patient: by default its prior
        ratio (``_prior_ratio``) alone; GatingModel adds its self-training step."""
        return PatientAdjustment(self._prior_ratio(chosen, frame))

    def _streamed_novelty(self, sample, frame, disagreement, constant) -> Novelty:
        """The patient's novelty, with the parts' disagreement (None: one part) and its constant
        channels ({$PnN: value})."""
        novelty = self.novelty(sample, frame) if disagreement is None else self.novelty(sample, frame, disagreement)
        novelty.note_constant_channels(constant, sample.name)
        return novelty

    def _parts_disagreement(self, chosen, frame, adjust: PatientAdjustment):
        """The share of the patient's cells on which the model's parts disagree: None by default
        (one part); GatingModel measures its transfer model against the adapted populations."""
        return None

    def _adjusted_proba(self, cells, frame, chunk_size, adjust: PatientAdjustment, part=None) -> np.ndarray:
        """The model's probabilities of a chunk's cells (``_proba``), then ``adjust`` (one part:
        ``part`` is None)."""
        return adjust(self._proba(cells, frame, chunk_size))

    def _standardised_rows(self, events, indices) -> np.ndarray:
        """``_standardise(events[:, indices])`` computed on row blocks in parallel (the
        transform is element-wise, so the result is the same bits)."""

        cells = np.empty((len(events), len(indices)), dtype=np.float32)

        def run(bounds):
            lo, hi = bounds
            cells[lo:hi] = self._scaled(events[lo:hi][:, indices])

        parallel_rows(run, len(events))
        return self._invariant(cells)  # DICA on the whole chunk, as gate() projects it

    def _content_chosen_rows(self, chunks, indices, chunk_events):
        """First pass of :meth:`gate_chunks`: the raw rows (model channels, file order) that
        ``content_subsample(events[:, indices], embedding_cells)`` picks, and the event count.

        Keeps the rows of the smallest hashes seen so far (with ties at the cut, which only
        identical rows share); when tied rows straddle the final cut (the order-dependent
        choice ``argpartition`` makes among them), hashes every row once more and lets
        ``content_subsample``'s own selection decide, so the result is always the same."""
        k = int(self.embedding_cells)
        kept_hash = np.empty(0, dtype=np.uint64)
        kept_rows = None
        n = 0
        cut = None  # the k-th smallest hash kept so far, once k rows are kept
        for start, events in chunks(chunk_events):
            raw = events[:, indices]
            hashes = content_hashes(raw, parallel=True)
            n = start + len(raw)
            if cut is not None:
                # A row above the cut can never be among the k smallest (k kept rows are at or
                # below it): dropped before the copies, the same rows survive.
                below = hashes <= cut
                hashes, raw = hashes[below], raw[below]
            kept_hash = np.concatenate([kept_hash, hashes])
            kept_rows = raw if kept_rows is None else np.concatenate([kept_rows, raw])
            if len(kept_hash) >= k:
                cut = np.partition(kept_hash, k - 1)[k - 1]
                keep = kept_hash <= cut
                kept_hash, kept_rows = kept_hash[keep], kept_rows[keep]
        if kept_rows is None:
            return np.empty((0, len(indices)), dtype=np.float32), 0
        if n <= k:
            return kept_rows, n
        cut = np.partition(kept_hash, k - 1)[k - 1]
        below = kept_hash < cut
        tied = kept_hash == cut
        if int(tied.sum()) == k - int(below.sum()):
            return kept_rows[below | tied], n
        # Tied rows straddle the cut: reproduce argpartition's choice on all the hashes.
        hashes = np.empty(n, dtype=np.uint64)
        for start, events in chunks(chunk_events):
            hashes[start:start + len(events)] = content_hashes(events[:, indices], parallel=True)
        chosen = np.sort(np.argpartition(hashes, k - 1)[:k])
        del hashes
        rows = []
        for start, events in chunks(chunk_events):
            local = chosen[(chosen >= start) & (chosen < start + len(events))] - start
            rows.append(events[local][:, indices])
        return np.concatenate(rows), n
