"""bundle/catalog.py: which names and digests of bundle.json `imgtool serve` maps to bytes (pure, no server)."""

from imgtool.bundle.catalog import Catalog, valid_name
from imgtool.bundle.reader import read_index
from imgtool.model import DOCKER_LIST, Digest
from tests.support.bundles import BlobDir, write
from tests.support.images import host_arch


def test_names_by_path_by_registry_and_by_containerds_ns(factory, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    quay, hub = factory.image(host_arch(), layers=1), factory.image(host_arch(), layers=1)
    other = factory.image(host_arch(), layers=1)
    out = tmp_path / "b"
    write(out, [store.pulled(quay, "quay.io/ascend/vllm-ascend:v1"), store.pulled(hub, "docker.io/library/busybox:1"),
                store.pulled(other, "registry.example:5000/ascend/vllm-ascend:v1")], store)
    catalog = Catalog([read_index(out)[0]])
    # one path held under two registries: the short form names neither; the prefix form and ns name each
    assert catalog.repository("ascend/vllm-ascend") is None
    assert catalog.repository("quay.io/ascend/vllm-ascend").registry == "quay.io"
    assert catalog.repository("registry.example:5000/ascend/vllm-ascend").registry == "registry.example:5000"
    assert str(catalog.repository("ascend/vllm-ascend", "quay.io").tags["v1"][0]) == quay.manifest_digest
    assert catalog.repository("ascend/vllm-ascend", "docker.io") is None
    for name, ns in (("library/busybox", None), ("library/busybox", "docker.io"), ("docker.io/library/busybox", None),
                     ("index.docker.io/library/busybox", None)):
        assert str(catalog.repository(name, ns).tags["1"][0]) == hub.manifest_digest, (name, ns)
    assert catalog.names() == ["library/busybox", "quay.io/ascend/vllm-ascend",
                               "registry.example:5000/ascend/vllm-ascend"]


def test_spans_cut_a_blob_at_the_part_boundaries(factory, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    image = factory.image(host_arch(), layers=3)
    out = tmp_path / "b"
    write(out, [store.pulled(image, "quay.io/ascend/vllm-ascend:v1")], store, chunk_size=700 * 1024)
    index, _ = read_index(out)
    catalog = Catalog([index])
    joined = b"".join((out / p.name).read_bytes() for p in index.parts)
    starts = [sum(p.size for p in index.parts[:i]) for i in range(len(index.parts))]
    for digest, data in image.blobs().items():
        blob = next(b for d, b in catalog.blobs.items() if str(d) == digest)
        got = b"".join(joined[starts[s.part] + s.offset:starts[s.part] + s.offset + s.length]
                       for s in catalog.spans(blob))
        assert got == data
        assert b"".join(joined[starts[s.part] + s.offset:starts[s.part] + s.offset + s.length]
                        for s in catalog.spans(blob, 5, 17)) == data[5:17]


def test_valid_names():
    for good in ("ascend/vllm-ascend", "quay.io/ascend/vllm-ascend", "127.0.0.1:5000/a/b", "library/busybox", "a__b/c"):
        assert valid_name(good), good
    for bad in ("", "..", "../etc/passwd", "a/../b", "/etc/passwd", "a//b", "a/b/", "%2e%2e/x", "a b", "a/.hidden",
                "a\x00b", "A" * 600):
        assert not valid_name(bad), bad


def test_a_compressed_bundles_blobs_are_spans_of_its_unpacked_archive(factory, tmp_path):
    import gzip

    store = BlobDir(tmp_path / "blobs")
    image = factory.image(host_arch(), layers=2)
    out = tmp_path / "b"
    write(out, [store.pulled(image, "quay.io/ascend/vllm-ascend:v1")], store, chunk_size=700 * 1024, compress="gzip")
    index, _ = read_index(out)
    assert len(index.parts) > 1
    tar = gzip.decompress(b"".join((out / p.name).read_bytes() for p in index.parts))
    catalog = Catalog([index])
    for digest, data in image.blobs().items():
        blob = next(b for d, b in catalog.blobs.items() if str(d) == digest)
        assert [(s.part, s.length) for s in catalog.spans(blob)] == [(0, len(data))]
        span = catalog.spans(blob)[0]
        assert tar[span.offset:span.offset + span.length] == data


# --- upstream's index, as fetch keeps it (bundle.json upstream_indexes) ----------------------------------------------

REPO = "quay.io/ascend/vllm-ascend"


def upstream_bundle(out, store, idx, images, tag="v3"):
    """A bundle of `images` (of support Index `idx`) as fetch writes it: each names idx, whose bytes it keeps."""
    write(out, [store.pulled(image, f"{REPO}:{tag}", index=idx) for image in images], store)
    return Catalog([read_index(out)[0]])


def test_a_tag_whose_bundle_holds_every_entry_is_upstreams_index(factory, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    idx = factory.multiarch(("amd64", "arm64"), layers=1, media="docker")
    catalog = upstream_bundle(tmp_path / "b", store, idx, idx.images)
    repo = catalog.repository("ascend/vllm-ascend")
    digest = Digest.parse(idx.manifest_digest)
    assert repo.resolve("v3") == digest
    found = repo.manifests[digest]
    assert (found.data, found.media_type) == (idx.manifest_bytes, DOCKER_LIST)  # upstream's bytes, byte for byte
    assert repo.lacking == {}


def test_a_bundle_lacking_entries_answers_upstreams_index_by_digest_only(factory, tmp_path):
    """One platform fetched of an index with attestations: the tag is that platform's manifest (as before), the
    digest upstream's index, and each entry it lacks is named."""
    store = BlobDir(tmp_path / "blobs")
    amd, arm = factory.image("amd64", layers=1), factory.image("arm64", layers=1)
    idx = factory.attested([amd, arm])
    catalog = upstream_bundle(tmp_path / "b", store, idx, [arm])
    repo = catalog.repository("ascend/vllm-ascend")
    digest = Digest.parse(idx.manifest_digest)
    assert repo.resolve("v3") == Digest.parse(arm.manifest_digest)
    assert repo.manifests[digest].data == idx.manifest_bytes and repo.served_upstream(digest)
    of = f"upstream's index {digest} (tag v3)"
    assert {str(d): why for d, why in repo.lacking.items()} == {
        amd.manifest_digest: f"the linux/amd64 manifest of {of}",
        idx.attestations[0][0]: f"an attestation manifest of {of}",
        idx.attestations[1][0]: f"an attestation manifest of {of}"}
    assert repo.why_missing(Digest.parse(amd.manifest_digest)) == (
        f"{REPO}@{amd.manifest_digest} is the linux/amd64 manifest of {of}, which the bundles served here do not hold")

    # both platforms, attestations still lacking: the tag is the generated index (skopeo copy --all keeps working)
    both = upstream_bundle(tmp_path / "both", store, idx, [amd, arm]).repository("ascend/vllm-ascend")
    assert both.resolve("v3") != digest and both.manifests[both.resolve("v3")].platform == "index"
    assert both.served_upstream(digest) and len(both.lacking) == 2


def test_two_bundles_each_holding_a_platform_answer_upstreams_index_whole(factory, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    idx = factory.multiarch(("amd64", "arm64"), layers=1)
    write(tmp_path / "a", [store.pulled(idx.images[0], f"{REPO}:v3", index=idx)], store)
    write(tmp_path / "b", [store.pulled(idx.images[1], f"{REPO}:v3-arm", index=idx)], store)
    catalog = Catalog([read_index(tmp_path / "a")[0], read_index(tmp_path / "b")[0]])
    repo = catalog.repository("ascend/vllm-ascend")
    digest = Digest.parse(idx.manifest_digest)
    assert repo.served_upstream(digest) and repo.lacking == {}
    assert repo.resolve("v3") == Digest.parse(idx.images[0].manifest_digest)  # each tag as its bundle holds it


def test_old_bundles_and_rewritten_manifests_do_not_answer_upstreams_digest(factory, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    idx = factory.multiarch(("amd64", "arm64"), layers=1)
    write(tmp_path / "old", [store.pulled(image, f"{REPO}:v3") for image in idx.images], store)
    old = Catalog([read_index(tmp_path / "old")[0]]).repository("ascend/vllm-ascend")
    assert old.resolve("v3") != Digest.parse(idx.manifest_digest) and old.kept == {}
    # a bundle whose manifests fetch rewrote (--layers compat of zstd): it keeps upstream's index, lists none of them
    other = factory.multiarch(("amd64", "arm64"), layers=1)
    write(tmp_path / "rewritten", [store.pulled(image, f"{REPO}:v3", index=idx) for image in other.images], store)
    repo = Catalog([read_index(tmp_path / "rewritten")[0]]).repository("ascend/vllm-ascend")
    digest = Digest.parse(idx.manifest_digest)
    assert digest in repo.kept and not repo.served_upstream(digest) and digest not in repo.manifests
    assert repo.why_missing(digest) == (
        f"{REPO}@{digest} is upstream's index of tag v3, whose manifests the bundles do not hold (fetch rewrote their "
        f"layers): pull {REPO}:v3 (here {repo.resolve('v3')})")
