"""Can this Docker host take this bundle? The checks `load` refuses or warns on and `doctor` lists.

One set of words and thresholds for both: zstd layers against the runtime's version, the storage
driver, and free space under the runtime's root against what the load needs there, as the runtime
stages and stores images (`need_for`: Docker's graphdriver unpacks the whole archive under
<root>/tmp before it registers the layers; the containerd store keeps the compressed blobs and
unpacks them into snapshots; Podman loads from a copy of the archive) less the layers it holds
already. `facts` is a runtime.RuntimeInfo: this module asks the runtime nothing itself, it only
reads the statvfs of a local root dir.
"""

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, AbstractSet, Optional

from ..delta import chain_ids
from ..model import UNPACKED_PER_COMPRESSED, Digest, format_size
from .format import BundleIndex
from .texts import ZSTD_REMEDY, zstd_layer_refs

if TYPE_CHECKING:
    from ..runtimes.base import Runtime, RuntimeInfo

# Podman 4.3 loading an archive of A bytes (measured with the test services' Podman on generated images: A = 16, 24
# and 32 MiB, layers from incompressible to 2.4:1): its staging dir ($TMPDIR, else /var/tmp) holds 3.0 x A at its
# peak, imgtool's copy of the archive plus two copies Podman makes of the layers while it reads and applies them,
# all removed after; its graphroot holds what the layers unpack to (overlay: +0.4 % for big files, +5 % for many
# small ones).
PODMAN_STAGED_COPIES = 3
TYPICAL_NEED = 20 * 1024 ** 3  # a vllm-ascend image: ~15 GB unpacked plus the archive staged (or kept) while loading
FREE_SPACE_ADVICE = "free space there (docker image prune, docker system df), or move Docker's data-root"


def free_space_advice(facts: "RuntimeInfo") -> str:
    """How to make room where this runtime keeps images, in its own tools' words."""
    if facts.runtime == "containerd":
        return (f"free space there (ctr -n {facts.namespace or 'k8s.io'} images prune --all; on a Kubernetes node "
                "crictl rmi --prune), or move containerd's root (root in /etc/containerd/config.toml)")
    if facts.runtime == "podman":
        return "free space there (podman image prune, podman system df), or move Podman's graphroot (storage.conf)"
    return FREE_SPACE_ADVICE


@dataclass
class Check:
    name: str
    status: str  # ok | info | warn | fail
    detail: str
    advice: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail, "advice": self.advice}


@dataclass(frozen=True)
class Need:
    """What loading a bundle writes where the runtime keeps its images, by what the runtime does with it."""

    staged: int  # the archive copied whole before a layer is registered, removed after (Docker's <root>/tmp)
    kept: int  # compressed layers the runtime keeps (containerd's content store)
    unpacked: int  # layers unpacked into the store: those whose chain it does not hold already
    held: int  # layers whose chain the runtime holds already: not unpacked (nor kept) again

    @property
    def total(self) -> int:
        return self.staged + self.kept + self.unpacked


def need_for(index: BundleIndex, facts: "RuntimeInfo", held_chains: AbstractSet[Digest] = frozenset(),
             unpacked: Optional[int] = None) -> Need:
    """Space the runtime needs under its root to load the bundle, as it stages and stores images.

    Docker with its graphdriver store unpacks the whole upload under <root>/tmp (image/tarexport/load.go:
    every member, even of layers it holds) and then registers each layer it lacks, unpacked; the
    containerd store (containerd, and Docker's containerd image store) writes the blobs into its
    content store, where they stay, and unpacks into snapshots; Podman loads from a whole copy of the
    archive in its staging dir and copies the layers there twice more (PODMAN_STAGED_COPIES, counted here
    when that is on the root's file system). A layer's unpacked size is what fetch learnt (or load's full
    check measured), else model.UNPACKED_PER_COMPRESSED times its size."""
    layers: dict = {}  # chain ID -> (compressed, unpacked) of the layers the bundle carries
    held = 0
    for im in index.images:
        chains = chain_ids([x.diff_id for x in im.layers])
        for layer, chain in zip(im.layers, chains):
            if layer.omitted or chain in layers:
                continue
            if chain in held_chains:
                held += 1
                layers[chain] = None
                continue
            size = layer.unpacked_size if layer.unpacked_size is not None else int(layer.size * UNPACKED_PER_COMPRESSED)
            layers[chain] = (layer.size, size)
    fresh = [x for x in layers.values() if x is not None]
    total_unpacked = sum(u for _, u in fresh) if unpacked is None else unpacked
    if facts.containerd_store:
        return Need(0, sum(c for c, _ in fresh), total_unpacked, held)
    staged = index.archive.tar_size
    if facts.runtime == "podman":
        # _staging_check holds the copies against their own file system
        staged = PODMAN_STAGED_COPIES * staged if _same_fs(facts.staging_dir, facts.root_dir) else 0
    return Need(staged, 0, total_unpacked, held)


def held_chains(runtime: "Runtime") -> frozenset:
    """The layer chain IDs the runtime holds (every layer of its images); raises DaemonError."""
    present = set()
    for im in runtime.inventory():
        present.update(chain_ids(im.diff_ids))
    return frozenset(present)


def describe_need(need: Need, facts: "RuntimeInfo") -> str:
    """The need in words: how much, and what the runtime does with it."""
    root = facts.root_dir or "its root"
    if facts.containerd_store:
        how = (f"{format_size(need.kept)} of compressed layers kept in the content store + "
               f"{format_size(need.unpacked)} unpacked into snapshots")
    elif facts.runtime == "podman":
        how = (f"{format_size(need.staged)} in {facts.staging_dir} for the copy of the archive Podman loads from "
               f"and the two Podman makes of its layers + " if need.staged else "") + f"{format_size(need.unpacked)} unpacked"
    else:
        how = (f"{format_size(need.staged)} for the archive {facts.title} unpacks into {root}/tmp before it "
               f"registers the layers + {format_size(need.unpacked)} unpacked")
    held = (f"; {need.held} layer{'s' if need.held != 1 else ''} {facts.title} holds already "
            f"{'are' if need.held != 1 else 'is'} not unpacked again") if need.held else ""
    return f"the bundle needs about {format_size(need.total)} ({how}{held})"


def _same_fs(a: str, b: str) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return True  # not measurable here: count it, as one file system


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
    if facts.runtime == "podman" and facts.unmade:
        return Check("storage", "info", f"containers-storage ({facts.driver}) under {facts.root_dir}: not there yet "
                     "(Podman makes it on first use)")
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


def space_check(facts: "RuntimeInfo", index: Optional[BundleIndex], unpacked: Optional[int] = None,
                held_chains: AbstractSet[Digest] = frozenset()) -> Check:
    """Free space under the runtime's root against what loading `index` needs (a typical image without one);
    `held_chains`: the layer chains the runtime holds already (not unpacked again)."""
    root = facts.root_dir
    need = need_for(index, facts, held_chains, unpacked) if index is not None else None
    how = describe_need(need, facts) if need is not None else ""
    if facts.unmade and root and not os.path.isdir(root):
        root = _made_part(root)  # where the storage will be made: the space there is what it will have
    if not facts.local or not root or not os.path.isdir(root):
        return Check("space", "info", f"cannot check free space under {root or 'the Docker root dir'} from here "
                     f"(daemon at {facts.host})" + (f"; {how}" if how else ""))
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    staged = _staging_check(facts, index)
    if staged is not None:
        return staged
    if need is not None:
        if free < need.total:
            return Check("space", "fail", f"not enough space for {facts.title} under {root}: {how}, "
                         f"{format_size(free)} is free{_staged_by_others(facts, root)}", free_space_advice(facts))
        return Check("space", "ok", f"{format_size(free)} free under {root}; {how}")
    if free < TYPICAL_NEED:
        return Check("space", "warn", f"{format_size(free)} free under {root}",
                     f"a vllm-ascend image needs about {format_size(TYPICAL_NEED)} while loading; free space there")
    return Check("space", "ok", f"{format_size(free)} free under {root}")


def _staged_by_others(facts: "RuntimeInfo", where: str) -> str:
    """The archive copies other imgtool loads, still running, hold on the file system of `where`, for a refusal."""
    held = [(path, size) for path, size in facts.staged_by_others if _same_fs(path, where)]
    if not held:
        return ""
    return (f"; imgtool loads still running hold {format_size(sum(s for _, s in held))} of it: "
            + ", ".join(f"{path} ({format_size(size)})" for path, size in held))


def _made_part(path: str) -> str:
    """The nearest directory of `path` that exists (where a storage not made yet will be made)."""
    while path and not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _staging_check(facts: "RuntimeInfo", index: Optional[BundleIndex]) -> Optional[Check]:
    """Podman loads from a copy of the whole archive in its staging dir (/var/tmp, $TMPDIR) and copies the layers
    there twice more while it reads and applies them: on another file system than its storage, that needs
    PODMAN_STAGED_COPIES times the archive there; a fail when it lacks it."""
    stage = facts.staging_dir
    if index is None or not stage or not os.path.isdir(stage) or not os.path.isdir(facts.root_dir):
        return None
    if os.stat(stage).st_dev == os.stat(facts.root_dir).st_dev:
        return None  # one file system: need_for already counts the archive
    st = os.statvfs(stage)
    free = st.f_bavail * st.f_frsize
    need = PODMAN_STAGED_COPIES * index.archive.tar_size
    if free >= need:
        return None
    return Check("space", "fail", f"not enough space for {facts.title}'s copy of the archive in {stage}: it needs "
                 f"{format_size(need)} (the copy of the archive Podman loads from and the two Podman makes of its "
                 f"layers), {format_size(free)} is free{_staged_by_others(facts, stage)}",
                 f"free space there, or point TMPDIR at a directory with room for {PODMAN_STAGED_COPIES} times the archive")
