"""Real-shaped random images for tests: gzip layers of generated files, configs, manifests, indexes.

Everything is a pure function of the seed (and $IMGTOOL_TEST_SEED, mixed into every seed): file
names, sizes, modes and contents are drawn from `random.Random`, never read from this machine, so
the same test builds the same bytes on every host. Built in memory. Typical use:

    f = ImageFactory(seed=1)
    base = [f.layer(), f.layer()]                    # shared bottom layers
    old = f.image("arm64", layers=1, base=base)      # base + one new layer, Docker v2 schema2
    new = f.image("arm64", layers=1, base=base)      # same base blobs, different top layer
    idx = f.multiarch(layers=2, base=base)           # OCI index: linux/amd64 + linux/arm64/v8
    write_docker_archive(old, tmp_path / "old.tar", "example.com/app:v1")
"""

import gzip
import hashlib
import io
import json
import math
import os
import platform as _platform
import random
import struct
import sys
import tarfile
from array import array
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"

MEDIA_TYPES = {  # media= value -> (manifest, config, layer, index)
    "docker": (DOCKER_MANIFEST, DOCKER_CONFIG, DOCKER_LAYER, DOCKER_MANIFEST_LIST),
    "oci": (OCI_MANIFEST, OCI_CONFIG, OCI_LAYER, OCI_INDEX),
}
#: what a client should send as Accept to get any of the above
MANIFEST_ACCEPT = ", ".join([OCI_INDEX, DOCKER_MANIFEST_LIST, OCI_MANIFEST, DOCKER_MANIFEST])

CREATED = "2025-01-01T00:00:00Z"
MTIME = 1735689600  # CREATED as a unix time: every tar entry gets it, for reproducible bytes
DEFAULT_LAYER_SIZE = 1 << 20  # ~1 MiB compressed per layer: 3 layers ~ 3 MiB
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUSYBOX = "/bin/busybox"  # Debian's busybox-static: one static binary, a shell and the applets below
BUSYBOX_APPLETS = ("sh", "df", "cat", "ls", "echo", "true", "false", "sleep", "uname", "env", "test",
                   "mkdir", "rm", "id")

# arch name (as tests say it) -> (architecture, variant) as configs and indexes say it
ARCHES = {
    "amd64": ("amd64", None),
    "x86_64": ("amd64", None),
    "arm64": ("arm64", "v8"),
    "arm64/v8": ("arm64", "v8"),
    "aarch64": ("arm64", "v8"),
    "arm/v7": ("arm", "v7"),
    "ppc64le": ("ppc64le", None),
    "s390x": ("s390x", None),
}


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def host_arch() -> str:
    m = _platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(m, m)


def _manifest_json(obj) -> bytes:
    # Indented like the manifests distribution and Docker write: a client that re-serializes
    # JSON instead of hashing the bytes it received gets a different digest.
    return json.dumps(obj, indent=3).encode()


def _config_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Layer:
    """One layer blob (gzip unless `media_type` says zstd); `diff_id` is the sha256 of its uncompressed tar."""

    blob: bytes = field(repr=False)
    digest: str
    size: int
    diff_id: str
    uncompressed_size: int
    files: Tuple[str, ...] = field(repr=False, default=())
    media_type: Optional[str] = None  # None: the gzip layer type of the manifest's media

    def descriptor(self, media: str = "docker") -> dict:
        return {"mediaType": self.media_type or MEDIA_TYPES[media][2], "size": self.size, "digest": self.digest}

    def tar_bytes(self) -> bytes:
        if self.media_type == OCI_LAYER_ZSTD:
            import zstandard

            return zstandard.ZstdDecompressor().decompress(self.blob, max_output_size=self.uncompressed_size)
        return gzip.decompress(self.blob)

    def zstd(self) -> "Layer":
        """The same tar, zstd-compressed as a registry serving zstd images holds it (same diff_id)."""
        import zstandard

        blob = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(self.tar_bytes())
        return Layer(blob=blob, digest=sha256_digest(blob), size=len(blob), diff_id=self.diff_id,
                     uncompressed_size=self.uncompressed_size, files=self.files, media_type=OCI_LAYER_ZSTD)


@dataclass(frozen=True)
class Image:
    """A single-platform image: config + layers + manifest, all as the exact bytes to serve."""

    os: str
    architecture: str
    variant: Optional[str]
    media: str  # "docker" or "oci"
    layers: Tuple[Layer, ...]
    config_bytes: bytes = field(repr=False)
    config_digest: str
    manifest_bytes: bytes = field(repr=False)
    manifest_digest: str

    @property
    def platform(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)

    @property
    def id(self) -> str:
        """What `docker image inspect` reports as Id after loading this image."""
        return self.config_digest

    @property
    def config_size(self) -> int:
        return len(self.config_bytes)

    @property
    def manifest_size(self) -> int:
        return len(self.manifest_bytes)

    @property
    def manifest_media_type(self) -> str:
        return MEDIA_TYPES[self.media][0]

    media_type = manifest_media_type

    @property
    def config(self) -> dict:
        return json.loads(self.config_bytes)

    @property
    def manifest(self) -> dict:
        return json.loads(self.manifest_bytes)

    @property
    def diff_ids(self) -> List[str]:
        return [layer.diff_id for layer in self.layers]

    def blobs(self) -> Dict[str, bytes]:
        """Every blob by digest: config first, then layers bottom-up."""
        out = {self.config_digest: self.config_bytes}
        for layer in self.layers:
            out[layer.digest] = layer.blob
        return out

    def manifests(self) -> Dict[str, Tuple[str, bytes]]:
        """digest -> (media type, bytes) of every manifest, children before parents."""
        return {self.manifest_digest: (self.manifest_media_type, self.manifest_bytes)}

    def descriptor(self) -> dict:
        """This image as an entry of an index / manifest list."""
        plat = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            plat["variant"] = self.variant
        return {
            "mediaType": self.manifest_media_type,
            "size": self.manifest_size,
            "digest": self.manifest_digest,
            "platform": plat,
        }


@dataclass(frozen=True)
class Index:
    """A multi-platform image: an OCI index or a Docker manifest list over `images`."""

    media: str  # "oci" (index) or "docker" (manifest list)
    images: Tuple[Image, ...]
    manifest_bytes: bytes = field(repr=False)
    manifest_digest: str

    @property
    def manifest_size(self) -> int:
        return len(self.manifest_bytes)

    @property
    def manifest_media_type(self) -> str:
        return MEDIA_TYPES[self.media][3]

    media_type = manifest_media_type

    @property
    def manifest(self) -> dict:
        return json.loads(self.manifest_bytes)

    @property
    def platforms(self) -> List[str]:
        return [image.platform for image in self.images]

    def image(self, platform: str) -> Image:
        """The child for "linux/arm64", "linux/arm64/v8", "arm64", ...; KeyError if none."""
        want = platform if "/" in platform and platform.startswith(("linux/", "windows/")) \
            else "linux/" + platform
        for image in self.images:
            if image.platform == want or image.platform.startswith(want + "/"):
                return image
        raise KeyError(f"no {platform} in index (has {', '.join(self.platforms)})")

    def blobs(self) -> Dict[str, bytes]:
        out: Dict[str, bytes] = {}
        for image in self.images:
            out.update(image.blobs())
        return out

    def manifests(self) -> Dict[str, Tuple[str, bytes]]:
        out: Dict[str, Tuple[str, bytes]] = {}
        for image in self.images:
            out.update(image.manifests())
        out[self.manifest_digest] = (self.manifest_media_type, self.manifest_bytes)
        return out


@dataclass(frozen=True)
class AttestedIndex(Index):
    """An OCI index whose builder added attestation manifests (buildkit's provenance: an OCI manifest with an
    in-toto layer, listed with platform unknown/unknown): pushed with them, fetched without them."""

    attestations: Tuple[Tuple[str, bytes], ...] = field(default=(), repr=False)  # (digest, manifest bytes)
    attestation_blobs: Tuple[bytes, ...] = field(default=(), repr=False)

    def blobs(self) -> Dict[str, bytes]:
        out = super().blobs()
        out.update((sha256_digest(b), b) for b in self.attestation_blobs)
        return out

    def manifests(self) -> Dict[str, Tuple[str, bytes]]:
        out: Dict[str, Tuple[str, bytes]] = {}
        for image in self.images:
            out.update(image.manifests())
        out.update((d, (OCI_MANIFEST, body)) for d, body in self.attestations)
        out[self.manifest_digest] = (self.manifest_media_type, self.manifest_bytes)  # last: it names the others
        return out


ImageOrIndex = Union[Image, Index]

# ---------------------------------------------------------------------------------------------
# where layer contents come from: generated from the seed, never read from this machine, so a
# layer's bytes, sizes and part boundaries are the same on every host (issue 15)

SEED_ENV = "IMGTOOL_TEST_SEED"
MAX_FILE = 256 << 10  # a generated file's size is log-uniform in [MIN_FILE, MAX_FILE]
MIN_FILE = 64
#: share of a layer's uncompressed bytes per kind of file; with gzip -6 the mix compresses about
#: 2.5x overall, like a layer of real files (text ~5x, binaries ~2x, packed data 1x)
KIND_SHARE = (("text", 0.50), ("binary", 0.38), ("packed", 0.12))
_EXTENSIONS = {
    "text": (".py", ".txt", ".conf", ".json", ".h", ".md", ".sh", ".yaml"),
    "binary": (".so", ".bin", ".o", ".so.1"),
    "packed": (".gz", ".png", ".whl", ".zst"),
}
# every file name has an extension and no directory name a dot: a file never shares a path with a
# directory (docker load refuses such a layer: "duplicates of file paths not supported")
_TOPS = ("opt/app", "opt/toolkit", "srv/data", "etc", "var/cache", "home/app", "lib/ext")
_SYLLABLES = ("ka", "to", "ri", "en", "de", "sh", "ar", "on", "il", "um", "ex", "po", "la", "ne", "st",
              "co", "me", "ti", "ra", "vo", "in", "it", "al", "or", "ue", "py", "np", "ux")
_SEPARATORS = (b" ", b" ", b" ", b"_", b".", b", ", b" = ", b"(", b"): ", b"/", b"-", b"\"")
_TEXT_LINES = 8192  # distinct lines; the table holds each 8 times, so any 16-bit number picks one
_CORPORA: Dict[str, Tuple[List[bytes], List[bytes]]] = {}


def suite_seed() -> str:
    """$IMGTOOL_TEST_SEED, mixed into every factory's seed ("0" unless set): vary it to show that no
    test depends on the particular bytes."""
    return os.environ.get(SEED_ENV, "").strip() or "0"


def _corpus(seed: str) -> Tuple[List[bytes], List[bytes]]:
    """(words, lines) that text files are drawn from: made once per suite seed."""
    if seed not in _CORPORA:
        rng = random.Random(f"{seed}:corpus")
        words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))).encode()
                 for _ in range(3000)]

        def line() -> bytes:
            # Zipf-like word choice (a few words are everywhere), a few indents: compresses ~5x
            picked = (words[min(int(rng.paretovariate(1.0)), len(words) - 1)] + rng.choice(_SEPARATORS)
                      for _ in range(rng.randint(1, 12)))
            return b"    " * rng.randint(0, 3) + b"".join(picked) + b"\n"

        _CORPORA[seed] = (words, [line() for _ in range(_TEXT_LINES)] * (65536 // _TEXT_LINES))
    return _CORPORA[seed]


def _text(rng: random.Random, size: int, lines: List[bytes]) -> bytes:
    picks = array("H", rng.randbytes(2 * (size // 24 + 1)))
    if sys.byteorder == "big":  # the same picks on every machine
        picks.byteswap()
    return b"".join(map(lines.__getitem__, picks))[:size]


def _binary(rng: random.Random, size: int) -> bytes:
    # like an executable: random code and data between runs of zeros and repeated records (~2x)
    out, n = [], 0
    while n < size:
        k = rng.randint(16, 4096)
        roll = rng.random()
        if roll < 0.5:
            out.append(rng.randbytes(k))
        elif roll < 0.85:
            out.append(bytes(k))
        else:
            out.append((rng.randbytes(16) * (k // 16 + 1))[:k])
        n += k
    return b"".join(out)[:size]


class _Contents:
    """Files for one layer: names, modes and bytes from `rng`, kinds in KIND_SHARE's proportions."""

    def __init__(self, rng: random.Random, seed: str):
        self.rng = rng
        self.words, self.lines = _corpus(seed)
        self.bytes = {kind: 0 for kind, _ in KIND_SHARE}
        self.names: set = set()

    def next_file(self, limit: int) -> Tuple[str, bytes, int]:
        """(name, data, mode) of a file of at most max(MIN_FILE, limit) bytes."""
        rng = self.rng
        total = sum(self.bytes.values()) + 1
        # the kind furthest below its share, so every layer has about the same mix (and ratio)
        kind = max(KIND_SHARE, key=lambda ks: ks[1] * total - self.bytes[ks[0]])[0]
        size = int(math.exp(rng.uniform(math.log(MIN_FILE), math.log(MAX_FILE))))
        size = max(MIN_FILE, min(size, limit))
        if kind == "text":
            data = _text(rng, size, self.lines)
            mode = 0o755 if rng.random() < 0.1 else 0o644
        elif kind == "binary":
            data = _binary(rng, size)
            mode = 0o755 if rng.random() < 0.6 else 0o644
        else:
            data = rng.randbytes(size)
            mode = 0o644
        self.bytes[kind] += len(data)
        name = self._name(kind)
        return name, data, mode

    def _name(self, kind: str) -> str:
        rng, words = self.rng, self.words
        while True:
            parts = [rng.choice(_TOPS)] + [rng.choice(words).decode() for _ in range(rng.randint(1, 3))]
            name = "/".join(parts) + rng.choice(_EXTENSIONS[kind])
            if name not in self.names:
                self.names.add(name)
                return name


def _elf_interpreter(data: bytes) -> Optional[bytes]:
    """The PT_INTERP path of an ELF executable (None: statically linked); ValueError if not ELF."""
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError("not an ELF file")
    end = "<" if data[5] == 1 else ">"
    if data[4] == 2:
        phoff, = struct.unpack_from(end + "Q", data, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 54)
    else:
        phoff, = struct.unpack_from(end + "I", data, 28)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 42)
    for i in range(phnum):
        at = phoff + i * phentsize
        p_type, = struct.unpack_from(end + "I", data, at)
        if p_type == 3:  # PT_INTERP
            if data[4] == 2:
                offset, = struct.unpack_from(end + "Q", data, at + 8)
                size, = struct.unpack_from(end + "Q", data, at + 32)
            else:
                offset, = struct.unpack_from(end + "I", data, at + 4)
                size, = struct.unpack_from(end + "I", data, at + 16)
            return data[offset:offset + size].rstrip(b"\0")
    return None


def static_busybox() -> bytes:
    """The bytes of Debian's busybox-static `/bin/busybox`; RuntimeError when absent or dynamic.

    Runnable test images need a real shell; a static busybox brings one without any of this
    machine's libraries, so the image is the same wherever the package is the same.
    """
    hint = "install Debian's busybox-static (apt-get install busybox-static; scripts/services.sh does)"
    try:
        with open(BUSYBOX, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise RuntimeError(f"a runnable test image needs {BUSYBOX} ({e.strerror}): {hint}") from None
    try:
        interp = _elf_interpreter(data)
    except (ValueError, struct.error):
        raise RuntimeError(f"{BUSYBOX} is not an ELF executable: {hint}") from None
    if interp is not None:
        raise RuntimeError(f"{BUSYBOX} is dynamically linked (it needs {interp.decode(errors='replace')}): "
                           f"{hint}")
    return data


class _HashingWriter:
    """tar stream -> sha256 (the diff_id) and size -> gzip stream."""

    def __init__(self, out):
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


class _LayerWriter:
    def __init__(self, compresslevel: int):
        self.buf = io.BytesIO()
        self.gz = gzip.GzipFile(filename="", mode="wb", fileobj=self.buf,
                                compresslevel=compresslevel, mtime=0)
        self.hw = _HashingWriter(self.gz)
        self.tar = tarfile.open(fileobj=self.hw, mode="w|", format=tarfile.PAX_FORMAT)
        self.dirs = set()
        self.names: List[str] = []

    @property
    def compressed_so_far(self) -> int:
        return self.buf.tell()

    def _dirs_for(self, name: str) -> None:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.dirs:
                self.dirs.add(d)
                ti = tarfile.TarInfo(d)
                ti.type = tarfile.DIRTYPE
                ti.mode = 0o755
                ti.mtime = MTIME
                ti.uname = ti.gname = "root"
                self.tar.addfile(ti)

    def add(self, name: str, data: bytes, mode: int = 0o644) -> None:
        name = name.lstrip("/")
        self._dirs_for(name)
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        ti.mode = mode
        ti.mtime = MTIME
        ti.uname = ti.gname = "root"
        self.tar.addfile(ti, io.BytesIO(data))
        self.names.append(name)

    def add_symlink(self, name: str, target: str) -> None:
        name = name.lstrip("/")
        self._dirs_for(name)
        ti = tarfile.TarInfo(name)
        ti.type = tarfile.SYMTYPE
        ti.linkname = target
        ti.mode = 0o777
        ti.mtime = MTIME
        ti.uname = ti.gname = "root"
        self.tar.addfile(ti)
        self.names.append(name)

    def finish(self) -> Layer:
        self.tar.close()
        self.gz.close()
        blob = self.buf.getvalue()
        return Layer(
            blob=blob,
            digest=sha256_digest(blob),
            size=len(blob),
            diff_id="sha256:" + self.hw.sha.hexdigest(),
            uncompressed_size=self.hw.size,
            files=tuple(self.names),
        )


# ---------------------------------------------------------------------------------------------


class ImageFactory:
    """Builds layers, images and indexes; the same seed gives the same bytes on every machine.

    The bytes depend on `seed`, on $IMGTOOL_TEST_SEED (read when the factory is made) and on the
    order of calls, nothing else.
    """

    def __init__(self, seed: Union[int, str] = 0, *, compresslevel: int = 1):
        self.seed = seed
        self.suite_seed = suite_seed()
        self.compresslevel = compresslevel
        self._counter = 0

    def _rng(self, what: str) -> random.Random:
        self._counter += 1
        return random.Random(f"{self.suite_seed}:{self.seed}:{what}:{self._counter}")

    # -- layers ---------------------------------------------------------------------------------

    def layer(self, size: int = DEFAULT_LAYER_SIZE, *,
              files: Optional[Dict[str, bytes]] = None) -> Layer:
        """A gzip layer of ~`size` compressed bytes of generated files (text, binaries, packed data).

        `files` (path -> bytes) are added first, verbatim: use them for layers whose content a
        test checks. Every layer also holds a small marker file naming the seed and its number,
        so no two layers of different factories or calls are identical.
        """
        rng = self._rng("layer")
        n = self._counter
        w = _LayerWriter(self.compresslevel)
        for name, data in (files or {}).items():
            w.add(name, data)
        w.add(f"etc/imgtool-test/layer-{n}", f"seed={self.seed} suite-seed={self.suite_seed} layer={n} "
              f"salt={rng.getrandbits(64):016x}\n".encode())
        contents = _Contents(rng, self.suite_seed)
        while w.compressed_so_far < size:
            # gzip holds back up to a few dozen KiB, so near the end files get small: the layer
            # ends close to `size` instead of a whole large file past it
            name, data, mode = contents.next_file(2 * (size - w.compressed_so_far))
            w.add(name, data, mode)
        return w.finish()

    def layers(self, count: int, size: Union[int, Sequence[int]] = DEFAULT_LAYER_SIZE
               ) -> List[Layer]:
        sizes = [size] * count if isinstance(size, int) else list(size)
        if len(sizes) != count:
            raise ValueError(f"{count} layers but {len(sizes)} sizes")
        return [self.layer(s) for s in sizes]

    def runnable_layer(self) -> Layer:
        """A layer with a static busybox as /bin/busybox and /bin/sh, df, cat, ls, ... linked to it.

        Host arch only (it is this machine's busybox-static). Raises RuntimeError without it.
        """
        w = _LayerWriter(self.compresslevel)
        w.add("bin/busybox", static_busybox(), 0o755)
        for applet in BUSYBOX_APPLETS:
            w.add_symlink(f"bin/{applet}", "busybox")
        self._counter += 1
        return w.finish()

    # -- images ---------------------------------------------------------------------------------

    def image(
        self,
        arch: str = "amd64",
        layers: Union[int, Sequence[Layer]] = 3,
        base: Union[Sequence[Layer], Image, None] = None,
        *,
        layer_size: Union[int, Sequence[int]] = DEFAULT_LAYER_SIZE,
        media: str = "docker",
        os: str = "linux",
        variant: Optional[str] = None,
        runnable: bool = False,
        config: Optional[dict] = None,
        labels: Optional[Dict[str, str]] = None,
        created: str = CREATED,
    ) -> Image:
        """An image of `base` layers, then `layers` (a count of new layers, or Layer objects).

        arch: "amd64", "arm64" (variant v8), ...; media: "docker" (v2 schema2) or "oci".
        runnable=True puts a static busybox layer (/bin/sh, df, ...) on top (arch must be the host's), so
        `docker run IMAGE df -k /dev/shm` works. `config` entries update the config's "config"
        object (Env, Cmd, Labels, ...). Raises ValueError on unknown arch/media.
        """
        if media not in MEDIA_TYPES:
            raise ValueError(f"media must be 'docker' or 'oci', not {media!r}")
        if arch not in ARCHES:
            raise ValueError(f"unknown arch {arch!r} (known: {', '.join(ARCHES)})")
        architecture, default_variant = ARCHES[arch]
        variant = variant if variant is not None else default_variant
        if isinstance(base, Image):
            base = base.layers
        stack = list(base or ())
        stack += self.layers(layers, layer_size) if isinstance(layers, int) else list(layers)
        if runnable:
            if architecture != host_arch():
                raise ValueError(f"a runnable image must be {host_arch()}, not {architecture}")
            stack.append(self.runnable_layer())
        if not stack:
            raise ValueError("an image needs at least one layer")

        inner = {
            "Env": [PATH_ENV],
            "Cmd": ["/bin/sh"],
            "WorkingDir": "/",
            "Labels": {"org.opencontainers.image.title": "imgtool-test",
                       "imgtool.test.seed": str(self.seed)},
        }
        inner.update(config or {})
        if labels:
            inner["Labels"] = {**inner.get("Labels", {}), **labels}
        cfg = {
            "architecture": architecture,
            "os": os,
            "created": created,
            "config": inner,
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in stack]},
            "history": [
                {"created": created, "created_by": f"/bin/sh -c #(nop) ADD file:{layer.diff_id[7:19]} in / "}
                for layer in stack
            ],
        }
        if variant:
            cfg["variant"] = variant
        config_bytes = _config_json(cfg)
        config_digest = sha256_digest(config_bytes)
        manifest_type, config_type, _, _ = MEDIA_TYPES[media]
        manifest = {
            "schemaVersion": 2,
            "mediaType": manifest_type,
            "config": {"mediaType": config_type, "size": len(config_bytes), "digest": config_digest},
            "layers": [layer.descriptor(media) for layer in stack],
        }
        manifest_bytes = _manifest_json(manifest)
        return Image(
            os=os,
            architecture=architecture,
            variant=variant,
            media=media,
            layers=tuple(stack),
            config_bytes=config_bytes,
            config_digest=config_digest,
            manifest_bytes=manifest_bytes,
            manifest_digest=sha256_digest(manifest_bytes),
        )

    def index(self, images: Iterable[Image], media: str = "oci") -> Index:
        """An OCI index (media="oci") or Docker manifest list (media="docker") over images."""
        if media not in MEDIA_TYPES:
            raise ValueError(f"media must be 'docker' or 'oci', not {media!r}")
        images = tuple(images)
        if not images:
            raise ValueError("an index needs at least one image")
        body = {
            "schemaVersion": 2,
            "mediaType": MEDIA_TYPES[media][3],
            "manifests": [image.descriptor() for image in images],
        }
        manifest_bytes = _manifest_json(body)
        return Index(media=media, images=images, manifest_bytes=manifest_bytes,
                     manifest_digest=sha256_digest(manifest_bytes))

    def multiarch(
        self,
        arches: Sequence[str] = ("amd64", "arm64"),
        layers: int = 3,
        base: Union[Sequence[Layer], Index, None] = None,
        *,
        media: str = "oci",
        image_media: Optional[str] = None,
        layer_size: Union[int, Sequence[int]] = DEFAULT_LAYER_SIZE,
        **image_kwargs,
    ) -> Index:
        """An index over one image per arch; each arch gets `layers` layers of its own.

        `base` layers (a list, or the per-arch layers of an older Index) sit below them: with a
        list every arch shares those blobs; with an Index each arch reuses its own older layers,
        like consecutive releases on one base image. `image_media` defaults to `media`.
        """
        images = []
        for arch in arches:
            if isinstance(base, Index):
                arch_base = base.image(arch).layers
            else:
                arch_base = list(base or ())
            images.append(self.image(arch, layers, arch_base, layer_size=layer_size,
                                     media=image_media or media, **image_kwargs))
        return self.index(images, media=media)

    @staticmethod
    def attested(images: Sequence[Image]) -> AttestedIndex:
        """An OCI index over `images` followed by one attestation manifest per image, as `docker buildx build
        --provenance` publishes it (vnd.docker.reference.type: attestation-manifest, platform unknown/unknown)."""
        config = b"{}"
        entries = [image.descriptor() for image in images]
        attestations, blobs = [], [config]
        for image in images:
            statement = json.dumps({"_type": "https://in-toto.io/Statement/v0.1", "subject": [
                {"digest": {"sha256": image.manifest_digest[7:]}}]}).encode()
            blobs.append(statement)
            body = _manifest_json({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                   "config": {"mediaType": OCI_CONFIG, "size": len(config),
                                              "digest": sha256_digest(config)},
                                   "layers": [{"mediaType": "application/vnd.in-toto+json", "size": len(statement),
                                               "digest": sha256_digest(statement)}]})
            attestations.append((sha256_digest(body), body))
            entries.append({"mediaType": OCI_MANIFEST, "size": len(body), "digest": sha256_digest(body),
                            "platform": {"architecture": "unknown", "os": "unknown"},
                            "annotations": {"vnd.docker.reference.digest": image.manifest_digest,
                                            "vnd.docker.reference.type": "attestation-manifest"}})
        body = _manifest_json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
        return AttestedIndex(media="oci", images=tuple(images), manifest_bytes=body,
                             manifest_digest=sha256_digest(body), attestations=tuple(attestations),
                             attestation_blobs=tuple(blobs))

    @staticmethod
    def zstd_twin(image: Image) -> Image:
        """`image` as a builder that switched to zstd publishes it: the same config (so the same image
        ID) and files, every layer zstd-compressed, in an OCI manifest (Docker v2 has no zstd type)."""
        layers = tuple(layer.zstd() for layer in image.layers)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "size": len(image.config_bytes), "digest": image.config_digest},
            "layers": [layer.descriptor("oci") for layer in layers],
        }
        manifest_bytes = _manifest_json(manifest)
        return Image(os=image.os, architecture=image.architecture, variant=image.variant, media="oci",
                     layers=layers, config_bytes=image.config_bytes, config_digest=image.config_digest,
                     manifest_bytes=manifest_bytes, manifest_digest=sha256_digest(manifest_bytes))


    @staticmethod
    def wrong_diff_id(image: Image, index: int) -> Image:
        """`image` with a config whose diff_id of layer `index` is not that layer's (a broken build, or a
        layer swapped in the registry): every blob still matches its digest. `diff_ids` keeps the true
        ones; the config (hence the image ID) and the manifest are new."""
        cfg = image.config
        cfg["rootfs"]["diff_ids"][index] = sha256_digest(b"not this layer's tar")
        config_bytes = _config_json(cfg)
        config_digest = sha256_digest(config_bytes)
        manifest = image.manifest
        manifest["config"] = {**manifest["config"], "size": len(config_bytes), "digest": config_digest}
        manifest_bytes = _manifest_json(manifest)
        return Image(os=image.os, architecture=image.architecture, variant=image.variant, media=image.media,
                     layers=image.layers, config_bytes=config_bytes, config_digest=config_digest,
                     manifest_bytes=manifest_bytes, manifest_digest=sha256_digest(manifest_bytes))

# ---------------------------------------------------------------------------------------------


def write_docker_archive(
    image: Image,
    path: Union[str, os.PathLike],
    repo_tag: Union[str, Sequence[str], None] = None,
    *,
    omit_layers: Iterable[str] = (),
    uncompressed: bool = False,
) -> str:
    """Write a classic `docker save`-style archive that `docker load` accepts; returns the path.

    Layout: `<config hex>.json`, `<diff_id hex>/layer.tar` (the gzip blob as is, which docker
    decompresses; plain tar with uncompressed=True), `manifest.json` with Config, RepoTags and
    Layers. `omit_layers` (digests or diff_ids) are listed in manifest.json but not written:
    the shape of a delta archive for a daemon that already holds those layers.
    """
    path = os.fspath(path)
    tags = [repo_tag] if isinstance(repo_tag, str) else list(repo_tag or [])
    omit = set(omit_layers)
    config_name = image.config_digest[len("sha256:"):] + ".json"
    layer_names = [layer.diff_id[len("sha256:"):] + "/layer.tar" for layer in image.layers]
    manifest = [{"Config": config_name, "RepoTags": tags or None, "Layers": layer_names}]

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        ti.mtime = MTIME
        ti.mode = 0o644
        tar.addfile(ti, io.BytesIO(data))

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        add(tar, config_name, image.config_bytes)
        for layer, name in zip(image.layers, layer_names):
            if layer.digest in omit or layer.diff_id in omit:
                continue
            ti = tarfile.TarInfo(name.split("/")[0])
            ti.type = tarfile.DIRTYPE
            ti.mode = 0o755
            ti.mtime = MTIME
            tar.addfile(ti)
            add(tar, name, layer.tar_bytes() if uncompressed else layer.blob)
        add(tar, "manifest.json", json.dumps(manifest).encode())
    return path


if __name__ == "__main__":  # quick look: python -m tests.support.images [seed]
    import time

    t = time.time()
    f = ImageFactory(sys.argv[1] if len(sys.argv) > 1 else 0)
    idx = f.multiarch()
    for im in idx.images:
        print(im.platform, im.manifest_digest, [(layer.size, layer.uncompressed_size)
                                                for layer in im.layers])
    print(f"{time.time() - t:.2f}s")
