"""Progress display for long command-line steps: tqdm on a terminal, silence otherwise."""

from __future__ import annotations

import sys


class StageProgress:
    """A ``callable(stage, fraction)`` that draws one tqdm bar on stderr when it is a terminal."""

    def __init__(self, description: str, enabled: bool | None = None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._bar = None
        self.description = description

    def __call__(self, stage: str, fraction: float) -> None:
        if not self.enabled:
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
