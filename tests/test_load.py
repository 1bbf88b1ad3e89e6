"""`imgtool load`: verified while it streams (Docker never completes a bad archive), confirmed by image ID.

Against the real test dockerd; a refused bundle must leave Docker without any new image.
"""

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from imgtool.bundle.landing import _compatibility
from imgtool.runtimes import docker
from imgtool.runtimes.base import RuntimeInfo as DaemonInfo
from imgtool.errors import ImgtoolError
from tests.support.bundles import (BlobDir, canonical_tar, damaged_part_line, fetch_from_registry, imgtool, member_bytes, parts_of,
                                   random_layer, replace_archive, simple_image, tar_body, write)
from tests.support.images import host_arch

REPO = "quay.io/ascend/vllm-ascend"


def err_lines(r):
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:", "warning:", "  - "))]


@pytest.fixture
def store(tmp_path):
    return BlobDir(tmp_path / "blobs")


@pytest.fixture
def bundle(factory, store, tmp_path):
    """A 4+-part bundle of a fresh host-arch image (no daemon has it yet)."""
    image = factory.image(host_arch(), layers=3)
    out = tmp_path / "vllm-ascend-v0.22.1rc1"
    write(out, [store.pulled(image, f"{REPO}:v0.22.1rc1")], store, chunk_size=700 * 1024)
    assert len(parts_of(out)) >= 4
    return out, image


def _where(node) -> str:
    """How load's last line names the runtime's side: ", namespace k8s.io" on containerd."""
    return ", namespace k8s.io" if node.kind == "containerd" else ""


@pytest.mark.runtimes(proof=True)
def test_load_multipart_then_again_is_a_noop(bundle, node):
    out, image = bundle
    before = node.image_ids()
    node.remove_later(f"{REPO}:v0.22.1rc1", "vllm:prod", node.bundle_id(image))
    r = imgtool("load", str(out), "--tag", "vllm:prod", env=node.env)
    assert r.returncode == 0, r.stderr
    assert set(node.image_ids()) - set(before) == {node.bundle_id(image)}
    assert node.names(image) == sorted([f"{REPO}:v0.22.1rc1", "vllm:prod"])
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ID", "PLATFORM", "SIZE"]
    assert lines[1].startswith(f"{REPO}:v0.22.1rc1, vllm:prod  {node.bundle_id(image)[7:19]}  "
                               f"linux/{host_arch()}")
    assert lines[2].startswith(f"loaded 1 image(s) from {out} in ")
    version = json.loads(imgtool("load", str(out), "--json", env=node.env).stdout)["daemon"]["version"]
    assert lines[2].endswith(f" sent to {node.title} {version}{_where(node)})")

    again = imgtool("load", str(out), "--json", env=node.env)
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert result["sent"] is False and result["images"][0]["was_present"] is True
    assert result["runtime"] == node.kind
    text = imgtool("load", str(out), "--tag", "vllm:prod", env=node.env)
    assert text.stdout.splitlines()[-1] == f"already loaded: nothing sent to {node.title} ({out}{_where(node)})"


@pytest.mark.runtimes
def test_damaged_part_is_named_and_the_runtime_keeps_nothing(bundle, node):
    out, image = bundle
    part = parts_of(out)[1]
    data = bytearray(part.read_bytes())
    data[4242] ^= 0x40
    part.write_bytes(bytes(data))
    before = node.snapshot()
    r = imgtool("load", str(out), env=node.env)
    assert r.returncode == 3
    assert err_lines(r) == [
        f"error: refusing to load: {out}: 1 problem; nothing was loaded",
        damaged_part_line(out, 1),
    ]
    assert node.leftovers(before) == []


@pytest.mark.runtimes(stores=True)
def test_damage_in_the_last_member_bytes_cuts_the_upload_and_the_runtime_keeps_nothing(bundle, node):
    """load checks while it streams: the last bytes go out only after every part and blob matched; the
    runtime (which has had every other byte: containerd has ingested the blobs) records nothing."""
    out, image = bundle
    part = parts_of(out)[-1]
    data = bytearray(part.read_bytes())
    last = len(data.rstrip(b"\0")) - 1  # the last data byte of the last member (padding and trailer are zeros)
    data[last] ^= 0x01
    part.write_bytes(bytes(data))
    before = node.snapshot()
    r = imgtool("load", str(out), env=node.env)
    assert r.returncode == 3, r.stderr
    n = len(parts_of(out))
    assert err_lines(r)[0] == f"error: refusing to load: {out}: 1 problem; nothing was loaded"
    assert err_lines(r)[1].startswith(f"  - part {n:03d} ({part.name}) is damaged: its sha256 differs from bundle.json")
    assert "stopped the upload: " in r.stderr  # it was cut short, not refused before the stream
    assert node.leftovers(before) == []


@pytest.mark.runtimes(stores=True)
def test_missing_part_is_refused(bundle, node):
    out, _ = bundle
    parts = parts_of(out)
    parts[2].unlink()
    before = node.image_ids()
    r = imgtool("load", str(out), env=node.env)
    assert r.returncode == 3
    assert err_lines(r)[1] == f"  - part 003 ({parts[2].name}) is missing; copy part 003 from the source medium"
    assert node.image_ids() == before


@pytest.mark.engines(stores=True)
def test_every_problem_is_named_not_only_the_first(bundle, services, docker_cli):
    """part 002 damaged and part 004 missing: load names both, as verify does."""
    out, _ = bundle
    parts = parts_of(out)
    damaged = damaged_part_line(out, 1)  # what part 002 holds, read before part 004 goes
    data = bytearray(parts[1].read_bytes())
    data[4242] ^= 0x40
    parts[1].write_bytes(bytes(data))
    parts[3].unlink()
    before = docker_cli.image_ids()
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 3, r.stderr
    assert err_lines(r) == [
        f"error: refusing to load: {out}: 2 problems; nothing was loaded",
        damaged,
        f"  - part 004 ({parts[3].name}) is missing; copy part 004 from the source medium",
    ]
    assert err_lines(imgtool("verify", str(out)))[1:] == err_lines(r)[1:]
    assert docker_cli.image_ids() == before


def _rewrite_bundle_json(out, doc) -> str:
    """Write bundle.json and make SHA256SUMS agree, as someone editing the bundle would; returns its sha256."""
    raw = (json.dumps(doc, indent=2) + "\n").encode()
    (out / "bundle.json").write_bytes(raw)
    sha = hashlib.sha256(raw).hexdigest()
    sums = [line for line in (out / "SHA256SUMS").read_text().splitlines() if not line.endswith("  bundle.json")]
    (out / "SHA256SUMS").write_text("\n".join(sums + [f"{sha}  bundle.json"]) + "\n")
    return sha


@pytest.mark.runtimes(stores=True)
def test_an_already_loaded_bundle_is_still_checked(bundle, node):
    """The runtime holding the image ID is no reason to skip a check: --expect, sizes and sha256s still count."""
    out, image = bundle
    node.remove_later(f"{REPO}:v0.22.1rc1", "vllm:prod", node.bundle_id(image))
    first = imgtool("load", str(out), env=node.env)
    assert first.returncode == 0, first.stderr
    parts = parts_of(out)
    sound = parts[1].read_bytes()
    parts[1].write_bytes(sound[:-100])
    r = imgtool("load", str(out), "--expect", "0" * 64, "--tag", "vllm:prod", env=node.env)
    assert r.returncode == 3, r.stderr
    lines = err_lines(r)
    assert lines[0] == f"error: refusing to load: {out}: 2 problems; nothing was loaded"
    assert lines[1].startswith("  - bundle.json does not match --expect: its sha256 is ")
    assert lines[2] == (f"  - part 002 ({parts[1].name}) is truncated: {len(sound) - 100} of {len(sound)} bytes; "
                        "re-copy part 002 from the source medium")
    assert "vllm:prod" not in node.names(image)

    # a part damaged in place: its size is right, its sha256 is not (--quick checks sizes only)
    parts[1].write_bytes(sound[:4242] + bytes([sound[4242] ^ 0x40]) + sound[4243:])
    r = imgtool("load", str(out), "--tag", "vllm:prod", env=node.env)
    assert r.returncode == 3, r.stderr
    assert err_lines(r) == [
        f"error: refusing to load: {out}: 1 problem; nothing was loaded",
        damaged_part_line(out, 1),
    ]
    assert "vllm:prod" not in node.names(image)
    quick = imgtool("load", str(out), "--quick", "--tag", "vllm:prod", env=node.env)
    assert quick.returncode == 0, quick.stderr
    assert quick.stdout.splitlines()[-1] == f"already loaded: nothing sent to {node.title} ({out}{_where(node)})"
    assert "vllm:prod" in node.names(image)


@pytest.mark.engines(stores=True)
def test_a_bundle_json_naming_another_loaded_image_tags_nothing(factory, store, tmp_path, services, docker_cli,
                                                                docker_cleanup):
    """bundle.json edited to name an image Docker already holds under a new name: refused, nothing tagged."""
    victim, other = factory.image(host_arch(), layers=1), factory.image(host_arch(), layers=1)
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, [store.pulled(victim, f"{REPO}:v1")], store)
    write(b, [store.pulled(other, f"{REPO}:v2")], store)
    docker_cleanup.image(f"{REPO}:v1", f"{REPO}:v2", f"{REPO}:evil", victim.config_digest, other.config_digest)
    for d in (a, b):
        r = imgtool("load", str(d), docker_host=services.docker_host)
        assert r.returncode == 0, r.stderr
    genuine = hashlib.sha256((b / "bundle.json").read_bytes()).hexdigest()
    doc = json.loads((b / "bundle.json").read_text())
    doc["images"][0].update(image_id=victim.config_digest, ref=f"{REPO}:evil")
    _rewrite_bundle_json(b, doc)
    expecting = imgtool("load", str(b), "--expect", genuine, docker_host=services.docker_host)
    assert expecting.returncode == 3, expecting.stderr
    assert err_lines(expecting)[1].startswith("  - bundle.json does not match --expect: its sha256 is ")
    blind = imgtool("load", str(b), docker_host=services.docker_host)  # no --expect: the archive still disagrees
    assert blind.returncode == 3, blind.stderr
    assert f"  - the archive lacks blobs/sha256/{victim.config_digest[7:]} (config of {REPO}:evil) " \
           "(in part 001)" in err_lines(blind)
    assert docker_cli.find(victim)["RepoTags"] == [f"{REPO}:v1"]


def test_unreachable_docker_is_one_error(bundle, tmp_path):
    out, _ = bundle
    r = imgtool("load", str(out), "--runtime", "docker", docker_host=f"unix://{tmp_path}/no.sock")
    assert r.returncode == 5
    lines = r.stderr.splitlines()
    assert lines == [f"error: cannot reach the Docker daemon at unix://{tmp_path}/no.sock: the socket does not exist "
                     "(dockerd is not running)",
                     "hint: start it (systemctl start docker), or point DOCKER_HOST at the daemon's socket"]


def test_no_runtime_at_all_is_one_error_naming_each(bundle, tmp_path):
    """--runtime auto on a host with no Docker socket, no containerd socket and no podman: each is named."""
    out, _ = bundle
    empty = tmp_path / "bin"
    empty.mkdir()
    r = imgtool("load", str(out), docker_host=f"unix://{tmp_path}/no.sock",
                env={"PATH": str(empty), "CONTAINERD_ADDRESS": f"{tmp_path}/c.sock"})
    assert r.returncode == 5, r.stderr
    assert r.stderr.splitlines() == [
        f"error: no container runtime answers here: Docker: cannot reach the Docker daemon at unix://{tmp_path}/no.sock: "
        f"the socket does not exist (dockerd is not running); containerd: cannot reach containerd at {tmp_path}/c.sock: "
        "the socket does not exist (containerd is not running); Podman: cannot use Podman: the podman command is not "
        "installed (not in PATH)",
        "hint: start one (systemctl start docker, or containerd), choose one with --runtime, and for containerd give "
        "its socket with --address or CONTAINERD_ADDRESS"]
    wrong = imgtool("load", str(out), "--runtime", "containerd", "--address", f"{tmp_path}/c.sock")
    assert wrong.returncode == 5
    assert wrong.stderr.splitlines()[0] == (f"error: cannot reach containerd at {tmp_path}/c.sock: the socket does not "
                                            "exist (containerd is not running)")


@pytest.mark.engines
def test_fetch_verify_expect_load(services, factory, mirrored, tmp_path, docker_cli, docker_cleanup):
    """The whole path through the CLI: fetch (connected side) -> verify --expect -> load (offline side)."""
    out, child, ref, fetched = fetch_from_registry(services, factory, mirrored, tmp_path, "--json")
    sha = json.loads(fetched.stdout)["bundle_json_sha256"]
    assert len(json.loads(fetched.stdout)["parts"]) >= 3  # several parts of 1 MiB, the smallest a user may ask for
    ok = imgtool("verify", str(out), "--expect", sha)
    assert ok.returncode == 0, ok.stderr
    docker_cleanup.image(ref, child.config_digest)
    loaded = imgtool("load", str(out), "--expect", sha, docker_host=services.docker_host)
    assert loaded.returncode == 0, loaded.stderr
    assert docker_cli.holds(ref, child)


# --- crafted archives: parts and bundle.json agree, the tar does not ----------------------


def _crafted(bundle_dir, extra: bytes = b"", replace_manifest: bytes = None):
    tar = canonical_tar(bundle_dir)
    body = tar_body(tar)
    if replace_manifest is not None:
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            names = t.getnames()
            keep = []
            for m in t.getmembers():
                data = t.extractfile(m).read()
                keep.append(member_bytes(m.name, replace_manifest if m.name == "manifest.json" else data))
        assert "manifest.json" in names
        body = b"".join(keep)
    replace_archive(bundle_dir, body + extra)


EVIL = {
    "dotdot": (member_bytes("../x", b"owned\n"), "archive member '../x' escapes the archive (a `..` path)"),
    "absolute": (member_bytes("/etc/cron.d/x", b"* * * * * root sh\n"),
                 "archive member '/etc/cron.d/x' is an absolute path"),
    "symlink": (member_bytes("blobs/sha256/evil", type=tarfile.SYMTYPE, linkname="../../../etc/shadow"),
                "archive member 'blobs/sha256/evil' is a symbolic link to '../../../etc/shadow': the archive may "
                "hold only regular files"),
    "hardlink": (member_bytes("blobs/link", type=tarfile.LNKTYPE, linkname="manifest.json"),
                 "archive member 'blobs/link' is a hard link to 'manifest.json': the archive may hold only "
                 "regular files"),
    "device": (member_bytes("dev-sda", type=tarfile.BLKTYPE, devmajor=8, devminor=0),
               "archive member 'dev-sda' is a block device: the archive may hold only regular files"),
    "chardev": (member_bytes("blobs/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3),
                "archive member 'blobs/null' is a character device: the archive may hold only regular files"),
}


@pytest.mark.parametrize("case", sorted(EVIL))
@pytest.mark.engines(stores=True)
def test_crafted_member_is_refused_before_docker(case, bundle, services, docker_cli):
    out, _ = bundle
    member, message = EVIL[case]
    _crafted(out, extra=member)
    before = docker_cli.image_ids()
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 3, r.stderr
    lines = err_lines(r)
    assert lines[0] == f"error: refusing to load: {out}: 1 problem; nothing was loaded", r.stderr
    assert lines[1].startswith(f"  - {message} (in part 001)"), lines
    assert docker_cli.image_ids() == before
    assert imgtool("verify", str(out)).returncode == 3


@pytest.mark.engines(stores=True)
def test_huge_manifest_json_is_refused(bundle, services, docker_cli):
    out, image = bundle
    entries = [{"Config": f"blobs/sha256/{image.config_digest[7:]}", "RepoTags": [f"evil/x{i}:latest"],
                "Layers": []} for i in range(300000)]
    huge = json.dumps(entries).encode()
    assert len(huge) > 20 << 20
    _crafted(out, replace_manifest=huge)
    before = docker_cli.image_ids()
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 3
    implied = len(json.dumps([{"Config": f"blobs/sha256/{image.config_digest[7:]}",
                               "RepoTags": [f"{REPO}:v0.22.1rc1"],
                               "Layers": [f"blobs/sha256/{x.digest[7:]}" for x in image.layers]}],
                             separators=(",", ":")))
    assert f"  - archive member 'manifest.json' is {len(huge)} bytes, but bundle.json implies {implied} " \
           "(in part 001)" in err_lines(r)
    assert docker_cli.image_ids() == before


@pytest.mark.engines(stores=True)
def test_manifest_json_with_other_tags_is_refused(bundle, services, docker_cli):
    """Same size as implied, other content (a tag of someone else's image): caught by content."""
    out, image = bundle
    tar = canonical_tar(out)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        original = t.extractfile("manifest.json").read()
    forged = original.replace(b"quay.io/ascend/vllm-ascend", b"docker.io/library/ubuntuuu")
    assert len(forged) == len(original)
    _crafted(out, replace_manifest=forged)
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 3
    assert "  - archive member manifest.json differs from what bundle.json implies; the bundle itself is bad: " \
           "make it again as it was made (imgtool fetch, export or copy) (in part 001)" in err_lines(r)


@pytest.mark.engines(stores=True)
def test_docker_error_detail_on_http_200_is_a_failure(store, tmp_path, services, docker_cli):
    """A layer that is valid gzip with a matching diff_id but not a tar: only Docker can tell."""
    raw = os.urandom(64 * 1024)
    blob = gzip.compress(raw, mtime=0)
    from tests.support.images import Layer, sha256_digest

    layer = Layer(blob=blob, digest=sha256_digest(blob), size=len(blob), diff_id=sha256_digest(raw),
                  uncompressed_size=len(raw))
    image = simple_image([layer], host_arch(), seed=7)
    out = tmp_path / "b"
    write(out, [store.pulled(image, f"{REPO}:broken")], store)
    assert imgtool("verify", str(out)).returncode == 0
    before = docker_cli.image_ids()
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 5, r.stderr
    lines = err_lines(r)
    assert lines[0].startswith("error: docker load failed: ")
    assert docker_cli.image_ids() == before


@pytest.mark.runtimes(stores=True, proof=True)
def test_a_layer_not_matching_its_diff_id_loads_nothing(store, tmp_path, node):
    """load leaves the diff_id check to the runtime (no second decompression of every layer): the runtime
    refuses such a layer itself, and nothing is left (containerd and Docker's containerd store register
    the image before unpacking it: imgtool removes it, and containerd's blobs; on containerd the import records
    it and imgtool's unpack is what fails). `imgtool verify` still names it offline."""
    from tests.support.images import Layer, sha256_digest

    good = random_layer(32 * 1024, seed=11)
    layer = Layer(blob=good.blob, digest=good.digest, size=good.size, diff_id=sha256_digest(b"not this"),
                  uncompressed_size=good.uncompressed_size)
    base = random_layer(16 * 1024, seed=12)
    image = simple_image([base, layer], host_arch(), seed=8)
    out = tmp_path / "b"
    write(out, [store.pulled(image, f"{REPO}:wrongdiff")], store)
    assert imgtool("verify", str(out)).returncode == 3
    before = node.snapshot()
    r = imgtool("load", str(out), env=node.env)
    if node.kind == "podman":  # 4.3 would load it as it is (imgtool checks what it applied); 5 refuses it (exit 125)
        assert r.returncode == 3, r.stderr
        assert err_lines(r) == [f"error: refusing to load: {out}: 1 problem; nothing was loaded",
                                f"  - layer 2 of {REPO}:wrongdiff (blob {good.digest[7:19]}): its uncompressed content "
                                "does not match the diff_id in the image config; its blob matches its digest, so the "
                                "image is published this way (fetching again gives the same bytes): report it to the "
                                "image's publisher (in part 001)"]
        done = "applied" if node.version == "4.3" else "refused"  # Podman 5 checks the diff_id itself
        assert f"refused what was loaded: layer 2 of {REPO}:wrongdiff: Podman {done} content that is not its diff_id" \
            in r.stderr
        assert node.image_ids() == before.items["image"]  # no image record, on either
        if node.version == "4.3":
            assert node.leftovers(before) == []
        else:  # Podman 5 commits each layer as it arrives: the good first layer may be in its storage already when
            # it refuses the second, and it keeps it, no image naming it (docs/runtimes.md); nothing else is left
            assert node.leftovers(before) in ([], [f"layer {base.diff_id.split(':', 1)[1]}"])
        return
    assert r.returncode == 5, r.stderr
    if node.kind == "docker" and node.cli.containerd_store:  # registered, then failed unpacking: removed again
        assert err_lines(r)[0] == ("error: docker load failed: failed to unpack loaded image: wrong diff id "
                                   f"calculated on extraction \"{good.diff_id}\"")
    elif node.kind == "docker":
        assert err_lines(r)[0].startswith("error: docker load failed: invalid diffID for layer 1: expected "
                                          f"\"{sha256_digest(b'not this')}\"")
    else:
        assert err_lines(r)[0].startswith(f"error: containerd could not unpack {REPO}:wrongdiff (it is not unpacked "
                                          "into overlayfs): ctr: error unpacking image: ")
        assert f"wrong diff id calculated on extraction \"{good.diff_id}\"" in err_lines(r)[0]
    assert node.leftovers(before) == []


@pytest.mark.engines(stores=True)
def test_foreign_arch_loads_with_a_warning(factory, store, tmp_path, services, docker_cli, docker_cleanup):
    other = "arm64" if host_arch() == "amd64" else "amd64"
    image = factory.image(other, layers=1)
    out = tmp_path / "b"
    write(out, [store.pulled(image, f"{REPO}:foreign")], store)
    docker_cleanup.image(f"{REPO}:foreign", image.config_digest)
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    platform = "linux/arm64/v8" if other == "arm64" else "linux/amd64"
    assert (f"warning: {REPO}:foreign is for {platform} but this Docker host is linux/{host_arch()}: its "
            f"containers will not start (exec format error); fetch it with --arch {host_arch()}") in err_lines(r)


def test_tag_needs_a_source_when_the_bundle_has_several_images(factory, store, tmp_path, services):
    base = factory.layers(1)
    images = [store.pulled(factory.image(host_arch(), layers=1, base=base), f"{REPO}:a"),
              store.pulled(factory.image(host_arch(), layers=1, base=base), f"{REPO}:b")]
    out = tmp_path / "b"
    write(out, images, store)
    r = imgtool("load", str(out), "--tag", "x:1", docker_host=services.docker_host)
    assert r.returncode == 2
    assert err_lines(r) == [f"error: --tag x:1: this bundle holds 2 images ({REPO}:a, {REPO}:b)",
                            "hint: say which: --tag SOURCE=NAME, SOURCE being an image's name or tag"]
    r = imgtool("load", str(out), "--tag", "b=Bad Name", docker_host=services.docker_host)
    assert r.returncode == 2 and err_lines(r)[0] == "error: invalid --tag 'b=Bad Name': expected NAME[:TAG], " \
                                                    "e.g. vllm-ascend:prod"


def test_free_space_is_checked_against_the_unpacked_size(tmp_path, factory, store):
    mnt = tmp_path / "root"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        out = tmp_path / "b"
        write(out, [store.pulled(factory.image("arm64", layers=3), f"{REPO}:v1")], store)
        from imgtool.bundle.reader import read_index

        index, _ = read_index(out)
        facts = DaemonInfo("unix:///x.sock", "20.10.24", "1.41", "overlay2", str(mnt), "arm64", "linux", True, docker.TRAITS)
        with pytest.raises(ImgtoolError) as e:
            _compatibility(index, facts, 8 << 20, force=False)
        assert e.value.message.startswith(f"not enough space for Docker under {mnt}: the bundle needs about ")
        assert "unpacked), 4.0 MiB is free" in e.value.message
        assert e.value.hint == ("free space there (docker image prune, docker system df), or move Docker's data-root; "
                                "or pass --force to try anyway")
        assert _compatibility(index, facts, 8 << 20, force=True)[0].endswith("(--force: trying anyway)")
        remote = DaemonInfo("tcp://10.0.0.9:2375", "20.10.24", "1.41", "overlay2", "/var/lib/docker", "arm64",
                            "linux", False, docker.TRAITS)
        assert _compatibility(index, remote, 8 << 20, force=False)[0].startswith(
            "cannot check free space under /var/lib/docker from here (daemon at tcp://10.0.0.9:2375)")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# --- memory: streaming means the load does not grow with the image -------------------------


MEASURE = """
import os, subprocess, sys
proc = subprocess.Popen([sys.executable, "-m", "imgtool", *sys.argv[1:]], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
if os.waitstatus_to_exitcode(status):
    sys.exit("imgtool exited %d" % os.waitstatus_to_exitcode(status))
print(usage.ru_maxrss * 1024)
"""


def _load_peak_rss(tmp_path, services, size: int, tag: str) -> int:
    store = BlobDir(tmp_path / f"blobs-{tag}")
    layers = [random_layer(size // 2, seed=hash((tag, i)) & 0xFFFF) for i in range(2)]
    image = simple_image(layers, host_arch(), seed=size)
    out = tmp_path / f"b-{tag}"
    write(out, [store.pulled(image, f"{REPO}:{tag}")], store, chunk_size=16 << 20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    env["DOCKER_HOST"] = services.docker_host
    # A small fresh process starts imgtool and reads its rusage: forked straight from pytest, the
    # child's peak RSS would include pytest's own pages before exec.
    r = subprocess.run([sys.executable, "-c", MEASURE, "-q", "load", str(out)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split()[-1]), image


@pytest.mark.engines(stores=True)
def test_load_memory_does_not_grow_with_image_size(tmp_path, services, docker_cli, docker_cleanup):
    small, a = _load_peak_rss(tmp_path, services, 8 << 20, "rss-small")
    big, b = _load_peak_rss(tmp_path, services, 80 << 20, "rss-big")
    docker_cleanup.image(f"{REPO}:rss-small", f"{REPO}:rss-big", a.config_digest, b.config_digest)
    print(f"peak RSS of imgtool load: 8 MB image {small / 2**20:.1f} MiB, 80 MB image {big / 2**20:.1f} MiB")
    assert big - small < 15 << 20, (small, big)


def test_the_verbs_speak_docker_18_09s_api(factory, store, tmp_path, services, docker_cli, docker_cleanup):
    """Kylin V10's Docker 18.09 answers API 1.39: load, reload, --tag, inventory and export pinned to it
    (DOCKER_API_VERSION, as for the docker CLI) work, and never ask for a newer API."""
    from tests.support.daemon import DockerAPIRecorder

    image = factory.image(host_arch(), layers=2)
    out = tmp_path / "b"
    write(out, [store.pulled(image, f"{REPO}:api139")], store)
    docker_cleanup.image(f"{REPO}:api139", "api139:prod", image.config_digest)
    recorder = DockerAPIRecorder(services.docker_host)
    env = {"DOCKER_HOST": f"tcp://{recorder.address}", "DOCKER_API_VERSION": "1.39",
           "IMGTOOL_CACHE": str(tmp_path / "cache")}
    try:
        for args in (("load", str(out)), ("load", str(out), "--tag", "api139:prod"),
                     ("inventory", "-o", str(tmp_path / "inv.json")),
                     ("export", f"{REPO}:api139", "-o", str(tmp_path / "exported"), "--no-tool")):
            r = imgtool(*args, env=env)
            assert r.returncode == 0, (args, r.stderr)
    finally:
        recorder.close()
    assert docker_cli.holds("api139:prod", image)
    assert imgtool("verify", str(tmp_path / "exported")).returncode == 0
    paths = recorder.requests
    assert any(p.startswith("/v1.39/images/load") for p in paths) and any("/images/" in p and "/get" in p for p in paths)
    assert [p for p in paths if not p.startswith("/v1.39/")] == []
    bad = imgtool("load", str(out), env={**env, "DOCKER_API_VERSION": "latest"})
    assert (bad.returncode, bad.stderr.splitlines()[0]) == (
        2, "error: invalid DOCKER_API_VERSION 'latest': give an API version such as 1.39 (Docker 18.09)")


def test_docker_s_invalid_tar_header_is_explained_as_a_zstd_layer_not_an_architecture():
    from imgtool.runtimes.docker import _load_hint

    hint = _load_hint("Error processing tar file(exit status 1): archive/tar: invalid tar header")
    assert hint == ("vllm-ascend FAQ 19: this Docker read a zstd-compressed layer as a plain tar (Docker reads zstd "
                    "only from 23.0 on); upgrade Docker, or bring the image with gzip layers (imgtool fetch "
                    "--layers compat, the default)")


def test_a_bundle_of_many_images_asks_docker_once_not_once_per_image(factory, store, tmp_path, services, docker_cli,
                                                                       docker_cleanup):
    """40 images: a load (and a reload of what is there) lists Docker's images in one request instead of
    inspecting each one three times (14,000 images took 25 s of inspects, against verify's 3 s;
    docs/benchmarks.md). An image with a --tag to add is still inspected to confirm it."""
    from tests.support.daemon import DockerAPIRecorder

    base = factory.layers(1)
    images = [factory.image(host_arch(), layers=1, base=base, layer_size=1_000) for _ in range(40)]
    refs = [f"{REPO}-many{i}:v1" for i in range(len(images))]
    out = tmp_path / "many"
    write(out, [store.pulled(im, ref) for im, ref in zip(images, refs)], store)
    docker_cleanup.image(*refs, "many:extra", *[im.config_digest for im in images])
    recorder = DockerAPIRecorder(services.docker_host)
    env = {"DOCKER_HOST": f"tcp://{recorder.address}"}
    try:
        for args in (("load", str(out)), ("load", str(out)), ("load", str(out), "--tag", f"{refs[0]}=many:extra")):
            before = len(recorder.requests)
            r = imgtool(*args, env=env)
            assert r.returncode == 0, (args, r.stderr)
            asked = recorder.requests[before:]
            inspects = [p for p in asked if "/images/" in p and p.endswith("/json") and "/images/json" not in p]
            listings = [p for p in asked if "/images/json" in p]
            assert len(listings) == 2, asked  # once before, once after (the reloads too)
            assert len(inspects) == (1 if "--tag" in args else 0), inspects
    finally:
        recorder.close()
    for im, ref in zip(images, refs):
        assert docker_cli.holds(ref, im)
    assert docker_cli.holds("many:extra", images[0])
