"""Which runtime a verb opens: --runtime, --address, --namespace (and their variables), and on a Kubernetes node
the kubelet's runtime (kubelet.py), which --runtime auto follows. `load`, `inventory`, `doctor`, `run` and
`run-flags` choose alike. The rooms are named here and nowhere above: every difference between them is in
their `Traits`.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Mapping, Optional, Tuple, cast

from ..errors import DaemonError, UsageError
from . import containerd, docker, podman
from .base import RunProgram, Traits

if TYPE_CHECKING:
    from ..nodeconfig import PartMaker
    from .base import Runner, Runtime
    from .kubelet import Kubelet

# the rooms, in the order --runtime auto tries them off Kubernetes
ROOMS: Dict[str, Traits] = {"docker": docker.TRAITS, "containerd": containerd.TRAITS, "podman": podman.TRAITS}
RUNTIMES = tuple(ROOMS)
CHOICES = ("auto",) + RUNTIMES
TITLES = {name: traits.title for name, traits in ROOMS.items()}
# the `run` programs imgtool renders, Docker's first (run-flags' syntax when no runtime answers)
PROGRAMS = tuple(traits.run_program for traits in ROOMS.values() if traits.run_program is not None)
DEFAULT_CONTAINERD_ADDRESS = "/run/containerd/containerd.sock"
DEFAULT_CONTAINERD_NAMESPACE = "k8s.io"  # the namespace the kubelet (the CRI plugin) reads


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

    def asked(self) -> Tuple[str, ...]:
        """The runtimes this choice asks about (doctor): every one with auto, in the order auto tries them."""
        return RUNTIMES if self.runtime == "auto" else (self.runtime,)

    def loads_into(self, runtime: str) -> bool:
        """Whether a load goes to `runtime` (a RuntimeInfo.runtime) under this choice (auto: when it follows a kubelet)."""
        return runtime == self.effective

    def kubelet_uses(self, runtime: str) -> bool:
        """Whether this node's kubelet reads images from `runtime` (a RuntimeInfo.runtime)."""
        return self.kubelet is not None and self.kubelet.runtime == runtime

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
    return docker.open_daemon(timeout=timeout, host=host)


def _containerd(choice: Choice, timeout: Optional[int]) -> "Runtime":
    return containerd.Containerd(choice.address, choice.namespace, timeout=timeout)


def _podman(timeout: Optional[int], choice: Choice, create: bool) -> "Runtime":
    return podman.Podman(timeout=timeout, staging_dir=choice.tmpdir, create=create, env=dict(choice.podman_env))



def runner(runtime: "Runtime") -> Tuple["Runner", RunProgram]:
    """The runtime, to start a container through (`imgtool run`), and its `run` program; raises UsageError when its
    traits name no `run` (containerd: the kubelet starts its containers)."""
    return cast("Runner", runtime), refuse_without_run(runtime.traits)


def refuse_without_run(traits: Traits) -> RunProgram:
    """The `run` program of a runtime with these traits; raises UsageError when it has none."""
    if traits.run_program is None:
        runners = " or ".join(p.title for p in PROGRAMS)
        raise UsageError(f"imgtool run starts containers through {runners}; {traits.title} has no `run` of its "
                         "own (on a Kubernetes node the kubelet starts its containers)",
                         hint="write a Pod for it: imgtool run-flags PRESET --format k8s > pod.yaml, then kubectl apply "
                              "-f pod.yaml; or choose another runtime with --runtime")
    return traits.run_program


def mirror_parts() -> Tuple["PartMaker", ...]:
    """Each room's node configuration for pulling from `imgtool serve`, in the order the script prints them."""
    return (containerd.mirror_part, podman.mirror_part, docker.mirror_part)
