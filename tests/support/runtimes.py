"""Every runtime a test loads into, behind one test-side interface: Docker engines, containerd, Podman.

A test marked @pytest.mark.runtimes runs once per runtime (the Docker engines of the matrix, then
containerd 1.6, 1.7 and 2.1, then Podman 4.3) and gets a `node`: the environment that makes
`imgtool load` (--runtime auto) pick that runtime as on a host that has only it (Docker's socket
absent for containerd and Podman; containerd's too for Podman), what the runtime holds, the ID it
gives a test image, a container run from an image, and cleanup. It asks each runtime with its own
tool (docker, ctr, podman), never through imgtool.
"""

import json
import os
import subprocess
from typing import Dict, List

from .daemon import DaemonCleanup, DockerCLI, bundle_view
from .services import Services

RUNTIMES = ("containerd-1.6", "containerd-1.7", "containerd-2.1", "podman-4.3")
# Runtimes that run only each verb's proof (a test marked @pytest.mark.runtimes(proof=True)), not every runtimes test:
# Podman 5.8 shares 4.3's room, and all 24 runtimes tests on it cost about as much as the whole containerd 1.7
# column (docs/testing.md)
PROOF_RUNTIMES = ("podman-5.8",)
NO_DOCKER = "unix:///nonexistent/imgtool-test/docker.sock"
NO_CONTAINERD = "/nonexistent/imgtool-test/containerd.sock"


class Node:
    kind = ""
    title = ""

    def __init__(self, name: str):
        self.name = name
        self.removals: List[str] = []
        self.env: Dict[str, str] = {}  # for the imgtool subprocess: this runtime is the one auto finds

    def image_ids(self) -> List[str]:
        raise NotImplementedError

    def bundle_id(self, image) -> str:
        raise NotImplementedError

    def names(self, image) -> List[str]:
        """The names the runtime shows for the test image (short forms: x:1, not docker.io/library/x:1)."""
        raise NotImplementedError

    def run(self, ref: str, *command: str) -> str:
        raise NotImplementedError

    def ids_of(self, image) -> List[str]:
        """The IDs this runtime may give the test image (see DockerCLI.ids_of)."""
        return [self.bundle_id(image)]

    def holds(self, ref: str, image) -> bool:
        """The runtime has `ref`, and it is `image` (by the ID this runtime gives it)."""
        raise NotImplementedError

    def find(self, image) -> bool:
        """The runtime holds the test image (by ID), named or not."""
        return any(i in self.image_ids() for i in self.ids_of(image))

    def remove(self, *refs: str) -> None:
        """Remove these images now (names or IDs)."""
        self.remove_later(*refs)
        errors = self.cleanup()
        assert not errors, errors

    def leftovers(self, before: "Snapshot") -> List[str]:
        """What is here now and was not at `before`: image records, blobs, snapshots/layers."""
        now = self.snapshot()
        return sorted(f"{what} {x}" for what in now.items for x in set(now.items[what]) - set(before.items[what]))

    def snapshot(self) -> "Snapshot":
        return Snapshot({"image": self.image_ids()})

    def remove_later(self, *refs: str) -> None:
        self.removals.extend(refs)

    def cleanup(self) -> List[str]:
        raise NotImplementedError


class Snapshot:
    def __init__(self, items: Dict[str, List[str]]):
        self.items = items


class DockerNode(Node):
    kind, title = "docker", "Docker"

    def __init__(self, name: str, services: Services):
        super().__init__(name)
        self.cli = DockerCLI(services.docker_host)
        self.env = {"DOCKER_HOST": services.docker_host}
        self._cleanup = DaemonCleanup(self.cli)

    def image_ids(self) -> List[str]:
        return self.cli.image_ids()

    def bundle_id(self, image) -> str:
        return self.cli.bundle_id(image)

    def names(self, image) -> List[str]:
        found = self.cli.find(image)
        return sorted(found["RepoTags"]) if found else []

    def run(self, ref: str, *command: str) -> str:
        return self.cli("run", "--rm", "--network", "none", ref, *command).stdout

    def ids_of(self, image) -> List[str]:
        return self.cli.ids_of(image)

    def holds(self, ref: str, image) -> bool:
        return self.cli.holds(ref, image)

    def remove_later(self, *refs: str) -> None:
        self._cleanup.image(*refs)

    def cleanup(self) -> List[str]:
        return self._cleanup.run()


class ContainerdNode(Node):
    kind, title = "containerd", "containerd"

    def __init__(self, name: str, services: Services):
        super().__init__(name)
        self.socket = services.containerd(name.split("-", 1)[1])
        self.env = {"DOCKER_HOST": NO_DOCKER, "CONTAINERD_ADDRESS": self.socket}
        self.path = containerd_path(self.socket)
        if self.path != os.environ.get("PATH", ""):
            self.env["PATH"] = self.path  # its own ctr first (2.x: the transfer service), as on its node

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["ctr", "--address", self.socket, "-n", "k8s.io", *args], capture_output=True,
                              text=True, timeout=300, check=check, env=dict(os.environ, PATH=self.path))

    def refs(self) -> List[List[str]]:
        """`ctr images ls` rows split: [name, type, digest, size, unit, platforms, labels]."""
        return [line.split() for line in self.ctr("images", "ls").stdout.splitlines()[1:] if line.strip()]

    def image_ids(self) -> List[str]:
        return sorted({row[2] for row in self.refs()})

    def snapshot(self) -> Snapshot:
        return Snapshot({
            "image": sorted(row[0] for row in self.refs()),
            "blob": self.ctr("content", "ls", "--quiet").stdout.split(),
            "snapshot": [line.split()[0] for line in self.ctr("snapshots", "ls").stdout.splitlines()[1:]],
        })

    def bundle_id(self, image) -> str:
        from imgtool.bundle import layout

        return str(layout.oci_descriptor_digest(bundle_view(image)))

    def names(self, image) -> List[str]:
        from imgtool.model import familiar

        digest = self.bundle_id(image)
        return sorted(familiar(row[0]) for row in self.refs()  # tags, as Docker's RepoTags: no digest names
                      if row[2] == digest and not row[0].startswith("sha256:") and "@" not in row[0])

    def holds(self, ref: str, image) -> bool:
        from imgtool.runtimes.containerd import normalize

        return any(row[0] == normalize(ref) and row[2] == self.bundle_id(image) for row in self.refs())

    def labels(self, ref: str) -> str:
        return next(row[-1] for row in self.refs() if row[0] == ref)

    def run(self, ref: str, *command: str) -> str:
        from imgtool.runtimes.containerd import normalize

        name = "run-" + os.urandom(4).hex()
        root = os.path.join(os.path.dirname(self.socket), "runc", "k8s.io")
        return self.ctr("run", "--rm", "--runc-root", root, normalize(ref), name, *command).stdout

    def cleanup(self) -> List[str]:
        from imgtool.runtimes.containerd import normalize

        names = {normalize(r) if not r.startswith("sha256:") else r for r in self.removals}
        rows = self.refs()
        digests = {row[2] for row in rows if row[0] in names} | {r for r in self.removals if r.startswith("sha256:")}
        doomed = sorted({row[0] for row in rows if row[0] in names or row[2] in digests})
        self.removals.clear()
        if doomed:
            r = self.ctr("images", "rm", "--sync", *doomed, check=False)
            if r.returncode != 0:
                return [r.stderr.strip()]
        return []


class PodmanNode(Node):
    kind, title = "podman", "Podman"

    def __init__(self, name: str, services: Services):
        super().__init__(name)
        self.services = services
        self.version = name.split("-", 1)[1]
        self.env = {"DOCKER_HOST": NO_DOCKER, "CONTAINERD_ADDRESS": NO_CONTAINERD}
        full = services.podman_env(version=self.version)
        for key in ("PATH", "CONTAINERS_STORAGE_CONF", "CONTAINERS_CONF"):
            self.env[key] = full[key]

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], env=self.services.podman_env(version=self.version), capture_output=True, text=True,
                              timeout=300, check=check)

    def image_ids(self) -> List[str]:
        return sorted("sha256:" + x for x in self.podman("images", "-a", "-q", "--no-trunc").stdout.replace(
            "sha256:", "").split())

    # graphRoot by storage.conf: `podman info` costs ~0.2 CPU s (it asks dpkg-query for its helpers' versions),
    # 5x any other podman command, and it was asked again for every snapshot
    _graph_roots: Dict[str, str] = {}

    def graph_root(self) -> str:
        conf = self.env["CONTAINERS_STORAGE_CONF"]
        if conf not in self._graph_roots:
            self._graph_roots[conf] = json.loads(self.podman("info", "--format", "json").stdout)["store"]["graphRoot"]
        return self._graph_roots[conf]

    def snapshot(self) -> Snapshot:
        path = os.path.join(self.graph_root(), "overlay-layers", "layers.json")
        ids = [x["id"] for x in json.load(open(path))] if os.path.exists(path) else []
        return Snapshot({"image": self.image_ids(), "layer": ids})

    def bundle_id(self, image) -> str:
        return image.config_digest

    def names(self, image) -> List[str]:
        from imgtool.model import familiar

        r = self.podman("image", "inspect", image.config_digest, check=False)
        if r.returncode != 0:
            return []
        return sorted(familiar(t[len("localhost/"):] if t.startswith("localhost/") else t)
                      for t in json.loads(r.stdout)[0].get("RepoTags") or [])

    def run(self, ref: str, *command: str) -> str:
        return self.podman("run", "--rm", ref, *command).stdout

    def holds(self, ref: str, image) -> bool:
        r = self.podman("image", "inspect", ref, check=False)
        return r.returncode == 0 and "sha256:" + json.loads(r.stdout)[0]["Id"].replace("sha256:", "") == \
            image.config_digest

    def cleanup(self) -> List[str]:
        errors = []
        for ref in reversed(self.removals):
            r = self.podman("rmi", "-f", ref, check=False)
            if r.returncode != 0 and "image not known" not in r.stderr:
                errors.append(r.stderr.strip())
        self.removals.clear()
        return errors


def containerd_path(socket: str) -> str:
    """PATH with the containerd's own ctr first where scripts/services.sh gives it one (DIR/bin: 2.x), else PATH."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    own = os.path.join(os.path.dirname(socket), "bin")
    return own + os.pathsep + path if os.path.isdir(own) else path


def node_for(name: str, services: Services) -> Node:
    if name.startswith("containerd-"):
        return ContainerdNode(name, services)
    if name.startswith("podman-"):
        return PodmanNode(name, services)
    return DockerNode(name, services.on(name))
