"""ends/registry_dest.py against a registry that refuses cross-repository mounts (as Nexus does: the mount POST opens
an upload session instead), read from a compressed bundle, which hands blobs over once, in archive order.

The real registries of the services tier mount (tests/test_push.py); this one is a stand-in that keeps what it is
sent and checks every upload against its digest, as a registry does.
"""

import json
from itertools import count

from imgtool.ends.bundle_source import BundleSource
from imgtool.ends.registry_dest import RegistryDestination
from imgtool.model import Digest
from imgtool.pipeline import copy
from imgtool.progress import Progress
from tests.support.bundles import BlobDir, random_layer, simple_image, write


class NoMountRegistry:
    def __init__(self):
        self.blobs = {}  # (repository, digest) -> bytes
        self.sessions = {}  # url -> (repository, bytearray)
        self.manifests = {}  # (repository, reference) -> bytes
        self.mounts = []
        self._urls = count()

    def has_blob(self, repo, digest):
        return (repo, digest) in self.blobs

    def mount_blob(self, repo, digest, source_repo):
        assert (source_repo, digest) in self.blobs
        self.mounts.append((repo, digest))
        return self.start_upload(repo)  # refused: an upload session instead

    def start_upload(self, repo):
        url = f"http://reg/upload/{next(self._urls)}"
        self.sessions[url] = (repo, bytearray())
        return url

    def upload_chunk(self, repo, url, data, start):
        owner, buf = self.sessions.pop(url)
        assert owner == repo and len(buf) == start
        buf += data
        nxt = f"http://reg/upload/{next(self._urls)}"
        self.sessions[nxt] = (repo, buf)
        return nxt

    def finish_upload(self, repo, url, digest, data=b""):
        owner, buf = self.sessions.pop(url)
        assert owner == repo
        buf += data
        assert Digest.of(bytes(buf)) == digest
        self.blobs[(repo, digest)] = bytes(buf)

    def put_manifest(self, repo, reference, data, media_type):
        for d in [x["digest"] for x in json.loads(data)["layers"]]:
            assert (repo, Digest.parse(d)) in self.blobs  # a manifest only once its blobs are in
        self.manifests[(repo, reference)] = data
        return Digest.of(data)


def test_a_refused_mount_sends_the_blob_again_in_a_second_pass_over_a_compressed_bundle(tmp_path):
    store = BlobDir(tmp_path / "blobs")
    base = [random_layer(1_500_000, 1), random_layer(700_000, 2)]
    one = simple_image(base + [random_layer(400_000, 3)], seed=1)
    two = simple_image(base + [random_layer(900_000, 4)], seed=2)
    out = tmp_path / "bundle"
    write(out, [store.pulled(one, "quay.io/ascend/vllm-ascend:v1"), store.pulled(two, "quay.io/ascend/cann:8.2")],
          store, chunk_size=1024 * 1024, compress="zstd")
    source = BundleSource(out)
    registry = NoMountRegistry()
    destination = RegistryDestination(registry, "reg", "site", "http", Progress(), chunk=256 * 1024,  # type: ignore
                                      prefer=source.order, rewind=source.rewind)
    try:
        result = copy(source, destination).result
    finally:
        source.finish()
    shared = {Digest.parse(x.digest) for x in base}
    assert {d for _, d in registry.mounts} == shared  # each tried, each refused
    assert (result.blobs_uploaded, result.blobs_mounted) == (8, 0)  # 2 configs, 2 own layers, the 2 shared twice
    for repo, image in (("site/ascend/vllm-ascend", one), ("site/ascend/cann", two)):
        for digest, data in image.blobs().items():
            assert registry.blobs[(repo, Digest.parse(digest))] == data
    assert registry.manifests[("site/ascend/vllm-ascend", "v1")] == one.manifest_bytes
    assert registry.manifests[("site/ascend/cann", "8.2")] == two.manifest_bytes
