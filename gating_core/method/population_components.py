"""Populations that are no single Gaussian, as a few Gaussian components each.

The adapted populations (:mod:`gating_core.method.adaptive_lda`,
:class:`~gating_core.method.unknown_cells.PopulationReach`) model every population as one Gaussian.
An expert's catch-all gate ("ungated", "rest", "other": debris, monocytes and granulocytes outside a
lymphocyte gate) is several clusters; one Gaussian spread over all of them reaches into the
populations between them, and EM on a new patient lets it take their cells. Here each
population's training cells are split into components by a Gaussian mixture, the number chosen by
BIC (at most ``max_components``) among the splits whose components lie apart and appear within
most patients (not one per run or center), and a split is kept only where it gates the training
patients better; the generative fits then model the components as they modelled the
populations, and a population's posterior is the sum of its components'.
"""

from __future__ import annotations

import numpy as np
from sklearn.mixture import GaussianMixture

from gating_core.method.adaptive_lda import AdaptiveLDA
from gating_core.method.swollen_populations import SWELL_FACTOR
from gating_core.method.ties import call_weights
from gating_core.method.unknown_cells import MIN_POPULATION_CELLS, UNKNOWN_MARGIN, PopulationReach

#: Components per population at most (``GatingModel.population_components``'s default).
MAX_COMPONENTS = 3
#: The most components a population may be split into (a model file holding more is refused).
MAX_COMPONENTS_PER_POPULATION = 8
#: A population's pooled training cells the mixture is fitted on, at most.
MAX_FIT_CELLS = 10_000
#: In more than half of the training patients, every component of a split must hold at least this
#: share of the population's cells, all of them in the same patient; else the split is refused (a
#: few outlying cells are no cluster, and a cluster of some patients only is where their run put
#: the population).
MIN_COMPONENT_SHARE = 0.05
#: A population's split must raise the adapted populations' mean accuracy on the training patients
#: by at least this much, else it stays whole. More components give a population more room to
#: take its neighbours' cells when EM adapts it to a patient; where the experts' catch-all gate
#: (a few percent of debris, the clusters a lab gates as 'other') is split, the training patients
#: show that cost, and where one Gaussian for a catch-all reached into another population they
#: show the gain.
MIN_SPLIT_GAIN = 0.005
#: Every two components of a split must lie at least this far apart (the Mahalanobis distance
#: between their means under their mean covariance; two equal Gaussians closer than 2 make one
#: mode): a population that is one skewed or heavy-tailed cluster stays whole (BIC alone splits
#: almost any real population), one made of separate clusters is split.
MIN_SEPARATION = 3.0
#: A population the shared-covariance fit gives at least this share of a patient's cells is lost
#: by the own-shape fit where that fit leaves it without cells (:func:`lost_populations`). Below
#: it, a small population the shared covariance lets swell over a neighbour's cells (a few
#: percent in a simulated center) would restart the own-shape fit from a wrong mean.
LOST_SHARE = 0.1


def adapted_fits(lda: AdaptiveLDA, reach: PopulationReach | None, cells, margin=UNKNOWN_MARGIN, start=None,
                 starts=None, largest=None) -> tuple:
    """Both generative fits adapted to one patient's cells (m, d) by EM: (the shared-covariance
    Gaussians, :meth:`AdaptiveLDA.adapt` from ``start``; the own-shape populations,
    :meth:`PopulationReach.for_patient`, or None without ``reach``). ``starts``
    (:func:`population_starts`): the first component of each population, where the fits model
    components (a population is lost below only when all its components are). ``largest``
    (k,): each population's largest share in a training patient (None: not known).

    The own-shape EM starts from the population shares the shared-covariance EM found in the
    patient, not from the training shares. Started from the training shares, a population that
    is common in training and absent in this patient (a biopsy of tumour cells and no FL2+
    cell) takes the nearest cluster in the first step, and its fixed shape can then hold it; the
    shared-covariance fit, whose covariance follows the patient, finds the patient's own mix
    first.

    It starts from the training means. Where a run moved a population further than its own
    training shape reaches, a neighbour of a wider shape takes the moved cells and EM is left
    with no cell for the population (:func:`lost_populations`). The own-shape EM then starts
    again from the shared-covariance fit's means, and of its two ends the one under which the
    patient's cells are likelier is kept (:meth:`PopulationReach.log_likelihood`). A population
    the shared covariance let swell over a neighbour's cells, to more than ``SWELL_FACTOR`` times
    its largest training share, is not taken for lost: the likelier end can be the one that gives
    it the neighbour's cells (a small population beside an expert's catch-all gate)."""
    gaussians = lda.adapt(cells, start)
    if reach is None:
        return gaussians, None
    shares = np.exp(gaussians.log_shares)
    own = reach.for_patient(cells, margin, shares=shares)
    if lost_populations(shares, np.exp(own.log_shares), len(cells), starts, largest).any():
        again = reach.for_patient(cells, margin, shares=shares, means=gaussians.means)
        if reach.log_likelihood(cells, again) > reach.log_likelihood(cells, own):
            own = again
    return gaussians, own


def lost_populations(shared, own, n_cells, starts=None, largest=None) -> np.ndarray:
    """Which populations (k,) the own-shape fit lost: fewer than ``MIN_POPULATION_CELLS`` of the
    patient's ``n_cells`` cells by its shares ``own`` (the EM gave up moving them), where the
    shared-covariance fit's shares ``shared`` give them ``LOST_SHARE`` of the cells or more, and,
    with ``largest`` (k,: each population's largest share in a training patient), at most
    ``SWELL_FACTOR`` times that share. Per population where ``starts`` (:func:`population_starts`)
    groups components into populations."""
    shared, own = np.asarray(shared, dtype=np.float64), np.asarray(own, dtype=np.float64)
    if starts is not None:
        shared, own = np.add.reduceat(shared, np.asarray(starts)), np.add.reduceat(own, np.asarray(starts))
    shared, own = shared / shared.sum(), own / own.sum()
    lost = (own * n_cells < MIN_POPULATION_CELLS) & (shared >= LOST_SHARE)
    if largest is not None:
        lost &= shared <= SWELL_FACTOR * np.asarray(largest, dtype=np.float64)
    return lost


def component_name(population: int, component: int) -> str:
    """The label of a population's component: sorted names keep each population's components
    together and in population order."""
    return f"{population:04d}.{component:02d}"


def component_names(population_of) -> np.ndarray:
    """The name of each component (k_c,) from its population's index (``population_of``, grouped
    by population in population order, every population present)."""
    population_of = np.asarray(population_of, dtype=np.int64)
    first = population_starts(population_of)
    return np.asarray([component_name(int(j), i - int(first[j])) for i, j in enumerate(population_of)])


def split_populations(cells, labels, classes, max_components=MAX_COMPONENTS, random_state=0):
    """Split every population of the training patients into components.

    Parameters
    ----------
    cells : list of ndarray of shape (n_i, d)
        Standardised cells of each training patient.
    labels : list of ndarray of shape (n_i,)
        Their populations, each among ``classes``.
    classes : array-like of shape (k,)
        The populations, in model order.
    max_components : int
        Components per population at most; 1 leaves every population whole.

    Returns
    -------
    component_labels : list of ndarray of shape (n_i,)
        Each cell's component (:func:`component_name`).
    names : ndarray of shape (k_c,)
        The components, sorted: each population's together, populations in ``classes`` order.
    population_of : ndarray of shape (k_c,)
        The index in ``classes`` of each component's population.
    """
    classes = np.asarray(classes).astype(str)
    labels = [np.asarray(y).astype(str) for y in labels]
    order = np.argsort(classes)
    codes = [order[np.clip(np.searchsorted(classes, y, sorter=order), 0, len(classes) - 1)] for y in labels]
    rng = np.random.default_rng(np.random.SeedSequence([int(random_state or 0), 47]))
    # Each population's candidate components (cells of population j in patient i: assigned[j][i]).
    assigned = []
    for j in range(len(classes)):
        own = [np.asarray(x, dtype=np.float64)[c == j] for x, c in zip(cells, codes)]
        found = _components(np.concatenate(own), np.repeat(np.arange(len(own)), [len(x) for x in own]),
                            max_components, rng)
        assigned.append(np.split(found, np.cumsum([len(x) for x in own])[:-1]))
    counts = [int(np.concatenate(a).max(initial=0)) + 1 for a in assigned]
    # A split stays only where it gates the training patients better (:data:`MIN_SPLIT_GAIN`).
    whole = [1] * len(classes)
    baseline = None
    for j in [j for j in range(len(classes)) if counts[j] > 1]:
        if baseline is None:
            baseline = _adapted_accuracy(cells, codes, *_labelled(codes, assigned, whole))
        trial = list(whole)
        trial[j] = counts[j]
        if _adapted_accuracy(cells, codes, *_labelled(codes, assigned, trial)) - baseline < MIN_SPLIT_GAIN:
            counts[j] = 1
    return _labelled(codes, assigned, counts)


def _labelled(codes, assigned, counts) -> tuple:
    """(component labels, names, population of each) with population j in ``counts[j]``
    components (1: whole), its cells' components ``assigned[j]``."""
    parts = [np.empty(len(c), dtype=object) for c in codes]
    for j, count in enumerate(counts):
        for y, c, a in zip(parts, codes, assigned[j]):
            y[c == j] = [component_name(j, int(m)) for m in (a if count > 1 else np.zeros(len(a), dtype=np.int64))]
    population_of = np.repeat(np.arange(len(counts)), counts)
    return [y.astype(str) for y in parts], component_names(population_of), population_of


def _adapted_accuracy(cells, codes, parts, names, population_of) -> float:
    """The training patients' mean accuracy under the adapted populations modelled as
    ``parts``: both generative fits on all of them, each patient's populations adapted by EM to
    its own cells, the mean of the fits' posteriors (as gating mixes them in)."""
    lda = AdaptiveLDA().fit(cells, parts, classes=names)
    reach = PopulationReach().fit(cells, parts, names)
    starts = population_starts(population_of)
    accuracy = []
    for x, c in zip(cells, codes):
        gaussians, patient = adapted_fits(lda, reach, x)
        proba = adapted_proba(x, gaussians, (reach, patient), starts)
        # No transfer model is fitted yet to break the fits' ties: a tied cell counts as the
        # share of a right call a random choice among the tied would make, whatever the names.
        accuracy.append(np.mean(call_weights(proba)[np.arange(len(c)), c]))
    return float(np.mean(accuracy))


def _components(cells, patient_of, max_components, rng) -> np.ndarray:
    """Each cell's component (n,) int: a Gaussian mixture of 1..``max_components`` components
    fitted on at most ``MAX_FIT_CELLS`` of the cells (``patient_of``: each cell's patient), the
    number chosen by BIC among the splits that :func:`_within_patients` accepts."""
    n = len(cells)
    if max_components <= 1 or n < 20 * max(cells.shape[1], 1):
        return np.zeros(n, dtype=np.int64)
    drawn = rng.choice(n, MAX_FIT_CELLS, replace=False) if n > MAX_FIT_CELLS else np.arange(n)
    fit = cells[drawn]
    best, best_bic = None, np.inf
    for m in range(1, int(max_components) + 1):
        mixture = GaussianMixture(m, covariance_type="full", reg_covar=1e-4, n_init=1, max_iter=200,
                                  random_state=int(rng.integers(2**31 - 1))).fit(fit)
        if m > 1 and not _within_patients(mixture, mixture.predict(fit), patient_of[drawn]):
            continue
        bic = mixture.bic(fit)
        if bic < best_bic:
            best, best_bic = mixture, bic
    if best is None or best.n_components == 1:
        return np.zeros(n, dtype=np.int64)
    return best.predict(cells).astype(np.int64)


def _within_patients(mixture, assigned, patient_of) -> bool:
    """Whether a split is the population's own shape: every two components at least
    ``MIN_SEPARATION`` apart (:func:`_separation`), and more than half of the patients holding
    every component side by side, each with ``MIN_COMPONENT_SHARE`` of the population's cells.
    Pooled over patients of shifted runs or centers, one cluster is several, one per run: each
    of those components holds the cells of some patients, and a patient holds one of them (or
    one and the tail of another: counted component by component, such a split would pass)."""
    if _separation(mixture) < MIN_SEPARATION:
        return False
    m = mixture.n_components
    patients = np.unique(patient_of)
    together = 0
    for p in patients:
        own = assigned[patient_of == p]
        together += bool(np.all(np.bincount(own, minlength=m) >= MIN_COMPONENT_SHARE * len(own)))
    return together > 0.5 * len(patients)


def _separation(mixture) -> float:
    """The smallest Mahalanobis distance between two components' means of ``mixture``, under the
    mean of their covariances."""
    means, covariances = mixture.means_, mixture.covariances_
    smallest = np.inf
    for a in range(len(means)):
        for b in range(a + 1, len(means)):
            gap = means[a] - means[b]
            smallest = min(smallest, float(np.sqrt(gap @ np.linalg.solve(0.5 * (covariances[a] + covariances[b]), gap))))
    return smallest


def component_start(proba, gaussians, cells, population_of):
    """EM's start in components (m, k_c) from another model's population probabilities ``proba``
    (m, k) of ``cells`` (m, d): each population's probability shared among its components as the
    training components (``gaussians``, an AdaptiveLDA fitted on them) share its cells. ``proba``
    itself when ``population_of`` is None (no components)."""
    if population_of is None:
        return proba
    population_of = np.asarray(population_of)
    trained = gaussians.training_gaussians()
    logits = np.asarray(cells, dtype=np.float64) @ trained.coef + trained.intercept
    start = np.empty_like(logits)
    for j in np.unique(population_of):
        own = population_of == j
        within = logits[:, own] - logits[:, own].max(axis=1, keepdims=True)
        np.exp(within, out=within)
        start[:, own] = within / within.sum(axis=1, keepdims=True) * np.asarray(proba, dtype=np.float64)[:, [j]]
    return start


def population_starts(population_of) -> np.ndarray:
    """The index of each population's first component (k,), for summing component columns with
    ``np.add.reduceat``."""
    population_of = np.asarray(population_of)
    return np.flatnonzero(np.r_[True, population_of[1:] != population_of[:-1]])


def population_proba(component_proba: np.ndarray, starts) -> np.ndarray:
    """Population probabilities (n, k) from component probabilities (n, k_c) whose columns are
    grouped by population (``starts``: :func:`population_starts`)."""
    if len(starts) == component_proba.shape[1]:
        return component_proba
    return np.add.reduceat(component_proba, np.asarray(starts), axis=1)


def adapted_proba(cells, gaussians, shapes=None, starts=None) -> np.ndarray:
    """The adapted populations' posteriors of cells (n, d): (n, k) float32, the mean of the
    shared-covariance fit's (``gaussians``, a :class:`~gating_core.method.adaptive_lda.PatientGaussians`)
    and, with ``shapes`` (a :class:`~gating_core.method.unknown_cells.PopulationReach` and its
    :class:`~gating_core.method.unknown_cells.PatientReach`), the own-shape fit's; with ``starts``
    (:func:`population_starts`) their components' columns summed per population."""
    proba = AdaptiveLDA.proba(cells, gaussians)
    if shapes is not None:
        reach, patient = shapes
        proba += reach.proba(cells, patient)
        proba *= np.float32(0.5)
    return proba if starts is None else population_proba(proba, starts)
