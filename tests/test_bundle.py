"""The bundle writer: layout, parts, checksums, load.sh, reproducibility, failures while writing.

Bundles are written from factory images (tests/support/images.py) through the core API, and
checked with the tools a user has: docker load, sha256sum, sh load.sh, skopeo, tar.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from imgtool.bundle.writer import check_output_dir, default_bundle_name
from imgtool.errors import ImgtoolError, UsageError
from tests.support.bundles import BlobDir, imgtool, parts_of, reassemble, sums_damaged, write
from tests.support.images import host_arch

REPO = "quay.io/ascend/vllm-ascend"
REMEDY = ("upgrade Docker to 23.0 or later, or fetch the image again with imgtool fetch --layers compat (the default), "
          "which rewrites zstd layers as gzip: this bundle kept the registry's zstd bytes")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path):
    return BlobDir(tmp_path / "blobs")


def _env(services):
    return {**{k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")},
            "DOCKER_HOST": services.docker_host}


@pytest.mark.engines
def test_multipart_bundle_loads_with_plain_docker_load(factory, store, tmp_path, services, docker_cli,
                                                       docker_cleanup):
    image = factory.image(host_arch(), layers=3)
    pulled = store.pulled(image, f"{REPO}:v0.22.1rc1")
    out = tmp_path / "vllm-ascend-v0.22.1rc1"
    result = write(out, [pulled], store, chunk_size=700 * 1024)
    parts = parts_of(out)
    assert len(parts) >= 4 and [p.name for p in parts] == sorted(p.name for p in parts)
    assert parts[0].name == "vllm-ascend-v0.22.1rc1.tar.part001"
    assert all(p.stat().st_size == 700 * 1024 for p in parts[:-1])
    assert result.bundle_json_sha256 == hashlib.sha256((out / "bundle.json").read_bytes()).hexdigest()
    assert sorted(x.name for x in out.iterdir()) == sorted(
        [p.name for p in parts] + ["bundle.json", "SHA256SUMS", "load.sh", "README.txt"])

    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == len(parts) + 3

    before = docker_cli.image_ids()
    docker_cleanup.image(f"{REPO}:v0.22.1rc1", image.config_digest)
    cat = subprocess.run(f"cat {' '.join(p.name for p in parts)} | docker load", shell=True, cwd=out,
                         capture_output=True, text=True, env=_env(services))
    assert cat.returncode == 0, cat.stderr
    assert f"Loaded image: {REPO}:v0.22.1rc1" in cat.stdout
    assert docker_cli.holds(f"{REPO}:v0.22.1rc1", image) and str(pulled.image_id) == image.config_digest
    assert set(docker_cli.image_ids()) - set(before) == {docker_cli.bundle_id(image)}


def test_bundle_json_describes_images_archive_and_parts(factory, store, tmp_path):
    image = factory.image("arm64", layers=2, media="oci")
    pulled = store.pulled(image, f"{REPO}:v1", source="daocloud (https://m.daocloud.io)")
    result = write(tmp_path / "b", [pulled], store, chunk_size=1 << 20)
    doc = json.loads((tmp_path / "b" / "bundle.json").read_text())
    assert doc["format"] == "imgtool-bundle" and doc["version"] == 1
    assert doc["created"] == "2025-01-01T00:00:00Z" and doc["imgtool_version"]
    (entry,) = doc["images"]
    assert entry["ref"] == f"{REPO}:v1"
    assert entry["source"] == "daocloud (https://m.daocloud.io)"
    assert entry["platform"] == "linux/arm64/v8"
    assert entry["manifest_digest"] == image.manifest_digest
    assert entry["image_id"] == image.config_digest
    assert [(x["digest"], x["size"], x["diff_id"]) for x in entry["layers"]] == \
        [(x.digest, x.size, x.diff_id) for x in image.layers]
    assert doc["archive"]["name"] == "b.tar" and doc["archive"]["compression"] == "none"
    joined = b"".join(p.read_bytes() for p in parts_of(tmp_path / "b"))
    assert doc["archive"]["size"] == len(joined) == doc["archive"]["tar_size"]
    assert doc["archive"]["sha256"] == hashlib.sha256(joined).hexdigest() == result.archive.sha256
    for part in doc["parts"]:
        data = (tmp_path / "b" / part["name"]).read_bytes()
        assert part["size"] == len(data) and part["sha256"] == hashlib.sha256(data).hexdigest()
    assert [f["name"] for f in doc["files"]] == ["load.sh", "README.txt"]


def test_one_part_is_the_archive_itself(factory, store, tmp_path):
    pulled = store.pulled(factory.image("amd64", layers=1), f"{REPO}:v1")
    write(tmp_path / "one", [pulled], store)
    assert [p.name for p in parts_of(tmp_path / "one")] == ["one.tar"]
    tarfile.open(tmp_path / "one" / "one.tar").getnames()  # a plain tar: `docker load -i one.tar` works


def test_archive_is_docker_archive_and_oci_layout_with_fixed_metadata(factory, store, tmp_path):
    image = factory.image("arm64", layers=2)  # Docker v2 manifest
    pulled = store.pulled(image, f"{REPO}:v0.22.1rc1")
    write(tmp_path / "b", [pulled], store, chunk_size=512 * 1024)
    tar_path = reassemble(tmp_path / "b", tmp_path / "all.tar")
    with tarfile.open(tar_path) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names)
        for m in members:
            assert m.isreg() and m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.mode == 0o644
            assert m.uname == "" and m.gname == ""
        manifest = json.load(tar.extractfile("manifest.json"))
        index = json.load(tar.extractfile("index.json"))
        assert json.load(tar.extractfile("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    assert manifest == [{"Config": f"blobs/sha256/{image.config_digest[7:]}",
                         "RepoTags": [f"{REPO}:v0.22.1rc1"],
                         "Layers": [f"blobs/sha256/{x.digest[7:]}" for x in image.layers]}]
    (entry,) = index["manifests"]
    assert entry["annotations"] == {"io.containerd.image.name": f"{REPO}:v0.22.1rc1",
                                    "org.opencontainers.image.ref.name": "v0.22.1rc1"}
    # the registry's own manifest is kept under its digest; index.json names its OCI twin
    assert f"blobs/sha256/{image.manifest_digest[7:]}" in names
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert f"blobs/sha256/{entry['digest'][7:]}" in names

    inspect = subprocess.run(["skopeo", "inspect", f"oci-archive:{tar_path}:v0.22.1rc1"],
                             capture_output=True, text=True)
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["Architecture"] == "arm64"
    assert json.loads(inspect.stdout)["Layers"] == [x.digest for x in image.layers]
    config = subprocess.run(["skopeo", "inspect", "--config", f"oci-archive:{tar_path}:v0.22.1rc1"],
                            capture_output=True, text=True)
    assert config.returncode == 0, config.stderr
    assert json.loads(config.stdout)["rootfs"]["diff_ids"] == [x.diff_id for x in image.layers]


def test_oci_manifest_images_are_named_by_their_own_digest(factory, store, tmp_path):
    image = factory.image("arm64", layers=1, media="oci")
    write(tmp_path / "b", [store.pulled(image, f"{REPO}:v2")], store)
    tar_path = reassemble(tmp_path / "b", tmp_path / "all.tar")
    r = subprocess.run(["skopeo", "inspect", f"oci-archive:{tar_path}:v2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["Digest"] == image.manifest_digest


@pytest.mark.engines(stores=True)
def test_shared_layers_are_stored_once(factory, store, tmp_path, docker_cli, docker_cleanup):
    base = factory.layers(2)
    a = factory.image(host_arch(), layers=1, base=base)
    b = factory.image(host_arch(), layers=1, base=base)
    images = [store.pulled(a, f"{REPO}:v0.22.0"), store.pulled(b, f"{REPO}:v0.22.1rc1")]
    result = write(tmp_path / "b", images, store, chunk_size=1 << 20)
    with tarfile.open(reassemble(tmp_path / "b", tmp_path / "all.tar")) as tar:
        blobs = [n for n in tar.getnames() if n.startswith("blobs/")]
    layer_blobs = {x.digest[7:] for x in a.layers + b.layers}
    assert len(layer_blobs) == 4 and len(blobs) == len(set(blobs))
    assert {n.rsplit("/", 1)[1] for n in blobs} >= layer_blobs
    # 4 layers, 2 configs, 2 registry manifests + 2 OCI twins
    assert result.blobs == len(blobs) == 10
    assert default_bundle_name(images) == f"vllm-ascend-v0.22.0+v0.22.1rc1-{host_arch()}"

    docker_cleanup.image(f"{REPO}:v0.22.0", f"{REPO}:v0.22.1rc1", a.config_digest, b.config_digest)
    docker_cli("load", input=(tmp_path / "all.tar").read_bytes())
    assert docker_cli.holds(f"{REPO}:v0.22.0", a)
    assert docker_cli.holds(f"{REPO}:v0.22.1rc1", b)


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
@pytest.mark.engines(stores=True)
def test_compressed_bundles_load(compress, factory, store, tmp_path, services, docker_cli, docker_cleanup):
    image = factory.image(host_arch(), layers=2)
    out = tmp_path / "b"
    result = write(out, [store.pulled(image, f"{REPO}:c-{compress}")], store, chunk_size=600 * 1024,
                   compress=compress)
    suffix = {"gzip": ".tar.gz", "zstd": ".tar.zst"}[compress]
    assert result.archive.name == "b" + suffix and len(result.parts) >= 2
    assert result.archive.tar_size > 0
    docker_cleanup.image(f"{REPO}:c-{compress}", image.config_digest)
    # load.sh decompresses with gzip -dc / zstd -dc and pipes into docker load
    r = subprocess.run(["sh", "load.sh"], cwd=out, capture_output=True, text=True, env=_env(services))
    assert r.returncode == 0, r.stderr
    assert docker_cli.holds(f"{REPO}:c-{compress}", image)


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
@pytest.mark.engines(stores=True)
def test_compressed_bundles_load_with_imgtool_and_a_damaged_last_part_loads_nothing(
        compress, factory, store, tmp_path, services, docker_cli, docker_cleanup):
    image = factory.image(host_arch(), layers=2)
    out = tmp_path / "b"
    result = write(out, [store.pulled(image, f"{REPO}:i-{compress}")], store, chunk_size=600 * 1024,
                   compress=compress)
    assert len(result.parts) >= 2
    docker_cleanup.image(f"{REPO}:i-{compress}", image.config_digest)
    last = parts_of(out)[-1]
    good = last.read_bytes()
    last.write_bytes(good[:-1] + bytes([good[-1] ^ 0x01]))  # the compressed stream's last byte
    before = docker_cli.image_ids()
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 3, r.stderr
    n = len(result.parts)
    assert f"  - part {n:03d} ({last.name}) is damaged: its sha256 differs from bundle.json; re-copy part " \
           f"{n:03d} from the source medium" in r.stderr.splitlines(), r.stderr
    assert docker_cli.image_ids() == before
    last.write_bytes(good)
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    assert docker_cli.holds(f"{REPO}:i-{compress}", image)


@pytest.mark.engines
def test_load_sh_loads_and_names_damaged_parts(factory, store, tmp_path, services, docker_cli, docker_cleanup):
    image = factory.image(host_arch(), layers=2)
    out = tmp_path / "b"
    write(out, [store.pulled(image, f"{REPO}:sh")], store, chunk_size=512 * 1024)
    help_ = subprocess.run(["sh", str(out / "load.sh"), "--help"], capture_output=True, text=True)
    assert help_.returncode == 0 and help_.stdout.startswith("usage: sh load.sh")

    parts = parts_of(out)
    data = bytearray(parts[1].read_bytes())
    data[100] ^= 0xFF
    good = parts[1].read_bytes()
    parts[1].write_bytes(bytes(data))
    before = docker_cli.image_ids()
    r = subprocess.run(["sh", str(out / "load.sh")], capture_output=True, text=True, env=_env(services))
    assert r.returncode == 3
    assert r.stderr.splitlines()[1:4] == sums_damaged(parts[1].name)
    assert docker_cli.image_ids() == before

    parts[1].write_bytes(good)
    docker_cleanup.image(f"{REPO}:sh", image.config_digest)
    r = subprocess.run(["sh", str(out / "load.sh")], capture_output=True, text=True, env=_env(services))
    assert r.returncode == 0, r.stderr
    assert docker_cli.holds(f"{REPO}:sh", image)


def test_bundles_are_reproducible(factory, store, tmp_path):
    images = [store.pulled(factory.image("arm64", layers=2), f"{REPO}:v1")]
    a = write(tmp_path / "same", images, store, chunk_size=300 * 1024)
    os.rename(tmp_path / "same", tmp_path / "first")
    b = write(tmp_path / "same", images, store, chunk_size=300 * 1024)
    assert a.bundle_json_sha256 == b.bundle_json_sha256
    assert [p.sha256 for p in a.parts] == [p.sha256 for p in b.parts]
    assert (tmp_path / "first" / "SHA256SUMS").read_bytes() == (tmp_path / "same" / "SHA256SUMS").read_bytes()


def test_readme_is_bilingual_and_names_the_images(factory, store, tmp_path):
    write(tmp_path / "b", [store.pulled(factory.image("arm64", layers=1), f"{REPO}:v1")], store)
    text = (tmp_path / "b" / "README.txt").read_text()
    assert f"{REPO}:v1" in text and "linux/arm64/v8" in text
    assert "Load it" in text and "导入" in text and "invalid tar header" in text


def test_existing_output_is_refused_unless_force(factory, store, tmp_path):
    images = [store.pulled(factory.image("arm64", layers=1), f"{REPO}:v1")]
    out = tmp_path / "b"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError) as e:
        write(out, images, store)
    assert e.value.message == f"output directory {out} already exists and is not empty"
    assert e.value.hint == "choose another --output, or pass --force to replace the bundle in it"
    assert e.value.exit_code == 2
    with pytest.raises(UsageError):
        check_output_dir(out / "notes.txt", force=True)

    first = write(out, images, store, chunk_size=200 * 1024, force=True)
    assert (out / "notes.txt").read_text() == "mine"  # --force replaces only bundle files
    assert first.warnings == [f"{out}: left 1 other file(s) in place: notes.txt"]
    second = write(out, images, store, force=True)  # fewer parts now: the old ones are gone
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["notes.txt", "bundle.json", "SHA256SUMS", "load.sh", "README.txt", second.parts[0].name])


def test_failure_while_writing_leaves_no_bundle(factory, store, tmp_path):
    images = [store.pulled(factory.image("arm64", layers=3), f"{REPO}:v1")]
    victim = images[0].manifest.layers[1].digest
    store.path(victim).write_bytes(b"short")  # the cache lost bytes: the writer notices the size
    out = tmp_path / "b"
    with pytest.raises(ImgtoolError) as e:
        write(out, images, store, chunk_size=200 * 1024)
    assert e.value.message == (f"blob {victim} (layer 2 of {REPO}:v1) in the cache is 5 bytes, "
                               f"expected {images[0].manifest.layers[1].size}")
    assert list(out.iterdir()) == []


def test_a_damaged_cache_blob_is_caught_on_the_way_into_the_bundle(factory, store, tmp_path):
    """The cache does not fsync its blobs: one torn by a power cut must never be bundled."""
    images = [store.pulled(factory.image("arm64", layers=3), f"{REPO}:v1")]
    victim = images[0].manifest.layers[2].digest
    data = bytearray(store.path(victim).read_bytes())
    data[len(data) // 3] ^= 0x10
    store.path(victim).write_bytes(bytes(data))
    out = tmp_path / "b"
    with pytest.raises(ImgtoolError) as e:
        write(out, images, store, chunk_size=200 * 1024)
    assert e.value.message == (f"blob {victim} (layer 3 of {REPO}:v1) in the cache does not match its digest: "
                               f"{store.path(victim)}")
    assert e.value.hint == "remove that file (or the whole cache) and fetch again"
    assert list(out.iterdir()) == []


KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from imgtool.progress import Bar, Progress
    from tests.support.bundles import BlobDir, write
    from tests.support.images import ImageFactory

    class Killer(Bar):
        seen = 0
        def update(self, n):
            Killer.seen += n
            if Killer.seen > 1_500_000:
                os.kill(os.getpid(), signal.SIGKILL)  # like a power cut or `kill -9` mid-write

    class P(Progress):
        def bar(self, total, desc, unit="B"):
            return Killer()

    store = BlobDir(Path({blobs!r}))
    image = ImageFactory("kill").image("arm64", layers=3)
    from imgtool.bundle.writer import write_bundle
    from imgtool.store import FileBlobs
    write_bundle(Path({out!r}), [store.pulled(image, "quay.io/ascend/vllm-ascend:v1")], FileBlobs(store.path),
                 chunk_size=256 * 1024, compress="none", force=False, progress=P())
""")


def test_killed_write_leaves_no_bundle_json(tmp_path):
    out = tmp_path / "b"
    code = KILLER.format(root=str(ROOT), blobs=str(tmp_path / "blobs"), out=str(out))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    left = sorted(p.name for p in out.iterdir())
    assert left and all(".part" in name for name in left)  # parts so far, never bundle.json
    v = imgtool("verify", str(out))
    assert v.returncode == 3
    assert v.stderr.splitlines()[0] == (f"error: incomplete bundle: {out} has no bundle.json (what made it did not "
                                        "finish, or bundle.json was not copied)")


def test_disk_full_is_one_error_and_no_bundle(factory, store, tiny_tmpfs):
    images = [store.pulled(factory.image("arm64", layers=3), f"{REPO}:v1")]
    out = tiny_tmpfs / "b"
    with pytest.raises(ImgtoolError) as e:
        write(out, images, store, chunk_size=256 * 1024)
    assert e.value.message.startswith(f"no space left on the device of {out} (the bundle needs about ")
    assert e.value.message.endswith("); nothing was kept")
    assert e.value.hint == "free space there, or choose another --output"
    assert e.value.exit_code == 1
    assert list(out.iterdir()) == []


def test_unwritable_output_is_one_error(factory, store, tmp_path):
    images = [store.pulled(factory.image("arm64", layers=1), f"{REPO}:v1")]
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        with pytest.raises(ImgtoolError) as e:
            write(ro / "b", images, store)
        assert e.value.message == f"cannot create the bundle in {ro / 'b'}: Read-only file system: {ro / 'b'}"
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def _mirrors(tmp_path, services, ms):
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    return cfg


def test_fetch_onto_a_full_disk_is_one_line_and_no_bundle(services, factory, mirrored, tiny_tmpfs, tmp_path):
    idx = factory.multiarch(media="oci", layers=3)
    ms = mirrored(idx, tag="v0.22.1rc1", targets=("upstream",))
    out = tiny_tmpfs / "b"
    # room for what fetch's space check counts (the blobs) and a page more, not for the tar headers and
    # side files: the check lets it start, and the disk fills while the bundle is written
    arm = idx.image("arm64")
    room = sum(x.size for x in arm.layers) + arm.config_size + 4096
    subprocess.run(["mount", "-o", f"remount,size={room}", str(tiny_tmpfs)], check=True)
    r = imgtool("fetch", "v0.22.1rc1", "--arch", "arm64", "--mirrors", str(_mirrors(tmp_path, services, ms)),
                "-o", str(out), "--chunk-size", "1M", "-q", "--no-tool", env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"error: no space left on the device of {out} (the bundle needs about {r.stderr.split('about ')[1].split(')')[0]}); "
        "nothing was kept",
        "hint: free space there, or choose another --output",
    ]
    assert not out.exists()  # made by this fetch (its lock, dirlock.py) and left empty: removed with the lock


@pytest.mark.engines(stores=True)
def test_zstd_layers_are_faq_19_and_refused_before_docker_on_docker_before_23(
        factory, store, tmp_path, engine, services, docker_cli, docker_cleanup):
    """vllm-ascend FAQ 19's `invalid tar header` is a zstd layer on Docker < 23 (not a wrong
    architecture): load.sh, imgtool load and doctor say so before Docker sees a byte; 23+ loads it."""
    gzip_image = factory.image(host_arch(), layers=2)
    image = factory.zstd_twin(gzip_image)
    assert image.config_digest == gzip_image.config_digest
    out = tmp_path / "z"
    write(out, [store.pulled(image, f"{REPO}:zl")], store, chunk_size=600 * 1024)
    readme = (out / "README.txt").read_text()
    assert f"This bundle HAS zstd layers ({REPO}:zl): load.sh refuses them on Docker before 23.0;\n" \
        "upgrade Docker, or fetch it again with --layers compat (the default)." in readme
    assert "本镜像包含 zstd 压缩层" in readme and "exec format error" in readme
    docker_cleanup.image(f"{REPO}:zl", image.config_digest)
    before = docker_cli.image_ids()
    r = subprocess.run(["sh", "load.sh"], cwd=out, capture_output=True, text=True, env=_env(services))
    if engine != "20.10":
        assert r.returncode == 0, r.stderr
        assert docker_cli.holds(f"{REPO}:zl", image)
        return
    server = docker_cli("version", "--format", "{{.Server.Version}}").stdout.strip()
    assert r.returncode == 5, r.stderr
    assert r.stderr.splitlines()[-2:] == [
        f"load.sh: error: this bundle has zstd-compressed layers ({REPO}:zl), which Docker {server} cannot read "
        "(it needs 23.0 or later; older ones fail with 'invalid tar header', vllm-ascend FAQ 19); nothing was loaded",
        "load.sh: " + REMEDY,
    ]
    assert docker_cli.image_ids() == before
    # what load.sh spares the operator: FAQ 19's own message, after the whole upload
    cat = subprocess.run(f"cat {' '.join(p.name for p in parts_of(out))} | docker load", shell=True, cwd=out,
                         capture_output=True, text=True, env=_env(services))
    assert cat.returncode != 0 and "archive/tar: invalid tar header" in cat.stderr, cat.stderr
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 5  # as load.sh: docs/reliability.md, "Exit codes"
    assert r.stderr.splitlines() == [
        f"error: Docker {server} cannot read zstd-compressed layers ({REPO}:zl): that needs Docker 23.0 or later "
        "(older ones fail with `invalid tar header`, vllm-ascend FAQ 19); nothing was loaded",
        "hint: " + REMEDY,
    ]
    doctor = imgtool("doctor", str(out), docker_host=services.docker_host)
    assert f"Docker {server} cannot read zstd-compressed layers ({REPO}:zl): that needs Docker 23.0 or later" \
        in doctor.stdout  # the same words as load's refusal (bundle/hostcheck.py)
