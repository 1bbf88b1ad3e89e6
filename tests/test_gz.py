"""gzip through ISA-L (the installed package's `isal`) or zlib (imgtool.pyz, `--gzip-library zlib`): the same images.

Everything a user sees goes through the real CLI, registry and dockerd: a zstd image rewritten by each
library, an image exported by each, both loaded; the pyz on Python 3.7 (zlib only) verifying what ISA-L
wrote; bundle.json's `gzip` record and `imgtool diff` naming it. gz.py's own edges (members, zero padding,
truncation) are checked on both libraries directly.
"""

import gzip
import io
import json
import random
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from imgtool import gz
from imgtool.bundle import layout
from imgtool.bundle.format import BundleIndex
from tests.support.bundles import imgtool
from tests.support.images import host_arch, write_docker_archive
from tests.test_selfbundle import old_python, run_clean

TAG = "v0.22.1rc1"
CREATED = "2025-06-01T08:00:00Z"
ISAL = {"library": "isal", "level": 2}
ZLIB = {"library": "zlib", "level": 1}


def _mirrors(services, mirrored, tmp_path: Path, image) -> tuple:
    ms = mirrored(image, tag=TAG, targets=("upstream",))
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    return cfg, f"quay.io/{ms.repo}:{TAG}"


def _fetch(cfg: Path, out: Path, cache: Path, *extra: str) -> dict:
    r = imgtool("fetch", TAG, "--arch", host_arch(), "--mirrors", str(cfg), "-o", str(out), "--created", CREATED,
                *extra, env={"IMGTOOL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    return json.loads((out / "bundle.json").read_text())


@pytest.mark.parametrize("engine", ["20.10"], indirect=True)
def test_isal_and_zlib_rewrite_a_zstd_image_into_the_same_image(engine, services, factory, mirrored, tmp_path,
                                                                docker_cli, docker_cleanup):
    # the middle layer is several 4 MiB gzip members; the last one less than one
    gzip_image = factory.image(host_arch(), layers=3, layer_size=[1 << 20, 5 << 20, 100_000])
    cfg, ref = _mirrors(services, mirrored, tmp_path, factory.zstd_twin(gzip_image))
    docs = {lib: _fetch(cfg, tmp_path / lib, tmp_path / "cache", "--gzip-library", lib) for lib in ("isal", "zlib")}

    assert (docs["isal"]["gzip"], docs["zlib"]["gzip"]) == (ISAL, ZLIB)  # what compressed the layers, recorded
    isal, zlib = docs["isal"]["images"][0], docs["zlib"]["images"][0]
    assert [x["diff_id"] for x in isal["layers"]] == [x["diff_id"] for x in zlib["layers"]] == gzip_image.diff_ids
    assert isal["image_id"] == zlib["image_id"] == gzip_image.config_digest
    assert all(a["digest"] != b["digest"] for a, b in zip(isal["layers"], zlib["layers"]))  # other gzip bytes
    for lib in ("isal", "zlib"):
        r = imgtool("verify", str(tmp_path / lib))  # every layer inflated for its diff_id
        assert r.returncode == 0, r.stderr

    r = imgtool("diff", str(tmp_path / "zlib"), str(tmp_path / "isal"))
    assert r.returncode == 0, r.stderr
    assert "the bundles differ only by their gzip compressor: the layers were compressed by zlib level 1 in old, " \
           "isal level 2 in new" in r.stdout.splitlines(), r.stdout
    summary = json.loads(imgtool("diff", str(tmp_path / "zlib"), str(tmp_path / "isal"), "--json").stdout)
    assert summary["recompressed"] == {"layers": 3, "only_compression": True, "old": ZLIB, "new": ISAL}

    # the same image on Docker from either bundle: its ID and its layers
    for lib in ("zlib", "isal"):
        index = BundleIndex.from_bytes((tmp_path / lib / "bundle.json").read_bytes())
        docker_cleanup.image(ref, gzip_image.config_digest, str(layout.runtime_image_id(index.images[0], True)))
        r = imgtool("load", str(tmp_path / lib), docker_host=services.docker_host)
        assert r.returncode == 0, r.stderr
        assert docker_cli.holds(ref, gzip_image)
        docker_cli("rmi", ref)


def test_the_pyz_on_python_3_7_verifies_what_isal_compressed(services, factory, mirrored, tmp_path):
    """Layers rewritten by ISA-L in a whole-archive gzip ISA-L wrote: Kylin's python3 (zlib, no isal) checks
    every part, blob and diff_id of it, and finds the damage it should."""
    gzip_image = factory.image(host_arch(), layers=2, layer_size=[5 << 20, 300_000])
    cfg, _ = _mirrors(services, mirrored, tmp_path, factory.zstd_twin(gzip_image))
    out = tmp_path / "b"
    doc = _fetch(cfg, out, tmp_path / "cache", "--compress", "gzip", "--gzip-library", "isal")
    assert doc["gzip"] == ISAL and doc["archive"]["compression"] == "gzip"
    assert not [n for n in zipfile.ZipFile(out / "imgtool.pyz").namelist() if n.startswith("isal")]
    r = run_clean(old_python("3.7"), "imgtool.pyz", "verify", ".", cwd=out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: .: 1 image(s); "), r.stdout


@pytest.mark.parametrize("engine", ["20.10"], indirect=True)
def test_export_through_isal_and_zlib_gives_the_same_image(engine, services, factory, tmp_path, docker_cli,
                                                           docker_cleanup):
    image = factory.image("amd64", layers=2, layer_size=[5 << 20, 200_000])
    ref = f"quay.io/{tmp_path.name.lower()[:20]}x/vllm-ascend:{TAG}"
    write_docker_archive(image, tmp_path / "in.tar", ref)
    docker_cleanup.image(ref, image.config_digest)
    docker_cli("load", "-i", tmp_path / "in.tar")
    env = {"DOCKER_HOST": services.docker_host, "IMGTOOL_CACHE": str(tmp_path / "cache")}
    docs = {}
    for lib in ("isal", "zlib"):
        r = imgtool("export", ref, "-o", str(tmp_path / lib), "--gzip-library", lib, env=env)
        assert r.returncode == 0, r.stderr
        docs[lib] = json.loads((tmp_path / lib / "bundle.json").read_text())
    assert (docs["isal"]["gzip"], docs["zlib"]["gzip"]) == (ISAL, ZLIB)
    layers = {lib: doc["images"][0]["layers"] for lib, doc in docs.items()}
    assert [x["diff_id"] for x in layers["isal"]] == [x["diff_id"] for x in layers["zlib"]] == image.diff_ids
    assert all(a["digest"] != b["digest"] for a, b in zip(layers["isal"], layers["zlib"]))
    for lib in ("isal", "zlib"):
        docker_cli("image", "rm", ref)
        r = imgtool("load", str(tmp_path / lib), env=env)
        assert r.returncode == 0, r.stderr
        assert docker_cli.holds(ref, image)


def test_isal_takes_level_1_only_and_the_check_comes_before_docker(tmp_path):
    r = imgtool("export", "busybox:1", "-o", str(tmp_path / "o"), "--gzip-library", "isal", "--gzip-level", "6",
                docker_host="unix:///nonexistent/docker.sock")
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        "error: --gzip-library isal compresses at --gzip-level 1 only (asked: 6)",
        "hint: levels 2-9 are zlib's: --gzip-library zlib (or auto)"])
    r = imgtool("export", "busybox:1", "-o", str(tmp_path / "o"), "--gzip-level", "0",
                docker_host="unix:///nonexistent/docker.sock")
    assert (r.returncode, r.stderr.splitlines()) == (2, ["error: invalid --gzip-level 0: use 1 (fast) to 9 (small)"])



def test_fetch_takes_gzip_level_as_export_does(services, factory, mirrored, tmp_path):
    gzip_image = factory.image(host_arch(), layers=2, layer_size=[1 << 20, 100_000])
    cfg, _ = _mirrors(services, mirrored, tmp_path, factory.zstd_twin(gzip_image))
    doc = _fetch(cfg, tmp_path / "z6", tmp_path / "cache", "--gzip-level", "6", "--gzip-library", "zlib")
    assert doc["gzip"] == {"library": "zlib", "level": 6}  # the rewritten layers, at the level asked for
    assert [x["diff_id"] for x in doc["images"][0]["layers"]] == gzip_image.diff_ids
    assert imgtool("verify", str(tmp_path / "z6")).returncode == 0
    # refused before any work, in export's words: nothing fetched, no output directory
    r = imgtool("fetch", TAG, "--mirrors-file", str(cfg), "-o", str(tmp_path / "o"), "--gzip-level", "0")
    assert (r.returncode, r.stderr.splitlines()) == (2, ["error: invalid --gzip-level 0: use 1 (fast) to 9 (small)"])
    r = imgtool("fetch", TAG, "--mirrors-file", str(cfg), "-o", str(tmp_path / "o"), "--gzip-library", "isal",
                "--gzip-level", "6")
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        "error: --gzip-library isal compresses at --gzip-level 1 only (asked: 6)",
        "hint: levels 2-9 are zlib's: --gzip-library zlib (or auto)"])
    assert not (tmp_path / "o").exists()

# --- gz.py on both libraries ----------------------------------------------------------------------------


@pytest.mark.parametrize("library", ["isal", "zlib"])
def test_members_are_plain_gzip_and_the_reader_takes_what_gzip_takes(library):
    rng = random.Random(f"gz-{library}")
    text = b"".join(b"line %d of a layer\n" % rng.randrange(1000) for _ in range(600_000))  # ~12 MB: 3 members
    out = io.BytesIO()
    with ThreadPoolExecutor(2) as pool:
        members = gz.Members(gz.compressor(1, library), pool, out.write, 2)
        for i in range(0, len(text), 1 << 20):
            members.feed(text[i:i + (1 << 20)])
        members.close()
    blob = out.getvalue()
    assert gzip.decompress(blob) == text and blob.count(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff") >= 3
    # other members, zeros after them (as gzip(1) skips them), any read size: the same bytes
    padded = blob + gzip.compress(b"tail", mtime=0) + bytes(1000)
    for read_size in (1, 4096, 1 << 22):
        assert gz.Reader(io.BytesIO(padded), library, read_size).read() == text + b"tail"
    for cut in (9, len(blob) // 2, len(blob) - 4):  # cut short: one error, whatever the library
        with pytest.raises(gz.GzipError, match=r"^the gzip stream ends early$"):
            gz.Reader(io.BytesIO(blob[:cut]), library).read()
    damaged = bytearray(blob)
    damaged[len(blob) // 3] ^= 0xFF
    with pytest.raises(gz.GzipError, match=r"^damaged deflate data or CRC$"):
        gz.Reader(io.BytesIO(bytes(damaged)), library).read()
