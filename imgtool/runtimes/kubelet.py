"""The kubelet of this node, as its configuration says: which CRI runtime it reads images from, and its image GC.

On a Kubernetes node an image is of use only where the kubelet looks for it: its CRI runtime's
endpoint (namespace k8s.io on containerd). That is read, in order, from the running kubelet's command
line (`/proc/*/cmdline` of a process named kubelet: `--container-runtime-endpoint`, else `--config
FILE`'s `containerRuntimeEndpoint`; k3s runs the kubelet inside its own process, on its own containerd),
kubeadm's `/var/lib/kubelet/kubeadm-flags.env`, `/var/lib/kubelet/config.yaml`, crictl's
`/etc/crictl.yaml` (`runtime-endpoint`), then the sockets of k3s/RKE2 and MicroK8s. cri-dockerd's
endpoint means Docker. Only reads, never writes; a file that cannot be read is a warning, never an
error. Standard library only (the offline side runs on Python 3.7).
"""

import json
import os
import shlex
from dataclasses import dataclass, replace
from typing import Dict, Iterator, List, Optional, Tuple

PROC = "/proc"
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
KUBEADM_FLAGS = "/var/lib/kubelet/kubeadm-flags.env"
CRICTL_CONFIG = "/etc/crictl.yaml"
K3S_SOCKET = "/run/k3s/containerd/containerd.sock"  # k3s and RKE2 run their own containerd here
MICROK8S_SOCKET = "/var/snap/microk8s/common/run/containerd.sock"
DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"  # KubeletConfiguration's default (1.27+)
MAX_FILE = 1024 * 1024  # a kubelet configuration is a few KiB: more is not one
GC_HIGH, GC_LOW = 85, 80  # imageGCHighThresholdPercent, imageGCLowThresholdPercent: the kubelet's defaults
K3S_NAMES = ("k3s", "k3s-server", "k3s-agent")  # k3s's process (the kubelet runs inside it)


@dataclass(frozen=True)
class Kubelet:
    """The kubelet's CRI runtime and image GC thresholds, and where each was read."""

    runtime: str  # containerd | docker | another CRI runtime's name (cri-o, isulad): not one imgtool loads into
    endpoint: str  # as the kubelet has it: unix:///run/containerd/containerd.sock
    source: str  # where the endpoint was read, for messages
    config: str = ""  # the KubeletConfiguration file read, if any
    gc_high: int = GC_HIGH
    gc_low: int = GC_LOW
    gc_source: str = ""  # the file that set the thresholds; "": the kubelet's defaults

    @property
    def address(self) -> str:
        """The endpoint as a socket path (unix:// dropped)."""
        return self.endpoint[len("unix://"):] if self.endpoint.startswith("unix://") else self.endpoint

    def describe(self) -> str:
        """containerd at unix:///run/containerd/containerd.sock (the kubelet's, from /var/lib/kubelet/config.yaml)"""
        return f"{self.runtime} at {self.endpoint} (the kubelet's, from {self.source})"


def runtime_of(endpoint: str) -> str:
    """Which runtime an endpoint is: cri-dockerd (and the old dockershim) mean Docker."""
    name = os.path.basename(endpoint.rstrip("/"))
    if "dockerd" in name or "dockershim" in name:
        return "docker"
    if "crio" in name:
        return "cri-o"
    if "isulad" in name:
        return "isulad"
    return "containerd"


def find(warnings: List[str]) -> Optional[Kubelet]:
    """The kubelet of this node, or None when nothing says there is one; what could not be read is added to
    `warnings` (a file of the kubelet's that is not what it should be: said, then passed over)."""
    found = _from_process(warnings) or _from_files(warnings)
    if found is None:
        return None
    config = found.config or (KUBELET_CONFIG if os.path.exists(KUBELET_CONFIG) else "")
    values = read_keys(config, ("imageGCHighThresholdPercent", "imageGCLowThresholdPercent"), warnings) if config else {}
    high, low = _percent(values.get("imageGCHighThresholdPercent"), GC_HIGH), \
        _percent(values.get("imageGCLowThresholdPercent"), GC_LOW)
    return replace(found, config=config, gc_high=high, gc_low=low, gc_source=config if values else "")


def _percent(value: Optional[str], default: int) -> int:
    try:
        n = int(value) if value is not None else default
    except ValueError:
        return default
    return n if 0 <= n <= 100 else default


def _processes() -> Iterator[Tuple[int, str, List[str]]]:
    """(pid, comm, argv) of the processes a kubelet may be, in pid order: of this PID and mount namespace only."""
    try:
        pids = sorted(int(p) for p in os.listdir(PROC) if p.isdigit())
    except OSError:
        return
    for pid in pids:
        comm = _read(f"{PROC}/{pid}/comm", 256)
        if comm is None or comm.strip() not in ("kubelet",) + K3S_NAMES:
            continue
        raw = _read_bytes(f"{PROC}/{pid}/cmdline", MAX_FILE)
        if raw is None or not _same_namespaces(pid):
            continue
        yield pid, comm.strip(), [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _same_namespaces(pid: int) -> bool:
    """The process shares this one's PID and mount namespaces. A kubelet in another (a kind node's, a
    container's, a test's) is another node's: its endpoint is a path in a file system this process does not
    see. Where the namespaces cannot be compared (not root: the kubelet's are root's to read), it is taken as
    this node's, as it is on a real node."""
    for ns in ("pid", "mnt"):
        try:
            if os.readlink(f"{PROC}/{pid}/ns/{ns}") != os.readlink(f"{PROC}/self/ns/{ns}"):
                return False
        except OSError:
            continue
    return True


def _flag(args: List[str], name: str) -> Optional[str]:
    """--name=VALUE or --name VALUE (pflag's forms), the last one given (as pflag takes it)."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            value = arg[len(name) + 1:]
        elif arg == name and i + 1 < len(args):
            value = args[i + 1]
    return value


def _from_args(args: List[str], source: str, warnings: List[str]) -> Optional[Kubelet]:
    """The runtime the kubelet's flags name: --container-runtime-endpoint, else --config FILE's key."""
    endpoint = _flag(args, "--container-runtime-endpoint")
    config = _flag(args, "--config") or ""
    if endpoint:
        return Kubelet(runtime_of(endpoint), endpoint, source, config=config)
    if config:
        value = read_keys(config, ("containerRuntimeEndpoint",), warnings).get("containerRuntimeEndpoint")
        if value:
            return Kubelet(runtime_of(value), value, config, config=config)
    if _flag(args, "--container-runtime") == "docker":  # before Kubernetes 1.24: the dockershim
        return Kubelet("docker", "unix:///var/run/dockershim.sock", source, config=config)
    return None


def _from_process(warnings: List[str]) -> Optional[Kubelet]:
    for pid, comm, args in _processes():
        source = f"the kubelet's command line, pid {pid}" if comm == "kubelet" else f"k3s's command line, pid {pid}"
        found = _from_args(args[1:], source, warnings)
        if found is not None:
            return found
        if comm in K3S_NAMES:  # the embedded kubelet: on k3s's containerd, or on cri-dockerd with --docker
            if "--docker" in args:
                return Kubelet("docker", "unix:///run/k3s/cri-dockerd/cri-dockerd.sock", source)
            return Kubelet("containerd", "unix://" + K3S_SOCKET, source)
        # a kubelet without either flag: its configuration's default
        return Kubelet("containerd", DEFAULT_ENDPOINT, f"{source}: no endpoint given, the kubelet's default")
    return None


def _from_files(warnings: List[str]) -> Optional[Kubelet]:
    text = _read_config(KUBEADM_FLAGS, warnings)
    if text:
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == "KUBELET_KUBEADM_ARGS":
                try:
                    args = shlex.split(value.strip().strip('"').strip("'"))
                except ValueError:
                    warnings.append(f"cannot read {KUBEADM_FLAGS}: KUBELET_KUBEADM_ARGS is not a list of words")
                    continue
                found = _from_args(args, KUBEADM_FLAGS, warnings)
                if found is not None:
                    return found
    for path, key in ((KUBELET_CONFIG, "containerRuntimeEndpoint"), (CRICTL_CONFIG, "runtime-endpoint")):
        endpoint = read_keys(path, (key,), warnings).get(key)
        if endpoint:
            return Kubelet(runtime_of(endpoint), endpoint, path)
    for path, what in ((K3S_SOCKET, "k3s/RKE2's containerd socket"), (MICROK8S_SOCKET, "MicroK8s's containerd socket")):
        if os.path.exists(path):
            return Kubelet("containerd", "unix://" + path, f"{what}, {path}")
    return None


def read_keys(path: str, keys: Tuple[str, ...], warnings: List[str]) -> Dict[str, str]:
    """The top-level scalar `keys` of a small YAML (or JSON) file, as strings; {} when it is absent. A file
    that cannot be read or parsed adds a warning: the kubelet's files are read, never trusted to be sound."""
    text = _read_config(path, warnings)
    if not text:
        return {}
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as e:
            warnings.append(f"cannot read {path}: not valid JSON ({e})")
            return {}
        if not isinstance(doc, dict):
            return {}
        return {k: str(v) for k, v in doc.items() if k in keys and isinstance(v, (str, int, float))}
    out: Dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line[0] in " \t#-" or ":" not in line:
            continue  # nested, a comment, a list item: never one of our top-level keys
        key, _, rest = line.partition(":")
        key = key.strip().strip("\"'")
        if key not in keys:
            continue
        value = _scalar(rest)
        if value is None:
            warnings.append(f"cannot read {path}:{number}: {key} is not a plain value")
            continue
        out[key] = value
    return out


def _scalar(text: str) -> Optional[str]:
    """A YAML plain or quoted scalar on one line (a trailing comment dropped); None for anything else."""
    text = text.strip()
    if text[:1] in ("'", '"'):
        end = text.find(text[0], 1)
        return text[1:end] if end > 0 else None
    text = text.split(" #", 1)[0].strip()
    if not text or text[0] in "[{|>&*!":
        return None
    return text


def _read_config(path: str, warnings: List[str]) -> Optional[str]:
    """A configuration file's text; None when absent. Not a regular file, too big, or not text: a warning."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        warnings.append(f"cannot read {path}: {e.strerror or e}")
        return None
    import stat

    if not stat.S_ISREG(st.st_mode):
        warnings.append(f"cannot read {path}: not a regular file")
        return None
    if st.st_size > MAX_FILE:
        warnings.append(f"cannot read {path}: {st.st_size} bytes is too big for a configuration file")
        return None
    data = _read_bytes(path, MAX_FILE)
    if data is None:
        warnings.append(f"cannot read {path}")
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        warnings.append(f"cannot read {path}: not UTF-8 text")
        return None


def _read_bytes(path: str, limit: int) -> Optional[bytes]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    chunks: List[bytes] = []
    try:
        while limit > 0:
            data = os.read(fd, min(limit, 65536))
            if not data:
                break
            chunks.append(data)
            limit -= len(data)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read(path: str, limit: int) -> Optional[str]:
    data = _read_bytes(path, limit)
    return None if data is None else data.decode("utf-8", "replace")
