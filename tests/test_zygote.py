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
