"""Progress reporting behind a small interface, so core code never imports tqdm.

Modes: `tty` (tqdm bars on stderr), `plain` (a line every few seconds, for logs and
pipes), `quiet` (nothing). Core code receives a `Progress` and calls `bar()`/`note()`.
"""

import sys
import threading
import time
from typing import Optional

from .model import format_size

from .text import for_terminal


class Bar:
    """A byte or item counter; `update(n)` is thread-safe."""

    def update(self, n: int) -> None:  # pragma: no cover - interface
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Progress:
    """Quiet progress: every method is a no-op. The base of the other modes."""

    def bar(self, total: Optional[int], desc: str, unit: str = "B") -> Bar:
        return Bar()

    def note(self, message: str) -> None:
        """An informational line (stderr), suppressed by --quiet."""

    def warn(self, message: str) -> None:
        """A warning line (stderr); shown even with --quiet."""
        _say(f"warning: {for_terminal(message)}")


_SAYING = threading.Lock()


def _say(line: str) -> None:
    """One whole line on stderr. print() writes the text and its newline in two writes, and a line another thread
    wrote between them tore both (CI saw "... (pid 26565)59c87f622551: done (90.9 KiB)")."""
    with _SAYING:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


class _PlainBar(Bar):
    def __init__(self, total, desc, unit, interval):
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.done = 0
        self.start = self.last = time.monotonic()
        self.lock = threading.Lock()

    def _fmt(self, n):
        return format_size(n) if self.unit == "B" else f"{n}"

    def _line(self):
        elapsed = max(time.monotonic() - self.start, 1e-6)
        total = f"/{self._fmt(self.total)}" if self.total else ""
        rate = f" {format_size(int(self.done / elapsed))}/s" if self.unit == "B" else ""
        _say(f"{self.desc}: {self._fmt(self.done)}{total}{rate}")

    def update(self, n):
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last >= self.interval:
                self.last = now
                self._line()

    def close(self):
        with self.lock:
            if self.done:
                self._line()
            self.done = 0


class PlainProgress(Progress):
    """Periodic plain lines on stderr, for non-TTY output."""

    def __init__(self, interval: float = 5.0):
        self.interval = interval

    def bar(self, total, desc, unit="B"):
        return _PlainBar(total, desc, unit, self.interval)

    def note(self, message):
        _say(for_terminal(message))


class _TqdmBar(Bar):
    def __init__(self, bar):
        self._bar = bar
        self._lock = threading.Lock()

    def update(self, n):
        with self._lock:
            self._bar.update(n)

    def close(self):
        self._bar.close()


class TtyProgress(PlainProgress):
    """tqdm bars on stderr."""

    def bar(self, total, desc, unit="B"):
        from tqdm import tqdm

        scale = unit == "B"
        return _TqdmBar(
            tqdm(total=total, desc=desc, unit="B" if scale else unit, unit_scale=scale, unit_divisor=1024 if scale else 1000,
                 file=sys.stderr, leave=False, dynamic_ncols=True)
        )

    def note(self, message):
        from tqdm import tqdm

        tqdm.write(for_terminal(message), file=sys.stderr)

    def warn(self, message):
        """Above the bars, as a note (a print would land inside a bar's line and tear it)."""
        from tqdm import tqdm

        tqdm.write(f"warning: {for_terminal(message)}", file=sys.stderr)


def choose(quiet: bool) -> Progress:
    """The progress mode for this run: quiet, tqdm on a TTY, plain lines otherwise."""
    if quiet:
        return Progress()
    if sys.stderr.isatty() and _tqdm_runs():
        return TtyProgress()
    return PlainProgress()


def _tqdm_runs() -> bool:
    """tqdm 4.70 needs Python 3.8+: imgtool.pyz on Kylin's 3.7 prints plain lines instead of bars."""
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True
