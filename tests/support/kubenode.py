"""A simulated Kubernetes node: a process named `kubelet` and the kubelet's files, seen only by the command under test.

imgtool finds a node's kubelet by scanning /proc and reading /var/lib/kubelet and /etc/crictl.yaml. Other
test workers (and other people's imgtool runs) on this machine scan the same /proc, so the fake kubelet must
never be visible to them, and no test may write the host's real paths. Each run here is therefore its own
private PID namespace with its own /proc (`unshare --pid --fork --mount-proc`, which also makes a private
mount namespace), in which /etc and /var/lib are overlays whose writes land in the test's directory; the
files are put in place there, the kubelet started, then the command run. When the command ends, the
namespace's first process ends and the kernel kills every other process in it (the kubelet too).

The kubelet is a copy of /bin/sh named `kubelet` (what /proc/PID/comm shows) running `sleep`, with the real
kubelet's flags on its command line (sh takes them as its positional parameters). A node may run several
(`kubelets`), each as root or as another user (setpriv: an unprivileged user's fake), or as a zombie; they start in
the order given, so the first has the lowest pid. Its files can be given an owner and a mode, be FIFOs, or be
sparse files of any size; everything is in place, and every kubelet started, before the command runs.
"""

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

NAMES = "kubelet|k3s|k3s-server|k3s-agent"  # the processes imgtool takes for a kubelet (kubelet.NAMES)


@dataclass(frozen=True)
class Kubelet:
    """A process of the node named like a kubelet: its flags, its user (0: root's), and whether it is a zombie
    (ended, never reaped: no command line left)."""

    args: Sequence[str]
    uid: int = 0
    name: str = "kubelet"
    zombie: bool = False


class SimulatedNode:
    """`files`: absolute path on the node -> content (e.g. /var/lib/kubelet/config.yaml); `kubelet_args`: the
    flags of a running kubelet (None: no kubelet process); `links`: node path -> what it links to (a socket)."""

    def __init__(self, root: Path, files: Optional[Dict[str, str]] = None, kubelet_args: Optional[Sequence[str]] = None,
                 links: Optional[Dict[str, str]] = None, process_name: str = "kubelet",
                 nested_kubelet_args: Optional[Sequence[str]] = None, kubelets: Sequence[Kubelet] = (),
                 owners: Optional[Dict[str, Tuple[int, int]]] = None, fifos: Sequence[str] = (),
                 sizes: Optional[Dict[str, int]] = None, binds: Optional[Dict[str, str]] = None):
        """`kubelets`: more processes, started after the one of `kubelet_args`; `owners`: node path -> (uid, mode);
        `fifos`: node paths made FIFOs; `sizes`: node path -> the size it is made (sparse, by truncate); `binds`:
        node path in /run -> a host directory shown there read-only (for a user who cannot reach it where it is)."""
        self.root = root
        self.files = dict(files or {})
        self.kubelets = ([] if kubelet_args is None else [Kubelet(list(kubelet_args), name=process_name)]) + list(kubelets)
        self.links = dict(links or {})
        self.owners = dict(owners or {})
        self.fifos = list(fifos)
        self.sizes = dict(sizes or {})
        self.binds = dict(binds or {})
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
        for path, host in sorted(self.binds.items()):
            assert path.startswith("/run/"), path
            lines.append(f"mkdir -p {shlex.quote(path)} && mount --bind {shlex.quote(host)} {shlex.quote(path)} && "
                         f"mount -o remount,bind,ro {shlex.quote(path)}")
        for path in self.fifos:
            assert path.startswith(("/etc/", "/var/", "/run/")), path
            lines.append(f"mkdir -p {shlex.quote(str(Path(path).parent))} && mkfifo {shlex.quote(path)}")
        for path, size in sorted(self.sizes.items()):
            assert path.startswith(("/etc/", "/var/", "/run/")), path
            lines.append(f"mkdir -p {shlex.quote(str(Path(path).parent))} && truncate -s {int(size)} {shlex.quote(path)}")
        for path, (uid, mode) in sorted(self.owners.items()):
            assert path.startswith(("/etc/", "/var/", "/run/")), path
            lines.append(f"chown {int(uid)}:{int(uid)} {shlex.quote(path)} && chmod {mode:o} {shlex.quote(path)}")
        zombies = 0
        for i, k in enumerate(self.kubelets):
            # a copy of sh named as the process is (in /run, which every user of the node may run programs from)
            exe = shlex.quote(f"/run/kubenode/{i}/{k.name}")
            lines.append(f"mkdir -p /run/kubenode/{i} && cp /bin/sh {exe} && chmod 755 /run/kubenode /run/kubenode/{i}")
            args = " ".join(shlex.quote(a) for a in k.args)
            as_user = "" if k.uid == 0 else f"setpriv --reuid={k.uid} --regid={k.uid} --clear-groups "
            if k.zombie:  # it ends at once, and its parent (exec'd into sleep) never reaps it
                zombies += 1
                lines.append(f"{as_user}sh -c '\"$0\" -c \"exit 0\" kubelet \"$@\" & exec sleep 100000' {exe} {args} &")
            else:
                # "$0" of the sh is "kubelet"; the flags are its positional parameters, as they are the kubelet's
                lines.append(f"{as_user}{exe} -c 'sleep 100000; exit 0' kubelet {args} &")
        if self.nested_kubelet_args is not None:
            exe = self.root / "nested" / "kubelet"
            exe.parent.mkdir(exist_ok=True)
            shutil.copy("/bin/sh", exe)
            args = " ".join(shlex.quote(a) for a in self.nested_kubelet_args)
            lines.append(f"unshare --pid --fork --mount-proc {shlex.quote(str(exe))} -c 'sleep 100000; exit 0' "
                         f"kubelet {args} &")
            lines.append("while ! grep -qx kubelet /proc/[0-9]*/comm 2>/dev/null; do sleep 0.05; done")
        if self.kubelets:  # every one of them running as what it is (a zombie: ended), within 10 s
            n = len(self.kubelets) + (self.nested_kubelet_args is not None)
            lines.append(f"tries=0; until [ \"$(cat /proc/[0-9]*/comm 2>/dev/null | grep -cxE '{NAMES}')\" -ge {n} ] && "
                         f"[ \"$(grep -l '^State:[[:space:]]*Z' /proc/[0-9]*/status 2>/dev/null | wc -l)\" -ge {zombies} ]; do "
                         "tries=$((tries + 1)); [ $tries -lt 500 ] || { echo 'kubenode: the kubelets did not start' >&2; "
                         "exit 99; }; sleep 0.02; done")
        lines.append('"$@"')
        return "\n".join(lines) + "\n"

    def run(self, argv: Sequence[str], env: Dict[str, str], cwd: Optional[Path] = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        """`argv` run on this node (in its namespaces), with exactly `env`."""
        # --kill-child: a command that overruns `timeout` ends with its namespace (and so does everything in it)
        cmd: List[str] = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", self.script(), "node",
                          *argv]
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
