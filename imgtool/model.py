"""The pure model of images: digests, platforms, references, descriptors, manifests.

No I/O here (stdlib only, no network, no files): every other module produces or
consumes these values.
"""

import hashlib
import json
import platform as _platform
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import ManifestError, UsageError

# --- media types -----------------------------------------------------------

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_FOREIGN_LAYER = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
DOCKER_SCHEMA1 = "application/vnd.docker.distribution.manifest.v1+json"
DOCKER_SCHEMA1_SIGNED = "application/vnd.docker.distribution.manifest.v1+prettyjws"

INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
# What we ask registries for: without the index types quay falls back to amd64-only schema.
ACCEPT_MANIFESTS = ", ".join(INDEX_TYPES + MANIFEST_TYPES)

LAYER_COMPRESSION = {
    OCI_LAYER: "none",
    DOCKER_LAYER: "none",
    OCI_LAYER_GZIP: "gzip",
    DOCKER_LAYER_GZIP: "gzip",
    DOCKER_FOREIGN_LAYER: "gzip",
    OCI_LAYER_ZSTD: "zstd",
}

# Sizes planned before the bytes exist (the space checks of fetch, load and doctor): a layer's
# unpacked size per compressed byte, where no record says it (vllm-ascend: ~15 GB of ~6.5 GB), and a
# zstd layer's size once rewritten as gzip level 1 (zlib or ISA-L: ~1.1-1.2x what zstd level 3 wrote).
UNPACKED_PER_COMPRESSED = 2.5
GZIP_PER_ZSTD = 1.1

# JSON documents are read into memory, so their size is capped.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_CONFIG_BYTES = 32 * 1024 * 1024


# --- digests ---------------------------------------------------------------

# Every grammar below is matched whole (`\Z`, or fullmatch): `$` also matches before a final newline, so
# "sha256:...\n" or "base:v1\n" would pass.
_DIGEST_RE = re.compile(r"(sha256):([a-f0-9]{64})\Z|(sha512):([a-f0-9]{128})\Z")


@dataclass(frozen=True, order=True)
class Digest:
    """A content digest `algorithm:hex`; validated, so safe to use in file names."""

    algorithm: str
    hex: str

    @classmethod
    def parse(cls, text: str) -> "Digest":
        """Parse `sha256:<64 hex>`; raises UsageError."""
        m = _DIGEST_RE.match(text or "")
        if not m:
            raise UsageError(f"invalid digest {text!r}: expected sha256:<64 lowercase hex digits>")
        algo, hexpart = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        return cls(algo, hexpart)

    @classmethod
    def of(cls, data: bytes) -> "Digest":
        """The sha256 digest of `data`."""
        return cls("sha256", hashlib.sha256(data).hexdigest())

    def hasher(self):
        """A fresh hashlib object of this digest's algorithm."""
        return hashlib.new(self.algorithm)

    @property
    def short(self) -> str:
        return self.hex[:12]

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"


# --- platforms -------------------------------------------------------------

_ARCH_ALIASES = {
    "x86_64": "amd64",
    "x86-64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv8": "arm64",
    "armv7l": "arm",
    "armhf": "arm",
    "arm": "arm",
    "i386": "386",
    "i686": "386",
    "386": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "loong64": "loong64",
    "loongarch64": "loong64",
    "mips64le": "mips64le",
}
_ARCH_VARIANT_FROM_ALIAS = {"armv7l": "v7", "armhf": "v7"}
_DEFAULT_VARIANT = {"arm64": "v8"}
_PLATFORM_PART = re.compile(r"[a-z0-9_.-]{1,64}\Z")  # OCI: os, architecture, variant are short tokens


@dataclass(frozen=True)
class Platform:
    """An OS/architecture[/variant] triple, normalised (aarch64 -> arm64, x86_64 -> amd64)."""

    os: str
    architecture: str
    variant: Optional[str] = None

    @classmethod
    def parse(cls, text: str) -> "Platform":
        """Parse `os/arch[/variant]` or a bare arch (`arm64`, `aarch64`); raises UsageError."""
        raw = (text or "").strip().lower()
        parts = raw.split("/")
        if len(parts) == 1:
            os_name, arch, variant = "linux", parts[0], None
        elif len(parts) in (2, 3):
            os_name, arch = parts[0], parts[1]
            variant = parts[2] if len(parts) == 3 else None
        else:
            raise UsageError(f"invalid platform {text!r}: expected os/arch[/variant], e.g. linux/arm64")
        if not all(p and _PLATFORM_PART.match(p) for p in parts):
            raise UsageError(f"invalid platform {text!r}: expected os/arch[/variant], e.g. linux/arm64")
        if arch not in _ARCH_ALIASES:
            known = ", ".join(sorted({"amd64", "arm64", "arm", "386", "ppc64le", "s390x", "riscv64"}))
            raise UsageError(f"unknown architecture {arch!r} in {text!r}", hint=f"known: {known} (aliases x86_64, aarch64)")
        variant = variant or _ARCH_VARIANT_FROM_ALIAS.get(arch)
        return cls(os_name, _ARCH_ALIASES[arch], variant)

    @classmethod
    def from_json(cls, obj: dict, where: str = "platform") -> "Platform":
        """Build from an index entry's `platform` or an image config; tolerant of a missing os. Each field
        given must be OCI's short lowercase token (`[a-z0-9._-]`): these strings come from registries and
        reach messages and load.sh. Raises ManifestError naming `where`."""
        values = {}
        for key in ("os", "architecture", "variant"):
            value = obj.get(key)
            if value is None or value == "":
                continue
            if not isinstance(value, str) or not _PLATFORM_PART.match(value):
                raise ManifestError(f"malformed {where}: `{key}` is not a platform token: {value!r}",
                                    hint="expected a short lowercase word such as linux, arm64, v8 ([a-z0-9._-])")
            values[key] = value
        arch = values.get("architecture", "")
        return cls(values.get("os", "linux"), _ARCH_ALIASES.get(arch, arch), values.get("variant"))

    @classmethod
    def host(cls) -> "Platform":
        """The platform of the machine imgtool runs on (always linux: images are linux)."""
        machine = _platform.machine().lower()
        arch = _ARCH_ALIASES.get(machine, machine)
        return cls("linux", arch, _ARCH_VARIANT_FROM_ALIAS.get(machine))

    def normalized_variant(self) -> Optional[str]:
        return self.variant or _DEFAULT_VARIANT.get(self.architecture)

    def satisfies(self, wanted: "Platform") -> bool:
        """True when an image of this platform can serve a request for `wanted`."""
        if self.os != wanted.os or self.architecture != wanted.architecture:
            return False
        if wanted.variant is None:
            return True
        return self.normalized_variant() == wanted.normalized_variant()

    def agrees(self, other: "Platform") -> bool:
        """True when two statements about one image fit (an index entry and its config): the same os and
        architecture, and the same variant where both name one (arm64 and arm64/v8 agree)."""
        if self.os != other.os or self.architecture != other.architecture:
            return False
        return not (self.variant and other.variant) or self.normalized_variant() == other.normalized_variant()

    def to_json(self) -> dict:
        out = {"os": self.os, "architecture": self.architecture}
        if self.variant:
            out["variant"] = self.variant
        return out

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


# --- references ------------------------------------------------------------

# The grammar of image names (distribution's reference grammar), written once: ImageRef parses
# with it, and load's --tag NAME is checked against it (is_docker_name).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"(?:localhost|{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?"
_PATH_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*\Z")
_TAG_RE = re.compile(rf"{_TAG}\Z")
_HOST_RE = re.compile(rf"{_HOST}\Z")
_DOCKER_NAME_RE = re.compile(rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?\Z")


def json_object(data: bytes, limit: int, bad: Callable[[str], Exception]) -> dict:
    """The JSON object `data` holds; otherwise raises bad(why): over `limit` bytes, not JSON (nesting
    too deep for the parser included: never a RecursionError), or not an object."""
    if len(data) > limit:
        raise bad(f"it is {len(data)} bytes, over the {limit} byte limit")
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"not valid JSON ({e})") from e
    except RecursionError:
        raise bad("not valid JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise bad("not a JSON object")
    return obj


def is_platform(text: object) -> bool:
    """Whether `text` is `os/architecture[/variant]` of OCI tokens (known architectures or not), as inventories
    and messages write a platform."""
    parts = text.split("/") if isinstance(text, str) else []
    return 2 <= len(parts) <= 3 and all(_PLATFORM_PART.match(p) for p in parts)


def is_tag(text: object) -> bool:
    """Whether `text` is a tag in the distribution spec's grammar: up to 128 of [A-Za-z0-9_.-], not led by . or -."""
    return isinstance(text, str) and _TAG_RE.match(text) is not None


def is_docker_name(name: str) -> bool:
    """Whether `name` is a name `docker tag` takes: [HOST[:PORT]/]PATH[:TAG] (no digest)."""
    return isinstance(name, str) and _DOCKER_NAME_RE.match(name) is not None


def familiar(name: str) -> str:
    """Docker's short form of a name, as `docker images` shows it: docker.io/library/x:1 -> x:1."""
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/", "index.docker.io/"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def foreign_arch_warning(ref: str, platform: str, host_arch: str, host: str = "Docker") -> Optional[str]:
    """The warning load, doctor and run-flags give for an image of another architecture than the
    `host` runtime's (Docker, Podman; `host_arch` normalised, e.g. amd64), or None when it fits."""
    if Platform.parse(platform).architecture == host_arch:
        return None
    return (f"{ref} is for {platform} but this {host} host is linux/{host_arch}: its containers will not start "
            f"(exec format error); fetch it with --arch {host_arch}")


def _looks_like_host(component: str) -> bool:
    return "." in component or ":" in component or component == "localhost" or component.startswith("[")


@dataclass(frozen=True)
class ImageRef:
    """A fully-qualified image reference: registry, repository, and a tag and/or digest."""

    registry: str
    repository: str
    tag: Optional[str] = None
    digest: Optional[Digest] = None

    @classmethod
    def parse(cls, text: str, default_image: str = "quay.io/ascend/vllm-ascend") -> "ImageRef":
        """Parse a user reference; a bare tag means `default_image:TAG`. Raises UsageError.

        Forms: `TAG`, `NAME:TAG` (NAME in the default image's namespace), `path/name:TAG`
        (on the default image's registry), `host[:port]/path:TAG`, and any of these with
        `@sha256:<hex>`.
        """
        ref = _RefText(text)
        name, digest = ref.split_digest()
        default = _split_name(default_image)
        # A bare word is a tag of the default image (`v0.22.1rc1`, `main`).
        if "/" not in name and ":" not in name and digest is None:
            return cls(default[0], default[1], ref.check(_TAG_RE, name), None)
        name, tag = ref.split_tag(name)
        registry, path = ref.place(name, default)
        if tag is None and digest is None:
            tag = "latest"
        return cls(registry, path, tag, digest)

    @property
    def name(self) -> str:
        """`registry/repository` without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What to ask the registry for: the digest when pinned, else the tag."""
        return str(self.digest) if self.digest else str(self.tag)

    def with_digest(self, digest: Optional[Digest]) -> "ImageRef":
        return ImageRef(self.registry, self.repository, self.tag, digest)

    @property
    def tagged(self) -> str:
        """`registry/repository:tag` (the name Docker shows), or the digest form if untagged."""
        return f"{self.name}:{self.tag}" if self.tag else f"{self.name}@{self.digest}"

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


class _RefText:
    """A reference as the user wrote it, taken apart step by step by ImageRef.parse; every step raises
    UsageError naming the whole reference."""

    HINT = "use a tag (v0.22.1rc1), NAME:TAG, host/path:tag or host/path@sha256:<hex>"

    def __init__(self, original: str) -> None:
        self.original = original
        self.text = (original or "").strip()
        if not self.text or any(c.isspace() for c in self.text):
            raise self.bad()

    def bad(self) -> UsageError:
        return UsageError(f"invalid image reference {self.original!r}", hint=self.HINT)

    def check(self, pattern: "re.Pattern[str]", text: str) -> str:
        if not pattern.match(text):
            raise self.bad()
        return text

    def split_digest(self) -> Tuple[str, Optional["Digest"]]:
        """(NAME[:TAG], the digest after @ or None)."""
        if "@" not in self.text:
            return self.text, None
        name, _, text = self.text.partition("@")
        try:
            digest = Digest.parse(text)
        except UsageError:
            raise UsageError(f"invalid digest in image reference {self.original!r}",
                             hint="expected @sha256:<64 hex digits>") from None
        if not name:
            raise self.bad()
        return name, digest

    def split_tag(self, text: str) -> Tuple[str, Optional[str]]:
        """(NAME, the tag after the last component's colon or None)."""
        if ":" not in text.rsplit("/", 1)[-1]:
            return text, None
        name, _, tag = text.rpartition(":")
        if not _TAG_RE.match(tag):
            raise UsageError(f"invalid tag {tag!r} in image reference {self.original!r}",
                             hint="a tag is up to 128 of [A-Za-z0-9_.-]")
        return name, tag

    def place(self, name: str, default: Tuple[str, str]) -> Tuple[str, str]:
        """(registry, path): `host/path`, `path/name` on the default registry, or NAME in its namespace."""
        first, sep, rest = name.partition("/")
        if sep and _looks_like_host(first):
            registry, path = self.check(_HOST_RE, first), rest
        elif sep:
            registry, path = default[0], name
        else:
            ns = default[1].rsplit("/", 1)[0] if "/" in default[1] else ""
            registry, path = default[0], f"{ns}/{name}" if ns else name
        if len(path) > 255:
            raise self.bad()
        return registry, self.check(_PATH_RE, path)


def _split_name(image: str) -> Tuple[str, str]:
    """Split a default image name `host/path` into (host, path); raises UsageError."""
    first, sep, rest = (image or "").partition("/")
    if not sep or not _looks_like_host(first) or not _PATH_RE.match(rest):
        raise UsageError(f"invalid default_image {image!r}: expected host/path, e.g. quay.io/ascend/vllm-ascend")
    return first, rest


# --- descriptors, manifests, indexes, configs ------------------------------


@dataclass(frozen=True)
class Descriptor:
    """A pointer to a blob: media type, digest, size, and optional platform/annotations."""

    media_type: str
    digest: Digest
    size: int
    platform: Optional[Platform] = None
    annotations: Dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_json(cls, obj: object, where: str = "descriptor") -> "Descriptor":
        """Validate and build from a JSON object; raises ManifestError."""
        if not isinstance(obj, dict):
            raise ManifestError(f"malformed {where}: not an object")
        try:
            digest = Digest.parse(str(obj.get("digest", "")))
        except UsageError:
            raise ManifestError(f"malformed {where}: bad digest {obj.get('digest')!r}") from None
        size = obj.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"malformed {where}: bad size {size!r}")
        plat = obj.get("platform")
        annotations = obj.get("annotations") or {}
        if not isinstance(annotations, dict):
            raise ManifestError(f"malformed {where}: bad annotations")
        return cls(
            media_type=str(obj.get("mediaType") or ""),
            digest=digest,
            size=size,
            platform=Platform.from_json(plat, f"{where}'s platform") if isinstance(plat, dict) else None,
            annotations={str(k): str(v) for k, v in annotations.items()},
        )

    def to_json(self) -> dict:
        out = {"mediaType": self.media_type, "digest": str(self.digest), "size": self.size}
        if self.platform:
            out["platform"] = self.platform.to_json()
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


@dataclass(frozen=True)
class Manifest:
    """An image manifest (OCI or Docker v2 schema 2): a config and ordered layers."""

    media_type: str
    config: Descriptor
    layers: Tuple[Descriptor, ...]

    @property
    def size(self) -> int:
        """Compressed size of config plus layers."""
        return self.config.size + sum(layer.size for layer in self.layers)


@dataclass(frozen=True)
class Index:
    """A multi-platform index (OCI image index or Docker manifest list)."""

    media_type: str
    manifests: Tuple[Descriptor, ...]

    def platforms(self) -> List[Platform]:
        return [d.platform for d in self.manifests if d.platform and not is_attestation(d)]

    def select(self, wanted: Platform) -> Descriptor:
        """The entry for `wanted`; raises UsageError listing what the index offers."""
        for d in self.manifests:
            if d.platform and not is_attestation(d) and d.platform.satisfies(wanted):
                return d
        offered = ", ".join(str(p) for p in self.platforms()) or "none"
        raise UsageError(f"platform {wanted} not found in the image index; it offers: {offered}")


def is_attestation(d: Descriptor) -> bool:
    """Whether an index entry is an attestation manifest (provenance, SBOM) rather than a platform's image."""
    # buildkit stores provenance as index entries with platform unknown/unknown
    return d.annotations.get("vnd.docker.reference.type") == "attestation-manifest" or (
        d.platform is not None and d.platform.architecture == "unknown"
    )


def parse_manifest(data: bytes, content_type: Optional[str] = None) -> Union[Manifest, Index]:
    """Parse manifest or index bytes into the model; raises ManifestError."""
    obj = json_object(data, MAX_MANIFEST_BYTES, lambda why: ManifestError(f"malformed manifest: {why}"))
    ctype = (content_type or "").split(";")[0].strip()
    media = obj.get("mediaType") or ctype
    if obj.get("schemaVersion") == 1 or media in (DOCKER_SCHEMA1, DOCKER_SCHEMA1_SIGNED):
        raise ManifestError(
            "the registry returned a Docker schema 1 manifest, which imgtool does not support",
            hint="schema 1 is deprecated; ask for the image by a schema 2 / OCI tag or digest",
        )
    if not media:
        # OCI allows omitting mediaType; infer from the shape.
        media = OCI_INDEX if "manifests" in obj else OCI_MANIFEST if "config" in obj else ""
    if media in INDEX_TYPES:
        entries = obj.get("manifests")
        if not isinstance(entries, list):
            raise ManifestError("malformed index: `manifests` is not a list")
        return Index(media, tuple(Descriptor.from_json(e, "index entry") for e in entries))
    if media in MANIFEST_TYPES:
        config, parsed = _config_and_layers(obj)
        kind = obj.get("artifactType")
        for layer in parsed:
            if layer.media_type not in LAYER_COMPRESSION:
                if isinstance(kind, str) and kind:  # an artifact is read by parse_artifact, never as an image
                    raise ManifestError(f"the manifest is an OCI artifact ({_printable(kind)}), not an image: "
                                        f"its layer {layer.digest.short} is {_printable(layer.media_type)}")
                raise ManifestError(f"unsupported layer media type {layer.media_type!r} ({layer.digest})")
        return Manifest(media, config, parsed)
    raise ManifestError(f"unsupported manifest media type {media!r}")


def _config_and_layers(obj: dict) -> Tuple[Descriptor, Tuple[Descriptor, ...]]:
    layers = obj.get("layers")
    if not isinstance(layers, list):
        raise ManifestError("malformed manifest: `layers` is not a list")
    config = Descriptor.from_json(obj.get("config"), "config descriptor")
    return config, tuple(Descriptor.from_json(x, f"layer {i}") for i, x in enumerate(layers))


def _printable(text: str) -> str:
    return "".join(c if " " <= c < "\x7f" else "?" for c in text)[:200]


@dataclass(frozen=True)
class Artifact:
    """An OCI artifact: an OCI image manifest whose `artifactType` says what it carries (a CNCF ModelPack model),
    its layers of that kind's media types, not an image's. Read by parse_artifact; parse_manifest refuses one."""

    artifact_type: str
    config: Descriptor
    layers: Tuple[Descriptor, ...]
    annotations: Dict[str, str]

    @property
    def size(self) -> int:
        return self.config.size + sum(layer.size for layer in self.layers)


def parse_artifact(data: bytes, artifact_type: str, layer_types: Sequence[str],
                   content_type: Optional[str] = None) -> Artifact:
    """An OCI manifest of `artifact_type` whose layers are all of `layer_types`; raises ManifestError naming what
    differs (another media type or artifactType, a layer of another type)."""
    obj = json_object(data, MAX_MANIFEST_BYTES, lambda why: ManifestError(f"malformed manifest: {why}"))
    media = obj.get("mediaType") or (content_type or "").split(";")[0].strip()
    if media != OCI_MANIFEST:
        raise ManifestError(f"not an OCI artifact: the manifest's media type is {_printable(str(media))!r}")
    kind = obj.get("artifactType")
    if kind != artifact_type:
        raise ManifestError(f"not a {artifact_type} artifact: its artifactType is {_printable(str(kind))!r}")
    config, layers = _config_and_layers(obj)
    for layer in layers:
        if layer.media_type not in layer_types:
            raise ManifestError(f"unsupported layer media type {_printable(layer.media_type)!r} in a "
                                f"{artifact_type} artifact ({layer.digest})")
    notes = obj.get("annotations") or {}
    if not isinstance(notes, dict):
        raise ManifestError("malformed manifest: `annotations` is not an object")
    return Artifact(artifact_type, config, layers, {str(k): str(v) for k, v in notes.items()})


@dataclass(frozen=True)
class ImageConfig:
    """What imgtool needs from an image config: platform and the layers' diff_ids."""

    platform: Platform
    diff_ids: Tuple[Digest, ...]

    @classmethod
    def parse(cls, data: bytes) -> "ImageConfig":
        """Parse config JSON; raises ManifestError."""
        obj = json_object(data, MAX_CONFIG_BYTES, lambda why: ManifestError(f"malformed image config: {why}"))
        try:
            rootfs = obj.get("rootfs") or {}
            diff_ids = tuple(Digest.parse(d) for d in rootfs.get("diff_ids") or [])
        except (ValueError, UnicodeDecodeError, AttributeError, UsageError) as e:
            raise ManifestError(f"malformed image config: {e}") from e
        return cls(Platform.from_json(obj, "image config"), diff_ids)


# --- times -----------------------------------------------------------------

UTC_TIME = "%Y-%m-%dT%H:%M:%SZ"  # how bundle.json (`created`) and inventories write times: RFC 3339, UTC


def utc_time(seconds: float) -> str:
    """Seconds since the epoch as those files write a time: 2025-06-01T08:00:00Z."""
    return time.strftime(UTC_TIME, time.gmtime(seconds))


# --- sizes -----------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
MAX_SIZE = 1 << 60  # 1 EiB: far beyond any image, far below float and int64 limits


# Parts that fit their carrier. FAT32 holds files up to 4 GiB - 1 byte. A disc's size is its
# recordable 2048-byte sectors (the smaller of the + and - formats, as growisofs reports them),
# less 8 MiB (4096 sectors) left for the file system (UDF; ISO 9660 level 3 for files over 4 GiB)
# and the bundle's small files (imgtool.pyz ~1 MB, bundle.json, SHA256SUMS, README.txt, load.sh).
SECTOR = 2048
DISC_RESERVE = 4096  # sectors
FAT32_MAX = 4 * 1024 ** 3 - 1
CARRIERS = {  # name -> the largest part it takes, in bytes
    "fat32": FAT32_MAX,
    "dvd": (2295104 - DISC_RESERVE) * SECTOR,  # single-layer DVD±R, 4.7 GB
    "dvd-dl": (4171712 - DISC_RESERVE) * SECTOR,  # dual-layer DVD±R, 8.5 GB
    "bd25": (12219392 - DISC_RESERVE) * SECTOR,  # BD-R, 25 GB
    "bd50": (24438784 - DISC_RESERVE) * SECTOR,  # dual-layer BD-R, 50 GB
}


def is_size(text: str) -> bool:
    """Whether `text` is spelled as a size (a number with an optional unit), whatever its value."""
    return _SIZE_RE.match(str(text)) is not None


def parse_size(text: str, what: str = "size") -> int:
    """Parse `4G`, `700M`, `4GiB`, `1.5g`, `1048576` (binary units) into bytes; raises UsageError."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"invalid {what} {text!r}: use a number with an optional unit K, M, G, T (binary), e.g. 4G or 700M")
    number, unit = float(m.group(1)), m.group(2).lower()
    if number * _UNITS[unit] >= MAX_SIZE:  # also float("9" * 400) == inf, which int() cannot take
        raise UsageError(f"invalid {what} {text!r}: too large (at most {format_size(MAX_SIZE - 1)})")
    value = int(number * _UNITS[unit])
    if value <= 0:
        raise UsageError(f"invalid {what} {text!r}: must be greater than zero")
    return value


def format_size(n: int) -> str:
    """Human-readable binary size: 1.5 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


# --- a resolved image, ready to be written into a bundle -------------------


@dataclass(frozen=True)
class PulledImage:
    """One platform image whose blobs are all in the store: what a bundle is written from."""

    ref: ImageRef  # canonical upstream name (tag, and digest of what the tag meant)
    source: str  # the mirror that answered for the manifest, e.g. "daocloud (https://m.daocloud.io)"
    platform: Platform
    index_digest: Optional[Digest]  # the multi-arch index the tag pointed at, if any
    manifest_digest: Digest
    manifest_bytes: bytes = field(repr=False)
    manifest: Manifest = field(repr=False)
    config_bytes: bytes = field(repr=False)
    config: ImageConfig = field(repr=False)
    # Set when fetch rewrote layers (transcode.py): the registry's manifest digest and what changed,
    # as bundle.json's `upstream` records it; and each layer's unpacked size where it was learnt.
    upstream: Optional[dict] = field(default=None, repr=False, compare=False)
    unpacked_sizes: Tuple[Optional[int], ...] = field(default=(), repr=False, compare=False)
    # upstream's index (the bytes `index_digest` names, digest-checked) and its media type: bundle.json keeps them
    # so that `serve` answers a pull pinned by that digest
    index_bytes: Optional[bytes] = field(default=None, repr=False, compare=False)
    index_media_type: str = field(default="", repr=False, compare=False)

    @property
    def image_id(self) -> Digest:
        """What `docker images` shows as IMAGE ID: the config digest."""
        return self.manifest.config.digest
