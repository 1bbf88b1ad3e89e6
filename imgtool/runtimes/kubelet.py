"""The kubelet of this node, as its configuration says: which CRI runtime it reads images from, and its image GC.

On a Kubernetes node an image is of use only where the kubelet looks for it: its CRI runtime's
endpoint (namespace k8s.io on containerd). That is read, in order, from the running kubelet's command
line (`/proc/*/cmdline` of a process named kubelet: `--container-runtime-endpoint`, else `--config
FILE`'s `containerRuntimeEndpoint`; k3s runs the kubelet inside its own process, on its own containerd),
kubeadm's `/var/lib/kubelet/kubeadm-flags.env`, `/var/lib/kubelet/config.yaml`, crictl's
`/etc/crictl.yaml` (`runtime-endpoint`), then the sockets of k3s/RKE2 and MicroK8s. cri-dockerd's
endpoint means Docker. Only reads, never writes; a file that cannot be read is a warning, never an
error. Standard library only (the offline side runs on Python 3.7).

Only root steers root's load (issue 46): a process counts as the kubelet only when every uid of it is 0 and it
is alive (not a zombie, its command line not empty); where several such kubelets name different runtimes, none is
followed (a warning names them) and the files decide. A file counts only when it is a regular file owned by root,
writable by no one else, not empty (as the kernel's files of /proc say they are) and within MAX_FILE; it is read
only up to the size it says it has, so a FIFO, /proc/kmsg or a 1 GiB file is a warning, never a wait. A value
(an endpoint, a --config path) holding a control character (a newline) is no value: load.sh reads the command
line a line per argument and must read it as this does. bundle/loadsh.py writes these numbers into load.sh.
"""

import json
import os
import shlex
import stat
from dataclasses import dataclass, replace
from typing import Dict, Iterator, List, Optional, Tuple, Union

PROC = "/proc"
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
KUBEADM_FLAGS = "/var/lib/kubelet/kubeadm-flags.env"
CRICTL_CONFIG = "/etc/crictl.yaml"
K3S_SOCKET = "/run/k3s/containerd/containerd.sock"  # k3s and RKE2 run their own containerd here
MICROK8S_SOCKET = "/var/snap/microk8s/common/run/containerd.sock"
DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"  # KubeletConfiguration's default (1.27+)
MAX_FILE = 1024 * 1024  # a kubelet configuration (and a command line) is a few KiB: more is not one
MAX_COMM = 64  # /proc/PID/comm: the kernel's 16 bytes
MAX_STATUS = 4096  # /proc/PID/status: Name, State and Uid are in its first lines (Groups, which can be long, after)
NAMES = ("kubelet",) + ("k3s", "k3s-server", "k3s-agent")
GC_HIGH, GC_LOW = 85, 80  # imageGCHighThresholdPercent, imageGCLowThresholdPercent: the kubelet's defaults
K3S_NAMES = NAMES[1:]  # k3s's process (the kubelet runs inside it)


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
    """(pid, comm, argv) of the processes a kubelet may be, in pid order: root's, alive, of this PID and mount
    namespace only. Each is read through a descriptor of its /proc directory, so comm, cmdline and status are
    the one process's even if it ends and its pid is taken by another meanwhile."""
    try:
        pids = sorted(int(p) for p in os.listdir(PROC) if p.isdigit())
    except OSError:
        return
    for pid in pids:
        try:
            fd = os.open(f"{PROC}/{pid}", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            comm = _read_bytes("comm", MAX_COMM, fd)
            name = "" if comm is None else comm.decode("utf-8", "replace").rstrip("\n")
            if name not in NAMES:
                continue
            raw = _read_bytes("cmdline", MAX_FILE, fd)
            status = _read_bytes("status", MAX_STATUS, fd)  # after the command line: it was root's as it was read
        finally:
            os.close(fd)
        if not raw or status is None or not _roots_and_alive(status) or not _same_namespaces(pid):
            continue  # empty: a zombie, or a kernel thread
        yield pid, name, [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _roots_and_alive(status: bytes) -> bool:
    """/proc/PID/status says every uid of the process (real, effective, saved, file system) is 0, and it is not a
    zombie. Not the owner of /proc/PID: that is root for any process that is not dumpable, a setuid program
    started by anyone among them."""
    state = ""
    uids: List[str] = []
    for line in status.decode("utf-8", "replace").splitlines():
        fields = line.split()
        if fields[:1] == ["State:"] and len(fields) > 1:
            state = fields[1]
        elif fields[:1] == ["Uid:"]:
            uids = fields[1:]
    return state not in ("", "Z", "X") and len(uids) == 4 and all(u == "0" for u in uids)


def _same_namespaces(pid: int) -> bool:
    """The process shares this one's PID and mount namespaces. A kubelet in another (a kind node's, a
    container's, a test's) is another node's: its endpoint is a path in a file system this process does not
    see. Where the namespaces cannot be compared (not root: the kubelet's are root's to read), it is taken as
    this node's, as it is on a real node. A process gone since it was listed (its links no longer there) is none."""
    for ns in ("pid", "mnt"):
        try:
            if os.readlink(f"{PROC}/{pid}/ns/{ns}") != os.readlink(f"{PROC}/self/ns/{ns}"):
                return False
        except PermissionError:
            continue
        except OSError:
            return False
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


class _Invalid(Exception):
    """A value of the kubelet's that is no value (it holds a control character): said, and that kubelet (or that
    file) is not followed."""


def _valid(value: str, what: str, source: str) -> str:
    """`value`, unless it holds a control character (a newline: load.sh, which reads the command line a line per
    argument, would read two); raises _Invalid."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise _Invalid(f"{source}: {what} holds a control character: not followed")
    return value


def _from_args(args: List[str], source: str, warnings: List[str]) -> Optional[Kubelet]:
    """The runtime the kubelet's flags name: --container-runtime-endpoint, else --config FILE's key. Raises
    _Invalid."""
    endpoint = _valid(_flag(args, "--container-runtime-endpoint") or "", "--container-runtime-endpoint", source)
    config = _valid(_flag(args, "--config") or "", "--config", source)
    if endpoint:
        return Kubelet(runtime_of(endpoint), endpoint, source, config=config)
    if config:
        value = read_keys(config, ("containerRuntimeEndpoint",), warnings).get("containerRuntimeEndpoint")
        if value:
            return Kubelet(runtime_of(value), _valid(value, "containerRuntimeEndpoint", config), config, config=config)
    if _flag(args, "--container-runtime") == "docker":  # before Kubernetes 1.24: the dockershim
        return Kubelet("docker", "unix:///var/run/dockershim.sock", source, config=config)
    return None


def _of_process(pid: int, comm: str, args: List[str], warnings: List[str]) -> Kubelet:
    """The runtime a kubelet process (or k3s's) names. Raises _Invalid."""
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


def _from_process(warnings: List[str]) -> Optional[Kubelet]:
    """The kubelet process's runtime; None when there is none, or when root's kubelets name different ones
    (none of them can be told to be the node's: a warning names them, and the files decide)."""
    found: List[Tuple[int, Kubelet]] = []
    for pid, comm, args in _processes():
        try:
            found.append((pid, _of_process(pid, comm, args, warnings)))
        except _Invalid as e:
            warnings.append(str(e))
    if len({(k.runtime, k.endpoint) for _, k in found}) > 1:
        named = ", ".join(f"pid {pid}: {k.runtime} at {k.endpoint}" for pid, k in found)
        warnings.append(f"kubelets that name different runtimes run here ({named}): none of them is followed")
        return None
    return found[0][1] if found else None


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
                try:
                    found = _from_args(args, KUBEADM_FLAGS, warnings)
                except _Invalid as e:
                    warnings.append(str(e))
                    continue
                if found is not None:
                    return found
    for path, key in ((KUBELET_CONFIG, "containerRuntimeEndpoint"), (CRICTL_CONFIG, "runtime-endpoint")):
        endpoint = read_keys(path, (key,), warnings).get(key)
        if endpoint:
            try:
                return Kubelet(runtime_of(endpoint), _valid(endpoint, key, path), path)
            except _Invalid as e:
                warnings.append(str(e))
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
    """A configuration file's text; None when absent. A file that does not count (_refused) is a warning. Opened
    without waiting (a FIFO put there after the check is not waited on), and what was opened is checked again;
    read only up to the size it has (a file of the kernel's says 0, and is never read)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        warnings.append(f"cannot read {path}: {e.strerror or e}")
        return None
    why = _refused(st)
    if why:
        warnings.append(f"cannot read {path}: {why}")
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as e:
        warnings.append(f"cannot read {path}: {e.strerror or e}")
        return None
    try:
        now = os.fstat(fd)
        why = _refused(now) or ("it changed as it was opened" if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino)
                                else "")
        data = None if why else _read_bytes(fd, now.st_size)
    finally:
        os.close(fd)
    if why or data is None:
        warnings.append(f"cannot read {path}" + (f": {why}" if why else ""))
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        warnings.append(f"cannot read {path}: not UTF-8 text")
        return None


def _refused(st: os.stat_result) -> str:
    """Why a file of the kubelet's does not count, in load.sh's order and words; "" when it does. Owned by root and
    writable by root alone: another user's file would choose where root's images go."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not by root"
    if st.st_mode & 0o022:
        return f"writable by others than root (mode {stat.filemode(st.st_mode)})"
    if st.st_size > MAX_FILE:
        return f"{st.st_size} bytes is too big for a configuration file"
    if st.st_size == 0:
        return "its size is 0 (an empty file, or one of the kernel's)"
    return ""


def _read_bytes(path: Union[str, int], limit: int, dir_fd: Optional[int] = None) -> Optional[bytes]:
    """At most `limit` bytes of `path` (relative to `dir_fd`), or of the descriptor `path`; None when it cannot
    be read."""
    try:
        fd = path if isinstance(path, int) else os.open(path, os.O_RDONLY | os.O_NONBLOCK, dir_fd=dir_fd)
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
        if not isinstance(path, int):
            os.close(fd)
    return b"".join(chunks)
