"""A download's sources: how many connections each may have at once (`Slots`, shared by every image), which
are still healthy (`SourcePool`), and one range's failures on them (`Retries`: which source next, when one is
dropped, how long to back off by its client's RetryPolicy). puller.py's scheduler asks them; they move no byte.

A source is anything of `BlobSource`'s shape: a registry mirror (mirrors.Source) or a model hub's endpoint
(hubs.HubSource), each opening a blob's bytes [start, end) as a `BlobStream`.
"""

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Collection, Dict, Iterator, Optional, Sequence, Set

from .errors import NotFoundError, RegistryError, RegistryUnavailable
from .model import Digest

if TYPE_CHECKING:  # typing.Protocol is Python 3.8's
    from typing import Protocol

    from .registry_answers import BlobStream, RetryPolicy

    class BlobClient(Protocol):
        """What opens a source's blobs: one try of a range (`retry=False`: the puller retries by `retry`)."""

        retry: RetryPolicy

        def blob(self, repository: str, digest: Digest, start: int = 0, end: Optional[int] = None, *,
                 retry: bool = True) -> BlobStream: ...

    class BlobSource(Protocol):
        """One endpoint a download may take a blob's bytes from."""

        @property
        def name(self) -> str: ...

        @property
        def repository(self) -> str: ...

        @property
        def client(self) -> BlobClient: ...

        def describe(self) -> str: ...



class Slots:
    """The connections each source may have at once (`per_source`, --connections), shared by every image's pool:
    a source is one endpoint however many images it serves.

    A source that answers 429 or 503 while others of its connections are downloading from it is asking
    for fewer (a mirror's per-client connection limit): `slow_down` lowers its cap to the connections
    still downloading, for the rest of the run, instead of counting a failure that would drop the source.
    A source refusing every connection (down, or restarting) is failing, not limiting: no lowering."""

    def __init__(self, per_source: int):
        self.per_source = per_source
        self.cap: Dict[str, int] = {}
        self.busy: Dict[str, int] = {}
        self.flowing: Dict[str, int] = {}  # connections receiving a blob's bytes from the source now
        self.cond = threading.Condition()

    def in_use(self, name: str) -> int:
        with self.cond:
            return self.busy.get(name, 0)

    @contextmanager
    def hold(self, name: str) -> Iterator[None]:
        """One of the source's connections, waiting for one to be free."""
        with self.cond:
            while self.busy.get(name, 0) >= self.cap.get(name, self.per_source):
                self.cond.wait()
            self.busy[name] = self.busy.get(name, 0) + 1
        try:
            yield
        finally:
            with self.cond:
                self.busy[name] -= 1
                self.cond.notify_all()

    @contextmanager
    def receiving(self, name: str) -> Iterator[None]:
        """A connection of the source is receiving an answer's bytes (the source said yes to it)."""
        with self.cond:
            self.flowing[name] = self.flowing.get(name, 0) + 1
        try:
            yield
        finally:
            with self.cond:
                self.flowing[name] -= 1

    def slow_down(self, name: str) -> Optional[int]:
        """The source refused a connection's request with 429/503 (that connection's slot is released): its
        cap becomes the connections still receiving from it. Returns the new cap, or None when none is
        (the refusal is then a failure like any other)."""
        with self.cond:
            others = self.flowing.get(name, 0)
            cap = self.cap.get(name, self.per_source)
            if others < 1 or cap <= 1:
                return None
            self.cap[name] = min(cap - 1, others)
            return self.cap[name]


class SourcePool:
    """Healthy sources, their connections counted in the shared `Slots`; a failing source is dropped for
    the run."""

    def __init__(self, sources: Sequence["BlobSource"], slots: Slots):
        self.sources = list(sources)
        self.slots = slots
        self.dead: Dict[str, str] = {}
        self.last_error: Dict[str, str] = {}
        self.lock = threading.Lock()

    def pick(self, preferred: int, exclude: Collection[str] = ()) -> "BlobSource":
        """The live source (outside `exclude` while any is) with the fewest connections in use, the one at
        `preferred` (modulo) among equals; raises RegistryError when every source is dead."""
        with self.lock:
            live = [s for s in self.sources if s.name not in self.dead and s.name not in exclude]
            if not live:
                live = [s for s in self.sources if s.name not in self.dead]
        if not live:
            detail = "; ".join(f"{s.describe()}: {self.last_error.get(s.name) or self.dead.get(s.name) or 'failed'}"
                               for s in self.sources)
            raise RegistryError(f"every source failed: {detail}",
                                hint="check the network, or retry later: finished layers are kept in the cache")
        start = preferred % len(live)
        return min(live[start:] + live[:start], key=lambda s: self.slots.in_use(s.name))

    def fail(self, source: "BlobSource", error: str, fatal: bool) -> None:
        with self.lock:
            self.last_error[source.name] = error
            if fatal:
                self.dead[source.name] = error


def asks_for_fewer(error: RegistryError) -> bool:
    """429 Too Many Requests or 503 Service Unavailable: what a server limiting each client's connections
    answers (nginx's limit_conn: 503)."""
    return isinstance(error, RegistryUnavailable) and error.status in (429, 503)


def struck_out(failures: int, attempts: int) -> bool:
    """Whether a range's `failures`-th failure drops the source it happened on, for the run.

    Every `attempts`-th one does (the registry room's RetryPolicy: a request is tried that often). Failures
    are counted per range, not per source: each one also moves the range's next try to the next live
    source, so with one source its fourth failure for a range drops it, and with several, whichever fails
    the range the fourth, eighth, ... time is dropped. A single reset only costs a retry.
    """
    return failures % attempts == 0


class Retries:
    """One range's failures: which source to try next, which ones it no longer tries, how long to back off
    (by the source's RetryPolicy, the one the registry client applies to its own requests)."""

    def __init__(self, pool: SourcePool):
        self.pool = pool
        self.failures = 0
        self.out: Set[str] = set()

    def next_source(self, preferred: int) -> "BlobSource":
        """Raises RegistryError when every source of the pool is dead."""
        return self.pool.pick(preferred + self.failures, exclude=self.out)

    def not_found(self, source: "BlobSource", error: NotFoundError, digest: Digest) -> None:
        """`source` does not have the blob: the others are asked; raises RegistryError once none has it."""
        self.out.add(source.name)
        self.pool.fail(source, error.message, fatal=False)
        if len(self.out) >= len(self.pool.sources):
            raise RegistryError(f"blob {digest.short} is on no source: {error.message}") from error

    def failed(self, source: "BlobSource", error: RegistryError) -> float:
        """A failure on `source` (it may strike out); returns the seconds to wait before the next try: the
        policy's back-off, or the `Retry-After` the registry asked for."""
        policy = source.client.retry
        self.failures += 1
        fatal = struck_out(self.failures, policy.attempts)
        self.pool.fail(source, error.message, fatal=fatal)
        if fatal:
            self.out.add(source.name)
        retry_after = error.retry_after if isinstance(error, RegistryUnavailable) else None
        return policy.delay(self.failures - 1, retry_after)
