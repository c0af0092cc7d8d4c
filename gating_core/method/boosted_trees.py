"""Gradient-boosted trees on the training cells pooled, held as plain arrays.

The trees are scikit-learn's ``HistGradientBoostingClassifier`` with its defaults, fitted on every
training patient's standardised cells; what gating needs of them (each node's channel,
threshold, children and leaf value, and the baseline score) is copied into flat arrays, so that
the model file stores numbers, never a pickled estimator, and gating scores the trees in numpy.
:class:`PooledTrees` checks on fitting that its scores are scikit-learn's.
"""

from __future__ import annotations

import numpy as np

#: Cells scored at once: the scoring holds (cells, trees) arrays.
SCORE_CHUNK = 8192
#: Trees whose exit leaves are found together (the size of one block's tables).
TREE_BLOCK = 64
#: Leaves a tree may have: one bit each (scikit-learn's trees have 31 by default).
MAX_LEAVES = 64
ALL_LEAVES = np.uint64(2**64 - 1)
#: Splits from a root to a leaf a tree may have (a tree of MAX_LEAVES leaves has fewer).
MAX_DEPTH = MAX_LEAVES
#: Trees and nodes a model may hold: scikit-learn's default boosts at most 100 iterations, a
#: tree of at most 61 nodes per population each (50 populations: 5,000 trees, 305,000 nodes).
#: The scoring tables take about 512 bytes per split node, so these bound a model file's memory.
MAX_TREES = 20_000
MAX_NODES = 400_000
#: How far the probabilities may be from scikit-learn's own on the training cells
#: (float64 sums in another order).
SCORE_TOLERANCE = 1e-6


class PooledTrees:
    """Gradient-boosted trees over cells pooled from every training patient.

    Fitted attributes
    -----------------
    classes_ : ndarray (k,) of str  the populations, in the order of :meth:`proba`'s columns
    feature_, threshold_ : ndarray (n_nodes,)  each node's channel and split (a cell goes left
        when its value is at most the threshold); a leaf's are 0
    left_, right_ : ndarray (n_nodes,) of int32  each node's children (a leaf points to itself)
    value_ : ndarray (n_nodes,)  each leaf's score (0 elsewhere)
    roots_ : ndarray (n_iterations, n_scores) of int32  each tree's first node; one score per
        population, or one for two populations (the second's log-odds)
    baseline_ : ndarray (n_scores,)  the score before any tree
    columns_ : ndarray (n_populations_scored,) of int  the column of ``classes_`` each score is
        for (the populations the training cells had)
    """

    def __init__(self, random_state=0):
        self.random_state = random_state

    def fit(self, cells, labels, classes=None):
        """Fit on ``cells`` (list of (m_i, d) or (n, d)) and their ``labels`` (per event, the same
        layout). ``classes``: the populations the columns are (every label must be one; a
        population no cell has gets no probability)."""
        from sklearn.ensemble import HistGradientBoostingClassifier
        from threadpoolctl import threadpool_limits

        from gating_core.cpus import idle_cpus

        x = np.vstack(cells) if isinstance(cells, (list, tuple)) else np.asarray(cells)
        y = np.concatenate(labels) if isinstance(labels, (list, tuple)) else np.asarray(labels)
        y = y.astype(str)
        classes = np.unique(y) if classes is None else np.asarray(classes).astype(str)
        if not np.isin(y, classes).all():
            raise ValueError("a label is none of the given populations")
        # scikit-learn holds out a stratified tenth of the cells to stop boosting, which needs two
        # cells of every population; trees cannot learn a population from one cell either, so
        # such a population is left to the model's other parts.
        if not self.can_fit(y):
            raise ValueError("the trees need two populations of at least two training cells each")
        names, counts = np.unique(y, return_counts=True)
        kept = np.isin(y, names[counts >= 2])
        x, y = x[kept], y[kept]
        # OpenMP threads that spin while the CPUs serve other work stall the fit many times
        # over: the trees take the CPUs that are free, as BLAS does (gating_core.cpus).
        with threadpool_limits(limits=idle_cpus(), user_api="openmp"):
            estimator = HistGradientBoostingClassifier(random_state=self.random_state).fit(x, y)
        self._copy(estimator, classes)
        check = x[np.linspace(0, len(x) - 1, min(len(x), 2000)).astype(np.int64)]
        expected = np.zeros((len(check), len(classes)))
        expected[:, self.columns_] = estimator.predict_proba(check)
        if not np.allclose(self.proba(check), expected, atol=SCORE_TOLERANCE):
            raise RuntimeError("this scikit-learn's boosted trees are laid out otherwise than gating reads them")
        return self

    @staticmethod
    def can_fit(labels) -> bool:
        """Whether trees can be fitted on cells of these ``labels`` (per event, or a list of per-patient
        arrays): two populations of at least two cells each."""
        y = np.concatenate(labels) if isinstance(labels, (list, tuple)) else np.asarray(labels)
        if not len(y):
            return False
        counts = np.unique(y.astype(str), return_counts=True)[1]
        return int(np.sum(counts >= 2)) >= 2

    def _copy(self, estimator, classes) -> None:
        """The fitted trees' arrays, each tree's node indices shifted into one array."""
        fields = {"feature_idx": [], "num_threshold": [], "left": [], "right": [], "value": [], "is_leaf": []}
        roots, offset = [], 0
        for iteration in estimator._predictors:
            row = []
            for tree in iteration:
                nodes = tree.nodes
                row.append(offset)
                for name in fields:
                    fields[name].append(np.asarray(nodes[name]))
                fields["left"][-1] = fields["left"][-1].astype(np.int64) + offset
                fields["right"][-1] = fields["right"][-1].astype(np.int64) + offset
                offset += len(nodes)
            roots.append(row)
        leaf = np.concatenate(fields["is_leaf"]).astype(bool)
        index = np.arange(offset)
        self.feature_ = np.where(leaf, 0, np.concatenate(fields["feature_idx"])).astype(np.int32)
        self.threshold_ = np.where(leaf, 0.0, np.concatenate(fields["num_threshold"])).astype(np.float64)
        self.left_ = np.where(leaf, index, np.concatenate(fields["left"])).astype(np.int32)
        self.right_ = np.where(leaf, index, np.concatenate(fields["right"])).astype(np.int32)
        self.value_ = np.where(leaf, np.concatenate(fields["value"]), 0.0).astype(np.float64)
        self.roots_ = np.asarray(roots, dtype=np.int32).reshape(len(roots), -1)
        self.baseline_ = np.asarray(estimator._baseline_prediction, dtype=np.float64).ravel()
        self.classes_ = np.asarray(classes).astype(str)
        # The trees score the populations the training cells had; the others get no probability.
        position = {c: j for j, c in enumerate(self.classes_)}
        self.columns_ = np.array([position[c] for c in np.asarray(estimator.classes_).astype(str)], dtype=np.int64)
        self.check()
        self._exit_tables()

    @classmethod
    def from_arrays(cls, classes, columns, feature, threshold, left, right, value, roots, baseline, n_channels):
        """Trees read back from a model file (:meth:`check` raises ValueError on arrays that do
        not make trees)."""
        trees = cls()
        trees.classes_ = np.asarray(classes).astype(str)
        trees.columns_ = _indices(columns, np.int64)
        trees.feature_ = _indices(feature, np.int32)
        trees.threshold_ = np.asarray(threshold, dtype=np.float64)
        trees.left_ = _indices(left, np.int32)
        trees.right_ = _indices(right, np.int32)
        trees.value_ = np.asarray(value, dtype=np.float64)
        trees.roots_ = _indices(roots, np.int32)
        trees.baseline_ = np.asarray(baseline, dtype=np.float64)
        trees.check(n_channels)
        trees._exit_tables()
        return trees

    def check(self, n_channels=None) -> None:
        """ValueError unless the arrays make trees: same lengths, children and roots within the
        nodes, every path from a root ending on a leaf within MAX_DEPTH splits, one score per
        population (or one for two), columns that are populations, channels below ``n_channels``,
        no node with two parents, at most MAX_TREES trees and MAX_NODES nodes."""
        n = len(self.feature_)
        if n == 0 or not all(len(a) == n for a in (self.threshold_, self.left_, self.right_, self.value_)):
            raise ValueError("the trees' node arrays differ in length")
        if n > MAX_NODES:
            raise ValueError(f"{n} tree nodes; a model holds at most {MAX_NODES}")
        k = len(self.classes_)
        scores = len(self.columns_)
        if scores < 2 or len(np.unique(self.columns_)) != scores or self.columns_.min() < 0 or self.columns_.max() >= k:
            raise ValueError("the trees' populations are not the model's")
        per_iteration = 1 if scores == 2 else scores
        if self.roots_.ndim != 2 or self.roots_.shape[1] != per_iteration or len(self.baseline_) != per_iteration:
            raise ValueError("the trees' roots or baseline do not give one score per population")
        for a in (self.left_, self.right_, self.roots_):
            if a.size and (a.min() < 0 or a.max() >= n):
                raise ValueError("a tree points outside its nodes")
        if self.feature_.min() < 0 or (n_channels is not None and self.feature_.max() >= n_channels):
            raise ValueError("a tree splits on a channel the model does not have")
        if self.roots_.size > MAX_TREES:
            raise ValueError(f"{self.roots_.size} trees; a model holds at most {MAX_TREES}")
        leaf = self.left_ == np.arange(n)
        if not np.array_equal(leaf, self.right_ == np.arange(n)):
            raise ValueError("a tree's node has one child")
        # Trees, not graphs: every node has one parent at most and a root none, so each tree's
        # nodes are its own and the tables built from them grow with the file's nodes.
        children = np.concatenate([self.left_[~leaf], self.right_[~leaf], self.roots_.ravel()])
        if len(np.unique(children)) != len(children):
            raise ValueError("a node of the trees has two parents")
        reached = np.unique(self.roots_.ravel())
        for _ in range(MAX_DEPTH):  # a loop, or a path longer than a tree can have, never ends on leaves
            if leaf[reached].all():
                return
            inner = reached[~leaf[reached]]
            reached = np.unique(np.concatenate([reached[leaf[reached]], self.left_[inner], self.right_[inner]]))
        raise ValueError(f"a tree is deeper than {MAX_DEPTH} splits")

    def raw_scores(self, cells) -> np.ndarray:
        """The trees' summed scores of ``cells`` (n, d): (n, n_scores), float64.

        Each tree's exit leaf is found without walking it (QuickScorer, Lucchese et al. 2015): a
        cell that fails a node's test (goes right) cannot reach the leaves left of it, and the
        exit leaf is the leftmost leaf no failed test rules out. A node fails when its threshold
        is below the cell's value, so for each channel the failed nodes are the first ones by
        threshold, and what they rule out, per tree, is a running AND over those nodes
        (:meth:`_exit_tables`): a search and a row gather per channel and block of trees."""
        cells = np.asarray(cells)
        n_iter, per_iteration = self.roots_.shape
        out = np.empty((len(cells), per_iteration))
        for start in range(0, len(cells), SCORE_CHUNK):
            x = np.asarray(cells[start:start + SCORE_CHUNK], dtype=np.float64)
            leaf_scores = np.empty((len(x), n_iter * per_iteration))
            for trees, per_channel, leaf_values in self.tables_:
                reachable = np.full((len(x), len(trees)), ALL_LEAVES)
                for channel, (thresholds, running_and) in per_channel.items():
                    reachable &= running_and[np.searchsorted(thresholds, x[:, channel], side="left")]
                lowest = reachable & (~reachable + np.uint64(1))  # the leftmost reachable leaf's bit
                exit_leaf = np.log2(lowest.astype(np.float64)).astype(np.int64)
                leaf_scores[:, trees] = np.take_along_axis(leaf_values, exit_leaf.T, axis=1).T
            out[start:start + len(x)] = leaf_scores.reshape(len(x), n_iter, per_iteration).sum(axis=1)
        return out + self.baseline_

    def _exit_tables(self) -> None:
        """``tables_``: for each block of TREE_BLOCK trees, (their indices, channel ->
        (thresholds sorted, running AND of the leaves each node rules out: (nodes + 1, trees)),
        each tree's leaf values left to right (trees, MAX_LEAVES))."""
        roots = self.roots_.ravel()
        leaf = self.left_ == np.arange(len(self.left_))
        order = []  # per tree: (its leaves left to right, each split node with its left subtree's leaves)
        for root in roots:
            leaves, first, stack = [], {}, [int(root)]
            while stack:  # depth first, left before right: the leaves come left to right
                node = stack.pop()
                first[node] = len(leaves)  # the subtree of ``node`` starts at this leaf
                if leaf[node]:
                    leaves.append(node)
                else:
                    stack.extend([int(self.right_[node]), int(self.left_[node])])
            if len(leaves) > MAX_LEAVES:
                raise ValueError(f"a tree has {len(leaves)} leaves; gating reads trees of at most {MAX_LEAVES}")
            # A split's left subtree holds the leaves from its own first to its right child's first.
            splits = [(node, begin, first[int(self.right_[node])]) for node, begin in first.items() if not leaf[node]]
            order.append((leaves, splits))
        tables = []  # built whole, then set: scoring threads may read the trees meanwhile
        for first in range(0, len(roots), TREE_BLOCK):
            trees = np.arange(first, min(first + TREE_BLOCK, len(roots)))
            leaf_values = np.zeros((len(trees), MAX_LEAVES))
            nodes, owner, rules_out = [], [], []
            for j, t in enumerate(trees):
                leaves, splits = order[t]
                leaf_values[j, :len(leaves)] = self.value_[leaves]
                for node, begin, end in splits:
                    nodes.append(node)
                    owner.append(j)
                    rules_out.append(_bits(begin, end))
            nodes, owner, rules_out = np.asarray(nodes, np.int64), np.asarray(owner, np.int64), np.asarray(rules_out, np.uint64)
            per_channel = {}
            for channel in np.unique(self.feature_[nodes]) if len(nodes) else []:
                mine = np.flatnonzero(self.feature_[nodes] == channel)
                mine = mine[np.argsort(self.threshold_[nodes[mine]], kind="stable")]
                steps = np.full((len(mine) + 1, len(trees)), ALL_LEAVES)
                steps[np.arange(1, len(mine) + 1), owner[mine]] = ~rules_out[mine]
                per_channel[int(channel)] = (self.threshold_[nodes[mine]], np.bitwise_and.accumulate(steps, axis=0))
            tables.append((trees, per_channel, leaf_values))
        self.tables_ = tables

    def proba(self, cells) -> np.ndarray:
        """Probabilities (n, k) of ``cells`` (n, d) standardised as in training, float32, in the
        order of ``classes_``."""
        raw = self.raw_scores(cells)
        if raw.shape[1] == 1:  # two populations: the second's log-odds
            second = 1.0 / (1.0 + np.exp(-raw[:, 0]))
            scored = np.column_stack([1.0 - second, second])
        else:
            raw -= raw.max(axis=1, keepdims=True)
            scored = np.exp(raw)
            scored /= scored.sum(axis=1, keepdims=True)
        proba = np.zeros((len(raw), len(self.classes_)), dtype=np.float32)
        proba[:, self.columns_] = scored
        return proba


def _bits(begin: int, end: int) -> np.uint64:
    """The bits ``begin`` to ``end - 1`` set."""
    return np.uint64(sum(1 << i for i in range(begin, end)))


def _indices(values, dtype) -> np.ndarray:
    """Whole numbers as ``dtype``, refused (ValueError) when they are not whole numbers or do not
    fit: a model file's indices must not wrap into other, valid ones."""
    values = np.asarray(values)
    if values.dtype.kind not in "iu":
        raise ValueError("the trees' indices are not whole numbers")
    limit = np.iinfo(dtype)
    if values.size and (int(values.min()) < limit.min or int(values.max()) > limit.max):
        raise ValueError("the trees' indices are out of range")
    return values.astype(dtype)
