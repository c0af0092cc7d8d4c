"""The method on arrays: the marginal-transfer kernel classifier and what it is built from.

Nothing here knows of files, channels or transforms: a patient is an array of cells (and its
labels). ``features`` (mean embeddings, random and linear product features), ``training_problem``
(labeled patients made ready for a solver) with ``patient_embeddings`` (each patient's
embedding, shared within a training), ``landmarks`` (Nystroem / exact landmark features) and
``augmentation`` (shifted copies of training patients), ``ridge`` (ridge statistics: the squared loss in
closed form, and the multitask solve), ``solvers`` (logistic and hinge solves) on
``lbfgs`` (L-BFGS in row blocks), ``losses`` (one object per loss), ``classifier``
(:class:`~gating_core.method.classifier.MarginalTransferClassifier`) with ``prediction`` (its
scoring half), ``calibration`` (the temperature) and ``sklearn_checks``, ``selection``
(cross-validation over groups) with ``fold_fits`` (the fits its folds share) and
``companion_selection`` (the pooled companion's penalty and weight), ``groups`` (centers, batches, replicate twins), ``alignment`` and
``landmark_alignment`` (per-patient registration of each channel), ``priors`` (class-prior re-estimation),
``refinement`` and ``self_training`` (a patient's refit from corrections or from its own
confident cells), ``dica`` (domain-invariant projection), ``adaptive_lda`` (populations as
Gaussians adapted to each patient) and ``iw_nystroem`` (importance-weighted Nystroem KRR for
one new patient). Import each name from its module; this package re-exports nothing.
"""
