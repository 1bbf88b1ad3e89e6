"""A resolved model's files into the store (or a bundle's regions) through the one downloader: each file a blob
named by its sha256, fetched by puller.download_blobs in ranges over every agreeing hub endpoint, resumable from
the store's partial files, checked against the hub's digest; a file that keeps arriving with other bytes is
named by its path.
"""

import dataclasses
import threading
from typing import TYPE_CHECKING, Collection, Dict, List, Optional, Sequence

from .config import HubEnvironment, MirrorConfig
from .errors import CorruptBlob, VerifyError
from .hubs import HubResolution, open_hubs, resolve
from .model import Digest, format_size
from .progress import Progress
from .puller import BLOB_ATTEMPTS, CONNECTIONS, DEFAULT_TUNING, JOBS, PullStats, Tuning, download_blobs
from .store import Store
from .weights import ModelRef

if TYPE_CHECKING:
    from .bundle.regions import Regions


def pull_model(res: HubResolution, store: Store, progress: Progress, *, jobs: int = JOBS,
               connections: int = CONNECTIONS, tuning: Tuning = DEFAULT_TUNING, stats: Optional[PullStats] = None,
               order: Sequence[Digest] = (), cancel: Optional[threading.Event] = None,
               regions: Optional["Regions"] = None) -> PullStats:
    """Every file of `res` (completed: `HubResolution.complete`) not yet in the store (or, those `regions` holds,
    into their regions); what was transferred. Raises VerifyError naming the file whose bytes never matched the
    sha256 the hub lists, or that changed size under its commit; RegistryError when every endpoint failed for a
    file; StoreError; ValueError when `res` is not completed."""
    try:
        return download_blobs(res.blobs(), store, progress, jobs=jobs, stats=stats, order=order, cancel=cancel,
                              tuning=tuning, connections=connections, regions=regions)
    except CorruptBlob as e:
        paths = [f.path for f in res.snapshot.files if str(f.sha256) == e.digest]
        raise VerifyError(f"{res.ref}: {', '.join(paths) or e.digest}: the bytes the hub serves do not match the "
                          f"sha256 it lists ({e.digest}), {BLOB_ATTEMPTS} times; refused",
                          hint="the hub's listing and its bytes disagree: try another endpoint with --mirror NAME, "
                               "or pin another commit") from e


# --- fetch's model step --------------------------------------------------------------------------------------------

def resolve_models(refs: Sequence[ModelRef], config: MirrorConfig, env: HubEnvironment, store: Store,
                   progress: Progress, *, mirror: str = "auto", timeout: float = 5.0,
                   pins: Optional[Dict[str, str]] = None) -> List[HubResolution]:
    """Each model reference resolved (its revision to a commit: `pins`, from bundle.lock, names it by the reference
    as asked) and completed (every file with its sha256: small git files through the store). Raises as
    hubs.resolve and HubResolution.complete do; UsageError for an unknown --mirror."""
    from .model_dir import open_dir

    out: List[HubResolution] = []
    for ref in refs:
        if ref.directory is not None:  # a local snapshot: hashed here, read from there (model_dir.py)
            out.append(open_dir(ref, progress))
            continue
        asked = ref
        if pins and ref.asked in pins:
            ref = dataclasses.replace(ref, revision=pins[ref.asked])
        only = mirror if mirror != "auto" and any(m.name == mirror for m in config.model_mirrors) else None
        res = resolve(ref, open_hubs(ref, config, env, only=only), timeout)
        for note in res.notes:
            progress.note(note)
        for warning in res.warnings:
            progress.warn(warning)
        res = res.complete(store)
        if asked is not ref:  # the bundle records the reference as asked, at the pinned commit
            res = dataclasses.replace(res, ref=asked, snapshot=dataclasses.replace(res.snapshot, ref=asked))
        progress.note(f"{asked}: commit {res.commit} via {', '.join(h.name for h in res.hubs)} "
                      f"({len(res.snapshot.files)} files, {format_size(res.snapshot.size)})")
        out.append(res)
    return out


def source_of(res: HubResolution) -> str:
    """Where a model came from, for bundle.json and the lock: the fastest agreeing endpoint, or the directory."""
    return res.hubs[0].name if res.hubs else getattr(res, "directory", "")


def carrying(res: HubResolution, omitted: Collection[Digest]) -> HubResolution:
    """`res` narrowed to the files a bundle carries (a delta leaves out those whose sha256 the other side holds)."""
    if not omitted:
        return res
    files = tuple(f for f in res.snapshot.files if f.sha256 not in omitted)
    return dataclasses.replace(res, snapshot=dataclasses.replace(res.snapshot, files=files), _sources=None)
