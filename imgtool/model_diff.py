"""`imgtool diff`'s models (issue 48): each model of either side by hub and ORG/NAME, its files by path: shared (the
same sha256), changed (another sha256 under the path), added, removed; and what a delta bundle of new against old
carries: the files whose sha256 old holds nowhere (a delta leaves a file out by its sha256, whichever path or model
holds it). Pure: bundle.json's `models` (or an inventory's, as `HeldModel`s: placed, or held as modelcar images) in,
rows out.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .bundle.format import BundleModel, ModelEntry
from .delta import InventoryModel
from .errors import UsageError
from .model import Digest, format_size
from .weights import ModelRef, parse_model_ref


@dataclass(frozen=True)
class HeldFile:
    path: str
    size: int
    sha256: Optional[Digest]  # None: a small file inventory could not read (never the same as another's)


@dataclass(frozen=True)
class HeldModel:
    """A model an inventory lists (placed, or held as its modelcar image): compared by its commit and files, having
    no artifact digest."""

    model_ref: ModelRef
    commit: str
    files: Tuple[HeldFile, ...]
    manifest_digest: Optional[Digest] = None


def held_models(models: Sequence[InventoryModel]) -> List[HeldModel]:
    """An inventory's models as diff compares them (one whose reference is none a hub has is left out)."""
    out = []
    for m in models:
        try:
            ref = parse_model_ref(m.ref)
        except UsageError:
            continue
        out.append(HeldModel(ref, m.commit, tuple(HeldFile(p, n, d) for p, n, d in m.files)))
    return out


AnyModel = Union[BundleModel, HeldModel]
AnyFile = Union[ModelEntry, HeldFile]

FILE_STATUSES = ("changed", "added", "removed", "shared")


@dataclass(frozen=True)
class FileRow:
    status: str  # shared | changed | added | removed
    path: str
    old: Optional[AnyFile]
    new: Optional[AnyFile]

    @property
    def size(self) -> int:
        """The bytes of this file on the side that has it (new, else old)."""
        entry = self.new or self.old
        return entry.size if entry is not None else 0

    def to_json(self) -> dict:
        return {"status": self.status, "path": self.path,
                "old": _file_json(self.old), "new": _file_json(self.new)}


@dataclass
class ModelRow:
    status: str  # added | removed | changed | unchanged
    name: str  # hf:ORG/NAME
    old: Optional[AnyModel]
    new: Optional[AnyModel]
    files: List[FileRow] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for f in self.files if f.status == status)

    def bytes(self, status: str) -> int:
        return sum(f.size for f in self.files if f.status == status)

    def to_json(self) -> dict:
        return {"status": self.status, "name": self.name,
                "old_commit": self.old.commit if self.old else None, "new_commit": self.new.commit if self.new else None,
                "old_manifest_digest": str(self.old.manifest_digest) if self.old and self.old.manifest_digest else None,
                "new_manifest_digest": str(self.new.manifest_digest) if self.new and self.new.manifest_digest else None,
                "files": [f.to_json() for f in self.files]}


def _same(a: AnyModel, b: AnyModel) -> bool:
    """One artifact (its digest), or, where a side has none (an inventory's), one commit with the same files."""
    if a.manifest_digest is not None and b.manifest_digest is not None:
        return a.manifest_digest == b.manifest_digest
    files = [{(f.path, f.sha256) for f in m.files} for m in (a, b)]
    return a.commit == b.commit and files[0] == files[1] and all(d is not None for _, d in files[0])


def _name(model: AnyModel) -> str:
    ref = model.model_ref
    return f"{ref.hub}:{ref.repo}"


def _files(old: Optional[AnyModel], new: Optional[AnyModel]) -> List[FileRow]:
    before: Dict[str, AnyFile] = {f.path: f for f in old.files} if old else {}
    after: Dict[str, AnyFile] = {f.path: f for f in new.files} if new else {}
    rows = []
    for path, f in after.items():
        was = before.get(path)
        status = "added" if was is None else "shared" if was.sha256 == f.sha256 else "changed"
        rows.append(FileRow(status, path, was, f))
    rows += [FileRow("removed", path, f, None) for path, f in before.items() if path not in after]
    return sorted(rows, key=lambda r: (FILE_STATUSES.index(r.status), r.path))


def model_rows(old: Sequence[AnyModel], new: Sequence[AnyModel]) -> List[ModelRow]:
    """Each model of either side by hub and ORG/NAME (a second revision of one model in one bundle: the first)."""
    before: Dict[str, AnyModel] = {}
    for m in old:
        before.setdefault(_name(m), m)
    after: Dict[str, AnyModel] = {}
    for m in new:
        after.setdefault(_name(m), m)
    rows = []
    for name, m in after.items():
        was = before.get(name)
        status = "added" if was is None else "unchanged" if _same(was, m) else "changed"
        rows.append(ModelRow(status, name, was, m, _files(was, m)))
    return rows + [ModelRow("removed", name, m, None, _files(m, None)) for name, m in before.items()
                   if name not in after]


def delta_bytes(old: Sequence[AnyModel], new: Sequence[AnyModel]) -> Dict[str, int]:
    """What a delta bundle of new against old carries of the models, against the whole: bytes of the distinct files
    new holds (`new_bytes`) and of those whose sha256 old holds nowhere (`carried_bytes`)."""
    held = {f.sha256 for m in old for f in m.files}
    files = {f.sha256: f.size for m in new for f in m.files}
    return {"new_bytes": sum(files.values()), "carried_bytes": sum(n for d, n in files.items() if d not in held)}


def describe(rows: Sequence[ModelRow], old: Sequence[AnyModel], new: Sequence[AnyModel]) -> List[str]:
    """The text report's lines for the models (none when neither side holds one)."""
    if not rows:
        return []
    out = ["models:"]
    width = max(len(r.name) for r in rows)
    for r in rows:
        commits = {"added": f"commit {_c(r.new)}", "removed": f"commit {_c(r.old)}",
                   "unchanged": f"commit {_c(r.new)}"}.get(r.status, f"commit {_c(r.old)} -> {_c(r.new)}")
        out.append(f"  {r.status:<9}  {r.name:<{width}}  {commits}")
        out.append("    files: " + ", ".join(f"{r.count(s)} {s} ({format_size(r.bytes(s))})"
                                             for s in ("shared", "changed", "added", "removed")))
        for f in r.files:  # a changed model's files that differ (an added or removed one's: the count says it)
            if f.status == "shared" or r.status != "changed":
                continue
            digests = f"{_short(f.old)} -> {_short(f.new)}" if f.old and f.new else _short(f.new or f.old)
            out.append(f"    {f.status:<7}  {f.path}  {format_size(f.size)}  {digests}")
    t = delta_bytes(old, new)
    if t["new_bytes"]:
        saved = t["new_bytes"] - t["carried_bytes"]
        out.append(f"models delta: a bundle of new against old carries {format_size(t['carried_bytes'])} of model "
                   f"files instead of {format_size(t['new_bytes'])} (saves {format_size(saved)}, "
                   f"{100 * saved // t['new_bytes']}%)")
    return out


def _c(model: Optional[AnyModel]) -> str:
    return model.commit[:12] if model else "-"


def _short(f: Optional[AnyFile]) -> str:
    return f.sha256.short if f is not None and f.sha256 is not None else "-"


def _file_json(f: Optional[AnyFile]) -> Optional[dict]:
    if f is None:
        return None
    return {"sha256": str(f.sha256) if f.sha256 is not None else None, "size": f.size}
