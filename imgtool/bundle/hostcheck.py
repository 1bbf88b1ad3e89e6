"""Can this host's runtime take this bundle? The checks `load` refuses or warns on and `doctor` lists.

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
from typing import TYPE_CHECKING, AbstractSet, List, Optional

from ..delta import chain_ids
from ..model import LAYER_COMPRESSION, UNPACKED_PER_COMPRESSED, Digest, format_size
from .format import BundleIndex

if TYPE_CHECKING:
    from ..runtimes.base import Runtime, RuntimeInfo

TYPICAL_NEED = 20 * 1024 ** 3  # a vllm-ascend image: ~15 GB unpacked plus the archive staged (or kept) while loading


def free_space_advice(facts: "RuntimeInfo") -> str:
    """How to make room where this runtime keeps images, in its own tools' words."""
    return facts.traits.space_advice(facts)


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
    archive in its staging dir and copies the layers there twice more (the room's Traits.staged_copies,
    counted here when that is on the root's file system). A layer's unpacked size is what fetch learnt (or load's full
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
    # copies staged on another file system than the root: _staging_check holds them against theirs
    staged = facts.traits.staged_copies * index.archive.tar_size \
        if _same_fs(facts.staging_dir or facts.root_dir, facts.root_dir) else 0
    return Need(staged, 0, total_unpacked, held)


def held_chains(runtime: "Runtime") -> frozenset:
    """The layer chain IDs the runtime holds (every layer of its images); raises DaemonError."""
    present = set()
    for im in runtime.inventory():
        present.update(chain_ids(im.diff_ids))
    return frozenset(present)


def describe_need(need: Need, facts: "RuntimeInfo") -> str:
    """The need in words: how much, and what the runtime does with it."""
    if facts.containerd_store:
        how = (f"{format_size(need.kept)} of compressed layers kept in the content store + "
               f"{format_size(need.unpacked)} unpacked into snapshots")
    else:
        where = f" in {facts.staging_dir}" if facts.staging_dir else ""
        how = (f"{format_size(need.staged)}{where} for {facts.traits.staged_words(facts)} + " if need.staged else "") \
            + f"{format_size(need.unpacked)} unpacked"
    held = (f"; {need.held} layer{'s' if need.held != 1 else ''} {facts.title} holds already "
            f"{'are' if need.held != 1 else 'is'} not unpacked again") if need.held else ""
    return f"the bundle needs about {format_size(need.total)} ({how}{held})"


def _same_fs(a: str, b: str) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return True  # not measurable here: count it, as one file system


def zstd_layer_refs(index: BundleIndex) -> List[str]:
    """The images of this bundle sending zstd-compressed layers to the runtime (a delta bundle's omitted layers are
    the runtime's already: never sent)."""
    return list(dict.fromkeys(im.ref for im in index.images if any(
        LAYER_COMPRESSION.get(x.media_type) == "zstd" and not x.omitted for x in im.layers)))


def zstd_check(index: BundleIndex, facts: "RuntimeInfo") -> Optional[Check]:
    """A fail when the bundle has zstd layers and the runtime cannot read them (before its traits' zstd_since:
    Docker 23.0, containerd 1.5, Podman 3.0); else None."""
    zstd = zstd_layer_refs(index)
    if not zstd or facts.reads_zstd:
        return None
    title, since = facts.title, facts.traits.zstd_since
    return Check(facts.runtime, "fail", f"{title} {facts.version} cannot read zstd-compressed layers ({', '.join(zstd)}): "
                 f"that needs {title} {since} or later{facts.traits.zstd_symptom}",
                 f"upgrade {title} to {since} or later, or fetch the image again with imgtool fetch --layers compat "
                 "(the default), which rewrites zstd layers as gzip: this bundle kept the registry's zstd bytes")


def storage_check(facts: "RuntimeInfo") -> Check:
    """The image store and storage driver, as the runtime's room describes them (a warn for devicemapper, vfs)."""
    return Check("storage", *facts.traits.storage(facts))


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
    """A runtime with a staging dir (Podman: /var/tmp, $TMPDIR) copies the whole archive there, and Podman the
    layers twice more while it reads and applies them: on another file system than its storage, that needs
    Traits.staged_copies times the archive there; a fail when it lacks it."""
    stage = facts.staging_dir
    if index is None or not stage or not os.path.isdir(stage) or not os.path.isdir(facts.root_dir):
        return None
    if os.stat(stage).st_dev == os.stat(facts.root_dir).st_dev:
        return None  # one file system: need_for already counts the archive
    st = os.statvfs(stage)
    free = st.f_bavail * st.f_frsize
    need = facts.traits.staged_copies * index.archive.tar_size
    if free >= need:
        return None
    return Check("space", "fail", f"not enough space for {facts.title}'s copy of the archive in {stage}: it needs "
                 f"{format_size(need)} ({facts.traits.staged_words(facts)}), {format_size(free)} is free"
                 f"{_staged_by_others(facts, stage)}", f"free space there, or {facts.traits.staging_advice}")
