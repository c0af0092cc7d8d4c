"""One patient in the session (:class:`PatientRecord`) and an auto-gate result read back from
the library (:class:`StoredResult`); :class:`ui.store.Store` holds them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np

from gating_core.gates import GateTree
from ui.gate_history import GateHistory
from ui.shared import compact_labels


#: The key of a stored result's details that says its populations are a person's review.
REVIEWED_DETAIL = "corrected in review"


def _new_token() -> str:
    return uuid.uuid4().hex


@dataclass
class StoredResult:
    """An auto-gate result read back from the library (same attributes the pages use)."""

    populations: np.ndarray
    confidence: np.ndarray
    novelty: object = None
    counts: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)

    @property
    def part(self):
        """The model's part that gated (``GateResult.part``), as stored; None: the model's gating."""
        return self.details.get("part")


@dataclass(frozen=True)
class ReviewSnapshot:
    """A patient's review as it stood before a correction, for the page's undo: the corrected
    populations and their confidence (None: the gating as gated or read back), and the gates
    fitted to it (a copy of ``PatientRecord.autogates``)."""

    corrected: np.ndarray | None
    confidence: np.ndarray | None
    autogates: dict | None


def _novelty_details(result) -> dict:
    """What a result's details keep beside its populations: its novelty and, when one part of
    the model gated it alone, that part."""
    part = getattr(result, "part", None)
    details = {} if part is None else {"part": str(part)}
    novelty = getattr(result, "novelty", None)
    if novelty is None:
        return details
    stored = {"score": float(novelty.score), "threshold": float(novelty.threshold),
              "is_novel": bool(novelty.is_novel), "message": str(novelty.message)}
    disagreement = getattr(novelty, "disagreement", None)
    if disagreement is not None:
        stored.update(disagreement=float(disagreement),
                      disagreement_threshold=float(novelty.disagreement_threshold))
    constant = getattr(novelty, "constant_channels", None)
    if constant:
        stored["constant_channels"] = {str(c): float(v) for c, v in constant.items()}
    return {**details, "novelty": stored}


class PatientRecord:
    """One patient in the session.

    ``labels`` (n_events,) str, or None for a new patient; ``result`` is the latest auto-gate
    result and ``corrected`` its populations after the user's corrections. ``token`` changes
    whenever the events change, so caches keyed by it stay correct. ``sample`` and ``labels``
    may be read lazily from the library.
    """

    def __init__(self, name, sample=None, *, sample_loader=None, n_events=None, labels=None, labels_loader=None,
                 labeled=None, label_source="", file_name="", channel_names=None):
        self.name = name
        self.channel_names = list(channel_names) if channel_names is not None else list(sample.pnn)
        self._sample, self._sample_loader = sample, sample_loader
        self._n_events = n_events if n_events is not None else (sample.n_events if sample is not None else 0)
        self._labels, self._labels_loader = labels, labels_loader
        self._labeled = labeled if labeled is not None else labels is not None
        self.label_source = label_source
        self.file_name = file_name
        self.gate_tree = GateTree()
        self.history = GateHistory()
        self.result = None
        self.result_model = ""
        self.result_loader = None
        # the novelty (a dict) a result in the library was stored with, read without the result
        self.stored_novelty = None
        self.corrected = None
        # the confidence kept with the corrections (what the library stores with them)
        self.corrected_confidence = None
        # the auto-gates fitted to this patient: {"tree": GateTree dict, "template": patient name,
        # "edited": bool}; kept in the stored auto-gate result's details
        self.autogates = None
        self.token = _new_token()
        self.labels_token = _new_token()
        self.result_token = _new_token()
        # What the library held of this patient when this session last looked (the Store's
        # VERSION_FIELDS; None until known), and the labeling a review here started from.
        self.version: dict | None = None
        self.review_labeling: int | None = None

    # lazily loaded data --------------------------------------------------------------------
    @property
    def sample(self):
        if self._sample is None and self._sample_loader is not None:
            self._sample = self._sample_loader()
        return self._sample

    @property
    def sample_loaded(self) -> bool:
        """Whether the events are in memory (patients of the library are read when first used)."""
        return self._sample is not None or self._sample_loader is None

    @property
    def n_events(self) -> int:
        return self._n_events

    @property
    def labels(self):
        if self._labels is None and self._labeled and self._labels_loader is not None:
            loaded = self._labels_loader()
            self._labels = None if loaded is None else compact_labels(loaded) if loaded.dtype != object else loaded
        return self._labels

    @property
    def is_labeled(self) -> bool:
        return self._labeled

    @property
    def role(self) -> str:
        return "historical (labeled)" if self.is_labeled else "new"

    @property
    def result_novelty(self):
        """The latest auto-gate result's novelty (a Novelty, or the dict it was stored as), or None;
        the result is not read from the library for it."""
        if self.result is not None:
            return getattr(self.result, "novelty", None)
        return self.stored_novelty if self.result_loader is not None else None

    def load_result(self):
        if self.result is None and self.result_loader is not None:
            loader, self.result_loader = self.result_loader, None
            self.result = loader()
            stored = getattr(self.result, "details", None) or {}
            if isinstance(stored.get("autogates"), dict):
                self.autogates = stored["autogates"]
        return self.result

    @property
    def populations(self):
        """The populations to show: corrected auto-gate, else auto-gate, else labels."""
        if self.corrected is not None:
            return self.corrected
        if self.load_result() is not None:
            return self.result.populations
        return self.labels

    @property
    def confidence(self) -> np.ndarray:
        """Each event's confidence (n_events,) float64, as every export and the library hold it: the
        model's, or after corrections the one kept with them (a cell a person reassigned: 1.0);
        1.0 everywhere without an auto-gate result."""
        if self.load_result() is None:
            return np.ones(self.n_events)
        if self.corrected is not None and self.corrected_confidence is not None:
            return self.corrected_confidence
        return np.asarray(self.result.confidence, dtype=np.float64)

    @property
    def populations_token(self) -> str:
        """Changes whenever :attr:`populations` may change (cache key)."""
        return f"{self.token}:{self.labels_token}:{self.result_token}"

    # changes (the Store persists them) -----------------------------------------------------
    def set_labels(self, labels, source: str) -> None:
        labels = compact_labels(labels)
        if labels.shape != (self.n_events,):
            raise ValueError(f"{self.name}: {labels.shape[0]} labels for {self.n_events} events")
        self._labels, self._labeled, self.label_source = labels, True, source
        self.labels_token = _new_token()

    def set_result(self, result, model_name: str) -> None:
        self.result, self.result_model, self.corrected, self.result_loader = result, model_name, None, None
        self.corrected_confidence = None
        self.autogates = None
        self.result_token = _new_token()

    def set_corrected(self, populations, confidence) -> None:
        """The reviewed populations (n_events,) and their confidence (n_events,), clipped to [0, 1]."""
        confidence = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
        if confidence.shape != (self.n_events,):
            raise ValueError(f"{self.name}: {confidence.shape[0]} confidences for {self.n_events} events")
        self.corrected, self.corrected_confidence = compact_labels(populations), confidence
        self.result_token = _new_token()

    def reopen(self, base) -> None:
        """Put the review read back from the library (corrected in an earlier session) over
        ``base``, the model's own gating of the patient made again: the record then holds both,
        as for a review begun in this session (the gates stay as they are)."""
        self.load_result()
        reviewed, confidence = np.asarray(self.populations), np.array(self.confidence, dtype=np.float64)
        if len(reviewed) != len(base.populations):
            raise ValueError(f"{self.name}: the gating has {len(base.populations)} events, the review {len(reviewed)}")
        autogates = self.autogates
        self.result = base
        self.corrected, self.corrected_confidence = compact_labels(reviewed), confidence
        self.autogates = autogates
        self.result_token = _new_token()

    def snapshot(self) -> ReviewSnapshot:
        """The review as it stands (:class:`ReviewSnapshot`), copied: later corrections leave it as it is."""
        import copy

        return ReviewSnapshot(None if self.corrected is None else np.array(self.corrected, copy=True),
                              None if self.corrected_confidence is None else np.array(self.corrected_confidence),
                              copy.deepcopy(self.autogates))

    def restore(self, snapshot: ReviewSnapshot) -> None:
        """Put the review back as ``snapshot`` holds it."""
        import copy

        self.corrected = None if snapshot.corrected is None else np.array(snapshot.corrected, copy=True)
        self.corrected_confidence = None if snapshot.confidence is None else np.array(snapshot.confidence)
        self.autogates = copy.deepcopy(snapshot.autogates)
        self.result_token = _new_token()

    @property
    def reviewed_earlier(self) -> bool:
        """Whether the auto-gate result read back from the library holds reviewed cells
        (corrected in an earlier session), not the model's gating."""
        return bool((getattr(self.load_result(), "details", None) or {}).get(REVIEWED_DETAIL))

    @property
    def is_accepted(self) -> bool:
        """Whether the patient's labels are an auto-gating a person reviewed and accepted."""
        return self.label_source.startswith("auto-gate")

    @property
    def is_reviewed(self) -> bool:
        """Whether the populations shown are a person's review: corrected in this session or an earlier one."""
        return self.corrected is not None or self.reviewed_earlier

    def corrected_count(self) -> int:
        """Cells whose reviewed population differs from the gating this session's corrections
        started from (0 without corrections)."""
        if self.corrected is None or self.load_result() is None:
            return 0
        return int((np.asarray(self.corrected).astype(str) != np.asarray(self.result.populations).astype(str)).sum())

    def earlier_corrected_count(self) -> int:
        """Cells corrected in an earlier session, as the review read back from the library counts
        them (0 when the result read back is the model's own gating)."""
        stored = getattr(self.load_result(), "details", None) or {}
        return int(stored.get("cells corrected", 0)) if stored.get(REVIEWED_DETAIL) else 0

    def cells_corrected(self) -> int:
        """Cells corrected by hand in all: this session's corrections and an earlier session's
        (a cell corrected in both counts twice: the model's own gating is not kept)."""
        return self.earlier_corrected_count() + self.corrected_count()
