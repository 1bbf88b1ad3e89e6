"""Placing a model on the offline host (issue 48): every file checked against its sha256, read-only, and atomic.
The layouts are imgtool/placement.py's; this room writes them. Stdlib only: the pyz places models on Python 3.7.

One placement holds the lock of the model's folder (dirlock.py: a second `load` of the same model refuses at once) and
works in its own staging directory in that folder, `.imgtool-staging-<pid>-<random>`, so the last step is a rename
on one file system and a half-placed model is never visible under its name:

- each file is written to `partial` and hashed (sha256; the git blob sha1 too where the Hugging Face cache names a
  small file by it and the snapshot lacks it): copied in the kernel from where it lies (an uncompressed bundle's
  parts, a twin staged already) and hashed from `partial` itself by a second thread as the copy grows (filecopy.py:
  the bytes checked are the bytes placed), else hashed as its pieces are written (a compressed bundle's stream);
  then checked against its size and sha256, fsynced, made 0444, and only then renamed to `tree/<path>`. A file under
  its name in `tree/` is therefore one that was checked: a rerun after a kill keeps it when its size is right, and
  writes only the rest (re-reading 0.7 TB to re-hash it would double the time of a placement). A mismatch refuses
  with VerifyError naming the file; nothing is placed.
- the commit: ModelScope and plain directories rename `tree` (0555 directories) to the model's name; the Hugging
  Face cache moves each new file to `blobs/<etag>` (a blob it holds already is kept: a second revision writes only
  the files that changed), writes `trees/<commit>.json`, renames a tree of relative links to `snapshots/<commit>`,
  then writes `refs/<branch>`.

What a killed placement left (its staging directory) is taken over by the next one: the newest is resumed, the others
removed, and the placement says so.
"""

import errno
import hashlib
import os
import shutil
import stat
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union

from .dirlock import lock_output
from .errors import ImgtoolError, VerifyError, counted
from .filecopy import Regions, copy_regions
from .fsutil import fsync_dir, remove_quietly, tree_size, write_atomic
from .model import format_size
from .placement import (CACHEDIR_TAG, MARKER, Layout, files_to_place, git_blob_header, hf_blob_id, hf_etag, hf_link,
                        hf_tree, layout, marker, modelscope_meta, same_marker, staging_name, staging_pid)
from .weights import ModelFile, ModelSnapshot

# a file's bytes: in pieces (a compressed bundle's stream), or where they lie (an uncompressed bundle's parts: copied
# in the kernel, filecopy.py)
Reader = Callable[[ModelFile], Union[Iterable[bytes], Regions]]
_STAGING_HERE: Set[str] = set()  # staging directories of this process's placements that are not finished
FILE_MODE = 0o444
DIR_MODE = 0o555
# where the user points each target elsewhere, for a refusal's hint
_ELSEWHERE = {"hf": "set HF_HUB_CACHE (or HF_HOME)", "modelscope": "set MODELSCOPE_CACHE", "dir": "choose another --models-dir"}


class PlacementDamaged(VerifyError):
    """A model file's bytes differ from its size or sha256: nothing was placed (exit 3); `path` names the file."""

    def __init__(self, message: str, hint: Optional[str] = None, path: str = ""):
        super().__init__(message, hint, problems=[message])
        self.path = path


@dataclass
class Placed:
    """What one placement did: the directory to serve (`path`), and how much it wrote."""

    model: str
    target: str
    path: Path
    commit: str
    files: int
    size: int
    written: int = 0  # bytes written by this run
    kept: int = 0  # files not written again: blobs the cache held, files an earlier (killed) run staged and checked
    unchanged: bool = False  # the same model was there already: nothing was written
    notes: List[str] = field(default_factory=list)  # staging left by stopped placements, resumed or removed

    def to_json(self) -> dict:
        return {"ref": self.model, "target": self.target, "path": str(self.path), "commit": self.commit,
                "files": self.files, "size": self.size, "written": self.written, "kept": self.kept,
                "unchanged": self.unchanged, "notes": self.notes}

    def line(self) -> str:
        """What load prints for this model."""
        what = f"{counted(self.files, 'file')}, {format_size(self.size)}"
        if self.unchanged:
            return f"{self.model} is placed already in {self.path} ({what}): nothing to do"
        kept = f"; {self.kept} held already" if self.kept else ""
        return f"placed {self.model} (commit {self.commit[:12]}) in {self.path} ({what}{kept})"


def place_model(snapshot: ModelSnapshot, target: str, root: Path, read: Reader, revision: Optional[str] = None,
                force: bool = False, created: Optional[int] = None) -> Placed:
    """Place `snapshot` under `root` in `target`'s layout (hf, modelscope, dir), each file's bytes from `read`.
    `revision`: the branch or tag asked for (the HF cache's refs/ entry). `force`: place without enough free space,
    and over a directory imgtool did not place. Raises PlacementDamaged (a file's bytes differ: nothing placed),
    UsageError (a snapshot that cannot be placed), DirectoryBusy (another placement of this model), ImgtoolError
    (no space, a directory not imgtool's, the disk)."""
    return stage_model(snapshot, target, root, read, revision, force, created).commit()


class StagedModel:
    """A model staged and checked, not yet visible under its name (`stage_model`): `commit()` makes it so, `release()`
    leaves the staged files for a later placement to resume. The lock of the model's folder is held until either."""

    def __init__(self, placement: "_Placement", lock: ExitStack):
        self._placement, self._lock = placement, lock

    @property
    def placed(self) -> Placed:
        return self._placement.done

    def staged(self, sha256: str) -> Optional[Path]:
        """A staged file of this model with these bytes (its sha256 hex), to copy a twin from; else None."""
        return self._placement.by_sha.get(sha256)

    def commit(self) -> Placed:
        """Rename what was staged to the model's name (nothing when it was placed already); raises ImgtoolError."""
        try:
            return self._placement.commit()
        finally:
            self.release()

    def release(self) -> None:
        _STAGING_HERE.discard(str(self._placement.staging))  # left for a later placement to resume
        self._lock.close()


def stage_model(snapshot: ModelSnapshot, target: str, root: Path, read: Reader, revision: Optional[str] = None,
                force: bool = False, created: Optional[int] = None, locked: bool = False) -> StagedModel:
    """`place_model`'s first half: every file written to the staging directory and checked, nothing under the model's
    name yet (load stages every model of a bundle, checks the rest of the bundle, then commits them all). `locked`:
    the caller holds the folder's lock (`model_folder`; two models of one folder staged by one load). Raises what
    place_model raises, the folder's lock released then."""
    files = files_to_place(snapshot)
    lay = layout(target, str(root), snapshot, revision)
    folder = Path(str(lay.folder))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ImgtoolError(f"cannot place {snapshot.ref}: cannot create {folder}: {e.strerror or e}",
                           hint=f"run as a user who may write there, or {_ELSEWHERE[target]}") from None
    lock = ExitStack()
    try:
        if not locked:
            lock.enter_context(lock_output(folder, "load"))
        placement = _Placement(snapshot, files, lay, folder, read, revision, force, created)
        try:
            placement.stage()
        except BaseException:
            _STAGING_HERE.discard(str(placement.staging))
            raise
    except BaseException:
        lock.close()
        raise
    return StagedModel(placement, lock)


def model_folder(snapshot: ModelSnapshot, target: str, root: Path) -> Path:
    """The folder `snapshot` is staged in under `root` (its lock's), as place_model makes it."""
    return Path(str(layout(target, str(root), snapshot).folder))


def placed_already(snapshot: ModelSnapshot, target: str, root: Path, revision: Optional[str] = None) -> bool:
    """Whether `snapshot` is placed whole under `root` already (no lock, nothing written: what load asks before it
    reads a model's bytes at all)."""
    lay = layout(target, str(root), snapshot, revision)
    folder = Path(str(lay.folder))
    return _Placement(snapshot, files_to_place(snapshot), lay, folder, lambda f: (), revision, False, 0)._unchanged()


class _Placement:
    def __init__(self, snapshot: ModelSnapshot, files: Tuple[ModelFile, ...], lay: Layout, folder: Path, read: Reader,
                 revision: Optional[str], force: bool, created: Optional[int]):
        self.snapshot, self.files, self.lay, self.folder, self.read = snapshot, files, lay, folder, read
        self.revision, self.force = revision, force
        self.created = int(time.time()) if created is None else created
        self.name = Path(str(lay.name))
        self.done = Placed(str(snapshot.ref), lay.target, self.name, snapshot.commit, len(files), snapshot.size)
        self.staging = folder / staging_name(os.getpid(), os.urandom(4).hex())
        _STAGING_HERE.add(str(self.staging))
        self.computed: Dict[str, str] = {}  # path -> git blob sha1, for small files the snapshot names no blob for
        self.by_sha: Dict[str, Path] = {}  # sha256 hex -> a file staged with those bytes (a twin is copied from it)

    def stage(self) -> None:
        """Every file not held already written to the staging directory and checked; nothing under the name yet."""
        with self._disk_errors():
            self._take_over_staging()
            if self._unchanged():
                self.done.unchanged = True
                return
            self._refuse_foreign()
            todo = self._todo()
            self._check_space(sum(f.size for f in todo))
            for f in todo:
                self._stage(f)

    def commit(self) -> Placed:
        """What was staged renamed to the model's name (an unchanged model: only its refs/ looked after)."""
        with self._disk_errors():
            if self.done.unchanged:
                if self.lay.shared_blobs:
                    self._finish_hf_cache()
            else:
                self._commit()
        _remove_tree(self.staging)
        fsync_dir(self.folder)
        _STAGING_HERE.discard(str(self.staging))
        return self.done

    @contextmanager
    def _disk_errors(self) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            hint = "free space there" if e.errno == errno.ENOSPC else "check the file system there"
            raise ImgtoolError(f"cannot place {self.snapshot.ref} in {self.folder}: {e.strerror or e}; "
                               f"nothing was placed", hint=f"{hint}; a rerun goes on from what was staged in "
                               f"{self.staging}") from None

    # --- what is there already ----------------------------------------------------------------------------------

    def _take_over_staging(self) -> None:
        """Resume the newest staging directory a stopped placement left in the folder (the lock says none runs), and
        remove the others."""
        left = []
        for entry in os.listdir(str(self.folder)):
            pid = staging_pid(entry)
            path = self.folder / entry
            if str(path) in _STAGING_HERE:
                continue  # another model of this folder, staged by this process and not committed yet
            if pid is not None and path.is_dir() and not path.is_symlink():
                left.append((path.stat().st_mtime, path, pid))
        mine = self._staging_for()
        resumed = False
        for _, path, pid in sorted(left, reverse=True):
            try:
                same = (path / "for").read_bytes() == mine
            except OSError:
                same = False
            if same and not resumed:  # staged for this model at this commit: its files were checked against these
                _make_writable(path)
                os.rename(str(path), str(self.staging))
                for scratch in ("partial", "links", "old"):
                    _remove_tree(self.staging / scratch)
                self.done.notes.append(f"resumed the placement pid {pid} left in {path}")
                resumed = True
            else:
                size = tree_size(str(path))
                _remove_tree(path)
                self.done.notes.append(f"removed {path} ({format_size(size)}), left by a stopped placement (pid {pid})")
        (self.staging / "tree").mkdir(parents=True, exist_ok=True)
        if not resumed:
            write_atomic(self.staging / "for", mine)

    def _staging_for(self) -> bytes:
        """What a staging directory is for: the name it will become and the commit whose sha256s its files were
        checked against (a folder is shared: ModelScope's models/ORG holds every model of ORG)."""
        return f"{self.name}\n{self.snapshot.commit}\n".encode()

    def _unchanged(self) -> bool:
        """Whether this snapshot is placed whole already (a second load of an unchanged model writes nothing)."""
        if not self.name.is_dir():
            return False
        if self.lay.shared_blobs:
            if not (self.folder / "trees" / f"{self.snapshot.commit}.json").is_file():
                return False
        else:
            try:
                if not same_marker((self.name / MARKER).read_bytes(), self.snapshot):
                    return False
            except OSError:
                return False
        return all(_size_of(self.name / f.path) == f.size for f in self.files)

    def _refuse_foreign(self) -> None:
        """A modelscope or plain directory that imgtool did not place (a download of the user's) is not replaced
        without --force."""
        if self.lay.shared_blobs or not os.path.lexists(str(self.name)) or (self.name / MARKER).is_file() or self.force:
            return
        raise ImgtoolError(f"{self.name} exists and was not placed by imgtool: {self.snapshot.ref} was not placed",
                           hint="move it away, or place with --force to replace it")

    def _held_blob(self, f: ModelFile) -> Optional[Path]:
        etag = hf_etag(f)
        if etag is None:
            return None
        blob = self.folder / "blobs" / etag
        return blob if _size_of(blob, follow=False) == f.size else None

    def _todo(self) -> List[ModelFile]:
        """The files to write: not staged by an earlier run, nor held as a blob in the HF cache."""
        todo = []
        seen_etags = set()
        for f in self.files:
            staged = self.staging / "tree" / f.path
            if _size_of(staged, follow=False) == f.size:
                self.done.kept += 1
                self.by_sha.setdefault(f.sha256.hex if f.sha256 else "", staged)
                if self.lay.shared_blobs and hf_etag(f) is None:
                    self.computed[f.path] = _git_blob_id_of(staged, f.size)
                continue
            remove_quietly(str(staged))
            etag = hf_etag(f) if self.lay.shared_blobs else None
            if etag is not None and (etag in seen_etags or self._held_blob(f) is not None):
                self.done.kept += 1  # one blob for two paths of the same bytes, or a blob of another revision
                continue
            seen_etags.add(etag)
            todo.append(f)
        return todo

    def _check_space(self, need: int) -> None:
        st = os.statvfs(str(self.folder))
        free = st.f_bavail * st.f_frsize
        if need <= free or self.force:
            return
        raise ImgtoolError(f"not enough space to place {self.snapshot.ref} in {self.folder}: it needs "
                           f"{format_size(need)}, {format_size(free)} is free",
                           hint=f"free space there, or {_ELSEWHERE[self.lay.target]}; --force tries anyway")

    # --- writing ------------------------------------------------------------------------------------------------

    def _stage(self, f: ModelFile) -> None:
        """Write one file to `partial`, checked as it is written, then rename it to tree/<path>."""
        assert f.sha256 is not None
        partial = self.staging / "partial"
        git = git_blob_header(f.size) if self.lay.shared_blobs and hf_etag(f) is None else None
        fd = os.open(str(partial), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            with os.fdopen(fd, "wb", buffering=0) as out:
                source = self._source(f)
                if isinstance(source, Regions):  # copied in the kernel, hashed from the copy
                    copied = copy_regions(source, out.fileno(), str(partial), git)
                    n, sha, git_sha1 = copied.size, copied.sha256, copied.git_sha1
                else:
                    n, sha, git_sha1 = _write_chunks(out, source, f.size, git)
                if n > f.size:
                    raise self._damaged(f, f"more than the {f.size} bytes its sha256 covers")
                if n < f.size:
                    raise self._damaged(f, f"{n} bytes where the snapshot says {f.size}")
                if sha != f.sha256.hex:
                    raise self._damaged(f, f"its bytes do not match its sha256 (sha256:{sha[:12]} read, "
                                           f"{f.sha256.short} expected)")
                os.fsync(out.fileno())
        except BaseException:
            remove_quietly(str(partial))
            raise
        os.chmod(str(partial), FILE_MODE)
        dest = self.staging / "tree" / f.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(str(partial), str(dest))
        self.by_sha.setdefault(f.sha256.hex, dest)
        self.done.written += n
        if git_sha1 is not None:
            self.computed[f.path] = git_sha1

    def _source(self, f: ModelFile) -> Union[Iterable[bytes], Regions]:
        """The file's bytes: from a twin staged already (the same sha256 under another path: a bundle carries those
        bytes once), else from `read`."""
        twin = self.by_sha.get(f.sha256.hex) if f.sha256 is not None else None
        if twin is None:
            return self.read(f)
        return Regions(((str(twin), 0, f.size),))

    def _damaged(self, f: ModelFile, why: str) -> PlacementDamaged:
        return PlacementDamaged(f"{self.snapshot.ref}: {f.path}: {why}; nothing was placed",
                                hint="the model's bytes in the bundle are damaged: `imgtool verify` names the part; "
                                     "the files checked so far stay staged for the next load", path=f.path)

    def _commit(self) -> None:
        if self.lay.shared_blobs:
            self._commit_hf_cache()
        else:
            self._commit_directory()

    def _commit_directory(self) -> None:
        tree = self.staging / "tree"
        write_atomic(tree / MARKER, marker(self.snapshot, self.revision), mode=FILE_MODE)
        if self.lay.target == "modelscope":
            for name, data in modelscope_meta(self.snapshot, self.revision, str(self.created)).items():
                write_atomic(tree / name, data, mode=FILE_MODE)
        _seal(tree)
        self._swap_in(tree)

    def _swap_in(self, ready: Path) -> None:
        """Rename the finished `ready` to the name: what was there (another revision, an incomplete copy) is moved
        into the staging directory first and removed with it."""
        if os.path.lexists(str(self.name)):
            _make_writable(self.name, deep=False)  # a directory moved to another parent rewrites its `..`
            os.rename(str(self.name), str(self.staging / "old"))
        self.name.parent.mkdir(parents=True, exist_ok=True)
        os.rename(str(ready), str(self.name))
        fsync_dir(self.name.parent)

    def _commit_hf_cache(self) -> None:
        blobs = self.folder / "blobs"
        blobs.mkdir(exist_ok=True)
        links = self.staging / "links"
        _remove_tree(links)
        links.mkdir()
        blob_ids = {}
        for f in self.files:
            etag = hf_etag(f) or self.computed[f.path]
            staged = self.staging / "tree" / f.path
            blob = blobs / etag
            if _size_of(blob, follow=False) != f.size:
                if not staged.is_file():  # held when planned, gone since: not placed, say which
                    raise ImgtoolError(f"{blob} went away while {self.snapshot.ref} was placed; nothing was placed",
                                       hint="load again")
                os.rename(str(staged), str(blob))
            blob_ids[f.path] = hf_blob_id(f, self.computed.get(f.path))
            link = links / f.path
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(hf_link(f.path, etag), str(link))
        fsync_dir(blobs)
        trees = self.folder / "trees"
        trees.mkdir(exist_ok=True)
        write_atomic(trees / f"{self.snapshot.commit}.json", hf_tree(self.snapshot, blob_ids), mode=FILE_MODE)
        _seal(links)
        (self.folder / "snapshots").mkdir(exist_ok=True)
        self._swap_in(links)
        self._finish_hf_cache()

    def _finish_hf_cache(self) -> None:
        """refs/<branch or tag> (the commit, no newline) and the cache root's CACHEDIR.TAG, as the client writes
        them; after the snapshot, so a ref never names a commit that is not whole."""
        if self.lay.ref is not None:
            ref = self.folder / "refs" / self.lay.ref
            try:
                current = ref.read_text()
            except OSError:
                current = None
            if current != self.snapshot.commit:
                ref.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(ref, self.snapshot.commit.encode(), mode=FILE_MODE)
                if self.done.unchanged:
                    self.done.notes.append(f"refs/{self.lay.ref} now names {self.snapshot.commit[:12]}")
        tag = Path(str(self.lay.root)) / "CACHEDIR.TAG"
        if not tag.exists():
            write_atomic(tag, CACHEDIR_TAG.encode(), mode=0o644)


def _size_of(path: Path, follow: bool = True) -> Optional[int]:
    """The size of a regular file at `path` (a link followed when `follow`), else None."""
    try:
        st = os.stat(str(path)) if follow else os.lstat(str(path))
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _write_chunks(out, chunks: Iterable[bytes], size: int, git_header: Optional[bytes]
                  ) -> Tuple[int, str, Optional[str]]:
    """Write the chunks to `out`, hashing them as they pass: (bytes, sha256 hex, git blob sha1 hex or None); stops
    once more than `size` came."""
    sha = hashlib.sha256()
    git = hashlib.sha1(git_header) if git_header is not None else None
    n = 0
    for chunk in chunks:
        n += len(chunk)
        if n > size:
            break
        sha.update(chunk)
        if git is not None:
            git.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[out.write(view):]
    return n, sha.hexdigest(), (git.hexdigest() if git is not None else None)


def _git_blob_id_of(path: Path, size: int) -> str:
    git = hashlib.sha1(git_blob_header(size))
    with open(str(path), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            git.update(chunk)
    return git.hexdigest()


def _seal(top: Path) -> None:
    """Make a finished tree's directories read-only (0555), deepest first, and fsync them."""
    for here, _dirs, _ in os.walk(str(top), topdown=False):
        fsync_dir(Path(here))
        os.chmod(here, DIR_MODE)


def _make_writable(top: Path, deep: bool = True) -> None:
    """Let this user change a sealed tree's directories again (to rename or remove it)."""
    if not top.is_dir() or top.is_symlink():
        return
    os.chmod(str(top), 0o755)
    if deep:
        for here, dirs, _ in os.walk(str(top)):
            for d in dirs:
                p = os.path.join(here, d)
                if not os.path.islink(p):
                    os.chmod(p, 0o755)


def _remove_tree(path: Path) -> None:
    if os.path.isdir(str(path)) and not os.path.islink(str(path)):
        _make_writable(path)
        shutil.rmtree(str(path), ignore_errors=True)
    else:
        remove_quietly(str(path))

