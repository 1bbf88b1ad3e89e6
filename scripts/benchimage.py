"""A benchmark image shaped like quay.io/ascend/vllm-ascend, generated from a seed (never host files).

Not product code: scripts/bench.py uses it; imgtool/ never imports it.

Shape (at --scale 1, one architecture): 17 layers, about 15 GB unpacked and 6.5 GB as gzip (Docker
v2 media types, level 6 as buildx writes them), the CANN base first (6 layers, one of them the
`COPY /usr/local/Ascend` giant holding ~40 % of the bytes), vllm-ascend's 11 on top, the last four
(source tree, its build, pip cleanup, config) the ones every build changes. Content compresses like
the real image (~2.3:1 overall): text (Python, headers, configs: ~4:1), binary-like bytes (shared
libraries, kernels: ~2:1) and already-compressed files (wheels, .gz, model assets: 1:1), in shares
per layer.

Same tar bytes on every machine: every byte comes from a seeded PRNG (Python's `random.Random`,
whose string seeding and `randbytes` are specified), file sizes and names too. The gzip bytes are
zlib's (the same for every stock zlib; zlib-ng's compat mode writes other bytes, so the layer
digests can differ there, never the diff_ids). Speed: three pools of content (text, binary-like,
random) are made once per seed; a file is a slice of a pool at a random offset; the pools are
large (64 MiB) so neither gzip's 32 KiB window nor zstd's few-MiB one sees a slice repeat.
Each layer is streamed once into its gzip blob and, in the same pass, its zstd twin (level 3, OCI
media type): memory does not grow with the scale; the layers are made in parallel (zlib, zstd and
sha256 release the GIL).
"""

import hashlib
import json
import os
import random
import shutil
import tarfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

MiB = 1024 * 1024
MB = 1000 * 1000
MTIME = 1735689600
POOL = 64 * MiB
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"

# (what the layer is, unpacked MB at scale 1, shares of text / binary-like / compressed bytes, where)
# bottom-up; the first six are the CANN base image, the rest vllm-ascend's Dockerfile.
LAYERS: Tuple[Tuple[str, float, Tuple[float, float, float], str], ...] = (
    ("ubuntu 22.04 base", 78, (0.30, 0.62, 0.08), "usr"),
    ("apt: build tools, python3.11", 640, (0.28, 0.64, 0.08), "usr/lib"),
    ("pip: CANN python deps", 310, (0.38, 0.48, 0.14), "usr/local/lib/python3.11/site-packages"),
    ("COPY /usr/local/Ascend (CANN toolkit)", 6050, (0.20, 0.72, 0.08), "usr/local/Ascend"),
    ("CANN kernels, nnal", 1480, (0.12, 0.82, 0.06), "usr/local/Ascend/nnal"),
    ("CANN env (set_env.sh)", 0.05, (1.0, 0.0, 0.0), "etc/profile.d"),
    ("apt: vllm-ascend build deps", 190, (0.30, 0.62, 0.08), "usr/lib"),
    ("pip: torch (cpu)", 1790, (0.20, 0.73, 0.07), "usr/local/lib/python3.11/site-packages/torch"),
    ("pip: torch_npu", 880, (0.15, 0.75, 0.10), "usr/local/lib/python3.11/site-packages/torch_npu"),
    ("vllm source + build", 420, (0.55, 0.35, 0.10), "vllm-workspace/vllm"),
    ("pip: vllm requirements", 1610, (0.32, 0.56, 0.12), "usr/local/lib/python3.11/site-packages"),
    ("pip: triton-ascend, extras", 790, (0.20, 0.65, 0.15), "usr/local/lib/python3.11/site-packages/triton"),
    ("pip: modelscope, ray", 300, (0.45, 0.35, 0.20), "usr/local/lib/python3.11/site-packages"),
    ("vllm-ascend source tree", 150, (0.80, 0.05, 0.15), "vllm-workspace/vllm-ascend"),
    ("vllm-ascend build (custom ops)", 245, (0.10, 0.85, 0.05), "vllm-workspace/vllm-ascend/vllm_ascend"),
    ("pip cache cleanup", 18, (0.60, 0.20, 0.20), "root/.cache"),
    ("ENV, WORKDIR, CMD", 0.02, (1.0, 0.0, 0.0), "etc/vllm-ascend"),
)
CHANGED_BY_A_RELEASE = 4  # the top layers a new build changes: source tree, its build, cleanup, config
AMD64_LAYERS = 2  # the other half of the two-arch tag: small (no tool downloads it)
MIN_LAYER = 4096  # unpacked bytes of the smallest layer at tiny scales
SUFFIXES = ((".py", ".h"), (".so", ".o"), (".whl", ".gz"))  # text, binary-like, compressed


class Pools:
    """Seeded content: text (~4:1 with gzip), binary-like (~2:1), random (1:1); POOL bytes each."""

    def __init__(self, seed: str, size: int = POOL):
        rng = random.Random(f"pools:{seed}")
        self.size = size
        self.text = _text_pool(rng, size)
        self.binary = _binary_pool(rng, size)
        self.random = rng.randbytes(size)

    def kind(self, k: int) -> bytes:
        return (self.text, self.binary, self.random)[k]


def _text_pool(rng: random.Random, size: int) -> bytes:
    """Lines of code-like text: Zipf-distributed words from a seeded vocabulary, indented."""
    letters = "abcdefghijklmnopqrstuvwxyz_"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 12))) for _ in range(3000)]
    vocab += ["def", "return", "self", "import", "from", "if", "else", "for", "in", "None", "=", "(", ")", ":",
              "#", "0", "1", "{", "}", "const", "int", "void", "struct", "\"", "'", ",", "."]
    weights = [1.0 / (i + 1) ** 1.1 for i in range(len(vocab))]
    rng.shuffle(weights)
    out = bytearray()
    while len(out) < size:
        words = rng.choices(vocab, weights=weights, k=200000)
        lines = []
        for i in range(0, len(words), 9):
            indent = " " * (4 * (i % 5))
            lines.append(indent + " ".join(words[i:i + 9 - (i % 4)]))
        out += "\n".join(lines).encode()
    return bytes(out[:size])


def _binary_pool(rng: random.Random, size: int) -> bytes:
    """Bytes like shared libraries: skewed-alphabet stretches (code), repeats of recent pieces
    (symbol tables, relocations), zero padding."""
    skew = bytes(_skewed_table(rng))
    out = bytearray()
    while len(out) < size:
        r = rng.random()
        n = rng.choice((256, 512, 1024, 2048, 4096))
        if r < 0.40:
            out += rng.randbytes(n).translate(skew)
        elif r < 0.88 and len(out) > 16384:
            start = len(out) - rng.randint(n, 16384)
            piece = bytearray(out[start:start + n])
            for _ in range(n // 64):
                piece[rng.randrange(n)] = rng.randrange(256)
            out += piece
        elif r < 0.95:
            out += bytes(n)
        else:
            out += rng.randbytes(n)
    return bytes(out[:size])


def _skewed_table(rng: random.Random) -> List[int]:
    """A 256-entry byte map: a few values (0x00, 0xff, common opcodes) take most of the mass."""
    common = [0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0x48, 0x8B, 0x89, 0xE8, 0x0F, 0x01]
    table = [rng.choice(common) if rng.random() < 0.45 else rng.randrange(96) for _ in range(256)]
    return table


# ---------------------------------------------------------------------------------------------
# one layer: tar bytes -> sha256 (diff_id), gzip -> file (digest), zstd -> file (the twin's digest)


class _Blob:
    def __init__(self, path: Path):
        self.path, self.f, self.sha, self.size = path, open(path, "wb"), hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        if data:
            self.sha.update(data)
            self.size += len(data)
            self.f.write(data)

    def finish(self) -> dict:
        self.f.close()
        digest = "sha256:" + self.sha.hexdigest()
        os.replace(self.path, self.path.with_name(digest.split(":")[1]))
        return {"digest": digest, "size": self.size}


class _LayerSink:
    """tar bytes in 1 MiB batches -> diff_id, gzip blob, optional zstd blob."""

    def __init__(self, blobs: Path, label: str, level: int, zstd: bool):
        self.diff, self.size = hashlib.sha256(), 0
        self.buf: List[bytes] = []
        self.buffered = 0
        self.gz = _Blob(blobs / f".tmp-{label}.gz")
        self.z = zlib.compressobj(level, zlib.DEFLATED, 31)
        self.zs: Optional[_Blob] = None
        if zstd:
            import zstandard

            self.zs = _Blob(blobs / f".tmp-{label}.zst")
            self.zc = zstandard.ZstdCompressor(level=3).compressobj()

    def write(self, data: bytes) -> None:
        self.buf.append(data)
        self.buffered += len(data)
        if self.buffered >= MiB:
            self._flush()

    def _flush(self) -> None:
        data = b"".join(self.buf)
        self.buf, self.buffered = [], 0
        self.diff.update(data)
        self.size += len(data)
        self.gz.write(self.z.compress(data))
        if self.zs is not None:
            self.zs.write(self.zc.compress(data))

    def close(self) -> dict:
        self._flush()
        self.gz.write(self.z.flush())
        out = dict(self.gz.finish(), diff_id="sha256:" + self.diff.hexdigest(), unpacked=self.size)
        if self.zs is not None:
            import zstandard

            self.zs.write(self.zc.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
            out["zstd"] = self.zs.finish()
        return out


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE, mode: int = 0o644) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.type = size, MTIME, mode, kind
    ti.uname = ti.gname = "root"
    return ti.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def write_layer(blobs: Path, pools: Pools, label: str, seed: str, want: int, mix: Sequence[float], where: str,
                level: int, zstd: bool) -> dict:
    """One layer of about `want` unpacked bytes under `where`, its files drawn from `pools` by `seed`."""
    rng = random.Random(f"layer:{seed}")
    sink = _LayerSink(blobs, label, level, zstd)
    dirs = set()

    def add_dirs(path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in dirs:
                dirs.add(d)
                sink.write(_header(d + "/", 0, tarfile.DIRTYPE, 0o755))

    marker = f"imgtool bench image, seed {seed}\n".encode()
    name = f"{where}/.imgtool-bench-{label}"
    add_dirs(name)
    sink.write(_header(name, len(marker)) + marker + bytes(-len(marker) % 512))
    written = 1024 + len(marker)
    subdirs = [f"{where}/{_word(rng)}" for _ in range(max(1, min(64, want // (4 * MiB))))]
    cap = max(want // 8, 4096)  # small layers get small files, so sizes stay close to the plan
    got = [0, 0, 0]  # bytes of each kind so far: the next file is of the kind furthest behind its share
    while written < want:
        k = max(range(3), key=lambda i: (mix[i] * (written + MiB) - got[i], -i))
        size = min(_file_size(rng, k), cap, pools.size, max(want - written, 1))
        path = f"{rng.choice(subdirs)}/{_word(rng)}{SUFFIXES[k][rng.randrange(2)]}"
        add_dirs(path)
        off = rng.randrange(pools.size - size + 1)
        data = pools.kind(k)[off:off + size]
        sink.write(_header(path, size, mode=0o755 if k == 1 else 0o644))
        sink.write(data)
        sink.write(bytes(-size % 512))
        written += 512 + size + (-size % 512)
        got[k] += size
    sink.write(bytes(1024))  # the end-of-archive blocks
    return sink.close()


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789_") for _ in range(rng.randint(4, 14)))


def _file_size(rng: random.Random, kind: int) -> int:
    """Log-uniform sizes: text 512 B-256 KiB, binaries 8 KiB-24 MiB, compressed 16 KiB-32 MiB."""
    lo, hi = ((9, 18), (13, 24.6), (14, 25))[kind]
    return int(2 ** rng.uniform(lo, hi))


# ---------------------------------------------------------------------------------------------
# the image: layers, config, manifests; cached in the work dir by seed and scale


def plan(scale: float) -> List[Tuple[str, int, Tuple[float, float, float], str]]:
    """The arm64 image's layers at `scale`: (what, unpacked bytes, mix, where)."""
    return [(what, max(int(mb * MB * scale), MIN_LAYER), mix, where) for what, mb, mix, where in LAYERS]


def key(seed: str, scale: float, level: int, full: bool = True) -> str:
    return f"vllm-{seed}-s{scale:g}-gz{level}" + ("" if full else "-gzip-only")


def cached(work: Path, seed: str, scale: float, level: int = 6, full: bool = True) -> Optional[dict]:
    meta = work / key(seed, scale, level, full) / "image.json"
    return json.loads(meta.read_text()) if meta.exists() else None


def planned_bytes(scale: float) -> Dict[str, int]:
    """What building the image at `scale` writes, estimated before it is built (for the disk check):
    unpacked, gzip, zstd and the next release's changed layers, in bytes."""
    unpacked = sum(b for _, b, _, _ in plan(scale))
    top = sum(b for _, b, _, _ in plan(scale)[-CHANGED_BY_A_RELEASE:])
    return {"unpacked": unpacked, "gzip": int(unpacked / 2.2), "zstd": int(unpacked / 2.3), "next": int(top / 2)}


def build(work: Path, seed: str, scale: float, level: int = 6, full: bool = True, jobs: Optional[int] = None) -> dict:
    """The two-arch image, with `full` its zstd twin and its next release, in work/<key>/blobs; cached.

    Returns the meta bench.py reads: {"dir", "index", "images": {arch: {config, manifest, layers,
    platform, ...}}, "zstd": {...}, "next": {...}, "seconds", "scale", "seed"}."""
    d = work / key(seed, scale, level, full)
    meta_path = d / "image.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    shutil.rmtree(d, ignore_errors=True)
    blobs = d / "blobs"
    blobs.mkdir(parents=True)
    t0 = time.monotonic()
    layers = plan(scale)
    total = sum(b for _, b, _, _ in layers)
    pools = Pools(seed, min(POOL, max(MiB, 1 << (total - 1).bit_length())))  # tiny images: tiny pools
    jobs = jobs or os.cpu_count() or 2
    tasks = []  # (image, index, label, seed, bytes, mix, where, zstd)
    for i, (_, want, mix, where) in enumerate(layers):
        tasks.append(("arm64", i, f"arm64-{i}", f"{seed}:{i}", want, mix, where, full))
    for i, (_, want, mix, where) in enumerate(layers[-CHANGED_BY_A_RELEASE:] if full else []):
        n = len(layers) - CHANGED_BY_A_RELEASE + i
        tasks.append(("next", n, f"next-{n}", f"{seed}:next:{n}", want, mix, where, False))
    small = max(int(sum(b for _, b, _, _ in layers) / 50 / AMD64_LAYERS), MIN_LAYER)
    for i in range(AMD64_LAYERS):
        tasks.append(("amd64", i, f"amd64-{i}", f"{seed}:amd64:{i}", small, (0.3, 0.6, 0.1), "usr/lib", False))
    tasks.sort(key=lambda t: -t[4])  # the giant first: the pool's other worker makes the rest meanwhile
    done: Dict[Tuple[str, int], dict] = {}
    with ThreadPoolExecutor(jobs) as pool:
        futures = {(t[0], t[1]): pool.submit(write_layer, blobs, pools, t[2], t[3], t[4], t[5], t[6], level, t[7])
                   for t in tasks}
        for k, f in futures.items():
            done[k] = f.result()
    arm = [done[("arm64", i)] for i in range(len(layers))]
    images = {"arm64": _image(blobs, "arm64", "v8", arm, [w for w, _, _, _ in layers], "v1"),
              "amd64": _image(blobs, "amd64", None, [done[("amd64", i)] for i in range(AMD64_LAYERS)],
                              ["amd64 layer"] * AMD64_LAYERS, "v1")}
    meta = {"dir": str(d), "index": _index(blobs, images), "images": images, "seed": seed, "scale": scale,
            "layer_names": [w for w, _, _, _ in layers]}
    if full:
        top = range(len(layers) - CHANGED_BY_A_RELEASE, len(layers))
        nxt = arm[:-CHANGED_BY_A_RELEASE] + [done[("next", i)] for i in top]
        nimages = {"arm64": _image(blobs, "arm64", "v8", nxt, [w for w, _, _, _ in layers], "v2"),
                   "amd64": images["amd64"]}
        meta["next"] = {"index": _index(blobs, nimages), "images": nimages}
        meta["zstd"] = _zstd_manifest(blobs, images["arm64"], arm)
    meta["seconds"] = round(time.monotonic() - t0, 1)
    tmp = d / ".image.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, meta_path)  # last: a killed build is never taken for a cached one
    return meta


def _json(obj) -> bytes:
    return json.dumps(obj, indent=3).encode()


def _put(blobs: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (blobs / digest.split(":")[1]).write_bytes(data)
    return digest


def _image(blobs: Path, arch: str, variant: Optional[str], layers: List[dict], history: List[str], release: str) -> dict:
    config = {"architecture": arch, "os": "linux", "created": "2025-01-01T00:00:00Z",
              "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                 "ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest",
                                 f"IMGTOOL_BENCH_RELEASE={release}"],
                         "WorkingDir": "/vllm-workspace", "Cmd": ["/bin/bash"]},
              "rootfs": {"type": "layers", "diff_ids": [x["diff_id"] for x in layers]},
              "history": [{"created": "2025-01-01T00:00:00Z", "created_by": h} for h in history]}
    if variant:
        config["variant"] = variant
    cbytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    cdigest = _put(blobs, cbytes)
    manifest = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                "config": {"mediaType": DOCKER_CONFIG, "size": len(cbytes), "digest": cdigest},
                "layers": [{"mediaType": DOCKER_LAYER, "size": x["size"], "digest": x["digest"]} for x in layers]}
    mbytes = _json(manifest)
    plat = {"architecture": arch, "os": "linux"}
    if variant:
        plat["variant"] = variant
    return {"config": cdigest, "config_size": len(cbytes), "manifest": _put(blobs, mbytes),
            "manifest_size": len(mbytes), "platform": plat,
            "layers": [{k: x[k] for k in ("digest", "size", "diff_id", "unpacked")} for x in layers]}


def _index(blobs: Path, images: Dict[str, dict]) -> str:
    lst = {"schemaVersion": 2, "mediaType": DOCKER_LIST,
           "manifests": [{"mediaType": DOCKER_MANIFEST, "size": im["manifest_size"], "digest": im["manifest"],
                          "platform": im["platform"]} for im in images.values()]}
    return _put(blobs, _json(lst))


def _zstd_manifest(blobs: Path, im: dict, layers: List[dict]) -> dict:
    """The arm64 image as a builder that switched to zstd publishes it: same config (image ID), same tars."""
    zl = [dict(x["zstd"], unpacked=x["unpacked"]) for x in layers]
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "size": im["config_size"], "digest": im["config"]},
                "layers": [{"mediaType": OCI_LAYER_ZSTD, "size": x["size"], "digest": x["digest"]} for x in zl]}
    return {"manifest": _put(blobs, _json(manifest)), "layers": zl, "config": im["config"]}
