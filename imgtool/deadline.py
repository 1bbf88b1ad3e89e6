"""Every wait ends: a deadline for a registry's answer, and a minimum rate for a blob's body.

A read timeout bounds one recv. A server sending a byte every few seconds never trips it, and a status line
and headers are read by the transport (http.client, under urllib3 or registry_http) in a loop of recvs that
no caller regains control in. So an answer's connection is watched: when its deadline passes, one watchdog
thread shuts the connection's socket down, which ends the blocked read at once, and the registry room turns
the transport's error into "answered too slowly" (`Watch.expired`). The thread runs while something is
watched and ends when nothing is; it waits on a condition for the earliest deadline, never polls.

A body the caller reads in its own loop is held to a rule there, without the thread: a small answer to the
rest of its deadline, a blob to `Rate` (bytes per second of time spent waiting for it, so a slow disk on
our side never counts against the source, and a 3 GB layer on a slow but honest link is never cut).

The transports call `attach(connection)` as a request is sent on a connection (and again once it is
connected): registry.py hooks urllib3's connection classes, and gives registry_http's Session the same
function. Stdlib only, Python 3.7.
"""

import heapq
import socket
import threading
import time
from typing import Any, Iterator, List, Optional, Tuple
from contextlib import contextmanager

_current = threading.local()


class Watch:
    """One answer's deadline, `seconds` from now, and the connection it arrives on."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.due = time.monotonic() + seconds
        self.expired = False
        self._conn: Any = None
        self._done = False
        self._lock = threading.Lock()

    def attach(self, conn: Any) -> None:
        with self._lock:
            if self._done:
                return
            self._conn = conn
            if self.expired:  # it passed while connecting: nothing was there to shut yet
                _shut(conn)

    def expire(self) -> None:
        """The deadline passed: shut the connection (unless the answer is in)."""
        with self._lock:
            if self._done:
                return
            self.expired = True
            if self._conn is not None:
                _shut(self._conn)

    def finish(self) -> None:
        """The answer is in (or given up on): the connection is no longer ours to shut."""
        with self._lock:
            self._done = True
            self._conn = None


def _shut(conn: Any) -> None:
    """End every read and write on a connection's socket now. socket.socket's own shutdown, also for TLS: the
    SSLSocket's would drop the TLS object under the thread reading it."""
    sock = getattr(conn, "sock", None)
    if sock is None:
        return
    try:
        if isinstance(sock, socket.socket):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        else:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass  # closed already


class _Watchdog:
    """The one thread expiring watches, alive while any is watched."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: List[Tuple[float, int, Watch]] = []
        self._count = 0
        self._live = 0
        self._thread: Optional[threading.Thread] = None

    def add(self, watch: Watch) -> None:
        with self._cond:
            self._count += 1
            self._live += 1
            heapq.heappush(self._heap, (watch.due, self._count, watch))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="imgtool-deadlines", daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def remove(self, watch: Watch) -> None:
        watch.finish()
        with self._cond:
            self._live -= 1
            if self._live == 0:
                self._heap.clear()
                self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while self._heap:
                due, _, watch = self._heap[0]
                now = time.monotonic()
                if due > now:
                    self._cond.wait(due - now)
                    continue
                heapq.heappop(self._heap)
                watch.expire()
            self._thread = None


_watchdog = _Watchdog()


@contextmanager
def watching(seconds: float) -> Iterator[Watch]:
    """Watch the connection this thread sends its next request on (and any it is redirected to) for
    `seconds`; leaving the block ends the watch."""
    watch = Watch(seconds)
    _watchdog.add(watch)
    _current.watch = watch
    try:
        yield watch
    finally:
        _current.watch = None
        _watchdog.remove(watch)


def attach(conn: Any) -> None:
    """A transport sends this thread's request on `conn` (connected, or about to connect)."""
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.attach(conn)


class Rate:
    """A body's minimum rate: at least `floor` bytes a second over each `window` seconds spent waiting for it."""

    def __init__(self, floor: int, window: float):
        self.floor, self.window = floor, window
        self._got = 0
        self._waited = 0.0

    def add(self, n: int, waited: float) -> Optional[Tuple[int, float]]:
        """`n` bytes came after `waited` seconds; (bytes, seconds) of a window that fell short, else None."""
        self._got += n
        self._waited += waited
        if self._waited < self.window:
            return None
        got, spent = self._got, self._waited
        self._got, self._waited = 0, 0.0
        return (got, spent) if got < self.floor * spent else None
