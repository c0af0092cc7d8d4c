"""Features on landmarks (the Nystroem solver; with every training cell a landmark, the exact
kernel machine), and :func:`cell_features`: one patient's cell features under any feature map.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh

from gating_core.cpus import one_blas_thread
from gating_core.method.features import ExactKernel

def cell_features(feature_map, x, embedding, use_embedding=True, out=None) -> np.ndarray:
    """phi(P, x) of cells ``x`` (n, d) of one patient with embedding Psi(P): (n, D) float32.

    ``feature_map``: a :class:`~gating_core.method.features.ProductRFF` or a :class:`LandmarkFeatures`;
    ``use_embedding=False`` ignores the embedding (k_P = 1).
    """
    # One BLAS thread: OpenBLAS computes a small product (a patient of 2,000 cells times d x D)
    # differently on one thread and on two (1e-6 apart), and training sizes BLAS from the load
    # average; a product with d inner terms gains nothing from threads beside the cosine.
    with one_blas_thread():
        if isinstance(feature_map, LandmarkFeatures):
            return feature_map.transform(x, embedding)
        return feature_map.transform(x, feature_map.patient_phase(embedding if use_embedding else None), out=out)


class LandmarkFeatures:
    """Features K((Psi, x), Z) K_ZZ^{-1/2} on landmark (embedding, cell) pairs Z.

    They reproduce the kernel on the landmarks' span: the Nystroem solver, or, with every
    training cell a landmark, the exact kernel machine.

    Parameters
    ----------
    cells : ndarray of shape (m, d);  embeddings : ndarray of shape (m, 2L)
        The landmarks: cells and the embedding of the patient each comes from.
    projection : ndarray of shape (m, D')
    bandwidth_x, bandwidth_p : float (bandwidth_p None: k_P = 1)
    """

    def __init__(self, cells, embeddings, projection, bandwidth_x, bandwidth_p):
        self.cells, self.embeddings, self.projection = cells, embeddings, projection
        self.bandwidth_x, self.bandwidth_p = bandwidth_x, bandwidth_p

    @classmethod
    def from_training(cls, cells, embeddings, bandwidth_x, bandwidth_p, max_landmarks=None, random_state=0):
        """Landmarks from per-patient training cells (list of (m_i, d)) and their patients'
        embeddings (rows of ``embeddings``): all cells, or a seeded draw of ``max_landmarks``."""
        rng = np.random.default_rng(random_state)
        owners = np.concatenate([np.full(len(x), i) for i, x in enumerate(cells)])
        stacked = np.vstack(cells)
        if max_landmarks is not None and len(stacked) > max_landmarks:
            keep = np.sort(rng.choice(len(stacked), max_landmarks, replace=False))
            stacked, owners = stacked[keep], owners[keep]
        landmark_cells = stacked.astype(np.float64)
        landmark_embeddings = embeddings[owners]
        kernel = ExactKernel(bandwidth_x, bandwidth_p)
        gram = kernel(landmark_embeddings, landmark_cells, landmark_embeddings, landmark_cells)
        values, vectors = eigh(gram, driver="evd")
        keep = values > values.max() * 1e-12
        return cls(landmark_cells, landmark_embeddings, vectors[:, keep] / np.sqrt(values[keep]),
                   bandwidth_x, bandwidth_p)

    def transform(self, x, embedding) -> np.ndarray:
        """Features of cells ``x`` (n, d) of one patient with embedding (2L,): (n, D') float32."""
        kernel = ExactKernel(self.bandwidth_x, self.bandwidth_p)
        psi = np.broadcast_to(embedding, (len(x), len(embedding)))
        gram = kernel(psi, x, self.embeddings, self.cells)
        return (gram @ self.projection).astype(np.float32)
