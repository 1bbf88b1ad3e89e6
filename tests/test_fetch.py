"""`imgtool fetch` and `imgtool export` through the real CLI, against the real registries and dockerd."""

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
import time

import pytest

from imgtool.model import format_size
from tests.support import zygote
from tests.support.bundles import ctrl_c_as_at_a_terminal
from tests.support.images import write_docker_archive
from tests.support.proxy import Fault, FaultProxy, blob_path
from tests.support.registry import push_image
from tests.support.smallfs import fill, free_bytes, small_fs

DEAD = "http://127.0.0.1:1"


def imgtool(*args, env=None, cwd=None, timeout=180):
    return zygote.run(args, env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout)


def write_mirrors(tmp_path, repo, entries):
    """entries: (name, url, prefix, upstream)."""
    out = [f'default_image = "quay.io/{repo}"']
    for name, url, prefix, upstream in entries:
        out.append(f'[[mirrors]]\nname = "{name}"\nregistry = "quay.io"\nurl = "{url}"\ninsecure = true')
        if prefix:
            out.append(f'prefix = "{prefix}"')
        if upstream:
            out.append("upstream = true")
    path = tmp_path / "mirrors.toml"
    path.write_text("\n".join(out) + "\n")
    return path


def parts_of(bundle: Path):
    return [bundle / p["name"] for p in json.loads((bundle / "bundle.json").read_text())["parts"]]


@pytest.mark.engines(stores=True)
def test_arm64_through_daocloud_mirror_with_upstream_down(services, factory, mirrored, tmp_path, docker_cli,
                                                          docker_cleanup):
    idx = factory.multiarch(media="oci", layers=3)
    ms = mirrored(idx, tag="v0.22.1rc1", targets=("daocloud",))
    cfg = write_mirrors(tmp_path, ms.repo, [("quay", DEAD, "", True), ("daocloud", f"http://{services.mirror}", "quay.io", False)])
    r = imgtool("fetch", "v0.22.1rc1", "--arch", "arm64", "--mirrors", str(cfg), "--chunk-size", "1M",
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    bundle = tmp_path / "vllm-ascend-v0.22.1rc1-arm64"  # the default name: image, tag, arch
    assert "bundle: vllm-ascend-v0.22.1rc1-arm64" in r.stdout
    assert "source quay unreachable: 127.0.0.1:1: connection refused" in r.stderr
    assert "platform: linux/arm64" in r.stderr
    info = json.loads((bundle / "bundle.json").read_text())
    image = info["images"][0]
    arm = idx.image("linux/arm64/v8")
    assert image["ref"] == f"quay.io/{ms.repo}:v0.22.1rc1"
    assert image["source"].startswith("daocloud (")
    assert (image["image_id"], image["manifest_digest"], image["index_digest"]) == (
        arm.config_digest, arm.manifest_digest, idx.manifest_digest)
    parts = parts_of(bundle)
    assert len(parts) >= 3
    sums = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=bundle, capture_output=True, text=True)
    assert sums.returncode == 0, sums.stdout + sums.stderr
    # plain docker load of the parts, concatenated in order
    ref = f"quay.io/{ms.repo}:v0.22.1rc1"
    docker_cleanup.image(ref, arm.config_digest)
    cat = subprocess.run(f"cat {' '.join(p.name for p in parts)} | {docker_cli.binary} -H {services.docker_host} load",
                         shell=True, cwd=bundle, capture_output=True, text=True, env=docker_cli.env)
    assert cat.returncode == 0, cat.stderr
    assert docker_cli.holds(ref, arm) and docker_cli.inspect_image(ref)["Architecture"] == "arm64"
    # the same archive is an OCI layout skopeo can read
    archive = tmp_path / "whole.tar"
    with open(archive, "wb") as out:
        for p in parts:
            out.write(p.read_bytes())
    sk = subprocess.run(["skopeo", "inspect", "--config", f"oci-archive:{archive}"], capture_output=True, text=True)
    assert sk.returncode == 0, sk.stderr
    config = json.loads(sk.stdout)
    assert config["architecture"] == "arm64" and config["rootfs"]["diff_ids"] == arm.diff_ids


def test_two_tags_share_layers_stored_once(services, factory, mirrored, tmp_path):
    first = factory.multiarch(layers=2)
    second = factory.multiarch(layers=1, base=first)
    ms = mirrored(first, tag="v0.22.1rc1", targets=("upstream",))
    push_image(services.plain, ms.repo, "v0.22.1rc1-a3", second)
    cfg = write_mirrors(tmp_path, ms.repo, [("quay", f"http://{services.plain}", "", True)])
    out = tmp_path / "b"
    r = imgtool("fetch", "v0.22.1rc1", "v0.22.1rc1-a3", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out),
                "--json", env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["download"]["blobs_downloaded"] == 3  # 2 shared + 1 new layer, each once
    with tarfile.open(parts_of(out)[0]) as tar:
        names = tar.getnames()
    shared = first.image("amd64").layers
    for layer in shared:
        assert names.count(f"blobs/sha256/{layer.digest.split(':')[1]}") == 1
    refs = [i["ref"] for i in json.loads((out / "bundle.json").read_text())["images"]]
    assert refs == [f"quay.io/{ms.repo}:v0.22.1rc1", f"quay.io/{ms.repo}:v0.22.1rc1-a3"]


def test_each_layer_is_written_once_and_a_later_fetch_copies_it_from_the_bundle_it_went_into(services, factory,
                                                                                              mirrored, tmp_path):
    """An uncompressed bundle takes each layer from the network straight into its parts (bundle/regions.py): the cache
    keeps where it lies, not a copy. A later fetch sharing layers copies them from that bundle, hashed, instead of
    downloading them; a layer the bundle no longer holds as it was (a byte changed, the bundle removed) is
    downloaded again, and every bundle verifies."""
    base = factory.layers(2, 1_500_000)  # each across two 1 MiB parts
    first = factory.image("amd64", layers=0, base=base)
    second = factory.image("amd64", layers=1, base=base, layer_size=500_000)
    ms = mirrored(first, tag="v1", targets=("upstream",))
    push_image(services.plain, ms.repo, "v2", second)
    proxy = FaultProxy(services.plain)
    try:
        cfg = write_mirrors(tmp_path, ms.repo, [("quay", proxy.url, "", True)])
        cache = tmp_path / "cache"

        def fetch(tag: str, out: str, *more: str):
            r = imgtool("fetch", tag, "--arch", "amd64", "--mirrors", str(cfg), "-o", str(tmp_path / out), "--no-tool",
                        "--chunk-size", "1M", "--json", *more, env={"IMGTOOL_CACHE": str(cache)})
            assert r.returncode == 0, r.stderr
            assert imgtool("verify", str(tmp_path / out)).returncode == 0
            return json.loads(r.stdout)["download"]

        def downloaded():
            got = {rec.path.rsplit(":", 1)[1] for rec in proxy.records if blob_path(rec.path) and rec.method == "GET"}
            proxy.clear()
            return got

        shared, new = [x.digest[7:] for x in base], second.layers[-1].digest[7:]
        fetch("v1", "b1")
        assert downloaded() >= set(shared)
        assert not {p.name for p in (cache / "blobs" / "sha256").iterdir()} & set(shared)  # written once: the bundle's
        assert {p.name for p in (cache / "located" / "sha256").iterdir()} == set(shared)

        assert fetch("v2", "b2")["blobs_cached"] == 2
        assert downloaded() & {*shared, new} == {new}  # the shared layers came from b1

        # where the cache now says the first shared layer lies (b2), one byte changes: that layer comes again
        located = json.loads((cache / "located" / "sha256" / shared[0]).read_text())["regions"]
        path, offset, _ = located[0]
        with open(path, "r+b") as f:
            f.seek(offset + 10)
            byte = f.read(1)
            f.seek(offset + 10)
            f.write(bytes([byte[0] ^ 1]))
        assert fetch("v2", "b3")["blobs_cached"] == 2  # the other shared layer, and the new one from b2
        assert downloaded() & {*shared, new} == {shared[0]}

        for out in ("b1", "b2", "b3"):
            shutil.rmtree(tmp_path / out)
        assert fetch("v2", "b4")["blobs_cached"] == 0
        assert downloaded() & {*shared, new} == {*shared, new}
        # a compressed bundle goes through the cache: the layers are copied into it from b4, not downloaded
        assert fetch("v2", "g", "--compress", "gzip")["blobs_cached"] == 3
        assert not downloaded() & {*shared, new}
        assert {p.name for p in (cache / "blobs" / "sha256").iterdir()} >= {*shared, new}
    finally:
        proxy.close()


def _placed_whole(out: Path, hex_: str) -> bool:
    """The unfinished bundle's record says the layer is all there (bundle/regions.py)."""
    try:
        record = json.loads((out / f".imgtool-slots-{hex_}.json").read_text())
    except (OSError, ValueError):
        return False
    return record["done"] == [[0, record["size"]]]


def test_killed_fetch_leaves_no_bundle_json_and_rerun_keeps_finished_layers(services, factory, mirrored, tmp_path):
    idx = factory.multiarch(layers=4, layer_size=1 << 20)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    proxy = FaultProxy(services.plain)
    try:
        layers = {lay.digest.split(":")[1] for lay in idx.image("amd64").layers}
        # one connection: two layer downloads go through, the third is held at the proxy, so
        # the kill lands between layers however fast or slow this machine is
        gate = proxy.gate(lambda m, p: m == "GET" and blob_path(p) and p.rsplit(":", 1)[1] in layers, requests=2)
        cfg = write_mirrors(tmp_path, ms.repo, [("quay", proxy.url, "", True)])
        out, cache = tmp_path / "b", tmp_path / "cache"
        cmd = [sys.executable, "-m", "imgtool", "fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out),
               "--connections", "1"]
        proc = subprocess.Popen(cmd, env={**os.environ, "IMGTOOL_CACHE": str(cache)}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            assert gate.reached.wait(120), "the fetch never asked for a third layer"
            done = set()
            deadline = time.monotonic() + 60
            while len(done) < 2 and time.monotonic() < deadline:  # the two layers let through land in the bundle
                done = {hex_ for hex_ in layers if _placed_whole(out, hex_)}
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            gate.release()
        assert len(done) == 2, "the two layers let through were not written whole into the unfinished bundle"
        assert not (out / "bundle.json").exists()
        assert not [p for p in (cache / "blobs/sha256").iterdir() if p.name in layers]  # each layer written once
        proxy.clear()
        r = imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out), "--json",
                    env={"IMGTOOL_CACHE": str(cache)})
        assert r.returncode == 0, r.stderr
        fetched_again = {rec.path.rsplit(":", 1)[1] for rec in proxy.records if blob_path(rec.path) and rec.method == "GET"}
        assert not (fetched_again & done)  # finished layers are never downloaded twice
        assert json.loads(r.stdout)["download"]["blobs_cached"] >= len(done)
        assert (out / "bundle.json").exists()
    finally:
        proxy.close()


@pytest.mark.parametrize("args,line", [
    (["--chunk-size", "4X"], "error: invalid --chunk-size '4X': use a carrier (fat32, dvd, dvd-dl, bd25, bd50) or a "
                             "number with an optional unit K, M, G, T (binary), e.g. 700M"),
    (["--chunk-size", "0"], "error: invalid --chunk-size '0': must be greater than zero"),
    (["--arch", "sparc"], "error: unknown architecture 'sparc' in 'sparc'"),
    (["--arch", "arm64", "--platform", "linux/arm64"], "error: --arch and --platform cannot be used together"),
    (["--connections", "0"], "error: invalid --connections 0: use 1 to 64"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, line):
    cfg = write_mirrors(tmp_path, "ascend/vllm-ascend", [("quay", DEAD, "", True)])
    r = imgtool("fetch", "v0.22.1rc1", "--mirrors", str(cfg), "-o", str(tmp_path / "out"), *args)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == line
    assert "Traceback" not in r.stderr and not (tmp_path / "out" / "bundle.json").exists()


def test_unknown_compression_and_existing_output(tmp_path):
    r = imgtool("fetch", "v1", "--compress", "lz4")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == "error: invalid value for '--compress': 'lz4' is not one of 'none', 'gzip', 'zstd'"
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("x")
    r = imgtool("fetch", "v1", "-o", str(out))
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == f"error: output directory {out} already exists and is not empty"
    assert (out / "old.txt").exists()  # nothing touched without --force


def test_rerun_replaces_an_unfinished_bundle_but_never_foreign_files(services, factory, mirrored, tmp_path):
    ms = mirrored(factory.multiarch(layers=1), tag="v1", targets=("upstream",))
    cfg = write_mirrors(tmp_path, ms.repo, [("quay", f"http://{services.plain}", "", True)])
    out = tmp_path / "b"
    out.mkdir()
    for name in ("b.tar.part001", "b.tar.part002", "load.sh", ".b.tar.part003.tmp-99"):
        (out / name).write_bytes(b"left by a killed fetch")
    env = {"IMGTOOL_CACHE": str(tmp_path / "cache")}
    r = imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out), "--chunk-size", "64M", env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("b.tar")) == ["b.tar"]
    assert imgtool("verify", str(out)).returncode == 0
    (out / "bundle.json").unlink()
    (out / "notes.txt").write_text("mine")
    r = imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out), env=env)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == f"error: output directory {out} already exists and is not empty"


def test_unwritable_output_is_one_error(services, factory, mirrored, tmp_path):
    ms = mirrored(factory.multiarch(layers=1), tag="v1", targets=("upstream",))
    cfg = write_mirrors(tmp_path, ms.repo, [("quay", f"http://{services.plain}", "", True)])
    locked = tmp_path / "ro"
    locked.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(locked), str(locked)], check=True)
    try:
        r = imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(locked / "b"),
                    env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    finally:
        subprocess.run(["umount", str(locked)], check=True)
    assert r.returncode == 1, r.stderr
    assert len([lay for lay in r.stderr.splitlines() if lay.startswith("error:")]) == 1
    assert "Read-only file system" in r.stderr or "read-only" in r.stderr.lower()
    assert not (locked / "b" / "bundle.json").exists()


@pytest.mark.engines
def test_export_round_trips_through_a_daemon_without_the_image(services, factory, tmp_path, docker_cli,
                                                               docker_cleanup):
    image = factory.image("amd64", layers=3, layer_size=1 << 20)
    ref = f"quay.io/{tmp_path.name.lower()[:20]}x/vllm-ascend:v0.22.1rc1"
    archive = tmp_path / "in.tar"
    write_docker_archive(image, archive, ref)
    docker_cleanup.image(ref, image.config_digest)
    docker_cli("load", "-i", archive)
    out = tmp_path / "exported"
    env = {"DOCKER_HOST": services.docker_host, "IMGTOOL_CACHE": str(tmp_path / "cache")}
    r = imgtool("export", ref, "-o", str(out), "--chunk-size", "1M", "--json", env=env)
    assert r.returncode == 0, r.stderr
    info = json.loads((out / "bundle.json").read_text())
    layers = info["images"][0]["layers"]
    assert [lay["diff_id"] for lay in layers] == image.diff_ids
    assert all(lay["media_type"] == "application/vnd.docker.image.rootfs.diff.tar.gzip" for lay in layers)
    assert info["images"][0]["image_id"] == image.config_digest
    # a second export gives the same layer digests (deterministic gzip)
    again = imgtool("export", ref, "-o", str(tmp_path / "again"), "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert [lay["digest"] for lay in json.loads((tmp_path / "again" / "bundle.json").read_text())["images"][0]["layers"]] == \
        [lay["digest"] for lay in layers]
    docker_cli("image", "rm", ref)
    assert docker_cli.find(image) is None
    loaded = imgtool("load", str(out), env=env)
    assert loaded.returncode == 0, loaded.stderr
    assert docker_cli.holds(ref, image)


def test_export_of_a_missing_image_is_one_line(services, tmp_path):
    r = imgtool("export", "quay.io/nope/none:v0", "-o", str(tmp_path / "o"), env={"DOCKER_HOST": services.docker_host})
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == "error: image quay.io/nope/none:v0 is not in the local Docker"


def test_a_dead_network_fails_before_imgtool_pyz_is_built(tmp_path):
    """fetch resolves first: with no source reachable it stops before spending time on the pyz."""
    cfg = write_mirrors(tmp_path, "ascend/vllm-ascend", [("quay", DEAD, "", True)])
    cache = tmp_path / "cache"
    r = imgtool("fetch", "v0.22.1rc1", "--mirrors", str(cfg), "-o", str(tmp_path / "out"),
                env={"IMGTOOL_CACHE": str(cache)})
    assert r.returncode == 4
    assert r.stderr.splitlines() == [
        "error: no source can serve quay.io/ascend/vllm-ascend:v0.22.1rc1: "
        "quay (127.0.0.1:1/ascend/vllm-ascend): 127.0.0.1:1: connection refused",
        "hint: check the network or proxy, or force a source with --mirror NAME",
    ]
    assert not (cache / "tool").exists()  # the pyz was never built


@pytest.mark.parametrize("name,quoted", [
    ("vllm-ascend-v1", False),  # a plain path stays as it is
    ("离线 bundle's", True),  # a space, 中文 and a quote: quoted as a shell needs
])
def test_offline_command_pastes_into_a_shell(services, factory, mirrored, tmp_path, name, quoted):
    idx = factory.multiarch(media="oci", layers=1)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    cfg = write_mirrors(tmp_path, ms.repo, [("quay", f"http://{services.plain}", "", True)])
    out = tmp_path / name
    r = imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out),
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    sha = hashlib.sha256((out / "bundle.json").read_bytes()).hexdigest()
    tool = hashlib.sha256((out / "imgtool.pyz").read_bytes()).hexdigest()
    pyz, d = shlex.quote(str(out / "imgtool.pyz")), shlex.quote(str(out))
    assert r.stdout.splitlines()[-5:] == [
        f"bundle.json sha256: {sha}",
        f"imgtool.pyz sha256: {tool}   (publish both out of band: a host checks the tool with sha256sum before it "
        "installs it)",
        f"offline side: imgtool verify {d} --expect {sha} && imgtool load {d}   (the host's installed imgtool: it "
        "refuses an edited bundle)",
        f"first time on a host: sha256sum {pyz} (the value above), then: python3 {pyz} self-install",
        f"without an installed imgtool: python3 {pyz} load {d}, or: sh {shlex.quote(str(out / 'load.sh'))}   "
        "(damage only: an edited bundle brings its own checker)"]
    line = r.stdout.splitlines()[-3]
    assert (shlex.quote(str(out)) != str(out)) == quoted
    # pasted into a shell, the verify half runs on the right directory
    verify = line[len("offline side: "):line.index(" && ")]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran = subprocess.run(["sh", "-c", verify], capture_output=True, text=True, env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(f"ok: {out}: 1 image(s)")


def test_ctrl_c_says_what_was_kept_and_the_rerun_resumes(services, factory, mirrored, tmp_path):
    idx = factory.multiarch(layers=3, layer_size=1 << 20)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    proxy = FaultProxy(services.plain)
    try:
        # the layers' bytes are held after the first 1.5 MiB, and the rest is slow (~10 s): the Ctrl-C
        # lands mid-download, a layer done and the next part-way, whatever this machine's speed
        held = proxy.gate(lambda m, p: blob_path(p) and m == "GET", bytes=3 << 19)
        slow = proxy.add(Fault("rate", lambda m, p: blob_path(p) and m == "GET", times=10_000, rate=300_000))
        cfg = write_mirrors(tmp_path, ms.repo, [("quay", proxy.url, "", True)])
        out, cache = tmp_path / "b", tmp_path / "cache"
        args = ("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out), "--connections", "1", "-q")
        proc = subprocess.Popen([sys.executable, "-m", "imgtool", *args], env={**os.environ, "IMGTOOL_CACHE": str(cache)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_as_at_a_terminal)
        assert held.reached.wait(60), "the fetch never reached the held bytes"
        assert proxy.wait_delivered()  # what was let through is in imgtool's hands
        proc.send_signal(signal.SIGINT)
        held.release()  # bytes flow again (slowly) while the interrupt is handled
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert err.splitlines()[-2:] == [
            f"error: interrupted: finished layers and partial downloads are kept in the unfinished bundle {out} "
            "(it has no bundle.json)",
            "hint: run the same command again to resume: it downloads only what is missing and finishes the bundle",
        ]
        assert not (out / "bundle.json").exists()
        assert list(out.glob(".imgtool-slots-*.json"))  # something was kept, where the layers go
        slow.times = 0
        r = imgtool(*args, env={"IMGTOOL_CACHE": str(cache)})
        assert r.returncode == 0, r.stderr
        assert (out / "bundle.json").exists()
    finally:
        proxy.close()


HOLD_BLOB_LOCK = """
import sys
from pathlib import Path
from imgtool.model import Digest
from imgtool.store import Store
unlock = Store(Path(sys.argv[1])).lock_blob(Digest.parse(sys.argv[2]))
print("held", flush=True)
sys.stdin.readline()
unlock()
"""


def test_a_blob_another_imgtool_is_fetching_is_waited_for_and_said_once(services, factory, mirrored, tmp_path):
    image = factory.image("amd64", layers=2, layer_size=1 << 16)
    ms = mirrored(image, tag="v1", targets=("upstream",))
    cfg = write_mirrors(tmp_path, ms.repo, [("quay", f"http://{services.plain}", "", True)])
    out, cache = tmp_path / "b", tmp_path / "cache"
    layer = image.layers[1].digest
    holder = subprocess.Popen([sys.executable, "-c", HOLD_BLOB_LOCK, str(cache), layer],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        proc = subprocess.Popen([sys.executable, "-m", "imgtool", "fetch", "v1", "--arch", "amd64", "--mirrors",
                                 str(cfg), "-o", str(out)], env={**os.environ, "IMGTOOL_CACHE": str(cache)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = f"waiting for another imgtool fetching {layer[7:19]} (pid {holder.pid})"
        lines = []
        hang = threading.Timer(120, proc.kill)  # silent waiting would hang here: that fails instead
        hang.start()
        for line in proc.stderr:  # it says so, and then waits: the fetch cannot end while the lock is held
            lines.append(line.rstrip("\n"))
            if line.rstrip("\n") == said:
                break
        hang.cancel()
        assert lines and lines[-1] == said, lines
        holder.stdin.write("\n")
        holder.stdin.flush()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert said not in err.splitlines()  # once
        assert (out / "bundle.json").exists()
    finally:
        holder.kill()
        holder.wait(30)


def _export_killed_mid_layer(services, ref: str, cache: Path, out: Path, during=None):
    """`imgtool export` killed while a layer is being gzip-compressed into the cache: the docker save
    stream is held mid-layer, so the kill lands inside the layer's temp file however fast this machine
    is. `during()` runs while the export is held (alive). Returns the temp files it left."""
    from tests.support.daemon import DockerAPIRecorder

    relay = DockerAPIRecorder(services.docker_host, hold_after=20 << 20)  # past 8 MiB of reads ahead
    proc = subprocess.Popen([sys.executable, "-m", "imgtool", "export", ref, "-o", str(out)],
                            env={**os.environ, "IMGTOOL_CACHE": str(cache), "DOCKER_HOST": f"tcp://{relay.address}"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert relay.reached.wait(120), "docker save never sent 20 MiB"
        deadline = time.monotonic() + 120  # the export is held, so its temp file comes and stays
        while not list((cache / "partial").glob("export.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.05)
        if during is not None:
            during()
    finally:
        proc.kill()
        proc.wait()
        relay.close()
    left = sorted((cache / "partial").glob("export.*.tmp"))
    assert left and all(f".{proc.pid}." in p.name for p in left), (left, proc.stderr.read()[-2000:])
    assert not (out / "bundle.json").exists()
    return left


def test_an_export_whose_docker_save_is_cut_fails_in_one_line_and_leaves_nothing(services, factory, tmp_path,
                                                                                   docker_cli, docker_cleanup):
    """Docker's answer ends mid-layer (the connection broke): one line naming how far it got, exit 5, no bundle and
    no temp file in the cache."""
    from tests.support.daemon import DockerAPIRecorder

    image = factory.image("amd64", layers=1, layer_size=12 << 20)
    ref = f"quay.io/{tmp_path.name.lower()[:20]}c/vllm-ascend:v1"
    write_docker_archive(image, tmp_path / "in.tar", ref)
    docker_cleanup.image(ref, image.config_digest)
    docker_cli("load", "-i", tmp_path / "in.tar")
    relay = DockerAPIRecorder(services.docker_host, hold_after=8 << 20, cut=True)
    cache = tmp_path / "cache"
    try:
        r = imgtool("export", ref, "-o", str(tmp_path / "out"), "--no-tool",
                    env={"IMGTOOL_CACHE": str(cache), "DOCKER_HOST": f"tcp://{relay.address}"})
    finally:
        relay.close()
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 5, r.stderr
    assert len(errors) == 1 and re.fullmatch(
        rf"error: docker save {re.escape(ref)} failed after [78]\.\d MiB: Docker's answer was cut short", errors[0]), errors
    assert not (tmp_path / "out").exists()
    assert not list((cache / "partial").glob("*.tmp"))


@pytest.mark.parametrize("engine", ["26.1"], indirect=True)
def test_temp_files_of_a_killed_export_are_removed_by_the_next_export_and_fetch(
        engine, services, factory, mirrored, tmp_path, docker_cli, docker_cleanup):
    image = factory.image("amd64", layers=1, layer_size=12 << 20)  # a ~29 MiB tar in docker save
    ref = f"quay.io/{tmp_path.name.lower()[:20]}x/vllm-ascend:v0.22.1rc1"
    write_docker_archive(image, tmp_path / "in.tar", ref)
    docker_cleanup.image(ref, image.config_digest)
    docker_cli("load", "-i", tmp_path / "in.tar")
    cache = tmp_path / "cache"
    small = factory.multiarch(layers=1)
    ms = mirrored(small, tag="v1", targets=("upstream",))
    cfg = write_mirrors(tmp_path, ms.repo, [("quay", f"http://{services.plain}", "", True)])

    def fetch(out):
        return imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out), "--no-tool",
                       env={"IMGTOOL_CACHE": str(cache)})

    # a fetch beside a live export leaves its temp file alone (its pid is alive)
    held = []
    left = _export_killed_mid_layer(services, ref, cache, tmp_path / "x1",
                                    during=lambda: held.append((fetch(tmp_path / "f0"),
                                                                sorted((cache / "partial").glob("*.tmp")))))
    assert held[0][0].returncode == 0, held[0][0].stderr
    assert held[0][1] == left and "temp file" not in held[0][0].stderr
    # a file whose pid is dead but whose lock is held (a reused pid, another pid namespace) stays too
    ended = subprocess.Popen(["true"])
    ended.wait()
    locked = cache / "partial" / f"export.{ended.pid}.1.2.tmp"
    locked.write_bytes(b"being written elsewhere")
    with open(locked, "rb") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        size = sum(p.stat().st_size for p in left)
        r = imgtool("export", ref, "-o", str(tmp_path / "e1"), env={"IMGTOOL_CACHE": str(cache),
                                                                    "DOCKER_HOST": services.docker_host})
        assert r.returncode == 0, r.stderr
        assert (f"removed 1 temp file ({format_size(size)}) that killed imgtool processes left in "
                f"{cache / 'partial'}") in r.stderr.splitlines(), r.stderr
        assert sorted((cache / "partial").glob("*.tmp")) == [locked]
    locked.unlink()
    assert imgtool("verify", str(tmp_path / "e1")).returncode == 0
    layers = json.loads((tmp_path / "e1" / "bundle.json").read_text())["images"][0]["layers"]
    assert [x["diff_id"] for x in layers] == image.diff_ids

    # fetch removes them as well
    left = _export_killed_mid_layer(services, ref, cache, tmp_path / "x2")
    size = sum(p.stat().st_size for p in left)
    r = fetch(tmp_path / "f1")
    assert r.returncode == 0, r.stderr
    assert (f"removed 1 temp file ({format_size(size)}) that killed imgtool processes left in "
            f"{cache / 'partial'}") in r.stderr.splitlines(), r.stderr
    assert not list((cache / "partial").glob("*.tmp"))
    assert imgtool("verify", str(tmp_path / "f1")).returncode == 0


def test_a_dead_proxy_is_named_with_its_variable(services, tmp_path):
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/ascend/vllm-ascend"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "https://{services.tls}"\nupstream = true\nca_cert = "{services.tls_ca}"\n')
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    r = subprocess.run([sys.executable, "-m", "imgtool", "fetch", "v1", "--mirrors", str(cfg), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=180,
                       env={**env, "https_proxy": "http://127.0.0.1:1", "IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert (r.returncode, r.stderr.splitlines()[0]) == (4, (
        f"error: no source can serve quay.io/ascend/vllm-ascend:v1: quay ({services.tls}/ascend/vllm-ascend): "
        f"cannot reach the proxy http://127.0.0.1:1 (from $https_proxy) for {services.tls}: connection refused")), \
        r.stderr


def test_a_passphrase_key_without_a_terminal_is_refused_before_the_download(services, factory, mirrored, tmp_path):
    """stdin not a tty and no controlling terminal (a new session), as under cron or CI: ssh-keygen cannot
    ask the passphrase, so the key is refused before anything is fetched, not after the whole download."""
    key = tmp_path / "release"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret", "-C", "release", "-f", str(key)], check=True)
    ms = mirrored(factory.multiarch(layers=1), tag="v1", targets=("upstream",))
    proxy = FaultProxy(services.plain)
    try:
        cfg = write_mirrors(tmp_path, ms.repo, [("quay", proxy.url, "", True)])
        r = subprocess.run([sys.executable, "-m", "imgtool", "fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg),
                            "-o", str(tmp_path / "b"), "--sign-key", str(key)], stdin=subprocess.DEVNULL,
                           start_new_session=True, capture_output=True, text=True, timeout=180,
                           env={**os.environ, "IMGTOOL_CACHE": str(tmp_path / "cache")})
        assert (r.returncode, r.stderr.splitlines()[-2:]) == (2, [
            f"error: --sign-key {key}: ssh-keygen cannot sign with it without a terminal to ask its passphrase on; "
            "nothing was downloaded",
            "hint: load the key into ssh-agent (ssh-add KEY) and give its .pub: --sign-key KEY.pub; or run on a "
            "terminal, where its passphrase is asked"]), r.stderr
        assert proxy.records == [] and not (tmp_path / "b").exists()
    finally:
        proxy.close()


def test_compat_rewrite_is_counted_at_its_gzip_size_and_refused_up_front(services, factory, mirrored, tmp_path):
    """`--layers compat` writes each zstd layer again as gzip (level 1: bigger than the zstd) into the
    cache and the bundle. On a real ext4 file system with room for the zstd blobs and two copies at their
    zstd size, but not at the gzip estimate (1.1x), fetch refuses before a layer is asked for, naming
    the bytes it needs and what is free; before, it counted the rewrite at the zstd size, started, and
    failed half-way with the disk full."""
    image = factory.zstd_twin(factory.image("amd64", layers=3, layer_size=2 << 20))
    ms = mirrored(factory.index([image]), tag="z1", targets=("upstream",))
    proxy = FaultProxy(services.plain)
    try:
        cfg = write_mirrors(tmp_path, ms.repo, [("quay", proxy.url, "", True)])
        with small_fs(tmp_path / "disk", 48 << 20) as disk:
            zstd = sum(x.size for x in image.layers)
            gzip = sum(int(x.size * 1.1) for x in image.layers)  # the estimate of each rewritten layer
            old, new = 3 * zstd + image.config_size, zstd + 2 * gzip + image.config_size
            fill(disk, (old + new) // 2 + (64 << 10))
            cache, out = disk / "cache", disk / "z1"
            r = imgtool("fetch", "z1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out), "--no-tool",
                        "--layers", "compat", env={"IMGTOOL_CACHE": str(cache)})
            assert (r.returncode, r.stderr.splitlines()[-2:]) == (1, [
                f"error: not enough space: fetch needs {format_size(zstd + gzip)} in {cache} and "
                f"{format_size(gzip + image.config_size)} in {out} ({format_size(free_bytes(disk))} free)",
                "hint: free space there, or point IMGTOOL_CACHE or --output at a bigger disk (zstd layers rewritten "
                "as gzip are counted at 1.1x their size); nothing was downloaded"]), r.stderr
            assert not [rec for rec in proxy.records if blob_path(rec.path) and rec.path.rsplit(":", 1)[1]
                        in {x.digest.split(":")[1] for x in image.layers}]
            assert not out.exists()
            assert not list((cache / "blobs" / "sha256").iterdir()) or all(
                p.stat().st_size < 4096 for p in (cache / "blobs" / "sha256").iterdir())  # the config only
    finally:
        proxy.close()


def test_not_enough_space_is_refused_before_the_download_and_a_delta_needs_less(services, factory, mirrored,
                                                                                 tmp_path):
    """The cache and the output on one 20 MiB file system (ext4, loop-mounted): a 13 MiB image fetched into a
    compressed bundle needs it twice (the blobs in the cache, the bundle beside them), so fetch refuses before
    downloading; a delta against the bundle of the previous tag needs only the new layer, and fits. Into an
    uncompressed bundle each layer is written once, straight into the archive (bundle/regions.py): it fits, and
    the cache holds none of the layers."""
    base = factory.layers(2, 6 << 20)
    old, new = factory.image("amd64", layers=0, base=base), factory.image("amd64", layers=1, base=base,
                                                                          layer_size=1 << 20)
    ms = mirrored(old, tag="v1", targets=("upstream",))
    push_image(services.plain, ms.repo, "v2", new)
    proxy = FaultProxy(services.plain)
    try:
        cfg = write_mirrors(tmp_path, ms.repo, [("quay", proxy.url, "", True)])
        r = imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(tmp_path / "v1"), "--no-tool",
                    env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
        assert r.returncode == 0, r.stderr
        proxy.clear()
        with small_fs(tmp_path / "disk", 20 << 20) as disk:
            cache, out = disk / "cache", disk / "v2"
            fetch_v2 = ("fetch", "v2", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out), "--no-tool")
            r = imgtool(*fetch_v2, "--compress", "gzip", env={"IMGTOOL_CACHE": str(cache)})
            st = os.statvfs(disk)
            layers = sum(x.size for x in new.layers)
            assert (r.returncode, r.stderr.splitlines()[-2:]) == (1, [
                f"error: not enough space: fetch needs {format_size(layers)} in {cache} and "
                f"{format_size(layers)} in {out} ({format_size(st.f_bavail * st.f_frsize)} free)",
                "hint: free space there, or point IMGTOOL_CACHE or --output at a bigger disk; nothing was downloaded"]), \
                r.stderr
            assert not [rec for rec in proxy.records if blob_path(rec.path) and rec.path.rsplit(":", 1)[1]
                        in {x.digest.split(":")[1] for x in new.layers}]
            assert not out.exists()
            r = imgtool(*fetch_v2, "--compress", "gzip", "--base", str(tmp_path / "v1"),
                        env={"IMGTOOL_CACHE": str(cache)})
            assert r.returncode == 0, r.stderr
            assert imgtool("verify", str(out)).returncode == 0
            shutil.rmtree(out)
            cached = {p.name for p in (cache / "blobs" / "sha256").iterdir()}  # the delta's new layer
            r = imgtool(*fetch_v2, env={"IMGTOOL_CACHE": str(cache)})
            assert r.returncode == 0, r.stderr
            assert imgtool("verify", str(out)).returncode == 0
            assert {p.name for p in (cache / "blobs" / "sha256").iterdir()} == cached
    finally:
        proxy.close()


def test_ctrl_c_during_a_retry_after_wait_ends_the_fetch_at_once(services, factory, mirrored, tmp_path):
    """A registry answering 503 with `Retry-After: 60` to every layer: the wait before the retry is on the
    run's cancel event, so Ctrl-C ends it at once (a plain sleep held the download thread, and exit, for
    minutes). The signal is sent once the first layer request has reached the registry."""
    idx = factory.multiarch(layers=2, layer_size=1 << 20)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    layers = {x.digest for x in idx.image("linux/amd64").layers}
    proxy = FaultProxy(services.plain)
    try:
        busy = proxy.add(Fault("status", lambda m, p: m == "GET" and p.rsplit("/", 1)[-1] in layers, times=10_000,
                               status=503, headers={"Retry-After": "60"}))
        cfg = write_mirrors(tmp_path, ms.repo, [("quay", proxy.url, "", True)])
        out, cache = tmp_path / "b", tmp_path / "cache"
        # --compress gzip: the layers go through the cache (the Ctrl-C test above has them in the bundle)
        proc = subprocess.Popen([sys.executable, "-m", "imgtool", "fetch", "v1", "--arch", "amd64", "--mirrors",
                                 str(cfg), "-o", str(out), "-q", "--compress", "gzip"],
                                env={**os.environ, "IMGTOOL_CACHE": str(cache)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_as_at_a_terminal)
        try:
            assert busy.arrived.wait(120), "no layer request reached the registry"
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)  # a hang fails here: the wait was 60 s per try
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == 130, err
        assert err.splitlines() == [
            f"error: interrupted: finished layers and partial downloads are kept in the cache ({cache}); "
            "the bundle was not finished (it has no bundle.json)",
            "hint: run the same command again to resume: it downloads only what is missing and finishes the bundle",
        ]
    finally:
        proxy.close()


# --- strings from outside are data (issue 35, cases 1 and 6) ------------------------------------------------


def error_lines(r):
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:"))]


def test_a_config_whose_variant_is_a_command_is_refused_and_nothing_is_written(services, factory, mirrored, tmp_path):
    """Case 1: a mirror's config with `"variant": "v8\\ntouch X\\n#"` used to be written raw into a comment
    line of load.sh (whose next line was then the command) with exit 0."""
    marker = tmp_path / "owned"
    image = factory.image("arm64", layers=1, variant=f"v8\ntouch {marker}\n#")
    ms = mirrored(image, tag="v1", targets=("upstream",))
    cfg = write_mirrors(tmp_path, ms.repo, [("quay", f"http://{services.plain}", "", True)])
    out = tmp_path / "b"
    r = imgtool("fetch", "v1", "--arch", "arm64", "--mirrors", str(cfg), "-o", str(out), "--no-tool",
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 4, r.stderr
    assert error_lines(r) == [
        f"error: quay.io/{ms.repo}:v1: malformed image config: `variant` is not a platform token: "
        f"'v8\\ntouch {marker}\\n#'",
        "hint: expected a short lowercase word such as linux, arm64, v8 ([a-z0-9._-])"]
    assert not (out / "load.sh").exists() and not (out / "bundle.json").exists()
    assert not marker.exists()


def test_an_index_entry_whose_config_says_another_architecture_is_refused_naming_both(services, factory, mirrored,
                                                                                      tmp_path):
    """Case 1: an index entry saying amd64 whose config says arm64 gave `fetch --arch amd64` an arm64 bundle."""
    import dataclasses

    arm = factory.image("arm64", layers=1)
    liar = dataclasses.replace(arm, architecture="amd64", variant=None)  # the same manifest, listed as amd64
    index = factory.index([liar, factory.image("s390x", layers=1)])
    ms = mirrored(index, tag="v1", targets=("upstream",))
    cfg = write_mirrors(tmp_path, ms.repo, [("quay", f"http://{services.plain}", "", True)])
    out = tmp_path / "b"
    r = imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(out), "--no-tool",
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 4, r.stderr
    assert error_lines(r) == [
        f"error: quay.io/{ms.repo}:v1: the image index lists manifest {arm.manifest_digest[7:19]} as linux/amd64, "
        "but its config says linux/arm64/v8; refusing it for linux/amd64",
        f"hint: the source that served it (quay ({services.plain}/{ms.repo})) is inconsistent: try another "
        "with --mirror NAME, or tell the image's publisher"]
    assert not (out / "bundle.json").exists()


def test_a_digest_mismatch_says_expected_and_got_and_names_the_source(services, factory, mirrored, tmp_path):
    """Issue 35 case 10: an image asked for by digest, whose only source answers with another digest (a proxy in
    front of the registry rewrites Docker-Content-Digest), ended `from any source: ` with an empty reason after a
    warning blaming "a stale cache?". Now one line names the source with the digest expected and the one it got."""
    idx, other = factory.multiarch(layers=1), factory.multiarch(layers=1)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    proxy = FaultProxy(services.plain)
    try:
        proxy.add(Fault("status", lambda m, p: m == "HEAD" and idx.manifest_digest in p, times=100, status=200,
                        headers={"Docker-Content-Digest": other.manifest_digest,
                                 "Content-Type": idx.manifest_media_type}))
        cfg = write_mirrors(tmp_path, ms.repo, [("quay", proxy.url, "", True)])
        ref = f"quay.io/{ms.repo}@{idx.manifest_digest}"
        r = imgtool("fetch", ref, "--arch", "amd64", "--mirrors", str(cfg), "-o", str(tmp_path / "b"), "--no-tool",
                    env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
        source = f"quay ({proxy.hostport}/{ms.repo})"
        assert r.returncode == 4, r.stderr
        assert [x for x in r.stderr.splitlines() if x.startswith(("error:", "hint:", "warning:"))] == [
            f"error: no source serves {ref} under its digest: {source}: expected {idx.manifest_digest}, "
            f"got {other.manifest_digest}",
            "hint: a digest names its content: these sources (or a proxy between) answer with other content; try "
            "another source with --mirror NAME"]
        assert not (tmp_path / "b").exists()
    finally:
        proxy.close()
