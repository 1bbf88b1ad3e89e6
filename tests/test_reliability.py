"""Nothing is lost under faults and bad input: the real CLI against real registries behind a fault proxy.

Every fault test runs `imgtool fetch` in a subprocess through `tests/support/proxy.py` and
asserts one of two outcomes: the bundle is byte-identical to a clean fetch (bundle.json
without `created`, and every part and file by sha256), or, when every source fails, exit 4
with one line naming each source and its last error. After every run the cache is scanned:
each file in `blobs/sha256` hashes to its name. docs/reliability.md lists every case here
(a test checks that).
"""

import hashlib
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from imgtool.model import format_size
from tests.support import zygote
from tests.support.bundles import damaged_part_line
from tests.support.images import ImageFactory
from tests.support.proxy import Fault, FaultProxy
from tests.support.registry import publish_mirrored

ROOT = Path(__file__).resolve().parent.parent
TAG = "v0.22.1rc1"
LAYER_SIZE = 1 << 20


# --- helpers ------------------------------------------------------------------------------------


def run(*args, env=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "IMGTOOL_"))
         or k.startswith("IMGTOOL_TEST_")}
    e.update(env or {})
    return zygote.run(args, env=e, timeout=timeout, cwd=ROOT)


def start(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "IMGTOOL_"))
         or k.startswith("IMGTOOL_TEST_")}
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "imgtool", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=e, cwd=str(ROOT))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fingerprint(out: Path):
    """What must not depend on faults: bundle.json and the archive parts, by sha256.

    Left out: `created`, each image's `source` (which mirror answered) and `files` (load.sh,
    README.txt, imgtool.pyz: they name the sources and carry imgtool's own code, not the image).
    """
    doc = json.loads((out / "bundle.json").read_text())
    doc.pop("created")
    doc.pop("files", None)
    for image in doc["images"]:
        image.pop("source", None)
    parts = {p["name"]: sha256_file(out / p["name"]) for p in doc["parts"]}
    return doc, parts


def assert_cache_sound(cache: Path) -> int:
    """Every published blob hashes to its name, and so does every blob the cache says a bundle holds (a layer
    written straight into a bundle, bundle/regions.py, while that bundle is there); returns how many there are."""
    blobs = sorted((cache / "blobs" / "sha256").iterdir()) if (cache / "blobs" / "sha256").exists() else []
    bad = [p.name for p in blobs if not p.name.startswith(".") and sha256_file(p) != p.name]
    assert bad == [], f"corrupt blobs in the cache: {bad}"
    located = sorted((cache / "located" / "sha256").iterdir()) if (cache / "located" / "sha256").exists() else []
    for p in located:
        h = hashlib.sha256()
        for path, offset, length in json.loads(p.read_text())["regions"]:
            if not Path(path).exists():
                break  # that bundle is gone (a later fetch downloads the blob again)
            with open(path, "rb") as f:
                f.seek(offset)
                h.update(f.read(length))
        else:
            assert h.hexdigest() == p.name, f"the cache locates blob {p.name} where other bytes lie"
    return len(blobs) + len(located)


def err_lines(r):
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:"))]


@dataclass
class World:
    """One image published once for the module, a proxy per source, and the clean result."""

    factory: ImageFactory
    repo: str
    layers: list  # digests of the arm64 layers
    proxy: FaultProxy  # in front of the upstream (plain) registry
    proxy2: FaultProxy  # in front of the nju (mirror) registry
    one: Path  # mirrors.toml: quay through proxy
    two: Path  # mirrors.toml: quay through proxy, nju through proxy2
    clean: tuple  # fingerprint of a fault-free fetch
    total: int  # blob bytes a fault-free fetch downloads
    root: Path

    def fetch(self, name: str, cfg: Path = None, env=None, extra=()):
        # the same directory name every time: part names derive from it
        cache, out = self.root / f"cache-{name}", self.root / f"out-{name}" / "vllm-ascend"
        out.parent.mkdir(exist_ok=True)
        r = run("fetch", TAG, "--arch", "arm64", "--mirrors", str(cfg or self.one), "-o", str(out),
                "--chunk-size", "1M", "-q", *extra, env={"IMGTOOL_CACHE": str(cache), **(env or {})})
        return r, cache, out

    def on_layer(self, method, path):
        return method == "GET" and any(d in path for d in self.layers)

    def reset(self):
        self.proxy.clear()
        self.proxy2.clear()


def mirrors_toml(path: Path, repo: str, entries) -> Path:
    out = [f'default_image = "quay.io/{repo}"']
    for name, url in entries:
        out.append(f'[[mirrors]]\nname = "{name}"\nregistry = "quay.io"\nurl = "{url}"\ninsecure = true'
                   + ("\nupstream = true" if name == "quay" else ""))
    path.write_text("\n".join(out) + "\n")
    return path


@pytest.fixture(scope="module")
def world(_services, tmp_path_factory):
    services = _services
    factory = ImageFactory("reliability")
    idx = factory.multiarch(layers=3, layer_size=LAYER_SIZE)
    ms = publish_mirrored(services, "rel" + secrets.token_hex(4), TAG, idx, targets=("upstream", "nju"))
    proxy, proxy2 = FaultProxy(services.plain), FaultProxy(services.mirror)
    root = tmp_path_factory.mktemp("rel")
    one = mirrors_toml(root / "one.toml", ms.repo, [("quay", proxy.url)])
    two = mirrors_toml(root / "two.toml", ms.repo, [("quay", proxy.url), ("nju", proxy2.url)])
    w = World(factory, ms.repo, [x.digest for x in idx.image("linux/arm64/v8").layers], proxy, proxy2,
              one, two, None, 0, root)
    try:
        r, cache, out = w.fetch("clean")
        assert r.returncode == 0, r.stderr
        w.clean, w.total = fingerprint(out), proxy.blob_bytes_sent()
        assert w.total > 3 * LAYER_SIZE
        yield w
    finally:
        proxy.close()
        proxy2.close()


@pytest.fixture
def w(world):
    world.reset()
    yield world
    world.reset()


# --- faults on the wire: the fetch completes with the same bundle --------------------------------

# name -> (faults on the upstream proxy, given the World; extra env). Each fault hits layer GETs.
FAULTS = {
    "reset": lambda w: [Fault("reset", w.on_layer, times=2, after=300_000)],
    "http-500": lambda w: [Fault("status", w.on_layer, times=2, status=500)],
    "http-502": lambda w: [Fault("status", w.on_layer, times=2, status=502)],
    "http-503": lambda w: [Fault("status", w.on_layer, times=2, status=503)],
    "http-429-retry-after": lambda w: [Fault("status", w.on_layer, times=1, status=429,
                                             headers={"Retry-After": "2"})],
    "flipped-byte": lambda w: [Fault("flip", w.on_layer, times=1, after=1000)],
    "flipped-byte-late": lambda w: [Fault("flip", w.on_layer, times=3, after=LAYER_SIZE - 10)],
    # held until the test ends: a fetch that waited it out would never finish
    "stalled-body": lambda w: [Fault("stall", w.on_layer, times=1, after=200_000)],
    "short-body": lambda w: [Fault("short", w.on_layer, times=2, after=500_000)],
    "expired-redirect": lambda w: [Fault("expiring_redirect", w.on_layer, times=1, seconds=0),
                                   Fault("expiring_redirect", w.on_layer, times=100, seconds=60)],
}


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_fault_fetch_matches_a_clean_fetch(kind, w):
    for fault in FAULTS[kind](w):
        w.proxy.add(fault)
    began = time.monotonic()
    r, cache, out = w.fetch(kind, env={"IMGTOOL_READ_TIMEOUT": "1.5"})
    took = time.monotonic() - began
    assert r.returncode == 0, r.stderr
    assert all(f.used == f.times for f in w.proxy.faults if f.times < 100), "a fault never fired"
    assert fingerprint(out) == w.clean
    assert assert_cache_sound(cache) >= 4  # three layers and the config
    if kind == "http-429-retry-after":
        assert took >= 2
    if kind == "expired-redirect":
        assert [x.status for x in w.proxy.records if x.path.startswith("/cdn/")].count(403) == 1


def test_expiring_cdn_link_resume_goes_back_to_the_registry(w):
    """Like quay's signed CDN URLs: the body stalls past the link's life; the resume asks the registry again."""
    w.proxy.add(Fault("expiring_redirect", w.on_layer, times=100, seconds=1.0))
    w.proxy.add(Fault("stall", lambda m, p: p.startswith("/cdn/"), times=1, after=300_000))  # until the end
    r, cache, out = w.fetch("cdn", env={"IMGTOOL_READ_TIMEOUT": "1.5"})
    assert r.returncode == 0, r.stderr
    assert fingerprint(out) == w.clean
    assert_cache_sound(cache)
    cdn = [x for x in w.proxy.records if x.path.startswith("/cdn/")]
    assert all(x.status != 403 for x in cdn), "an expired CDN link was reused"
    assert len({x.path for x in cdn}) == len(cdn), "a CDN link was requested twice"
    # the stalled layer was resumed with a Range on the registry URL, which redirected afresh
    resumed = [x for x in w.proxy.records if w.on_layer(x.method, x.path) and x.range and x.range != "bytes=0-"]
    assert resumed and all(x.status == 307 for x in resumed)
    assert w.proxy.blob_bytes_sent() < w.total + 300_000


def test_failover_to_the_second_source_matches_a_clean_fetch(w):
    w.proxy.add(Fault("status", w.on_layer, times=1000, status=403))
    r, cache, out = w.fetch("failover", cfg=w.two)
    assert r.returncode == 0, r.stderr
    assert fingerprint(out) == w.clean
    assert_cache_sound(cache)
    assert w.proxy2.blob_bytes_sent() >= 3 * LAYER_SIZE


def test_every_source_failing_is_exit_4_naming_each_source_and_its_last_error(w):
    w.proxy.add(Fault("status", w.on_layer, times=1000, status=403))
    w.proxy2.add(Fault("reset", w.on_layer, times=1000, after=100_000))
    r, cache, out = w.fetch("allfail", cfg=w.two)
    assert r.returncode == 4, r.stderr
    lines = err_lines(r)
    assert len(lines) == 2 and lines[1].startswith("hint: "), r.stderr
    q, n = w.proxy.hostport, w.proxy2.hostport
    assert lines[0].startswith("error: every source failed: "), lines[0]
    # one entry per source (in the order the probe ranked them), each with its last error
    entries = sorted(lines[0][len("error: every source failed: "):].split("; "))
    assert len(entries) == 2, lines[0]
    assert entries[0].startswith(f"nju ({n}/{w.repo}): {n}: connection reset"), entries
    assert entries[1].startswith(f"quay ({q}/{w.repo}): {q}/{w.repo}: blob "), entries
    assert entries[1].endswith(": UNAVAILABLE: injected"), entries
    assert "Traceback" not in r.stderr
    assert not (out / "bundle.json").exists()
    assert_cache_sound(cache)


# --- SIGKILL at random points, and two fetches sharing one cache ----------------------------------

RATE = 1_000_000  # bytes/s per blob connection: three ~1 MiB layers in parallel take about a second


def _blob_get(method, path):
    return method == "GET" and "/blobs/sha256:" in path


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_sigkill_at_a_random_point_then_rerun_fetches_the_rest_only(seed, w):
    """Killed mid-download (no cleanup runs), the rerun fetches only what the first run had not.

    With T the blob bytes of a clean fetch, B1 the bytes the proxy sent before the kill and B2
    those of the rerun, B1 + B2 - T bytes were sent twice; that must be at most 10% of B1:
    B2 <= T - 0.9 * B1. The kill comes once the fetch has read all B1 bytes off its sockets,
    so this bounds how far the partial record may lag behind the data it received.
    """
    rng = random.Random(seed)
    w.proxy.add(Fault("rate", _blob_get, times=10_000, rate=RATE))
    # The random point is a byte count, not a time: the proxy holds every blob body once that
    # many bytes went out, and the kill lands there however fast or slow this machine is.
    kill_at = rng.randint(64 * 1024, int(0.85 * w.total))
    gate = w.proxy.gate(_blob_get, bytes=kill_at)
    cache, out = w.root / f"cache-kill{seed}", w.root / f"out-kill{seed}" / "vllm-ascend"
    out.parent.mkdir(exist_ok=True)
    args = ("fetch", TAG, "--arch", "arm64", "--mirrors", str(w.one), "-o", str(out), "--chunk-size", "1M", "-q")
    p = start(*args, env={"IMGTOOL_CACHE": str(cache)})
    try:
        # held, and everything sent so far read by the fetch: B1 is what it has received
        reached = gate.reached.wait(120) and w.proxy.wait_delivered()
    finally:
        # B1 is read just before the kill: the proxy's first write after the kill still
        # "succeeds" (the peer's RST comes later), so reading it afterwards overcounts.
        b1 = w.proxy.blob_bytes_sent()
        p.kill()  # SIGKILL
        p.wait()
        gate.release()
    assert reached, f"the fetch never had {kill_at} blob bytes sent: {p.stderr.read()[-2000:]}"
    assert p.returncode == -signal.SIGKILL
    assert b1 <= kill_at
    assert not (out / "bundle.json").exists()
    assert_cache_sound(cache)
    w.reset()
    r = run(*args, "--force", env={"IMGTOOL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    b2 = w.proxy.blob_bytes_sent()
    assert fingerprint(out) == w.clean
    assert assert_cache_sound(cache) >= 4
    print(f"seed {seed}: T={w.total} B1={b1} B2={b2} twice={b1 + b2 - w.total}")
    assert b2 <= w.total - 0.9 * b1, f"T={w.total} B1={b1} B2={b2}: {b1 + b2 - w.total} bytes fetched twice"
    assert not list((cache / "partial" / "sha256").iterdir())  # every partial committed and cleaned up


def test_two_fetches_sharing_one_cache_both_succeed_and_download_each_blob_once(w):
    w.proxy.add(Fault("rate", _blob_get, times=10_000, rate=2 * RATE))
    cache = w.root / "cache-shared"
    procs, outs = [], []
    for name in ("a", "b"):
        out = w.root / f"out-shared-{name}" / "vllm-ascend"
        out.parent.mkdir(exist_ok=True)
        outs.append(out)
        procs.append(start("fetch", TAG, "--arch", "arm64", "--mirrors", str(w.one), "-o", str(out),
                           "--chunk-size", "1M", "-q", env={"IMGTOOL_CACHE": str(cache)}))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    for out in outs:
        assert fingerprint(out) == w.clean
    assert_cache_sound(cache)
    sent = w.proxy.blob_bytes_sent()
    assert sent <= w.total + 64 * 1024, f"{sent} bytes for {w.total} bytes of blobs"  # configs may come twice


def test_a_second_fetch_into_an_output_being_written_refuses_naming_the_first(w):
    """Issue 35 case 7: two fetches into one -o both exited 0 with different bundles, the directory holding one
    and the other's parts as debris. The first is held at its first layer (the gate), so it holds the output's
    lock; the second (another architecture, from the other registry, past the gate) refuses at once, naming it."""
    gate = w.proxy.gate(w.on_layer, requests=0)
    out = w.root / "out-together" / "vllm-ascend"
    out.parent.mkdir(exist_ok=True)
    first = start("fetch", TAG, "--arch", "arm64", "--mirrors", str(w.one), "-o", str(out), "--chunk-size", "1M",
                  "-q", env={"IMGTOOL_CACHE": str(w.root / "cache-together-1")})
    try:
        assert gate.reached.wait(120), "the first fetch never asked for a layer"
        direct = mirrors_toml(w.root / "direct.toml", w.repo, [("nju", f"http://{w.proxy2.upstream}")])
        second = run("fetch", TAG, "--arch", "amd64", "--mirrors", str(direct), "-o", str(out), "--chunk-size", "1M",
                     "-q", env={"IMGTOOL_CACHE": str(w.root / "cache-together-2")})
        assert second.returncode == 1, second.stderr
        assert err_lines(second) == [f"error: {out} is being written by imgtool fetch (pid {first.pid}); nothing was done",
                                     "hint: wait for it to finish, or choose another directory"]
        forced = run("fetch", TAG, "--arch", "amd64", "--mirrors", str(direct), "-o", str(out), "--force", "-q",
                     env={"IMGTOOL_CACHE": str(w.root / "cache-together-2")})
        assert (forced.returncode, err_lines(forced)[0]) == (1, err_lines(second)[0])
    finally:
        gate.release()
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert fingerprint(out) == w.clean  # the first's bundle, whole, and nothing of the second's
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["bundle.json", "SHA256SUMS", "load.sh", "README.txt", "imgtool.pyz"] + list(w.clean[1]))  # the lock is gone


# --- disk full --------------------------------------------------------------------------------------


def _needs(w):
    """(layer bytes, config bytes, imgtool.pyz bytes) of the clean fetch's bundle."""
    clean = w.root / "out-clean" / "vllm-ascend"
    image = json.loads((clean / "bundle.json").read_text())["images"][0]
    return sum(x["size"] for x in image["layers"]), image["config_size"], (clean / "imgtool.pyz").stat().st_size


def _free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


SPACE_HINT = "hint: free space there, or point IMGTOOL_CACHE or --output at a bigger disk; nothing was downloaded"


def test_cache_on_a_full_disk_is_refused_up_front_or_one_error_half_way_and_the_cache_stays_sound(w, tiny_tmpfs):
    """--check-diff-ids: the layers go through the cache (they are unpacked from there); without it an uncompressed
    bundle takes them straight in and the cache needs nothing for them (the last fetch here)."""
    cache = tiny_tmpfs / "cache"
    out = w.root / "out-fullcache" / "vllm-ascend"
    layers, config, pyz = _needs(w)
    # room for what fetch caches before the check (the config, imgtool.pyz) and not for the layers
    subprocess.run(["mount", "-o", f"remount,size={pyz + config + 256 * 1024}", str(tiny_tmpfs)], check=True)
    assert _free(tiny_tmpfs) < pyz + config + layers
    r = run("fetch", TAG, "--arch", "arm64", "--mirrors", str(w.one), "-o", str(out), "-q", "--check-diff-ids",
            env={"IMGTOOL_CACHE": str(cache)})  # the config is in the cache already (resolving read it)
    assert (r.returncode, err_lines(r)) == (1, [
        f"error: not enough space: fetch needs {format_size(layers)} in {cache} ({format_size(_free(cache))} free)",
        SPACE_HINT]), r.stderr
    assert len(r.stderr.splitlines()) == 2
    assert not any(rec.method == "GET" and w.on_layer(rec.method, rec.path) for rec in w.proxy.records)
    assert not out.exists()
    assert_cache_sound(cache)
    # room for the layers the check counts and a page more, not for the records beside them: the check
    # lets the fetch start, and the disk fills half-way
    st = os.statvfs(tiny_tmpfs)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    subprocess.run(["mount", "-o", f"remount,size={used + layers + 4096}", str(tiny_tmpfs)], check=True)
    r = run("fetch", TAG, "--arch", "arm64", "--mirrors", str(w.one), "-o", str(out), "-q", "--check-diff-ids",
            env={"IMGTOOL_CACHE": str(cache)})
    assert (r.returncode, err_lines(r)) == (1, [f"error: no space left on the device holding the cache ({cache})",
                                                "hint: free some space or point IMGTOOL_CACHE at a bigger disk"]), r.stderr
    assert len(r.stderr.splitlines()) == 2
    assert not (out / "bundle.json").exists()
    assert_cache_sound(cache)
    # after freeing space (a bigger cache disk), the same cache completes the fetch
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_tmpfs)], check=True)
    r = run("fetch", TAG, "--arch", "arm64", "--mirrors", str(w.one), "-o", str(out), "--chunk-size", "1M",
            "-q", "--force", env={"IMGTOOL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    assert fingerprint(out) == w.clean
    assert_cache_sound(cache)


def test_output_on_a_full_disk_is_refused_before_the_download(w, tiny_tmpfs):
    cache = w.root / "cache-fullout"
    out = tiny_tmpfs / "vllm-ascend"
    r = run("fetch", TAG, "--arch", "arm64", "--mirrors", str(w.one), "-o", str(out), "--chunk-size", "1M",
            "-q", env={"IMGTOOL_CACHE": str(cache)})
    layers, config, pyz = _needs(w)
    # measured under the output's lock: its file holds one page of the tiny disk until the refusal removes it
    free = {format_size(_free(tiny_tmpfs)), format_size(_free(tiny_tmpfs) - os.statvfs(tiny_tmpfs).f_frsize)}
    lines = err_lines(r)
    assert r.returncode == 1 and len(lines) == 2 and lines[1] == SPACE_HINT, r.stderr
    assert any(lines[0] == f"error: not enough space: fetch needs {format_size(layers + config + pyz)} in {out} "
               f"({f} free)" for f in free), r.stderr
    assert len(r.stderr.splitlines()) == 2
    assert not any(rec.method == "GET" and w.on_layer(rec.method, rec.path) for rec in w.proxy.records)
    assert not out.exists()
    assert_cache_sound(cache)


# --- bundle tampering, through `imgtool load`: refused, culprit named, Docker unchanged ---------------
# (test_verify.py covers the exact `verify` lines for flipped/missing/truncated parts, an edited
# bundle.json, --expect and stray files; test_load.py the crafted archive members and a huge
# manifest.json. Here: every part, extra/renamed/reordered parts, and each through `load`.)

REPO = "quay.io/ascend/vllm-ascend"


@pytest.fixture(scope="module")
def sealed(tmp_path_factory):
    """A sound 5-part bundle of a host-arch image no daemon holds; copied fresh per test."""
    from tests.support.bundles import BlobDir, write
    from tests.support.images import host_arch

    root = tmp_path_factory.mktemp("sealed")
    store = BlobDir(root / "blobs")
    image = ImageFactory("reliability-sealed").image(host_arch(), layers=3)
    write(root / "vllm-ascend", [store.pulled(image, f"{REPO}:v0.22.1rc1")], store, chunk_size=700 * 1024)
    return root / "vllm-ascend"


@pytest.fixture
def damaged(sealed, tmp_path):
    import shutil

    out = tmp_path / "vllm-ascend"
    shutil.copytree(sealed, out)
    return out


def _parts(out: Path):
    doc = json.loads((out / "bundle.json").read_text())
    return [out / p["name"] for p in doc["parts"]]


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _load_refused(out: Path, services, docker_cli, *extra):
    before = docker_cli.image_ids()
    r = run("load", str(out), *extra, env={"DOCKER_HOST": services.docker_host})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert docker_cli.image_ids() == before, "Docker holds a new image after a refused load"
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:", "warning:", "  - "))]


def test_flipped_byte_in_any_part_is_named(damaged):
    parts = _parts(damaged)
    assert len(parts) >= 5
    for k, part in enumerate(parts, 1):
        offset = random.Random(k).randrange(part.stat().st_size)
        _flip(part, offset)
        r = run("verify", str(damaged), "--quick")
        assert r.returncode == 3
        assert damaged_part_line(damaged, k - 1) in r.stderr.splitlines(), (k, r.stderr)
        _flip(part, offset)
    assert run("verify", str(damaged)).returncode == 0


TAMPER = {}


def tamper(fn):
    TAMPER[fn.__name__[1:]] = fn
    return fn


@tamper
def _flipped_part(out):
    _flip(_parts(out)[2], 4321)
    return [f"  - part 003 ({_parts(out)[2].name}) is damaged: its sha256 differs from bundle.json"]


@tamper
def _truncated_part(out):
    last = _parts(out)[-1]
    with open(last, "r+b") as f:
        f.truncate(last.stat().st_size // 2)
    return [f"  - part {len(_parts(out)):03d} ({last.name}) is truncated: "]


@tamper
def _missing_part(out):
    _parts(out)[0].unlink()
    return [f"  - part 001 ({_parts(out)[0].name}) is missing"]


@tamper
def _extra_part(out):
    parts = _parts(out)
    extra = parts[-1].with_name(parts[-1].name[:-3] + f"{len(parts) + 1:03d}")
    extra.write_bytes(b"\0" * 512)  # a stray part: would change the archive if concatenated
    # sound parts plus a stray one: still refused? Only a warning is acceptable, not a load of it
    return None


@tamper
def _renamed_part(out):
    p = _parts(out)[1]
    p.rename(p.with_name(p.name + ".bak"))
    return [f"  - part 002 ({p.name}) is missing"]


@tamper
def _reordered_parts(out):
    a, b = _parts(out)[1:3]
    tmp = a.with_name("swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    return [f"  - part 002 ({a.name}) is damaged", f"  - part 003 ({b.name}) is damaged"]


@tamper
def _edited_bundle_json(out):
    doc = json.loads((out / "bundle.json").read_text())
    doc["images"][0]["ref"] = "quay.io/evil/image:latest"
    (out / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    return ["  - bundle.json does not match SHA256SUMS: it was changed after the fetch"]


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_tampered_bundle_is_refused_by_load_naming_the_culprit(case, damaged, services, docker_cli):
    culprits = TAMPER[case](damaged)
    if culprits is None:  # _extra_part: a stray file is ignored with a warning, and the load is sound
        r = run("verify", str(damaged))
        assert r.returncode == 0, r.stderr
        assert any(line.startswith("warning: unexpected file in the bundle directory: ")
                   for line in r.stderr.splitlines())
        return
    lines = _load_refused(damaged, services, docker_cli)
    assert lines[0].startswith(f"error: refusing to load: {damaged}: "), lines
    assert lines[0].endswith("; nothing was loaded"), lines
    for culprit in culprits:
        assert any(line.startswith(culprit) for line in lines[1:]), (culprit, lines)


def test_expect_mismatch_is_refused_by_load(damaged, services, docker_cli):
    lines = _load_refused(damaged, services, docker_cli, "--expect", "ab" * 32)
    assert any(line.startswith("  - bundle.json does not match --expect: its sha256 is ") for line in lines), lines


# --- bad input: one line (plus an optional hint) and exit 2, never a traceback -----------------------

DEAD_MIRRORS = 'default_image = "quay.io/ascend/vllm-ascend"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n' \
               'url = "http://127.0.0.1:1"\ninsecure = true\n'

BAD_MIRRORS = {
    "mirrors-not-toml": "this is = = not toml\n",
    "mirrors-unknown-key": DEAD_MIRRORS + "colour = 1\n",
    "mirrors-missing-url": 'default_image = "quay.io/a/b"\n[[mirrors]]\nname = "x"\nregistry = "quay.io"\n',
    "mirrors-bad-scheme": DEAD_MIRRORS.replace("http://127.0.0.1:1", "ftp://127.0.0.1:1"),
    "mirrors-wrong-type": DEAD_MIRRORS.replace("insecure = true", 'insecure = "yes"'),
    "mirrors-not-a-table": 'default_image = "quay.io/a/b"\nmirrors = 3\n',
    "mirrors-bad-default-image": DEAD_MIRRORS.replace("quay.io/ascend/vllm-ascend", "Not An Image"),
    "mirrors-duplicate-name": DEAD_MIRRORS + DEAD_MIRRORS.split("\n", 1)[1],
    "mirrors-binary": "\x00\xff\xfe garbage",
}

BAD_PRESETS = {
    "presets-not-toml": "[presets\n",
    "presets-unknown-key": "[presets.x]\ncolour = 1\n",
    "presets-bad-cards": '[presets.x]\ncards = "7-0"\n',
    "presets-bad-shm": '[presets.x]\nshm_size = "lots"\n',
    "presets-extends-loop": '[presets.a]\nextends = "b"\n[presets.b]\nextends = "a"\n',
    "presets-bad-mount": '[presets.x]\nmounts = [":::"]\n',
}

BAD_ARGS = {
    "ref-empty": ["fetch", ""],
    "ref-spaces": ["fetch", "v1 v2"],
    "ref-uppercase-repo": ["fetch", "quay.io/Ascend/VLLM:v1"],
    "ref-bad-digest": ["fetch", "quay.io/a/b@sha256:xyz"],
    "ref-two-colons": ["fetch", "a:b:c"],
    "ref-dotdot": ["fetch", "quay.io/../etc:v1"],
    "arch-unknown": ["fetch", "v1", "--arch", "sparc"],
    "arch-empty-item": ["fetch", "v1", "--arch", "arm64,"],
    "platform-too-long": ["fetch", "v1", "--platform", "linux/arm64/v8/x"],
    "platform-and-arch": ["fetch", "v1", "--arch", "arm64", "--platform", "linux/arm64"],
    "size-zero": ["fetch", "v1", "--chunk-size", "0"],
    "size-unit": ["fetch", "v1", "--chunk-size", "4X"],
    "size-negative": ["fetch", "v1", "--chunk-size", "-1G"],
    "size-huge": ["fetch", "v1", "--chunk-size", "9" * 400],
    "jobs-zero": ["fetch", "v1", "--jobs", "0"],
    "max-connections-zero": ["fetch", "v1", "--max-connections", "0"],
    "helper-timeout-bad": ["fetch", "v1", {"IMGTOOL_CREDENTIAL_HELPER_TIMEOUT": "soon"}],
    "output-is-a-file": ["fetch", "v1", "-o", "{file}"],
    "mirror-unknown": ["fetch", "v1", "--mirror", "nowhere"],
    "mirrors-file-missing": ["fetch", "v1", "--mirrors", "{tmp}/absent.toml"],
    "read-timeout-bad": ["fetch", "v1", {"IMGTOOL_READ_TIMEOUT": "soon"}],
    "read-timeout-zero": ["fetch", "v1", {"IMGTOOL_READ_TIMEOUT": "0"}],
    "verify-missing-dir": ["verify", "{tmp}/nowhere"],
    "verify-bad-expect": ["verify", "{tmp}", "--expect", "nope"],
    "load-missing-dir": ["load", "{tmp}/nowhere"],
    "preset-unknown": ["run-flags", "no-such-preset"],
}
BAD_ARGS.update({k: ["fetch", "v1", "--mirrors", "{tmp}/" + k + ".toml"] for k in BAD_MIRRORS})
BAD_ARGS.update({k: ["presets", "--presets", "{tmp}/" + k + ".toml"] for k in BAD_PRESETS})


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path):
    for name, text in {**BAD_MIRRORS, **BAD_PRESETS}.items():
        (tmp_path / f"{name}.toml").write_bytes(text.encode("utf-8", "surrogateescape")
                                                if not text.startswith("\x00") else text.encode("latin-1"))
    (tmp_path / "file").write_text("x")
    cfg = tmp_path / "dead.toml"
    cfg.write_text(DEAD_MIRRORS)
    env = {"IMGTOOL_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path / "home"),
           "IMGTOOL_MIRRORS": str(cfg)}
    args = []
    for a in BAD_ARGS[case]:
        if isinstance(a, dict):
            env.update(a)
        else:
            args.append(a.format(tmp=tmp_path, file=tmp_path / "file"))
    r = run(*args, env=env, timeout=60)
    lines = r.stderr.splitlines()
    assert r.returncode == 2, (case, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert 1 <= len(lines) <= 2 and lines[0].startswith("error: "), (case, r.stderr)
    assert len(lines) == 1 or lines[1].startswith("hint: "), (case, r.stderr)


# --- property tests for the parsers: nothing but UsageError/ConfigError escapes ----------------------

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from imgtool.errors import UsageError  # noqa: E402  (ConfigError is a UsageError)

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
near_ref = st.text(alphabet="abcAB09.-_/:@sha256xyz \t", max_size=60)


@PROPS
@given(st.one_of(st.text(max_size=80), near_ref))
def test_property_image_ref_parse(text):
    from imgtool.model import ImageRef

    try:
        ref = ImageRef.parse(text)
    except UsageError:
        return
    assert ImageRef.parse(str(ref)) == ref  # what parses, round-trips


@PROPS
@given(st.one_of(st.text(max_size=40), st.text(alphabet="linuxarm64amd/v8 ", max_size=30)))
def test_property_platform_parse(text):
    from imgtool.model import Platform

    try:
        p = Platform.parse(text)
    except UsageError:
        return
    assert Platform.parse(str(p)) == p


@PROPS
@given(st.one_of(st.text(max_size=30), st.integers(10 ** 290, 10 ** 400).map(str),
                 st.from_regex(r"\s*[0-9]{1,40}(\.[0-9]{0,5})?\s*[kKmMgGtTpP]?i?[bB]?\s*", fullmatch=True)))
def test_property_parse_size(text):
    from imgtool.model import parse_size

    try:
        n = parse_size(text)
    except UsageError:
        return
    assert isinstance(n, int) and n > 0


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


_scalar = st.one_of(st.text(max_size=20), st.integers(-5, 100), st.booleans(),
                    st.sampled_from(["0-7", "1g", "http://127.0.0.1:1", "quay.io", "/dev/davinci0", "a:b:ro",
                                     "8000:8000", "host", "x", "../x", ""]))
_value = st.one_of(_scalar, st.lists(_scalar, max_size=3), st.dictionaries(st.text(max_size=8), _scalar, max_size=3))


def _names_file_and_line(message: str, path: Path, text: str) -> bool:
    """A config rejection starts with `FILE:LINE: ` (a line of the file), or is TOML's own
    syntax error for FILE, which says `at line N`."""
    m = re.match(rf"{re.escape(str(path))}:(\d+): ", message)
    if m:
        return 1 <= int(m.group(1)) <= max(1, len(text.splitlines()))
    return message.startswith(f"{path}: invalid TOML: ") and re.search(r"at line \d+", message) is not None


@PROPS
@given(st.dictionaries(st.sampled_from(["default_image", "name", "registry", "url", "prefix", "insecure",
                                        "ca_cert", "upstream", "colour"]), _value, max_size=7),
       st.sampled_from(["quay.io/ascend/vllm-ascend", "x", 3]))
@example({"name": "x", "registry": "quay.io", "url": "http://127.0.0.1:1/", "insecure": True, "prefix": "/x/",
          "upstream": True, "ca_cert": "x"}, "quay.io/ascend/vllm-ascend")  # parses: the round trip runs
def test_property_mirrors_toml(entry, default_image):
    """What parses is what the file says; what is refused names the file and the line."""
    import tempfile

    from imgtool.config import load_mirrors

    text = f"default_image = {_toml_value(default_image)}\n[[mirrors]]\n" + \
        "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in entry.items())
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "mirrors.toml"
        path.write_text(text)
        try:
            cfg = load_mirrors(str(path))
        except UsageError as e:
            assert _names_file_and_line(e.message, path, text), (text, e.message)
            return
        assert cfg.default_image == default_image and cfg.path == str(path)
        assert len(cfg.mirrors) == 1
        m = cfg.mirrors[0]
        assert (m.name, m.registry, m.url) == (entry["name"], entry["registry"], entry["url"].rstrip("/"))
        assert m.prefix == entry.get("prefix", "").strip("/")
        assert (m.insecure, m.upstream) == (entry.get("insecure", False), entry.get("upstream"))
        ca = entry.get("ca_cert")
        assert m.ca_cert == (str((Path(d) / ca).resolve()) if ca else ca)


_PRESET_SCALARS = ("description", "privileged", "min_cards", "network")


@PROPS
@given(st.dictionaries(st.sampled_from(["description", "extends", "cards", "min_cards", "devices", "mounts",
                                        "shm_size", "network", "ports", "env", "tag_suffixes", "privileged",
                                        "multi_node", "bogus"]), _value, max_size=6),
       st.sampled_from(["presets", "env_presets", "multi_node", "other"]), st.sampled_from(["a2", "x", "a-b"]))
@example({"description": "x", "privileged": True, "network": "host", "devices": ["/dev/davinci0"]}, "presets", "a2")
@example({"description": "x", "env": {"A": "1"}}, "env_presets", "x")  # these parse: the round trips run
def test_property_presets_toml(table, section, name):
    """What parses is what the file says (merged over the built-ins); what is refused names the
    file and the line."""
    import tempfile

    from imgtool.presets.files import load_presets

    text = f"[{section}.{json.dumps(name)}]\n" + \
        "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in table.items())
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "presets.toml"
        path.write_text(text)
        try:
            pset = load_presets(str(path))
        except UsageError as e:
            assert _names_file_and_line(e.message, path, text), (text, e.message)
            return
        assert str(path) in pset.files
        if section == "presets":
            preset = pset.get(name)
            for key in _PRESET_SCALARS:
                if key in table:
                    assert getattr(preset, key) == table[key], (key, text)
            if "devices" in table:
                assert list(preset.devices) == list(table["devices"])
            if "tag_suffixes" in table:
                assert list(preset.tag_suffixes) == list(table["tag_suffixes"])
        elif section == "env_presets":
            env_preset = next(p for p in pset.env_presets if p.name == name)
            if "description" in table:
                assert env_preset.description == table["description"]
            if "env" in table:
                assert dict(env_preset.env) == table["env"]


@PROPS
@given(st.one_of(st.text(max_size=30), _scalar, st.lists(_scalar, max_size=3)))
@example("0-3,8")
@example("/a:/b:ro")
@example("A=1=2")
def test_property_preset_value_parsers(value):
    """Each parser's result reads back the same when written out again; a refusal is one line
    that quotes what it refused."""
    from imgtool.presets.preset import format_cards, parse_cards, parse_env, parse_mount

    for parse, written in ((parse_cards, format_cards), (parse_mount, lambda m: m.spec),
                           (parse_env, lambda kv: f"{kv[0]}={kv[1]}")):
        try:
            parsed = parse(value)
        except UsageError as e:
            assert "\n" not in e.message and e.message.startswith("invalid "), e.message
            continue
        assert parse(written(parsed)) == parsed, (parse.__name__, value, parsed)


# --- secrets never leave the process: not in any output, bundle file or cache file ------------------


def _docker_login(home: Path, host: str, user: str, password: str) -> None:
    import base64

    (home / ".docker").mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (home / ".docker" / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))


def _secret_forms(user: str, password: str, tokens=()):
    import base64

    forms = {password, base64.b64encode(f"{user}:{password}".encode()).decode()}
    for t in tokens:
        forms.add(t)
        forms.update(t.split(".")[1:])  # a JWT's claims and signature, even if split up
    return {f for f in forms if len(f) >= 8}


def _assert_no_secret(forms, outputs, dirs):
    for name, text in outputs.items():
        for f in forms:
            assert f not in text, f"a secret appears in {name}"
    for d in dirs:
        for path in Path(d).rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                for f in forms:
                    assert f.encode() not in data, f"a secret appears in {path}"


def _scan_runs(tmp_path, cfg, env, tag_ok="v1"):
    """fetch (plain and --debug), inspect --debug, a failing fetch --debug: their outputs and dirs."""
    outputs, dirs = {}, [env["IMGTOOL_CACHE"]]
    for i, extra in enumerate([(), ("--debug",)]):
        out = tmp_path / f"b{i}"
        r = run("fetch", tag_ok, "--arch", "arm64", "--mirrors", str(cfg), "-o", str(out), *extra, env=env)
        assert r.returncode == 0, r.stderr
        outputs[f"fetch {extra} stdout"], outputs[f"fetch {extra} stderr"] = r.stdout, r.stderr
        dirs.append(out)
    r = run("inspect", tag_ok, "--mirrors", str(cfg), "--debug", "--json", env=env)
    assert r.returncode == 0, r.stderr
    outputs["inspect"] = r.stdout + r.stderr
    r = run("fetch", "no-such-tag", "--arch", "arm64", "--mirrors", str(cfg), "-o", str(tmp_path / "bx"),
            "--debug", env=env)
    assert r.returncode == 4, r.stderr
    outputs["failing fetch --debug"] = r.stdout + r.stderr
    return outputs, dirs


def test_basic_auth_secret_is_in_no_output_or_file(services, factory, tmp_path, uniq):
    from tests.support.registry import push_image

    idx = factory.multiarch(layers=2)
    push_image(services.tls, f"{uniq}/vllm-ascend", "v1", idx, scheme="https", auth=services.tls_auth,
               verify=services.tls_ca)
    cfg = mirrors_toml(tmp_path / "m.toml", f"{uniq}/vllm-ascend", [])
    cfg.write_text(f'default_image = "quay.io/{uniq}/vllm-ascend"\n[[mirrors]]\nname = "site"\nregistry = "quay.io"\n'
                   f'url = "https://{services.tls}"\nca_cert = "{services.tls_ca}"\n')
    home = tmp_path / "home"
    _docker_login(home, services.tls, services.tls_user, services.tls_password)
    env = {"HOME": str(home), "IMGTOOL_CACHE": str(tmp_path / "cache")}
    outputs, dirs = _scan_runs(tmp_path, cfg, env)
    forms = _secret_forms(services.tls_user, services.tls_password)
    _assert_no_secret(forms, outputs, dirs)
    with pytest.raises(AssertionError):  # the scan does find a secret where there is one
        _assert_no_secret(forms, {}, [home])


def test_token_auth_secrets_are_in_no_output_or_file(services, factory, token_issuer, tmp_path, uniq):
    from tests.support.registry import RegistryClient as PushClient

    idx = factory.multiarch(layers=2)
    with PushClient.for_service(services, "token") as c:
        c.push(f"{uniq}/vllm-ascend", "v1", idx)
    user, password = "robot", "s3cret-" + secrets.token_hex(8)
    token_issuer.credentials = {user: password}
    token_issuer.anonymous_actions = ()  # without the password, nothing
    seen = len(token_issuer.requests)
    cfg = tmp_path / "m.toml"
    cfg.write_text(f'default_image = "quay.io/{uniq}/vllm-ascend"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.token}"\ninsecure = true\nupstream = true\n')
    home = tmp_path / "home"
    _docker_login(home, services.token, user, password)
    env = {"HOME": str(home), "IMGTOOL_CACHE": str(tmp_path / "cache")}
    outputs, dirs = _scan_runs(tmp_path, cfg, env)
    ours = [r for r in token_issuer.requests[seen:] if r.token]
    assert ours and all(r.account == user for r in ours)  # imgtool logged in with the password
    tokens = [r.token for r in token_issuer.requests if r.token]
    _assert_no_secret(_secret_forms(user, password, tokens), outputs, dirs)


def test_tls_is_verified_unless_the_mirror_says_insecure(services, factory, tmp_path, uniq):
    from tests.support.registry import push_image

    idx = factory.multiarch(layers=1)
    push_image(services.tls, f"{uniq}/vllm-ascend", "v1", idx, scheme="https", auth=services.tls_auth,
               verify=services.tls_ca)
    home = tmp_path / "home"
    _docker_login(home, services.tls, services.tls_user, services.tls_password)
    env = {"HOME": str(home), "IMGTOOL_CACHE": str(tmp_path / "cache")}
    base = (f'default_image = "quay.io/{uniq}/vllm-ascend"\n[[mirrors]]\nname = "site"\nregistry = "quay.io"\n'
            f'url = "https://{services.tls}"\n')
    cfg = tmp_path / "m.toml"
    cfg.write_text(base)  # the test CA is not trusted: refused
    r = run("fetch", "v1", "--arch", "arm64", "--mirrors", str(cfg), "-o", str(tmp_path / "b1"), "-q", env=env)
    assert r.returncode == 4 and "TLS verification failed" in r.stderr, r.stderr
    assert not (tmp_path / "b1" / "bundle.json").exists()
    cfg.write_text(base + "insecure = true\n")  # explicitly trusted network: accepted
    r = run("fetch", "v1", "--arch", "arm64", "--mirrors", str(cfg), "-o", str(tmp_path / "b2"), "-q", env=env)
    assert r.returncode == 0, r.stderr


# --- the documentation keeps up with the tests ----------------------------------------------------


def test_reliability_doc_lists_every_case():
    import ast

    doc = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    covered_by_table = {"test_fault_fetch_matches_a_clean_fetch": FAULTS,
                        "test_tampered_bundle_is_refused_by_load_naming_the_culprit": TAMPER,
                        "test_bad_input_is_one_line_and_exit_2": BAD_ARGS}
    missing = [name for name in tests if name not in doc and name not in covered_by_table]
    for name, cases in covered_by_table.items():
        missing += [f"{name}[{case}]" for case in cases if f"`{case}`" not in doc]
    assert "test_fault_fetch_matches_a_clean_fetch" in doc
    assert missing == [], f"docs/reliability.md does not mention: {missing}"
