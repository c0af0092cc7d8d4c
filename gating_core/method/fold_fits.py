"""Ridge fits shared by the runs and folds of a hyperparameter search.

:class:`SharedFolds` fits one feature set on training sets named by the patients they leave
out, each once, and scores each held-out patient under each fit once: in the held-out check's
nested selections, the inner fold of the run without patient k that holds out patient j trains
on what the run without j trains on when it holds out k.
"""

from __future__ import annotations

import numpy as np

from gating_core.method.ridge import RidgeStatistics


class SharedFolds:
    """Ridge fits of one feature set on training sets named by the patients they leave out,
    and the held-out accuracy of each patient under each fit, each computed once.

    A training set's fit depends only on the patients it leaves out (its rows are every row
    whose patient is not left out, in order), so every run and fold that trains on it reads
    the same numbers. Coefficients are dropped once the starting grid is scored, and so are
    the decompositions (D x D each) unless ``keep_rotations``: a lambda beyond the grid, rarely
    asked, then decomposes again, to the same result.
    Safe to fill from several threads: a value computed twice is the same value.
    """

    def __init__(self, features, stats, problem, keep_rotations=True):
        self.features, self.stats, self.problem = features, stats, problem
        self.keep_rotations = keep_rotations
        self.rotations, self.coefs, self.accuracies = {}, {}, {}
        self.n_decompositions = 0  # how many eigendecompositions were computed (for tests)

    def rotation(self, held):
        """``stats.eigen`` of every row whose patient is not in ``held`` (a frozenset)."""
        if held not in self.rotations:
            source = self.problem.source
            self.rotations[held] = self.stats.eigen([r for r in range(self.problem.n_rows)
                                                     if int(source[r]) not in held])
            self.n_decompositions += 1
        return self.rotations[held]

    def prepare(self, held, patients, alphas):
        """Decompose the training set without ``held`` and score ``patients`` at ``alphas``;
        keep the scores (and the decomposition if ``keep_rotations``)."""
        for alpha in alphas:
            for i in patients:
                self.accuracy(held, i, alpha)
            self.coefs.pop((held, alpha), None)
        if not self.keep_rotations:
            self.rotations.pop(held, None)

    def coefficients(self, held, alpha):
        """(coef (D, k) float32, intercept (k,) float32) of the fit without ``held`` at ``alpha``."""
        key = (held, alpha)
        if key not in self.coefs:
            coef, intercept = RidgeStatistics.solve(self.rotation(held), alpha)
            self.coefs[key] = (coef.astype(np.float32), intercept.astype(np.float32))
        return self.coefs[key]

    def accuracy(self, held, patient, alpha):
        """Accuracy on real patient ``patient`` of the fit without ``held`` at ``alpha``, scored
        with the intercept, s = F coef + intercept, as the fitted model scores it."""
        key = (held, patient, alpha)
        if key not in self.accuracies:
            coef, intercept = self.coefficients(held, alpha)
            scores = self.features[patient] @ coef + intercept
            self.accuracies[key] = np.mean(np.argmax(scores, axis=1) == self.problem.targets[patient])
        return self.accuracies[key]
