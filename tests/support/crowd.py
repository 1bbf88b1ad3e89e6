"""A crowd of hostile clients for a server under test, as a hundred nodes' worst look: some connect and say
nothing, some send a request line and then one header line a second (never the end), some ask for a big blob and
read one byte a second. One thread drives every socket with a selector (300 sockets cost one thread); a
connection the server closes is opened again at the next second, so the crowd stays whole while it runs.
Used by tests/test_serve.py and scripts/bench_crowd.py."""

import selectors
import socket
import threading
import time
from typing import Dict, List, Tuple

IDLE, DRIP, SLOW = "idle", "drip", "slow"


class Crowd:
    """`with Crowd(host, port, blob_path, idle=100, drip=100, slow=100) as crowd:` the crowd is connected (the slow
    readers' requests sent) on entry, driven until exit, every socket closed and the thread joined on exit."""

    def __init__(self, host: str, port: int, blob_path: str, idle: int = 100, drip: int = 100, slow: int = 100,
                 tick: float = 1.0):
        self.address = (host, port)
        self.blob_path = blob_path
        self.tick = tick
        self.kinds = [IDLE] * idle + [DRIP] * drip + [SLOW] * slow
        self.socks: Dict[int, Tuple[str, socket.socket]] = {}  # slot -> (kind, socket)
        self.reopened = {IDLE: 0, DRIP: 0, SLOW: 0}
        self.read = 0  # bytes the slow readers took
        self.ticks = 0  # rounds driven (one a tick)
        self._ticked = threading.Condition()
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="crowd")
        self._error: List[BaseException] = []

    def __enter__(self) -> "Crowd":
        try:
            for slot, kind in enumerate(self.kinds):
                self._open(slot, kind)
        except BaseException:
            self._close_all()
            raise
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._wake_w.send(b"x")
        self._thread.join()
        self._close_all()
        if self._error and exc[0] is None:
            raise self._error[0]

    def open_now(self) -> int:
        return len(self.socks)

    def wait_ticks(self, n: int, timeout: float = 30.0) -> None:
        """Until the crowd has been driven n rounds since it connected (a pull on a quiet machine can end sooner)."""
        with self._ticked:
            if not self._ticked.wait_for(lambda: self.ticks >= n or bool(self._error), timeout):
                raise TimeoutError(f"the crowd drove {self.ticks} of {n} rounds in {timeout} s")

    def _open(self, slot: int, kind: str) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if kind == SLOW:  # a small window: the server's answer stalls on this reader at once
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(10)
            s.connect(self.address)
            if kind == SLOW:
                s.sendall(f"GET {self.blob_path} HTTP/1.1\r\nHost: crowd\r\n\r\n".encode())
            elif kind == DRIP:
                s.sendall(b"GET /v2/ HTTP/1.1\r\n")
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        self.socks[slot] = (kind, s)
        if kind != SLOW:  # readable: the server closed it (the slow readers find out when they read)
            self.sel.register(s, selectors.EVENT_READ, slot)

    def _drop(self, slot: int) -> None:
        kind, s = self.socks.pop(slot)
        if kind != SLOW:
            self.sel.unregister(s)
        s.close()

    def _close_all(self) -> None:
        for slot in list(self.socks):
            self._drop(slot)
        self.sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        try:
            n = 0
            due = time.monotonic() + self.tick
            while True:
                for key, _ in self.sel.select(max(due - time.monotonic(), 0)):
                    if key.data is None:
                        return
                    self._drop(key.data)  # closed by the server: opened again at the next tick
                if time.monotonic() < due:
                    continue
                due += self.tick
                n += 1
                for slot, kind in enumerate(self.kinds):
                    if slot not in self.socks:
                        try:
                            self._open(slot, kind)
                            self.reopened[kind] += 1
                        except OSError:
                            pass  # the next tick tries again
                        continue
                    s = self.socks[slot][1]
                    try:
                        if kind == DRIP:
                            s.send(f"X-Drip-{n}: x\r\n".encode())
                        elif kind == SLOW:
                            got = s.recv(1)
                            if not got:
                                raise ConnectionError
                            self.read += 1
                    except BlockingIOError:
                        pass
                    except OSError:
                        self._drop(slot)
                with self._ticked:
                    self.ticks = n
                    self._ticked.notify_all()
        except BaseException as e:  # re-raised by __exit__
            self._error.append(e)
