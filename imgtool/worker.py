"""One kind of background thread: a worker fed through a bounded queue, always ended and joined.

`Worker(target)` runs `target(feed)` on its own thread; the caller `put()`s items and gets what
target returned (or the exception it raised) from `result()`. Used as a context manager it ends
the feed and joins the thread on every exit path. A worker that stops early (an error, or it has
seen enough) keeps taking items off the queue until the feed ends, so a caller can never block on
a full queue: no sentinel rules per use, no polling, no thread left behind.
"""

import hashlib
import queue
import threading
from typing import Any, Callable, Generic, Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")
_END = object()

# The longest the main thread waits in one go for another thread. Python runs a signal's handler (Ctrl-C's
# KeyboardInterrupt) in the main thread at its next bytecode, and a SIGINT the kernel handed to another thread (a
# download's) does not wake a lock wait there: one unbroken wait held Ctrl-C until what it waited for came.
SIGNAL_SLICE = 0.25


def join(thread: threading.Thread) -> None:
    """`thread.join()` in slices, so Ctrl-C is handled while the main thread waits."""
    while thread.is_alive():
        thread.join(SIGNAL_SLICE)


class Feed:
    """The worker's end of the queue: iterate over the items, or `read()` bytes items like a file."""

    def __init__(self, maxsize: int):
        self._q: "queue.Queue[Any]" = queue.Queue(maxsize=maxsize)
        self._buf = memoryview(b"")
        self._ended = False

    def __iter__(self) -> Iterator[Any]:
        while not self._ended:
            item = self._q.get()
            if item is _END:
                self._ended = True
                return
            yield item

    def read(self, n: Optional[int] = -1) -> bytes:
        while not len(self._buf) and not self._ended:
            item = self._q.get()
            if item is _END:
                self._ended = True
            else:
                self._buf = memoryview(item)
        if n is None or n < 0:
            n = len(self._buf)
        out, self._buf = self._buf[:n], self._buf[n:]
        return bytes(out)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def _drain(self) -> None:
        self._buf = memoryview(b"")
        while not self._ended:
            if self._q.get() is _END:
                self._ended = True


class Worker(Generic[T]):
    """`target(feed)` on a thread of its own; `put()` feeds it, `result()` ends the feed and returns what
    target returned, raising what it raised."""

    def __init__(self, target: Callable[[Feed], T], name: str, maxsize: int = 4):
        self.feed = Feed(maxsize)
        self._target = target
        self._result: Optional[T] = None
        self._error: Optional[BaseException] = None
        self._closed = False
        # daemon: every path joins it (result, close, the context managers that own one), but Ctrl-C can land between
        # its start and the `with` that would end it (a _PartSink being built: issue 38's faster fetch got there
        # first, and the interpreter then waited at exit for a feed nobody would end); such a thread must not
        # hold the process
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._target(self.feed)
        except BaseException as e:  # handed to the caller by result()
            self._error = e
        finally:
            self.feed._drain()  # whoever feeds us must never block on a full queue

    @property
    def failed(self) -> bool:
        """True once target has raised (its error comes out of result())."""
        return self._error is not None

    def put(self, item: Any) -> None:
        if self._closed:
            raise ValueError("put() on a worker whose feed has ended")
        self.feed._q.put(item)

    def close(self) -> None:
        """End the feed (idempotent): target sees the end after the items already put."""
        if not self._closed:
            self._closed = True
            self.feed._q.put(_END)

    def result(self) -> T:
        """End the feed, wait for target, and return its result or raise its exception."""
        self.close()
        join(self._thread)
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def abandon(self) -> None:
        """End the feed and wait for target, discarding its result: for paths that already have an error."""
        self.close()
        join(self._thread)

    def __enter__(self) -> "Worker[T]":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
        join(self._thread)
        if exc_type is None and self._error is not None:
            raise self._error


def sha256_of(feed: Iterable[bytes]) -> str:
    """sha256 hex of the chunks of a feed: a Worker target (hashlib releases the GIL)."""
    sha = hashlib.sha256()
    for chunk in feed:
        sha.update(chunk)
    return sha.hexdigest()
