"""A resolved image's blobs into the store, concurrently, without a daemon.

`download` brings every missing blob into the store: big blobs split into ranges fetched in
parallel (from several sources when several are healthy), resumable from `partial/` in a later
run, each committed only after its sha256 matched. (resolve.py finds the manifests and config.)
"""

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple


from .errors import Cancelled, CorruptBlob, ImgtoolError, NotFoundError, RegistryError, VerifyError
from .model import Descriptor, Digest, PulledImage, format_size
from .progress import Bar, Progress
from .puller_sources import Retries, Slots, SourcePool, asks_for_fewer
from .registry import BlobStream
from .store import Partial, Store

if TYPE_CHECKING:
    from .bundle.regions import Regions
    from .puller_sources import BlobSource

MiB = 1024 * 1024
READ_CHUNK = 256 * 1024  # one network read (bigger reads kept more freed memory per thread: docs/benchmarks.md)
JOBS = 12  # connections per source (--connections; why 12: docs/design.md); how the scheduler divides the work: Tuning
CONNECTIONS = 32  # connections at once over every source (--max-connections)
# connections per model hub endpoint (--connections unset): a hub serves a model's few multi-GB files from a CDN made
# for many ranged readers, where the client opens one per file; on a link holding each connection to a rate, 24 is
# the count measured past 3x the client (16 was not: docs/benchmarks.md "Models (issue 48)"). A registry keeps JOBS:
# image pulls do not change.
HUB_JOBS = 24
# connections at once over a model's hub endpoints (--max-connections unset): two endpoints' HUB_JOBS each. At 32, two
# sources at 2 MB/s per connection could not pass 5.7x the client, the download alone taking 8.4 s of 54.6 / 6 = 9.1
# (docs/benchmarks.md "Two sources, measured"); registries keep CONNECTIONS.
HUB_CONNECTIONS = 2 * HUB_JOBS


# --- blob download ---------------------------------------------------------
#
# Read top to bottom: the knobs (Tuning), what a download counts (PullStats), one blob being written (_BlobJob),
# the one kind of queued work (_Range), the scheduler that hands work to the connections and moves
# bytes (_Scheduler), and `download`, which plans the work and runs the workers.


@dataclass(frozen=True)
class Tuning:
    """How `download` divides blobs over its connections. Every default was chosen by measurement
    (docs/benchmarks.md); tests build smaller ones so that splits and steals happen on small blobs."""

    big_blob: int = 64 * MiB
    """A blob at least this big is split into `segment`-sized ranges when it is opened."""

    segment: int = 32 * MiB
    """The size of those ranges (the last one of a blob is shorter)."""

    request: int = 16 * MiB
    """A connection asks for at most this much of its range per request, so a steal never cuts a
    request short and a kill loses at most this much in flight per connection. 4 MiB requests cost
    5-15 % on a link holding each connection to 20 MB/s (each request's round trip and the registry's
    per-request work); 16 MiB cost nothing measurable there or on loopback."""

    min_steal: int = MiB
    """An idle connection takes the back half of the biggest running range only if that half holds at
    least this many bytes ..."""

    steal_seconds: float = 0.2
    """... and, at the rate the range has been coming, it still has at least this long to go: a new
    request would not finish much sooner."""

    tail_seconds: float = 1.0
    """With nothing queued, a range with longer than this to go is asked for in halves (never less than
    `min_steal`), so idle connections can take the other half now instead of waiting for the request."""

    share: float = 0.5
    """A range with longer than `tail_seconds` to go (or whose rate is not known yet) is asked for in requests of at
    most this much of the bytes no connection has asked for yet, over the connections (never less than `min_steal`):
    as the work runs out the requests shrink, so no connection holds a long request that idle ones cannot take a
    byte of, and the connections finish together (guided self-scheduling, halved)."""

    start_wait: float = 0.2
    """How long an idle connection waits for a blob being opened to queue its ranges, so blobs complete
    in archive order; an open that takes longer is waiting for another imgtool's lock on the blob."""


DEFAULT_TUNING = Tuning()


@dataclass
class PullStats:
    """What a download did: bytes over the wire, blobs fetched and already present."""

    bytes_downloaded: int = 0
    blobs_downloaded: int = 0
    blobs_cached: int = 0
    bytes_cached: int = 0
    resumed_bytes: int = 0
    per_source: Dict[str, int] = field(default_factory=dict)
    connections_lowered: Dict[str, int] = field(default_factory=dict)  # source -> its cap after a 429/503
    fresh: Set[Digest] = field(default_factory=set)  # downloaded and digest-checked by this process
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, source: str, n: int) -> None:
        with self.lock:
            self.bytes_downloaded += n
            self.per_source[source] = self.per_source.get(source, 0) + n

    def lowered(self, source: str, cap: int) -> bool:
        """The source's connections were capped at `cap`; True the first time for that source."""
        with self.lock:
            first = source not in self.connections_lowered
            self.connections_lowered[source] = cap
            return first

    def cached(self, size: int) -> None:
        """A blob of `size` bytes was in the store already."""
        with self.lock:
            self.blobs_cached += 1
            self.bytes_cached += size

    def resumed(self, n: int) -> None:
        """A previous run left `n` bytes of a blob in its partial file."""
        with self.lock:
            self.resumed_bytes += n

    def downloaded(self, digest: Digest) -> None:
        """The blob arrived whole and matched its digest."""
        with self.lock:
            self.blobs_downloaded += 1
            self.fresh.add(digest)


HASHERS = 2  # threads moving the blobs' hash cursors over the bytes other ranges wrote (_Scheduler.hash_behind)
BLOB_ATTEMPTS = 3  # whole-blob downloads before a blob that keeps arriving corrupt is given up on


@dataclass(frozen=True)
class _Blob:
    """A blob to download: what it is, where from, which attempt this is, and its place in archive order."""

    desc: Descriptor
    pool: SourcePool
    attempt: int
    index: int


class _BlobJob:
    """One blob being downloaded: its partial file, its per-blob lock and bar, and its running sha256.

    The hash follows a cursor: bytes that arrive at the cursor are hashed as they come; bytes
    written past it (other ranges) are read back from the partial file once the cursor reaches
    them, by the download's hashing threads (`catch_up`), never by the connection that brought the
    chunk at the cursor: that one read its socket at half its rate while it hashed the other
    ranges' bytes, and was the last to finish (docs/benchmarks.md "Two sources, measured"). So a
    blob fetched in ranges is mostly hashed by the time its last byte lands, instead of being read
    back whole at the end.
    """

    def __init__(self, blob: _Blob, partial: Partial, unlock: Callable[[], None], bar: Bar):
        self.blob, self.desc, self.partial, self.unlock, self.bar = blob, blob.desc, partial, unlock, bar
        self.hasher = blob.desc.digest.hasher()
        self.hashed = 0
        self.hash_busy = False
        self.queued = False  # handed to a hashing thread, not taken yet
        self.closed = False
        self.pending = 0  # ranges not finished yet (changed under the scheduler's lock)
        self.lock = threading.Lock()
        self.cursor_free = threading.Condition(self.lock)

    def split(self, segment: Optional[int]) -> List[Tuple[int, int]]:
        """The byte ranges not on disk yet, cut into `segment`-sized pieces (None: whole)."""
        out: List[Tuple[int, int]] = []
        for a, b in self.partial.missing():
            step = segment or (b - a)
            out += [(x, min(x + step, b)) for x in range(a, b, step)]
        return out

    def hash_from(self, pos: int, chunk: bytes) -> bool:
        """`chunk` was just written at `pos`: hash it now if the cursor is there. True when bytes written past the
        cursor wait to be read back (`catch_up`, on another thread: see `wants_catch_up`)."""
        with self.lock:
            if self.hash_busy or self.hashed != pos:
                return False  # not at the cursor (or someone is moving it): read back later
            self.hash_busy = True
        self.hasher.update(chunk)
        with self.lock:
            self.hashed, self.hash_busy = pos + len(chunk), False
            self.cursor_free.notify_all()
            return self._done_from(self.hashed) > self.hashed  # a chunk written there meanwhile was left to us

    def wants_catch_up(self) -> bool:
        """True the first time since the last `catch_up` began: the caller hands the blob to a hashing thread."""
        with self.lock:
            first, self.queued = not self.queued, True
            return first

    def catch_up(self, wait: bool = False) -> None:
        """Move the cursor over whatever is written contiguously after it (unless another thread is, or, with
        `wait`, once it has)."""
        with self.lock:
            self.queued = False
            while wait and self.hash_busy:
                self.cursor_free.wait()
            if self.hash_busy or self.closed:
                return
            self.hash_busy = True
        self._advance(self.hashed)

    def _done_from(self, pos: int) -> int:
        """Where the written bytes that start at or before `pos` end (`pos` if none covers it)."""
        for a, b in self.partial.done_ranges():
            if a <= pos < b:
                return b
        return pos

    def _advance(self, hashed: int) -> None:
        """Hash the written bytes from `hashed` on, as far as they reach; then leave the cursor there."""
        try:
            while True:
                upto = self._done_from(hashed)
                if upto == hashed:
                    upto = self._stop_or_more(hashed)
                    if upto == hashed:
                        return
                for piece in self.partial.read_range(hashed, upto):
                    self.hasher.update(piece)
                hashed = upto
        except BaseException:
            with self.lock:
                self.hash_busy = False
                self.cursor_free.notify_all()
            raise

    def _stop_or_more(self, hashed: int) -> int:
        """Under the lock, look again: a chunk written at the cursor while we were busy was left to us.
        With none, the cursor stays at `hashed` and is free for the next thread; returns where to hash up to."""
        with self.lock:
            upto = self._done_from(hashed)
            if upto == hashed:
                self.hashed, self.hash_busy = hashed, False
                self.cursor_free.notify_all()
            return upto


class _Range:
    """The one kind of queued work: bytes [pos, end) of a blob, for one connection.

    A range without a `job` is a whole blob nobody has opened yet: the worker that takes it opens the
    blob (locks it, reads its partial record) and the blob's ranges go to the front of the queue.

    `end` moves down when an idle worker takes the back half; `asked` is where the worker's outstanding
    request ends: bytes up to there may be on their way already, so `end` never moves below it
    (both changed under the scheduler's lock).
    """

    __slots__ = ("blob", "job", "pos", "end", "asked", "preferred", "since", "first")

    def __init__(self, blob: _Blob, job: Optional[_BlobJob], pos: int, end: int, preferred: int):
        self.blob, self.job, self.pos, self.end, self.preferred = blob, job, pos, end, preferred
        self.asked = pos
        self.since: Optional[float] = None  # when a worker started on it, at `first`
        self.first = pos

    @classmethod
    def unopened(cls, blob: _Blob) -> "_Range":
        return cls(blob, None, 0, blob.desc.size, blob.index)

    def seconds_left(self, now: float) -> Optional[float]:
        """At the rate the range has been coming, how long it still takes (None: too early to tell)."""
        if self.since is None or now - self.since < 0.05 or self.pos <= self.first:
            return None
        return (self.end - self.pos) * (now - self.since) / (self.pos - self.first)

    def back_half(self) -> int:
        """Where an idle worker would split it: halfway through what is left, but never inside the
        outstanding request (those bytes may be on the wire already; cut off, they would come twice)."""
        return max(self.asked, self.pos + (self.end - self.pos) // 2)


class _Scheduler:
    """Every worker takes the next piece of work: a blob to open (in archive order, its ranges going
    to the front of the queue) or a range; with the queue empty, an idle worker takes the back half
    of the biggest range still running, so no connection idles while one slow range finishes."""

    def __init__(self, store: Store, progress: Progress, stats: PullStats, total_bar: Bar, tuning: Tuning,
                 stop: threading.Event, per_source: int, regions: Optional["Regions"] = None):
        self.store, self.progress, self.stats, self.total_bar = store, progress, stats, total_bar
        self.regions = regions  # where the destination wants blobs written instead of the store (bundle/regions.py)
        self.tuning = tuning
        self.queue: Deque[_Range] = deque()
        self.running: List[_Range] = []
        self.jobs: List[_BlobJob] = []  # opened and not finished
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.opening = 0  # blobs being opened by a worker (their ranges not queued yet)
        self.opened_at = 0.0  # when the latest of them was taken from the queue
        self.stop = stop
        self.error: Optional[BaseException] = None  # the first error any worker met
        self.turn = 0
        self.workers = 1  # the connections at once (set by _run_workers)
        self.hashing: Optional[ThreadPoolExecutor] = None  # moves the blobs' hash cursors (set by _run_workers)
        self.slots = Slots(per_source)
        self.pools: Dict[int, SourcePool] = {}

    def pool(self, sources: Sequence["BlobSource"]) -> SourcePool:
        """The pool of an image's sources (one per list of sources), sharing the per-source slots."""
        return self.pools.setdefault(id(sources), SourcePool(sources, self.slots))

    # -- a worker --------------------------------------------------------------------------------

    def work(self) -> None:
        """A worker's loop, until no work is left or `stop` is set. The first error any worker meets
        is kept in `error` and stops every worker."""
        try:
            while not self.stop.is_set():
                rng = self._take()
                if rng is None:
                    return
                if rng.job is None:
                    rng = self._open_taken(rng.blob)
                    if rng is None:
                        continue
                self._fetch(rng)
                if not self.stop.is_set():
                    self._range_done(rng)
        except BaseException as e:
            with self.lock:
                if self.error is None:
                    self.error = e
            self.stop.set()

    # -- handing out work (under the lock) -------------------------------------------------------

    def _take(self) -> Optional[_Range]:
        """The next piece of work for an idle worker; None: nothing left worth a connection."""
        with self.lock:
            self._wait_for_opening()
            if self.queue:
                return self._pop()
            return self._steal()

    def _wait_for_opening(self) -> None:
        # A blob being opened puts its ranges at the front of the queue: wait for them, so blobs complete
        # in archive order and the bundle writer, which takes them in that order, is not kept waiting by
        # the first. Briefly: an open that takes longer waits for another imgtool's lock on the blob.
        deadline = self.opened_at + self.tuning.start_wait
        while self.opening and not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.changed.wait(left)

    def _pop(self) -> _Range:
        rng = self.queue.popleft()
        if rng.job is None:
            self.opening += 1
            self.opened_at = time.monotonic()
        else:
            self.running.append(rng)
        return rng

    def _steal(self) -> Optional[_Range]:
        """The back half of the running range with the most bytes beyond its split point, if worth it."""
        victim, mid = None, 0
        for r in self.running:
            at = r.back_half()
            if r.end - at > (victim.end - mid if victim is not None else 0):
                victim, mid = r, at
        if victim is None or victim.job is None or victim.end - mid < self.tuning.min_steal:
            return None
        left = victim.seconds_left(time.monotonic())
        if left is not None and left < self.tuning.steal_seconds:
            return None
        rng = _Range(victim.blob, victim.job, mid, victim.end, self._next_turn())
        victim.end = mid
        victim.job.pending += 1
        self.running.append(rng)
        return rng

    def _next_turn(self) -> int:
        self.turn += 1
        return self.turn

    def _ask(self, rng: _Range, whole: bool) -> int:
        """Where the worker's next request on `rng` ends (`whole`: the rest of the range); marks it asked."""
        with self.lock:
            size = rng.end - rng.pos if whole else self.tuning.request
            left = rng.seconds_left(time.monotonic())
            if not whole and (left is None or left > self.tuning.tail_seconds):
                # Not a fast range (the extra requests would cost more than they save there): no more than this
                # connection's share of what nobody has asked for yet. On a slow link the first wave asked for
                # `request` each, 8 s at 2 MB/s that no idle connection could take a byte of (docs/benchmarks.md
                # "Two sources, measured").
                size = min(size, max(self.tuning.min_steal, int(self._unasked() * self.tuning.share / self.workers)))
            if not self.queue and not whole and left is not None and left > self.tuning.tail_seconds:
                # The tail, on a slow range: connections that run out of work come for it. Ask for at most
                # half of what is left, so they can take the other half now instead of waiting for the
                # request to end.
                size = min(size, max(self.tuning.min_steal, (rng.end - rng.pos) // 2))
            rng.asked = min(rng.end, rng.pos + size)
            return rng.asked

    def _unasked(self) -> int:
        """The bytes no connection has asked for yet: the queued work and the running ranges beyond their requests
        (under the lock)."""
        return sum(r.blob.desc.size if r.job is None else r.end - r.pos for r in self.queue) + \
            sum(r.end - max(r.asked, r.pos) for r in self.running)

    # -- opening a blob --------------------------------------------------------------------------

    def _open_taken(self, blob: _Blob) -> Optional[_Range]:
        """`_open`, then tell the workers waiting in `_take` that this blob's ranges are queued."""
        try:
            return self._open(blob)
        finally:
            with self.lock:
                self.opening -= 1
                self.changed.notify_all()

    def _open(self, blob: _Blob) -> Optional[_Range]:
        """Lock the blob (waiting for another imgtool that holds it), open its partial, queue its ranges;
        returns the first of them for this worker (None: nothing to fetch).

        A blob the cache lacks is first copied from a bundle the cache remembers it in (`Store.locate`), a blob the
        destination placed (bundle/regions.py) from the cache too (another imgtool that held the lock may have just
        placed it in its own bundle)."""
        desc = blob.desc
        unlock = self.store.lock_blob(desc.digest, waiting=self.progress.note)
        try:
            if self.regions is not None and self.regions.holds(desc.digest):
                partial: Optional[Partial] = self._open_placed(blob)
                if partial is None:  # here already
                    unlock()
                    return None
            else:
                partial = None if self.store.has(desc.digest, desc.size) else self.store.partial(desc.digest,
                                                                                                 desc.size)
                if partial is not None and blob.attempt == 0 and not partial.done and \
                        self._copy_local(desc, partial):  # from a bundle the cache remembers
                    unlock()
                    return None
        except BaseException:
            unlock()
            raise
        if partial is None:  # another imgtool finished it meanwhile
            unlock()
            self.store.announce()  # whoever waits for it in this process: it is here
            self.stats.cached(desc.size)
            return None
        bar = self.progress.bar(desc.size, f"{desc.digest.short} ({format_size(desc.size)})")
        job = _BlobJob(blob, partial, unlock, bar)
        with self.lock:
            self.jobs.append(job)
        self.stats.resumed(partial.done_bytes)
        bar.update(partial.done_bytes)
        job.catch_up()  # what a previous run left
        pieces = job.split(self.tuning.segment if desc.size >= self.tuning.big_blob else None)
        if not pieces:
            self._finish(job)
            return None
        with self.lock:
            ranges = [_Range(blob, job, a, b, blob.index + k) for k, (a, b) in enumerate(pieces)]
            job.pending = len(ranges)
            self.queue.extendleft(reversed(ranges[1:]))  # next in line: this blob's other ranges
            self.running.append(ranges[0])
            return ranges[0]

    def _open_placed(self, blob: _Blob) -> Optional[Partial]:
        """The partial of a placed blob, or None when it is in place already: whole from an earlier run into this
        bundle (hashed again), or copied from this machine (hashed)."""
        assert self.regions is not None
        desc = blob.desc
        partial = self.regions.partial(desc.digest, desc.size)
        if not partial.missing():
            if self._whole_already(desc, partial):
                return None
            partial = self.regions.partial(desc.digest, desc.size)  # it did not match: discarded, start over
        elif blob.attempt == 0 and not partial.done and self._copy_local(desc, partial):
            return None
        return partial

    def _located(self, desc: Descriptor) -> None:
        """A placed blob is whole: the cache learns where (a fetch waiting for its lock copies it from there)."""
        if self.regions is not None and self.regions.holds(desc.digest):
            self.store.locate(desc.digest, desc.size, self.regions.regions(desc.digest, self.regions.part_names))

    def _here(self, desc: Descriptor, partial: Partial, hexdigest: str) -> None:
        """A blob that came from this machine, hashed: committed (VerifyError when it does not match), counted as
        cached."""
        partial.commit(hexdigest)
        partial.close()
        self._located(desc)
        self.stats.cached(desc.size)

    def _whole_already(self, desc: Descriptor, partial: Partial) -> bool:
        """A placed blob an earlier run finished: True once its bytes hash to its digest (committed), else False
        (discarded)."""
        hasher = desc.digest.hasher()
        for chunk in partial.read_range(0, desc.size):
            hasher.update(chunk)
        try:
            self._here(desc, partial, hasher.hexdigest())
        except VerifyError:
            return False
        return True

    def _copy_local(self, desc: Descriptor, partial: Partial) -> bool:
        """Copy a blob from the cache's file (into its place) or a bundle the cache remembers, hashing it; True when
        it came whole and matched (committed), else False with nothing recorded (it is downloaded)."""
        chunks = self.store.local_chunks(desc.digest, desc.size)
        if chunks is None:
            return False
        hasher, pos = desc.digest.hasher(), 0
        try:
            for chunk in chunks:
                if self.stop.is_set():
                    partial.reset()
                    partial.close()
                    return True  # the run is ending: nothing to fetch
                partial.write(pos, chunk)
                hasher.update(chunk)
                pos += len(chunk)
        except OSError:
            pos = -1  # moved or shortened since: download it
        if pos != desc.size or hasher.hexdigest() != desc.digest.hex:
            partial.reset()
            return False
        self._here(desc, partial, hasher.hexdigest())
        self.total_bar.update(desc.size)
        return True

    # -- moving the bytes ------------------------------------------------------------------------

    def _fetch(self, rng: _Range) -> None:
        """Download the range into its blob's partial file, retrying and failing over between sources.

        The range is asked for in bounded requests (`_ask` says where each ends), one after the other on
        the same (kept-alive) connection. A request is never cut short: an idle worker may take the back
        half of the range only beyond the outstanding request (`asked`), so no byte the server was asked
        for is thrown away, and a kill loses at most one request's bytes in flight per connection.
        """
        retries = Retries(rng.blob.pool)
        rng.since, rng.first = time.monotonic(), rng.pos
        while rng.pos < rng.end and not self.stop.is_set():
            source = retries.next_source(rng.preferred)
            try:
                with self.slots.hold(source.name):
                    while rng.pos < rng.end and not self.stop.is_set():
                        self._request(source, rng)
            except NotFoundError as e:
                retries.not_found(source, e, rng.blob.desc.digest)
            except RegistryError as e:  # the registry room's words: "HOST: connection reset", "... timed out"
                lowered = self.slots.slow_down(source.name) if asks_for_fewer(e) else None
                if lowered is not None and self.stats.lowered(source.name, lowered):
                    self.progress.warn(f"{source.name} refused a connection while {lowered} others were downloading "
                                       f"({e.message}): fewer connections to it from now on")
                try:
                    source.client.retry.wait(retries.failed(source, e) if lowered is None
                                             else source.client.retry.delay(0, getattr(e, "retry_after", None)),
                                             self.stop)
                except Cancelled:
                    return  # stopped (Ctrl-C, or another worker's error): the caller is unwinding

    def _request(self, source: "BlobSource", rng: _Range) -> None:
        """One request for the range, from `rng.pos` to where `_ask` says; its bytes go to the partial.
        The client does not retry it: `_fetch` does, by the same policy, maybe from another source."""
        start, size = rng.pos, rng.blob.desc.size
        asked = self._ask(rng, False)
        with source.client.blob(source.repository, rng.blob.desc.digest, start, None if asked == size else asked,
                                retry=False) as blob, self.slots.receiving(source.name):
            if blob.whole:  # the server ignored Range: it sends the whole blob anyway,
                asked = self._ask(rng, True)  # so keep the rest of the range from this response
                self._skip(blob, start, source, rng)
            while rng.pos < asked and not self.stop.is_set():
                chunk = self._read(blob, min(READ_CHUNK, asked - rng.pos), source, rng)
                self._write(rng, chunk[:asked - rng.pos], source.name)

    def _skip(self, blob: BlobStream, n: int, source: "BlobSource", rng: _Range) -> None:
        """Read and drop the first `n` bytes of a response."""
        while n and not self.stop.is_set():
            n -= len(self._read(blob, min(READ_CHUNK, n), source, rng))

    def _read(self, blob: BlobStream, n: int, source: "BlobSource", rng: _Range) -> bytes:
        """Up to `n` raw bytes of the response; raises RegistryError if the connection broke or closed early."""
        chunk = blob.read(n)
        if not chunk:
            raise RegistryError(f"{source.name}: connection closed after {format_size(rng.pos)} of "
                                f"{format_size(rng.blob.desc.size)}")
        return chunk

    def _write(self, rng: _Range, chunk: bytes, source: str) -> None:
        """`chunk` belongs at `rng.pos`: into the partial file, the hash, the counts and the bars."""
        assert rng.job is not None  # a range being fetched belongs to an opened blob
        pos = rng.pos
        rng.job.partial.write(pos, chunk)
        if rng.job.hash_from(pos, chunk) and self.hashing is not None and rng.job.wants_catch_up():
            self.hashing.submit(self.hash_behind, rng.job)
        rng.pos = pos + len(chunk)
        self.stats.add(source, len(chunk))
        rng.job.bar.update(len(chunk))
        self.total_bar.update(len(chunk))

    # -- finishing a blob ------------------------------------------------------------------------

    def _range_done(self, rng: _Range) -> None:
        assert rng.job is not None
        with self.lock:
            self.running.remove(rng)
            rng.job.pending -= 1
            last = rng.job.pending == 0
        if last:
            self._finish(rng.job)

    def _finish(self, job: _BlobJob) -> None:
        """Every byte is in: hash what the cursor has not reached, check, publish (or queue it again)."""
        try:
            self._commit(job)
        finally:
            self._close(job)

    def hash_behind(self, job: _BlobJob) -> None:
        """On a hashing thread: the blob's cursor moved over the bytes written past it. What fails here is left to
        the blob's end, which hashes what is left and reports it (`_commit`)."""
        if not self.stop.is_set():
            try:
                job.catch_up()
            except (OSError, ImgtoolError):
                pass

    def _commit(self, job: _BlobJob) -> None:
        desc = job.desc
        job.catch_up(wait=True)
        if job.hashed != desc.size:
            raise ImgtoolError(f"internal: blob {desc.digest.short} hashed {job.hashed} of {desc.size} bytes")
        try:
            job.partial.commit(job.hasher.hexdigest())
        except VerifyError as e:
            self._again(job.blob, e)
            return
        self._located(desc)
        self.stats.downloaded(desc.digest)
        self.progress.note(f"{desc.digest.short}: done ({format_size(desc.size)})")

    def _again(self, blob: _Blob, corrupt: VerifyError) -> None:
        """The blob arrived corrupt: queue it again, first in line; raises VerifyError after BLOB_ATTEMPTS."""
        self.progress.warn(f"{corrupt.message}; downloading it again")
        if blob.attempt + 1 >= BLOB_ATTEMPTS:
            raise CorruptBlob(f"blob {blob.desc.digest} arrived corrupt {BLOB_ATTEMPTS} times; giving up",
                              hint="a proxy or mirror is damaging data; try another with --mirror NAME",
                              digest=str(blob.desc.digest)) from corrupt
        with self.lock:
            self.queue.appendleft(_Range.unopened(replace(blob, attempt=blob.attempt + 1)))

    def _close(self, job: _BlobJob) -> None:
        with self.lock:
            if job not in self.jobs:
                return
            self.jobs.remove(job)
        with job.lock:
            job.closed = True
        try:
            job.partial.flush_state()
            job.partial.close()
            job.bar.close()
        finally:
            job.unlock()

    def close_all(self) -> None:
        """After a failure: keep every opened blob's partial record, release its lock."""
        for job in list(self.jobs):
            self._close(job)


def download(images: Sequence[Tuple[PulledImage, Sequence["BlobSource"]]], store: Store, progress: Progress,
             jobs: int = JOBS, stats: Optional[PullStats] = None,
             blobs: Optional[Sequence[Digest]] = None, cancel: Optional[threading.Event] = None,
             tuning: Tuning = DEFAULT_TUNING, connections: int = CONNECTIONS,
             regions: Optional["Regions"] = None) -> PullStats:
    """Bring the layers `blobs` of `images` (exactly those, in that order: what a copy moves; None: every layer)
    into the store, or those `regions` holds into their regions, over `jobs` connections per source, at most
    `connections` at once over all; returns what was transferred. Setting `cancel` stops it (what arrived stays in
    the partial files for the next run), and ends any wait before a retry at once.

    Raises RegistryError when every source failed for some blob, StoreError on disk
    trouble, VerifyError (CorruptBlob) when a blob kept arriving corrupt.
    """
    known: Dict[Digest, Tuple[Descriptor, Sequence["BlobSource"]]] = {}
    for image, sources in images:
        for layer in image.manifest.layers:
            known.setdefault(layer.digest, (layer, sources))
    wanted = list(known) if blobs is None else [d for d in dict.fromkeys(blobs) if d in known]
    return download_blobs([known[d] for d in wanted], store, progress, jobs=jobs, stats=stats, cancel=cancel,
                          tuning=tuning, connections=connections, regions=regions)


def download_blobs(blobs: Sequence[Tuple[Descriptor, Sequence["BlobSource"]]], store: Store, progress: Progress,
                   jobs: int = JOBS, stats: Optional[PullStats] = None, order: Sequence[Digest] = (),
                   cancel: Optional[threading.Event] = None, tuning: Tuning = DEFAULT_TUNING,
                   connections: int = CONNECTIONS, regions: Optional["Regions"] = None) -> PullStats:
    """`download` of blobs named by their descriptors, each with the sources that serve it (a registry's
    mirrors, a model hub's endpoints: anything of `puller_sources.BlobSource`'s shape); each blob once, with
    the sources given first for it, in the order given (`order` first, when given). Raises as `download` does."""
    stats = stats if stats is not None else PullStats()  # the caller's: it may watch `fresh` grow
    todo = _missing(blobs, store, stats, order, regions)
    if not todo:
        return stats
    total = sum(d.size - (regions.partial_bytes(d.digest, d.size) if regions is not None and regions.holds(d.digest)
                          else store.partial_bytes(d.digest, d.size)) for d, _ in todo)
    with progress.bar(total, "download") as total_bar:
        sched = _Scheduler(store, progress, stats, total_bar, tuning, cancel if cancel is not None else threading.Event(),
                           max(1, jobs), regions)
        for i, (desc, sources) in enumerate(todo):
            sched.queue.append(_Range.unopened(_Blob(desc, sched.pool(sources), 0, i)))
        names = {s.name for _, sources in todo for s in sources}  # the shape: connections per source
        _run_workers(sched, max(1, min(connections, max(1, jobs) * len(names))))
        if cancel is not None and cancel.is_set():
            return stats
        if sched.queue or sched.running:
            raise ImgtoolError("internal: the download stopped with work left")
    return stats


def _missing(blobs: Sequence[Tuple[Descriptor, Sequence["BlobSource"]]], store: Store, stats: PullStats,
             order: Sequence[Digest], regions: Optional["Regions"] = None
             ) -> List[Tuple[Descriptor, Sequence["BlobSource"]]]:
    """The blobs to download (each once, with the sources given first for it), in the order given, `order` first;
    those already in the store are counted in `stats` instead, unless `regions` wants them (copied there)."""
    wanted: Dict[Digest, Tuple[Descriptor, Sequence["BlobSource"]]] = {}
    for desc, sources in blobs:
        wanted.setdefault(desc.digest, (desc, sources))
    todo = []
    for desc, sources in wanted.values():
        if store.has(desc.digest, desc.size) and not (regions is not None and regions.holds(desc.digest)):
            stats.cached(desc.size)
        else:
            todo.append((desc, sources))
    if order:  # fetch: the bundle's archive order, so its writer can start on the first blob early
        rank = {d: i for i, d in enumerate(order)}
        todo.sort(key=lambda t: rank.get(t[0].digest, len(rank)))
    return todo


def _run_workers(sched: _Scheduler, jobs: int) -> None:
    """`jobs` workers on the scheduler until they run out of work; raises the first error one met.

    On every path out (an error in a worker, Ctrl-C here) the workers are stopped and joined before this
    returns, and every opened blob's partial record is kept and its lock released.
    """
    sched.workers = jobs
    # two: one thread fell behind under load (a loaded machine gives each thread its share), and the blobs'
    # last checks waited for it, 0.3-0.9 s after the last byte (docs/benchmarks.md "Two sources, measured")
    sched.hashing = ThreadPoolExecutor(max_workers=HASHERS, thread_name_prefix="download-hash")
    try:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="download") as pool:
            futures = [pool.submit(sched.work) for _ in range(jobs)]
            try:
                wait(futures)
            except BaseException:
                sched.stop.set()  # each worker ends at its next chunk; leaving `with` joins them
                raise
    finally:
        sched.hashing.shutdown(wait=True)  # before the blobs' files close: it may be reading one
        sched.close_all()
    if sched.error is not None:
        raise sched.error
