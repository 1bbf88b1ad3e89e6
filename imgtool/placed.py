"""The models placed on this host (issue 48), read back: the one `run-flags`/`run --model` serves, and every one
`doctor` lists, each checked against the listing its placement wrote. Reads only. Stdlib only, Python 3.7.

Where a model is placed is imgtool/placement.py's (the layouts) and imgtool/placer.py's (the writing); this room
reads the same layouts:

- `hf`: `ROOT/models--ORG--NAME/snapshots/<commit>`, the revision found through `refs/<name>` (a commit asked for is
  its own snapshot; nothing asked: `refs/main`, else the only snapshot). The files are checked against
  `trees/<commit>.json`, what the placer (and huggingface_hub since 1.22) writes; a snapshot without it (an older
  client's download) is listed with its size, unchecked.
- `modelscope`: `ROOT/models/ORG/NAME` (each `.` as `___`); `dir`: `DIR/ORG/NAME`. One revision each, named by
  `.imgtool-model.json` (the placer's marker), else the old ModelScope client's `.mv`.

A placed file is read-only (0444, its directories 0555): a writable one is a problem (a container given the cache
read-write, or another tool, could change the weights without a digest noticing). So is a file missing, or of
another size than the listing says.

`held_models` lists them as `imgtool inventory` does, with each file's sha256 (what a delta may leave out):

  - the Hugging Face cache: each `models--ORG--NAME/trees/<commit>.json` whose `snapshots/<commit>` holds every file
    it lists at its size (huggingface_hub writes the same trees for its own downloads: those count too). An LFS file's
    sha256 is in the tree; a small non-LFS file (config, tokenizer) is hashed, it being small (at most SMALL_FILE).
  - the ModelScope cache and plain directories (`--models-dir`): each `ORG/NAME/.imgtool-model.json` whose files are
    there at their sizes (a download of the user's has no marker, and is not listed: its sha256s are unknown).
  The reference names the branch or tag it was placed as (`refs/` of the HF cache, the marker's revision), else the
  commit. Names read from these files are data: a path that could leave the model's directory is not followed.
  Stdlib only, Python 3.7.
"""

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from .delta import InventoryModel
from .errors import UsageError, counted
from .model import Digest, format_size
from .placement import MARKER, MODELSCOPE_META, STAGING_PREFIX
from .weights import HUBS, check_path, hf_folder, is_commit, modelscope_folder, parse_model_ref

WHERE = {"hf": "the Hugging Face cache", "modelscope": "the ModelScope cache", "dir": "the models directory"}
MAX_LISTING = 64 << 20  # a trees/<commit>.json or marker larger than this is not one the placer wrote


@dataclass(frozen=True)
class Wanted:
    """What `--model` asked for: ORG/NAME, the hub when pinned (`hf:`, `modelscope:`), and a revision."""

    hub: Optional[str]  # hf | modelscope | None: either
    repo: str
    revision: Optional[str] = None

    def __str__(self) -> str:
        return (f"{self.hub}:" if self.hub else "") + self.repo + (f"@{self.revision}" if self.revision else "")


def parse_wanted(text: str) -> Wanted:
    """`ORG/NAME[@REVISION]`, `hf:ORG/NAME[@REVISION]` or `modelscope:ORG/NAME[@REVISION]`; raises UsageError."""
    hub, sep, _ = text.partition(":")
    pinned = bool(sep) and hub in HUBS
    try:
        if sep and not pinned:
            raise UsageError("")
        ref = parse_model_ref(text if pinned else "hf:" + text)
    except UsageError:
        raise UsageError(f"invalid --model {text!r}: use ORG/NAME[@REVISION], hf:ORG/NAME[@REVISION] or "
                         f"modelscope:ORG/NAME[@REVISION]") from None
    return Wanted(ref.hub if pinned else None, ref.repo, ref.revision)


@dataclass(frozen=True)
class PlacedModel:
    """One model as placed here: `folder` holds all of it (what a container mounts: the HF cache's
    models--ORG--NAME, whose snapshot links reach its blobs/; the directory itself elsewhere), `path` is what a
    server is pointed at (the snapshot; the directory)."""

    target: str  # hf | modelscope | dir
    repo: str
    root: Path
    folder: Path
    path: Path
    commit: Optional[str]  # None: not known (a download not placed by imgtool, without metadata)
    refs: Tuple[str, ...]  # hf: the refs/ naming this commit; else the revision the placement recorded
    files: int
    size: int
    checked: bool  # whether a listing (trees/<commit>.json, the marker) said what the files must be
    problems: Tuple[str, ...] = ()
    hub: Optional[str] = None  # hf | modelscope: where the files came from (a plain directory: its marker's); None: unknown

    @property
    def ref(self) -> str:
        """`hf:ORG/NAME@main`: the hub (a plain directory: the hub its marker names, else `dir:`) and revision."""
        hub = self.target if self.target in HUBS else "dir"
        rev = self.refs[0] if self.refs else self.commit
        return f"{hub}:{self.repo}" + (f"@{rev}" if rev else "")

    def describe(self) -> str:
        """`hf:ORG/NAME@main (commit 0123456789ab): 9 files, 85.2 KiB in PATH`."""
        commit = f" (commit {self.commit[:12]})" if self.commit and self.refs else ""
        return f"{self.ref}{commit}: {counted(self.files, 'file')}, {format_size(self.size)} in {self.path}"


@dataclass
class Looked:
    """Where a search looked, and why each place did not hold the model."""

    places: List[Tuple[str, str]] = field(default_factory=list)  # (path, why not)

    def text(self) -> str:
        return "; ".join(f"{path} ({why})" for path, why in self.places)


def cache_root(target: str) -> Path:
    from . import config

    return config.hf_hub_cache() if target == "hf" else config.modelscope_cache()


def find_model(wanted: Wanted, models: Optional[str] = None, models_dir: Optional[str] = None
               ) -> Tuple[PlacedModel, List[str]]:
    """The placed model `wanted` names, and notes (also placed elsewhere): in `models_dir` (DIR/ORG/NAME) when given,
    else in the `models` cache (hf, modelscope), else the hub's that `wanted` pins, else the Hugging Face cache,
    then ModelScope's. Raises UsageError: options that disagree, a model not placed (naming where it looked), an HF
    snapshot that cannot be chosen."""
    if models_dir is not None and models is not None:
        raise UsageError("give --models or --models-dir, not both: --models-dir DIR looks in DIR/ORG/NAME")
    if models is not None and wanted.hub is not None and models != wanted.hub:
        raise UsageError(f"--model {wanted} is a {wanted.hub} model and --models {models} names the other cache: "
                         f"give one")
    if models_dir is not None:
        places = [("dir", Path(models_dir))]
    else:
        pinned = models or wanted.hub
        hubs: List[str] = [pinned] if pinned else list(HUBS)
        places = [(hub, cache_root(hub)) for hub in hubs]
    looked = Looked()
    found: List[PlacedModel] = []
    for target, root in places:
        placed = locate(target, root, wanted, looked)
        if placed is not None:
            found.append(placed)
    if not found:
        raise UsageError(f"{wanted} is not placed on this host: looked in {looked.text()}",
                         hint="imgtool load BUNDLE places the models a bundle holds (imgtool fetch TAG hf:ORG/NAME "
                              "makes one); HF_HUB_CACHE, MODELSCOPE_CACHE or --models-dir DIR say where else to look")
    notes = [f"{wanted} is placed in {WHERE[p.target]} too ({p.path}): --models {p.target} serves that one"
             for p in found[1:]]
    return found[0], notes


def locate(target: str, root: Path, wanted: Wanted, looked: Looked) -> Optional[PlacedModel]:
    """The model in one place, or None with the reason added to `looked`. Raises UsageError for an HF folder
    whose snapshot cannot be chosen (several, and no refs/main)."""
    if target == "hf":
        folder = root / hf_folder(wanted.repo)
        if not folder.is_dir():
            looked.places.append((str(folder), "not there"))
            return None
        commit, why = _hf_commit(folder, wanted)
        if commit is None:
            looked.places.append((str(folder), why))
            return None
        return read_hf(root, folder, commit)
    name = root / (modelscope_folder(wanted.repo) if target == "modelscope" else wanted.repo)
    if not name.is_dir() or not any(e not in MODELSCOPE_META for e in _listdir(name)):
        looked.places.append((str(name), "not there"))
        return None
    placed = read_directory(target, root, name, wanted.repo)
    if wanted.revision and wanted.revision not in (placed.refs + ((placed.commit,) if placed.commit else ())):
        held = placed.refs[0] if placed.refs else (placed.commit or "a revision it does not name")
        looked.places.append((str(name), f"holds {held}, not {wanted.revision}"))
        return None
    return placed


def _hf_commit(folder: Path, wanted: Wanted) -> Tuple[Optional[str], str]:
    """(the commit of the snapshot to serve, or None and why)."""
    snapshots = sorted(e for e in _listdir(folder / "snapshots") if (folder / "snapshots" / e).is_dir())
    rev = wanted.revision
    if rev is not None and is_commit(rev):
        return (rev, "") if rev in snapshots else (None, f"no snapshot {rev[:12]}")
    ref = _read_ref(folder, rev or "main")
    if ref is not None:
        return (ref, "") if ref in snapshots else (None, f"refs/{rev or 'main'} names {ref[:12]}, whose snapshot "
                                                         f"is not there")
    if rev is not None:
        return None, f"no refs/{rev}" + (f"; it holds {_held_revisions(folder, snapshots)}" if snapshots else "")
    if len(snapshots) == 1:
        return snapshots[0], ""
    if not snapshots:
        return None, "no snapshot"
    raise UsageError(f"{folder} holds {len(snapshots)} snapshots and no refs/main: name one with "
                     f"--model {wanted.repo}@REVISION ({_held_revisions(folder, snapshots)})")


def _held_revisions(folder: Path, snapshots: List[str]) -> str:
    refs = _refs(folder)
    return ", ".join("/".join(refs.get(c, [])) or c for c in snapshots)


def _read_ref(folder: Path, name: str) -> Optional[str]:
    try:
        with open(str(folder / "refs" / name), "rb") as f:
            text = f.read(128).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if is_commit(text) else None


def _refs(folder: Path) -> Dict[str, List[str]]:
    """commit -> the refs naming it (`main`, `v1`, `pr/1`)."""
    out: Dict[str, List[str]] = {}
    top = folder / "refs"
    for here, _dirs, files in os.walk(str(top)):
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(here, name), str(top)).replace(os.sep, "/")
            commit = _read_ref(folder, rel)
            if commit is not None:
                out.setdefault(commit, []).append(rel)
    for names in out.values():
        names.sort(key=lambda n: (n != "main", n))
    return out


def read_hf(root: Path, folder: Path, commit: str) -> PlacedModel:
    """One snapshot of the HF cache, checked against trees/<commit>.json when there is one."""
    path = folder / "snapshots" / commit
    repo = _hf_repo(folder.name)
    listing = _hf_listing(folder / "trees" / f"{commit}.json")
    refs = tuple(_refs(folder).get(commit, ()))
    if listing is None:
        files = _walk_files(path)
        problems = _broken_links(path, files)
        sizes = {p: _stat_size(path / p) or 0 for p in files}
        return PlacedModel("hf", repo, root, folder, path, commit, refs, len(files), sum(sizes.values()), False,
                           tuple(problems + _writable(path, files)), "hf")
    problems = _against(path, listing)
    return PlacedModel("hf", repo, root, folder, path, commit, refs, len(listing), sum(listing.values()), True,
                       tuple(problems + _writable(path, [p for p in _listed(listing) if _stat_size(path / p) is not None])),
                       "hf")


def read_directory(target: str, root: Path, name: Path, repo: str) -> PlacedModel:
    """A ModelScope or plain model directory, checked against imgtool's marker when there is one."""
    doc = _read_json(name / MARKER)
    marker: Dict[str, object] = doc if isinstance(doc, dict) else {}
    files_doc = marker.get("files")
    if isinstance(files_doc, dict) and all(isinstance(v, dict) and isinstance(v.get("size"), int)
                                           for v in files_doc.values()):
        listing = {str(p): int(v["size"]) for p, v in files_doc.items()}
        commit = marker.get("commit")
        commit = commit if isinstance(commit, str) else None
        rev = marker.get("revision")
        rev = rev if isinstance(rev, str) else None
        refs = (rev,) if rev and rev != commit else ()
        problems = _against(name, listing)
        present = [p for p in _listed(listing) if _stat_size(name / p) is not None]
        return PlacedModel(target, repo, root, name, name, commit, refs, len(listing), sum(listing.values()), True,
                           tuple(problems + _writable(name, present + [MARKER])), _marker_hub(target, marker))
    files = [p for p in _walk_files(name) if p not in MODELSCOPE_META]
    rev = _modelscope_revision(name)
    return PlacedModel(target, repo, root, name, name, None, (rev,) if rev else (), len(files),
                       sum(_stat_size(name / p) or 0 for p in files), False, tuple(_writable(name, files)),
                       target if target in HUBS else None)


def _marker_hub(target: str, marker: Dict[str, object]) -> Optional[str]:
    """The hub a model came from: the cache's, else (a plain directory) the one its marker's `model` names."""
    if target in HUBS:
        return target
    ref = marker.get("model")
    hub = ref.partition(":")[0] if isinstance(ref, str) else ""
    return hub if hub in HUBS else None


def placed_models(target: str, root: Path) -> List[PlacedModel]:
    """Every model placed under `root` in `target`'s layout, in name order (HF: every snapshot). What a stopped
    placement left (its staging directory) is not a model: `staging_left` lists it."""
    out: List[PlacedModel] = []
    if target == "hf":
        for entry in sorted(_listdir(root)):
            folder = root / entry
            if not entry.startswith("models--") or entry.count("--") < 2 or not folder.is_dir():
                continue
            snaps = folder / "snapshots"
            for commit in sorted(_listdir(snaps)):
                if (snaps / commit).is_dir():
                    out.append(read_hf(root, folder, commit))
        return out
    top = root / "models" if target == "modelscope" else root
    for org in sorted(_listdir(top)):
        if org.startswith(".") or not (top / org).is_dir():
            continue
        for name in sorted(_listdir(top / org)):
            path = top / org / name
            if name.startswith(".") or not path.is_dir() or path.is_symlink():
                continue
            if target == "dir" and not (path / MARKER).is_file():
                continue  # a plain directory holds other things too: only what imgtool placed is a model there
            repo = f"{org}/{name.replace('___', '.')}" if target == "modelscope" else f"{org}/{name}"
            out.append(read_directory(target, root, path, repo))
    return out


def staging_left(target: str, root: Path) -> List[Path]:
    """Staging directories stopped placements left under `root` (the next load of that model resumes or removes
    them)."""
    if target == "hf":
        folders = [root / e for e in sorted(_listdir(root)) if e.startswith("models--")]
    elif target == "modelscope":
        folders = [root / "models" / e for e in sorted(_listdir(root / "models"))]
    else:
        folders = [root / e for e in sorted(_listdir(root))]
    return [f / e for f in folders if f.is_dir() for e in sorted(_listdir(f)) if e.startswith(STAGING_PREFIX)]


# --- reading ---------------------------------------------------------------------------------------------------

def _listdir(path: Path) -> List[str]:
    try:
        return os.listdir(str(path))
    except OSError:
        return []


def _hf_repo(folder_name: str) -> str:
    org, _, name = folder_name[len("models--"):].partition("--")
    return f"{org}/{name}"


def _read_json(path: Path) -> object:
    try:
        st = os.stat(str(path))
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_LISTING:
            return None
        with open(str(path), "rb") as f:
            return json.loads(f.read(MAX_LISTING).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _hf_listing(path: Path) -> Optional[Dict[str, int]]:
    """trees/<commit>.json's files and sizes, or None when there is none (or it is not one)."""
    doc = _read_json(path)
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return None
    out = {}
    for p, entry in files.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int):
            return None
        out[str(p)] = int(entry["size"])
    return out


def _modelscope_revision(name: Path) -> Optional[str]:
    """The revision the old ModelScope client's `.mv` names (`Revision:<rev>,CreatedAt:<ts>`)."""
    try:
        with open(str(name / ".mv"), "rb") as f:
            text = f.read(1024).decode("utf-8", "replace")
    except OSError:
        return None
    head = text.split(",", 1)[0]
    if not head.startswith("Revision:"):
        return None
    return head[len("Revision:"):] or None


def _stat_size(path: Path) -> Optional[int]:
    """The size of the regular file at `path`, links followed; None when there is none."""
    try:
        st = os.stat(str(path))
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _walk_files(top: Path) -> List[str]:
    """The files under `top` (links to files included), as relative paths, sorted."""
    out = []
    for here, dirs, files in os.walk(str(top)):
        dirs[:] = [d for d in dirs if not d.startswith(STAGING_PREFIX)]
        for name in files:
            out.append(os.path.relpath(os.path.join(here, name), str(top)).replace(os.sep, "/"))
    return sorted(out)


def _broken_links(top: Path, files: List[str]) -> List[str]:
    broken = [p for p in files if _stat_size(top / p) is None]
    return [f"{counted(len(broken), 'file')} missing (first: {broken[0]})"] if broken else []


def _against(top: Path, listing: Dict[str, int]) -> List[str]:
    """What differs from the listing: names that are not a path under the model (a listing is data: an edited
    marker or trees/ file in a user-writable directory must not have root stat a path outside), files missing,
    files of another size."""
    missing, wrong = [], []
    unsafe = [p for p in sorted(listing) if check_path(p) is not None]
    for p in sorted(_listed(listing)):
        size = _stat_size(top / p)
        if size is None:
            missing.append(p)
        elif size != listing[p]:
            wrong.append(f"{p} is {size} bytes, not {listing[p]}")
    out = []
    if unsafe:
        out.append(f"the listing names {counted(len(unsafe), 'path')} outside the model "
                   f"(first: {unsafe[0]!r}: {check_path(unsafe[0])})")
    if missing:
        out.append(f"incomplete: {len(missing)} of {counted(len(listing), 'file')} missing (first: {missing[0]})")
    if wrong:
        out.append(f"{counted(len(wrong), 'file')} of another size ({wrong[0]})")
    return out


def _listed(listing: Dict[str, int]) -> List[str]:
    """The listing's names that are paths under the model (the others are reported by _against, never opened)."""
    return [p for p in listing if check_path(p) is None]


def _writable(top: Path, files: List[str]) -> List[str]:
    """The files (links followed) and directories under `top` that someone may write."""
    bad = [p for p in files if _mode(top / p) & 0o222]
    dirs = [top] + [Path(here) / d for here, ds, _ in os.walk(str(top)) for d in ds]
    bad_dirs = [d for d in dirs if not d.is_symlink() and _mode(d) & 0o222]
    out = []
    if bad:
        out.append(f"not read-only: {counted(len(bad), 'file')} may be written (first: {bad[0]}, "
                   f"mode {_mode(top / bad[0]) & 0o777:o})")
    if bad_dirs:
        first = os.path.relpath(str(bad_dirs[0]), str(top))
        out.append(f"not read-only: {counted(len(bad_dirs), 'directory', 'directories')} may be written "
                   f"(first: {first}, mode {_mode(bad_dirs[0]) & 0o777:o})")
    return out


def _mode(path: Path) -> int:
    try:
        return os.stat(str(path)).st_mode
    except OSError:
        return 0


# --- what `imgtool inventory` lists: every model placed whole, with its files' sha256 ---

SMALL_FILE = 64 << 20  # a non-LFS file of the HF cache larger than this is not hashed (its sha256 stays unknown)
MAX_LISTING = 64 << 20  # a trees/<commit>.json or marker larger than this is not read


def held_models(hf_cache: Path, modelscope_cache: Path, dirs: Iterable[Path] = ()) -> List[InventoryModel]:
    """Every model placed whole in the Hugging Face cache, the ModelScope cache and the plain `dirs`, sorted by
    reference. Unreadable entries are left out, never raised."""
    out = list(_held_hf_models(Path(hf_cache)))
    out += _held_marked(Path(modelscope_cache) / "models")
    for d in dirs:
        out += _held_marked(Path(d))
    return sorted(out, key=lambda m: (m.ref, m.commit, m.path))


def _held_read_json(path: Path) -> Optional[dict]:
    try:
        if not path.is_file() or path.stat().st_size > MAX_LISTING:
            return None
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _held_size(path: Path) -> Optional[int]:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def _held_hf_models(root: Path) -> Iterable[InventoryModel]:
    try:
        folders = sorted(p for p in root.iterdir() if p.name.startswith("models--") and p.is_dir())
    except OSError:
        return
    for folder in folders:
        parts = folder.name[len("models--"):].split("--")
        if len(parts) != 2 or not all(parts):
            continue
        repo = "/".join(parts)
        names = _held_hf_refs(folder)
        try:
            trees = sorted((folder / "trees").glob("*.json"))
        except OSError:
            continue
        for tree in trees:
            commit = tree.name[:-len(".json")]
            if not is_commit(commit):
                continue
            files = _held_hf_files(folder / "snapshots" / commit, _held_read_json(tree))
            if files is not None:
                yield InventoryModel(f"hf:{repo}@{names.get(commit, commit)}", commit, files,
                                     str(folder / "snapshots" / commit))


def _held_hf_refs(folder: Path) -> Dict[str, str]:
    """commit -> the branch or tag naming it (main first, then by name)."""
    out: Dict[str, str] = {}
    refs = folder / "refs"
    try:
        names = sorted((p for p in refs.rglob("*") if p.is_file()), key=lambda p: (p.name != "main", str(p)))
    except OSError:
        return out
    for p in names:
        try:
            commit = p.read_text().strip()
        except (OSError, UnicodeDecodeError):
            continue
        out.setdefault(commit, p.relative_to(refs).as_posix())
    return out


def _held_hf_files(snapshot: Path, tree: Optional[dict]) -> Optional[Tuple[Tuple[str, int, Optional[Digest]], ...]]:
    """The files of a snapshot its tree lists, each there at its size; None when one is not (or the tree is bad)."""
    listed = tree.get("files") if tree is not None else None
    if not isinstance(listed, dict):
        return None
    out = []
    for path, entry in sorted(listed.items()):
        if not isinstance(path, str) or check_path(path) is not None or not isinstance(entry, dict):
            return None
        size = entry.get("size")
        if not isinstance(size, int) or _held_size(snapshot / path) != size:
            return None
        sha = entry.get("lfs_sha256")
        digest = _held_digest(sha) if isinstance(sha, str) else _held_small_sha256(snapshot / path, size)
        out.append((path, size, digest))
    return tuple(out)


def _held_digest(hex_or_digest: str) -> Optional[Digest]:
    text = hex_or_digest if hex_or_digest.startswith("sha256:") else "sha256:" + hex_or_digest
    try:
        return Digest.parse(text)
    except UsageError:  # a bad value in a file on disk: unknown, not fatal
        return None


def _held_small_sha256(path: Path, size: int) -> Optional[Digest]:
    if size > SMALL_FILE:
        return None
    try:
        return Digest("sha256", hashlib.sha256(path.read_bytes()).hexdigest())
    except OSError:
        return None


def _held_marked(top: Path) -> List[InventoryModel]:
    """The models under `top`/ORG/NAME that carry imgtool's marker and hold its files at their sizes."""
    out: List[InventoryModel] = []
    try:
        orgs = sorted(p for p in top.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return out
    for org in orgs:
        try:
            names = sorted(p for p in org.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            continue
        for name in names:
            model = _held_from_marker(name, _held_read_json(name / MARKER))
            if model is not None:
                out.append(model)
    return out


def _held_from_marker(where: Path, doc: Optional[dict]) -> Optional[InventoryModel]:
    if doc is None:
        return None
    ref, revision, commit, listed = doc.get("model"), doc.get("revision"), doc.get("commit"), doc.get("files")
    if not (isinstance(ref, str) and isinstance(commit, str) and isinstance(listed, dict)):
        return None
    base = ref.split("@", 1)[0]
    files = []
    for path, entry in sorted(listed.items()):
        if not isinstance(path, str) or check_path(path) is not None or not isinstance(entry, dict):
            return None
        size, sha = entry.get("size"), entry.get("sha256")
        if not isinstance(size, int) or not isinstance(sha, str) or _held_size(where / path) != size:
            return None
        files.append((path, size, _held_digest(sha)))
    label = revision if isinstance(revision, str) and revision else commit
    return InventoryModel(f"{base}@{label}", commit, tuple(files), str(where))

