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



TEARING = """
import sys, threading
sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: a torn line shows at once
from imgtool import progress
plain = progress.PlainProgress(interval=0.0)
bar = plain.bar(None, "download")
def say(n):
    for i in range(1000):
        plain.note("thread %d line %d" % (n, i))
        bar.update(1)
threads = [threading.Thread(target=say, args=(n,)) for n in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_lines_from_many_threads_never_tear():
    """Downloads report from their own threads: each note and bar line reaches stderr (a pipe, as in CI and under
    a log collector) whole, never with another thread's text between it and its newline (print() wrote the two
    separately; CI saw "... (pid 26565)59c87f622551: done (90.9 KiB)"; hundreds of torn lines in this test)."""
    import re
    import subprocess

    r = subprocess.run([sys.executable, "-c", TEARING], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    notes = [x for x in lines if x.startswith("thread ")]
    bar = re.compile(r"download: [\d.]+ (?:B|KiB|MiB) [\d.]+ (?:B|KiB|MiB)/s")
    assert [x for x in lines if not re.fullmatch(r"thread \d line \d+", x) and not bar.fullmatch(x)] == []
    assert sorted(notes) == sorted(f"thread {n} line {i}" for n in range(6) for i in range(1000))
