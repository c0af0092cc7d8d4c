"""From a panel's raw events to the cells the classifier sees: GatingModel's channel half.

:class:`ChannelPreprocessing` is mixed into :class:`~gating_core.model.estimator.GatingModel`: it chooses
the channels every training patient shares (by ``$PnN``, or ``$PnS`` when detectors differ),
compensates, fixes one transform per channel for the panel and the standardisation, and turns
any sample's events into standardised (and, with ``align="quantile"`` or ``"landmarks"``,
registered) cells.
"""

from __future__ import annotations

import numpy as np

from gating_core.fcs.transforms import ChannelTransform, default_transform, is_time_like, with_overrides
from gating_core.method.alignment import ALIGNMENTS, QuantileRegistration, channel_quantiles
from gating_core.method.features import content_subsample
from gating_core.method.landmark_alignment import LandmarkReference
from gating_core.model.digest import DigestView, find_channel
from gating_core.model.result import ChannelMismatchError

#: Rows checked for NaN / infinite values at a time (no copy of a whole file's channels).
FINITE_CHECK_ROWS = 262_144


def _flagged_events(events, indices, flagged) -> tuple[int, set]:
    """(events with a value ``flagged`` (a boolean test of a block) on the channels ``indices``,
    those channels), read in row blocks: no copy of a whole file's channels."""
    bad_rows, bad_channels = 0, set()
    for start in range(0, len(events), FINITE_CHECK_ROWS):
        bad = flagged(events[start:start + FINITE_CHECK_ROWS][:, indices])
        if bad.any():
            bad_rows += int(bad.any(axis=1).sum())
            bad_channels |= {int(indices[j]) for j in np.flatnonzero(bad.any(axis=0))}
    return bad_rows, bad_channels


def nonfinite_events(events, indices) -> tuple[int, set]:
    """(events holding NaN or infinite values on the channels ``indices``, those channels)."""
    return _flagged_events(events, indices, lambda block: ~np.isfinite(block))


def refuse_nonfinite(name: str, bad_rows: int, bad_channels, pnn,
                     problem: str = "NaN or infinite values") -> None:
    """Raise ValueError naming the patient, how many events and which channels hold NaN or
    infinite values (or the ``problem`` named), if any do."""
    if bad_rows:
        names = ", ".join(pnn[i] for i in sorted(bad_channels))
        raise ValueError(f"{name}: {bad_rows} events hold {problem} (channels {names}); "
                         f"remove those events or fix the values")


#: A training event beyond this magnitude on a model channel is refused: no instrument measures
#: it, and one such value makes a channel's standardisation infinite (gating calls it unknown).
MAX_TRAINING_VALUE = 1e15


def check_training_values(name: str, events, indices, pnn) -> None:
    """Raise ValueError naming the patient, how many events and which of the channels hold NaN,
    infinite values or values beyond MAX_TRAINING_VALUE, if any do."""
    check_finite(name, events, indices, pnn)
    far = _flagged_events(events, indices, lambda block: np.abs(block) > MAX_TRAINING_VALUE)
    refuse_nonfinite(name, *far, pnn, f"values beyond {MAX_TRAINING_VALUE:g}")


def check_finite(name: str, events, indices, pnn) -> None:
    """Raise ValueError naming the patient, how many events and which of the channels
    ``indices`` (names ``pnn``) hold NaN or infinite values, if any do."""
    refuse_nonfinite(name, *nonfinite_events(events, indices), pnn)


#: Standardised values are held within this many standard deviations of the training centre. No
#: real cell lies so far out; a value an instrument or a broken file wrote there (1e30 on a linear
#: channel) would otherwise overflow the squares of the kernels and the reach into NaN, where it
#: must simply be a cell beyond every population.
STANDARDISED_BOUND = 1e4


class ChannelPreprocessing:
    """Channels, compensation, transform and standardisation of a GatingModel (a mixin: it
    reads the model's parameters and sets ``channels_``, ``channel_markers_``, ``transform_``,
    ``center_``, ``scale_``, ``reference_quantiles_`` and ``reference_landmarks_``)."""

    def prepare_digests(self, digests):
        """Choose channels, transform and standardisation from training digests.

        Returns, per patient, the standardised training cells (m_i, d), the standardised cells
        its embedding is computed from (e_i, d) and the training cells' labels (m_i,).
        """
        patients = [DigestView(d) for d in digests]
        self._choose_channels(patients)
        indices = [self._channel_indices(v) for v in patients]
        for digest, index in zip(digests, indices):
            pnn = [c.pnn for c in digest.channels]
            check_training_values(digest.name, digest.train_events, index, pnn)
            check_training_values(digest.name, digest.embedding_events, index, pnn)
        embedding_raw = [d.embedding_events[:, i] for d, i in zip(digests, indices)]
        self._fit_scales(embedding_raw, patients[0])
        self.dica_ = None
        cells = [self._standardise(d.train_events[:, i]) for d, i in zip(digests, indices)]
        embedding_cells = [self._standardise(r) for r in embedding_raw]
        if getattr(self, "dica", None) is not None:  # DICA after standardisation, before everything else
            from gating_core.method.dica import fit_cell_projection

            self.dica_ = fit_cell_projection(cells, [d.train_labels for d in digests], self.dica,
                                             self.dica_components, self.random_state)
            cells = [self._invariant(x) for x in cells]
            embedding_cells = [self._invariant(e) for e in embedding_cells]
        self.reference_quantiles_ = None
        self.reference_landmarks_ = None
        if self.align not in ALIGNMENTS:
            raise ValueError(f"align must be one of {ALIGNMENTS}, got {self.align!r}")
        if self.align == "quantile":
            landmarks = [channel_quantiles(e) for e in embedding_cells]
            self.reference_quantiles_ = np.mean(landmarks, axis=0)
            maps = [QuantileRegistration(q, self.reference_quantiles_) for q in landmarks]
            cells = [m.transform(x) for m, x in zip(maps, cells)]
            embedding_cells = [m.transform(e) for m, e in zip(maps, embedding_cells)]
        if self.align == "landmarks":
            # Each training patient registered as a new one will be: from its content-chosen
            # cells, by the rule that leaves unmatched channels as they are.
            self.reference_landmarks_ = LandmarkReference.fit(embedding_cells)
            maps = [self.reference_landmarks_.registration(e) for e in embedding_cells]
            cells = [m.transform(x) for m, x in zip(maps, cells)]
            embedding_cells = [m.transform(e) for m, e in zip(maps, embedding_cells)]
        return cells, embedding_cells, [d.train_labels for d in digests]

    def _patient_registration(self, chosen):
        """The registration of one patient fitted on its content-chosen standardised cells
        (m, d): a QuantileRegistration, a LandmarkRegistration, or None without ``align``."""
        if getattr(self, "reference_quantiles_", None) is not None:
            return QuantileRegistration(channel_quantiles(chosen), self.reference_quantiles_)
        if getattr(self, "reference_landmarks_", None) is not None:
            return self.reference_landmarks_.registration(chosen)
        return None

    def _fit_scales(self, raw_parts, first):
        """The transform (unless given) and the standardisation, from raw events on channels_."""
        if isinstance(self.transform, ChannelTransform):
            self.transform_ = self.transform
        else:
            pooled, ranges = _transform_evidence(raw_parts, first, self._channel_indices(first))
            self.transform_ = default_transform(self.channels_, pooled, first.keywords, ranges)
            if isinstance(self.transform, dict):  # some channels' transforms set by the user
                self.transform_ = with_overrides(self.transform_, self.channels_, self.channel_markers_,
                                                 self.transform)
            elif self.transform != "auto":
                raise ValueError(f"transform must be 'auto', a ChannelTransform or a dict of channel -> "
                                 f"transform, got {self.transform!r}")
        pooled = np.vstack([self.transform_.apply(r[content_subsample(r, 5000)]) for r in raw_parts])
        self.center_ = pooled.mean(axis=0).astype(np.float32)
        scale = pooled.std(axis=0)
        self.scale_ = np.where(scale > 0, scale, 1.0).astype(np.float32)

    def standardised_cells(self, sample) -> np.ndarray:
        """A sample's events on the model's channels as the classifier sees them: transformed,
        standardised (and registered, with ``align="quantile"`` or ``"landmarks"``): (n, d)."""
        sample = self._compensated(sample)
        indices = self._channel_indices(sample)
        cells = self._standardise(sample.events[:, indices])
        if (getattr(self, "reference_quantiles_", None) is None
                and getattr(self, "reference_landmarks_", None) is None):
            return cells
        return self._registered(cells, self._chosen_cells(sample.events, indices)[0])

    def _compensated(self, sample):
        from gating_core.io.interop import as_sample  # a flowkit.Sample or an AnnData is welcome too

        sample = as_sample(sample)
        if self.compensate and sample.has_spillover and not sample.compensated:
            return sample.compensate()
        return sample

    def _choose_channels(self, samples):
        first = samples[0]
        if self.channels is not None:
            wanted = list(self.channels)
        else:
            wanted = [c.pnn for c in first.channels if not is_time_like(c.pnn)]
        kept, markers = [], []
        for name in wanted:
            index = find_channel(first, name)
            if index is None:
                raise ChannelMismatchError(f"{first.name}: no channel {name!r} (channels: {', '.join(first.pnn)})")
            channel = first.channels[index]
            if self.channels is None:
                if any(find_channel(s, channel.pnn, channel.pns) is None for s in samples[1:]):
                    continue  # not shared by every training patient
                column = first.events[: 100000, index]
                if len(column) and float(np.nanmax(column)) == float(np.nanmin(column)):
                    continue  # constant: carries nothing
            kept.append(channel.pnn)
            markers.append(channel.pns)
        if not kept:
            shown = "; ".join(f"{s.name}: {', '.join(s.pnn)}" for s in samples[:3]) + ("; ..." if len(samples) > 3 else "")
            raise ChannelMismatchError(f"the training patients share no usable channel ({shown})")
        self.channels_, self.channel_markers_ = kept, markers
        for s in samples[1:]:
            self._channel_indices(s)

    def _channel_indices(self, sample) -> list[int]:
        indices, missing = [], []
        for pnn, pns in zip(self.channels_, self.channel_markers_):
            index = find_channel(sample, pnn, pns)
            if index is None:
                missing.append(f"{pnn} ({pns})" if pns and pns != pnn else pnn)
            indices.append(index)
        if missing:
            raise ChannelMismatchError(
                f"{sample.name}: missing channel{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                f"needed by the model (file has: {', '.join(sample.pnn)})")
        return indices

    def _standardise(self, raw: np.ndarray) -> np.ndarray:
        """Raw events (n, d) on the model's channels -> the cells the classifier sees: (n, d),
        or (n, dica_components) when the model has a DICA projection."""
        return self._invariant(self._scaled(raw))

    #: Rows projected at a time by DICA: bounds the (rows, 2L) float64 features in memory, and
    #: fixed so that a chunk's cells get the same bits whichever path gates it.
    DICA_BLOCK = 4096

    def _invariant(self, cells: np.ndarray) -> np.ndarray:
        """Standardised cells (n, d) through the model's DICA projection (``dica``): (n, m)
        float32; unchanged without one."""
        dica = getattr(self, "dica_", None)
        if dica is None:
            return cells
        return dica.transform(cells, chunk_size=self.DICA_BLOCK).astype(np.float32)

    def _scaled(self, raw: np.ndarray) -> np.ndarray:
        """Transformed and standardised events (n, d), before any DICA projection."""
        out = self.transform_.apply(raw)
        out -= self.center_
        out /= self.scale_
        np.clip(out, -STANDARDISED_BOUND, STANDARDISED_BOUND, out=out)
        return out


#: Events per training patient (of those its embedding is computed from) the default transform
#: is decided on.
TRANSFORM_CELLS = 20_000


def _transform_evidence(raw_parts, first, indices) -> tuple:
    """What the default transform is decided on: the first TRANSFORM_CELLS events of each
    patient's ``raw_parts`` (n_i, d) pooled, and the ranges of the first patient's channels at
    ``indices``."""
    pooled = np.vstack([r[:TRANSFORM_CELLS] for r in raw_parts])
    return pooled, [first.channels[i].range for i in indices]


def found_transform(samples, channels, compensate: bool = True, embedding_cells: int = 20000) -> tuple:
    """What training on ``samples`` with ``transform="auto"`` would use for ``channels`` (names,
    $PnN) and why: (:class:`ChannelTransform`, {channel: reason}), for showing the choice
    before training. Decided as GatingModel decides it: on each sample's ``embedding_cells``
    events chosen by content (compensated when it carries a spillover matrix and
    ``compensate``), with the first sample's keywords and ranges."""
    from gating_core.fcs.transforms import default_transform_reasons
    from gating_core.io.interop import as_sample
    from gating_core.model.digest import embedding_rows

    samples = [as_sample(s) for s in samples]
    if not samples or not channels:
        raise ValueError("found_transform needs samples and channels")
    parts, first_indices = [], None
    for sample in samples:
        if compensate and sample.has_spillover and not sample.compensated:
            sample = sample.compensate()
        indices = [find_channel(sample, name) for name in channels]
        missing = [name for name, i in zip(channels, indices) if i is None]
        if missing:
            raise ChannelMismatchError(f"{sample.name}: no channel {', '.join(missing)}")
        first_indices = first_indices or indices
        parts.append(sample.events[embedding_rows(sample, embedding_cells)][:, indices])
    pooled, ranges = _transform_evidence(parts, samples[0], first_indices)
    keywords = samples[0].keywords
    return (default_transform(list(channels), pooled, keywords, ranges),
            default_transform_reasons(list(channels), pooled, keywords, ranges))


#: Events at the start of a patient's file on which a channel must hold one value to be checked
#: on every event (:func:`constant_channels`).
CONSTANT_HEAD_EVENTS = 4096
#: Relative tolerance on values recorded through a compensation taken back out (float32 rounding
#: of the compensated values, a few 1e-7 of the terms summed).
RECORDED_TOLERANCE = 1e-5


def recorded_values(sample, events, columns) -> tuple[np.ndarray, np.ndarray]:
    """The values of channels ``columns`` (indices into the sample's channels) of ``events``
    (m, all channels) as the instrument recorded them, float64 (m, c): a compensated sample's
    spillover channels with the spillover matrix taken back out (events @ S), the others as they
    are. With each column's rounding scale (c,): the largest sum of magnitudes the
    uncompensation adds up (0 for a column read as it is, which is exact)."""
    events = np.asarray(events)
    values = events[:, columns].astype(np.float64)
    scale = np.zeros(len(columns))
    if sample.spillover is None or not sample.compensated or len(events) == 0:
        return values, scale
    spill = [sample.channel_index(n) for n in sample.spillover_channels]
    taken = [j for j, column in enumerate(columns) if column in spill]
    if not taken:
        return values, scale
    compensated = events[:, spill].astype(np.float64)  # once for every column taken back out
    weights = np.asarray(sample.spillover, dtype=np.float64)[:, [spill.index(columns[j]) for j in taken]]
    values[:, taken] = compensated @ weights
    scale[taken] = np.max(np.abs(compensated) @ np.abs(weights), axis=0)
    return values, scale


def constant_channels(sample, chunks, indices, head) -> dict[str, float]:
    """The model channels that hold one value on every event of a patient, as the instrument
    recorded them (a compensated file's detectors before compensation): {$PnN: value}.

    ``head``: the patient's first events (up to :data:`CONSTANT_HEAD_EVENTS`, all channels);
    only the channels of one value there (two events or more) are checked on every event of
    ``chunks`` (an iterable of event arrays in file order; ``[events]`` for a whole file), so a
    patient without one costs nothing. A detector switched off, a channel the instrument did not
    record, a file of zeros: the gates that use such a channel are guesses."""
    head = np.asarray(head)
    if len(head) < 2:
        return {}
    values, scale = recorded_values(sample, head, list(indices))
    one = values.max(axis=0) - values.min(axis=0) <= RECORDED_TOLERANCE * scale
    candidates = [c for c, flat in zip(indices, one) if flat]
    if not candidates:
        return {}
    first = recorded_values(sample, head[:1], candidates)[0][0]
    low, high, bound = first.copy(), first.copy(), np.zeros(len(candidates))
    for events in chunks:
        values, scale = recorded_values(sample, events, candidates)
        if len(values):
            low, high = np.minimum(low, values.min(axis=0)), np.maximum(high, values.max(axis=0))
            bound = np.maximum(bound, scale)
    flat = high - low <= RECORDED_TOLERANCE * bound
    return {sample.pnn[c]: float(first[j]) for j, c in enumerate(candidates) if flat[j]}


def refuse_unmeasured(name: str, constant: dict, n_channels: int, n_events: int) -> None:
    """Raise ValueError when every one of the model's ``n_channels`` channels holds one value
    on all of a patient's ``n_events`` (two or more) events: nothing was measured to gate."""
    if n_events >= 2 and n_channels and len(constant) == n_channels:
        values = ", ".join(f"{c} {v:g}" for c, v in constant.items())
        raise ValueError(f"{name}: all {n_events} events hold the same values on every channel the model "
                         f"uses ({values}): nothing was measured to gate")
