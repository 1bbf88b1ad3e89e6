"""A resolved model's files into the store (or a bundle's regions) through the one downloader: each file a blob
named by its sha256, fetched by puller.download_blobs in ranges over every agreeing hub endpoint, resumable from
the store's partial files, checked against the hub's digest; a file that keeps arriving with other bytes is
named by its path.
"""

import threading
from typing import TYPE_CHECKING, Optional, Sequence

from .errors import CorruptBlob, VerifyError
from .hubs import HubResolution
from .model import Digest
from .progress import Progress
from .puller import BLOB_ATTEMPTS, CONNECTIONS, DEFAULT_TUNING, JOBS, PullStats, Tuning, download_blobs
from .store import Store

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
