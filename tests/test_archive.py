"""bundle/archive.py: the one forward reader of a bundle's archive, in each of its modes, on the same deviations.

Each bundle here is edited as a hostile maker would (tests.support.bundles.rewrite_parts, replace_archive: every
size and sum in bundle.json and SHA256SUMS agrees): only reading the archive can tell.
"""

import gzip
import io
import tarfile

import pytest

from imgtool.bundle.archive import REMADE, Archive, walk_archive
from imgtool.bundle.inplace import unpack_archive
from imgtool.bundle.reader import read_index
from imgtool.ends.bundle_source import BundleSource
from imgtool.errors import VerifyError
from imgtool.pipeline import Plan
from imgtool.progress import Progress
from tests.support.bundles import (BlobDir, canonical_tar, parts_of, random_layer, replace_archive, rewrite_parts,
                                   simple_image, tar_body, write)

REF = "quay.io/ascend/vllm-ascend:v1"


def _bundle(tmp_path, compress: str):
    store = BlobDir(tmp_path / "blobs")
    image = simple_image([random_layer(300_000, 1), random_layer(2_000_000, 2)])
    out = tmp_path / compress
    write(out, [store.pulled(image, REF)], store, compress=compress)
    return out


def _flipped(bundle):
    """The bundle with the middle byte of its biggest layer flipped, as its only uncompressed part; that layer's
    slot."""
    tar = bytearray(canonical_tar(bundle))
    index, _ = read_index(bundle)
    with Archive(bundle, index, fail=VerifyError) as archive:
        slot = max((p for p in archive.slots if p.member.kind == "layer"), key=lambda p: p.member.size)
    tar[slot.data_offset + slot.member.size // 2] ^= 0xFF
    replace_archive(bundle, tar_body(bytes(tar)))
    return slot


def test_strict_collects_the_damaged_member_and_reads_on(tmp_path):
    out = _bundle(tmp_path, "none")
    slot = _flipped(out)
    index, _ = read_index(out)
    result, parts = walk_archive(out, index, diff_ids=True, jobs=2)
    m = slot.member
    assert [p.message for p in result.problems] == [
        f"{m.what} (blob {m.digest.short}) is damaged: its sha256 differs from its digest; {REMADE} (in part 001)",
        f"{m.what} (blob {m.digest.short}) cannot be decompressed: not valid gzip data: damaged deflate data or CRC "
        "(in part 001)"]
    assert (result.blobs_checked, result.layers_checked, parts.bad) == (5, 1, [])  # both manifests, config, layers


def test_hand_over_inline_holds_the_last_chunk_until_the_digest_matched(tmp_path):
    out = _bundle(tmp_path, "none")
    slot = _flipped(out)
    index, _ = read_index(out)
    got = []
    with Archive(out, index, fail=VerifyError) as archive, pytest.raises(VerifyError) as e:
        for data in archive.blob(slot):
            got.append(data)
    assert sum(map(len, got)) < slot.member.size  # the consumer never holds the whole damaged blob
    m = slot.member
    assert e.value.message == (f"{m.what} (blob {m.digest.short}) is damaged: its sha256 differs from its digest; "
                               f"{REMADE} (in part 001)")


def test_hand_over_deferred_hands_everything_and_settles_at_the_end(tmp_path):
    out = _bundle(tmp_path, "none")
    slot = _flipped(out)
    index, _ = read_index(out)
    with Archive(out, index, fail=VerifyError, digests="deferred") as archive:
        assert sum(map(len, archive.blob(slot))) == slot.member.size  # hashed beside the consumer
        with pytest.raises(VerifyError) as e:
            archive.to_end()
    m = slot.member
    assert e.value.message == (f"{m.what} (blob {m.digest.short}) is damaged: its sha256 differs from its digest; "
                               f"{REMADE} (in part 001)")


def _tar(bundle) -> bytes:
    """A gzip bundle's tar: its parts are many gzip members (canonical_tar's zlib reads the first only)."""
    return gzip.decompress(b"".join(p.read_bytes() for p in parts_of(bundle)))


def _gzip_then(bundle, extra: bytes = b"", inside: bytes = b"") -> None:
    """The gzip bundle's archive compressed again with `inside` after the tar (in the gzip stream) and `extra`
    after the gzip stream's end."""
    rewrite_parts(bundle, gzip.compress(_tar(bundle) + inside, mtime=0) + extra)


@pytest.mark.parametrize("edit", ["after the gzip stream", "inside the gzip stream"])
def test_bytes_after_the_archive_are_refused_in_every_mode(tmp_path, edit):
    """The helper's finding (issue 47): `copy bundle: bundle:` and `push` read a compressed archive only up to its
    last blob, so bytes after it were copied and pushed while verify and load refused them; and verify let zeros
    after the tar's end through when they were inside the compressed stream."""
    out = _bundle(tmp_path, "gzip")
    if edit == "after the gzip stream":
        _gzip_then(out, extra=b"not gzip data after the last member")
        said = "the archive cannot be decompressed: not valid gzip data: "
    else:
        _gzip_then(out, inside=bytes(512))
        index, _ = read_index(out)
        said = f"the archive is longer than bundle.json says: it goes on after byte {index.archive.tar_size}"
    index, _ = read_index(out)
    result, _ = walk_archive(out, index, diff_ids=False, jobs=2)  # strict: verify
    assert [p.message.startswith(said) and p.message.endswith(" (in the compressed archive)")
            for p in result.problems] == [True], result.problems

    source = BundleSource(out)  # rewindable, inline: copy bundle: bundle:, push
    source.images()
    layers = [d for d in source.order if source.slots[d].member.kind == "layer"]
    source.start(Plan(tuple(source.images()), tuple(layers), frozenset(), None))
    last = layers[-1]
    for digest in layers[:-1]:
        b"".join(source.chunks(digest, source.slots[digest].member.size, "test"))
    got = []
    with pytest.raises(VerifyError) as e:
        for data in source.chunks(last, source.slots[last].member.size, "test"):
            got.append(data)
    source.finish()
    assert sum(map(len, got)) < source.slots[last].member.size  # the last blob's last chunk never went out
    assert e.value.message.startswith(f"cannot read {out}: {said}")
    assert e.value.hint == "run `imgtool verify` on the bundle and re-copy the parts it names"

    skipping = BundleSource(out)  # a destination that reads no blob (it holds them all): checked at start
    images = skipping.images()
    with pytest.raises(VerifyError) as e:
        skipping.start(Plan(tuple(images), (), frozenset(layers), None))
    skipping.finish()
    assert e.value.message.startswith(f"cannot read {out}: {said}")

    with pytest.raises(VerifyError) as e:  # tee: serve --unpack-to
        unpack_archive(out, index, tmp_path, Progress())
    assert e.value.message.startswith(f"cannot unpack {out}: {said}")
    assert list(tmp_path.glob("*.tar")) == list(tmp_path.glob(".*.partial")) == []


def test_tee_writes_the_archive_byte_for_byte(tmp_path):
    out = _bundle(tmp_path, "gzip")
    index, _ = read_index(out)
    unpacked = unpack_archive(out, index, tmp_path, Progress())
    assert unpacked.read_bytes() == _tar(out)


def test_a_member_out_of_place_is_named(tmp_path):
    """Two members swapped, each whole and at its size: verify let it through (it looked members up by name);
    load refused it. The one reader names it in every mode."""
    out = _bundle(tmp_path, "none")
    tar = canonical_tar(out)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        first, second = t.getmembers()[:2]
    a = tar[first.offset:second.offset]
    b_end = second.offset_data + second.size + (-second.size % 512)
    b = tar[second.offset:b_end]
    replace_archive(out, tar_body(tar[:first.offset] + b + a + tar[b_end:]))
    index, _ = read_index(out)
    result, _ = walk_archive(out, index, diff_ids=False, jobs=2)
    assert [p.message for p in result.problems] == [
        f"archive member {first.name} is out of order: bundle.json puts it before {second.name} (in part 001)"]
    with Archive(out, index, fail=VerifyError) as archive, pytest.raises(VerifyError) as e:
        archive.to_end()
    assert e.value.message == f"the archive lacks {first.name} ({archive.slots[0].member.what}) (in part 001)"


# --- passed over: load's placement of an uncompressed bundle's model files (the placer copies and checks them) ---

def _model_bundle(tmp_path):
    from tests.support.bundles import put_model, write
    from tests.support.models import small_model

    store = BlobDir(tmp_path / "blobs")
    out = tmp_path / "model-bundle"
    write(out, [], store, models=[put_model(store, small_model(seed=4801))], chunk_size=24 << 10)
    return out, store


def _region_bytes(regions) -> bytes:
    out = b""
    for path, offset, length in regions.regions:
        with open(path, "rb") as f:
            f.seek(offset)
            out += f.read(length)
    return out


def test_a_model_member_passed_over_is_handed_as_where_it_lies_and_its_data_is_not_read(tmp_path):
    """Its data damaged in the part: the archive (which does not read it) goes to its end without a word; the regions
    it hands over hold exactly the member's bytes, damage and all, for the placer to check."""
    from imgtool.bundle.landing import Cut
    from tests.support.bundles import damage_member

    bundle, store = _model_bundle(tmp_path)
    index, _ = read_index(bundle)
    weights = [p for p in Archive(bundle, index).slots if p.member.kind == "model"]
    biggest = max(weights, key=lambda p: p.member.size).member
    damage_member(bundle, str(biggest.digest))
    with Archive(bundle, index, fail=Cut, digests="deferred", hash_parts=False) as archive:
        assert archive.can_pass_over
        handed = {}
        for p in weights:
            handed[p.member.digest] = archive.passed_over(p)
        archive.to_end()  # the deferred digests hold no model member: nothing raised
    assert any(len(r.regions) == 2 for r in handed.values())  # a member spanning two parts, handed in two regions
    for digest, regions in handed.items():
        good = store.path(digest).read_bytes()
        got = _region_bytes(regions)
        assert len(got) == len(good) == regions.size
        assert (got == good) == (digest != biggest.digest)


def test_a_model_member_whose_header_differs_is_refused_though_its_data_is_passed_over(tmp_path):
    from imgtool.bundle.landing import Cut

    bundle, _ = _model_bundle(tmp_path)
    index, _ = read_index(bundle)
    archive = Archive(bundle, index, fail=Cut, digests="deferred", hash_parts=False)
    slot = next(p for p in archive.slots if p.member.kind == "model")
    archive.close()
    sizes = [p.stat().st_size for p in parts_of(bundle)]
    at, i = slot.offset + 100, 0  # the header's mode field
    while at >= sizes[i]:
        at -= sizes[i]
        i += 1
    data = bytearray(parts_of(bundle)[i].read_bytes())
    data[at] = ord("7") if data[at] != ord("7") else ord("6")
    parts_of(bundle)[i].write_bytes(bytes(data))
    with Archive(bundle, index, fail=Cut, digests="deferred", hash_parts=False) as archive:
        with pytest.raises(Cut) as e:
            archive.passed_over(slot)
    assert e.value.message.startswith(f"the archive is damaged: no valid tar header at byte {slot.offset} (in part ")
