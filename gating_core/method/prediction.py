"""Prediction by a fitted marginal-transfer classifier: each patient's cells scored with its
embedding, block by block.

:class:`ClassifierPrediction` is mixed into
:class:`~gating_core.method.classifier.MarginalTransferClassifier`: the embedding of a patient,
its cells' features, the ridge scores (random features in cache-sized blocks on threads, the
linear kernel as one matrix per patient, landmarks chunk by chunk), and ``decision_function`` /
``predict_proba`` / ``predict`` of the array and list forms (``groups`` giving each cell's
patient). :func:`patient_rows` splits cells by patient as fitting and prediction both do.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils.validation import check_is_fitted

try:
    from sklearn.utils.validation import validate_data
except ImportError:  # scikit-learn < 1.6: the same check was a private method of the estimator
    def validate_data(estimator, X, y="no_validation", **kwargs):
        return estimator._validate_data(X, y, **kwargs)

from gating_core.cpus import one_blas_thread, score_threads
from gating_core.method.features import LinearProductFeatures
from gating_core.method.landmarks import LandmarkFeatures, cell_features
from gating_core.method.patient_embeddings import embed_cells

SCORE_BLOCK = 2048


class ClassifierPrediction:
    """The prediction half of :class:`~gating_core.method.classifier.MarginalTransferClassifier`
    (a mixin: it reads the fitted attributes the classifier's fit sets)."""

    def embed(self, x) -> np.ndarray:
        """Psi of one patient's cells ``x`` (n, d): ndarray of shape (2L,)."""
        check_is_fitted(self)
        return embed_cells(self.embedder_, x, self.embedding_cells)

    def _features(self, x, embedding, out=None):
        if self.solver == "rff":
            return cell_features(self.feature_map_, x, embedding, self.use_embedding, out=out)
        landmarks = LandmarkFeatures(self.landmark_cells_, self.landmark_embeddings_, self.landmark_projection_,
                                     self.bandwidth_x_, self.bandwidth_p_)
        return landmarks.transform(x, embedding)

    def ridge_scores(self, X, embedding=None, chunk_size=50_000, *, groups=None):
        """Uncalibrated ridge scores of cells: (n_cells, n_classes) float32.

        Parameters
        ----------
        X : ndarray of shape (n_cells, d)
        embedding : ndarray of shape (2L,) or None
            The embedding of the patient ALL of ``X`` belongs to, when the caller has it (as
            :class:`~gating_core.model.estimator.GatingModel`, which scores a patient chunk by chunk);
            ``X`` is then only shape-checked. None: computed from ``X`` (or from each patient
            of ``groups``).
        chunk_size : int
            Cells featurised at once on the Nystroem / exact path (bounds memory).
        groups : array-like of shape (n_cells,) or None
            The patient of each cell; each patient's cells are scored with that patient's
            embedding. None: all of ``X`` is one patient.
        """
        return self._scores(X, embedding, chunk_size, groups, calibrated=False)

    def _scores(self, X, embedding, chunk_size, groups, calibrated, softmax=False):
        check_is_fitted(self)
        if embedding is not None:
            if groups is not None:
                raise ValueError("embedding= is one patient's: give groups= or embedding=, not both")
            return self._patient_scores(self._check_cells(X), embedding, chunk_size, calibrated, softmax=softmax)
        # float64 and float32 cells are scored as they are (no rounding the caller did not ask for).
        X = validate_data(self, X, reset=False, dtype=(np.float64, np.float32))
        rows = patient_rows(groups, len(X))
        if len(rows) == 1:
            return self._patient_scores(X, self.embed(X), chunk_size, calibrated, softmax=softmax)
        scores = np.empty((len(X), len(self.classes_)), dtype=np.float32)
        for r in rows:
            x = X[r]
            scores[r] = self._patient_scores(x, self.embed(x), chunk_size, calibrated, softmax=softmax)
        return scores

    def _patient_scores(self, x, embedding, chunk_size, calibrated, extra=None, softmax=False):
        """Ridge scores of the cells ``x`` of ONE patient with embedding ``embedding``, times
        the temperature when ``calibrated``: (n, n_classes) float32; their softmax (the
        probabilities) when ``softmax``. With ``extra`` (D, k2): also phi(P, x) @ extra, (n, k2)
        float32, returned after the scores."""
        k = len(self.classes_)
        width = k + (0 if extra is None else extra.shape[1])
        out = np.empty((len(x), width), dtype=np.float32)
        scores = out[:, :k] if extra is not None else out
        if isinstance(getattr(self, "feature_map_", None), LinearProductFeatures):
            self._linear_scores(x, embedding, scores)
        elif self.solver == "rff":
            # The features of every block projected on the coefficients and on ``extra`` at once,
            # and the block's scores finished (intercept, temperature, softmax) while in cache.
            self._rff_scores(x, embedding, out, extra, finish=(calibrated, softmax))
            return scores if extra is None else (scores, out[:, k:])
        else:
            for start in range(0, len(x), chunk_size):
                chunk = x[start:start + chunk_size]
                np.matmul(self._features(chunk, embedding), self.coef_, out=scores[start:start + len(chunk)])
        if extra is not None:
            with one_blas_thread():
                for lo in range(0, len(x), SCORE_BLOCK):
                    np.matmul(self._features(x[lo:lo + SCORE_BLOCK], embedding), extra, out=out[lo:lo + SCORE_BLOCK, k:])
        self._finish_scores(scores, calibrated, softmax)
        return scores if extra is None else (scores, out[:, k:])

    def _finish_scores(self, scores, calibrated, softmax):
        """In place: + intercept, x temperature when ``calibrated``, softmax when ``softmax``.
        Row by row, so a block of rows comes out as it would inside the whole array."""
        scores += self.intercept_
        if calibrated:
            scores *= np.float32(self.temperature_)
        if softmax:
            _softmax(scores)

    def _linear_scores(self, x, embedding, scores):
        """scores = [x, 1] M(P) for the linear cell kernel: one (d + 1, k) matrix per patient
        (:meth:`LinearProductFeatures.patient_coefficients`), no per-cell features."""
        fm = self.feature_map_
        m = fm.patient_coefficients(fm.patient_phase(embedding if self.use_embedding else None), self.coef_)
        for start in range(0, len(x), 1 << 16):
            block = np.asarray(x[start:start + (1 << 16)], dtype=np.float32)
            np.matmul(block, m[:-1], out=scores[start:start + len(block)])
            scores[start:start + len(block)] += m[-1]

    def _rff_scores(self, x, embedding, scores, extra=None, finish=None):
        """scores = cos(x B / sigma_X + phase) (sqrt(2/D) coef), block by block; with ``extra``
        (D, k2), ``scores`` (n, k + k2) gets the features' projection on it in its last columns.
        ``finish`` = (calibrated, softmax): each block's class scores then get
        :meth:`_finish_scores` in its thread (on 1,000,000 cells the whole-array passes on the
        calling thread had taken about 0.1 s of a 1.7 s gating step).

        Blocks of SCORE_BLOCK cells keep the (block, D) feature matrix inside the CPU cache, so
        the matmul, cosine and projection run at compute speed rather than memory speed; blocks
        are spread over threads (numpy releases the GIL) with BLAS itself single-threaded, which
        beats BLAS's own threading on such skinny products. The phase and the feature scale are
        folded into the weights so that no extra pass over the features is needed.
        """
        from concurrent.futures import ThreadPoolExecutor

        fm = self.feature_map_
        phase = fm.patient_phase(embedding if self.use_embedding else None)
        weights = np.vstack([fm.cell_weights_, phase[None, :]]).astype(np.float32)
        projection = self.coef_ if extra is None else np.hstack([self.coef_, extra])
        projection = (projection * fm.scale_).astype(np.float32)
        d, k = x.shape[1], self.coef_.shape[1]

        def run(bounds):
            lo, hi = bounds
            block = np.empty((hi - lo, d + 1), dtype=np.float32)
            block[:, :d] = x[lo:hi]
            block[:, d] = 1.0
            features = block @ weights
            np.cos(features, out=features)
            np.matmul(features, projection, out=scores[lo:hi])
            if finish is not None:
                self._finish_scores(scores[lo:hi, :k], *finish)

        bounds = [(lo, min(lo + SCORE_BLOCK, len(x))) for lo in range(0, len(x), SCORE_BLOCK)]
        threads = max(1, min(score_threads(), len(bounds)))
        with one_blas_thread():
            if threads == 1:
                for b in bounds:
                    run(b)
            else:
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(run, bounds))

    def decision_function(self, X, embedding=None, chunk_size=50_000, *, groups=None):
        """Calibrated class scores.

        Returns
        -------
        ndarray of shape (n_cells, n_classes): log-probabilities up to a per-cell constant;
        with two classes, shape (n_cells,): the log-odds of ``classes_[1]`` (scikit-learn's
        convention; positive means ``classes_[1]``). Arguments as in :meth:`ridge_scores`.
        """
        scores = self._scores(X, embedding, chunk_size, groups, calibrated=True)
        if scores.shape[1] == 2:
            return scores[:, 1] - scores[:, 0]
        return scores

    def predict_proba(self, X, embedding=None, chunk_size=50_000, *, groups=None):
        """Probability of each class (columns in ``classes_`` order): (n_cells, n_classes).

        Arguments as in :meth:`ridge_scores`: ``groups`` gives each cell's patient (None: one
        patient), or ``embedding`` the embedding of the one patient ``X`` belongs to.
        """
        return self._scores(X, embedding, chunk_size, groups, calibrated=True, softmax=True)

    def predict_proba_and_project(self, X, embedding, extra):
        """Probabilities of one patient's cells ``X`` (n, d) with embedding Psi (2L,), and their
        features projected on ``extra`` (D, k2): phi(P, x) @ extra, (n, k2) float32, from the
        same features where the solver allows (random features: one set serves both)."""
        check_is_fitted(self)
        return self._patient_scores(self._check_cells(X), embedding, 50_000, True, np.asarray(extra, dtype=np.float32),
                                    softmax=True)

    def predict(self, X, embedding=None, chunk_size=50_000, *, groups=None):
        """Class of each cell: (n_cells,). Arguments as in :meth:`ridge_scores`."""
        scores = self._scores(X, embedding, chunk_size, groups, calibrated=True)
        return self.classes_[np.argmax(scores, axis=1)]

    def _check_cells(self, x):
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.n_features_in_:
            raise ValueError(f"expected cells with {self.n_features_in_} channels, got shape {x.shape}")
        return x


def _softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax of class scores, in place; returns them."""
    # The row maxima column by column: numpy's max along a short last axis loops per row, and
    # was the larger part of scoring's softmax (the same values: a maximum is exact).
    top = scores[:, 0].copy()
    for column in range(1, scores.shape[1]):
        np.maximum(top, scores[:, column], out=top)
    scores -= top[:, None]
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=1, keepdims=True)
    return scores


def patient_rows(groups, n_cells: int) -> list:
    """Row indices of each patient of ``groups`` (the patient of each of ``n_cells`` cells).

    Patients in order of their first cell, each patient's rows in increasing order, so that
    stacking per-patient arrays and splitting them again gives back the same arrays in the same
    order. ``groups=None``: one patient holding every row.
    """
    if groups is None:
        return [np.arange(n_cells)]
    groups = np.asarray(groups)
    if groups.shape != (n_cells,):
        raise ValueError(f"groups has shape {groups.shape}; expected the patient of each cell ({n_cells},)")
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.intp)
    rank[np.argsort(first)] = np.arange(len(first))
    codes = rank[inverse.ravel()]
    ordered = np.argsort(codes, kind="stable")
    return np.split(ordered, np.cumsum(np.bincount(codes, minlength=len(first)))[:-1])
