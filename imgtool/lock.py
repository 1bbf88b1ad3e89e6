"""Release bundles from a spec: `imgtool lock` (tags pinned in bundle.lock) and `fetch -f SPEC`.

Core functions taking plain values and a Progress, returning plain values; commands/ parses the
options and prints. Both verbs refuse a lock that no longer fits its spec by one rule,
`spec.Lock.require_fit`.
"""

import dataclasses
from dataclasses import dataclass
from typing import AbstractSet, Any, Dict, List, Optional, Tuple

from .config import MirrorConfig, load_mirrors
from .errors import ConfigError, UsageError
from .fetch import FetchOptions
from .progress import Progress
from .resolve import resolve_image, resolve_refs
from .spec import Lock, LockChange, Spec, compare_locks, load_spec, lock_from, read_lock, write_lock
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
    changes: Dict[str, Any] = {"refs": spec.images, "platforms": spec.platforms}
    for key in SPEC_DEFAULTS:
        if key not in given:
            changes[key] = getattr(spec, key)
    lock = read_lock(spec.lock_path)
    if lock is None:
        progress.note(f"no {spec.lock_path.name} beside {spec.path}: tags are resolved now "
                      f"(imgtool lock -f {spec.path} pins them)")
    else:
        lock.require_fit(spec, config)
        progress.note(f"using {spec.lock_path}: {len(lock.images)} image(s) pinned by digest")
        changes["lock"] = lock
    return config, dataclasses.replace(opts, **changes)


@dataclass
class LockResult:
    """What `imgtool lock` did: `lock` is bundle.lock as it now is; `old` what was there before."""

    spec: Spec
    lock: Lock
    written: bool  # False: the lock fitted the spec and was left as it was
    old: Optional[Lock] = None
    changes: List[LockChange] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return {"lock": str(self.spec.lock_path), "written": self.written,
                "changes": [c.to_json() for c in self.changes]}


def lock_spec(spec_file: str, update: bool, mirror: Optional[str], mirrors_file: Optional[str], read_timeout: float,
              store: Store, progress: Progress, helper_timeout: Optional[float] = None,
              waits: Optional[MirrorConfig] = None) -> LockResult:
    """Pin a spec's images in bundle.lock beside it, unless a fitting lock is there and not `update`.

    `mirror` None: the spec's; the platform manifests and configs are read through `store`.
    Raises ConfigError (a lock that does not fit), UsageError, RegistryError.
    """
    spec = load_spec(spec_file)
    config = load_mirrors(mirrors_file or spec.mirrors, read_timeout, helper_timeout, waits=waits)
    old = read_lock(spec.lock_path)
    if old is not None and not update:
        old.require_fit(spec, config)
        return LockResult(spec, old, written=False)
    new = lock_images(config, spec, mirror or spec.mirror, store, progress)
    changes = compare_locks(old, new)
    write_lock(new)
    return LockResult(spec, new, written=True, old=old, changes=changes)


def lock_images(config: MirrorConfig, spec: Spec, mirror: str, store: Store, progress: Progress,
                timeout: float = 5.0) -> Lock:
    """Resolve every image of a bundle spec to its index and platform manifest digests.

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
    return lock_from(spec, config, resolved)
