"""A runtime's command-line tool run as a program (`ctr`, `podman`): with timeouts, decided on exit status.

The containerd and Podman rooms use this and nothing else to start their tools; it knows no tool's
words. Standard library only (the offline side runs on Python 3.7).
"""

import collections
import shutil
import subprocess
import threading
from typing import IO, Deque, Iterable, List, Mapping, Optional, Sequence, Tuple

from .errors import DaemonError, ProgramFailed, one_line

Process = subprocess.Popen  # a tool started with the terminal (Program.start), for the rooms' annotations
ProcessTimeout = subprocess.TimeoutExpired  # what waiting on a Process for too long raises
QUICK = 120.0  # a listing, a tag, an inspect: seconds before the tool is taken for hung
POISON = b"\xff" * 512  # not a tar header: ends an import we cut short in a failure, never in a success


class Program:
    """`argv` (the tool and its global options) as what a runtime room runs; `title` names the
    runtime in messages (containerd, Podman)."""

    def __init__(self, argv: Sequence[str], title: str, env: Optional[Mapping[str, str]] = None,
                 install_hint: str = ""):
        self.argv = list(argv)
        self.title = title
        self.env = dict(env) if env is not None else None
        if shutil.which(self.argv[0], path=(self.env or {}).get("PATH")) is None:
            raise DaemonError(f"cannot use {title}: the {self.argv[0]} command is not installed (not in PATH)",
                              hint=install_hint or None)

    def run(self, args: Sequence[str], timeout: float = QUICK, what: str = "") -> str:
        """The tool's stdout; raises ProgramFailed (non-zero exit), DaemonError (timeout, cannot start)."""
        return self._call(args, timeout, what, ok=(0,)).stdout.decode("utf-8", "replace")

    def outcome(self, args: Sequence[str], timeout: float, cwd: Optional[str] = None) -> str:
        """Run the tool for its effect, whatever its exit status (the caller checks the effect); returns its
        last line of output, or "exit status N". Raises DaemonError (timeout, cannot start)."""
        what = " ".join(args[:2])
        try:
            r = subprocess.run(self.argv + list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=timeout, env=self.env, cwd=cwd)
        except subprocess.TimeoutExpired:
            raise DaemonError(f"{self.title}: `{self.argv[0]} {what}` did not finish within {timeout:.0f} s",
                              hint=f"is {self.title} hung? check its service and log") from None
        except OSError as e:
            raise DaemonError(f"cannot run {self.argv[0]}: {e.strerror or e}") from e
        return _last_line(r.stderr) or _last_line(r.stdout) or f"exit status {r.returncode}"

    def status(self, args: Sequence[str], timeout: float = QUICK, what: str = "") -> int:
        """The tool's exit status, for questions it answers by status (`podman image exists`: 0 yes, 1 no);
        raises ProgramFailed for any other status, DaemonError (timeout, cannot start)."""
        return self._call(args, timeout, what, ok=(0, 1)).returncode

    def _call(self, args: Sequence[str], timeout: float, what: str, ok: Sequence[int]) -> "subprocess.CompletedProcess":
        what = what or " ".join(args[:2])
        try:
            r = subprocess.run(self.argv + list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=timeout, env=self.env)
        except subprocess.TimeoutExpired:
            raise DaemonError(f"{self.title}: `{self.argv[0]} {what}` did not finish within {timeout:.0f} s",
                              hint=f"is {self.title} hung? check its service and log") from None
        except OSError as e:
            raise DaemonError(f"cannot run {self.argv[0]}: {e.strerror or e}") from e
        if r.returncode not in ok:
            said = _ended(r.returncode, _last_line(r.stderr) or _last_line(r.stdout))
            raise ProgramFailed(f"{self.title}: `{self.argv[0]} {what}` failed: {said}", said, r.returncode,
                                said=_lines(r.stderr))
        return r

    def head(self, args: Sequence[str], limit: int, timeout: float = QUICK) -> Optional[bytes]:
        """The first `limit` bytes of the tool's stdout (fewer when it writes fewer), the tool then stopped (a blob's
        head, never the whole blob); None when it failed, or took longer than `timeout`, before writing them. Raises
        DaemonError (cannot start)."""
        try:
            proc = subprocess.Popen(self.argv + list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, env=self.env)
        except OSError as e:
            raise DaemonError(f"cannot run {self.argv[0]}: {e.strerror or e}") from e
        timer = threading.Timer(timeout, proc.kill)  # a hung tool: its pipe closes, the read ends
        timer.start()
        try:
            assert proc.stdout is not None
            data = proc.stdout.read(limit)
        finally:
            timer.cancel()
            timer.join()
            proc.kill()
            code = proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        return None if len(data) < limit and code != 0 else data

    def start(self, args: Sequence[str]) -> Process:
        """The tool started with this process's stdin, stdout and stderr (a container in the foreground:
        the terminal is the tool's); the caller waits for it. Raises DaemonError (cannot start)."""
        try:
            return subprocess.Popen(self.argv + list(args), env=self.env)
        except OSError as e:
            raise DaemonError(f"cannot run {self.argv[0]}: {e.strerror or e}") from e

    def feed(self, args: Sequence[str], chunks: Iterable[bytes], timeout: float, what: str) -> List[str]:
        """Run the tool with `chunks` as its stdin (never held whole); returns its output lines.

        When the chunks raise, the tool is sent a block that is no tar header and its stdin closed, so
        it fails on its own (releasing what it holds, as on any bad archive) before the error goes on.
        `timeout` counts from the last byte sent. Raises Failed, DaemonError, or what the chunks raised.
        """
        try:
            proc = subprocess.Popen(self.argv + list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=self.env)
        except OSError as e:
            raise DaemonError(f"cannot run {self.argv[0]}: {e.strerror or e}") from e
        said: Deque[str] = collections.deque(maxlen=200)
        reader = threading.Thread(target=_collect, args=(proc.stdout, said), name=f"{self.argv[0]}-output",
                                  daemon=True)
        reader.start()
        stdin = proc.stdin
        assert stdin is not None
        try:
            try:
                for chunk in chunks:
                    stdin.write(chunk)
            except BrokenPipeError:
                pass  # the tool stopped reading: its exit status and words say why
            except BaseException:
                _poison(stdin)
                _finish(proc, reader, timeout, self.argv[0])
                raise
            try:
                stdin.close()
            except BrokenPipeError:
                pass
            code = _finish(proc, reader, timeout, self.argv[0])
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lines = [line for line in said if line]
        if code != 0:
            last = _ended(code, next((line for line in reversed(lines) if line.strip()), ""))
            raise ProgramFailed(f"{self.title}: `{self.argv[0]} {what}` failed: {one_line(last)}", last, code)
        return lines


def _collect(stream: IO[bytes], into: Deque[str]) -> None:
    for raw in iter(stream.readline, b""):
        into.append(raw.decode("utf-8", "replace").rstrip())
    stream.close()


def _poison(stdin: IO[bytes]) -> None:
    try:
        stdin.write(POISON)
        stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _finish(proc: "subprocess.Popen", reader: threading.Thread, timeout: float, tool: str) -> int:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise DaemonError(f"`{tool}` did not finish within {timeout:.0f} s after the archive was sent; "
                          "stopped it") from None
    reader.join(timeout=30)
    return code


def _ended(code: int, last: str) -> str:
    """How a tool that failed ended, in words: killed by a signal (what it printed last was progress, not a reason;
    a shell in between reports 128 + the signal), else its last line of output, else its exit status."""
    import signal

    number = -code if code < 0 else code - 128 if 128 < code <= 128 + 64 else 0
    if number:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by {name}" + ("" if code < 0 else f" (exit status {code})")
    return last or f"exit status {code}"


SAID_LINES = 64  # of a failed tool's error output, kept for the room that reads it (ProgramFailed.said)


def _lines(data: bytes) -> Tuple[str, ...]:
    """The last SAID_LINES non-empty lines of a tool's output, each stripped."""
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return tuple(lines[-SAID_LINES:])


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return one_line(lines[-1]) if lines else ""
