"""On a Kubernetes node the image lands where the kubelet looks (issue 36, items 1-3), with the real parts.

A simulated node (tests/support/kubenode.py) is a process named `kubelet` with the real kubelet's flags,
and the kubelet's files, in a PID and mount namespace of its own, so no other imgtool on this machine
ever sees them; the kubelet points at a private containerd (1.6 or 1.7, CRI plugin on) while a test
dockerd answers too. The CRI's ImageStatus (what the kubelet asks) must report the image.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import pytest

from imgtool.delta import chain_ids
from imgtool.model import Digest
from tests.support.bundles import BlobDir, write
from tests.support.cri import ImageService
from tests.support.daemon import DockerCLI
from tests.support.images import host_arch
from tests.support.kubenode import SimulatedNode, kubelet_config
from tests.support.runtimes import containerd_path

REPO = "quay.io/ascend/vllm-ascend"
FIND = ("import json, sys; from imgtool.runtimes import kubelet; w = []; k = kubelet.find(w); "
        "json.dump(None if k is None else dict(runtime=k.runtime, endpoint=k.endpoint, source=k.source, "
        "gc_high=k.gc_high, gc_low=k.gc_low, gc_source=k.gc_source, warnings=w), sys.stdout)")


def clean_env(**extra: str) -> dict:
    """This process's environment without any runtime's variables (imgtool then finds its runtime itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "CONTAINERD_", "CONTAINERS_"))}
    env.update(extra)
    return env


def find_on(node: SimulatedNode):
    r = node.run([sys.executable, "-c", FIND], env=clean_env())
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# --- finding the kubelet's runtime (no services) ------------------------------------------------------

SOCK = "unix:///run/containerd/containerd.sock"


CASES = ["flag", "config-flag", "flag-beats-config", "kubeadm", "config.yaml", "crictl", "k3s", "microk8s", "cri-dockerd",
         "default", "none"]


def node_of(case: str, tmp_path: Path):
    """A simulated node of each kind (CASES) and what must be found there: {runtime, endpoint, source} with the
    kubelet's pid as N, or None (no kubelet). tests/test_load_sh.py holds load.sh to the same."""
    conf = str(tmp_path / "config.yaml")
    files, args, links, name = {}, None, {}, "kubelet"
    expect = {"runtime": "containerd", "endpoint": SOCK}
    if case == "flag":
        args = ["--container-runtime-endpoint=unix:///x/containerd.sock", "--v=2"]
        expect.update(endpoint="unix:///x/containerd.sock", source="the kubelet's command line, pid N")
    elif case == "config-flag":
        (tmp_path / "config.yaml").write_text(kubelet_config("unix:///y/containerd.sock"))
        args = ["--config", conf, "--node-ip=10.0.0.1"]
        expect.update(endpoint="unix:///y/containerd.sock", source=conf)
    elif case == "flag-beats-config":  # as the kubelet takes them: its flags over its configuration file
        (tmp_path / "config.yaml").write_text(kubelet_config("unix:///y/containerd.sock"))
        args = [f"--config={conf}", "--container-runtime-endpoint", "unix:///x/containerd.sock"]
        expect.update(endpoint="unix:///x/containerd.sock", source="the kubelet's command line, pid N")
    elif case == "kubeadm":
        files["/var/lib/kubelet/kubeadm-flags.env"] = (
            'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock '
            '--pod-infra-container-image=registry.k8s.io/pause:3.9"\n')
        expect.update(endpoint="unix:///var/run/containerd/containerd.sock", source="/var/lib/kubelet/kubeadm-flags.env")
    elif case == "config.yaml":
        files["/var/lib/kubelet/config.yaml"] = kubelet_config('"unix:///z/containerd.sock"  # kubeadm 1.27+')
        expect.update(endpoint="unix:///z/containerd.sock", source="/var/lib/kubelet/config.yaml")
    elif case == "crictl":
        files["/etc/crictl.yaml"] = "runtime-endpoint: unix:///c/containerd.sock\nimage-endpoint: unix:///c/x.sock\n"
        expect.update(endpoint="unix:///c/containerd.sock", source="/etc/crictl.yaml")
    elif case == "k3s":  # the kubelet runs inside k3s, on k3s's own containerd
        args, name = ["server", "--write-kubeconfig-mode=644"], "k3s-server"
        expect.update(endpoint="unix:///run/k3s/containerd/containerd.sock", source="k3s's command line, pid N")
    elif case == "microk8s":  # a socket there (a link to a file here: it exists, which is all that is asked)
        (tmp_path / "sock").write_text("")
        links["/var/snap/microk8s/common/run/containerd.sock"] = str(tmp_path / "sock")
        expect.update(endpoint="unix:///var/snap/microk8s/common/run/containerd.sock",
                      source="MicroK8s's containerd socket, /var/snap/microk8s/common/run/containerd.sock")
    elif case == "cri-dockerd":
        args = ["--container-runtime-endpoint=unix:///run/cri-dockerd.sock"]
        expect.update(runtime="docker", endpoint="unix:///run/cri-dockerd.sock", source="the kubelet's command line, pid N")
    elif case == "default":  # a kubelet with no endpoint anywhere: its configuration's default
        args = ["--v=2"]
        expect.update(source="the kubelet's command line, pid N: no endpoint given, the kubelet's default")
    node = SimulatedNode(tmp_path / "node", files=files, kubelet_args=args, links=links, process_name=name)
    return node, (None if case == "none" else expect)


def pid_as_n(source: str) -> str:
    """The kubelet's pid in its namespace (2, 3, ... whatever the namespace gave it) as N."""
    if "pid " not in source:
        return source
    pid = source.split("pid ")[1].split(":")[0].split(")")[0]
    assert pid.isdigit(), source
    return source.replace(f"pid {pid}", "pid N")


@pytest.mark.parametrize("case", CASES)
def test_the_kubelets_runtime_is_read_where_each_kind_of_node_keeps_it(case, tmp_path):
    node, expect = node_of(case, tmp_path)
    found = find_on(node)
    if expect is None:
        assert found is None
        return
    assert found["warnings"] == []
    found["source"] = pid_as_n(found["source"])
    assert {k: found[k] for k in expect} == expect


def test_a_kubelet_in_another_pid_and_mount_namespace_is_another_nodes(tmp_path):
    """A kubelet this /proc shows but that runs in a namespace of its own (a kind node, another test's simulated
    node): its endpoint is a path in another file system, so it is not this node's kubelet."""
    node = SimulatedNode(tmp_path / "node", nested_kubelet_args=["--container-runtime-endpoint=unix:///n.sock"])
    r = node.run(["sh", "-c", "cat /proc/[0-9]*/comm"], env=clean_env())
    assert "kubelet" in r.stdout.split()  # it is there to be seen
    assert find_on(node) is None


def test_k3s_and_rke2s_socket_marks_a_node_without_a_kubelet_process(tmp_path):
    node = SimulatedNode(tmp_path / "node", links={"/run/k3s/containerd/containerd.sock": "/nonexistent-but-a-link"},
                         files={"/run/k3s/containerd/.keep": ""})
    # a dangling link is no socket: nothing there
    assert find_on(node) is None
    target = tmp_path / "sock"
    target.write_text("")
    node = SimulatedNode(tmp_path / "node2", links={"/run/k3s/containerd/containerd.sock": str(target)})
    found = find_on(node)
    assert (found["runtime"], found["endpoint"], found["source"]) == (
        "containerd", "unix:///run/k3s/containerd/containerd.sock",
        "k3s/RKE2's containerd socket, /run/k3s/containerd/containerd.sock")


def test_a_kubelet_file_that_cannot_be_read_is_a_warning_never_a_crash(tmp_path):
    """A malformed config.yaml (a list where the endpoint goes), a binary kubeadm flags file and an oversized
    crictl.yaml: each is named in a warning, and the next source still answers (here: none does)."""
    node = SimulatedNode(tmp_path / "node", files={
        "/var/lib/kubelet/config.yaml": "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: [a, b]\n"
                                        "imageGCHighThresholdPercent: 90\n",
        "/etc/crictl.yaml": "runtime-endpoint: unix:///c.sock\n" + "#" * (1024 * 1024),
    })
    found = find_on(node)
    assert found is None  # nothing readable names an endpoint
    r = node.run([sys.executable, "-c", "from imgtool.runtimes import kubelet; w = []; "
                  "print(kubelet.read_keys('/var/lib/kubelet/config.yaml', ('containerRuntimeEndpoint', "
                  "'imageGCHighThresholdPercent'), w)); print(w); w = []; "
                  "print(kubelet.read_keys('/etc/crictl.yaml', ('runtime-endpoint',), w)); print(w)"], env=clean_env())
    assert r.returncode == 0, r.stderr
    size = len("runtime-endpoint: unix:///c.sock\n") + 1024 * 1024
    assert r.stdout.splitlines() == [
        "{'imageGCHighThresholdPercent': '90'}",
        "['cannot read /var/lib/kubelet/config.yaml:2: containerRuntimeEndpoint is not a plain value']",
        "{}",
        f"['cannot read /etc/crictl.yaml: {size} bytes is too big for a configuration file']"]


# --- only root steers root's load (issue 46) -----------------------------------------------------------------

ATTACKER = 65534  # nobody: an unprivileged user of the node
EVIL = "unix:///tmp/evil.sock"
FIND_ALL = ("import json, sys; from imgtool.runtimes import kubelet; w = []; k = kubelet.find(w); "
            "json.dump(dict(kubelet=None if k is None else dict(runtime=k.runtime, endpoint=k.endpoint, "
            "source=k.source), warnings=w), sys.stdout)")
HOSTILE = ["attacker", "attacker-config", "attacker-older", "different", "same", "zombie", "config-not-roots",
           "config-writable", "config-group-writable", "config-kmsg", "config-fifo", "config-huge", "config-at-cap",
           "config-over-cap", "newline", "newline-config"]
QUICK = 60  # seconds: a node run here that takes longer is hanging (the old load.sh never ended on /proc/kmsg)


def hostile_node_of(case: str, tmp_path: Path):
    """A node where an unprivileged user runs a kubelet of their own, or root's kubelet files are not what they should
    be (HOSTILE), and what must be found there: (node, {runtime, endpoint, source} or None, the warnings), pids as N.
    tests/test_load_sh.py holds load.sh to the same."""
    from imgtool.runtimes.kubelet import MAX_FILE
    from tests.support.kubenode import Kubelet

    x = "unix:///x/containerd.sock"
    conf = "/etc/kubernetes/kubelet.yaml"
    cmdline = "the kubelet's command line, pid N"
    default = dict(runtime="containerd", endpoint=SOCK, source=f"{cmdline}: no endpoint given, the kubelet's default")
    kubelets, files, owners, fifos, sizes = [], {}, {}, [], {}
    expect, warnings = None, []
    if case == "attacker":  # alone: no kubelet here
        kubelets = [Kubelet([f"--container-runtime-endpoint={EVIL}"], uid=ATTACKER)]
    elif case == "attacker-config":  # a configuration of their own: never read
        files[conf], owners[conf] = kubelet_config(EVIL), (ATTACKER, 0o644)
        kubelets = [Kubelet([f"--config={conf}"], uid=ATTACKER)]
    elif case == "attacker-older":  # older (a lower pid) than root's kubelet, which systemd restarted
        kubelets = [Kubelet([f"--container-runtime-endpoint={EVIL}"], uid=ATTACKER),
                    Kubelet([f"--container-runtime-endpoint={x}"])]
        expect = dict(runtime="containerd", endpoint=x, source=cmdline)
    elif case == "different":  # root's, and they disagree: none of them, and the files decide
        kubelets = [Kubelet([f"--container-runtime-endpoint={x}"]), Kubelet(["--container-runtime-endpoint=unix:///y.sock"])]
        files["/var/lib/kubelet/config.yaml"] = kubelet_config("unix:///z/containerd.sock")
        expect = dict(runtime="containerd", endpoint="unix:///z/containerd.sock", source="/var/lib/kubelet/config.yaml")
        warnings = [f"kubelets that name different runtimes run here (pid N: containerd at {x}, pid N: containerd at "
                    "unix:///y.sock): none of them is followed"]
    elif case == "same":  # root's, and they agree (one by its flag, one by its configuration)
        files[conf] = kubelet_config(x)
        kubelets = [Kubelet([f"--container-runtime-endpoint={x}"]), Kubelet([f"--config={conf}"])]
        expect = dict(runtime="containerd", endpoint=x, source=cmdline)
    elif case == "zombie":
        kubelets = [Kubelet([f"--container-runtime-endpoint={x}"], zombie=True)]
    elif case.startswith("config-") and case not in ("config-huge", "config-at-cap", "config-over-cap"):
        path, why = conf, ""
        files[conf] = kubelet_config(x)
        if case == "config-not-roots":
            owners[conf], why = (ATTACKER, 0o644), f"owned by uid {ATTACKER}, not by root"
        elif case == "config-writable":
            owners[conf], why = (0, 0o666), "writable by others than root (mode -rw-rw-rw-)"
        elif case == "config-group-writable":
            owners[conf], why = (0, 0o664), "writable by others than root (mode -rw-rw-r--)"
        elif case == "config-kmsg":  # the kernel's log: a regular file of size 0, and a read of it waits for the next
            path, why = "/proc/kmsg", "its size is 0 (an empty file, or one of the kernel's)"
        elif case == "config-fifo":
            path, why = "/etc/kubernetes/fifo", "not a regular file"
            fifos = [path]
        kubelets = [Kubelet([f"--config={path}"])]
        expect, warnings = default, [f"cannot read {path}: {why}"]
    elif case == "config-huge":
        sizes["/var/lib/kubelet/config.yaml"] = 1 << 30
        warnings = [f"cannot read /var/lib/kubelet/config.yaml: {1 << 30} bytes is too big for a configuration file"]
    elif case in ("config-at-cap", "config-over-cap"):  # kubelet.MAX_FILE bytes count, one more does not
        text = kubelet_config("unix:///z/containerd.sock")
        pad = MAX_FILE + (case == "config-over-cap") - len(text)
        text += ("#" * 999 + "\n") * (pad // 1000) + "#" * (pad % 1000 - 1) + "\n"
        files["/var/lib/kubelet/config.yaml"] = text
        if case == "config-at-cap":
            expect = dict(runtime="containerd", endpoint="unix:///z/containerd.sock", source="/var/lib/kubelet/config.yaml")
        else:
            warnings = [f"cannot read /var/lib/kubelet/config.yaml: {MAX_FILE + 1} bytes is too big for a configuration file"]
    elif case == "newline":  # load.sh read two arguments here, and took the second
        kubelets = [Kubelet([f"--container-runtime-endpoint={x}\n--container-runtime-endpoint={EVIL}"])]
        warnings = [f"{cmdline}: --container-runtime-endpoint holds a control character: not followed"]
    elif case == "newline-config":
        kubelets = [Kubelet([f"--config={conf}\n--container-runtime-endpoint={EVIL}"])]
        warnings = [f"{cmdline}: --config holds a control character: not followed"]
    node = SimulatedNode(tmp_path / "node", files=files, kubelets=kubelets, owners=owners, fifos=fifos, sizes=sizes)
    return node, expect, warnings


def pids_as_n(text: str) -> str:
    """Every pid in `text` as N."""
    import re

    return re.sub(r"\bpid [0-9]+\b", "pid N", text)


@pytest.mark.parametrize("case", HOSTILE)
def test_only_roots_living_kubelet_and_roots_own_files_say_where_the_images_go(case, tmp_path):
    """Issue 46 items 1 and 2: an unprivileged user's process named kubelet (alone, with a configuration of its own,
    or older than root's kubelet) was followed, the lowest pid first; a zombie counted as a kubelet with no endpoint;
    a configuration file anyone could write, or /proc/kmsg, a FIFO, a 1 GiB file, was read (load.sh waited on
    /proc/kmsg forever). Each is passed over, said, within a minute."""
    node, expect, warnings = hostile_node_of(case, tmp_path)
    started = time.monotonic()
    r = node.run([sys.executable, "-c", FIND_ALL], env=clean_env(), timeout=QUICK)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    if found["kubelet"] is not None:
        found["kubelet"]["source"] = pids_as_n(found["kubelet"]["source"])
    assert (found["kubelet"], [pids_as_n(w) for w in found["warnings"]]) == (expect, warnings)
    assert time.monotonic() - started < 20


def test_imgtool_run_by_a_user_takes_roots_kubelet_and_not_anothers(tmp_path):
    """Run by an unprivileged user, imgtool cannot read the kubelets' namespaces (root's to read) and takes them as
    this node's, as on a real node; it still reads whose each is, and follows root's only."""
    from tests.support.kubenode import Kubelet

    python = Path(os.path.realpath(sys.executable))
    node = SimulatedNode(tmp_path / "node", kubelets=[
        Kubelet([f"--container-runtime-endpoint={EVIL}"], uid=ATTACKER + 1),
        Kubelet(["--container-runtime-endpoint=unix:///x/containerd.sock"])],
        binds={"/run/py": sys.base_prefix, "/run/src": str(Path(__file__).resolve().parents[1])})
    r = node.run(["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups",
                  f"/run/py/bin/{python.name}", "-I", "-c", "import sys; sys.path.insert(0, '/run/src'); " + FIND_ALL],
                 env=clean_env(), timeout=QUICK)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert (found["kubelet"]["endpoint"], pids_as_n(found["kubelet"]["source"]), found["warnings"]) == (
        "unix:///x/containerd.sock", "the kubelet's command line, pid N", [])


def test_run_and_run_flags_follow_the_kubelet_as_load_does(tmp_path):
    """Issue 37: run-flags defaulted to Docker wherever it ran. On a node whose kubelet reads containerd it now
    writes the Pod (containerd has no `run` of its own) and `run` says why it cannot start one, before asking
    any runtime; on a cri-dockerd node it renders `docker run`, though Docker does not answer and Podman would."""
    unix = "unix:///run/imgtool-test-containerd.sock"
    containerd = SimulatedNode(tmp_path / "node", kubelet_args=[f"--container-runtime-endpoint={unix}"])
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(HOME=str(home), DOCKER_HOST="unix:///nonexistent/docker.sock")
    r = containerd.run([sys.executable, "-m", "imgtool", "run-flags", "a2", "--image", "v1"], env=env)
    assert r.returncode == 0, r.stderr
    assert "kind: Pod\n" in r.stdout and "image: quay.io/ascend/vllm-ascend:v1\n" in r.stdout
    run = containerd.run([sys.executable, "-m", "imgtool", "run", "a2", "v1", "--allow-missing-devices"], env=env)
    assert run.returncode == 2
    assert run.stderr.splitlines()[-2].startswith("error: imgtool run starts containers through Docker or Podman; "
                                                  "containerd has no `run` of its own")
    dockerd = SimulatedNode(tmp_path / "node2", kubelet_args=["--container-runtime-endpoint=unix:///run/cri-dockerd.sock"])
    r = dockerd.run([sys.executable, "-m", "imgtool", "run-flags", "a2", "--image", "v1", "--one-line"], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("docker run --rm -it --name vllm-ascend ")


def test_the_image_gc_thresholds_come_from_the_kubelets_configuration(tmp_path):
    conf = tmp_path / "config.yaml"
    conf.write_text(kubelet_config("unix:///x/containerd.sock", imageGCHighThresholdPercent=90,
                                   imageGCLowThresholdPercent='"70"'))
    found = find_on(SimulatedNode(tmp_path / "node", kubelet_args=[f"--config={conf}"]))
    assert (found["gc_high"], found["gc_low"], found["gc_source"]) == (90, 70, str(conf))
    found = find_on(SimulatedNode(tmp_path / "node2", files={"/etc/crictl.yaml": "runtime-endpoint: unix:///c.sock\n"}))
    assert (found["gc_high"], found["gc_low"], found["gc_source"]) == (85, 80, "")  # the kubelet's defaults


# --- loading on a node (services) ---------------------------------------------------------------------


@pytest.fixture
def bundle(factory, tmp_path):
    image = factory.image(host_arch(), layers=2)
    store = BlobDir(tmp_path / "blobs")
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:v1")], store, chunk_size=300 * 1024)
    return out, image


def ctr(socket: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "--address", socket, "-n", "k8s.io", *args], capture_output=True, text=True,
                          timeout=300, check=check)


def remove_from(socket: str, image, repo: str = REPO) -> None:
    names = [n for n in ctr(socket, "images", "ls", "-q").stdout.split()
             if n.startswith(repo) or n == image.config_digest]
    if names:
        ctr(socket, "images", "rm", "--sync", *names, check=False)


def kube_node(tmp_path: Path, socket: str, **config) -> SimulatedNode:
    """A kubelet on the test's containerd, as kubeadm starts it: --config and --container-runtime-endpoint."""
    conf = tmp_path / "config.yaml"
    conf.write_text(kubelet_config(f"unix://{socket}", **config))
    return SimulatedNode(tmp_path / "node", kubelet_args=[f"--config={conf}", f"--container-runtime-endpoint=unix://{socket}"])


def pinned_on(version: str) -> bool:
    """containerd's CRI reports an image labelled io.cri-containerd.pinned=pinned as pinned from 1.7 (measured)."""
    return version != "1.6"


@pytest.mark.parametrize("version", ["1.6", "1.7", "2.1"])
def test_on_a_mixed_node_the_image_lands_in_the_kubelets_containerd_and_docker_gets_nothing(version, services, bundle,
                                                                                             tmp_path):
    out, image = bundle
    socket = services.containerd(version)
    docker = DockerCLI(services.docker_host)
    before = docker.image_ids()
    node = kube_node(tmp_path, socket)
    cri = ImageService(socket)
    try:
        path = containerd_path(socket)  # the containerd's own ctr (2.x: the transfer service), as on its node
        r = node.run([sys.executable, "-m", "imgtool", "load", str(out)],
                     env=clean_env(DOCKER_HOST=services.docker_host, PATH=path))
        assert r.returncode == 0, r.stderr
        assert f"runtime: containerd at unix://{socket}, namespace k8s.io (the kubelet's, from the kubelet's " \
               "command line, pid " in r.stderr
        assert r.stdout.splitlines()[-1].endswith(", namespace k8s.io)")
        assert docker.image_ids() == before  # Docker answered, and got nothing
        status = cri.status(f"{REPO}:v1")
        assert status is not None and status.id == image.config_digest
        assert status.pinned is pinned_on(version)
        rows = [line.split() for line in ctr(socket, "images", "ls").stdout.splitlines()[1:]]
        assert [row[-1] for row in rows if row[0] == f"{REPO}:v1"] == [
            "io.cri-containerd.image=managed,io.cri-containerd.pinned=pinned"]
        top = str(chain_ids(tuple(Digest.parse(d) for d in image.diff_ids))[-1])
        assert top in ctr(socket, "snapshots", "ls").stdout  # unpacked
        inv = node.run([sys.executable, "-m", "imgtool", "inventory"], env=clean_env(DOCKER_HOST=services.docker_host, PATH=path))
        assert inv.returncode == 0, inv.stderr
        mine = [im for im in json.loads(inv.stdout)["images"] if f"{REPO}:v1" in im["tags"]]
        assert [im["pinned"] for im in mine] == [True]
    finally:
        cri.close()
        remove_from(socket, image)


def node_of_2026(tmp_path: Path, socket: str, containerd: str, kubelet_running: bool = True) -> SimulatedNode:
    """A node as kubeadm sets up Kubernetes 1.35/1.36, from its files: the kubelet started with --config alone (the
    endpoint flags are deprecated), its KubeletConfiguration naming containerRuntimeEndpoint and imageServiceEndpoint,
    containerd's config at `version = 3` (2.x; 1.7 reads version 2), crictl.yaml naming both endpoints."""
    endpoint = f"unix://{socket}"
    v3 = containerd.startswith("2.")
    cri = '"io.containerd.cri.v1.images"' if v3 else '"io.containerd.grpc.v1.cri"'
    files = {
        "/var/lib/kubelet/config.yaml": kubelet_config(endpoint, imageServiceEndpoint=endpoint,
                                                       imageGCHighThresholdPercent=85, imageGCLowThresholdPercent=80),
        "/var/lib/kubelet/kubeadm-flags.env": 'KUBELET_KUBEADM_ARGS="--node-ip=10.0.0.1"\n',
        "/etc/containerd/config.toml": (f"version = {3 if v3 else 2}\n[grpc]\n  address = \"{socket}\"\n"
                                        f"[plugins.{cri}.registry]\n  config_path = \"/etc/containerd/certs.d\"\n"),
        "/etc/crictl.yaml": f"runtime-endpoint: {endpoint}\nimage-endpoint: {endpoint}\ntimeout: 10\n",
    }
    args = (["--config=/var/lib/kubelet/config.yaml", "--kubeconfig=/etc/kubernetes/kubelet.conf"]
            if kubelet_running else None)
    return SimulatedNode(tmp_path / "node", files=files, kubelet_args=args)


@pytest.mark.parametrize("kubernetes,version", [("1.35", "1.7"), ("1.35", "2.1"), ("1.36", "2.1")])
def test_a_1_35_or_1_36_nodes_files_name_its_containerd_and_the_image_lands_there_pinned(kubernetes, version, services,
                                                                                         bundle, tmp_path):
    """Issue 49: a Kubernetes 1.35 node (the last on containerd 1.x) and a 1.36 one (containerd 2.x: 2.1 stands in for
    the 2.2 it needs, the newest Debian ships) found from its files alone. imgtool names the kubelet's containerd
    from the KubeletConfiguration (the kubelet running with --config only, and stopped: its file still says), loads
    into k8s.io with the containerd's own ctr, and the CRI reports the image pinned; doctor names the runtime."""
    out, image = bundle
    socket = services.containerd(version)
    env = clean_env(PATH=containerd_path(socket))  # no Docker: the node's containerd and its own ctr
    stopped = find_on(node_of_2026(tmp_path / "stopped", socket, version, kubelet_running=False))
    assert stopped == {"runtime": "containerd", "endpoint": f"unix://{socket}", "source": "/var/lib/kubelet/config.yaml",
                       "gc_high": 85, "gc_low": 80, "gc_source": "/var/lib/kubelet/config.yaml", "warnings": []}
    node = node_of_2026(tmp_path, socket, version)
    found = find_on(node)
    assert (found["runtime"], found["endpoint"], found["source"], found["warnings"]) == (
        "containerd", f"unix://{socket}", "/var/lib/kubelet/config.yaml", [])
    cri = ImageService(socket)
    try:
        r = node.run([sys.executable, "-m", "imgtool", "load", str(out)], env=env)
        assert r.returncode == 0, r.stderr
        assert f"runtime: containerd at unix://{socket}, namespace k8s.io (the kubelet's, from " \
               "/var/lib/kubelet/config.yaml)" in r.stderr
        status = cri.status(f"{REPO}:v1")
        assert status is not None and status.id == image.config_digest and status.pinned is True
        top = str(chain_ids(tuple(Digest.parse(d) for d in image.diff_ids))[-1])
        assert top in ctr(socket, "snapshots", "ls").stdout  # unpacked
        doctor = node.run([sys.executable, "-m", "imgtool", "doctor"], env=env)
        assert any(line.startswith(f"OK    runtime      imgtool load uses containerd {version}.") and
                   line.endswith("namespace k8s.io (--runtime auto: the kubelet's, from /var/lib/kubelet/config.yaml)")
                   for line in doctor.stdout.splitlines()), doctor.stdout
    finally:
        cri.close()
        remove_from(socket, image)


def test_no_pin_leaves_the_image_unpinned(services, bundle, tmp_path):
    out, image = bundle
    socket = services.containerd("1.7")
    node = kube_node(tmp_path, socket)
    cri = ImageService(socket)
    try:
        r = node.run([sys.executable, "-m", "imgtool", "load", str(out), "--no-pin"], env=clean_env())
        assert r.returncode == 0, r.stderr
        status = cri.status(f"{REPO}:v1")
        assert status is not None and status.pinned is False
        rows = [line.split() for line in ctr(socket, "images", "ls").stdout.splitlines()[1:]]
        assert [row[-1] for row in rows if row[0] == f"{REPO}:v1"] == ["io.cri-containerd.image=managed"]
    finally:
        cri.close()
        remove_from(socket, image)


def test_the_pyz_on_kylins_python_loads_into_the_kubelets_containerd(services, factory, mirrored, tmp_path):
    """`python3 imgtool.pyz load .` (Python 3.7, nothing installed) on the mixed node: k8s.io, not Docker."""
    from tests.support.bundles import fetch_from_registry
    from tests.test_selfbundle import old_python

    python = old_python("3.7")
    out, image, ref, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    socket = services.containerd("1.7")
    docker = DockerCLI(services.docker_host)
    before = docker.image_ids()
    node = kube_node(tmp_path, socket)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(out), "LANG": "C.UTF-8",
           "IMGTOOL_CACHE": "/nonexistent/imgtool-cache", "DOCKER_HOST": services.docker_host}
    cri = ImageService(socket)
    try:
        r = node.run([*python, "imgtool.pyz", "load", "."], env=env, cwd=out)
        assert r.returncode == 0, r.stderr
        assert f"runtime: containerd at unix://{socket}, namespace k8s.io (the kubelet's" in r.stderr
        assert docker.image_ids() == before
        status = cri.status(ref)
        assert status is not None and status.id == image.config_digest and status.pinned
    finally:
        cri.close()
        remove_from(socket, image, ref.rsplit(":", 1)[0])


def test_a_kubelet_on_cri_dockerd_means_docker(services, bundle, tmp_path, docker_cleanup):
    out, image = bundle
    socket = services.containerd("1.7")
    node = SimulatedNode(tmp_path / "node", kubelet_args=["--container-runtime-endpoint=unix:///run/cri-dockerd.sock"])
    docker_cleanup.image(f"{REPO}:v1")
    before = ctr(socket, "images", "ls", "-q").stdout.split()
    r = node.run([sys.executable, "-m", "imgtool", "load", str(out)],
                 env=clean_env(DOCKER_HOST=services.docker_host, CONTAINERD_ADDRESS=socket))
    assert r.returncode == 0, r.stderr
    assert "runtime: Docker (the kubelet's, through cri-dockerd at unix:///run/cri-dockerd.sock, from the kubelet's " \
           "command line, pid " in r.stderr
    assert DockerCLI(services.docker_host).holds(f"{REPO}:v1", image)
    assert ctr(socket, "images", "ls", "-q").stdout.split() == before  # containerd answered, and got nothing


def test_without_a_kubelet_auto_is_what_it_was(services, bundle, tmp_path, docker_cleanup):
    """No kubelet process, no kubelet file: Docker first, as before; no runtime line."""
    out, image = bundle
    socket = services.containerd("1.7")
    node = SimulatedNode(tmp_path / "node")
    docker_cleanup.image(f"{REPO}:v1")
    before = ctr(socket, "images", "ls", "-q").stdout.split()
    r = node.run([sys.executable, "-m", "imgtool", "load", str(out)],
                 env=clean_env(DOCKER_HOST=services.docker_host, CONTAINERD_ADDRESS=socket))
    assert r.returncode == 0, r.stderr
    assert not [line for line in r.stderr.splitlines() if line.startswith("runtime:") or "the kubelet" in line]
    assert DockerCLI(services.docker_host).holds(f"{REPO}:v1", image)
    assert ctr(socket, "images", "ls", "-q").stdout.split() == before


def test_doctor_names_the_kubelets_runtime_and_warns_when_images_would_go_elsewhere(services, bundle, tmp_path,
                                                                                  docker_cleanup):
    out, _ = bundle
    docker_cleanup.image(f"{REPO}:v1")  # the load --runtime docker below goes there, warned
    socket = services.containerd("1.7")
    node = kube_node(tmp_path, socket, imageGCHighThresholdPercent=90)
    conf = tmp_path / "config.yaml"
    env = clean_env(DOCKER_HOST=services.docker_host)
    r = node.run([sys.executable, "-m", "imgtool", "doctor"], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    source = next(line for line in lines if line.startswith("OK    kubelet ")).split("from ")[1].rstrip(")")
    assert source.startswith("the kubelet's command line, pid ")
    assert f"OK    kubelet      the kubelet uses containerd at unix://{socket} (the kubelet's, from {source})" in lines
    assert any(line.startswith("OK    runtime      imgtool load uses containerd 1.7.") and
               line.endswith(f"namespace k8s.io (--runtime auto: the kubelet's, from {source})") for line in lines)
    assert any(line.startswith("OK    docker       Docker 26.1") for line in lines)  # Docker is here, and not used
    gc = [line for line in lines if line.startswith(("OK    image-gc", "WARN  image-gc"))]
    assert len(gc) == 1 and f"the kubelet's image GC removes unused images above 90% (imageGCHighThresholdPercent, " \
                            f"{conf}) down to 80%" in gc[0], lines

    r = node.run([sys.executable, "-m", "imgtool", "doctor", "--runtime", "docker"], env=env)
    assert f"WARN  kubelet      the kubelet reads images from containerd at unix://{socket} (from {source}), but " \
           "--runtime docker sends them to Docker" in r.stdout.splitlines(), r.stdout
    r = node.run([sys.executable, "-m", "imgtool", "doctor"], env=dict(env, CONTAINERD_NAMESPACE="default"))
    assert any(line.startswith("WARN  kubelet      ") and line.endswith(
        "namespace k8s.io, but this load goes to namespace default (--namespace or CONTAINERD_NAMESPACE)")
        for line in r.stdout.splitlines()), r.stdout
    r = node.run([sys.executable, "-m", "imgtool", "load", str(out), "--runtime", "docker"], env=env)
    assert "warning: the kubelet reads images from containerd" in r.stderr, r.stderr


# --- complete means unpacked: containerd killed during the unpack ---------------------------------------

def _containerd_config(d: Path) -> str:
    """As scripts/services.sh writes a node's containerd: everything under `d`, the CRI plugin on."""
    return f"""version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{d}/c.sock"
[ttrpc]
  address = "{d}/c.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    Root = "{d}/runc/k8s.io"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
"""


class OwnContainerd:
    """A containerd of this test alone (its own root, state and socket), which it may kill and start again."""

    def __init__(self, services, version: str):
        self.dir = Path(tempfile.mkdtemp(prefix="ik", dir="/tmp"))  # short: a unix socket path is at most 107 bytes
        for sub in ("root", "state", "opt", "runc", "cni/bin", "cni/conf"):
            (self.dir / sub).mkdir(parents=True)
        (self.dir / "config.toml").write_text(_containerd_config(self.dir))
        self.socket = str(self.dir / "c.sock")
        debs = os.environ.get("IMGTOOL_DEBS_CACHE") or str(Path.home() / ".cache/imgtool-test/trixie")
        self.bin = "/usr/bin" if version == "1.6" else f"{debs}/root/usr/bin"  # as scripts/services.sh's runtime_bin
        self.proc = None

    def start(self) -> None:
        log = open(self.dir / "containerd.log", "ab")
        self.proc = subprocess.Popen([f"{self.bin}/containerd", "--config", str(self.dir / "config.toml")],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                     env=dict(os.environ, PATH=f"{self.bin}:{os.environ.get('PATH', '')}"))
        log.close()
        for _ in range(300):
            if ctr(self.socket, "--timeout", "2s", "version", check=False).returncode == 0:
                return
            assert self.proc.poll() is None, (self.dir / "containerd.log").read_text()[-2000:]
            time.sleep(0.1)
        raise AssertionError("the test's containerd did not answer")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)  # the PID this test started, nothing else
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(["umount", "-R", str(self.dir / "root")], capture_output=True)
        subprocess.run(["rm", "-rf", str(self.dir)], capture_output=True)


def watch_events(own) -> subprocess.Popen:
    """containerd's events (`ctr events`), watched from before the load starts."""
    return subprocess.Popen(["ctr", "--address", own.socket, "events"], stdout=subprocess.PIPE, text=True)


def kill_at_event(own, events: subprocess.Popen, load: subprocess.Popen, wanted, seconds: float = 300) -> None:
    """SIGKILL containerd at the first of its `events` for which `wanted(line)` holds; the test fails, never waits
    for ever, when the load ends first or no such event comes within `seconds`."""
    import select

    try:
        assert events.stdout is not None
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "containerd never said the event the test waits for"
            ready, _, _ = select.select([events.stdout], [], [], min(left, 0.5))
            if not ready:
                assert load.poll() is None, "the load ended before the event: " + load.communicate()[1]
                continue
            line = events.stdout.readline()
            assert line, "ctr events ended"
            if wanted(line):
                own.kill()
                return
    finally:
        events.kill()
        events.wait()


@pytest.mark.parametrize("version", ["1.6", "1.7"])
def test_containerd_killed_during_the_unpack_is_finished_by_the_next_load(version, services, factory, tmp_path):
    """SIGKILL to containerd once imgtool's unpack has begun (ctr events: an extract snapshot prepared): the image
    is recorded and complete but not unpacked, imgtool's lease and its extract snapshot remain. containerd is
    started again on the same root; the next load finishes the unpack, removes only that debris, and the CRI
    reports the image."""
    image = factory.image(host_arch(), layers=2, layer_size=[256 * 1024, 48 * 1024 * 1024])
    store = BlobDir(tmp_path / "blobs")
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:v1")], store)
    own = OwnContainerd(services, version)
    try:
        own.start()
        # another tool's lease and snapshot, which imgtool must never touch
        ctr(own.socket, "leases", "create", "--id", "someone-else", "owner=test")
        events = watch_events(own)
        load = subprocess.Popen([sys.executable, "-m", "imgtool", "load", str(out), "--runtime", "containerd",
                                 "--address", own.socket], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env())
        # the big layer's extract (its parent is the small one's), killed while it is applied: at the small
        # layer's own prepare, the kill could land after that layer's commit, leaving no extract snapshot
        kill_at_event(own, events, load, lambda line: "/snapshot/prepare" in line and '"extract-' in line
                      and '"parent":"sha256:' in line)
        _, err = load.communicate(timeout=300)
        assert load.returncode == 5, err
        own.start()  # the same root
        leases = ctr(own.socket, "leases", "ls", "-q").stdout.split()
        assert "someone-else" in leases and any(x.startswith("imgtool-unpack.") for x in leases), leases
        assert "extract-" in ctr(own.socket, "snapshots", "ls").stdout
        names = ctr(own.socket, "images", "ls", "-q").stdout.split()
        assert f"{REPO}:v1" in names  # recorded before the unpack

        again = subprocess.run([sys.executable, "-m", "imgtool", "load", str(out), "--runtime", "containerd",
                                "--address", own.socket], capture_output=True, text=True, env=clean_env(), timeout=600)
        assert again.returncode == 0, again.stderr
        assert f"{REPO}:v1 is in containerd, but it is not unpacked into overlayfs: finishing it ..." in again.stderr
        assert "already loaded: nothing sent to containerd" in again.stdout
        top = str(chain_ids(tuple(Digest.parse(d) for d in image.diff_ids))[-1])
        snapshots = ctr(own.socket, "snapshots", "ls").stdout
        assert top in snapshots and "extract-" not in snapshots
        assert ctr(own.socket, "leases", "ls", "-q").stdout.split() == ["someone-else"]
        cri = ImageService(own.socket)
        try:
            status = cri.status(f"{REPO}:v1")
        finally:
            cri.close()
        assert status is not None and status.id == image.config_digest
        third = subprocess.run([sys.executable, "-m", "imgtool", "load", str(out), "--runtime", "containerd",
                                "--address", own.socket], capture_output=True, text=True, env=clean_env(), timeout=600)
        assert third.returncode == 0 and "finishing" not in third.stderr, third.stderr
    finally:
        own.stop()


# --- what a killed containerd leaves is imgtool's: found, said, removed or finished (issue 46 item 5) -------------

def _load_args(out: Path, socket: str) -> List[str]:
    return [sys.executable, "-m", "imgtool", "load", str(out), "--runtime", "containerd", "--address", socket]


def _load(out: Path, socket: str) -> subprocess.Popen:
    return subprocess.Popen(_load_args(out, socket), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())


def _doctor(socket: str) -> List[str]:
    r = subprocess.run([sys.executable, "-m", "imgtool", "doctor", "--runtime", "containerd", "--address", socket],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    return r.stdout.splitlines()


def _leases(socket: str) -> Dict[str, List[str]]:
    """`ctr leases ls`: ID -> [created at, labels]."""
    return {f[0]: f[1:] for f in (line.split() for line in ctr(socket, "leases", "ls").stdout.splitlines()[1:]) if f}


@pytest.fixture
def big_bundle(factory, tmp_path):
    image = factory.image(host_arch(), layers=2, layer_size=[256 * 1024, 48 * 1024 * 1024])
    store = BlobDir(tmp_path / "blobs")
    write(tmp_path / "bundle", [store.pulled(image, f"{REPO}:v1")], store)
    return tmp_path / "bundle", image


def test_containerd_killed_mid_send_leaves_a_lease_doctor_names_and_the_next_load_removes(services, big_bundle):
    """containerd 1.7 SIGKILLed while the archive streams in (8 MiB of the big layer ingested): ctr's own lease (24 h,
    with what containerd had received) stayed, and neither the next load nor doctor said a word. doctor names it;
    the next load removes it (and says so), and only it: another tool's lease stays."""
    out, image = big_bundle
    own = OwnContainerd(services, "1.7")
    try:
        own.start()
        ctr(own.socket, "leases", "create", "--id", "someone-else", "owner=test")
        ingest = own.dir / "root" / "io.containerd.content.v1.content" / "ingest"
        load = _load(out, own.socket)
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size > 8 << 20 for p in ingest.glob("*/data")):
            assert load.poll() is None, load.communicate()[1]
            assert time.monotonic() < deadline, "the import never began"
            time.sleep(0.01)
        own.kill()
        _, err = load.communicate(timeout=300)
        assert load.returncode == 5, err
        own.start()  # the same root
        leases = _leases(own.socket)
        theirs = [x for x in leases if x != "someone-else" and not x.startswith("imgtool-")]
        assert len(theirs) == 1, leases  # ctr's, with nothing but its expiry
        expiry = leases[theirs[0]][1].split("containerd.io/gc.expire=")[1].split(",")[0]
        mark = [x for x in leases if x.startswith("imgtool-load.")]
        assert len(mark) == 1, leases

        lines = _doctor(own.socket)
        said = (f"WARN  containerd   lease {theirs[0]} of an imgtool load that was cut short (pid {load.pid}, "
                f"{leases[mark[0]][0]}) holds what containerd had received of it until {expiry}")
        assert said in lines, "\n".join(lines)
        assert lines[lines.index(said) + 1] == f"{'':<18}-> the next imgtool load removes it"

        again = subprocess.run(_load_args(out, own.socket), capture_output=True, text=True, env=clean_env(),
                               timeout=600)
        assert again.returncode == 0, again.stderr
        assert (f"warning: removed containerd lease {theirs[0]}, with what containerd had received of an imgtool "
                f"load that was cut short (pid {load.pid})") in again.stderr.splitlines()
        assert list(_leases(own.socket)) == ["someone-else"]
        assert not [x for x in _doctor(own.socket) if x.startswith("WARN  containerd")]
    finally:
        own.stop()


def test_containerd_killed_while_registering_leaves_a_half_loaded_image_said_and_finished(services, big_bundle):
    """containerd 1.6 SIGKILLed as it registers the image (its /images/create event): the image stays named in
    k8s.io, not unpacked nor pinned, and the kubelet's CRI takes it for present. The failed load said only "could not
    check for what the failed load left". It says what it may have left and that the next load finishes it; doctor
    names the image half-loaded; the next load finishes it and removes the lease and its mark."""
    out, image = big_bundle
    own = OwnContainerd(services, "1.6")
    try:
        own.start()
        ctr(own.socket, "leases", "create", "--id", "someone-else", "owner=test")
        events = watch_events(own)
        load = _load(out, own.socket)
        kill_at_event(own, events, load, lambda line: "/images/create" in line and f'"{REPO}:v1"' in line)
        _, err = load.communicate(timeout=300)
        assert load.returncode == 5, err
        own.start()
        leases = _leases(own.socket)
        theirs = [x for x in leases if x != "someone-else" and not x.startswith("imgtool-")]
        mark = [x for x in leases if x.startswith("imgtool-load.")]
        # ctr's lease: named by the mark; gone already when ctr ended it between the event and the kill
        ctr_lease = leases[mark[0]][1].split("imgtool.ctr-lease=")[1].split(",")[0] if len(mark) == 1 else None
        assert len(mark) == 1 and theirs in ([], [ctr_lease]), leases
        lines = err.splitlines()
        warning = [x for x in lines if x.startswith("warning: could not check for what the failed load left")]
        assert len(warning) == 1 and warning[0].endswith(
            f": it may hold lease {ctr_lease} with what it had received, and {REPO}:v1 named but not unpacked if it "
            "had registered it (the kubelet would take it for present); imgtool knows these for its own: the next "
            "imgtool load removes and finishes them, and imgtool doctor lists them"), err
        assert lines[-1] == (f"hint: once containerd answers again, run imgtool load {out} again: it finishes what "
                             "this load left (imgtool doctor lists it)"), err
        cri = ImageService(own.socket)
        try:
            assert cri.status(f"{REPO}:v1") is not None  # the harm: the kubelet takes it for present
        finally:
            cri.close()

        doctor = _doctor(own.socket)
        said = (f"WARN  containerd   {REPO}:v1 is half-loaded (it is not unpacked into overlayfs), but the kubelet "
                f"takes it for present: an imgtool load was cut short (pid {load.pid}, {leases[mark[0]][0]})")
        assert said in doctor, "\n".join(doctor)
        assert doctor[doctor.index(said) + 1] == (f"{'':<18}-> run imgtool load DIR again, DIR the bundle that holds "
                                                  "it: it finishes it")

        again = subprocess.run(_load_args(out, own.socket), capture_output=True, text=True, env=clean_env(),
                               timeout=600)
        assert again.returncode == 0, again.stderr
        assert f"{REPO}:v1 is in containerd, but it is not unpacked into overlayfs: finishing it ..." in again.stderr
        assert "already loaded: nothing sent to containerd" in again.stdout
        assert list(_leases(own.socket)) == ["someone-else"]
        top = str(chain_ids(tuple(Digest.parse(d) for d in image.diff_ids))[-1])
        assert top in ctr(own.socket, "snapshots", "ls").stdout
        assert "io.cri-containerd.pinned=pinned" in ctr(own.socket, "images", "ls").stdout
        assert not [x for x in _doctor(own.socket) if x.startswith("WARN  containerd")]
    finally:
        own.stop()


def test_a_process_gone_since_it_was_listed_is_in_no_namespace_of_ours():
    """A kubelet listed in /proc that ends before its namespaces are read (another test's simulated node, a kubelet
    restarting) is no kubelet of this node: its links are gone, which is not "cannot compare" (a user's EACCES)."""
    from imgtool.runtimes import kubelet

    p = subprocess.Popen(["true"])
    p.wait()
    assert kubelet._same_namespaces(p.pid) is False
    assert kubelet._same_namespaces(os.getpid()) is True
