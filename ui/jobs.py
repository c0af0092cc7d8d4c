"""Long computations (training, the held-out check) as background jobs of the app's process.

A job runs in a thread of the Streamlit server, not in the browser session that started it, so
leaving the page, opening another one or reloading the browser does not stop it. Every session
on the same patient library sees it (:func:`jobs_for`), who started it (``Job.owner``, the
session's id, which a reload of that browser tab keeps) and with what settings; the session
that started it shows its progress with a time estimate, can cancel it and takes up its result.
One job of a kind runs at a time on a library; one asked for meanwhile waits in a queue. A job
that finishes stores its result in the library itself (a trained model is added there by the
job), so the result is there even when no page watches, and the job keeps only ids and figures.

Cancelling is cooperative: the job's progress callback raises :class:`JobCancelled` at the
model's next progress report (between cross-validation fits), and nothing is stored.

No Streamlit here: the pages draw what :class:`Job` reports.
"""

from __future__ import annotations

import math
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

RUNNING, DONE, FAILED, CANCELLED, QUEUED = "running", "done", "failed", "cancelled", "queued"
_KEEP_FINISHED = 20  # finished jobs remembered per library (their results are in the library anyway)


class JobCancelled(Exception):
    """Raised inside a job's work when the user cancelled it."""


class ProgressClock:
    """Time left of a job, from its progress reports: where the pace since the start ends, that
    finish time smoothed (a job's stages run at different paces, and the estimate should
    follow a change of pace over seconds rather than jump with each report), counted down
    between reports. Once the smoothed finish has passed with the job still running, the pace
    so far at this moment is said instead (it grows as long as no progress comes).

    Honest only as far as the fractions reported grow with time: the check's stages are
    weighted by what each costs (:func:`ui.training.check_progress`) for that reason."""

    MIN_FRACTION = 0.02   # below it, too early to guess
    MIN_SECONDS = 3.0     # before it, the start-up's quick first steps would set the pace
    SMOOTHING_SECONDS = 10.0

    def __init__(self, now=time.monotonic):
        self._now = now
        self.start = now()
        self.fraction = 0.0
        self._finish: float | None = None
        self._last: float | None = None

    def restart(self) -> None:
        self.__init__(self._now)

    def update(self, fraction: float, at: float | None = None) -> None:
        at = self._now() if at is None else at
        self.fraction = max(self.fraction, min(float(fraction), 1.0))
        elapsed = at - self.start
        if self.fraction < self.MIN_FRACTION or elapsed < self.MIN_SECONDS:
            return
        finish = self.start + elapsed / self.fraction
        if self._finish is None:
            self._finish = finish
        else:
            weight = 1.0 - math.exp(-max(at - self._last, 0.0) / self.SMOOTHING_SECONDS)
            self._finish += weight * (finish - self._finish)
        self._last = at

    def remaining(self, at: float | None = None) -> float | None:
        """Seconds left, or None until a report past :attr:`MIN_FRACTION`."""
        if self._finish is None:
            return None
        at = self._now() if at is None else at
        left = self._finish - at
        if left > 0:
            return left
        return (at - self.start) * (1.0 - self.fraction) / self.fraction


@dataclass
class Job:
    """One background computation and what a page needs to show about it.

    ``owner`` is the id of the browser session that started it and ``owner_name`` how that
    session is shown to others; ``settings`` says in a line what it was asked to do."""

    kind: str                 # "train" or "check"
    title: str
    library_key: str
    owner: str = ""
    owner_name: str = ""
    settings: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    status: str = RUNNING
    stage: str = "Starting"
    fraction: float = 0.0
    submitted: float = field(default_factory=time.time)
    started: float = field(default_factory=time.time)
    finished: float | None = None
    error: str = ""
    result: object = None     # what the work function returned (ids, figures; no model when it is in the library)
    queued_behind: "Job | None" = field(default=None, repr=False)
    _clock: ProgressClock = field(default_factory=ProgressClock, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def report(self, stage: str, fraction: float) -> None:
        """The progress callback handed to the work; raises JobCancelled once cancelled."""
        if self._cancel.is_set():
            raise JobCancelled()
        self.stage = str(stage)
        self.fraction = min(max(float(fraction), self.fraction), 1.0)  # never goes backwards
        self._clock.update(self.fraction)

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set() and self.running

    @property
    def running(self) -> bool:
        """Not finished: working, or waiting for the job ahead of it."""
        return self.status in (RUNNING, QUEUED)

    @property
    def waiting(self) -> bool:
        return self.status == QUEUED

    @property
    def started_by(self) -> str:
        return self.owner_name or (f"session {self.owner[:6]}" if self.owner else "another session")

    @property
    def elapsed(self) -> float:
        if self.waiting:
            return 0.0
        return (self.finished or time.time()) - self.started

    def remaining_seconds(self) -> float | None:
        """Time left (see :class:`ProgressClock`); None while queued or too early to say."""
        if self.status != RUNNING:
            return None
        return self._clock.remaining()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has finished (for tests and scripts); True when it has."""
        return self._done.wait(timeout)


_lock = threading.Lock()
_jobs: dict[str, list[Job]] = {}


def library_key(library_path) -> str:
    """Jobs are shared by every session that works on the same library folder."""
    return str(Path(str(library_path)).expanduser().resolve())


def start_job(kind: str, title: str, library_path, work, *, owner: str = "", owner_name: str = "",
              settings: str = "") -> Job:
    """Run ``work(report)`` in a background thread; ``report(stage, fraction)`` is the progress
    callback (it raises JobCancelled after :meth:`Job.cancel`). Returns the job at once.

    One job of a kind runs at a time on a library: a job asked for while another runs is
    queued behind it (status ``queued``, its stage says behind whose) and starts when that one
    has finished, whoever started it; cancelled while it waits, it never starts."""
    job = Job(kind=kind, title=title, library_key=library_key(library_path), owner=owner, owner_name=owner_name,
              settings=settings)

    def run():
        try:
            ahead = job.queued_behind
            if ahead is not None:
                while not ahead.wait(0.2):
                    if job._cancel.is_set():
                        raise JobCancelled()
                if job._cancel.is_set():
                    raise JobCancelled()
                job.status, job.stage, job.started = RUNNING, "Starting", time.time()
                job._clock.restart()
                job.queued_behind = None
            job.result = work(job.report)  # the work reports (and so checks for a cancel) before it stores
            job.stage, job.fraction, job.status = "Done", 1.0, DONE
        except JobCancelled:
            job.status = CANCELLED
        except Exception as exc:  # shown on the page; the server and the library carry on
            job.status, job.error = FAILED, f"{exc}"
            traceback.print_exc()
        finally:
            job.finished = time.time()
            job._done.set()

    with _lock:
        jobs = _jobs.setdefault(job.library_key, [])
        ahead = [j for j in jobs if j.kind == kind and j.running]
        if ahead:
            job.queued_behind, job.status = ahead[-1], QUEUED
            job.stage = f"Queued behind {ahead[-1].title.lower()} started by {ahead[-1].started_by}"
        jobs.append(job)
        finished = [j for j in jobs if not j.running]
        for old in finished[:-_KEEP_FINISHED]:
            jobs.remove(old)
    threading.Thread(target=run, name=f"gating-{kind}-{job.id}", daemon=True).start()
    return job


def jobs_for(library_path, kind: str | None = None) -> list[Job]:
    """The jobs on this library, oldest first (running and recently finished)."""
    with _lock:
        jobs = list(_jobs.get(library_key(library_path), []))
    return [j for j in jobs if kind is None or j.kind == kind]


def running_job(library_path, kind: str, owner: str | None = None) -> Job | None:
    """The newest unfinished job of ``kind`` (of ``owner``'s, when given)."""
    return next((j for j in reversed(jobs_for(library_path, kind))
                 if j.running and (owner is None or j.owner == owner)), None)


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
