"""A tiny progress bar on stderr for long work (sweeps), silent when stderr is
not a terminal (CI logs, pipes, tests), so it never pollutes captured output."""

import sys
import time


class Progress:
    """``with Progress(n, "sweep") as bar: ... bar.advance("label")``."""

    WIDTH = 24

    def __init__(self, total: int, label: str = "", stream=None) -> None:
        self.total = max(int(total), 0)
        self.label = label
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self._start = time.monotonic()

    def __enter__(self) -> "Progress":
        self._draw("")
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def advance(self, note: str = "", steps: int = 1) -> None:
        self.done = min(self.done + steps, self.total)
        self._draw(note)

    def _draw(self, note: str) -> None:
        if not self.enabled:
            return
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self.WIDTH))
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        elapsed = time.monotonic() - self._start
        text = (f"\r{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.0f}s "
                f"{note[:60]}")
        self.stream.write(text.ljust(110))
        self.stream.flush()
