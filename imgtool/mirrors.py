"""Which endpoints can serve a reference, how healthy they are, and what the tag means.

`sources_for` turns a reference into the ordered list of `Source`s that serve its
registry (DaoCloud-style prefix rewrite, NJU-style host swap). `probe` checks them all
in parallel (`/v2/` plus a manifest HEAD, short timeouts). `resolve` picks the digest
of the tag ONCE, preferring the upstream, and drops mirrors that disagree (a stale
pull-through cache); the healthy rest is ordered by latency.
"""

import ipaddress
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, TypeVar
from urllib.parse import urlsplit

from .config import Mirror, MirrorConfig
from .errors import CredentialHelperError, ImgtoolError, LoginWithheld, NotFoundError, RegistryError, UsageError
from .model import Digest, ImageRef
from .registry import RegistryClient


@dataclass
class Source:
    """One endpoint for one reference: a mirror entry and the repository path on it."""

    mirror: Mirror
    repository: str
    client: RegistryClient = field(repr=False)

    @property
    def name(self) -> str:
        return self.mirror.name

    @property
    def is_upstream(self) -> bool:
        return self.mirror.is_upstream

    @property
    def location(self) -> str:
        """The rewritten reference as a user would write it: m.daocloud.io/quay.io/ascend/vllm-ascend."""
        return f"{urlsplit(self.mirror.url).netloc}/{self.repository}"

    def describe(self) -> str:
        return f"{self.name} ({self.location})"


def _is_loopback(host: str) -> bool:
    hostname = urlsplit(f"//{host}").hostname or ""
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def direct_mirror(registry: str) -> Mirror:
    """The implicit entry for a registry that mirrors.toml does not list.

    Loopback registries are reached over plain HTTP, like Docker's default insecure set.
    """
    if _is_loopback(registry):
        return Mirror(name=registry, registry=registry, url=f"http://{registry}", insecure=True, upstream=True)
    return Mirror(name=registry, registry=registry, url=f"https://{registry}")


class Clients:
    """One RegistryClient per mirror entry for a whole run, made when first needed: every reference a
    verb resolves (and every check before) shares its endpoint's client, so its tokens, its kept-alive
    connections and its login (a credential helper asked on the first 401) are had once per host."""

    def __init__(self, config: MirrorConfig):
        self.config = config
        self._made: Dict[Mirror, RegistryClient] = {}

    def client(self, m: Mirror) -> RegistryClient:
        """The mirror's client (its reads allowed to stall `config.read_timeout` seconds)."""
        if m not in self._made:
            self._made[m] = RegistryClient(m.url, insecure=m.insecure, ca_cert=m.ca_cert,
                                           read_timeout=self.config.read_timeout,
                                           helper_timeout=self.config.helper_timeout,
                                           response_timeout=self.config.response_timeout,
                                           min_rate=self.config.min_rate)
        return self._made[m]


def sources_for(ref: ImageRef, config: MirrorConfig, only: Optional[str] = None,
                clients: Optional[Clients] = None) -> List[Source]:
    """The sources serving `ref`'s registry in file order, each with its mirror's client from `clients`
    (None: new clients); `only` forces one by name. Raises UsageError for an unknown `only` name.
    """
    entries = [m for m in config.mirrors if m.registry == ref.registry]
    if only and only != "auto":
        names = [m.name for m in config.mirrors]
        chosen = [m for m in config.mirrors if m.name == only]
        if not chosen:
            raise UsageError(f"unknown mirror {only!r}", hint=f"known mirrors: {', '.join(names) or 'none'} (or auto); see {config.path}")
        if chosen[0].registry != ref.registry:
            raise UsageError(f"mirror {only!r} serves {chosen[0].registry}, not {ref.registry}")
        entries = chosen
    if not entries:
        entries = [direct_mirror(ref.registry)]
    clients = clients if clients is not None else Clients(config)
    out = []
    for m in entries:
        repo = f"{m.prefix}/{ref.repository}" if m.prefix else ref.repository
        out.append(Source(m, repo, clients.client(m)))
    return out


@dataclass
class Probe:
    """What one source said about a reference."""

    source: Source
    reachable: bool = False
    latency: Optional[float] = None  # seconds for /v2/ plus the manifest HEAD
    digest: Optional[Digest] = None  # what the tag (or digest) resolves to there
    media_type: str = ""
    error: str = ""
    not_found: bool = False  # reachable, and answered that it does not have the reference
    stale: bool = False  # answered with a digest that differs from the chosen one
    hint: Optional[str] = None  # what to do about `error`, when it is not the network's (a credential helper)

    def to_json(self) -> dict:
        return {
            "name": self.source.name,
            "url": self.source.mirror.url,
            "reference": self.source.location,
            "reachable": self.reachable,
            "latency_ms": None if self.latency is None else round(self.latency * 1000, 1),
            "digest": str(self.digest) if self.digest else None,
            "media_type": self.media_type or None,
            "stale": self.stale,
            "error": self.error or None,
        }


def _probe_one(source: Source, ref: ImageRef, timeout: float, body: bool = False) -> Probe:
    p = Probe(source)
    start = time.monotonic()
    try:
        source.client.ping(timeout=(timeout, timeout))
        p.reachable = True
        _, ctype, digest = source.client.manifest(source.repository, ref.reference, head=not body,
                                                  timeout=(timeout, timeout))
        if digest is None:  # some registries omit Docker-Content-Digest on HEAD
            _, ctype, digest = source.client.manifest(source.repository, ref.reference, timeout=(timeout, timeout))
        p.digest, p.media_type = digest, ctype
        p.latency = time.monotonic() - start
    except NotFoundError:
        p.error, p.not_found = f"{ref.reference} not found", True
    except (CredentialHelperError, LoginWithheld) as e:  # what to do about it is not the network's
        p.error, p.hint = e.message, e.hint
    except ImgtoolError as e:
        p.error = e.message
    return p


def probe(sources: List[Source], ref: ImageRef, timeout: float = 5.0, body: bool = False) -> List[Probe]:
    """Probe every source in parallel; results in the sources' order. `body`: GET the manifest (a source must
    send an answer's body in time too, as `imgtool mirrors` checks), not only HEAD it."""
    if not sources:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(sources))) as pool:
        return list(pool.map(lambda s: _probe_one(s, ref, timeout, body), sources))


def reachable(sources: List[Source], timeout: float = 5.0):
    """Ping every source's `/v2/` in parallel, once, no retries: ([reachable sources], {name: error}).

    A dead network then fails in one connect attempt, not after every source's retries in turn.
    """
    def one(source: Source) -> Optional[str]:
        try:
            source.client.ping(timeout=(timeout, timeout))
            return None
        except ImgtoolError as e:
            return e.message

    if not sources:
        return [], {}
    with ThreadPoolExecutor(max_workers=min(8, len(sources))) as pool:
        errors = list(pool.map(one, sources))
    return ([s for s, err in zip(sources, errors) if err is None],
            {s.name: err for s, err in zip(sources, errors) if err is not None})


def ping_probes(sources: List[Source], timeout: float = 5.0) -> List[Probe]:
    """Reachability and `/v2/` latency of every source, in parallel (no reference asked for)."""
    def one(source: Source) -> Probe:
        p = Probe(source)
        try:
            p.latency = source.client.ping(timeout=(timeout, timeout))
            p.reachable = True
        except ImgtoolError as e:
            p.error = e.message
        return p

    if not sources:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(sources))) as pool:
        return list(pool.map(one, sources))


@dataclass
class Resolution:
    """The outcome of mirror selection for one reference."""

    ref: ImageRef  # canonical, with the digest the tag resolved to
    digest: Digest
    sources: List[Source]  # healthy and in agreement, fastest first
    probes: List[Probe]
    notes: List[str]  # for the record: sources that did not answer
    warnings: List[str] = field(default_factory=list)  # worth attention: mirrors serving a stale digest


def resolve(ref: ImageRef, sources: List[Source], timeout: float = 5.0) -> Resolution:
    """Resolve the tag to a digest once and order the sources that agree by latency.

    Raises RegistryError naming every source and its error when none can serve `ref`.
    """
    probes = probe(sources, ref, timeout)
    ok = [p for p in probes if p.reachable and p.digest]
    if not ok:
        raise _none_serves(ref, probes)
    chosen = ref.digest or _choose(ok)
    warnings = _mark_stale(ref, ok, chosen)
    if ref.digest and not any(not p.stale for p in ok):
        detail = "; ".join(f"{p.source.describe()}: expected {chosen}, got {p.digest}" for p in ok)
        raise RegistryError(f"no source serves {ref} under its digest: {detail}",
                            hint="a digest names its content: these sources (or a proxy between) answer with other "
                                 "content; try another source with --mirror NAME")
    notes = [f"source {p.source.name} unreachable: {p.error}" for p in probes if not p.reachable]
    healthy = sorted((p for p in ok if not p.stale), key=lambda p: p.latency or 0)
    return Resolution(ref.with_digest(chosen) if not ref.digest else ref, chosen, [p.source for p in healthy], probes, notes,
                      warnings)


def _mark_stale(ref: ImageRef, answers: List[Probe], chosen: Digest) -> List[str]:
    """Mark each answer whose digest is not `chosen` stale; the warnings that say so."""
    warnings = []
    for p in answers:
        if p.digest == chosen:
            continue
        p.stale = True
        if ref.digest:  # asked by digest: another answer is other content under that name, not an old tag
            warnings.append(f"mirror {p.source.describe()} answered {ref.reference} with a manifest whose digest "
                            f"is {p.digest}: expected {chosen}, got {p.digest}; not used")
        else:
            warnings.append(f"mirror {p.source.name} serves {p.digest.short if p.digest else '-'} for "
                            f"{ref.reference}, not {chosen.short} (a stale cache?): not used for this image")
    return warnings


def _none_serves(ref: ImageRef, probes: List[Probe]) -> RegistryError:
    """The error when no source answered with a digest: not found when every reachable one said so."""
    reachable = [p for p in probes if p.reachable]
    detail = "; ".join(f"{p.source.describe()}: {p.error or 'no answer'}" for p in probes)
    if reachable and all(p.not_found for p in reachable):
        return NotFoundError(f"{ref} not found: {detail}", hint="check the tag (imgtool tags) or the mirror list (imgtool mirrors)")
    hints = [p.hint for p in probes if p.hint]  # a failing credential helper says what to do about it
    return RegistryError(f"no source can serve {ref}: {detail}",
                         hint=hints[0] if hints else "check the network or proxy, or force a source with --mirror NAME")


def _choose(answers: List[Probe]) -> Digest:
    """The digest a tag means: the upstream registry's answer; with upstream unreachable, the digest most
    sources agree on, ties to the fastest."""
    return agreed([(p.digest, p.source.is_upstream, p.latency or 0) for p in answers if p.digest])


T = TypeVar("T")


def agreed(answers: Sequence[Tuple[T, bool, float]]) -> T:
    """What several sources' answers (answer, from upstream, latency) mean: upstream's; without it, the answer most
    sources agree on, ties to the fastest (a tag's digest here, a model revision's commit in hubs/)."""
    upstream = [value for value, is_upstream, _ in answers if is_upstream]
    if upstream:
        return upstream[0]
    counts: Dict[T, int] = {}
    for value, _, _ in answers:
        counts[value] = counts.get(value, 0) + 1
    fastest = sorted(answers, key=lambda a: a[2])
    return max((value for value, _, _ in fastest), key=lambda v: counts[v])
