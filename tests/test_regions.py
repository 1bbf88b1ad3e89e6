"""Layers written once, straight into their regions in an uncompressed bundle's parts (bundle/regions.py, issue 38).

The source's side is played here by writing each layer through its `RegionPartial`, as the puller does; the fetch
end to end (a registry, a kill, a rerun, a later fetch copying from the bundle) is in test_fetch.py and
test_reliability.py."""

import hashlib
import json
from pathlib import Path

import pytest

from imgtool.bundle.regions import PLAN_NAME, RECORD_PREFIX
from imgtool.bundle.writer import regions_for, plan_bundle, prepare_regions, write_bundle
from imgtool.errors import VerifyError
from imgtool.model import Digest
from imgtool.progress import Progress
from imgtool.store import FileBlobs
from tests.support.bundles import BlobDir, random_layer, simple_image

CREATED = "2025-01-01T00:00:00Z"


@pytest.fixture
def pulled(tmp_path):
    blobs = BlobDir(tmp_path / "blobs")
    image = simple_image([random_layer(300_000, 1), random_layer(70_000, 2), random_layer(500_000, 3)])
    return blobs, [blobs.pulled(image, "quay.io/ascend/vllm-ascend:v1")]


def _place_all(regions, blobs: BlobDir) -> None:
    """What the download does: each layer's bytes into its partial in pieces, then committed by its digest."""
    for digest, (_, size) in regions.blobs.items():
        data = blobs.path(digest).read_bytes()
        partial = regions.partial(digest, size)
        for pos in range(0, size, 50_000):
            partial.write(pos, data[pos:pos + 50_000])
        partial.commit(hashlib.sha256(data).hexdigest())
        partial.close()
    regions.ended(None)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("chunk", [None, 128 << 10])
def test_a_bundle_of_placed_layers_is_the_bundle_written_through_the_writer_byte_for_byte(pulled, tmp_path, chunk):
    blobs, images = pulled
    common = dict(chunk_size=chunk, compress="none", force=False, progress=Progress(), created=CREATED)
    a = write_bundle(tmp_path / "a" / "vllm", images, FileBlobs(blobs.path), **common)
    regions = regions_for(plan_bundle(tmp_path / "b" / "vllm", images, None, chunk_size=chunk, compress="none"))
    prepare_regions(regions, force=False)
    if chunk:  # the layers cross parts: the regions split them
        assert len(regions.parts) == len(a.parts) > 3
    _place_all(regions, blobs)
    b = write_bundle(tmp_path / "b" / "vllm", images, FileBlobs(blobs.path), regions=regions, **common)
    regions.close()
    assert [(p.name, p.size, p.sha256) for p in b.parts] == [(p.name, p.size, p.sha256) for p in a.parts]
    assert [_sha256(b.dir / p.name) for p in b.parts] == [p.sha256 for p in a.parts]
    assert (b.dir / "bundle.json").read_bytes() == (a.dir / "bundle.json").read_bytes()
    assert sorted(p.name for p in b.dir.iterdir()) == sorted(p.name for p in a.dir.iterdir())  # no records


def test_an_unfinished_bundle_is_resumed_for_the_same_plan_even_with_force_and_started_over_for_another(
        pulled, tmp_path):
    blobs, images = pulled
    out = tmp_path / "vllm"
    regions = regions_for(plan_bundle(out, images, None, chunk_size=256 << 10, compress="none"))
    prepare_regions(regions, force=False)
    digest, (_, size) = next(iter(regions.blobs.items()))
    data = blobs.path(digest).read_bytes()
    half = regions.partial(digest, size)
    half.write(0, data[:size // 2])
    half.close()
    regions.close()
    assert regions.partial_bytes(digest, size) == size // 2

    again = regions_for(plan_bundle(out, images, None, chunk_size=256 << 10, compress="none"))
    assert again.resumable()
    prepare_regions(again, force=True)  # --force on an unfinished run of the same plan: resumed, not cleared
    resumed = again.partial(digest, size)
    assert resumed.missing() == [(size // 2, size)]
    assert b"".join(resumed.read_range(0, size // 2)) == data[:size // 2]
    resumed.close()
    again.close()

    other = regions_for(plan_bundle(out, images, None, chunk_size=100 << 10, compress="none"))
    assert not other.resumable()
    prepare_regions(other, force=False)  # another plan: the unfinished directory starts over
    assert other.partial_bytes(digest, size) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([PLAN_NAME, *other.part_names])
    assert json.loads((out / PLAN_NAME).read_text()) == other.layout
    other.close()


def test_a_placed_layer_of_wrong_bytes_is_refused_and_its_record_dropped(pulled, tmp_path):
    blobs, images = pulled
    regions = regions_for(plan_bundle(tmp_path / "vllm", images, None, chunk_size=None, compress="none"))
    prepare_regions(regions, force=False)
    digest, (_, size) = next(iter(regions.blobs.items()))
    partial = regions.partial(digest, size)
    partial.write(0, bytes(size))
    with pytest.raises(VerifyError) as e:
        partial.commit(hashlib.sha256(bytes(size)).hexdigest())
    assert e.value.message == f"blob {digest} arrived with digest {Digest.of(bytes(size))}"
    assert not list((tmp_path / "vllm").glob(RECORD_PREFIX + "*"))
    assert regions.partial(digest, size).missing() == [(0, size)]  # downloaded again from the first byte
    regions.close()


def test_a_finished_bundle_is_cleared_by_force_before_layers_are_placed(pulled, tmp_path):
    blobs, images = pulled
    out = tmp_path / "vllm"
    write_bundle(out, images, FileBlobs(blobs.path), chunk_size=None, compress="none", force=False,
                 progress=Progress(), created=CREATED)
    (out / "notes.txt").write_text("mine")
    regions = regions_for(plan_bundle(out, images, None, chunk_size=None, compress="none"))
    warnings = prepare_regions(regions, force=True)
    regions.close()
    assert not (out / "bundle.json").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([PLAN_NAME, *regions.part_names, "notes.txt"])
    assert warnings == [f"{out}: left 1 other file(s) in place: notes.txt"]
