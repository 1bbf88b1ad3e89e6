"""Release bundles from a spec: `imgtool lock` (tags pinned in bundle.lock) and `fetch -f SPEC`.

Core functions taking plain values and a Progress, returning plain values; commands/ parses the
options and prints. Both verbs refuse a lock that no longer fits its spec by one rule,
`spec.Lock.require_fit`.
"""

import dataclasses
from dataclasses import dataclass
from typing import AbstractSet, Any, Dict, List, Optional, Tuple, Union

from .config import HubEnvironment, MirrorConfig, load_mirrors
from .errors import ConfigError, UsageError
from .fetch import FetchOptions
from .progress import Progress
from .resolve import resolve_image, resolve_refs
from .model import Digest
from .spec import Lock, LockedModel, Spec, load_spec, lock_from, read_lock, write_lock
from .store import Store

# what fetch takes from the spec unless the command line gives it (FetchOptions field = Spec field)
SPEC_DEFAULTS = ("output", "mirror", "chunk_size", "compress")


def spec_fetch_options(spec_file: str, opts: FetchOptions, config: MirrorConfig, given: AbstractSet[str],
                       progress: Progress) -> Tuple[MirrorConfig, FetchOptions]:
    """`fetch -f SPEC`: the spec's values under those given on the command line, plus its lock.

    `given` names what the command line set: FetchOptions fields, "platforms" (--arch/--platform)
    and "mirrors" (--mirrors-file). Raises UsageError, ConfigError (a lock that does not fit the spec).
    """
    if opts.refs:
        raise UsageError("give image references or -f SPEC, not both")
    if "platforms" in given:
        raise UsageError("--arch/--platform cannot be used with -f: the spec's platforms decide",
                         hint=f"edit arch in {spec_file}, then run imgtool lock --update -f {spec_file}")
    spec = load_spec(spec_file)
    if spec.mirrors and "mirrors" not in given:
        config = load_mirrors(spec.mirrors, waits=config)
    changes: Dict[str, Any] = {"refs": spec.images + spec.models, "platforms": spec.platforms}
    for key in SPEC_DEFAULTS:
        if key not in given:
            changes[key] = getattr(spec, key)
    lock = read_lock(spec.lock_path)
    if lock is None:
        progress.note(f"no {spec.lock_path.name} beside {spec.path}: tags are resolved now "
                      f"(imgtool lock -f {spec.path} pins them)")
    else:
        lock.require_fit(spec, config)
        progress.note(f"using {spec.lock_path}: {len(lock.images)} image(s) pinned by digest"
                      + (f", {len(lock.models)} model(s) by commit and sha256" if lock.models else ""))
        changes["lock"] = lock
    return config, dataclasses.replace(opts, **changes)


@dataclass
class LockResult:
    """What `imgtool lock` did: `lock` is bundle.lock as it now is; `old` what was there before."""

    spec: Spec
    lock: Lock
    written: bool  # False: the lock fitted the spec and was left as it was
    old: Optional[Lock] = None
    changes: List["LockChange"] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return {"lock": str(self.spec.lock_path), "written": self.written,
                "changes": [c.to_json() for c in self.changes]}


def lock_spec(spec_file: str, update: bool, mirror: Optional[str], mirrors_file: Optional[str], read_timeout: float,
              store: Store, progress: Progress, helper_timeout: Optional[float] = None,
              waits: Optional[MirrorConfig] = None, hubs: Optional[HubEnvironment] = None) -> LockResult:
    """Pin a spec's images (and models) in bundle.lock beside it, unless a fitting lock is there and not `update`.

    `mirror` None: the spec's; the platform manifests and configs are read through `store`; `hubs`: the model
    hubs' endpoints and tokens. Raises ConfigError (a lock that does not fit), UsageError, RegistryError.
    """
    spec = load_spec(spec_file)
    config = load_mirrors(mirrors_file or spec.mirrors, read_timeout, helper_timeout, waits=waits)
    old = read_lock(spec.lock_path)
    if old is not None and not update:
        old.require_fit(spec, config)
        return LockResult(spec, old, written=False)
    new = lock_images(config, spec, mirror or spec.mirror, store, progress, hubs=hubs)
    changes = compare_locks(old, new)
    write_lock(new)
    return LockResult(spec, new, written=True, old=old, changes=changes)


def lock_images(config: MirrorConfig, spec: Spec, mirror: str, store: Store, progress: Progress,
                timeout: float = 5.0, hubs: Optional[HubEnvironment] = None) -> Lock:
    """Resolve every image of a bundle spec to its index and platform manifest digests, and every model to its
    commit and each file's size and sha256.

    Returns the lock (not written). Raises UsageError, ConfigError, RegistryError.
    """
    names: Dict[str, str] = {}
    for text in spec.images:
        name = str(config.parse_ref(text))
        if name in names:
            raise ConfigError(f"{spec.path}: images {names[name]!r} and {text!r} are the same image ({name})")
        names[name] = text
    store.create()
    resolved = []
    for text in spec.images:
        res = resolve_refs(config, [text], mirror, progress, timeout)[0]
        manifests = []
        source = ""
        for platform in spec.platforms:
            image = resolve_image(res, platform, store)
            manifests.append((platform, image.manifest_digest))
            source = source or image.source
        resolved.append((text, res.digest, manifests, source))
    return lock_from(spec, config, resolved, lock_models(config, spec, mirror, store, progress, timeout, hubs))


def lock_models(config: MirrorConfig, spec: Spec, mirror: str, store: Store, progress: Progress, timeout: float,
                hubs: Optional[HubEnvironment]) -> List[LockedModel]:
    """Each model of the spec at the commit its revision names now, with every file's size and sha256 (a small git
    file the hub gives no sha256 for is read through `store` to hash it). Raises as model_pull.resolve_models."""
    if not spec.models:
        return []
    from .model_pull import resolve_models, source_of
    from .weights import parse_model_ref

    out = []
    for res in resolve_models([parse_model_ref(r) for r in spec.models], config, hubs or HubEnvironment(), store,
                              progress, mirror=mirror, timeout=timeout):
        files = tuple(sorted((f.path, f.size, f.sha256) for f in res.snapshot.files if f.sha256 is not None))
        out.append(LockedModel(res.ref.asked, res.commit, files, source_of(res)))
    return out


@dataclass
class LockChange:
    """What `imgtool lock --update` changed for one image."""

    name: str
    kind: str  # added, removed, moved, unchanged
    old: Optional[Union[Digest, str]] = None  # a digest, or a model's commit
    new: Optional[Union[Digest, str]] = None
    platforms: List[str] = dataclasses.field(default_factory=list)  # platforms whose manifest moved; a model's changed files

    def describe(self) -> str:
        old, new = (_short(d) for d in (self.old, self.new))  # "removed" has no new, "added" no old
        if self.kind == "moved":
            detail = f" ({', '.join(self.platforms)} changed)" if self.platforms else ""
            return f"moved      {self.name}: {old} -> {new}{detail}"
        if self.kind == "added":
            return f"added      {self.name}: {new}"
        if self.kind == "removed":
            return f"removed    {self.name}: was {old}"
        return f"unchanged  {self.name}: {new}"

    def to_json(self) -> dict:
        return {"name": self.name, "change": self.kind, "old": str(self.old) if self.old else None,
                "new": str(self.new) if self.new else None, "platforms": self.platforms}


def _short(value: Optional[Union[Digest, str]]) -> str:
    if value is None:
        return "-"
    return value.short if isinstance(value, Digest) else value[:12]


def _compare_models(old: Optional[Lock], new: Lock) -> List[LockChange]:
    """Per model: added, removed, moved (another commit, with the files whose sha256 changed), unchanged."""
    before = {m.ref: m for m in old.models} if old else {}
    out = []
    for m in new.models:
        was = before.get(m.ref)
        if was is None:
            out.append(LockChange(m.ref, "added", new=m.commit))
        elif was.commit != m.commit or was.files != m.files:
            kept = {p: d for p, _, d in was.files}
            files = [p for p, _, d in m.files if kept.get(p) != d] + [p for p in kept if p not in
                                                                      {q for q, _, _ in m.files}]
            out.append(LockChange(m.ref, "moved", was.commit, m.commit, files))
        else:
            out.append(LockChange(m.ref, "unchanged", was.commit, m.commit))
    refs = {m.ref for m in new.models}
    out += [LockChange(r, "removed", old=m.commit) for r, m in before.items() if r not in refs]
    return out


def compare_locks(old: Optional[Lock], new: Lock) -> List[LockChange]:
    """Per image, then per model: added, removed, moved (with the platforms whose manifest changed, or the model
    files whose sha256 did), unchanged."""
    before = old.by_name() if old else {}
    out = []
    for im in new.images:
        was = before.get(im.name)
        if was is None:
            out.append(LockChange(im.name, "added", new=im.digest))
        elif was.digest != im.digest:
            old_m = dict(was.manifests)
            moved = [p for p, d in im.manifests if old_m.get(p) != d]
            out.append(LockChange(im.name, "moved", was.digest, im.digest, moved))
        else:
            out.append(LockChange(im.name, "unchanged", was.digest, im.digest))
    names = {im.name for im in new.images}
    out += [LockChange(n, "removed", old=im.digest) for n, im in before.items() if n not in names]
    return out + _compare_models(old, new)
