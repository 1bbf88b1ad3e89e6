"""`python -m imgtool ARGS` for the tests, without paying the interpreter's start and imgtool's imports each time.

Every call of `tests.support.bundles.imgtool` used to start a Python that imported the CLI: ~0.15 s of CPU, half of
what the average call costs, ~1500 times a suite on a 2-core machine. A zygote (one per pytest process) imports
`imgtool.cli` and every other imgtool module (and so requests, docker-py, ssl: what a verb imported as it ran, another
0.1 s a call) once; each call is a fork of it that becomes the CLI process as `python -m imgtool` makes it: its own
argv (`runpy`, as -m runs it), environment, working directory, stdin/stdout/stderr and exit status (a signal's
death reported as subprocess does, -N). Nothing imgtool does differs: it runs in a process of its own, started
from a Python in which its modules were already imported (none of them reads the environment when imported).

A real `python -m imgtool` is used instead when the call's environment differs in what Python reads only when it
starts (PYTHON*, LANG, LC_*: the encoding of stdout and files), when `IMGTOOL_TEST_FORK=0`, or where the zygote
cannot start. The tests that are about the entry point itself (the pyz, the installed launcher, Ctrl-C) start
their own process, as before.
"""

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, Optional, Sequence

# What Python reads from the environment only as it starts: a call that changes these gets a real interpreter.
_AT_START = ("PYTHON", "LANG", "LC_")

_ZYGOTE = r'''
import json, os, runpy, select, signal, socket, sys, traceback
import imgtool.cli  # noqa: F401  what every call would import first
import imgtool.commands.main as _m
for _name in _m.cli.list_commands(None):  # and each verb's module
    _m.cli.get_command(None, _name)
import importlib, pkgutil, imgtool
# and every module a verb imports as it runs (requests, urllib3, ssl, docker-py, the pipeline: ~250 modules, the
# bulk of a small call's CPU, measured: 0.15-0.33 s a call, ~1500 calls a suite); __main__ would run the CLI
for _mod in pkgutil.walk_packages(imgtool.__path__, "imgtool."):
    if not _mod.name.endswith("__main__"):
        importlib.import_module(_mod.name)

def _exit_code(e):
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(str(code) + "\n")
    return 1

def _cli(req, fds):
    os.setpgid(0, 0)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = ["-m", *req["args"]]
    code = 0
    try:
        runpy.run_module("imgtool", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        import threading, atexit
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 120
    os._exit(code)

def _watch(conn, req, fds):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote's SIG_IGN would reap the CLI before waitpid
    pid = os.fork()
    if pid == 0:
        conn.close()
        _cli(req, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(b"%d\n" % pid)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    conn.sendall(b"%d\n" % code)
    os._exit(0)

def _serve(path):
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # each watcher is reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready:
            return  # the test process ended
        conn, _ = listener.accept()
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        req = json.loads(msg)
        if os.fork() == 0:
            listener.close()
            _watch(conn, req, fds)
        conn.close()
        for fd in fds:
            os.close(fd)

try:
    _serve(sys.argv[1])
finally:  # the test process ended (or the zygote failed): its socket and directory go with it
    os.unlink(sys.argv[1])
    os.rmdir(os.path.dirname(sys.argv[1]))
'''


class Zygote:
    """One per test process (`get()`); `run()` is subprocess.run(capture_output=True, text=True) of the CLI."""

    def __init__(self, env: Dict[str, str]):
        # what Python reads as it starts is this process's own; the rest is the first call's (read by nothing at
        # import): a first call that sets PYTHONPATH must not leave every later call without the zygote
        self.env = {k: v for k, v in env.items() if not k.startswith(_AT_START)}
        self.env.update((k, v) for k, v in os.environ.items() if k.startswith(_AT_START))
        self.dir = tempfile.mkdtemp(prefix="imgtool-zygote-")
        self.path = os.path.join(self.dir, "socket")
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE, self.path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=self.env, cwd="/", text=True)
        if self.proc.stdout.readline() != "ready\n":
            raise RuntimeError("the imgtool zygote did not start")

    def serves(self, env: Dict[str, str]) -> bool:
        def at_start(e):
            return {k: v for k, v in e.items() if k.startswith(_AT_START)}

        return self.proc.poll() is None and at_start(env) == at_start(self.env)

    def run(self, args: Sequence[str], env: Dict[str, str], timeout: Optional[float],
            cwd: Optional[str] = None) -> subprocess.CompletedProcess:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            req = json.dumps({"args": list(args), "env": env, "cwd": os.path.abspath(cwd or os.getcwd())}).encode()
            socket.send_fds(conn, [req], [0, out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        reply = conn.makefile("rb")
        pid = int(reply.readline())
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            out, err = _collect(out_r, err_r, deadline)
        except subprocess.TimeoutExpired:
            _kill(pid)
            raise subprocess.TimeoutExpired([sys.executable, "-m", "imgtool", *args], timeout or 0) from None
        finally:
            os.close(out_r)
            os.close(err_r)
        code = int(reply.readline())
        conn.close()
        return subprocess.CompletedProcess([sys.executable, "-m", "imgtool", *args], code,
                                           out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _collect(out_r: int, err_r: int, deadline: Optional[float]):
    """Both pipes read to their end (whoever still holds a write end keeps them open, as with communicate)."""
    chunks: Dict[int, list] = {out_r: [], err_r: []}
    with selectors.DefaultSelector() as sel:
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("imgtool", 0)
            for key, _ in sel.select(left):
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
    return b"".join(chunks[out_r]), b"".join(chunks[err_r])


_lock = threading.Lock()
_zygote: Optional[Zygote] = None
_failed = False


def get(env: Dict[str, str]) -> Optional[Zygote]:
    """This process's zygote when it can run a call with `env`, else None (run a real interpreter)."""
    global _zygote, _failed
    if os.environ.get("IMGTOOL_TEST_FORK", "1") == "0" or sys.version_info < (3, 9) or _failed:
        return None
    with _lock:
        if _zygote is None or _zygote.proc.poll() is not None:
            try:
                _zygote = Zygote(env)
            except (OSError, RuntimeError):
                _failed = True
                return None
        return _zygote if _zygote.serves(env) else None


def run(args: Sequence[str], env: Optional[Dict[str, str]] = None, cwd=None,
        timeout: Optional[float] = None) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, "-m", "imgtool", *args], capture_output=True, text=True, env=env, cwd=cwd,
    timeout=timeout)`, through this process's zygote where it can run the call: the test files' own helpers that
    ran a new interpreter for each call (~0.25 CPU s of start and imports each, ~330 calls in the fast tier alone)."""
    env = dict(os.environ if env is None else env)
    forked = get(env)
    if forked is not None:
        return forked.run(args, env, timeout, None if cwd is None else str(cwd))
    return subprocess.run([sys.executable, "-m", "imgtool", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout)
