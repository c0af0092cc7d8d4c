""":func:`ellipse_task`, the synthetic domain-generalisation task of Blanchard et al.
(JMLR 2021, Algorithm 1).
"""

from __future__ import annotations

import numpy as np

from gating_core.synthetic.panel import _as_rng


DENSITIES = ("area", "chord")


def ellipse_task(n_tasks: int, n_points: int, rng_or_seed=None, *, semi_major: float = 1.0,
                 semi_minor: float = 0.2, angle_range=(np.pi / 4, 3 * np.pi / 4),
                 return_angles: bool = False, density: str = "area"):
    """The synthetic domain-generalisation task of Blanchard et al. (JMLR 2021, Algorithm 1).

    Each task draws an angle uniformly in ``angle_range``; its points are uniform over a filled
    ellipse centred at the origin (semi-axes ``semi_major`` and ``semi_minor``, as in the
    authors' reference code) whose major axis is rotated by that angle. The label is the side
    of the major axis: 1 on the side its normal (-sin a, cos a) points to, else 0. As in the
    reference code, half the points (rounded down) of each task have label 1.

    ``density``: "area" draws the points uniformly over the ellipse's area; "chord" as the
    authors' generator does (``getTaskData.m``): the coordinate along the major axis uniform
    in [-1, 1], then the other uniform over the chord at that coordinate -- more points towards
    the tips, where the axis's direction shows most.

    Returns
    -------
    Xs : list of n_tasks arrays of shape (n_points, 2)
    ys : list of n_tasks int arrays of shape (n_points,)
    angles : ndarray of shape (n_tasks,), only when ``return_angles``
    """
    if n_tasks < 1 or n_points < 2:
        raise ValueError("need at least one task and two points per task")
    if density not in DENSITIES:
        raise ValueError(f"density must be one of {DENSITIES}, got {density!r}")
    half = _uniform_half_ellipse if density == "area" else _chord_half_ellipse
    rng = _as_rng(rng_or_seed)
    angles = rng.uniform(angle_range[0], angle_range[1], size=n_tasks)
    Xs, ys = [], []
    for angle in angles:
        n_pos = n_points // 2
        upper = half(rng, n_pos, semi_major, semi_minor)
        lower = half(rng, n_points - n_pos, semi_major, semi_minor)
        lower[:, 1] *= -1
        points = np.vstack([upper, lower])
        labels = np.concatenate([np.ones(n_pos, dtype=int), np.zeros(n_points - n_pos, dtype=int)])
        order = rng.permutation(n_points)
        c, s = np.cos(angle), np.sin(angle)
        rotation = np.array([[c, -s], [s, c]])
        Xs.append(points[order] @ rotation.T)
        ys.append(labels[order])
    if return_angles:
        return Xs, ys, angles
    return Xs, ys


def _uniform_half_ellipse(rng: np.random.Generator, n: int, a: float, b: float) -> np.ndarray:
    """``n`` points uniform over the upper half (y >= 0) of the ellipse x^2/a^2 + y^2/b^2 <= 1."""
    out = np.empty((0, 2))
    while out.shape[0] < n:
        # Rejection from the bounding box keeps the density exactly uniform in area.
        candidates = rng.uniform([-1.0, 0.0], [1.0, 1.0], size=(2 * (n - out.shape[0]) + 8, 2))
        inside = candidates[(candidates ** 2).sum(axis=1) <= 1.0]
        out = np.vstack([out, inside])
    return out[:n] * np.array([a, b])


def _chord_half_ellipse(rng: np.random.Generator, n: int, a: float, b: float) -> np.ndarray:
    """``n`` points of the upper half of the ellipse drawn as the authors' generator draws them:
    u uniform in [-1, 1], v uniform in [0, sqrt(1 - u^2)], then scaled by (a, b)."""
    u = rng.uniform(-1.0, 1.0, n)
    v = rng.uniform(0.0, 1.0, n) * np.sqrt(1.0 - u ** 2)
    return np.column_stack([u * a, v * b])
