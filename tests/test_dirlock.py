"""imgtool.dirlock: a bundle directory's lock, released by the kernel however its holder ends."""

import os
import signal
import subprocess
import sys

import pytest

from imgtool.dirlock import DirectoryBusy, lock_output, lock_served


def test_a_killed_holder_leaves_no_lock_to_remove_by_hand(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from imgtool.dirlock import lock_output; lock = lock_output(Path(sys.argv[1]), 'export'); "
                               "print('held', flush=True); sys.stdin.read()", str(out)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryBusy) as e:
            lock_output(out, "fetch")
        assert e.value.message == f"{out} is being written by imgtool export (pid {holder.pid}); nothing was done"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert (out / ".imgtool-lock").exists()  # what the killed run left: taken over, not refused
    with lock_output(out, "fetch"):
        pass
    assert list(out.iterdir()) == []  # the lock file went with the lock
    with lock_output(tmp_path / "new", "fetch"):
        pass
    assert not (tmp_path / "new").exists()  # made by the lock and left empty: removed with it


def test_servers_share_a_directory_and_the_last_one_removes_the_lock(tmp_path):
    first, second = lock_served(tmp_path), lock_served(tmp_path)
    assert first is not None and second is not None
    with pytest.raises(DirectoryBusy) as e:
        lock_output(tmp_path, "fetch")
    assert e.value.message == f"{tmp_path} is being served by imgtool serve (pid {os.getpid()}); it was not changed"
    first.release()
    assert (tmp_path / ".imgtool-lock").exists()  # the other server's lock stays
    second.release()
    assert not (tmp_path / ".imgtool-lock").exists()
    with lock_output(tmp_path, "fetch"):
        with pytest.raises(DirectoryBusy):
            lock_served(tmp_path)
    assert tmp_path.is_dir()  # it was there before: kept
