"""scripts/durations.py: the tables docs/testing.md keeps, read from test.sh's --durations output."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "durations.py"

LOG = """\
test.sh: the fast tier (tests that need no service) on 2 workers
============================== slowest durations ===============================
2.50s call     tests/test_model.py::test_a
0.50s setup    tests/test_model.py::test_a
1.00s call     tests/test_cli.py::test_b
496 passed in 120.40s (0:02:00)
test.sh: the services tier on 2 workers, one set of services each
============================== slowest durations ===============================
30.00s call     tests/test_load.py::test_c[20.10]
10.00s call     tests/test_load.py::test_c[podman-4.3]
5.00s teardown tests/test_selfbundle.py::test_d[podman-4.3-3.7]
=================== 1 failed, 501 passed, 1 warning in 300.00s (0:05:00) ===================
"""


def test_the_tiers_modules_runtimes_and_slowest_tests(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(LOG)
    r = subprocess.run([sys.executable, str(SCRIPT), str(log), "--top", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "| fast tier | 120 s | 2 | 4 s |" in out
    assert "| services tier | 300 s | 3 | 45 s |" in out
    assert "| **all** | **420 s** | 5 | 49 s |" in out
    assert "| tests/test_load.py | 40 s |\n| tests/test_selfbundle.py | 5 s |\n\n" in out  # --top 2
    assert "| 20.10 | 30 s |" in out and "| podman-4.3 | 15 s |" in out and "| (none) | 4 s |" in out
    assert "| `tests/test_load.py::test_c[20.10]` | 30.0 s |\n| `tests/test_load.py::test_c[podman-4.3]` | 10.0 s |" in out


def test_a_log_without_a_summary_is_one_line_and_exit_1(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("services: up\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(log)], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"{log}: no pytest summary line found\n")
