"""bundle/catalog.py: which names and digests of bundle.json `imgtool serve` maps to bytes (pure, no server)."""

from imgtool.bundle.catalog import Catalog, valid_name
from imgtool.bundle.reader import read_index
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
