"""`imgtool verify`: every kind of damage named, with the exact lines a user sees."""

import json
import shutil

import pytest

from imgtool.bundle.reader import PartsStream, read_index
from imgtool.errors import VerifyError
from tests.support.bundles import BlobDir, damaged_part_line, imgtool, parts_holding, parts_of, write

REPO = "quay.io/ascend/vllm-ascend"


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A sound 4+-part bundle, copied fresh for each test that damages it."""
    from tests.support.images import ImageFactory

    root = tmp_path_factory.mktemp("verify")
    store = BlobDir(root / "blobs")
    f = ImageFactory("test_verify")
    base = f.layers(2)
    images = [store.pulled(f.image("arm64", layers=1, base=base), f"{REPO}:v0.22.0"),
              store.pulled(f.image("arm64", layers=1, base=base), f"{REPO}:v0.22.1rc1")]
    write(root / "bundle", images, store, chunk_size=1 << 20)
    assert len(parts_of(root / "bundle")) >= 4
    return root / "bundle"


@pytest.fixture
def bundle(template, tmp_path):
    out = tmp_path / "vllm-ascend-v0.22.1rc1-arm64"
    shutil.copytree(template, out)
    return out


def flip(path, offset=1000):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def err_lines(r):
    """stderr without the progress lines (plain mode prints one per bar when not a TTY)."""
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:", "warning:", "  - "))]


def test_sound_bundle(bundle):
    r = imgtool("verify", str(bundle))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"ok: {bundle}: 2 image(s); {len(parts_of(bundle))} parts, 10 blobs and 4 layer "
                            "diff_ids checked; ")
    assert f"  {REPO}:v0.22.0  linux/arm64/v8  ID " in r.stdout
    assert "unpacked size: " in r.stdout
    sha = json.loads(imgtool("verify", str(bundle), "--json").stdout)["bundle_json_sha256"]
    assert imgtool("verify", str(bundle), "--expect", sha).returncode == 0
    assert imgtool("verify", str(bundle), "--expect", "sha256:" + sha, "--quick").returncode == 0


@pytest.mark.parametrize("quick", [False, True])
def test_flipped_byte_names_that_part_only(bundle, quick):
    parts = parts_of(bundle)
    flip(parts[1])
    r = imgtool("verify", str(bundle), *(["--quick"] if quick else []))
    assert r.returncode == 3
    assert err_lines(r) == [
        f"error: bundle failed verification: {bundle}: 1 problem",
        damaged_part_line(bundle, 1),
    ]


def test_every_damaged_part_is_named_in_one_run(bundle):
    parts = parts_of(bundle)
    flip(parts[0])
    flip(parts[2], 5000)
    r = imgtool("verify", str(bundle))
    assert r.returncode == 3
    assert err_lines(r)[0] == f"error: bundle failed verification: {bundle}: 2 problems"
    assert [line.split(" (")[0] for line in err_lines(r)[1:]] == ["  - part 001", "  - part 003"]


def test_missing_part(bundle):
    parts = parts_of(bundle)
    parts[2].unlink()
    r = imgtool("verify", str(bundle))
    assert r.returncode == 3
    assert err_lines(r)[1] == f"  - part 003 ({parts[2].name}) is missing; copy part 003 from the source medium"
    assert len(err_lines(r)) == 2


def test_truncated_part(bundle):
    parts = parts_of(bundle)
    size = parts[3].stat().st_size
    with open(parts[3], "r+b") as f:
        f.truncate(size - 10)
    r = imgtool("verify", str(bundle), "--json")
    assert r.returncode == 3
    report = json.loads(r.stdout)
    assert report["ok"] is False
    assert report["problems"] == [{
        "message": f"part 004 ({parts[3].name}) is truncated: {size - 10} of {size} bytes; "
                   "re-copy part 004 from the source medium",
        "parts": [4], "kind": "problem"}]


def test_stray_file_is_a_warning(bundle):
    (bundle / "notes.txt").write_text("hello")
    r = imgtool("verify", str(bundle))
    assert r.returncode == 0
    assert "warning: unexpected file in the bundle directory: notes.txt (not part of the bundle; ignored)" \
        in err_lines(r)


def test_edited_bundle_json(bundle):
    doc = json.loads((bundle / "bundle.json").read_text())
    doc["images"][0]["source"] = "somewhere else"
    (bundle / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    r = imgtool("verify", str(bundle))
    assert r.returncode == 3
    assert err_lines(r)[1] == ("  - bundle.json does not match SHA256SUMS: it was changed after the fetch; "
                               "copy bundle.json and SHA256SUMS again from the source medium")


def test_wrong_expect(bundle):
    r = imgtool("verify", str(bundle), "--expect", "ab" * 32)
    assert r.returncode == 3
    assert err_lines(r)[1].startswith("  - bundle.json does not match --expect: its sha256 is ")
    assert err_lines(r)[1].endswith(", expected abababababababab...; this is not the published bundle, "
                                    "or bundle.json was changed")
    bad = imgtool("verify", str(bundle), "--expect", "nope")
    assert bad.returncode == 2
    assert err_lines(bad)[0] == "error: invalid --expect 'nope': give the sha256 of bundle.json (64 hex digits)"


def test_missing_or_unreadable_bundle_json(bundle, tmp_path):
    (bundle / "bundle.json").unlink()
    r = imgtool("verify", str(bundle))
    assert r.returncode == 3
    assert err_lines(r) == [
        f"error: incomplete bundle: {bundle} has no bundle.json (what made it did not finish, or bundle.json was "
        "not copied)",
        "hint: copy bundle.json from the source medium, or make the bundle again as it was made (imgtool fetch, "
        "export or copy)",
    ]
    (bundle / "bundle.json").write_text("{not json")
    r = imgtool("verify", str(bundle))
    assert r.returncode == 3 and err_lines(r)[0].startswith("error: bundle.json is malformed: not valid JSON")
    (bundle / "bundle.json").write_text('{"format": "imgtool-bundle", "version": 5}')
    r = imgtool("verify", str(bundle))
    assert err_lines(r) == ["error: bundle format version 5 is newer than this imgtool understands (4)",
                            "hint: upgrade imgtool on this host"]
    r = imgtool("verify", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and err_lines(r)[0] == f"error: no such bundle directory: {tmp_path / 'nowhere'}"


def test_part_names_cannot_escape_the_directory(bundle):
    doc = json.loads((bundle / "bundle.json").read_text())
    doc["parts"][0]["name"] = "../../etc/passwd"
    (bundle / "bundle.json").write_text(json.dumps(doc))
    r = imgtool("verify", str(bundle))
    assert r.returncode == 3
    assert err_lines(r)[0] == "error: bundle.json is malformed: `parts[0].name` is not a plain file name: " \
                              "'../../etc/passwd'"


@pytest.mark.parametrize("edit, problem", [
    (lambda im: im.update(layers=3), "`images[0].layers` is not a list"),
    (lambda im: im.pop("manifest_digest"), "`images[0].manifest_digest` is not a digest: None"),
    (lambda im: im.update(manifest_size=-1), "`images[0].manifest_size` is not a size: -1"),
    (lambda im: im.update(ref="v1"), "`images[0].ref` is not a canonical image reference: 'v1'"),
    (lambda im: im.update(platform=7), "`images[0].platform` is not a string"),
    (lambda im: im.update(platform="linux/sparc"), "`images[0].platform` is not a platform: 'linux/sparc'"),
    (lambda im: im["layers"][0].update(media_type="x"), "`images[0].layers[0].media_type` is not a layer type: 'x'"),
    (lambda im: im["layers"][1].update(omitted=True), "`images[0].layers[1].omitted` needs format version 2"),
    (lambda im: im["layers"][0].update(diff_id="sha512:" + "a" * 128),
     "`images[0].layers[0].diff_id`: only sha256 digests are supported"),
])
def test_bundle_json_image_errors_name_the_key(bundle, edit, problem):
    doc = json.loads((bundle / "bundle.json").read_text())
    doc["version"] = 1
    edit(doc["images"][0])
    (bundle / "bundle.json").write_text(json.dumps(doc))
    r = imgtool("verify", str(bundle))
    assert (r.returncode, err_lines(r)[0]) == (3, f"error: bundle.json is malformed: {problem}")


def test_bad_blob_inside_sound_parts(tmp_path, factory):
    """A cache blob damaged before bundling: the parts match bundle.json, only the deep check sees it."""
    store = BlobDir(tmp_path / "blobs")
    image = factory.image("arm64", layers=3)
    pulled = store.pulled(image, f"{REPO}:v1")
    victim = pulled.manifest.layers[2].digest
    data = bytearray(store.path(victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    store.path(victim).write_bytes(bytes(data))
    out = tmp_path / "b"
    # the writer checks cache blobs against their digests unless told they were just checked:
    # pretend so, to get a bundle with a bad blob inside sound parts
    write(out, [pulled], store, chunk_size=1 << 20, verified={victim})
    assert imgtool("verify", str(out), "--quick").returncode == 0  # parts are as written
    r = imgtool("verify", str(out))
    assert r.returncode == 3
    lines = err_lines(r)
    assert lines[1].startswith(f"  - layer 3 of {REPO}:v1 (blob {victim.short}) is damaged: its sha256 differs "
                               "from its digest; the bundle itself is bad: make it again as it was made (imgtool fetch, "
                               f"export or copy) ({parts_holding(out, victim)})")
    assert parts_holding(out, victim).startswith("in parts ")  # 1 MiB parts: a ~1 MiB layer spans two
    # gzip's own CRC catches the flipped byte before the diff_id comparison would
    assert lines[2].startswith(f"  - layer 3 of {REPO}:v1 (blob {victim.short}) cannot be decompressed: "
                               "not valid gzip data: damaged deflate data or CRC (in parts ")
    assert len(lines) == 3


def test_wrong_diff_id(tmp_path, factory):
    """A config whose diff_id does not match its layer: only decompressing the layer shows it."""
    from dataclasses import replace

    from imgtool.model import Digest, ImageConfig

    store = BlobDir(tmp_path / "blobs")
    pulled = store.pulled(factory.image("arm64", layers=2), f"{REPO}:v1")
    wrong = ImageConfig(pulled.config.platform, (pulled.config.diff_ids[0], Digest.of(b"not this")))
    out = tmp_path / "b"
    write(out, [replace(pulled, config=wrong)], store)
    r = imgtool("verify", str(out))
    assert r.returncode == 3
    assert err_lines(r)[1] == (f"  - layer 2 of {REPO}:v1 (blob {pulled.manifest.layers[1].digest.short}): its "
                               "uncompressed content does not match the diff_id in the image config; its blob "
                               "matches its digest, so the image is published this way (fetching again gives the "
                               f"same bytes): report it to the image's publisher "
                               f"({parts_holding(out, pulled.manifest.layers[1].digest)})")


def test_parts_stream_strict_stops_before_the_end_of_a_bad_part(template, tmp_path):
    """While streaming into Docker, a part that changed since the check raises before its last bytes."""
    out = tmp_path / "b"
    shutil.copytree(template, out)
    index, _ = read_index(out)
    flip(parts_of(out)[1])
    stream = PartsStream(out, index, strict=True)
    got = 0
    with pytest.raises(VerifyError) as e:
        while True:
            data = stream.read(64 * 1024)
            assert data
            got += len(data)
    assert got < index.parts[0].size + index.parts[1].size  # the end of part 2 was never handed out
    assert e.value.message.startswith("part 002 (")


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_damaged_compressed_bundle_ends_naming_the_part(tmp_path, factory, compress):
    """64 KiB overwritten mid-archive: the decoder fails inside a layer, and verify still ends (exit 3)."""
    store = BlobDir(tmp_path / "blobs")
    image = factory.image("arm64", layers=3, layer_size=[256 * 1024, 1 << 20, 256 * 1024])
    out = tmp_path / "b"
    write(out, [store.pulled(image, f"{REPO}:v1")], store, compress=compress)
    (part,) = parts_of(out)
    data = bytearray(part.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64 * 1024] = bytes(range(256)) * 256
    part.write_bytes(bytes(data))
    r = imgtool("verify", str(out), timeout=120)  # hung forever before: a worker waited for the rest of a layer
    assert r.returncode == 3, r.stderr
    assert err_lines(r) == [
        f"error: bundle failed verification: {out}: 1 problem",
        damaged_part_line(out, 0),
    ]


def as_unprivileged(*args: str):
    """imgtool run by root without the capabilities that bypass file permissions (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH), so a file's mode applies to it as to any user."""
    import subprocess
    import sys

    return subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m", "imgtool",
                           *args], capture_output=True, text=True, timeout=300)


def test_a_part_without_read_permission_is_named_as_that_not_as_damage(bundle):
    """Issue 35 case 10: a part this user may not read was called damaged ("re-copy it from the source medium"),
    which re-copying does not fix. Now it is named as a permission problem, with the path and what to do."""
    part = parts_of(bundle)[1]
    part.chmod(0)
    said = (f"part 002 ({part.name}) cannot be read by this user: permission denied (owner root, mode 0000): {part}; "
            f"it is not damaged: let this user read it (chmod a+r {part}, or chown it), or run as its owner")
    for quick in ((), ("--quick",)):
        r = as_unprivileged("verify", str(bundle), *quick)
        assert r.returncode == 3, r.stderr
        assert said in err_lines(r)[0] + "\n".join(err_lines(r)[1:]), (quick, r.stderr)
        assert "re-copy" not in r.stderr
    part.chmod(0o644)
    assert as_unprivileged("verify", str(bundle)).returncode == 0


def test_upstreams_index_is_kept_byte_for_byte_and_checked_against_its_digest(factory, tmp_path):
    """fetch keeps upstream's index in bundle.json (`upstream_indexes`, base64): the format version stays (old
    readers ignore the field), a bundle without one is written as before, and verify holds the bytes to the digest
    the images name."""
    import base64
    import hashlib

    from tests.test_sign import remake_sums

    store = BlobDir(tmp_path / "blobs")
    idx = factory.multiarch(("amd64", "arm64"), layers=1)
    arm = idx.image("arm64")
    write(tmp_path / "old", [store.pulled(arm, f"{REPO}:v3")], store)
    assert "upstream_indexes" not in json.loads((tmp_path / "old" / "bundle.json").read_text())
    out = tmp_path / "b"
    write(out, [store.pulled(arm, f"{REPO}:v3", index=idx)], store)
    doc = json.loads((out / "bundle.json").read_text())
    assert doc["version"] == 1 and doc["images"][0]["index_digest"] == idx.manifest_digest
    assert doc["upstream_indexes"] == [{"digest": idx.manifest_digest, "media_type": idx.manifest_media_type,
                                        "size": idx.manifest_size,
                                        "data": base64.b64encode(idx.manifest_bytes).decode()}]
    assert imgtool("verify", str(out)).returncode == 0

    changed = idx.manifest_bytes.replace(b"amd64", b"s390x")
    doc["upstream_indexes"][0].update(data=base64.b64encode(changed).decode())
    (out / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    remake_sums(out)  # bundle.json edited and SHA256SUMS made to match it: the digest still tells
    r = imgtool("verify", str(out))
    assert (r.returncode, err_lines(r)[0]) == (3, (
        f"error: bundle.json is malformed: `upstream_indexes[0].data` is not upstream's index {idx.manifest_digest}: "
        f"its {len(changed)} bytes have digest sha256:{hashlib.sha256(changed).hexdigest()}"))
    other = factory.multiarch(("amd64", "arm64"), layers=1)
    doc["upstream_indexes"][0] = {"digest": other.manifest_digest, "media_type": other.manifest_media_type,
                                  "size": other.manifest_size, "data": base64.b64encode(other.manifest_bytes).decode()}
    (out / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    remake_sums(out)
    r = imgtool("verify", str(out))
    assert (r.returncode, err_lines(r)[0]) == (3, (
        f"error: bundle.json is malformed: `upstream_indexes[0].digest` {other.manifest_digest} is no image's "
        "index_digest"))
