"""Reference -> platform manifest -> blobs in the store, concurrently, without a daemon.

`resolve_image` fetches (and digest-checks) the index and the platform manifest and the
config; `download` brings every missing blob into the store: big blobs split into ranges
fetched in parallel (from several sources when several are healthy), resumable from
`partial/` in a later run, each committed only after its sha256 matched.
"""

import socket
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Collection, Dict, List, Optional, Sequence, Set, Tuple

import requests
import urllib3

from .errors import ImgtoolError, NotFoundError, RegistryError, UsageError, VerifyError
from .mirrors import Resolution, Source
from .model import (Descriptor, Digest, ImageConfig, Index, Manifest, ManifestError, Platform,
                    PulledImage, format_size, parse_manifest)
from .progress import Progress
from .registry import _short as short_error
from .store import Store

READ_CHUNK = 256 * 1024
BIG_BLOB = 64 * 1024 * 1024  # blobs at least this big are fetched as parallel ranges
SEGMENT = 32 * 1024 * 1024
BLOB_ATTEMPTS = 3  # whole-blob retries after a digest mismatch
_NET_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, socket.timeout, ConnectionError)


def _manifest_from(sources: Sequence[Source], digest: Digest, what: str) -> Tuple[bytes, str, Source]:
    """Fetch manifest bytes by digest from the first source that has them (digest-checked)."""
    errors = []
    for s in sources:
        try:
            data, ctype, _ = s.client.manifest(s.repository, str(digest), expect=digest)
            return data, ctype, s
        except ImgtoolError as e:
            errors.append(f"{s.describe()}: {e.message}")
    raise RegistryError(f"cannot fetch the {what} {digest.short} from any source: " + "; ".join(errors))


def resolve_image(resolution: Resolution, platform: Platform, store: Store) -> PulledImage:
    """Index -> platform manifest -> config, all digest-checked; config lands in the store.

    Raises UsageError (platform missing, single-arch image of another platform),
    ManifestError, RegistryError.
    """
    ref = resolution.ref
    data, ctype, source = _manifest_from(resolution.sources, resolution.digest, "manifest")
    parsed = parse_manifest(data, ctype)
    index_digest = None
    if isinstance(parsed, Index):
        index_digest = resolution.digest
        try:
            entry = parsed.select(platform)
        except UsageError as e:
            raise UsageError(f"{ref.tagged}: {e.message}", hint="choose one with --arch or --platform")
        data, ctype, source = _manifest_from([source] + [s for s in resolution.sources if s is not source],
                                             entry.digest, f"{entry.platform} manifest")
        parsed = parse_manifest(data, ctype)
        if not isinstance(parsed, Manifest):
            raise ManifestError(f"{ref.tagged}: the index entry for {entry.platform} is not an image manifest")
        manifest_digest = entry.digest
    else:
        manifest_digest = resolution.digest
    manifest: Manifest = parsed
    config_bytes = _fetch_small_blob(resolution.sources, manifest.config, store)
    config = ImageConfig.parse(config_bytes)
    if index_digest is None and not config.platform.satisfies(platform):
        raise UsageError(
            f"{ref.tagged} is a single-platform image for {config.platform}, not {platform}",
            hint=f"use --platform {config.platform} if that is what you want; imgtool never copies the wrong architecture silently",
        )
    if len(config.diff_ids) != len(manifest.layers):
        raise ManifestError(f"{ref.tagged}: the config lists {len(config.diff_ids)} diff_ids for {len(manifest.layers)} layers")
    return PulledImage(
        ref=ref, source=source.describe(), platform=config.platform if index_digest is None else platform_of(parsed, config, platform),
        index_digest=index_digest, manifest_digest=manifest_digest, manifest_bytes=data, manifest=manifest,
        config_bytes=config_bytes, config=config,
    )


def platform_of(manifest: Manifest, config: ImageConfig, wanted: Platform) -> Platform:
    """The platform to record: the config's, completed with the requested variant."""
    p = config.platform
    return Platform(p.os, p.architecture, p.variant or (wanted.variant if p.architecture == wanted.architecture else None))


def _fetch_small_blob(sources: Sequence[Source], desc: Descriptor, store: Store) -> bytes:
    if store.has(desc.digest, desc.size):
        return store.read_bytes(desc.digest)
    errors = []
    for s in sources:
        try:
            resp = s.client.blob(s.repository, desc.digest)
            with resp:
                data = resp.raw.read(desc.size + 1, decode_content=False)
            if len(data) != desc.size or Digest.of(data) != desc.digest:
                errors.append(f"{s.describe()}: config blob failed its size/digest check")
                continue
            store.put_bytes(data, desc.digest)
            return data
        except ImgtoolError as e:
            errors.append(f"{s.describe()}: {e.message}")
        except _NET_ERRORS as e:
            errors.append(f"{s.describe()}: {type(e).__name__}")
    raise RegistryError(f"cannot fetch config {desc.digest.short} from any source: " + "; ".join(errors))


# --- blob download ---------------------------------------------------------


@dataclass
class PullStats:
    """What a download did: bytes over the wire, blobs fetched and already present."""

    bytes_downloaded: int = 0
    blobs_downloaded: int = 0
    blobs_cached: int = 0
    bytes_cached: int = 0
    resumed_bytes: int = 0
    per_source: Dict[str, int] = field(default_factory=dict)
    fresh: Set[Digest] = field(default_factory=set)  # downloaded and digest-checked by this process
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, source: str, n: int) -> None:
        with self.lock:
            self.bytes_downloaded += n
            self.per_source[source] = self.per_source.get(source, 0) + n


class _SourcePool:
    """Healthy sources with a connection cap each; a failing source is dropped for the run."""

    def __init__(self, sources: Sequence[Source], per_source: int):
        self.sources = list(sources)
        self.sem = {s.name: threading.Semaphore(per_source) for s in self.sources}
        self.dead: Dict[str, str] = {}
        self.last_error: Dict[str, str] = {}
        self.lock = threading.Lock()

    def pick(self, preferred: int, exclude=()) -> Source:
        with self.lock:
            live = [s for s in self.sources if s.name not in self.dead and s.name not in exclude]
            if not live:
                live = [s for s in self.sources if s.name not in self.dead]
        if not live:
            detail = "; ".join(f"{s.describe()}: {self.last_error.get(s.name) or self.dead.get(s.name) or 'failed'}"
                               for s in self.sources)
            raise RegistryError(f"every source failed: {detail}", hint="check the network, or retry later: finished layers are kept in the cache")
        return live[preferred % len(live)]

    def fail(self, source: Source, error: str, fatal: bool) -> None:
        with self.lock:
            self.last_error[source.name] = error
            if fatal:
                self.dead[source.name] = error


class _BlobJob:
    """One blob being downloaded: its partial file, its ranges, and the hash when sequential."""

    def __init__(self, desc: Descriptor, partial, segment: Optional[int]):
        self.desc, self.partial = desc, partial
        missing = partial.missing()
        self.sequential = segment is None and len(missing) == 1 and missing[0][1] == desc.size
        self.hasher = desc.digest.hasher() if self.sequential else None
        if self.hasher is not None and missing[0][0] > 0:
            for chunk in partial.read_range(0, missing[0][0]):
                self.hasher.update(chunk)
        self.ranges: List[Tuple[int, int]] = []
        for a, b in missing:
            step = segment or (b - a)
            self.ranges += [(x, min(x + step, b)) for x in range(a, b, step)]
        self.remaining = len(self.ranges)
        self.lock = threading.Lock()


def _stream_range(pool: _SourcePool, job: _BlobJob, start: int, end: int, preferred: int,
                  stats: PullStats, bar, total_bar) -> None:
    """Download [start, end) of a blob into its partial file, retrying and failing over."""
    pos = start
    attempts = 0
    tried = set()
    while pos < end:
        source = pool.pick(preferred + attempts, exclude=tried)
        try:
            with pool.sem[source.name]:
                ask_end = None if end == job.desc.size else end
                resp = source.client.blob(source.repository, job.desc.digest, pos, ask_end)
                with resp:
                    if resp.status_code == 200 and pos > 0:
                        if not job.sequential:
                            raise RegistryError(f"{source.name}: ignored a Range request")
                        # The server does not do ranges: restart this blob from zero.
                        pos = start = 0
                        job.hasher = job.desc.digest.hasher()
                    read = getattr(resp.raw, "read1", None) or resp.raw.read  # read1: keep what arrived before a reset
                    while pos < end:
                        chunk = read(min(READ_CHUNK, end - pos), decode_content=False)
                        if not chunk:
                            raise RegistryError(f"{source.name}: connection closed after {format_size(pos)} of "
                                                f"{format_size(job.desc.size)}")
                        job.partial.write(pos, chunk)
                        if job.hasher is not None:
                            job.hasher.update(chunk)
                        pos += len(chunk)
                        stats.add(source.name, len(chunk))
                        bar.update(len(chunk))
                        total_bar.update(len(chunk))
        except NotFoundError as e:
            tried.add(source.name)
            pool.fail(source, e.message, fatal=False)
            if len(tried) >= len(pool.sources):
                raise RegistryError(f"blob {job.desc.digest.short} is on no source: {e.message}")
        except (RegistryError,) + _NET_ERRORS as e:
            # one readable phrase ("connection reset", "timed out"), not urllib3's nested repr
            message = e.message if isinstance(e, ImgtoolError) else f"{source.client.host}: {short_error(e)}"
            attempts += 1
            fatal = attempts % 3 == 0  # three strikes on one source drop it for the run
            pool.fail(source, message, fatal=fatal)
            if fatal:
                tried.add(source.name)
            time.sleep(min(0.2 * attempts, 2.0))


def download(images: Sequence[Tuple[PulledImage, Sequence[Source]]], store: Store, progress: Progress,
             jobs: int = 4, per_source: int = 8, big_blob: int = BIG_BLOB, segment: int = SEGMENT,
             skip: Collection[Digest] = (), stats: Optional[PullStats] = None,
             order: Sequence[Digest] = ()) -> PullStats:
    """Bring every layer of `images` (but those in `skip`: a delta bundle leaves them out) into the store;
    returns what was transferred.

    Raises RegistryError when every source failed for some blob, StoreError on disk
    trouble, VerifyError when a blob kept arriving corrupt.
    """
    stats = stats if stats is not None else PullStats()  # the caller's: it may watch `fresh` grow
    wanted: Dict[Digest, Tuple[Descriptor, Sequence[Source]]] = {}
    for image, sources in images:
        for layer in image.manifest.layers:
            if layer.digest not in skip:
                wanted.setdefault(layer.digest, (layer, sources))
    todo = []
    for desc, sources in wanted.values():
        if store.has(desc.digest, desc.size):
            stats.blobs_cached += 1
            stats.bytes_cached += desc.size
        else:
            todo.append((desc, sources))
    if not todo:
        return stats
    # `order` first (fetch: the bundle's archive order, so its writer can start on the first blob early)
    rank = {d: i for i, d in enumerate(order)}
    todo.sort(key=lambda t: rank.get(t[0].digest, len(rank)))
    total = sum(d.size - store.partial_bytes(d.digest, d.size) for d, _ in todo)
    pools: Dict[int, _SourcePool] = {}
    with progress.bar(total, "download") as total_bar, ThreadPoolExecutor(max_workers=max(1, jobs)) as executor:
        futures = []
        for i, (desc, sources) in enumerate(todo):
            pool = pools.setdefault(id(sources), _SourcePool(sources, per_source))
            futures.append(executor.submit(_download_blob, pool, desc, store, progress, stats, total_bar, i,
                                          big_blob, segment))
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f.done() and f.exception() is not None:
                for other in futures:
                    other.cancel()
                raise f.exception()
        for f in futures:
            f.result()
    return stats


def _download_blob(pool: _SourcePool, desc: Descriptor, store: Store, progress: Progress, stats: PullStats,
                   total_bar, index: int, big_blob: int, segment: int) -> None:
    with store.lock(desc.digest):
        if store.has(desc.digest, desc.size):  # another imgtool finished it meanwhile
            with stats.lock:
                stats.blobs_cached += 1
                stats.bytes_cached += desc.size
            return
        for attempt in range(BLOB_ATTEMPTS):
            partial = store.partial(desc.digest, desc.size)
            try:
                with stats.lock:
                    stats.resumed_bytes += partial.done_bytes
                job = _BlobJob(desc, partial, segment if desc.size >= big_blob else None)
                label = f"{desc.digest.short} ({format_size(desc.size)})"
                with progress.bar(desc.size, label) as bar:
                    bar.update(partial.done_bytes)
                    if len(job.ranges) <= 1:
                        for a, b in job.ranges:
                            _stream_range(pool, job, a, b, index, stats, bar, total_bar)
                    else:
                        # Ranges of one big blob run side by side, each preferring another source.
                        with ThreadPoolExecutor(max_workers=min(4, len(job.ranges))) as seg_pool:
                            fs = [seg_pool.submit(_stream_range, pool, job, a, b, index + k, stats, bar, total_bar)
                                  for k, (a, b) in enumerate(job.ranges)]
                            for f in fs:
                                f.result()
                partial.commit(job.hasher.hexdigest() if job.hasher is not None else None)
                with stats.lock:
                    stats.blobs_downloaded += 1
                    stats.fresh.add(desc.digest)
                progress.note(f"{desc.digest.short}: done ({format_size(desc.size)})")
                return
            except VerifyError as e:
                progress.warn(f"{e.message}; downloading it again")
                if attempt + 1 == BLOB_ATTEMPTS:
                    raise VerifyError(f"blob {desc.digest} arrived corrupt {BLOB_ATTEMPTS} times; giving up",
                                      hint="a proxy or mirror is damaging data; try another with --mirror NAME")
            finally:
                partial.flush_state()
                partial.close()
