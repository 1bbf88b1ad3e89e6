"""ends/bundle_source.py: a bundle read as a pipeline source, uncompressed (in place) and compressed (one stream)."""

import pytest

from imgtool.ends.bundle_source import BundleSource, OutOfOrder
from imgtool.errors import VerifyError
from imgtool.model import Digest
from tests.support.bundles import BlobDir, parts_of, random_layer, simple_image, write

REF = "quay.io/ascend/vllm-ascend:v1"


@pytest.fixture
def image_and_store(tmp_path):
    store = BlobDir(tmp_path / "blobs")
    image = simple_image([random_layer(size, seed) for seed, size in enumerate((300_000, 2_000_000, 3_000_000,
                                                                                100_000))])
    return image, store


def _bundle(tmp_path, image, store, compress):
    out = tmp_path / compress
    write(out, [store.pulled(image, REF)], store, chunk_size=1024 * 1024, compress=compress)
    return out


def _read(source, digest):
    return b"".join(source.chunks(digest, source.slots[digest].member.size, "test"))


@pytest.mark.parametrize("compress", ["none", "gzip", "zstd"])
def test_every_blob_and_image_as_the_bundle_holds_them(tmp_path, image_and_store, compress):
    image, store = image_and_store
    source = BundleSource(_bundle(tmp_path, image, store, compress))
    [pulled] = source.images()
    assert (pulled.manifest_bytes, pulled.config_bytes) == (image.manifest_bytes, image.config_bytes)
    assert str(pulled.ref) == str(store.pulled(image, REF).ref) and pulled.index_digest is None
    blobs = {Digest.parse(d): data for d, data in image.blobs().items()}
    for digest in sorted(blobs, key=source.order.index):  # archive order: a compressed bundle's only one
        assert _read(source, digest) == blobs[digest]
    source.finish()
    assert source.path(Digest.parse(image.config_digest)) is None


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_a_compressed_bundle_hands_blobs_over_in_archive_order_only(tmp_path, image_and_store, compress):
    image, store = image_and_store
    source = BundleSource(_bundle(tmp_path, image, store, compress))
    source.images()
    layers = [d for d in source.order if source.slots[d].member.kind == "layer"]
    _read(source, layers[-1])
    with pytest.raises(OutOfOrder) as e:
        _read(source, layers[0])
    what = source.slots[layers[0]].member.what
    assert e.value.message == (f"bundle {compress} is {compress}-compressed: its blobs are read once, in archive "
                               f"order, and {what} (blob {layers[0].short}) lies behind the blob read last")
    source.rewind()  # a second pass, asked for: read from the start again
    assert Digest.of(_read(source, layers[0])) == layers[0]
    source.finish()


def test_a_damaged_blob_is_refused_before_its_last_chunk_with_its_parts_named(tmp_path, image_and_store):
    image, store = image_and_store
    out = _bundle(tmp_path, image, store, "none")
    source = BundleSource(out)
    biggest = max(source.order, key=lambda d: source.slots[d].member.size)
    slots = source.slots[biggest]
    tar_offset = slots.data_offset + slots.member.size // 2
    for part in parts_of(out):  # flip one byte in the middle of the blob, in whichever part holds it
        size = part.stat().st_size
        if tar_offset < size:
            data = bytearray(part.read_bytes())
            data[tar_offset] ^= 0xFF
            part.write_bytes(bytes(data))
            break
        tar_offset -= size
    got = []
    with pytest.raises(VerifyError) as e:
        for chunk in source.chunks(biggest, slots.member.size, "test"):
            got.append(chunk)
    assert sum(map(len, got)) < slots.member.size  # the consumer never holds the whole damaged blob
    held = sorted({s.part for s in source._files.catalog.spans(source._files.catalog.blobs[biggest])})
    where = f"part {held[0] + 1:03d}" if len(held) == 1 else f"parts {held[0] + 1:03d}-{held[-1] + 1:03d}"
    assert e.value.message == (f"{slots.member.what} (blob {biggest.short}) is damaged in the bundle ({where}): "
                               "its sha256 differs from its digest")
    assert e.value.hint == "run `imgtool verify` on the bundle and re-copy the parts it names"


@pytest.mark.parametrize("compress", ["none", "gzip"])
def test_a_missing_part_is_named(tmp_path, image_and_store, compress):
    image, store = image_and_store
    out = _bundle(tmp_path, image, store, compress)
    parts = parts_of(out)
    assert len(parts) >= 3
    parts[1].unlink()
    source = BundleSource(out)
    with pytest.raises(VerifyError) as e:
        source.images()
        for digest in source.order:
            _read(source, digest)
    assert e.value.message == (f"part 002 ({parts[1].name}) is missing; copy part 002 from the source medium")
