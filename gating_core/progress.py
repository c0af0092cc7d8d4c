"""Progress display for long command-line steps: tqdm on a terminal; elsewhere (a log, a pipe) a
line now and then on stderr, so that a long run is seen to be alive."""

from __future__ import annotations

import sys
import time

#: Off a terminal, the most seconds between two progress lines (none before the first interval:
#: a short run prints nothing).
LOG_INTERVAL = 60.0


class StageProgress:
    """A ``callable(stage, fraction)`` that draws one tqdm bar on stderr when it is a terminal,
    and otherwise writes a line ``<description>: <percent> (<stage>)`` at most every
    ``log_interval`` seconds (None: never)."""

    def __init__(self, description: str, enabled: bool | None = None, log_interval: float | None = LOG_INTERVAL):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._bar = None
        self.description = description
        self.log_interval = log_interval
        self._last_line = time.monotonic()

    def __call__(self, stage: str, fraction: float) -> None:
        if not self.enabled:
            if self.log_interval is not None and time.monotonic() - self._last_line >= self.log_interval:
                self._last_line = time.monotonic()
                print(f"{self.description}: {100 * min(max(fraction, 0.0), 1.0):.0f}% ({stage})", file=sys.stderr,
                      flush=True)
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=1000, desc=self.description, file=sys.stderr, leave=False,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")
        self._bar.set_postfix_str(stage)
        self._bar.n = int(round(1000 * min(max(fraction, 0.0), 1.0)))
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
