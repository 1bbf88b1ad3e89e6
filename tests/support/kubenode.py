"""A simulated Kubernetes node: a process named `kubelet` and the kubelet's files, seen only by the command under test.

imgtool finds a node's kubelet by scanning /proc and reading /var/lib/kubelet and /etc/crictl.yaml. Other
test workers (and other people's imgtool runs) on this machine scan the same /proc, so the fake kubelet must
never be visible to them, and no test may write the host's real paths. Each run here is therefore its own
private PID namespace with its own /proc (`unshare --pid --fork --mount-proc`, which also makes a private
mount namespace), in which /etc and /var/lib are overlays whose writes land in the test's directory; the
files are put in place there, the kubelet started, then the command run. When the command ends, the
namespace's first process ends and the kernel kills every other process in it (the kubelet too).

The kubelet is a copy of /bin/sh named `kubelet` (what /proc/PID/comm shows) running `sleep`, with the real
kubelet's flags on its command line (sh takes them as its positional parameters).
"""

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence


class SimulatedNode:
    """`files`: absolute path on the node -> content (e.g. /var/lib/kubelet/config.yaml); `kubelet_args`: the
    flags of a running kubelet (None: no kubelet process); `links`: node path -> what it links to (a socket)."""

    def __init__(self, root: Path, files: Optional[Dict[str, str]] = None, kubelet_args: Optional[Sequence[str]] = None,
                 links: Optional[Dict[str, str]] = None, process_name: str = "kubelet",
                 nested_kubelet_args: Optional[Sequence[str]] = None):
        self.root = root
        self.files = dict(files or {})
        self.kubelet_args = None if kubelet_args is None else list(kubelet_args)
        self.links = dict(links or {})
        self.process_name = process_name
        # a kubelet in a PID and mount namespace nested in this one (as a kind node's): visible in this /proc
        self.nested_kubelet_args = None if nested_kubelet_args is None else list(nested_kubelet_args)
        root.mkdir(parents=True, exist_ok=True)

    def script(self) -> str:
        """The shell run as the namespace's first process: the overlays, the files, the kubelet, then "$@"."""
        r = shlex.quote(str(self.root))
        lines = ["set -eu"]
        for d in ("etc", "var", "run"):
            lines.append(f"mkdir -p {r}/ovl/{d}/up {r}/ovl/{d}/work")
            lines.append(f"mount -t overlay overlay -o lowerdir=/{d},upperdir={r}/ovl/{d}/up,workdir={r}/ovl/{d}/work /{d}")
        staged = self.root / "staged"
        staged.mkdir(exist_ok=True)
        for i, (path, content) in enumerate(sorted(self.files.items())):
            assert path.startswith(("/etc/", "/var/", "/run/")), path  # only inside the overlays
            (staged / str(i)).write_text(content)
            lines.append(f"mkdir -p {shlex.quote(str(Path(path).parent))}")
            lines.append(f"cp {shlex.quote(str(staged / str(i)))} {shlex.quote(path)}")
        for path, target in sorted(self.links.items()):
            assert path.startswith(("/etc/", "/var/", "/run/")), path
            lines.append(f"mkdir -p {shlex.quote(str(Path(path).parent))}")
            lines.append(f"ln -s {shlex.quote(target)} {shlex.quote(path)}")
        if self.kubelet_args is not None:
            exe = self.root / self.process_name
            shutil.copy("/bin/sh", exe)
            args = " ".join(shlex.quote(a) for a in self.kubelet_args)
            # "$0" of the sh is "kubelet"; the flags are its positional parameters, as they are the kubelet's
            lines.append(f"{shlex.quote(str(exe))} -c 'sleep 100000; exit 0' kubelet {args} &")
        if self.nested_kubelet_args is not None:
            exe = self.root / "nested" / "kubelet"
            exe.parent.mkdir(exist_ok=True)
            shutil.copy("/bin/sh", exe)
            args = " ".join(shlex.quote(a) for a in self.nested_kubelet_args)
            lines.append(f"unshare --pid --fork --mount-proc {shlex.quote(str(exe))} -c 'sleep 100000; exit 0' "
                         f"kubelet {args} &")
            lines.append("while ! grep -qx kubelet /proc/[0-9]*/comm 2>/dev/null; do sleep 0.05; done")
        lines.append('"$@"')
        return "\n".join(lines) + "\n"

    def run(self, argv: Sequence[str], env: Dict[str, str], cwd: Optional[Path] = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        """`argv` run on this node (in its namespaces), with exactly `env`."""
        cmd: List[str] = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", self.script(), "node", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def kubelet_config(endpoint: Optional[str] = None, **extra: object) -> str:
    """A KubeletConfiguration as kubeadm writes it (the keys imgtool reads among others it does not)."""
    lines = ["apiVersion: kubelet.config.k8s.io/v1beta1", "kind: KubeletConfiguration",
             "authentication:", "  anonymous:", "    enabled: false", "cgroupDriver: systemd"]
    if endpoint is not None:
        lines.append(f"containerRuntimeEndpoint: {endpoint}")
    for key, value in extra.items():
        lines.append(f"{key}: {value}")
    lines += ["evictionHard:", "  imagefs.available: 15%", "staticPodPath: /etc/kubernetes/manifests"]
    return "\n".join(lines) + "\n"
