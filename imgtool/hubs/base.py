"""What every model hub endpoint answers (the interface the hubs room keeps), and a hub as a download's source.

`Hub`: one endpoint (the hub itself, `$HF_ENDPOINT`, a `[[model_mirrors]]` entry) of Hugging Face
(hubs/huggingface.py) or ModelScope (hubs/modelscope.py): a revision resolved to its commit, the snapshot of the
files at that commit with their sizes and sha256 (checked: names from a hub are data), and one try of a file's raw
bytes from an offset, its size held to the listing's. `HubSource`: a hub endpoint in the shape of the puller's
sources (puller_sources.BlobSource), a blob being a snapshot's file named by its sha256, so the one ranged,
multi-connection, multi-source, resumable downloader (puller.download_blobs) fetches model files too.
"""

import json
import re
from typing import Any, Callable, Dict, List, Optional

from ..errors import ManifestError, NotFoundError, RegistryError, UsageError, VerifyError
from ..model import Digest
from ..registry_answers import BlobStream, RetryPolicy
from ..weights import ModelFile, ModelRef, ModelSnapshot
from .http import HubHttp

_HEX40 = re.compile(r"[0-9a-f]{40}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


class MissingOnHub(NotFoundError):
    """An endpoint's answer that it has no such model, or no such revision of it: `why` says which (and what the hub
    said), for the one message that names every endpoint asked."""

    def __init__(self, host: str, ref: ModelRef, why: str):
        super().__init__(f"{host}: {ref}: {why}")
        self.host, self.why = host, why


class Hub:
    """One endpoint of a model hub. Subclasses say how to ask for a commit, a listing and a file."""

    kind = ""  # "hf" or "modelscope": the ModelRef.hub it serves
    token_hint = ""  # how to give this hub's token (the hint of a model not found: it may be gated or private)

    def __init__(self, name: str, http: HubHttp, upstream: bool = False):
        self.name, self.http, self.upstream = name, http, upstream

    @property
    def host(self) -> str:
        return self.http.host

    def describe(self) -> str:
        return f"{self.name} ({self.http.base_url})"

    # -- what a hub says (its room) ------------------------------------------------------------------------

    def commit(self, ref: ModelRef, timeout=None) -> str:
        """The commit `ref`'s revision names here (ModelScope: the revision itself when it gives no commit).
        Raises NotFoundError, RegistryError, ManifestError."""
        raise NotImplementedError

    def listing(self, ref: ModelRef, commit: str) -> List[ModelFile]:
        """Every file at `commit`, as the hub lists it. Raises NotFoundError, RegistryError, ManifestError (an
        answer that is not a listing, or an entry that is not a file or a directory: a link)."""
        raise NotImplementedError

    def file_url(self, ref: ModelRef, commit: str, path: str) -> str:
        """Where the file's bytes are (`path` checked already)."""
        raise NotImplementedError

    # -- the interface ----------------------------------------------------------------------------------------

    def snapshot(self, ref: ModelRef, commit: Optional[str] = None) -> ModelSnapshot:
        """The model at `commit` (None: the commit `ref`'s revision names here), its listing checked: a name that is
        not a safe relative path, twice, or a file and a directory at once is refused (ManifestError, exit 4:
        a hub's answer, as a malformed manifest is). Raises NotFoundError, RegistryError, ManifestError."""
        commit = commit or self.commit(ref)
        snap = ModelSnapshot(ref, commit, tuple(self.listing(ref, commit)))
        try:
            snap.check()
        except UsageError as e:
            raise ManifestError(f"{self.host}: {e.message}") from e
        return snap

    def open_file(self, snapshot: ModelSnapshot, f: ModelFile, start: int = 0, end: Optional[int] = None) -> BlobStream:
        """One try of the file's raw bytes [start, end) (end None: to its end); `whole` says the server ignored the
        Range and sends the file from its first byte. The size the server gives is held to the listing's: a file
        that grew (or shrank) since it was listed is refused (VerifyError). Raises NotFoundError,
        RegistryUnavailable, RegistryError, VerifyError."""
        what = f"{snapshot.ref}: {f.path}"
        stream, status, headers = self.http.stream(self.file_url(snapshot.ref, snapshot.commit, f.path), start, end,
                                                   what)
        try:
            served = _served_size(status, headers, start)
        except ValueError as e:
            stream.close()
            raise RegistryError(f"{self.host}: {what}: {e}") from None
        if served is not None and served != f.size:
            stream.close()
            raise VerifyError(f"{what}: the hub serves {served} bytes where its listing says {f.size}: the file "
                              f"changed under commit {snapshot.commit[:12]}; refused",
                              hint="fetch the model again later (its revision may be being rewritten), or pin "
                                   "another commit")
        return stream


def _served_size(status: int, headers: Dict[str, str], start: int) -> Optional[int]:
    """The whole file's size as an answer gives it (206: Content-Range's total; 200: Content-Length), or None when
    it does not say; ValueError for a 206 whose range does not start where asked."""
    lower = {k.lower(): v for k, v in headers.items()}
    if status == 206:
        m = re.match(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", lower.get("content-range", ""))
        if not m:
            raise ValueError(f"a partial answer without a usable Content-Range ({lower.get('content-range', '')[:80]!r})")
        if int(m.group(1)) != start:
            raise ValueError(f"asked for bytes from {start}, sent bytes from {m.group(1)}")
        return None if m.group(3) == "*" else int(m.group(3))
    length = lower.get("content-length", "")
    return int(length) if length.isdigit() else None


def sha256_of(value: object) -> Optional[Digest]:
    """A hub's sha256 (64 lower-case hex digits) as a Digest; None for an empty value. Raises ValueError."""
    if value in (None, ""):
        return None
    if not isinstance(value, str) or not _HEX64.match(value):
        raise ValueError(f"{str(value)[:80]!r} is not a sha256")
    return Digest("sha256", value)


def json_value(data: bytes, bad: Callable[[str], Exception]) -> Any:
    """The JSON value `data` holds (read whole and capped by the caller); otherwise raises bad(why), nesting too
    deep for the parser included (never a RecursionError)."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"not valid JSON ({e})") from e
    except RecursionError:
        raise bad("not valid JSON (nested too deeply)") from None


def is_hex40(value: object) -> bool:
    return isinstance(value, str) and bool(_HEX40.match(value))


def not_a_listing(host: str, ref: ModelRef, why: str) -> ManifestError:
    return ManifestError(f"{host}: {ref}: the hub's listing is not one imgtool reads: {why}")


class HubSource:
    """A hub endpoint as one of a download's sources (puller_sources.BlobSource): `blob(digest, start, end)` is
    one try of the snapshot's file whose sha256 is `digest` (the puller retries, maybe elsewhere, by `retry`)."""

    def __init__(self, hub: Hub, snapshot: ModelSnapshot):
        self.hub, self.snapshot = hub, snapshot
        self.retry: RetryPolicy = hub.http.retry
        self._files: Dict[Digest, ModelFile] = {f.sha256: f for f in snapshot.files if f.sha256 is not None}

    @property
    def name(self) -> str:
        return self.hub.name

    @property
    def repository(self) -> str:
        return self.snapshot.ref.repo

    @property
    def client(self) -> "HubSource":
        return self

    def describe(self) -> str:
        return self.hub.describe()

    def blob(self, repository: str, digest: Digest, start: int = 0, end: Optional[int] = None, *,
             retry: bool = True) -> BlobStream:
        """One try of the bytes [start, end) of the file whose sha256 is `digest` (`retry` is the puller's: it
        tries again itself). Raises NotFoundError, RegistryUnavailable, RegistryError, VerifyError."""
        f = self._files.get(digest)
        if f is None:
            raise NotFoundError(f"{self.hub.host}: {self.snapshot.ref} has no file with sha256 {digest.short}")
        return self.hub.open_file(self.snapshot, f, start, end)
