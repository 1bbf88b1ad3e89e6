"""One bundle, a whole (simulated) cluster: issue 26's "done when", end to end with the real parts.

The connected side fetches the image from the registry standing in for quay.io into a bundle; that
bundle, and nothing else, reaches the cluster. One node runs `imgtool serve` on it; `imgtool
run-flags a2 --format k8s --bundle` writes the Pod (validated against the Kubernetes schemas), and
every other node gets the image the Pod names:

- Kubernetes nodes (containerd 1.6, 1.7 and 2.1 with the CRI plugin): the kubelet's own path, CRI
  ImageStatus then PullImage of the Pod's image string `quay.io/...:TAG@sha256:...`, resolved by
  the CRI plugin through a hosts.toml mirror for quay.io in its `config_path` (as
  /etc/containerd/certs.d on a node): the upstream name, unchanged.
- a Podman host: a registries.conf mirror for quay.io, `podman pull quay.io/...@sha256:...`.
- Docker hosts (20.10, 26.1, 28.5): Docker mirrors only Docker Hub, so they pull from the server's address.

Every runtime checks what it pulls against the digests (the manifest the Pod pins, the layers the
manifest names), and the image each holds is the bundle's (its config digest). A part damaged after
the server started is never served: the pull fails and the node holds nothing by that name.
"""

import json
import os
import subprocess
from pathlib import Path
from typing import Optional

import grpc
import pytest

from imgtool.bundle.catalog import Catalog
from imgtool.bundle.reader import read_index
from imgtool.model import Digest
from tests.support.bundles import fetch_from_registry, imgtool
from tests.support.cri import ImageService
from tests.support.registry import get_manifest
from tests.support.daemon import DaemonCleanup, DockerCLI
from tests.support.runtimes import ContainerdNode, PodmanNode
from tests.test_presets_k8s import validate
from tests.test_serve import Server


class Cluster:
    """The bundle fetched on the connected side, the server on one node, the Pod for the others."""

    def __init__(self, services, factory, mirrored, tmp_path: Path):
        self.bundle, self.image, self.name, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
        self.server = Server(str(self.bundle), "--listen", "127.0.0.1:0")
        r = imgtool("run-flags", "a2", "--format", "k8s", "--bundle", str(self.bundle), "--image", self.name,
                    "--", "vllm", "serve", "/models/Qwen3-8B", env={"HOME": str(tmp_path)})
        assert r.returncode == 0, r.stderr
        self.pod = validate(r.stdout)
        container = self.pod["spec"]["containers"][0]
        self.pod_image = container["image"]
        assert self.pod_image == f"{self.name}@{self.image.manifest_digest}"
        assert container["imagePullPolicy"] == "IfNotPresent"
        self.repo = self.name.split(":")[0]  # quay.io/<path>, the upstream name without the tag
        self.by_digest = f"{self.repo}@{self.image.manifest_digest}"

    def stop(self) -> None:
        assert self.server.stop().returncode == 130  # Ctrl-C, as docs/reliability.md says

    def damage_a_layer(self) -> bytes:
        """Flip the last byte of the image's biggest layer in its part; returns the byte to put back."""
        index, _ = read_index(self.bundle)
        catalog = Catalog([index])
        layer = max(self.image.layers, key=lambda x: x.size)
        self.span = catalog.spans(catalog.blobs[Digest.parse(layer.digest)])[-1]
        self.part = self.bundle / index.parts[self.span.part].name
        with open(self.part, "r+b") as f:
            f.seek(self.span.offset + self.span.length - 1)
            last = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([last[0] ^ 0xFF]))
        self.layer = layer
        return last

    def repair(self, last: bytes) -> None:
        with open(self.part, "r+b") as f:
            f.seek(self.span.offset + self.span.length - 1)
            f.write(last)


@pytest.fixture
def cluster(services, factory, mirrored, tmp_path):
    c = Cluster(services, factory, mirrored, tmp_path)
    yield c
    c.stop()


class KubeNode:
    """A Kubernetes node: its containerd, the CRI plugin's hosts.toml for quay.io, the kubelet's CRI calls."""

    def __init__(self, version: str, services, mirror_url: str, hosts_toml: Optional[str] = None):
        self.containerd = ContainerdNode(f"containerd-{version}", services)
        self.hosts = Path(os.path.dirname(self.containerd.socket)) / "certs.d" / "quay.io"
        self.hosts.mkdir(parents=True, exist_ok=True)
        (self.hosts / "hosts.toml").write_text(hosts_toml or (
            f'server = "https://quay.io"\n\n[host."{mirror_url}"]\n  capabilities = ["pull", "resolve"]\n'))
        self.cri = ImageService(self.containerd.socket)

    def kubelet_pull(self, image: str) -> str:
        """What the kubelet does for a Pod with imagePullPolicy IfNotPresent: ImageStatus, then PullImage."""
        assert self.cri.status(image) is None
        return self.cri.pull(image)

    def close(self, cluster: Cluster) -> None:
        status = self.cri.status(cluster.pod_image)
        if status is not None:
            self.cri.remove(status.id)
        self.containerd.removals.extend([cluster.name, cluster.by_digest])
        errors = self.containerd.cleanup()
        self.cri.close()
        (self.hosts / "hosts.toml").unlink()
        assert errors == []


@pytest.mark.parametrize("version", ["1.6", "1.7", "2.1"])
def test_a_kubernetes_node_pulls_the_pods_image_by_its_upstream_name(version, cluster, services):
    node = KubeNode(version, services, cluster.server.url)
    try:
        image_id = node.kubelet_pull(cluster.pod_image)
        assert image_id == cluster.image.config_digest
        status = node.cri.status(cluster.pod_image)
        assert (status.id, status.repo_digests) == (cluster.image.config_digest, [cluster.by_digest])
        # the next Pod on this node finds it (by the digest name a pull records), and runs it without a pull
        names = [row[0] for row in node.containerd.refs() if row[2] == cluster.image.manifest_digest]
        assert cluster.by_digest in names
    finally:
        node.close(cluster)
    # through the mirror, as containerd asks a mirror: ?ns=quay.io, by the Pod's digest
    assert cluster.server.said(f"/manifests/{cluster.image.manifest_digest}?ns=quay.io 200"), cluster.server.log()


@pytest.mark.parametrize("version", ["1.6", "1.7", "2.1"])
def test_a_pod_pinned_by_upstreams_index_digest_pulls_through_the_hosts_toml_serve_printed(version, cluster, services):
    """Issue 36 item 6: a GitOps Pod pins quay.io/...:TAG@sha256:<the index digest quay.io shows>. The bundle (this
    host's platform of a two-arch tag) keeps upstream's index; the kubelet's CRI pull finds it through the
    hosts.toml `serve --print-node-config` printed, and records upstream's digest."""
    repo_path, tag = cluster.name.split("/", 1)[1].rsplit(":", 1)
    upstream = get_manifest(services.plain, repo_path, tag)  # what quay.io (the registry standing in) shows
    printed = imgtool("serve", str(cluster.bundle), "--listen", f"127.0.0.1:{cluster.server.port}",
                      "--print-node-config", "--json")
    assert printed.returncode == 0, printed.stderr
    hosts = {f["path"]: f["content"] for f in json.loads(printed.stdout)["files"]}
    pinned = f"{cluster.name}@{upstream.digest}"
    node = KubeNode(version, services, cluster.server.url, hosts["/etc/containerd/certs.d/quay.io/hosts.toml"])
    try:
        assert node.kubelet_pull(pinned) == cluster.image.config_digest
        status = node.cri.status(pinned)
        assert status.repo_digests == [f"{cluster.repo}@{upstream.digest}"]
        assert node.containerd.ctr("content", "get", upstream.digest).stdout.encode() == upstream.body
    finally:
        node.containerd.removals.append(f"{cluster.repo}@{upstream.digest}")
        node.close(cluster)
    assert cluster.server.said(f"/manifests/{upstream.digest}?ns=quay.io 200"), cluster.server.log()


def test_a_podman_host_pulls_the_upstream_name_through_a_registries_conf_mirror(cluster, services, tmp_path):
    node = PodmanNode("podman-4.3", services)
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nprefix = "quay.io"\nlocation = "quay.io"\n\n[[registry.mirror]]\n'
                    f'location = "{cluster.server.hostport}"\ninsecure = true\n')
    env = services.podman_env()
    env["CONTAINERS_REGISTRIES_CONF"] = str(conf)
    node.removals.append(cluster.image.config_digest)
    try:
        r = subprocess.run(["podman", "pull", cluster.by_digest], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        assert node.holds(cluster.by_digest, cluster.image)
    finally:
        assert node.cleanup() == []


@pytest.mark.parametrize("engine", ["20.10", "26.1", "28.5"])
def test_a_docker_host_pulls_from_the_servers_address(engine, cluster, _services):
    cli = DockerCLI(_services.on(engine).docker_host)
    cleanup = DaemonCleanup(cli)
    ref = f"{cluster.server.hostport}/{cluster.repo.split('/', 1)[1]}@{cluster.image.manifest_digest}"
    cleanup.image(ref, cluster.image.config_digest)
    try:
        cli("pull", ref)  # loopback registries are insecure by default for these engines
        assert cli.holds(ref, cluster.image)
    finally:
        assert cleanup.run() == []


def test_a_part_damaged_after_the_server_started_is_never_served(cluster, services):
    last = cluster.damage_a_layer()
    node = KubeNode("1.7", services, cluster.server.url)
    try:
        with pytest.raises(grpc.RpcError) as failed:
            node.kubelet_pull(cluster.pod_image)
        assert cluster.layer.digest in failed.value.details()
        assert node.cri.status(cluster.pod_image) is None
        assert [row for row in node.containerd.refs() if row[0] in (cluster.name, cluster.by_digest)] == []
        # the operator re-copies the part: the same pull now succeeds
        cluster.repair(last)
        assert node.kubelet_pull(cluster.pod_image) == cluster.image.config_digest
    finally:
        node.close(cluster)
    assert cluster.server.said(f"(blob {cluster.layer.digest[7:19]}) is damaged in {cluster.bundle}"), \
        cluster.server.log()
