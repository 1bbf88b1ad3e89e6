"""A local directory as a model's source (issue 48): a snapshot someone already downloaded, read instead of the hub.

    hf:ORG/NAME[@REVISION]=DIR            a plain directory (`huggingface-cli download --local-dir`, `modelscope
                                          download`, a copy): the user names the model
    .../models--ORG--NAME/snapshots/<c>   a Hugging Face cache's snapshot: it names the model and the commit

Each file is read once to hash it (the layout of an uncompressed bundle is a pure function of bundle.json, which
names every file's sha256, so the digests are needed before the first byte is placed), then once more by the one
downloader (puller.download_blobs, through `DirSource`) straight into its region of the bundle, checked again
against that sha256 on the way: a file changed between the two reads is refused, never bundled.

The names are data, as a hub's are (weights.check_path). Nothing outside DIR is read: in a Hugging Face cache a
snapshot's entries are links into the cache's own `blobs/` and only those are followed; any other link is refused.
"""

import dataclasses
import hashlib
import os
import re
import stat
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from .errors import NotFoundError, UsageError, VerifyError
from .fsutil import NotRegularFile, open_regular
from .hubs import HubResolution, HubSource
from .model import Digest, format_size
from .progress import Progress
from .registry_answers import RetryPolicy
from .weights import WEIGHT_RAW, ModelFile, ModelRef, ModelSnapshot, check_path, is_commit, layer_media_type

READ = 1 << 20
LFS_SIZE = 10 << 20  # a plain directory says nothing of LFS: a weight file or a file this big is taken as one
# what the hubs' clients keep beside a model's files: not the model's (top level only)
SKIP_DIRS = (".cache", ".git")
SKIP_FILES = (".msc", ".mdl", ".mv", ".imgtool-model.json", ".imgtool-lock")
_HEX40 = re.compile(r"[0-9a-f]{40}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


@dataclasses.dataclass
class DirResolution(HubResolution):
    """A model read from a local directory: `hubs` empty, `directory` where, `real` each file's path on disk (a
    Hugging Face cache's snapshot: its blob)."""

    directory: str = ""
    real: Dict[str, str] = dataclasses.field(default_factory=dict)

    def sources(self) -> List[HubSource]:
        if self._sources is None:
            self._sources = [DirSource(self.directory, self.snapshot, self.real)]
        return self._sources


class DirSource(HubSource):
    """The directory in the shape of the puller's sources: `blob(digest, start, end)` reads the file with that
    sha256 from `start`, refusing one whose size changed since it was hashed."""

    def __init__(self, directory: str, snapshot: ModelSnapshot, real: Dict[str, str]):  # no hub: not super()'s
        self.directory, self.snapshot, self.real = directory, snapshot, real
        self.retry = RetryPolicy(attempts=1, backoff=0.0)  # a local read failing once fails
        self._files = {f.sha256: f for f in snapshot.files if f.sha256 is not None}

    @property
    def name(self) -> str:
        return self.directory

    def describe(self) -> str:
        return self.directory

    def blob(self, repository: str, digest: Digest, start: int = 0,  # type: ignore[override]
             end: Optional[int] = None, *, retry: bool = True) -> "_FileStream":  # BlobStream's shape, no HTTP
        f = self._files.get(digest)
        if f is None:
            raise NotFoundError(f"{self.directory}: no file with sha256 {digest.short}")
        fp = open_regular(self.real[f.path])
        size = os.fstat(fp.fileno()).st_size
        if size != f.size:
            fp.close()
            raise VerifyError(f"{self.snapshot.ref}: {f.path}: changed since it was hashed ({size} bytes now, "
                              f"{f.size} then); refused", hint="leave the directory alone while fetch reads it")
        fp.seek(start)
        return _FileStream(fp, (f.size if end is None else end) - start)


class _FileStream:
    """A file's range as the puller reads a response (never `whole`: a range is always honoured)."""

    whole = False

    def __init__(self, fp, left: int):
        self.fp, self.left = fp, left

    def read(self, n: int) -> bytes:
        chunk = self.fp.read(min(n, self.left))
        self.left -= len(chunk)
        return chunk

    def close(self) -> None:
        self.fp.close()

    def __enter__(self) -> "_FileStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_dir(ref: ModelRef, progress: Progress) -> DirResolution:
    """The model in `ref.directory`: every file hashed (read once), its names checked, the commit (a cache's
    snapshot: its own; `@COMMIT` given: that; else `local-` and 32 hex digits of the files' digests). Raises
    UsageError (not a directory, a link leaving the cache's blobs/, a file that is not regular, a bad name),
    VerifyError (a cache blob whose bytes are not its name's digest)."""
    assert ref.directory is not None
    root = Path(os.path.expanduser(ref.directory))
    if not root.is_dir():
        raise UsageError(f"{ref.asked}: {root} is not a directory")
    blobs = _cache_blobs(root)
    started = time.monotonic()
    files: List[ModelFile] = []
    real: Dict[str, str] = {}
    for rel, path in _entries(ref, root, blobs):
        files.append(_hashed(ref, rel, path, blobs is not None))
        real[rel] = path
    files.sort(key=lambda f: f.path)
    commit, revision = _commit(ref, root, blobs, files)
    ref = dataclasses.replace(ref, revision=revision)
    snapshot = ModelSnapshot(ref, commit, tuple(files))
    snapshot.check()
    size = snapshot.size
    seconds = time.monotonic() - started
    progress.note(f"{ref.asked}: {len(files)} files, {format_size(size)} hashed in {seconds:.1f} s"
                  + (f" ({format_size(int(size / seconds))}/s)" if seconds > 0 else ""))
    return DirResolution(ref, commit, snapshot, [], [], directory=str(root), real=real)


def _cache_blobs(root: Path) -> Optional[Path]:
    """A Hugging Face cache's blobs/ when `root` is one of its snapshots (models--ORG--NAME/snapshots/<commit>)."""
    folder = root.resolve().parent.parent
    if root.resolve().parent.name == "snapshots" and folder.name.startswith("models--") and (folder / "blobs").is_dir():
        return (folder / "blobs").resolve()
    return None


def _entries(ref: ModelRef, root: Path, blobs: Optional[Path]) -> Iterator[Tuple[str, str]]:
    """(path in the model, path on disk) of every file under `root`, in a stable order; links refused except a
    cache snapshot's into its own blobs/."""
    for top, dirs, names in os.walk(str(root), followlinks=False):
        here = os.path.relpath(top, str(root))
        if here == ".":
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
            names = [n for n in names if n not in SKIP_FILES]
        dirs.sort()
        for d in dirs:
            if os.path.islink(os.path.join(top, d)):
                rel = os.path.normpath(os.path.join(here, d))
                raise UsageError(f"{ref.asked}: {rel} is a link to a directory: refused (a model directory holds "
                                 "files)")
        for name in sorted(names):
            rel = os.path.normpath(os.path.join(here, name)).replace(os.sep, "/")
            why = check_path(rel)
            if why is not None:
                raise UsageError(f"{ref.asked}: {rel!r} is {why}: not a file name imgtool places")
            yield rel, _followed(ref, rel, os.path.join(top, name), blobs)


def _followed(ref: ModelRef, rel: str, path: str, blobs: Optional[Path]) -> str:
    """The file on disk that `path` is: itself, or a cache snapshot's link resolved into blobs/."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(path)
        if blobs is None:
            raise UsageError(f"{ref.asked}: {rel} is a symbolic link: refused (only a Hugging Face cache's snapshot "
                             "links are followed, into its own blobs/)")
        if os.path.dirname(target) != str(blobs):
            raise UsageError(f"{ref.asked}: {rel} links outside the cache's blobs/ ({target}): refused")
        return target
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{ref.asked}: {rel} is not a regular file: refused")
    return path


def _hashed(ref: ModelRef, rel: str, path: str, cache: bool) -> ModelFile:
    """The file with its sha256 (one read); a cache blob is also held to its name (sha256, or git blob sha1)."""
    blob = os.path.basename(path) if cache else ""
    lfs, git = bool(_HEX64.match(blob)), bool(_HEX40.match(blob))
    sha = hashlib.sha256()
    try:
        with open_regular(path) as fp:
            size = os.fstat(fp.fileno()).st_size
            sha1 = hashlib.sha1(b"blob %d\0" % size) if git else None
            while True:
                chunk = fp.read(READ)
                if not chunk:
                    break
                sha.update(chunk)
                if sha1 is not None:
                    sha1.update(chunk)
    except NotRegularFile:
        raise UsageError(f"{ref.asked}: {rel} is not a regular file: refused") from None
    except OSError as e:
        raise UsageError(f"{ref.asked}: {rel}: cannot read: {e.strerror or e}") from e
    digest = sha.hexdigest()
    if (lfs and digest != blob) or (sha1 is not None and sha1.hexdigest() != blob):
        raise VerifyError(f"{ref.asked}: {rel}: the cache's blob {blob[:12]} does not hold the bytes its name says; "
                          "refused", hint="the cache is damaged: download the model again")
    if cache and (lfs or git):
        return ModelFile(rel, size, Digest("sha256", digest), blob if git else None, lfs)
    return ModelFile(rel, size, Digest("sha256", digest), None,
                     layer_media_type(rel) == WEIGHT_RAW or size >= LFS_SIZE)


def _commit(ref: ModelRef, root: Path, blobs: Optional[Path], files: List[ModelFile]) -> Tuple[str, Optional[str]]:
    """(commit, revision) of the directory's model."""
    if blobs is not None and ref.revision and is_commit(ref.revision) and root.resolve().name == ref.revision:
        return ref.revision, _named_by(blobs.parent / "refs", ref.revision) or ref.revision
    if blobs is not None:  # hf:ORG/NAME=…/snapshots/<commit>
        return root.resolve().name, ref.revision
    if ref.revision and is_commit(ref.revision):
        return ref.revision, ref.revision
    listing = "".join(f"{f.path}\0{f.size}\0{f.sha256}\n" for f in files)
    return "local-" + hashlib.sha256(listing.encode()).hexdigest()[:32], ref.revision


def _named_by(refs: Path, commit: str) -> Optional[str]:
    """The branch or tag of the cache's refs/ that names `commit` (main first), if any."""
    names = []
    for top, _, files in os.walk(str(refs), followlinks=False):
        for n in files:
            p = os.path.join(top, n)
            try:
                with open_regular(p) as fp:
                    if fp.read(128).decode("ascii", "replace").strip() == commit:
                        names.append(os.path.relpath(p, str(refs)).replace(os.sep, "/"))
            except OSError:
                continue
    return "main" if "main" in names else (sorted(names)[0] if names else None)
