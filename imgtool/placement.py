"""Where a model is placed on the offline host, as pure functions of its snapshot (issue 48): the Hugging Face cache,
the ModelScope cache and a plain directory. No I/O: imgtool/placer.py writes what these say. Stdlib only, Python 3.7.

Each target has a *folder* (where placing stages, beside what it names, so the last step is one rename on one file
system) and a *name*: the directory a model server is pointed at, which appears whole or not at all.

- `hf`: `ROOT/models--ORG--NAME/` as huggingface_hub (2.4) writes and its offline mode reads:
  `blobs/<etag>` (the sha256 of an LFS file, the git blob sha1 of the rest), `snapshots/<commit>/<path>` relative
  symlinks to `../../blobs/<etag>` (one `../` more per directory in the path), `refs/<branch or tag>` holding the
  commit without a newline (only when the revision asked for was a name), `trees/<commit>.json` (the listing offline
  `snapshot_download` checks a snapshot against), and `ROOT/CACHEDIR.TAG`. The name is `snapshots/<commit>`.
- `modelscope`: `ROOT/models/ORG/NAME` with each `.` in NAME stored as `___`, ROOT being `$MODELSCOPE_CACHE` or
  `~/.cache/modelscope/hub`. modelscope <= 1.37 reads and writes exactly there; the current client (1.38+, whose own
  downloads go to `{cache}/models/ORG--NAME/snapshots/<rev>`) reads `{cache}/models/ORG/NAME___` and
  `{cache}/hub/models/ORG/NAME___` first when they are not empty, its cache being `$MODELSCOPE_CACHE` or
  `~/.cache/modelscope`: so both find this one place. The old client also needs its metadata beside the files:
  `.msc` (a pickled list of `{"Path", "Revision"}`), `.mdl` (a pickled `{"id": "ORG/NAME"}`) and `.mv`
  (`Revision:<rev>,CreatedAt:<ts>`). One revision at a time: a new one replaces the directory.
- `dir`: `DIR/ORG/NAME` (the hub's spelling, dots kept): a plain copy of the files, one revision at a time, for
  `vllm serve DIR/ORG/NAME`.

ModelScope and plain directories also hold `.imgtool-model.json` (the model, its commit and each file's size and
sha256): what tells a later placement that the model there is unchanged, and `doctor` what is placed.
"""

import hashlib
import json
import pickle
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Dict, List, Optional, Tuple

from .errors import UsageError
from .weights import ModelFile, ModelSnapshot, hf_folder, is_commit, modelscope_folder

TARGETS = ("hf", "modelscope", "dir")
STAGING_PREFIX = ".imgtool-staging-"  # + <pid>-<random>: a placement's own directory in the folder
MARKER = ".imgtool-model.json"  # what imgtool placed in a modelscope or plain directory
# what huggingface_hub writes into its cache root (_local_folder.CACHEDIR_TAG_CONTENT), so backup tools skip it
CACHEDIR_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                "# This file is a cache directory tag created by huggingface_hub.\n"
                "# For information about cache directory tags, see:\n"
                "#\thttps://bford.info/cachedir/\n")
MODELSCOPE_META = (".msc", ".mdl", ".mv")


@dataclass(frozen=True)
class Layout:
    """Where one snapshot goes: `folder` (made if missing; the staging directory and the lock live there) and
    `name`, the directory a server is pointed at (HF: snapshots/<commit>, ModelScope and plain: the model's)."""

    target: str  # hf | modelscope | dir
    root: PurePosixPath
    folder: PurePosixPath
    name: PurePosixPath
    ref: Optional[str] = None  # hf: the refs/ entry to write (a branch or tag asked for), else None

    @property
    def shared_blobs(self) -> bool:
        """Whether files live once in blobs/ and the name holds links (HF), or the name holds the files."""
        return self.target == "hf"


def layout(target: str, root: str, snapshot: ModelSnapshot, revision: Optional[str] = None) -> Layout:
    """Where `snapshot` goes under `root` for `target` (hf, modelscope, dir); `revision`: the branch or tag asked
    for (default: the reference's, else the hub's default branch). Raises UsageError for an unknown target."""
    base = PurePosixPath(root)
    repo = snapshot.ref.repo
    if target == "hf":
        folder = base / hf_folder(repo)
        return Layout(target, base, folder, folder / "snapshots" / snapshot.commit, hf_ref(snapshot, revision))
    if target == "modelscope":
        name = base / modelscope_folder(repo)
        return Layout(target, base, name.parent, name)
    if target == "dir":
        name = base / snapshot.ref.org / snapshot.ref.name
        return Layout(target, base, name.parent, name)
    raise UsageError(f"unknown model destination {target!r}: use one of {', '.join(TARGETS)}")


def hf_ref(snapshot: ModelSnapshot, revision: Optional[str] = None) -> Optional[str]:
    """The refs/ entry huggingface_hub keeps for the revision asked for: the name itself (a branch, a tag; `main`,
    its default, when none was asked), or None when the revision was a commit (the client writes none then)."""
    asked = revision or snapshot.ref.revision or "main"
    return None if is_commit(asked) else asked


def git_blob_header(size: int) -> bytes:
    """What git hashes before a file's bytes to name its blob: sha1(b"blob <size>\\0" + bytes)."""
    return b"blob %d\0" % size


def lfs_pointer(sha256_hex: str, size: int) -> bytes:
    """The Git LFS pointer git holds for an LFS file (the Hub's blob id of an LFS file is this pointer's)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256_hex}\nsize {size}\n".encode()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(git_blob_header(len(data)) + data).hexdigest()


def hf_etag(f: ModelFile) -> Optional[str]:
    """The name of a file's blob in the Hugging Face cache: the sha256 of an LFS file, the git blob sha1 of the rest;
    None for a small file whose git blob id the snapshot lacks (a ModelScope listing): computed while placing."""
    if f.lfs:
        return f.sha256.hex if f.sha256 is not None else None
    return f.git_oid


def hf_blob_id(f: ModelFile, computed: Optional[str] = None) -> str:
    """The `blob_id` trees/<commit>.json gives a file: the git blob id (for an LFS file, of its pointer)."""
    if f.git_oid:
        return f.git_oid
    if f.lfs:
        assert f.sha256 is not None
        return git_blob_id(lfs_pointer(f.sha256.hex, f.size))
    assert computed is not None, f.path
    return computed


def hf_link(path: str, etag: str) -> str:
    """The relative symlink at snapshots/<commit>/<path> to blobs/<etag>."""
    return "../" * (2 + path.count("/")) + "blobs/" + etag


def hf_tree(snapshot: ModelSnapshot, blob_ids: Dict[str, str]) -> bytes:
    """trees/<commit>.json as huggingface_hub writes it (format 1, the files sorted, indent 1): what its offline
    snapshot_download checks the snapshot folder against."""
    files = {}
    for f in sorted(snapshot.files, key=lambda f: f.path):
        entry: Dict[str, object] = {"size": f.size, "blob_id": blob_ids[f.path]}
        if f.lfs:
            assert f.sha256 is not None
            entry["lfs_sha256"] = f.sha256.hex
            entry["lfs_size"] = f.size
        files[f.path] = entry
    return json.dumps({"format_version": 1, "files": files}, indent=1).encode()


def marker(snapshot: ModelSnapshot, revision: Optional[str]) -> bytes:
    """.imgtool-model.json: the model, the revision asked for, its commit, and each file's size and sha256."""
    doc = {"model": str(snapshot.ref), "revision": revision or snapshot.ref.default_revision,
           "commit": snapshot.commit,
           "files": {f.path: {"size": f.size, "sha256": str(f.sha256)} for f in sorted(snapshot.files, key=lambda f: f.path)}}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def same_marker(found: bytes, snapshot: ModelSnapshot) -> bool:
    """Whether a marker read back names this snapshot's commit and files (the revision's name may differ)."""
    try:
        doc = json.loads(found.decode("utf-8"))
        want = json.loads(marker(snapshot, None).decode())
        return bool(doc["commit"] == want["commit"] and doc["files"] == want["files"] and doc["model"] == want["model"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return False


def modelscope_meta(snapshot: ModelSnapshot, revision: Optional[str], created: str) -> Dict[str, bytes]:
    """The metadata modelscope <= 1.37 keeps beside the files (hub/utils/caching.py): `.msc` the cached files (a
    pickled list of {"Path", "Revision"}), `.mdl` the model id (a pickled {"id": ...}), `.mv` the revision. Its
    offline snapshot_download refuses a directory whose `.msc` is empty."""
    rev = revision or snapshot.ref.default_revision
    files = [{"Path": f.path, "Revision": snapshot.commit} for f in sorted(snapshot.files, key=lambda f: f.path)]
    return {".msc": pickle.dumps(files, protocol=2), ".mdl": pickle.dumps({"id": snapshot.ref.repo}, protocol=2),
            ".mv": f"Revision:{rev},CreatedAt:{created}".encode()}


def directories(paths: List[str]) -> List[str]:
    """Every directory the paths need, parents first ("a", "a/b" for "a/b/c")."""
    out = set()
    for p in paths:
        parts = p.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out.add("/".join(parts[:i]))
    return sorted(out, key=lambda d: (d.count("/"), d))


def staging_name(pid: int, token: str) -> str:
    return f"{STAGING_PREFIX}{pid}-{token}"


def staging_pid(name: str) -> Optional[int]:
    """The pid in a staging directory's name, or None when `name` is not one."""
    if not name.startswith(STAGING_PREFIX):
        return None
    pid, sep, _ = name[len(STAGING_PREFIX):].partition("-")
    return int(pid) if sep and pid.isdigit() else None


def files_to_place(snapshot: ModelSnapshot) -> Tuple[ModelFile, ...]:
    """The snapshot's files in path order, each with its sha256 (what every placed byte is checked against);
    raises UsageError for one without (a listing not yet downloaded cannot be placed)."""
    snapshot.check()
    missing = [f.path for f in snapshot.files if f.sha256 is None]
    if missing:
        raise UsageError(f"{snapshot.ref}: no sha256 for {missing[0]!r}: only a downloaded snapshot can be placed")
    return tuple(sorted(snapshot.files, key=lambda f: f.path))
