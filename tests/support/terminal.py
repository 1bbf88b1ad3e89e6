"""A command run on a pseudo-terminal, as a person at a shell would: `imgtool run` on a terminal."""

import os
import select
import signal
import time
from typing import Dict, List, Tuple

SESSION = b"tty; echo $((6 * 7)); exit 3\r"  # typed at the container's shell prompt


def session_on_a_terminal(argv: List[str], env: Dict[str, str], prompt: bytes = b"# ",
                          typed: bytes = SESSION) -> Tuple[bytes, bool, int]:
    """Run argv with a terminal on stdin and stdout, type `typed` once `prompt` shows; returns (everything
    the terminal showed, whether it was typed, the exit code). A child still running after 60 s of
    session and 30 s of ending is killed (the exit code is then -9's)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command with a terminal on stdin and stdout
        os.execvpe(argv[0], argv, env)
    out, sent, deadline = b"", False, time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            if not sent and prompt in out:
                os.write(fd, typed)
                sent = True
    finally:
        for _ in range(300):  # the command still reads the exit code and removes the container
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        os.close(fd)
    return out, sent, os.waitstatus_to_exitcode(status)
