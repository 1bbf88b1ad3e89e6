"""What every runtime room reports and does: `Runtime` (the interface), `RuntimeInfo`, `Traits`, `ImageInfo`.

`Runtime` is what `load`, `inventory`, `doctor` and `diff` ask of any runtime; each runtime is a room of its
own that implements it: docker.py (Docker, the only importer of docker-py), containerd.py (`ctr`) and
podman.py (`podman`), both run as programs with timeouts. What differs between them is a `Traits` value each
room reports (its zstd floor, whether it checks diff_ids, how it names an image by digest, its words for a
load, where to free space, ...): the rooms above ask the traits, never compare a runtime's name. The Protocol
exists for the type checker only (typing.Protocol is 3.8+, and the offline side runs on 3.7): import it under
TYPE_CHECKING.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class RunProgram:
    """A runtime whose `run` command imgtool renders: what differs from `docker run`, and only that."""

    name: str  # the program, argv[0]
    title: str  # as messages name it: "loaded in Podman"
    extra: Tuple[str, ...] = ()  # flags after -it/-d that only this program gets


@dataclass(frozen=True)
class Traits:
    """What a room says of how its runtime takes images: every difference the rooms above ask about.

    A room subclasses it where a difference is words built from its facts (`describe`, `storage`,
    `space_advice`)."""

    title: str  # how messages name the runtime: Docker, containerd, Podman
    load_command: str  # its own words for a load, in messages: "docker load finished, but ..."
    zstd_since: str  # the first version that reads zstd-compressed layers: "23.0"
    zstd_symptom: str = ""  # what an older one does with them, for the refusal
    # the runtime refuses a layer whose content does not match its diff_id (Docker and containerd do, while
    # they unpack; Podman 4.3 loads it as it is, measured: imgtool checks for it)
    checks_diff_ids: bool = True
    # an image is also named REPO@<the registry's manifest digest>, as the CRI names one it pulls (its
    # RepoDigests), and an archive's unnamed images are kept only by such a name (containerd)
    digest_names: bool = False
    # copies of the whole archive the runtime stages before it registers a layer, and where in words (Docker's
    # graphdriver: 1, unpacked under <root>/tmp; Podman: 3 in its staging dir)
    staged_copies: int = 0
    staging_advice: str = ""  # when its staging dir (another file system than its root) lacks room for them
    pins_for_kubelet: bool = False  # Runtime.pin labels an image the kubelet's image GC leaves (containerd 1.7+)
    # an archive it imports may leave out a blob it holds by digest (containerd's content store): what a modelcar of
    # a delta bundle needs (its files' layers held, by another revision's modelcar); Docker's load wants every layer
    # whose chain it lacks, Podman's every layer
    reuses_blobs: bool = False
    run_program: Optional[RunProgram] = None  # `imgtool run` starts containers through it (None: not this runtime)
    absent_advice: str = ""  # what to do when it does not answer

    @property
    def zstd_floor(self) -> Tuple[int, ...]:
        return version_tuple(self.zstd_since)

    def describe(self, facts: "RuntimeInfo") -> str:
        """The runtime in one line: which, its version, where."""
        return f"{self.title} {facts.version} at {facts.host}"

    def storage(self, facts: "RuntimeInfo") -> Tuple[str, str, str]:
        """Its image store and storage driver: (status ok|info|warn, detail, advice)."""
        return "ok", f"{facts.driver} under {facts.root_dir}", ""

    def space_advice(self, facts: "RuntimeInfo") -> str:
        """How to make room where it keeps images, in its own tools' words."""
        return f"free space under {facts.root_dir or 'its root'}"

    def staged_words(self, facts: "RuntimeInfo") -> str:
        """What the staged copies of the archive are, in words."""
        return "the copies of the archive it stages"


def tags_of(images: Iterable["ImageInfo"], repository: str) -> List[str]:
    """The tags of `repository` among the images' names, sorted (a room's local_tags from its listing)."""
    from ..model import familiar

    wanted = familiar(repository)
    tags = set()
    for info in images:
        for ref in info.tags:
            name, _, tag = str(ref).rpartition(":")
            if name and "/" not in tag and familiar(name) == wanted:
                tags.add(tag)
    return sorted(tags)


def version_tuple(version: str) -> Tuple[int, ...]:
    """"20.10.24+dfsg1" -> (20, 10, 24); "v1.7.24" -> (1, 7, 24)."""
    nums = []
    for piece in version.lstrip("v").split("+")[0].split("-")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        nums.append(int(digits) if digits else 0)
    return tuple(nums)


@dataclass(frozen=True)
class RuntimeInfo:
    """What decides whether a bundle can be loaded: which runtime, version, storage, where, which arch."""

    host: str  # DOCKER_HOST or Docker's default socket; containerd's address; "podman"
    version: str  # server version, e.g. 20.10.24+dfsg1, 1.7.24, 4.3.1
    api_version: str
    driver: str  # storage driver or snapshotter: overlay2, overlayfs, vfs, ...
    root_dir: str  # where images land (docker load also unpacks its upload under <root>/tmp)
    arch: str  # normalised: arm64, amd64
    os: str
    local: bool  # the runtime runs on this machine, so root_dir's free space can be read here
    traits: Traits  # what its room says of how it takes images
    # Where images live: "graphdriver" (Docker's overlay2 & co: image ID = config digest), "containerd"
    # (Docker's containerd image store, and containerd itself: image ID = the manifest digest it was
    # loaded by) or "containers-storage" (Podman: image ID = config digest)
    image_store: str = "graphdriver"
    runtime: str = "docker"  # docker | containerd | podman
    namespace: str = ""  # containerd's namespace (k8s.io on a Kubernetes node)
    staging_dir: str = ""  # where the runtime copies the whole archive before it reads it (Podman: /var/tmp)
    # the archive copies other imgtool loads, still running, hold there: (path, bytes) (a space refusal names them)
    staged_by_others: Tuple[Tuple[str, int], ...] = ()
    reports_applied_diff_ids: bool = False  # Runtime.applied_diff_ids answers (Podman: its storage's records)
    unmade: bool = False  # no image storage yet (Podman before its first use): nothing was asked that would make it

    @property
    def title(self) -> str:
        """How messages name the runtime: Docker, containerd, Podman."""
        return self.traits.title

    @property
    def containerd_store(self) -> bool:
        """Image IDs are manifest digests (Docker's containerd image store, and containerd)."""
        return self.image_store == "containerd"

    @property
    def version_tuple(self) -> Tuple[int, ...]:
        return version_tuple(self.version)

    @property
    def checks_diff_ids(self) -> bool:
        """The runtime refuses a layer whose content does not match its diff_id; where it does not (Podman),
        imgtool checks: after the load against what its storage computed while applying
        (reports_applied_diff_ids), else while the archive streams (decompressing every layer)."""
        return self.traits.checks_diff_ids

    @property
    def reads_zstd(self) -> bool:
        """zstd-compressed layers: from the traits' zstd_since on (Docker 23.0, containerd 1.5, Podman 3.0)."""
        return self.version_tuple >= self.traits.zstd_floor

    def to_json(self) -> dict:
        out = {"runtime": self.runtime, "title": self.traits.title, "host": self.host, "version": self.version,
               "api_version": self.api_version,
               "driver": self.driver, "image_store": self.image_store, "root_dir": self.root_dir, "arch": self.arch,
               "os": self.os, "local": self.local}
        if self.namespace:
            out["namespace"] = self.namespace
        return out


@dataclass(frozen=True)
class ImageInfo:
    """An image as the runtime reports it."""

    id: str  # sha256:..., what this runtime calls it (see bundle.layout.runtime_image_id)
    tags: Tuple[str, ...]  # as the runtime shows them (Docker: docker.io/library/x:1 shows as x:1)
    os: str
    architecture: str
    variant: Optional[str]
    size: int

    @property
    def platform(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


@dataclass(frozen=True)
class Unfinished:
    """What a runtime holds of a recorded image that is not yet all of it (containerd: content missing, or not
    unpacked into the snapshotter, as a killed import or unpack leaves it)."""

    reason: str  # in words: "it is not unpacked into overlayfs"
    needs_import: bool = False  # True: blobs are missing, the archive must be imported again; False: unpack it


@dataclass(frozen=True)
class Debris:
    """What a load of imgtool's, cut short (imgtool, the runtime or its tool killed), left in a runtime and no one
    removed: known for imgtool's own by a name or label it carries. `doctor` lists it; the next load removes or
    finishes it (`Runtime.remove_debris`, or the load's own plan for a half-loaded image of its bundle)."""

    what: str  # in words, with where it is and, where known, its size
    advice: str  # what removes or finishes it: "the next imgtool load removes it"
    size: int = 0  # bytes it holds, where known


if TYPE_CHECKING:  # typing.Protocol is 3.8+: the offline side (3.7) never imports it
    from typing import Protocol

    from ..delta import InventoryImage
    from ..model import Digest

    class Runtime(Protocol):
        """The operations load, inventory and doctor need of a container runtime; errors are DaemonError."""

        @property
        def traits(self) -> Traits: ...  # what the room says of how its runtime takes images (also in info())

        def info(self) -> RuntimeInfo: ...

        def image_info(self, image_id: str) -> Optional[ImageInfo]: ...

        def images_by_id(self) -> Dict[str, ImageInfo]: ...

        def inventory(self) -> List[InventoryImage]: ...

        def stored_name(self, name: str) -> str: ...

        def tag(self, image_id: str, name: str) -> None: ...

        def remove_image(self, image_id: str) -> None: ...

        # `images`: (name, ID) of each image the archive registers, so that what a load cut short leaves is known
        def load_archive(self, chunks: Iterable[bytes], platforms: Tuple[str, ...] = (), *,
                         images: Sequence[Tuple[str, str]] = ()) -> List[str]: ...

        def applied_diff_ids(self, image_id: str) -> Optional[List[str]]: ...

        def held_blobs(self, digests: Iterable[Digest]) -> FrozenSet[Digest]: ...  # those it holds by digest

        def blob_head(self, digest: str, limit: int) -> Optional[bytes]: ...  # a held blob's first bytes; None: not

        def incomplete(self, image_id: str, diff_ids: Sequence[str]) -> Optional[Unfinished]: ...

        def finish(self, image_id: str) -> None: ...

        def pin(self, image_id: str) -> bool: ...

        def debris(self) -> List[Debris]: ...  # what loads of imgtool's cut short left here, read only (doctor)

        def remove_debris(self) -> List[str]: ...  # that removed, a line for each (what a load finishes, said)

        def left_behind(self) -> str: ...  # what this process's failed load may have left where it could not look

        def close(self) -> None: ...

        def __enter__(self) -> "Runtime": ...

        def __exit__(self, *exc: object) -> None: ...

    class BindMount(Protocol):
        @property
        def host(self) -> str: ...

        @property
        def create(self) -> bool: ...  # a directory of the preset's own: made when absent

    class ContainerSpec(Protocol):
        """What a room reads of the container `imgtool run` starts (presets.run.RunSpec, handed down)."""

        @property
        def image(self) -> str: ...

        @property
        def name(self) -> Optional[str]: ...

        @property
        def detach(self) -> bool: ...

        @property
        def interactive(self) -> bool: ...

        @property
        def mounts(self) -> Sequence[BindMount]: ...

    class Runner(Runtime, Protocol):
        """A runtime `imgtool run` starts containers through (its traits name a run_program)."""

        def local_tags(self, repository: str) -> List[str]: ...

        def arch_warning(self, ref: str) -> Optional[str]: ...

        def run_container(self, spec: ContainerSpec, argv_for: Callable[[bool], List[str]]) -> Tuple[int, str]: ...


