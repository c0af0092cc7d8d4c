"""What gating a patient gives back: populations, confidences, how new the patient is and how
much the model's parts disagree on it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gating_core.errors import ChannelMismatchError  # noqa: F401  (importable from here, as before)


#: Share of a patient's cells on which the transfer model and the patient's adapted populations
#: name different populations, beyond which its gates are flagged for review. On the held-out
#: patients of every benchmark set (real and simulated), those beyond 0.2 were gated at 0.80 mean
#: accuracy and the others at 0.955; 27 of the 33 patients gated below 0.8 were beyond it
#: (docs/unseen_data.md, "Which patients to review first").
DISAGREEMENT_THRESHOLD = 0.2
#: What gating can give besides the model's own mix (``gate(..., part=...)``): its transfer model
#: alone, which extrapolates the training patients' boundaries, or the patient's adapted
#: populations alone, which follow its own clusters. Where the two disagree the patient is
#: flagged, and which one is right depends on the patient: a reviewer compares them.
GATING_PARTS = ("transfer", "adapted")
#: How the review names each part of :data:`GATING_PARTS` (None: the model's own mix).
PART_TITLES = {None: "the model's gating", "transfer": "the transfer model alone",
               "adapted": "the patient's own populations alone"}


@dataclass
class Novelty:
    """How far a patient's cell distribution lies from the training patients', and how much the
    model's parts disagree on its cells.

    ``score``: distance of its embedding to the nearest training embedding, divided by the
    median nearest-neighbour distance among training patients (1 = as close as a typical
    training patient is to its nearest peer). ``is_novel`` when ``score > threshold``.

    ``disagreement``: the share of the patient's content-chosen cells on which the transfer model
    and its adapted populations (the two parts the default mixes) name different populations (a
    cell the adapted populations' two fits tie on counts), or None when the model does not mix
    them. ``parts_disagree`` when it exceeds ``disagreement_threshold``: the patient's gates are
    then more often wrong, whatever its novelty.

    ``constant_channels``: {$PnN: value} of the model's channels that hold one value on every
    event of the patient (a detector off, a channel not recorded): the gates that use them are
    guesses. ``needs_review`` when any of these is up.
    """

    score: float
    threshold: float
    is_novel: bool
    nearest_patient: str = ""
    message: str = ""
    disagreement: float | None = None
    disagreement_threshold: float = DISAGREEMENT_THRESHOLD
    constant_channels: dict = field(default_factory=dict)

    @property
    def parts_disagree(self) -> bool:
        return self.disagreement is not None and self.disagreement > self.disagreement_threshold

    @property
    def needs_review(self) -> bool:
        return bool(self.is_novel) or self.parts_disagree or bool(self.constant_channels)

    def note_constant_channels(self, constant, name: str) -> None:
        """Record the channels that hold one value on every event of patient ``name``
        ({$PnN: value}; none: nothing changes), and say so first in :attr:`message`."""
        if not constant:
            return
        self.constant_channels = dict(constant)
        held = ", ".join(f"{c} ({v:g})" for c, v in constant.items())
        one = len(constant) == 1
        self.message = (f"{'Channel' if one else 'Channels'} {held} {'holds' if one else 'hold'} one value on "
                        f"every event of {name}: a detector off or a channel not recorded? The gates that use "
                        f"{'it' if one else 'them'} are guesses; review them by hand. {self.message}")

    def to_dict(self) -> dict:
        return {"score": self.score, "threshold": self.threshold, "is_novel": self.is_novel,
                "nearest_patient": self.nearest_patient, "message": self.message,
                "disagreement": self.disagreement, "disagreement_threshold": self.disagreement_threshold,
                "parts_disagree": self.parts_disagree, "constant_channels": dict(self.constant_channels)}


def novelty_field(novelty, key: str):
    """A field of a :class:`Novelty` or of its ``to_dict`` as stored with a result (a dict, or a
    namespace made of it): None when absent, or when ``novelty`` is None."""
    if novelty is None:
        return None
    return novelty.get(key) if isinstance(novelty, dict) else getattr(novelty, key, None)


def review_flags(novelty) -> tuple[bool, bool]:
    """(is_novel, parts_disagree) of a :class:`Novelty`, or of its ``to_dict`` (a dict or a
    namespace, as stored with a result; results stored without a disagreement give False)."""
    disagreement = novelty_field(novelty, "disagreement")
    threshold = novelty_field(novelty, "disagreement_threshold")
    disagree = (disagreement is not None and threshold is not None
                and float(disagreement) > float(threshold))
    return bool(novelty_field(novelty, "is_novel")), disagree


def constant_channel_names(novelty) -> list[str]:
    """The channels of a :class:`Novelty` (or its stored dict) that hold one value on every event
    of the patient; empty for results stored before this was measured."""
    return list(novelty_field(novelty, "constant_channels") or {})


def review_reasons(novelty) -> list[str]:
    """Why a gated patient is to be reviewed, in words (empty: it is not): unlike the training
    patients, the model's parts disagreeing on many of its cells, channels that hold one value."""
    novel, disagree = review_flags(novelty)
    constant = constant_channel_names(novelty)
    return ((["unlike the training patients"] if novel else [])
            + ([f"parts disagree on {float(novelty_field(novelty, 'disagreement')):.1%} of its cells"] if disagree else [])
            + ([f"{', '.join(constant)} {'holds' if len(constant) == 1 else 'hold'} one value"] if constant else []))


def review_order(novelties: dict) -> list:
    """The patients of ``{patient: novelty}`` (a :class:`Novelty`, its stored dict, or None) in the
    order to review them: unlike the training patients first, then those the model's parts
    disagree on or with a channel of one value, then the others; each group by decreasing
    disagreement, unmeasured last."""
    def key(item):
        novel, disagree = review_flags(item[1])
        disagreement = novelty_field(item[1], "disagreement")
        flagged = disagree or bool(constant_channel_names(item[1]))
        return not novel, not flagged, 1.0 if disagreement is None else -float(disagreement)

    return [patient for patient, _ in sorted(novelties.items(), key=key)]


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
    part: str | None = None
    """The model's part that gated (one of :data:`GATING_PARTS`), or None: the model's own mix."""


@dataclass
class StreamedGate:
    """What :meth:`GatingModel.gate_chunks` returns: the per-patient part of a
    :class:`GateResult` (the per-event results went to its ``sink``)."""

    novelty: Novelty
    counts: dict
    n_events: int
    mean_confidence: float
    population_names: list = field(default_factory=list)
    part: str | None = None
