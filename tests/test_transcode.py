"""fetch --layers: a registry image with zstd layers becomes a bundle every supported Docker loads.

The image is built here (tests/support/images.py `zstd_twin`): the same files and config as a gzip
image, so the same image ID, with every layer zstd-compressed in an OCI manifest, as a builder that
switched to zstd publishes it. Everything goes through the real CLI, registry and dockerds.
"""

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from imgtool.bundle import layout
from imgtool.bundle.format import BundleIndex
from tests.support.bundles import imgtool, parts_of
from tests.support.images import host_arch

TAG = "v0.22.1rc1"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
PLAIN_LAYER = "application/vnd.oci.image.layer.v1.tar"


def _mirrors_file(services, ms, tmp_path: Path) -> Path:
    """A mirrors.toml naming the plain test registry quay.io, the default image the one `ms` published."""
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    return cfg


def _fetch(services, mirrored, tmp_path: Path, image, *extra: str):
    """Publish `image` as quay.io's TAG on the plain registry and fetch it through the CLI."""
    ms = mirrored(image, tag=TAG, targets=("upstream",))
    cfg = _mirrors_file(services, ms, tmp_path)
    out = tmp_path / "bundle"
    r = imgtool("fetch", TAG, "--arch", host_arch(), "--mirrors", str(cfg), "-o", str(out), "--chunk-size", "1M",
                *extra, env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    return out, f"quay.io/{ms.repo}:{TAG}", r


def _env(services):
    return {**{k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}, "DOCKER_HOST": services.docker_host}


def _loaded_as_bundled(docker_cli, ref: str, index: BundleIndex, gzip_image) -> bool:
    """Docker holds `ref` as the bundle's image: the gzip tag's image ID (a graphdriver store) or the
    bundle's manifest digest (the containerd store, whose IDs are manifest digests), and its layers."""
    found = docker_cli.inspect_image(ref)
    want = layout.runtime_image_id(index.images[0], docker_cli.containerd_store)
    return (found is not None and found["Id"] == str(want) and found["RootFS"]["Layers"] == gzip_image.diff_ids
            and (docker_cli.containerd_store or found["Id"] == gzip_image.config_digest))


@pytest.mark.engines(stores=True)
def test_default_fetch_of_a_zstd_image_loads_three_ways(services, factory, mirrored, tmp_path, docker_cli,
                                                        docker_cleanup):
    gzip_image = factory.image(host_arch(), layers=2)
    image = factory.zstd_twin(gzip_image)
    out, ref, r = _fetch(services, mirrored, tmp_path, image)
    assert (f"{ref} (linux/{host_arch()}): 2 of 2 layers rewritten as gzip (--layers compat); the image ID is "
            "unchanged, its manifest digest is now sha256:") in r.stderr

    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    doc = json.loads((out / "bundle.json").read_text())["images"][0]
    assert doc["image_id"] == gzip_image.config_digest  # the config, hence the image ID, is unchanged
    assert doc["manifest_digest"] != image.manifest_digest
    assert [x["media_type"] for x in doc["layers"]] == [GZIP_LAYER, GZIP_LAYER]
    assert [x["diff_id"] for x in doc["layers"]] == gzip_image.diff_ids
    assert [x["unpacked_size"] for x in doc["layers"]] == [x.uncompressed_size for x in image.layers]
    assert doc["upstream"] == {
        "manifest_digest": image.manifest_digest, "manifest_size": len(image.manifest_bytes), "layers": "compat",
        "changed": [{"index": i, "digest": x.digest, "size": x.size, "media_type": ZSTD_LAYER}
                    for i, x in enumerate(image.layers)]}
    assert json.loads((out / "bundle.json").read_text())["version"] == 1  # old imgtools read it
    assert "This bundle has none: its layers are gzip or plain tar." in (out / "README.txt").read_text()
    verify = imgtool("verify", str(out))
    assert verify.returncode == 0, verify.stderr

    docker_cleanup.image(ref, gzip_image.config_digest, str(layout.runtime_image_id(index.images[0], True)))
    # 1. imgtool load, 2. load.sh (sh, sha256sum, cat, docker)
    _loads_with_imgtool_and_load_sh(services, docker_cli, out, ref, index, gzip_image)
    docker_cli("rmi", ref)
    # 3. plain cat parts | docker load: what Docker 20.10 failed with FAQ 19's `invalid tar header`
    r = subprocess.run(f"cat {' '.join(p.name for p in parts_of(out))} | docker load", shell=True, cwd=out,
                       capture_output=True, text=True, env=_env(services))
    assert r.returncode == 0, r.stderr
    assert f"Loaded image: {ref}" in r.stdout
    assert _loaded_as_bundled(docker_cli, ref, index, gzip_image)


def _loads_with_imgtool_and_load_sh(services, docker_cli, out, ref, index, gzip_image):
    """`imgtool load`, then (the image removed) `sh load.sh`: each leaves the image as bundled."""
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    assert _loaded_as_bundled(docker_cli, ref, index, gzip_image)
    docker_cli("rmi", ref)
    r = subprocess.run(["sh", "load.sh"], cwd=out, capture_output=True, text=True, env=_env(services))
    assert r.returncode == 0, r.stderr
    assert _loaded_as_bundled(docker_cli, ref, index, gzip_image)


@pytest.mark.parametrize("engine", ["20.10"], indirect=True)
def test_as_is_keeps_the_registry_s_zstd_and_docker_20_10_is_refused_naming_compat(
        engine, services, factory, mirrored, tmp_path, docker_cli):
    image = factory.zstd_twin(factory.image(host_arch(), layers=2))
    out, ref, r = _fetch(services, mirrored, tmp_path, image, "--layers", "as-is")
    doc = json.loads((out / "bundle.json").read_text())["images"][0]
    assert doc["manifest_digest"] == image.manifest_digest and "upstream" not in doc
    assert [x["digest"] for x in doc["layers"]] == [x.digest for x in image.layers]
    assert [x["media_type"] for x in doc["layers"]] == [ZSTD_LAYER, ZSTD_LAYER]
    before = docker_cli.image_ids()
    r = imgtool("load", str(out), docker_host=services.docker_host)
    server = docker_cli("version", "--format", "{{.Server.Version}}").stdout.strip()
    assert (r.returncode, r.stderr.splitlines()) == (5, [
        f"error: Docker {server} cannot read zstd-compressed layers ({ref}): that needs Docker 23.0 or later "
        "(older ones fail with `invalid tar header`, vllm-ascend FAQ 19); nothing was loaded",
        "hint: upgrade Docker to 23.0 or later, or fetch the image again with imgtool fetch --layers compat "
        "(the default), which rewrites zstd layers as gzip: this bundle kept the registry's zstd bytes",
    ])
    assert docker_cli.image_ids() == before


@pytest.mark.engines(stores=True)
def test_plain_writes_every_layer_uncompressed_and_loads(services, factory, mirrored, tmp_path, docker_cli,
                                                         docker_cleanup):
    gzip_image = factory.image(host_arch(), layers=2)
    image = factory.zstd_twin(gzip_image)
    out, ref, r = _fetch(services, mirrored, tmp_path, image, "--layers", "plain")
    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    layers = index.images[0].layers
    # exactly what docker save gives: each layer's file is its tar, so its digest is its diff_id
    assert [x.media_type for x in layers] == [PLAIN_LAYER, PLAIN_LAYER]
    assert [str(x.digest) for x in layers] == [str(x.diff_id) for x in layers] == gzip_image.diff_ids
    assert [x.size for x in layers] == [x.unpacked_size for x in layers] == [x.uncompressed_size for x in image.layers]
    docker_cleanup.image(ref, gzip_image.config_digest, str(layout.runtime_image_id(index.images[0], True)))
    _loads_with_imgtool_and_load_sh(services, docker_cli, out, ref, index, gzip_image)


def test_a_gzip_image_is_fetched_byte_for_byte_and_transcoding_is_reproducible(services, factory, mirrored,
                                                                                tmp_path):
    gzip_image = factory.image(host_arch(), layers=2, media="oci")
    (tmp_path / "g").mkdir()
    out, _, r = _fetch(services, mirrored, tmp_path / "g", gzip_image)
    doc = json.loads((out / "bundle.json").read_text())["images"][0]
    assert "rewritten" not in r.stderr and "upstream" not in doc
    assert doc["manifest_digest"] == gzip_image.manifest_digest
    # fetch's diff_id check unpacked each layer: bundle.json records what it unpacks to (load's space check)
    assert [x["unpacked_size"] for x in doc["layers"]] == [x.uncompressed_size for x in gzip_image.layers]

    image = factory.zstd_twin(gzip_image)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, _, _ = _fetch(services, mirrored, tmp_path / "a", image, "--created", "2025-01-01T00:00:00Z")
    second, _, _ = _fetch(services, mirrored, tmp_path / "b", image, "--created", "2025-01-01T00:00:00Z")
    assert hashlib.sha256((first / "bundle.json").read_bytes()).digest() == \
        hashlib.sha256((second / "bundle.json").read_bytes()).digest()


@pytest.mark.parametrize("engine", ["20.10"], indirect=True)
def test_push_of_a_rewritten_bundle_pushes_its_own_manifest_and_says_the_digest_differs(
        engine, services, factory, mirrored, tmp_path, uniq, docker_cli, docker_cleanup):
    gzip_image = factory.image(host_arch(), layers=2)
    image = factory.zstd_twin(gzip_image)
    out, ref, _ = _fetch(services, mirrored, tmp_path, image)
    mine = json.loads((out / "bundle.json").read_text())["images"][0]["manifest_digest"]
    r = imgtool("push", str(out), "--to", f"{services.plain}/{uniq}-site", "--insecure")
    assert r.returncode == 0, r.stderr
    target = f"{services.plain}/{uniq}-site/{ref.split('/', 1)[1]}"
    assert (f"warning: {target} (linux/{host_arch()}) is the manifest this bundle holds: fetch rewrote its layers "
            f"(--layers compat), so its digest {mine[7:19]} differs from upstream's {image.manifest_digest[7:19]}; "
            "the image ID (config) is upstream's") in r.stderr.splitlines(), r.stderr
    # the nodes' Docker 20.10 pulls it: gzip layers, the gzip tag's image ID
    docker_cleanup.image(target, gzip_image.config_digest)
    docker_cli("pull", target)
    assert docker_cli.holds(target, gzip_image)


def test_a_zstd_layer_whose_content_is_not_the_config_s_diff_id_is_exit_3_and_no_bundle(
        services, factory, mirrored, tmp_path):
    """The registry's blob matches its digest, but its tar is not the layer the config names: the
    rewrite is where fetch first sees the tar, so it checks the diff_id there."""
    import dataclasses

    from tests.support.images import _manifest_json, sha256_digest

    gzip_image = factory.image(host_arch(), layers=2)
    twin = factory.zstd_twin(gzip_image)
    stranger = factory.layer(200_000).zstd()  # another tar, correctly zstd-compressed
    layers = (twin.layers[0], stranger)
    manifest = {**twin.manifest, "layers": [x.descriptor("oci") for x in layers]}
    body = _manifest_json(manifest)
    bad = dataclasses.replace(twin, layers=layers, manifest_bytes=body, manifest_digest=sha256_digest(body))
    ms = mirrored(bad, tag=TAG, targets=("upstream",))
    cfg = _mirrors_file(services, ms, tmp_path)
    out = tmp_path / "bundle"
    r = imgtool("fetch", TAG, "--arch", host_arch(), "--mirrors", str(cfg), "-o", str(out),
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 3, r.stderr
    assert (f"error: layer 2 of quay.io/{ms.repo}:{TAG} ({stranger.digest}): its content has diff_id "
            f"{stranger.diff_id}, the config says {gzip_image.diff_ids[1]}") in r.stderr.splitlines(), r.stderr
    assert not (out / "bundle.json").exists()


@pytest.mark.parametrize("engine", ["26.1"], indirect=True)
def test_the_space_check_uses_the_unpacked_sizes_fetch_learnt(engine, services, factory, mirrored, tmp_path):
    from imgtool.model import format_size

    image = factory.zstd_twin(factory.image(host_arch(), layers=2))
    out, _, _ = _fetch(services, mirrored, tmp_path, image)
    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    need = index.archive.tar_size + sum(x.uncompressed_size for x in image.layers)
    guess = index.archive.tar_size + int(index.layer_bytes * 2.5)  # what it said before: 2.5 x the gzip bytes
    assert format_size(guess) != format_size(need)
    r = imgtool("doctor", str(out), docker_host=services.docker_host)
    space = next(line for line in r.stdout.splitlines() if " space " in line)
    tar = index.archive.tar_size
    assert (f"the bundle needs about {format_size(need)} ({format_size(tar)} for the archive Docker unpacks into "
            f"{space.split(' free under ')[1].split('; ')[0]}/tmp before it registers the layers + "
            f"{format_size(need - tar)} unpacked)") in space, space


@pytest.mark.parametrize("layers,zstd", [("as-is", True), ("as-is", False), ("compat", False)])
def test_a_kept_layer_whose_content_is_not_the_config_s_diff_id_is_exit_3_and_no_bundle(
        layers, zstd, services, factory, mirrored, tmp_path):
    """With --check-diff-ids, a layer fetch keeps as served (every one with --layers as-is, gzip ones with compat) is
    decompressed and hashed against the config at fetch, and the diff_id found is remembered in the cache: a later
    fetch without the option still refuses the layer, from the cache, unpacking nothing."""
    good = factory.image(host_arch(), layers=3)
    image = factory.wrong_diff_id(factory.zstd_twin(good) if zstd else good, 1)
    ms = mirrored(image, tag=TAG, targets=("upstream",))
    cfg = _mirrors_file(services, ms, tmp_path)
    out = tmp_path / "bundle"
    r = imgtool("fetch", TAG, "--arch", host_arch(), "--mirrors", str(cfg), "-o", str(out), "--layers", layers,
                "--chunk-size", "1M", "--check-diff-ids", env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    wrong = image.config["rootfs"]["diff_ids"][1]
    refusal = (3, [
        f"error: layer 2 of quay.io/{ms.repo}:{TAG} ({image.layers[1].digest}) from quay ({services.plain}/{ms.repo}): "
        f"its content has diff_id {image.diff_ids[1]}, the config says {wrong}",
        "hint: the registry serves a layer that does not belong to this image (fetching again gives the same "
        "bytes); report it to the image's publisher"])
    assert (r.returncode, r.stderr.splitlines()[-2:]) == refusal, r.stderr
    assert not (out / "bundle.json").exists() and not list(out.glob("*.part*"))
    # again from the cache, where the diff_ids found are remembered: the same refusal, without the option
    r = imgtool("fetch", TAG, "--arch", host_arch(), "--mirrors", str(cfg), "-o", str(out), "--layers", layers,
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert (r.returncode, r.stderr.splitlines()[-2:]) == refusal, r.stderr
    assert not (out / "bundle.json").exists()


@pytest.mark.parametrize("layers,zstd", [("as-is", False), ("compat", False), ("compat", True)])
def test_default_fetch_unpacks_no_layer_it_keeps_and_still_records_the_unpacked_sizes(
        layers, zstd, services, factory, mirrored, tmp_path):
    """Issue 38: fetch by default checks blob digests only, as skopeo and crane do (the diff_id check doubled its
    time); the diff_ids are checked by verify, by Docker and containerd as they unpack, and by --check-diff-ids.
    The unpacked sizes load and doctor count space with still come without unpacking: from each gzip layer's
    trailer, or measured where a layer is rewritten (unpacked anyway). A layer that is not its diff_id's is let
    through, and verify names it as the publisher's, not as damage fetching again would mend."""
    good = factory.image(host_arch(), layers=3)
    image = factory.wrong_diff_id(factory.zstd_twin(good) if zstd else good, 1)
    cache = tmp_path / "cache"
    ms = mirrored(image, tag=TAG, targets=("upstream",))
    cfg = _mirrors_file(services, ms, tmp_path)
    out = tmp_path / "bundle"
    r = imgtool("fetch", TAG, "--arch", host_arch(), "--mirrors", str(cfg), "-o", str(out), "--layers", layers,
                "--no-tool", env={"IMGTOOL_CACHE": str(cache)})
    if zstd:  # every layer rewritten (unpacked anyway): its diff_id is checked for free
        assert r.returncode == 3, r.stderr
        assert (f"error: layer 2 of quay.io/{ms.repo}:{TAG} ({image.layers[1].digest}): its content has diff_id "
                f"{image.diff_ids[1]}, the config says {image.config['rootfs']['diff_ids'][1]}") in r.stderr
        return
    assert r.returncode == 0, r.stderr
    assert os.listdir(cache / "diffids") == []  # nothing was unpacked: no diff_id was found to remember
    doc = json.loads((out / "bundle.json").read_text())["images"][0]
    assert [x["unpacked_size"] for x in doc["layers"]] == [x.uncompressed_size for x in image.layers]
    r = imgtool("verify", str(out))
    assert r.returncode == 3, r.stderr
    assert [x for x in r.stderr.splitlines() if x.startswith("  - ")][0].startswith(
        f"  - layer 2 of quay.io/{ms.repo}:{TAG} (blob {image.layers[1].digest[7:19]}): its uncompressed content does "
        "not match the diff_id in the image config; its blob matches its digest, so the image is published this way "
        "(fetching again gives the same bytes): report it to the image's publisher"), r.stderr


def test_a_gzip_trailer_gives_the_unpacked_size_only_where_it_can_be_trusted(tmp_path):
    """The size bundle.json records for a gzip layer fetch did not unpack (load's and doctor's space checks count it):
    one gzip member's trailer, refused where it counts only a last member or may have wrapped at 4 GiB."""
    import gzip
    import random

    from imgtool.transcode import gzip_trailer_size

    rng = random.Random(38)
    noise = bytes(rng.getrandbits(8) for _ in range(1 << 16))
    text = b"usr/lib/python3/dist-packages/" * 40000

    def blob(name: str, data: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        return path

    for name, data in (("noise", gzip.compress(noise)), ("text", gzip.compress(text))):
        path = blob(name, data)
        assert gzip_trailer_size(path, len(data)) == len(gzip.decompress(data)), name
    two = gzip.compress(noise) + gzip.compress(b"x" * 100)  # the trailer counts the last member only
    assert gzip_trailer_size(blob("two", two), len(two)) is None
    plain = noise  # not gzip at all
    assert gzip_trailer_size(blob("plain", plain), len(plain)) is None
    zeros = gzip.compress(bytes(1 << 24))  # 1000:1, and 4 GiB more would be 250000:1: the trailer is the size
    assert gzip_trailer_size(blob("zeros", zeros), len(zeros)) == 1 << 24

    def big(name: str, size: int, isize: int) -> Path:
        """A sparse stand-in for a big gzip layer: only its first bytes and its trailer are read."""
        path = tmp_path / name
        with open(path, "wb") as f:
            f.write(b"\x1f\x8b\x08\0")
            f.seek(size - 4)
            f.write(isize.to_bytes(4, "little"))
        return path

    gb = 1 << 30
    # 1 GiB compressed: saying 1.5 GiB it may as well be 5.5 GiB (5.5:1, as a layer of text compresses): not trusted
    assert gzip_trailer_size(big("ambiguous", gb, 3 * gb // 2), gb) is None
    # saying less than it takes compressed: wrapped at 4 GiB (or a last member's count)
    assert gzip_trailer_size(big("wrapped", gb, gb // 2), gb) is None
    assert gzip_trailer_size(big("small", 64 << 20, 150 << 20), 64 << 20) == 150 << 20
