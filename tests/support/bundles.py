"""Bundles from factory images: PulledImage values and a blob dir, without a registry or puller.

    store = BlobDir(tmp_path / "blobs")
    pulled = store.pulled(factory.image("arm64"), "quay.io/ascend/vllm-ascend:v1")
    write_bundle(out, [pulled], FileBlobs(store.path), chunk_size=..., compress="none", force=False,
                 progress=Progress())
"""

import atexit
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from imgtool.model import Digest, ImageConfig, ImageRef, Platform, PulledImage, parse_manifest

from . import zygote
from .images import DOCKER_CONFIG, DOCKER_LAYER, DOCKER_MANIFEST, Image, Layer, host_arch, sha256_digest

REPO = "quay.io/ascend/vllm-ascend"


class BlobDir:
    """A directory of blobs by digest: the test's stand-in for the store (`path` is blob_path)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, digest: Digest) -> Path:
        return self.root / digest.hex

    def put(self, data: bytes) -> Digest:
        d = Digest.of(data)
        p = self.path(d)
        if not p.exists():
            p.write_bytes(data)
        return d

    def pulled(self, image: Image, ref: str, source: str = "test", index=None) -> PulledImage:
        """Write the image's blobs here and describe it as the puller would (`index`: the support.images.Index it
        was resolved through, whose bytes fetch keeps)."""
        for data in image.blobs().values():
            self.put(data)
        manifest = parse_manifest(image.manifest_bytes)
        return PulledImage(
            ref=ImageRef.parse(ref).with_digest(Digest.parse(index.manifest_digest if index else image.manifest_digest)),
            source=source,
            platform=Platform.parse(image.platform),
            index_digest=Digest.parse(index.manifest_digest) if index else None,
            index_bytes=index.manifest_bytes if index else None,
            index_media_type=index.manifest_media_type if index else "",
            manifest_digest=Digest.parse(image.manifest_digest),
            manifest_bytes=image.manifest_bytes,
            manifest=manifest,
            config_bytes=image.config_bytes,
            config=ImageConfig.parse(image.config_bytes),
        )


def random_layer(size: int, seed: int) -> Layer:
    """A gzip layer of one file of `size` pseudo-random bytes (incompressible, fast to make)."""
    data = _random_bytes(size, seed)
    tbuf = io.BytesIO()
    with tarfile.open(fileobj=tbuf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        ti = tarfile.TarInfo(f"data/blob-{seed}.bin")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    raw = tbuf.getvalue()
    blob = gzip.compress(raw, compresslevel=0, mtime=0)  # stored deflate: fast, still gzip
    return Layer(blob=blob, digest=sha256_digest(blob), size=len(blob),
                 diff_id=sha256_digest(raw), uncompressed_size=len(raw), files=(ti.name,))


def _random_bytes(size: int, seed: int) -> bytes:
    return random.Random(f"layer-{seed}").randbytes(size)


def simple_image(layers: Sequence[Layer], arch: str = "amd64", seed: int = 0) -> Image:
    """A Docker v2 image over `layers` (config + manifest built here)."""
    architecture, variant = {"amd64": ("amd64", None), "arm64": ("arm64", "v8")}[arch]
    cfg = {"architecture": architecture, "os": "linux", "created": "2025-01-01T00:00:00Z",
           "config": {"Labels": {"imgtool.test.seed": str(seed)}},
           "rootfs": {"type": "layers", "diff_ids": [x.diff_id for x in layers]}}
    if variant:
        cfg["variant"] = variant
    config_bytes = json.dumps(cfg, sort_keys=True).encode()
    manifest = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                "config": {"mediaType": DOCKER_CONFIG, "size": len(config_bytes),
                           "digest": sha256_digest(config_bytes)},
                "layers": [{"mediaType": DOCKER_LAYER, "size": x.size, "digest": x.digest} for x in layers]}
    manifest_bytes = json.dumps(manifest, indent=3).encode()
    return Image(os="linux", architecture=architecture, variant=variant, media="docker", layers=tuple(layers),
                 config_bytes=config_bytes, config_digest=sha256_digest(config_bytes),
                 manifest_bytes=manifest_bytes, manifest_digest=sha256_digest(manifest_bytes))


def parts_of(bundle: Path) -> List[Path]:
    """The part files of a bundle, in order, as bundle.json lists them."""
    doc = json.loads((bundle / "bundle.json").read_text())
    return [bundle / p["name"] for p in doc["parts"]]


def parts_holding(bundle: Path, member) -> str:
    """Where verify and load say a member lies: "in part 001", "in parts 002-003".

    `member` is a blob digest or an archive member name. Read from the bundle itself (the parts'
    sizes in bundle.json, the member's header and data offsets in the tar), never from the
    product's own layout code, so no test hard-codes a part boundary that moves with layer sizes.
    """
    doc = json.loads((bundle / "bundle.json").read_text())
    if doc["archive"]["compression"] != "none":
        raise ValueError(f"{bundle} is compressed: problems are named 'in the compressed archive'")
    name = str(member)
    if name.startswith("sha256:"):
        name = "blobs/sha256/" + name[len("sha256:"):]
    with tarfile.open(fileobj=io.BytesIO(canonical_tar(bundle))) as tar:
        info = tar.getmember(name)
    start, end = info.offset, info.offset_data + info.size
    bounds, pos = [], 0
    for p in doc["parts"]:
        bounds.append((pos, pos + p["size"]))
        pos += p["size"]
    holding = [i for i, (a, b) in enumerate(bounds) if a < end and start < b]
    width = max(3, len(str(len(bounds))))
    labels = [f"{i + 1:0{width}d}" for i in holding]
    return f"in part {labels[0]}" if len(labels) == 1 else f"in parts {labels[0]}-{labels[-1]}"


def damage_member(bundle: Path, member) -> List[int]:
    """Flip the middle byte of a member's data (a blob digest or an archive member name) in the part that holds
    it, found from the bundle itself as `parts_holding` finds it; returns the indexes of every part the member's
    data spans (0 = part 001), for the message that names them."""
    doc = json.loads((bundle / "bundle.json").read_text())
    name = str(member)
    if name.startswith("sha256:"):
        name = "blobs/sha256/" + name[len("sha256:"):]
    with tarfile.open(fileobj=io.BytesIO(canonical_tar(bundle))) as tar:
        info = tar.getmember(name)
    sizes = [p["size"] for p in doc["parts"]]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    begin, end = info.offset_data, info.offset_data + info.size
    spans = [i for i, a in enumerate(starts) if a < end and begin < a + sizes[i]]
    at = begin + info.size // 2
    k = max(i for i, a in enumerate(starts) if a <= at)
    part = bundle / doc["parts"][k]["name"]
    data = bytearray(part.read_bytes())
    data[at - starts[k]] ^= 0xFF
    part.write_bytes(bytes(data))
    return spans


def reassemble(bundle: Path, out: Path) -> Path:
    """cat the parts into one (decompressed) tar at `out`."""
    doc = json.loads((bundle / "bundle.json").read_text())
    data = b"".join(p.read_bytes() for p in parts_of(bundle))
    comp = doc["archive"]["compression"]
    if comp == "gzip":
        data = zlib.decompress(data, 31)
    elif comp == "zstd":
        import zstandard

        data = zstandard.ZstdDecompressor().decompress(data, max_output_size=doc["archive"]["tar_size"])
    out.write_bytes(data)
    return out


def ctrl_c_as_at_a_terminal() -> None:
    """A Popen preexec_fn for a test that sends SIGINT: the child gets SIGINT's default action, as a terminal's
    foreground job does (a test run started in the background, `cmd &`, hands its children SIGINT ignored,
    and Python then keeps ignoring it)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def imgtool(*args: str, docker_host: Optional[str] = None, env: Optional[Dict[str, str]] = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the imgtool CLI in a subprocess (exact stderr and exit codes), Docker at docker_host.

    The machine's own runtimes are out of reach: containerd's address is none unless `env` gives one,
    and `podman` is the private one of the test services (its storage under the services dir)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "CONTAINERD_", "CONTAINERS_"))}
    e["CONTAINERD_ADDRESS"] = "/nonexistent/imgtool-test/containerd.sock"
    # the machine's model caches too: doctor lists what is placed there
    e["HF_HUB_CACHE"] = "/nonexistent/imgtool-test/huggingface/hub"
    e["MODELSCOPE_CACHE"] = "/nonexistent/imgtool-test/modelscope/hub"
    podman = os.environ.get("IMGTOOL_TEST_PODMAN")
    if podman:
        e["PATH"] = os.path.join(podman, "bin") + os.pathsep + e.get("PATH", "/usr/bin:/bin")
        e["CONTAINERS_STORAGE_CONF"] = os.path.join(podman, "storage.conf")
        e["CONTAINERS_CONF"] = os.path.join(podman, "containers.conf")
    if docker_host:
        e["DOCKER_HOST"] = docker_host
    e.update(env or {})
    return zygote.run(args, env=e, timeout=timeout)  # a fork of a Python that imported the CLI already


def write(out: Path, images: Sequence[PulledImage], store: "BlobDir", *, chunk_size: Optional[int] = None,
          compress: str = "none", force: bool = False, created: str = "2025-01-01T00:00:00Z",
          verified=(), models=()):
    """write_bundle with quiet progress and a fixed creation time (`verified`: blobs it copies unchecked; `models`:
    BundleModels whose files are in `store`, see put_model)."""
    from imgtool.bundle.writer import write_bundle
    from imgtool.store import FileBlobs
    from imgtool.progress import Progress

    return write_bundle(out, images, FileBlobs(store.path, verified), chunk_size=chunk_size, compress=compress,
                        force=force, progress=Progress(), created=created, models=models)


def put_model(store: "BlobDir", model, revision: str = "main", hub: str = "hf", omitted=(), modelcar: bool = False):
    """A seeded model's revision (tests/support/models.py HubModel) as a bundle carries it: its files written into
    `store` by sha256, and the BundleModel describing them (`omitted`: sha256s a delta leaves out; `modelcar`: with
    each file's modelcar layer digest, as fetch records them)."""
    from imgtool import modelcar as car
    from imgtool.bundle.format import bundle_model
    from imgtool.weights import ModelFile, ModelRef, ModelSnapshot

    rev = model.resolve(revision)
    files = []
    for f in rev.files.values():
        path = store.path(Digest.parse("sha256:" + f.sha256))
        if not path.exists():
            with open(path, "wb") as out:
                for chunk in f.chunks():
                    out.write(chunk)
        files.append(ModelFile(f.path, f.size, Digest.parse("sha256:" + f.sha256), f.blob_id, f.lfs))
    snapshot = ModelSnapshot(ModelRef(hub, model.repo_id, revision), rev.commit, tuple(files))
    layers = {f.path: car.layer_digest(f.path, f.size, f.chunks()) for f in rev.files.values()} if modelcar else None
    return bundle_model(snapshot, "test", omitted, layers)


def write_delta(out: Path, factory, store: "BlobDir", repo: str):
    """A delta bundle of REPO:v2 written to `out`, leaving out the two base layers it shares with REPO:v1 (as a
    fetch --base of v1's bundle would); returns (the base layers, the v1 image, the v2 image)."""
    from imgtool.bundle.writer import write_bundle
    from imgtool.store import FileBlobs
    from imgtool.delta import DeltaPlan, Have
    from imgtool.model import Digest
    from imgtool.progress import Progress

    from .images import host_arch

    base = factory.layers(2)
    old = factory.image(host_arch(), layers=1, base=base)
    new = factory.image(host_arch(), layers=1, base=base)
    have = Have("test")
    have.add([Digest.parse(d) for d in old.diff_ids], f"{repo}:v1")
    pulled = [store.pulled(new, f"{repo}:v2")]
    write_bundle(out, pulled, FileBlobs(store.path), chunk_size=None, compress="none", force=False, progress=Progress(),
                 delta=DeltaPlan.make(have, {"kind": "bundle", "name": "v1"}, pulled))
    return base, old, new


def canonical_tar(bundle: Path) -> bytes:
    """The bundle's uncompressed tar (small bundles only: read into memory)."""
    data = b"".join(p.read_bytes() for p in parts_of(bundle))
    comp = json.loads((bundle / "bundle.json").read_text())["archive"]["compression"]
    if comp == "gzip":
        return zlib.decompress(data, 31)
    if comp == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 30)
    return data


def tar_body(tar: bytes) -> bytes:
    """A tar without its end-of-archive blocks and record padding (to append members to)."""
    pos = 0
    while pos + 512 <= len(tar):
        block = tar[pos:pos + 512]
        if block == bytes(512):
            return tar[:pos]
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        size = info.size if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.XHDTYPE) else 0
        pos += 512 + size + (-size % 512)
    return tar


def member_bytes(name: str, data: bytes = b"", **attrs) -> bytes:
    """One tar member (header + padded data) with tarfile's defaults plus attrs (type, linkname, ...)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    for k, v in attrs.items():
        setattr(info, k, v)
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + bytes(-len(data) % 512)


def replace_archive(bundle: Path, tar: bytes) -> None:
    """Make `tar` the bundle's only (uncompressed) part and make bundle.json and SHA256SUMS agree.

    What an attacker who can write the whole medium would do: parts check out, only the walk
    of the archive can tell.
    """
    doc = json.loads((bundle / "bundle.json").read_text())
    for p in parts_of(bundle):
        p.unlink()
    tar += bytes(1024)
    tar += bytes(-len(tar) % 10240)
    name = doc["archive"]["name"].split(".tar")[0] + ".tar"
    (bundle / name).write_bytes(tar)
    sha = hashlib.sha256(tar).hexdigest()
    doc["archive"].update({"name": name, "compression": "none", "size": len(tar), "sha256": sha,
                           "tar_size": len(tar)})
    doc["parts"] = [{"name": name, "size": len(tar), "sha256": sha}]
    raw = (json.dumps(doc, indent=2) + "\n").encode()
    (bundle / "bundle.json").write_bytes(raw)
    sums = [f"{sha}  {name}", f"{hashlib.sha256(raw).hexdigest()}  bundle.json"]
    for f in doc["files"]:
        sums.append(f"{f['sha256']}  {f['name']}")
    (bundle / "SHA256SUMS").write_text("\n".join(sums) + "\n")


def rewrite_parts(bundle: Path, data: bytes) -> None:
    """Make `data` (the archive as stored: compressed when the bundle is) the bundle's only part, with bundle.json
    and SHA256SUMS made to agree; the compression and the tar size stay what bundle.json says. What a hostile maker
    writes: every size and sum checks out, only reading the archive can tell."""
    doc = json.loads((bundle / "bundle.json").read_text())
    for p in parts_of(bundle):
        p.unlink()
    name = doc["parts"][0]["name"]
    (bundle / name).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    doc["archive"].update({"size": len(data), "sha256": sha})
    doc["parts"] = [{"name": name, "size": len(data), "sha256": sha}]
    raw = (json.dumps(doc, indent=2) + "\n").encode()
    (bundle / "bundle.json").write_bytes(raw)
    sums = [f"{sha}  {name}", f"{hashlib.sha256(raw).hexdigest()}  bundle.json"]
    sums += [f"{f['sha256']}  {f['name']}" for f in doc["files"]]
    (bundle / "SHA256SUMS").write_text("\n".join(sums) + "\n")


_TOOL: Optional[Path] = None


def seed_tool(cache: Path) -> None:
    """Give the fetch cache `cache` the imgtool.pyz this checkout builds, as a fetch into it leaves it in
    `cache/tool/` (selfbundle.cached_tool): built once per test process instead of once per test (zipping imgtool
    and its dependencies, ~0.4 CPU s a fetch). Tests of the build itself use a cache of their own."""
    global _TOOL
    if _TOOL is None:
        from imgtool import selfbundle

        where = Path(tempfile.mkdtemp(prefix="imgtool-tool-"))
        atexit.register(shutil.rmtree, where, True)
        _TOOL = selfbundle.cached_tool(where).path
    (cache / "tool").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_TOOL, cache / "tool" / _TOOL.name)


def fetch_from_registry(services, factory, mirrored, tmp_path: Path, *extra: str):
    """A two-layer multi-arch image published as quay.io's v0.22.1rc1 on the plain registry, fetched
    for this host's arch through the real CLI into tmp_path/bundle (1 MiB parts, the smallest a user may ask for).
    Returns (bundle dir, the host-arch image, its canonical name, the CompletedProcess)."""
    idx = factory.multiarch(media="oci", layers=2)
    ms = mirrored(idx, tag="v0.22.1rc1", targets=("upstream",))
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    out = tmp_path / "bundle"
    seed_tool(tmp_path / "cache")
    r = imgtool("fetch", "v0.22.1rc1", "--arch", host_arch(), "--mirrors", str(cfg), "-o", str(out),
                "--chunk-size", "1M", *extra, env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    return out, idx.image(host_arch()), f"quay.io/{ms.repo}:v0.22.1rc1", r


def fetch_two_arch(services, factory, mirrored, tmp_path: Path, media: str, *extra: str):
    """A tag (v3) published upstream as an index over amd64 and arm64 (`media`: docker, oci), fetched as users
    do (`fetch --arch amd64,arm64`) into tmp_path/both; returns (bundle dir, the index, its repository path)."""
    idx = factory.multiarch(("amd64", "arm64"), layers=2, media=media)
    ms = mirrored(idx, tag="v3", targets=("upstream",))
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    out = tmp_path / "both"
    r = imgtool("fetch", "--no-tool", "v3", "--arch", "amd64,arm64", "--mirrors", str(cfg), "-o", str(out), *extra,
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    return out, idx, ms.repo


_EMPTY_TAR = bytes(10240)  # a compressed archive's part holds no member's bytes as they are: none is named


def damaged_part_line(bundle: Path, k: int) -> str:
    """verify's line for part `k` (0 = part 001) of an uncompressed bundle damaged: what the part holds found from
    the tar itself (tarfile's member offsets) and bundle.json's layers and model files, at most 3 named."""
    doc = json.loads((bundle / "bundle.json").read_text())
    names = {}
    for im in doc["images"]:
        for i, x in enumerate(im["layers"]):
            names.setdefault("blobs/sha256/" + x["digest"].split(":")[1], f"layer {i + 1} of {im['ref']}")
    for m in doc.get("models", []):
        for f in m["files"]:
            names.setdefault("blobs/sha256/" + f["sha256"].split(":")[1], f"{f['path']} of {m['ref']}")
    sizes = [p["size"] for p in doc["parts"]]
    start, end = sum(sizes[:k]), sum(sizes[:k + 1])
    held: List[str] = []
    with tarfile.open(fileobj=io.BytesIO(canonical_tar(bundle) if doc["archive"]["compression"] == "none" else
                                         _EMPTY_TAR)) as tar:
        for info in tar.getmembers():
            if info.name in names and info.offset_data < end and start < info.offset_data + info.size \
                    and names[info.name] not in held:
                held.append(names[info.name])
    part = doc["parts"][k]["name"]
    n = f"{k + 1:03d}"
    holds = f" (it holds {', '.join(held[:3])}{f' and {len(held) - 3} more' if len(held) > 3 else ''})" if held else ""
    return (f"  - part {n} ({part}) is damaged: its sha256 differs from bundle.json{holds}; re-copy part {n} "
            "from the source medium")


SUMS_DAMAGED = "load.sh: error: these files are damaged or missing:"


def sums_damaged(*names: str) -> list:
    """load.sh's lines for parts whose sha256 is not SHA256SUMS's: the error, each part, what to do."""
    return [SUMS_DAMAGED, *(f"    {name}: FAILED" for name in names),
            "load.sh: re-copy them from the source medium, then run load.sh again"]
