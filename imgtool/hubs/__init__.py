"""The model hubs as an outside system (issue 48): where a model's snapshot and its files come from.

    hubs = open_hubs(ref, config, env)     # the endpoints serving ref's hub: $HF_ENDPOINT, [[model_mirrors]], the hub
    res = resolve(ref, hubs)               # probed in parallel: the commit, the agreeing endpoints fastest first,
                                           # the listing from the fastest (checked: names from a hub are data)
    res = res.complete(store)              # small git files the hub gives no sha256 for: downloaded whole, checked
                                           # against their git blob id, hashed, kept in the store (by git blob
                                           # id too: a later run downloads them no more)
    model_pull.pull_model(res, store, progress)   # every file through puller.download_blobs, by its sha256

One room per hub (hubs/huggingface.py, hubs/modelscope.py) behind `hubs.base.Hub`; the transport is hubs/http.py.
Mirrors work as for images (mirrors.py): every endpoint is asked what the revision's commit is, the hub's own
answer (or, without it, the most common one) wins, an endpoint answering another commit is stale and not used, and
the rest serve the files, fastest first, a big file in ranges over all of them.
"""

import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ..config import HubEnvironment, MirrorConfig
from ..errors import (ImgtoolError, ManifestError, NotFoundError, RegistryError,
                      RegistryUnavailable, UsageError, VerifyError)
from ..mirrors import agreed
from ..model import Descriptor, Digest
from ..registry_answers import RetryPolicy
from ..store import Store
from ..weights import FILEPATH, ModelFile, ModelRef, ModelSnapshot, is_commit
from . import huggingface, modelscope
from .base import Hub, HubSource, MissingOnHub
from .http import HubHttp

__all__ = ["Hub", "HubSource", "HubProbe", "HubResolution", "open_hubs", "resolve"]

READ_CHUNK = 256 * 1024
COMPLETING = 8  # small git files downloaded at once by HubResolution.complete
_ROOMS = {"hf": (huggingface.HuggingFace, huggingface.LOGIN_HINT),
          "modelscope": (modelscope.ModelScope, modelscope.LOGIN_HINT)}


@dataclass(frozen=True)
class _Endpoint:
    name: str
    url: str
    upstream: bool = False
    token: bool = False
    insecure: bool = False
    ca_cert: Optional[str] = None


def _login(hub: str, token: Optional[str]) -> Dict[str, str]:
    """The headers that carry a hub's token, as its client sends them (ModelScope's also as its session cookie)."""
    if not token:
        return {}
    if hub == "modelscope":
        return {"Authorization": f"Bearer {token}", "Cookie": f"m_session_id={token}"}
    return {"Authorization": f"Bearer {token}"}


def _endpoints(hub: str, config: MirrorConfig, env: HubEnvironment) -> List[_Endpoint]:
    """The endpoints of a hub in the order they are listed: the environment's (`$HF_ENDPOINT`, `$MODELSCOPE_ENDPOINT`
    or `$MODELSCOPE_DOMAIN`, which the hub's own client would use), mirrors.toml's `[[model_mirrors]]`, the hub
    itself; one URL once (the hub's, where one is, stays the upstream). The token goes to the environment's
    endpoint and the hub, as the hub's client sends it, and to a mirror only with `token = true`."""
    variable = "HF_ENDPOINT" if hub == "hf" else env.modelscope_variable  # named as the user set it
    env_url = env.hf_endpoint if hub == "hf" else env.modelscope_endpoint
    default = env.hf_default if hub == "hf" else env.modelscope_default
    found: List[_Endpoint] = []
    if env_url:
        found.append(_Endpoint(variable, env_url, token=True))
    found += [_Endpoint(m.name, m.url, m.upstream, m.token, m.insecure, m.ca_cert)
              for m in config.model_mirrors if m.hub == hub]
    if default:
        found.append(_Endpoint(urlsplit(default).netloc, default, upstream=True, token=True))
    out: Dict[str, _Endpoint] = {}
    for e in found:
        key = e.url.rstrip("/").lower()
        if key in out:
            kept = out[key]
            out[key] = replace(kept, upstream=kept.upstream or e.upstream, token=kept.token or e.token)
        else:
            out[key] = e
    return list(out.values())


def open_hubs(ref: ModelRef, config: MirrorConfig, env: HubEnvironment, only: Optional[str] = None,
              retry: Optional[RetryPolicy] = None, connect_timeout: float = 10.0) -> List[Hub]:
    """The endpoints serving `ref`'s hub (see `_endpoints`), each with its client (the waits of `config`: read
    timeout, response timeout, minimum rate); `only` forces one by name (`--mirror NAME`). Raises UsageError for
    an unknown name or a malformed URL."""
    if ref.hub not in _ROOMS:
        raise UsageError(f"{ref}: not a model hub reference (hf:ORG/NAME or modelscope:ORG/NAME)")
    room, hint = _ROOMS[ref.hub]
    token = env.hf_token if ref.hub == "hf" else env.modelscope_token
    endpoints = _endpoints(ref.hub, config, env)
    if only and only != "auto":
        chosen = [e for e in endpoints if e.name == only]
        if not chosen:
            names = ", ".join(e.name for e in endpoints) or "none"
            raise UsageError(f"unknown mirror {only!r} for {ref.hub}", hint=f"known: {names} (or auto); see {config.path}")
        endpoints = chosen
    hubs: List[Hub] = []
    for e in endpoints:
        try:
            http = HubHttp(e.url, login=_login(ref.hub, token) if e.token else None, login_hint=hint,
                           insecure=e.insecure, ca_cert=e.ca_cert, connect_timeout=connect_timeout,
                           read_timeout=config.read_timeout, response_timeout=config.response_timeout,
                           min_rate=config.min_rate, retry=retry)
        except ValueError:
            raise UsageError(f"invalid endpoint URL {e.url!r} ({e.name})") from None
        hubs.append(room(e.name, http, e.upstream))
    return hubs


@dataclass
class HubProbe:
    """What one endpoint said a revision is."""

    hub: Hub
    commit: Optional[str] = None
    latency: Optional[float] = None
    error: str = ""
    not_found: bool = False
    missing: str = ""  # not_found: what the endpoint said is missing (no such model, no such revision)
    stale: bool = False  # answered another commit than the chosen one
    hint: Optional[str] = None

    def to_json(self) -> dict:
        return {"name": self.hub.name, "url": self.hub.http.base_url, "commit": self.commit,
                "latency_ms": None if self.latency is None else round(self.latency * 1000, 1),
                "stale": self.stale, "error": self.error or None}


def _probe(hub: Hub, ref: ModelRef, timeout: float) -> HubProbe:
    p = HubProbe(hub)
    start = time.monotonic()
    try:
        p.commit = hub.commit(ref, timeout=(timeout, timeout))
        p.latency = time.monotonic() - start
    except MissingOnHub as e:
        p.error, p.not_found, p.missing = e.message, True, e.why
    except NotFoundError as e:
        p.error, p.not_found, p.missing = e.message, True, e.message
    except ImgtoolError as e:
        p.error, p.hint = e.message, e.hint
    return p


def probe(hubs: Sequence[Hub], ref: ModelRef, timeout: float = 5.0) -> List[HubProbe]:
    """Every endpoint asked for the revision's commit, in parallel; results in the endpoints' order."""
    if not hubs:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(hubs)), thread_name_prefix="hub-probe") as pool:
        return list(pool.map(lambda h: _probe(h, ref, timeout), hubs))


@dataclass
class HubResolution:
    """A model reference resolved: the commit, its snapshot, and the endpoints that agree on it, fastest first."""

    ref: ModelRef
    commit: str
    snapshot: ModelSnapshot
    hubs: List[Hub]
    probes: List[HubProbe]
    notes: List[str] = field(default_factory=list)  # endpoints that did not answer
    warnings: List[str] = field(default_factory=list)  # endpoints serving another commit (stale), not used
    _sources: Optional[List[HubSource]] = field(default=None, repr=False)

    @property
    def pinned(self) -> bool:
        """Whether the hub named a commit (Hugging Face always does; ModelScope's /revisions may give none, and
        then `commit` is the revision's name, which can move)."""
        return is_commit(self.commit)

    def listing_digest(self) -> Digest:
        """The sha256 of the listing: a line `DIGEST SIZE PATH` per file, sorted by path, DIGEST the file's sha256
        (or `git:<oid>` before `complete` where the hub gives only that). What lock records beside a revision that
        is not a commit: the name plus this digest are the snapshot, and `hold_to` refuses another."""
        lines = sorted(f"{f.sha256 or 'git:' + str(f.git_oid)} {f.size} {f.path}\n" for f in self.snapshot.files)
        return Digest("sha256", hashlib.sha256("".join(lines).encode("utf-8")).hexdigest())

    def hold_to(self, listing: Digest) -> None:
        """Refuse this resolution unless its listing is `listing` (the one lock recorded). Raises VerifyError naming
        the revision when the files under it changed."""
        found = self.listing_digest()
        if found == listing:
            return
        what = "its commit" if self.pinned else f"revision {self.commit!r} (the hub gives no commit for it)"
        raise VerifyError(f"{self.ref}: the files under {what} are not the ones locked: listing {found.short}, the "
                          f"lock has {listing.short}; refused",
                          hint="lock again to take the new files, or name a revision that does not move (a tag)")

    def sources(self) -> List[HubSource]:
        """The endpoints as the puller's sources, one list for every file (so they share one pool)."""
        if self._sources is None:
            self._sources = [HubSource(h, self.snapshot) for h in self.hubs]
        return self._sources

    def blobs(self) -> List[Tuple[Descriptor, Sequence[HubSource]]]:
        """Every file as a blob to download (its digest its sha256, its path in `org.cncf.model.filepath`) with the
        endpoints that serve it; for `puller.download_blobs`. Raises ValueError before `complete` where a file
        has no sha256 yet."""
        missing = [f.path for f in self.snapshot.files if f.sha256 is None]
        if missing:
            raise ValueError(f"{self.ref}: no sha256 yet for {', '.join(missing[:3])}: complete() first")
        sources = self.sources()
        return [(Descriptor(f.media_type, f.sha256, f.size, annotations={FILEPATH: f.path}), sources)
                for f in self.snapshot.files if f.sha256 is not None]

    def complete(self, store: Store, cancel: Optional[threading.Event] = None) -> "HubResolution":
        """This resolution with every file's sha256: a file the hub gives none for (a small git file on Hugging
        Face) is downloaded whole into the store, checked against its git blob id, and hashed; one an earlier run
        kept (store.blob_for_git_oid, its bytes checked again) is not downloaded. Raises
        VerifyError (its bytes are not what the hub lists), RegistryError (no endpoint could send it),
        StoreError, Cancelled."""
        small = [f for f in self.snapshot.files if f.sha256 is None]
        if not small:
            return self
        # at once: one after the other, a model's five to ten small files took 0.4 s of a 10 s two-source fetch
        # (docs/benchmarks.md "Two sources, measured")
        with ThreadPoolExecutor(max_workers=min(COMPLETING, len(small)), thread_name_prefix="hub-small") as pool:
            hashed = dict(zip((f.path for f in small), pool.map(lambda f: self._hashed(f, store, cancel), small)))
        files = tuple(hashed.get(f.path, f) if f.sha256 is None else f for f in self.snapshot.files)
        return replace(self, snapshot=replace(self.snapshot, files=files), _sources=None)

    def _hashed(self, f: ModelFile, store: Store, cancel: Optional[threading.Event]) -> ModelFile:
        held = store.blob_for_git_oid(f.git_oid, f.size) if f.git_oid else None
        if held is not None:  # an earlier run's download, its bytes that git blob: not asked for again
            return replace(f, sha256=held)
        errors: List[str] = []
        for hub in self.hubs:
            policy = hub.http.retry
            for attempt in range(policy.attempts):
                try:
                    return _hash_one(hub, self.snapshot, f, store)
                except NotFoundError as e:
                    errors.append(f"{hub.describe()}: {e.message}")
                    break
                except RegistryError as e:
                    if attempt + 1 >= policy.attempts:
                        errors.append(f"{hub.describe()}: {e.message}")
                        break
                    wait = e.retry_after if isinstance(e, RegistryUnavailable) else None
                    policy.wait(policy.delay(attempt, wait), cancel)
        raise RegistryError(f"{self.ref}: {f.path}: no source could send it: {'; '.join(errors)}",
                            hint="check the network, or retry later")


def _hash_one(hub: Hub, snapshot: ModelSnapshot, f: ModelFile, store: Store) -> ModelFile:
    """One try of a small file, whole, into the store: the file with its sha256. Raises VerifyError when its bytes
    are longer than listed or not what its git blob id names, RegistryError (tried again by the caller)."""
    what = f"{snapshot.ref}: {f.path}"
    git = hashlib.sha1(b"blob %d\0" % f.size)
    got = 0
    with hub.open_file(snapshot, f) as stream, store.new_blob("hubfile") as blob:
        while True:
            chunk = stream.read(READ_CHUNK)
            if not chunk:
                break
            got += len(chunk)
            if got > f.size:
                raise VerifyError(f"{what}: the hub serves more than the {f.size} bytes its listing says: the file "
                                  f"changed under commit {snapshot.commit[:12]}; refused")
            git.update(chunk)
            blob.write(chunk)
        if got < f.size:
            raise RegistryError(f"{hub.host}: {what}: connection closed after {got} of {f.size} bytes")
        if f.git_oid is not None and git.hexdigest() != f.git_oid:
            raise VerifyError(f"{what}: its bytes have git blob id {git.hexdigest()}, the hub lists {f.git_oid}; "
                              "refused", hint="the hub's listing and its bytes disagree: try another endpoint with "
                                              "--mirror NAME")
        digest = blob.publish()
    if f.git_oid is not None:
        store.remember_git_oid(f.git_oid, digest)
    return replace(f, sha256=digest)


def resolve(ref: ModelRef, hubs: Sequence[Hub], timeout: float = 5.0) -> HubResolution:
    """The revision resolved to one commit, every endpoint asked at once: the upstream's answer (the hub's), else
    the commit most endpoints give (ties to the fastest); an endpoint giving another commit is stale and not used.
    The snapshot is listed by the fastest agreeing endpoint that can (checked: `Hub.snapshot`). Raises
    NotFoundError (every endpoint that answered has no such model or revision), RegistryError naming every
    endpoint and its error, ManifestError (a listing refused)."""
    probes = probe(hubs, ref, timeout)
    ok = [p for p in probes if p.commit]
    if not ok:
        raise _none_serves(ref, probes)
    chosen = ref.revision if ref.revision and is_commit(ref.revision) else _choose(ok)
    warnings = []
    for p in ok:
        if p.commit != chosen:
            p.stale = True
            warnings.append(f"mirror {p.hub.name} says {ref.default_revision} is {str(p.commit)[:12]}, not "
                            f"{chosen[:12]} (a stale mirror?): not used for this model")
    healthy = sorted((p for p in ok if not p.stale), key=lambda p: p.latency or 0)
    notes = [f"source {p.hub.name} unreachable: {p.error}" for p in probes if not p.commit and not p.not_found]
    errors = []
    for p in healthy:
        try:
            snapshot = p.hub.snapshot(ref, chosen)
        except ManifestError:
            raise  # a hostile or malformed listing is refused, not passed over
        except RegistryError as e:
            errors.append(f"{p.hub.describe()}: {e.message}")
            continue
        return HubResolution(ref, chosen, snapshot, [q.hub for q in healthy], probes, notes, warnings)
    raise RegistryError(f"no source can list {ref} at {chosen[:12]}: {'; '.join(errors)}",
                        hint="check the network or proxy, or force a source with --mirror NAME")


def _choose(answers: List[HubProbe]) -> str:
    """The commit a revision means, as mirrors.agreed decides a tag's digest."""
    return agreed([(p.commit, p.hub.upstream, p.latency or 0) for p in answers if p.commit])


def _none_serves(ref: ModelRef, probes: List[HubProbe]) -> RegistryError:
    detail = "; ".join(f"{p.hub.describe()}: {p.error or 'no answer'}" for p in probes) or "no endpoint"
    answered = [p for p in probes if p.not_found]
    if answered and len(answered) == len(probes):
        where = ", ".join(f"{p.hub.host} ({p.missing})" for p in answered)
        token = answered[0].hub.token_hint
        return NotFoundError(f"{ref.hub}:{ref.repo}@{ref.default_revision}: not found on {where}",
                             hint=f"check the revision {ref.default_revision!r} (a branch, tag or commit of the "
                                  f"model) and the model name {ref.repo!r} on the hub; a gated or private model is "
                                  f"not found without its token: {token}")
    hints = [p.hint for p in probes if p.hint]
    return RegistryError(f"no source can serve {ref}: {detail}",
                         hint=hints[0] if hints else "check the network or proxy, or force a source with --mirror NAME")
