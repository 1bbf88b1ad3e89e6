"""The tests' zygote (tests/support/zygote.py): a call through it is the CLI's, and it leaves nothing behind."""

import os
import subprocess

from tests.support import zygote


def test_a_zygote_runs_the_cli_and_removes_its_socket_when_the_test_process_ends(tmp_path):
    z = zygote.Zygote(dict(os.environ))
    try:
        assert os.path.exists(z.path)
        done = z.run(["verify", str(tmp_path / "nothing")], dict(os.environ), timeout=60)
        assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stdout == ""
    finally:
        z.proc.stdin.close()  # as when the pytest process ends
        try:
            z.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            z.proc.kill()
            raise
    assert z.proc.returncode == 0
    assert not os.path.exists(z.dir), "the zygote left its directory in the temp dir"


def test_a_call_through_the_zygote_sees_the_directory_and_environment_a_new_interpreter_sees(tmp_path):
    """zygote.run stands in for `subprocess.run([python, "-m", "imgtool", ...], cwd=, env=)` in the test files'
    helpers: the relative path in the call's variable is read from `cwd`, as a new interpreter reads it."""
    import sys

    (tmp_path / "mirrors.toml").write_text("default_image = \n")
    env = {**os.environ, "IMGTOOL_MIRRORS": "mirrors.toml"}
    forked = zygote.run(["mirrors"], env=env, cwd=tmp_path, timeout=60)
    fresh = subprocess.run([sys.executable, "-m", "imgtool", "mirrors"], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=60)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert (fresh.returncode, fresh.stderr) == (2, "error: mirrors.toml: invalid TOML: Invalid value (at line 1, column 17)\n")
