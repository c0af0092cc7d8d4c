"""What gating a patient gives back: populations, confidences and how new the patient is."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gating_core.errors import ChannelMismatchError  # noqa: F401  (importable from here, as before)


@dataclass
class Novelty:
    """How far a patient's cell distribution lies from the training patients'.

    ``score``: distance of its embedding to the nearest training embedding, divided by the
    median nearest-neighbour distance among training patients (1 = as close as a typical
    training patient is to its nearest peer). ``is_novel`` when ``score > threshold``.
    """

    score: float
    threshold: float
    is_novel: bool
    nearest_patient: str = ""
    message: str = ""

    def to_dict(self) -> dict:
        return {"score": self.score, "threshold": self.threshold, "is_novel": self.is_novel,
                "nearest_patient": self.nearest_patient, "message": self.message}


@dataclass
class GateResult:
    """Gating of one patient: per-cell population and confidence, per-patient novelty.

    ``populations``: (n_events,) object array of population names (str); ``confidence``:
    (n_events,) float32 in [0, 1], the probability of the assigned population.
    """

    populations: np.ndarray
    confidence: np.ndarray
    novelty: Novelty
    population_names: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    """Events per population, every population of the model listed (zeros included)."""


@dataclass
class StreamedGate:
    """What :meth:`GatingModel.gate_chunks` returns: the per-patient part of a
    :class:`GateResult` (the per-event results went to its ``sink``)."""

    novelty: Novelty
    counts: dict
    n_events: int
    mean_confidence: float
    population_names: list = field(default_factory=list)
