"""Shift augmentation: copies of the training patients under simulated instrument shifts.

:func:`shift_spread` measures how much groups of patients (centers, batches, runs) differ per
channel; :func:`augment_patients` adds shifted copies of every patient (a random gain and
offset per channel, the same for its training and its embedding cells) with the source's
labels, so that the model learns how a center's shift moves both the cells and the embedding.
"""

from __future__ import annotations

import numpy as np

MAX_SHIFT_SD, MAX_GAIN_SD = 0.5, 0.3


def shift_spread(embedding_cells, groups=None):
    """How much groups of patients differ, per channel: (log-gain sd (d,), offset sd (d,)).

    Per patient and channel, the median and the log inter-quartile range of its cells; averaged
    within each group (center, batch, run; every patient its own group when ``groups`` is None)
    so that replicates count once; then the standard deviation across groups. Capped at
    ``MAX_GAIN_SD`` / ``MAX_SHIFT_SD`` (standardised units): beyond that a shift is not an
    instrument effect but a different panel.
    """
    medians = np.array([np.median(e, axis=0) for e in embedding_cells])
    q25, q75 = zip(*[np.percentile(e, [25, 75], axis=0) for e in embedding_cells])
    log_iqr = np.log(np.maximum(np.array(q75) - np.array(q25), 1e-3))
    labels = list(range(len(medians))) if groups is None else list(groups)
    names = sorted(set(labels), key=labels.index)
    if len(names) < 2:
        return np.zeros(medians.shape[1]), np.zeros(medians.shape[1])
    by_group = lambda values: np.array([values[[i for i, g in enumerate(labels) if g == n]].mean(axis=0) for n in names])
    gain = np.std(by_group(log_iqr), axis=0, ddof=1)
    shift = np.std(by_group(medians), axis=0, ddof=1)
    return np.minimum(gain, MAX_GAIN_SD), np.minimum(shift, MAX_SHIFT_SD)


def augment_patients(cells, labels, embedding_cells, n_copies, gain_sd, shift_sd, random_state=0,
                     shift_embedding_cells=True):
    """Add ``n_copies`` shifted copies of every patient, as further patients.

    Each copy multiplies each channel by exp(N(0, gain_sd^2)) and adds N(0, shift_sd^2)
    (``gain_sd``, ``shift_sd``: scalars or per-channel arrays), the same draw for its training
    cells and its embedding cells, and keeps the source's labels: an instrument or staining
    shift moves the cells and the expert's gates together. ``shift_embedding_cells=False``
    (a model without the embedding) gives each copy its source's embedding cells, unshifted
    and not copied; the draws, hence the copies' training cells, are the same.

    Returns the lists extended (real patients first, then copies in source order) and the
    source index of every entry.
    """
    rng = np.random.default_rng(random_state)
    d = cells[0].shape[1]
    out_x, out_y, out_e = list(cells), None if labels is None else list(labels), list(embedding_cells)
    source = list(range(len(cells)))
    for i in range(len(cells)):
        for _ in range(n_copies):
            gain = np.exp(rng.normal(0.0, 1.0, d) * gain_sd).astype(np.float32)
            shift = (rng.normal(0.0, 1.0, d) * shift_sd).astype(np.float32)
            out_x.append(cells[i] * gain + shift)
            out_e.append(np.asarray(embedding_cells[i], dtype=np.float32) * gain + shift if shift_embedding_cells
                         else embedding_cells[i])
            if out_y is not None:
                out_y.append(labels[i])
            source.append(i)
    return out_x, out_y, out_e, np.asarray(source)
