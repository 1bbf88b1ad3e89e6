"""The container runtimes of a host, behind one interface: Docker, containerd (Kubernetes nodes), Podman.

`Runtime` is what `load`, `inventory`, `doctor` and `diff` ask of any of them; each runtime is a room
of its own that implements it: daemon.py (Docker, the only importer of docker-py), containerd.py
(`ctr`) and podman.py (`podman`), both run as programs with timeouts. The Protocol exists for the
type checker only (typing.Protocol is 3.8+, and the offline side runs on 3.7): import it under
TYPE_CHECKING. `open_runtime` picks and opens one (`--runtime auto`: Docker if its socket answers,
else containerd if its socket answers, else Podman if installed).
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import DaemonError, UsageError

if TYPE_CHECKING:
    from .kubelet import Kubelet

RUNTIMES = ("docker", "containerd", "podman")
CHOICES = ("auto",) + RUNTIMES
TITLES = {"docker": "Docker", "containerd": "containerd", "podman": "Podman"}
DEFAULT_CONTAINERD_ADDRESS = "/run/containerd/containerd.sock"
DEFAULT_CONTAINERD_NAMESPACE = "k8s.io"  # the namespace the kubelet (the CRI plugin) reads


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
        return TITLES.get(self.runtime, self.runtime)

    @property
    def containerd_store(self) -> bool:
        """Image IDs are manifest digests (Docker's containerd image store, and containerd)."""
        return self.image_store == "containerd"

    @property
    def version_tuple(self) -> Tuple[int, ...]:
        nums = []
        for piece in self.version.lstrip("v").split("+")[0].split("-")[0].split(".")[:3]:
            digits = "".join(ch for ch in piece if ch.isdigit())
            nums.append(int(digits) if digits else 0)
        return tuple(nums)

    @property
    def checks_diff_ids(self) -> bool:
        """The runtime refuses a layer whose content does not match its diff_id: Docker and containerd do
        (while they unpack); Podman 4.3 loads it as it is (measured), so imgtool checks for it: after the
        load against what Podman's storage computed while applying (reports_applied_diff_ids), else while
        the archive streams (decompressing every layer)."""
        return self.runtime != "podman"

    @property
    def reads_zstd(self) -> bool:
        """zstd layers: Docker from 23.0, containerd from 1.5, Podman (containers/storage) from 3.0."""
        floor = {"docker": (23,), "containerd": (1, 5), "podman": (3,)}.get(self.runtime, (23,))
        return self.version_tuple >= floor

    def to_json(self) -> dict:
        out = {"runtime": self.runtime, "host": self.host, "version": self.version, "api_version": self.api_version,
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


if TYPE_CHECKING:  # typing.Protocol is 3.8+: the offline side (3.7) never imports it
    from typing import Protocol

    from ..delta import InventoryImage

    class Runtime(Protocol):
        """The operations load, inventory and doctor need of a container runtime; errors are DaemonError."""

        def info(self) -> RuntimeInfo: ...

        def image_info(self, image_id: str) -> Optional[ImageInfo]: ...

        def images_by_id(self) -> Dict[str, ImageInfo]: ...

        def inventory(self) -> List[InventoryImage]: ...

        def stored_name(self, name: str) -> str: ...

        def tag(self, image_id: str, name: str) -> None: ...

        def remove_image(self, image_id: str) -> None: ...

        def load_archive(self, chunks: Iterable[bytes], platforms: Tuple[str, ...] = ()) -> List[str]: ...

        def applied_diff_ids(self, image_id: str) -> Optional[List[str]]: ...

        def incomplete(self, image_id: str, diff_ids: Sequence[str]) -> Optional[Unfinished]: ...

        def finish(self, image_id: str) -> None: ...

        def pin(self, image_id: str) -> bool: ...

        def remove_debris(self) -> List[str]: ...

        def close(self) -> None: ...

        def __enter__(self) -> "Runtime": ...

        def __exit__(self, *exc: object) -> None: ...


@dataclass(frozen=True)
class Choice:
    """Which runtime to open and where: --runtime, --address, --namespace (and their variables), and on a
    Kubernetes node the kubelet's runtime, which --runtime auto follows."""

    runtime: str = "auto"
    docker_host: Optional[str] = None  # None: config's (DOCKER_HOST or the default socket)
    address: str = DEFAULT_CONTAINERD_ADDRESS
    namespace: str = DEFAULT_CONTAINERD_NAMESPACE
    tmpdir: str = "/var/tmp"  # where Podman stages an archive: $TMPDIR, else /var/tmp (as podman load does)
    podman_env: Tuple[Tuple[str, str], ...] = ()  # where Podman's storage.conf is (CONTAINERS_STORAGE_CONF, XDG_*)
    kubelet: Optional["Kubelet"] = None  # this node's kubelet (kubelet.find()), None off Kubernetes

    @classmethod
    def from_options(cls, runtime: Optional[str], address: Optional[str], namespace: Optional[str],
                     env: Mapping[str, str], kubelet: Optional["Kubelet"] = None) -> "Choice":
        """--runtime/--address/--namespace, else $CONTAINERD_ADDRESS/$CONTAINERD_NAMESPACE (as ctr reads
        them; `env` is config.runtime_environment()), else on a Kubernetes node the kubelet's endpoint, else
        the defaults; raises UsageError."""
        runtime = (runtime or "auto").lower()
        if runtime not in CHOICES:
            raise UsageError(f"unknown runtime {runtime!r}: choose one of {', '.join(CHOICES)}")
        kubelets = kubelet.address if kubelet is not None and kubelet.runtime == "containerd" else None
        address = address or env.get("CONTAINERD_ADDRESS") or kubelets or DEFAULT_CONTAINERD_ADDRESS
        if address.startswith("unix://"):
            address = address[len("unix://"):]
        namespace = namespace or env.get("CONTAINERD_NAMESPACE") or DEFAULT_CONTAINERD_NAMESPACE
        podman_env = tuple((k, env[k]) for k in ("CONTAINERS_STORAGE_CONF", "XDG_CONFIG_HOME", "XDG_DATA_HOME")
                           if env.get(k))
        return cls(runtime, env.get("DOCKER_HOST") or None, address, namespace, env.get("TMPDIR") or "/var/tmp",
                   podman_env, kubelet)

    @property
    def follows_kubelet(self) -> bool:
        """--runtime auto on a node whose kubelet uses a runtime imgtool loads into: that one, and no other."""
        return self.runtime == "auto" and self.kubelet is not None and self.kubelet.runtime in RUNTIMES

    @property
    def effective(self) -> str:
        """The runtime a load goes to: --runtime's, the kubelet's under auto, else "auto" (the first that answers)."""
        return self.kubelet.runtime if self.follows_kubelet and self.kubelet is not None else self.runtime

    def reason(self) -> str:
        """Why auto chose the runtime, one line ("" when it did not follow a kubelet)."""
        if not self.follows_kubelet or self.kubelet is None:
            return ""
        if self.kubelet.runtime == "containerd":
            return f"runtime: containerd at unix://{self.address}, namespace {self.namespace} " \
                   f"(the kubelet's, from {self.kubelet.source})"
        return f"runtime: Docker (the kubelet's, through cri-dockerd at {self.kubelet.endpoint}, " \
               f"from {self.kubelet.source})"

    def elsewhere(self) -> str:
        """Where this choice sends images that the kubelet does not read them from, in words ("" when it
        sends them where the kubelet reads, or there is no kubelet)."""
        k = self.kubelet
        if k is None:
            return ""
        if k.runtime not in RUNTIMES:
            return f"the kubelet uses {k.runtime} at {k.endpoint} (from {k.source}), which imgtool does not " \
                   "load into"
        theirs = f"the kubelet reads images from {TITLES[k.runtime]} at {k.endpoint} (from {k.source})"
        runtime = self.effective
        if runtime not in (k.runtime, "auto"):
            return f"{theirs}, but --runtime {runtime} sends them to {TITLES[runtime]}"
        if k.runtime == "containerd" and runtime == "containerd":
            if not _same_socket(self.address, k.address):
                return f"{theirs}, but this load goes to containerd at {self.address} (--address or CONTAINERD_ADDRESS)"
            if self.namespace != DEFAULT_CONTAINERD_NAMESPACE:
                return f"{theirs}, namespace {DEFAULT_CONTAINERD_NAMESPACE}, but this load goes to namespace " \
                       f"{self.namespace} (--namespace or CONTAINERD_NAMESPACE)"
        return ""


def _same_socket(a: str, b: str) -> bool:
    import os

    return os.path.realpath(a) == os.path.realpath(b)


def open_runtime(choice: Choice, timeout: Optional[int] = 3600, create: bool = True) -> "Runtime":
    """The runtime `choice` names, opened; with "auto", the kubelet's on a Kubernetes node (and no other),
    elsewhere the first that answers of Docker, containerd, Podman. `create=False` (doctor): a runtime without
    image storage yet is opened without asking it anything that would make it (its facts say `unmade`). Raises
    DaemonError (naming what each said when none answers), UsageError."""
    openers: Dict[str, Callable[[], "Runtime"]] = {
        "docker": lambda: _docker(timeout, choice.docker_host),
        "containerd": lambda: _containerd(choice, timeout),
        "podman": lambda: _podman(timeout, choice, create),
    }
    if choice.effective != "auto":
        if not choice.follows_kubelet:
            return openers[choice.effective]()
        try:  # the kubelet's runtime, or none: another that answers is not where Pods look
            return openers[choice.effective]()
        except DaemonError as e:
            raise DaemonError(f"the kubelet's runtime does not answer: {e.message}",
                              hint="start it, or choose another runtime with --runtime (Pods will not find the "
                                   "images there)") from e
    said = []
    for name in RUNTIMES:
        try:
            return openers[name]()
        except DaemonError as e:
            said.append(f"{TITLES[name]}: {e.message}")
    raise DaemonError("no container runtime answers here: " + "; ".join(said),
                      hint="start one (systemctl start docker, or containerd), choose one with --runtime, and for "
                           "containerd give its socket with --address or CONTAINERD_ADDRESS")


def _docker(timeout: Optional[int], host: Optional[str]) -> "Runtime":
    from .docker import open_daemon

    return open_daemon(timeout=timeout, host=host)


def _containerd(choice: Choice, timeout: Optional[int]) -> "Runtime":
    from .containerd import Containerd

    return Containerd(choice.address, choice.namespace, timeout=timeout)


def _podman(timeout: Optional[int], choice: Choice, create: bool) -> "Runtime":
    from .podman import Podman

    return Podman(timeout=timeout, staging_dir=choice.tmpdir, create=create, env=dict(choice.podman_env))

