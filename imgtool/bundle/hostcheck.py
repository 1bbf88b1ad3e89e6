"""Can this Docker host take this bundle? The checks `load` refuses or warns on and `doctor` lists.

One set of words and thresholds for both: zstd layers against Docker's version, the storage driver,
and free space under Docker's root against what the load needs (the upload Docker unpacks under
<root>/tmp plus the unpacked layers). `facts` is a daemon.DaemonInfo: this module asks Docker
nothing itself, it only reads the statvfs of a local root dir.
"""

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..model import format_size
from .format import BundleIndex
from .texts import ZSTD_REMEDY, zstd_layer_refs

if TYPE_CHECKING:
    from ..runtime import RuntimeInfo

TYPICAL_NEED = 20 * 1024 ** 3  # a vllm-ascend image: ~15 GB unpacked plus the upload while loading
FREE_SPACE_ADVICE = "free space there (docker image prune, docker system df), or move Docker's data-root"


@dataclass
class Check:
    name: str
    status: str  # ok | info | warn | fail
    detail: str
    advice: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail, "advice": self.advice}


def need_bytes(index: BundleIndex, unpacked: Optional[int] = None) -> int:
    """Space Docker needs to load the bundle: the upload it unpacks under <root>/tmp, plus the layers."""
    if unpacked is None:  # each layer's unpacked size where fetch learnt it, else the typical gzip ratio
        seen = {x.digest: x for im in index.images for x in im.layers if not x.omitted}
        known = sum(x.unpacked_size for x in seen.values() if x.unpacked_size is not None)
        unknown = sum(x.size for x in seen.values() if x.unpacked_size is None)
        unpacked = known + int(unknown * 2.5)
    return index.archive.tar_size + unpacked


def zstd_check(index: BundleIndex, facts: "RuntimeInfo") -> Optional[Check]:
    """A fail when the bundle has zstd layers and the runtime cannot read them (Docker before 23.0); else None."""
    zstd = zstd_layer_refs(index)  # omitted layers (a delta bundle) are the runtime's already: never sent
    if not zstd or facts.reads_zstd:
        return None
    return Check("docker", "fail", f"Docker {facts.version} cannot read zstd-compressed layers ({', '.join(zstd)}): "
                 "that needs Docker 23.0 or later (older ones fail with `invalid tar header`, vllm-ascend FAQ 19)",
                 ZSTD_REMEDY)


def storage_check(facts: "RuntimeInfo") -> Check:
    """The image store and storage driver: a warn for devicemapper and vfs."""
    if facts.runtime == "containerd":
        return Check("storage", "ok", f"containerd's content store and {facts.driver} snapshotter under "
                     f"{facts.root_dir}, namespace {facts.namespace}: image IDs are manifest digests")
    if facts.runtime == "podman":
        return Check("storage", "warn" if facts.driver == "vfs" else "ok",
                     f"containers-storage ({facts.driver}) under {facts.root_dir}",
                     "vfs copies every layer in full: overlay is the usual choice" if facts.driver == "vfs" else "")
    if facts.containerd_store:
        return Check("storage", "ok", f"the containerd image store ({facts.driver} snapshotter) under "
                     f"{facts.root_dir}: image IDs are manifest digests; imgtool confirms loads by them")
    where = f"{facts.driver} under {facts.root_dir} (graphdriver image store)"
    if facts.driver == "devicemapper":
        return Check("storage", "warn", where, "devicemapper limits each container to dm.basesize (10 GB by "
                     "default), less than a vllm-ascend image: raise dm.basesize or move to overlay2")
    if facts.driver == "vfs":
        return Check("storage", "warn", where, "vfs copies every layer in full: expect several times the "
                     "unpacked size on disk; overlay2 is the usual choice")
    return Check("storage", "ok", where)


def space_check(facts: "RuntimeInfo", index: Optional[BundleIndex], unpacked: Optional[int] = None) -> Check:
    """Free space under Docker's root against what loading `index` needs (a typical image without one)."""
    root = facts.root_dir
    need = need_bytes(index, unpacked) if index is not None else None
    how = ""
    if index is not None and need is not None:
        how = (f"the bundle needs about {format_size(need)} ({format_size(index.archive.tar_size)} for the upload "
               f"while loading + {format_size(need - index.archive.tar_size)} unpacked)")
    if not facts.local or not root or not os.path.isdir(root):
        return Check("space", "info", f"cannot check free space under {root or 'the Docker root dir'} from here "
                     f"(daemon at {facts.host})" + (f"; {how}" if how else ""))
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    staged = _staging_check(facts, index)
    if staged is not None:
        return staged
    if need is not None:
        if free < need:
            return Check("space", "fail", f"not enough space for {facts.title} under {root}: {how}, "
                         f"{format_size(free)} is free", FREE_SPACE_ADVICE)
        return Check("space", "ok", f"{format_size(free)} free under {root}; {how}")
    if free < TYPICAL_NEED:
        return Check("space", "warn", f"{format_size(free)} free under {root}",
                     f"a vllm-ascend image needs about {format_size(TYPICAL_NEED)} while loading; free space there")
    return Check("space", "ok", f"{format_size(free)} free under {root}")


def _staging_check(facts: "RuntimeInfo", index: Optional[BundleIndex]) -> Optional[Check]:
    """Podman loads from a copy of the whole archive in its staging dir (/var/tmp, $TMPDIR): on another
    file system than its storage, that copy needs the archive's size there; a fail when it lacks it."""
    stage = facts.staging_dir
    if index is None or not stage or not os.path.isdir(stage) or not os.path.isdir(facts.root_dir):
        return None
    if os.stat(stage).st_dev == os.stat(facts.root_dir).st_dev:
        return None  # one file system: need_bytes already counts the archive (the "upload while loading")
    st = os.statvfs(stage)
    free = st.f_bavail * st.f_frsize
    if free >= index.archive.tar_size:
        return None
    return Check("space", "fail", f"not enough space for {facts.title}'s copy of the archive in {stage}: it needs "
                 f"{format_size(index.archive.tar_size)}, {format_size(free)} is free",
                 "free space there, or point TMPDIR at a directory with room for the archive")
