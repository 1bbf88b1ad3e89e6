"""progress.py: a warning on a terminal is printed above the bars, as a note is, never into a bar's line."""

import io
import sys

from imgtool import progress


def test_a_warning_on_a_terminal_is_a_line_of_its_own_above_the_bars(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    tty = progress.TtyProgress()
    with tty.bar(100, "blob") as bar:
        bar.update(10)
        tty.warn("careful")
        tty.note("noted")
        bar.update(10)
    shown = [line.rsplit("\r", 1)[-1] for line in err.getvalue().split("\n")]  # what each line ends up showing
    assert "warning: careful" in shown and "noted" in shown, err.getvalue()
