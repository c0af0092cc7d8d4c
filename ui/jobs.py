"""Long computations (training, the held-out check) as background jobs of the app's process.

A job runs in a thread of the Streamlit server, not in the browser session that started it, so
leaving the page, opening another one or reloading the browser does not stop it: any session
on the same patient library finds it again (:func:`jobs_for`), shows its progress with a time
estimate, and can cancel it. A job that finishes stores its result in the library itself (a
trained model is added there by the job), so the result is there even when no page watches.

Cancelling is cooperative: the job's progress callback raises :class:`JobCancelled` at the
model's next progress report (between cross-validation fits), and nothing is stored.

No Streamlit here: the pages draw what :class:`Job` reports.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

RUNNING, DONE, FAILED, CANCELLED = "running", "done", "failed", "cancelled"
_KEEP_FINISHED = 20  # finished jobs remembered per library (their results are in the library anyway)


class JobCancelled(Exception):
    """Raised inside a job's work when the user cancelled it."""


@dataclass
class Job:
    """One background computation and what a page needs to show about it."""

    kind: str                 # "train" or "check"
    title: str
    library_key: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    status: str = RUNNING
    stage: str = "Starting"
    fraction: float = 0.0
    started: float = field(default_factory=time.time)
    finished: float | None = None
    error: str = ""
    result: object = None     # what the work function returned (e.g. a model id and the model)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def report(self, stage: str, fraction: float) -> None:
        """The progress callback handed to the work; raises JobCancelled once cancelled."""
        if self._cancel.is_set():
            raise JobCancelled()
        self.stage = str(stage)
        self.fraction = min(max(float(fraction), self.fraction), 1.0)  # never goes backwards

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set() and self.status == RUNNING

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    @property
    def elapsed(self) -> float:
        return (self.finished or time.time()) - self.started

    def remaining_seconds(self) -> float | None:
        """Time left, extrapolated from the time per unit of progress so far (None until a
        first report past 2% makes the estimate worth showing)."""
        if not self.running or self.fraction < 0.02:
            return None
        return self.elapsed * (1.0 - self.fraction) / self.fraction

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has finished (for tests and scripts); True when it has."""
        return self._done.wait(timeout)


_lock = threading.Lock()
_jobs: dict[str, list[Job]] = {}


def library_key(library_path) -> str:
    """Jobs are shared by every session that works on the same library folder."""
    return str(Path(str(library_path)).expanduser().resolve())


def start_job(kind: str, title: str, library_path, work) -> Job:
    """Run ``work(report)`` in a background thread; ``report(stage, fraction)`` is the progress
    callback (it raises JobCancelled after :meth:`Job.cancel`). Returns the job at once."""
    job = Job(kind=kind, title=title, library_key=library_key(library_path))

    def run():
        try:
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


def running_job(library_path, kind: str) -> Job | None:
    return next((j for j in reversed(jobs_for(library_path, kind)) if j.running), None)


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
