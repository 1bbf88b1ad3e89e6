"""glibc's malloc is tuned only for the verbs measured with it (fetch, export: imgtool/memory.py says why)."""

import subprocess
import sys

# imgtool's entry point run in-process, then the names of the threads still alive
RUN = ("import sys, threading; from imgtool.commands.main import main\n"
       "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
       "print(code, sorted(t.name for t in threading.enumerate()))")


def threads_after(*argv, env=None):
    r = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    code, _, names = r.stdout.strip().splitlines()[-1].partition(" ")
    return code, names


def test_help_and_the_offline_verbs_start_no_thread_of_their_own(tmp_path):
    assert threads_after("--help") == ("0", "['MainThread']")
    code, names = threads_after("verify", str(tmp_path))  # no bundle.json there: refused, exit 3
    assert (code, names) == ("3", "['MainThread']")


def test_export_runs_with_the_trimming_thread(tmp_path):
    import os

    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    code, names = threads_after("export", "busybox:latest", "-o", str(tmp_path / "out"), env=env)
    assert code == "5"  # no Docker there
    assert "malloc-trim" in names
