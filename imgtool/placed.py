"""The models placed on this host (issue 48), as `imgtool inventory` lists them: read from what a placement leaves
(imgtool/placement.py), never by hashing the weights.

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
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from .delta import InventoryModel
from .errors import UsageError
from .model import Digest
from .placement import MARKER
from .weights import check_path, is_commit

SMALL_FILE = 64 << 20  # a non-LFS file of the HF cache larger than this is not hashed (its sha256 stays unknown)
MAX_LISTING = 64 << 20  # a trees/<commit>.json or marker larger than this is not read


def held_models(hf_cache: Path, modelscope_cache: Path, dirs: Iterable[Path] = ()) -> List[InventoryModel]:
    """Every model placed whole in the Hugging Face cache, the ModelScope cache and the plain `dirs`, sorted by
    reference. Unreadable entries are left out, never raised."""
    out = list(_hf_models(Path(hf_cache)))
    out += _marked(Path(modelscope_cache) / "models")
    for d in dirs:
        out += _marked(Path(d))
    return sorted(out, key=lambda m: (m.ref, m.commit, m.path))


def _read_json(path: Path) -> Optional[dict]:
    try:
        if not path.is_file() or path.stat().st_size > MAX_LISTING:
            return None
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _size(path: Path) -> Optional[int]:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def _hf_models(root: Path) -> Iterable[InventoryModel]:
    try:
        folders = sorted(p for p in root.iterdir() if p.name.startswith("models--") and p.is_dir())
    except OSError:
        return
    for folder in folders:
        parts = folder.name[len("models--"):].split("--")
        if len(parts) != 2 or not all(parts):
            continue
        repo = "/".join(parts)
        names = _hf_refs(folder)
        try:
            trees = sorted((folder / "trees").glob("*.json"))
        except OSError:
            continue
        for tree in trees:
            commit = tree.name[:-len(".json")]
            if not is_commit(commit):
                continue
            files = _hf_files(folder / "snapshots" / commit, _read_json(tree))
            if files is not None:
                yield InventoryModel(f"hf:{repo}@{names.get(commit, commit)}", commit, files,
                                     str(folder / "snapshots" / commit))


def _hf_refs(folder: Path) -> Dict[str, str]:
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


def _hf_files(snapshot: Path, tree: Optional[dict]) -> Optional[Tuple[Tuple[str, int, Optional[Digest]], ...]]:
    """The files of a snapshot its tree lists, each there at its size; None when one is not (or the tree is bad)."""
    listed = tree.get("files") if tree is not None else None
    if not isinstance(listed, dict):
        return None
    out = []
    for path, entry in sorted(listed.items()):
        if not isinstance(path, str) or check_path(path) is not None or not isinstance(entry, dict):
            return None
        size = entry.get("size")
        if not isinstance(size, int) or _size(snapshot / path) != size:
            return None
        sha = entry.get("lfs_sha256")
        digest = _digest(sha) if isinstance(sha, str) else _small_sha256(snapshot / path, size)
        out.append((path, size, digest))
    return tuple(out)


def _digest(hex_or_digest: str) -> Optional[Digest]:
    text = hex_or_digest if hex_or_digest.startswith("sha256:") else "sha256:" + hex_or_digest
    try:
        return Digest.parse(text)
    except UsageError:  # a bad value in a file on disk: unknown, not fatal
        return None


def _small_sha256(path: Path, size: int) -> Optional[Digest]:
    if size > SMALL_FILE:
        return None
    try:
        return Digest("sha256", hashlib.sha256(path.read_bytes()).hexdigest())
    except OSError:
        return None


def _marked(top: Path) -> List[InventoryModel]:
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
            model = _from_marker(name, _read_json(name / MARKER))
            if model is not None:
                out.append(model)
    return out


def _from_marker(where: Path, doc: Optional[dict]) -> Optional[InventoryModel]:
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
        if not isinstance(size, int) or not isinstance(sha, str) or _size(where / path) != size:
            return None
        files.append((path, size, _digest(sha)))
    label = revision if isinstance(revision, str) and revision else commit
    return InventoryModel(f"{base}@{label}", commit, tuple(files), str(where))

