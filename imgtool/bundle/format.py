"""bundle.json: the index of a bundle directory (format `imgtool-bundle`, version 1).

Pure values and JSON (de)serialisation with validation; no file I/O. Everything a reader
trusts about the archive (its members, sizes, digests, the parts) is derived from this
document, so it is validated strictly: names cannot escape the directory, digests are
well-formed, sizes are non-negative integers. See docs/bundle-format.md.
"""

import base64
import binascii
import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Callable, Collection, List, Mapping, NoReturn, Optional, Sequence, Tuple

from ..delta import DeltaPlan, chain_ids
from ..errors import ImgtoolError, ManifestError, UsageError, VerifyError
from ..model import (INDEX_TYPES, LAYER_COMPRESSION, MANIFEST_TYPES, Descriptor, Digest, ImageRef, Index, Platform,
                     PulledImage, is_docker_name, json_object, parse_manifest)
from .. import modelcar
from ..schema import Invalid, Key, Table
from ..text import is_printable
from ..trust import SIGNATURE as SIGNATURE
from ..weights import (MODEL_LAYER_TYPES, ModelFile, ModelRef, ModelSnapshot, check_path, is_commit, layer_media_type, source_url,
                       modelpack, parse_model_ref)

FORMAT_NAME = "imgtool-bundle"
FORMAT_VERSION = 4  # the newest this imgtool reads; 2 = delta bundles (layers left out)
# 3 = a tag held for several architectures is unnamed in index.json too (as in manifest.json), so a
# plain docker load names none of its platforms on any image store; written only by such bundles
UNNAMED_MULTIARCH_VERSION = 3
# 4 = the bundle carries models (bundle.json `models`, their files after the images' members): an older imgtool
# would take the model members for strays, so it refuses the version instead, saying to upgrade
MODELS_VERSION = 4
FULL_VERSION = 1  # what a bundle without omitted layers is written as, so older imgtools read it

BUNDLE_JSON = "bundle.json"
SHA256SUMS = "SHA256SUMS"
# SIGNATURE (bundle.json.sig, trust.py's: the policy's file): in neither file list
LOAD_SH = "load.sh"
README_TXT = "README.txt"
TOOL_PYZ = "imgtool.pyz"  # imgtool and its pure-Python dependencies (selfbundle.py); optional
LOCK_NAME = ".imgtool-lock"  # flock'd while fetch/export write the directory and serve serves it (dirlock.py)
COMPRESSIONS = ("none", "gzip", "zstd")
ARCHIVE_SUFFIX = {"none": ".tar", "gzip": ".tar.gz", "zstd": ".tar.zst"}

# bundle.json is read into memory: cap it (a real one is a few KiB per image).
MAX_BUNDLE_JSON = 16 * 1024 * 1024
# upstream's index is kept in bundle.json up to this size (real ones: 1-3 KiB); fetch keeps none bigger
MAX_KEPT_INDEX = 1024 * 1024

# File names a bundle may use for its parts and files: plain names inside the directory.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
RESERVED_NAMES = (BUNDLE_JSON, SHA256SUMS, SIGNATURE)


def safe_name(name: str) -> bool:
    """True for a plain file name (no path separators, no leading dot, no `..`)."""
    return isinstance(name, str) and bool(_SAFE_NAME.match(name)) and ".." not in name


@dataclass(frozen=True)
class Layer:
    """One layer of an image as bundle.json lists it."""

    digest: Digest
    size: int
    diff_id: Digest
    media_type: str
    # A delta bundle leaves the layer's file out: the offline Docker must already hold `chain_id`
    # (this layer on top of every layer below it), which `provided_by` images carried.
    omitted: bool = False
    chain_id: Optional[Digest] = None
    provided_by: Tuple[str, ...] = ()
    unpacked_size: Optional[int] = None  # the layer's tar in bytes, where fetch learnt it (rewritten layers)

    def to_json(self) -> dict:
        out = {"digest": str(self.digest), "size": self.size, "diff_id": str(self.diff_id),
               "media_type": self.media_type}
        if self.unpacked_size is not None:
            out["unpacked_size"] = self.unpacked_size
        if self.omitted:
            out.update({"omitted": True, "chain_id": str(self.chain_id), "provided_by": list(self.provided_by)})
        return out


@dataclass(frozen=True)
class BundleImage:
    """One platform image in the bundle: its canonical name, where it came from, its blobs."""

    ref: str  # canonical upstream name: quay.io/ascend/vllm-ascend:v0.22.1rc1 (or name@digest)
    source: str
    platform: Platform
    index_digest: Optional[Digest]
    manifest_digest: Digest
    manifest_media_type: str
    manifest_size: int
    image_id: Digest  # the config digest: what `docker images` shows as IMAGE ID
    config_size: int
    layers: Tuple[Layer, ...]
    # fetch rewrote layers (--layers compat|plain): {"manifest_digest": the registry's, "manifest_size",
    # "layers": the mode, "changed": [{"index", "digest", "size", "media_type"} of each upstream layer]}
    upstream: Optional[dict] = None

    @property
    def image_ref(self) -> ImageRef:
        return ImageRef.parse(self.ref)

    @property
    def repo_tag(self) -> Optional[str]:
        """The name Docker tags the image with, or None for a digest-only reference."""
        ref = self.image_ref
        return f"{ref.name}:{ref.tag}" if ref.tag else None

    @property
    def size(self) -> int:
        """Compressed size: manifest, config and layers."""
        return self.manifest_size + self.config_size + sum(layer.size for layer in self.layers)

    @property
    def omitted(self) -> Tuple[Layer, ...]:
        return tuple(layer for layer in self.layers if layer.omitted)

    def to_json(self) -> dict:
        return {
            "ref": self.ref,
            "source": self.source,
            "platform": str(self.platform),
            "index_digest": str(self.index_digest) if self.index_digest else None,
            "manifest_digest": str(self.manifest_digest),
            "manifest_media_type": self.manifest_media_type,
            "manifest_size": self.manifest_size,
            "image_id": str(self.image_id),
            "config_size": self.config_size,
            "layers": [layer.to_json() for layer in self.layers],
            **({"upstream": self.upstream} if self.upstream is not None else {}),
        }


@dataclass(frozen=True)
class ModelEntry:
    """One file of a model as bundle.json lists it: the path under the model's directory, its size, its sha256 (the
    hub's: the raw layer's digest and the archive member's name), its ModelPack media type, the git blob id the hub
    gave (the Hugging Face cache names a small file's blob by it) and whether it is an LFS file. `omitted`: a delta
    leaves the file out of the archive; the offline side holds a file with this sha256 (an inventory's or a base
    bundle's). `modelcar`: the digest of the file's layer in the model's modelcar image (modelcar.py: a pure
    function of the bytes, hashed once at fetch, never stored); None in a bundle carrying no modelcar form (every file
    has one or none does)."""

    path: str
    size: int
    sha256: Digest
    media_type: str
    git_oid: Optional[str] = None
    lfs: bool = False  # stored in LFS/Xet on the hub (the Hugging Face cache names its blob by the sha256)
    omitted: bool = False
    modelcar: Optional[Digest] = None

    def to_json(self) -> dict:
        out = {"path": self.path, "size": self.size, "sha256": str(self.sha256), "media_type": self.media_type}
        if self.git_oid is not None:
            out["git_oid"] = self.git_oid
        if self.lfs:
            out["lfs"] = True
        if self.omitted:
            out["omitted"] = True
        if self.modelcar is not None:
            out["modelcar"] = str(self.modelcar)
        return out


@dataclass(frozen=True)
class BundleModel:
    """One model in the bundle: the reference as asked (`hf:ORG/NAME@REVISION`), where it came from, the commit the
    revision resolved to, and every file. Its ModelPack artifact (manifest, config: weights.modelpack) is a pure
    function of these; bundle.json records the two digests and a reader checks they
    follow (BundleIndex.from_bytes), so serve, push and the archive's members agree on one artifact."""

    ref: str
    source: str
    commit: str
    files: Tuple[ModelEntry, ...]
    manifest_digest: Digest
    manifest_size: int
    config_digest: Digest
    config_size: int

    @property
    def model_ref(self) -> ModelRef:
        return parse_model_ref(self.ref)

    @property
    def size(self) -> int:
        """Bytes of every file (omitted ones too: the model's size, not the bundle's share)."""
        return sum(f.size for f in self.files)

    @property
    def carried(self) -> Tuple[ModelEntry, ...]:
        """The files the archive holds (a delta leaves the others out)."""
        return tuple(f for f in self.files if not f.omitted)

    def snapshot(self) -> ModelSnapshot:
        """The model as the placer and weights.modelpack take it (every file, with its hub digests)."""
        return ModelSnapshot(self.model_ref, self.commit,
                             tuple(ModelFile(f.path, f.size, f.sha256, f.git_oid, f.lfs)
                                   for f in self.files))

    def artifact(self) -> Tuple[bytes, bytes]:
        """The ModelPack manifest and config bytes (the archive's members, what serve answers and push sends)."""
        manifest, config, _ = modelpack(self.snapshot())
        return manifest, config

    def modelcar(self) -> Optional[modelcar.Modelcar]:
        """The model's modelcar image (its index, per-platform manifests and configs: modelcar.image of the files'
        recorded layer digests), or None when the bundle records none."""
        if not self.files or any(f.modelcar is None for f in self.files):
            return None
        return modelcar.image([modelcar.LayerFile(f.path, f.size, f.modelcar, f.sha256) for f in self.files  # type: ignore
                               ], source_url(self.model_ref), self.commit)

    def to_json(self) -> dict:
        return {"ref": self.ref, "source": self.source, "commit": self.commit,
                "manifest_digest": str(self.manifest_digest), "manifest_size": self.manifest_size,
                "config_digest": str(self.config_digest), "config_size": self.config_size,
                "files": [f.to_json() for f in self.files]}


def bundle_model(snapshot: ModelSnapshot, source: str, omitted: Collection[Digest] = (),
                 modelcar_layers: Optional[Mapping[str, Digest]] = None) -> BundleModel:
    """bundle.json's view of a resolved snapshot (every file with its sha256 by now); `omitted`: the sha256s a
    delta leaves out; `modelcar_layers`: each path's modelcar layer digest (modelcar.LayerHash, fed at fetch), None
    for a bundle without the modelcar form. Raises ValueError for a file without its sha256 (weights.modelpack's) or
    without its layer digest when some have one."""
    manifest, config, _ = modelpack(snapshot)
    if modelcar_layers is not None and any(f.path not in modelcar_layers for f in snapshot.files):
        raise ValueError("a modelcar layer digest is missing")
    files = tuple(ModelEntry(f.path, f.size, f.sha256, f.media_type, f.git_oid, f.lfs, f.sha256 in omitted,  # type: ignore
                             None if modelcar_layers is None else modelcar_layers[f.path])
                  for f in sorted(snapshot.files, key=lambda f: f.path))
    return BundleModel(str(snapshot.ref), source, snapshot.commit, files, Digest.of(manifest), len(manifest),
                       Digest.of(config), len(config))


@dataclass(frozen=True)
class Part:
    """One file of the split archive; the parts in order concatenate to the archive."""

    name: str
    size: int
    sha256: str  # hex, as sha256sum prints it

    def to_json(self) -> dict:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class Archive:
    """The (possibly compressed) tar, as a whole: what the parts concatenate to."""

    name: str  # the name it gets when reassembled: <bundle>.tar[.gz|.zst]
    compression: str  # none | gzip | zstd
    size: int  # bytes of the archive (compressed, when compressed)
    sha256: str
    tar_size: int  # bytes of the uncompressed tar stream

    def to_json(self) -> dict:
        return {"name": self.name, "compression": self.compression, "size": self.size,
                "sha256": self.sha256, "tar_size": self.tar_size}


@dataclass(frozen=True)
class UpstreamIndex:
    """Upstream's multi-arch index byte for byte, as fetch received it under the digest `images[].index_digest`
    names: what `serve` answers a pull pinned by that digest with (bundle.json `upstream_indexes`)."""

    digest: Digest
    media_type: str  # OCI index or Docker manifest list
    data: bytes

    @property
    def entries(self) -> Tuple[Descriptor, ...]:
        """Its manifests (platform images and attestations), as it lists them."""
        parsed = parse_manifest(self.data, self.media_type)
        return parsed.manifests if isinstance(parsed, Index) else ()

    def to_json(self) -> dict:
        return {"digest": str(self.digest), "media_type": self.media_type, "size": len(self.data),
                "data": base64.b64encode(self.data).decode("ascii")}


@dataclass(frozen=True)
class BundleIndex:
    """The parsed bundle.json."""

    created: str
    imgtool_version: str
    images: Tuple[BundleImage, ...]
    archive: Archive
    parts: Tuple[Part, ...]
    files: Tuple[Part, ...] = field(default=())  # load.sh, README.txt (name, size, sha256)
    base: Optional[dict] = None  # delta bundles: {"kind": "inventory"|"bundle", "name", "images": [names]}
    # read from a bundle of format version 1 or 2: its index.json names every platform of a multi-arch tag
    legacy_names: bool = False
    # what gzip-compressed the layers imgtool rewrote or exported and a gzip archive: {"library": "isal"|"zlib",
    # "level": the library's own}; None when imgtool compressed nothing (or an older imgtool wrote the bundle)
    gzip: Optional[dict] = None
    # upstream's multi-arch indexes the images came from, byte for byte (absent in bundles of imgtools before it)
    upstream_indexes: Tuple[UpstreamIndex, ...] = ()
    # the models it carries (format version 4), each an OCI artifact whose members follow the images'
    models: Tuple[BundleModel, ...] = ()

    @property
    def layer_bytes(self) -> int:
        """Compressed bytes of the unique layers the archive holds (omitted ones are not in it)."""
        seen = {}
        for image in self.images:
            for layer in image.layers:
                if not layer.omitted:
                    seen[layer.digest] = layer.size
        return sum(seen.values())

    @property
    def is_delta(self) -> bool:
        return any(layer.omitted for image in self.images for layer in image.layers)

    def omitted_chains(self) -> List[Tuple[Digest, Tuple[str, ...]]]:
        """(chain ID, image names providing it) for every omitted layer, each chain once, in order."""
        out: List[Tuple[Digest, Tuple[str, ...]]] = []
        seen = set()
        for image in self.images:
            for layer in image.layers:
                if layer.omitted and layer.chain_id is not None and layer.chain_id not in seen:  # omitted: has one
                    seen.add(layer.chain_id)
                    out.append((layer.chain_id, layer.provided_by))
        return out

    @property
    def has_multiarch_tag(self) -> bool:
        refs = [image.ref for image in self.images]
        return len(set(refs)) < len(refs)

    @property
    def version(self) -> int:
        """The oldest format version that describes this bundle, so older imgtools read what they can."""
        if self.models:
            return MODELS_VERSION
        if self.has_multiarch_tag and not self.legacy_names:
            return UNNAMED_MULTIARCH_VERSION
        return 2 if self.is_delta else FULL_VERSION

    def to_json(self) -> dict:
        out = {
            "format": FORMAT_NAME,
            "version": self.version,
            "created": self.created,
            "imgtool_version": self.imgtool_version,
            "images": [image.to_json() for image in self.images],
            "archive": self.archive.to_json(),
            "parts": [part.to_json() for part in self.parts],
            "files": [f.to_json() for f in self.files],
        }
        if self.base is not None:
            out["base"] = self.base
        if self.gzip is not None:
            out["gzip"] = self.gzip
        if self.upstream_indexes:
            out["upstream_indexes"] = [x.to_json() for x in self.upstream_indexes]
        if self.models:
            out["models"] = [m.to_json() for m in self.models]
        return out

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "BundleIndex":
        """Parse and validate bundle.json; raises VerifyError naming what is wrong."""
        obj = json_object(data, MAX_BUNDLE_JSON, _bad)
        version = _version(obj)
        parsed_images = tuple(_image(x, i, version) for i, x in enumerate(_list(obj, "images")))
        created = _printable(obj, "created")
        models = _models(obj.get("models"), version)
        if not parsed_images and not models:
            raise _bad("it lists no images")
        refs = [(im.ref, im.platform.architecture) for im in parsed_images]
        if len(set(refs)) != len(refs):  # one tag may be held for several architectures, each once
            raise _bad("an image reference is listed twice")
        archive = _archive(obj.get("archive"))
        parts = tuple(_part(x, f"parts[{i}]") for i, x in enumerate(_list(obj, "parts")))
        if not parts:
            raise _bad("it lists no parts")
        files = tuple(_part(x, f"files[{i}]") for i, x in enumerate(_list(obj, "files", required=False)))
        _check_sizes(archive, parts, files)
        base = _base(obj.get("base"))
        gzip = obj.get("gzip")
        if gzip is not None:
            if not isinstance(gzip, dict):
                raise _bad("`gzip` is not an object")
            _str(gzip, "library", "gzip.")
            _size(gzip, "level", "gzip.")
        return cls(
            created=created,
            imgtool_version=_printable(obj, "imgtool_version"),
            images=parsed_images,
            archive=archive,
            parts=parts,
            files=files,
            base=base,
            legacy_names=version < UNNAMED_MULTIARCH_VERSION,
            gzip=gzip,
            upstream_indexes=_upstream_indexes(obj.get("upstream_indexes"), parsed_images),
            models=models,
        )


def _version(obj: dict) -> int:
    """bundle.json's format version, when this imgtool reads it; raises VerifyError."""
    if obj.get("format") != FORMAT_NAME:
        raise VerifyError(f"not an imgtool bundle: bundle.json has format {obj.get('format')!r}, "
                          f"expected {FORMAT_NAME!r}")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _bad(f"bad version {version!r}")
    if version > FORMAT_VERSION:
        raise VerifyError(f"bundle format version {version} is newer than this imgtool understands "
                          f"({FORMAT_VERSION})", hint="upgrade imgtool on this host")
    return version


def _check_sizes(archive: "Archive", parts: Tuple["Part", ...], files: Tuple["Part", ...]) -> None:
    """Every file named once, the parts adding up to the archive; raises VerifyError."""
    names = [p.name for p in parts + files]
    if len(set(names)) != len(names):
        raise _bad("a file name is listed twice")
    if sum(p.size for p in parts) != archive.size:
        raise _bad("the parts' sizes do not add up to the archive size")
    if archive.compression == "none" and archive.size != archive.tar_size:
        raise _bad("archive size and tar size differ for an uncompressed archive")


def _bad(why: str) -> VerifyError:
    return VerifyError(f"bundle.json is malformed: {why}",
                       hint="copy bundle.json again from the source medium, or fetch the bundle again")


def _list(obj: dict, key: str, required: bool = True) -> list:
    v = obj.get(key)
    if v is None and not required:
        return []
    if not isinstance(v, list):
        raise _bad(f"`{key}` is not a list")
    return v


def _str(obj: dict, key: str, where: str = "") -> str:
    v = obj.get(key)
    if not isinstance(v, str):
        raise _bad(f"`{where}{key}` is not a string")
    return v


def _printable(obj: dict, key: str, where: str = "") -> str:
    v = _str(obj, key, where)
    if not is_printable(v):
        raise _bad(f"`{where}{key}` is not printable text: {v!r}")
    return v


def _base(x: object) -> Optional[dict]:
    """A delta's `base`: what it was made against (kind and name: printable text) and the images it needs."""
    if x is None:
        return None
    if not isinstance(x, dict):
        raise _bad("`base` is not an object")
    for key in ("kind", "name"):
        if key in x:
            _printable(x, key, "base.")
    images = x.get("images", [])
    if not isinstance(images, list) or not all(is_docker_name(n) for n in images):
        raise _bad(f"`base.images` is not a list of image names: {images!r}")
    return x


def _size(obj: dict, key: str, where: str) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise _bad(f"`{where}{key}` is not a size: {v!r}")
    return v


def _digest(obj: dict, key: str, where: str) -> Digest:
    v = obj.get(key)
    try:
        d = Digest.parse(v if isinstance(v, str) else "")
    except UsageError:
        raise _bad(f"`{where}{key}` is not a digest: {v!r}") from None
    if d.algorithm != "sha256":
        raise _bad(f"`{where}{key}`: only sha256 digests are supported")
    return d


def _sha256_hex(obj: dict, where: str) -> str:
    v = obj.get("sha256")
    if not isinstance(v, str) or not _HEX64.match(v):
        raise _bad(f"`{where}sha256` is not 64 lowercase hex digits")
    return v


def _fail(key: Optional[str], problem: str) -> NoReturn:
    raise _bad(problem)


def _size_value(value: int) -> int:
    if value < 0:
        raise Invalid()
    return value


def _sha256(value: object) -> Digest:
    try:
        digest = Digest.parse(value if isinstance(value, str) else "")
    except UsageError:
        raise Invalid() from None
    if digest.algorithm != "sha256":
        raise Invalid("`{where}{key}`: only sha256 digests are supported")
    return digest


def _ref(ref: str) -> str:
    try:
        parsed = ImageRef.parse(ref)
    except UsageError:
        raise Invalid("`{where}{key}` is not an image reference: {value!r}") from None
    if str(parsed) != ref and parsed.tagged != ref:
        raise Invalid("`{where}{key}` is not a canonical image reference: {value!r}")
    return ref


def _platform(text: str) -> Platform:
    try:
        return Platform.parse(text)
    except UsageError:
        raise Invalid("`{where}{key}` is not a platform: {value!r}") from None


def _choice(choices: Collection[str], what: str) -> Callable[[str], str]:
    def checked(value: str) -> str:
        if value not in choices:
            raise Invalid("`{where}{key}` is not " + what + ": {value!r}")
        return value

    return checked


def _names(values: object) -> Tuple[str, ...]:
    """Image names (a delta's providers, which load.sh's base check asks the runtime for): each in the grammar
    `docker tag` takes."""
    values = values or []
    if not isinstance(values, list) or not all(is_docker_name(n) for n in values):
        raise Invalid()
    return tuple(values)


def _text(value: str) -> str:
    """Free text (where an image came from, when and by what imgtool it was packed): one printable line."""
    if not is_printable(value):
        raise Invalid("`{where}{key}` is not printable text: {value!r}")
    return value


_STRING = "`{where}{key}` is not a string"
_SIZE = Key("", int, True, check=_size_value, wrong="`{where}{key}` is not a size: {value!r}")
_DIGEST = Key("", object, True, check=_sha256, wrong="`{where}{key}` is not a digest: {value!r}")


def _size_key(name: str, required: bool = True) -> Key:
    return dataclasses.replace(_SIZE, name=name, required=required)


def _digest_key(name: str, required: bool = True) -> Key:
    return dataclasses.replace(_DIGEST, name=name, required=required)


# What bundle.json says of an image (images[i]) and of each of its layers.
_LAYER = Table(
    _digest_key("digest"),
    _size_key("size"),
    _digest_key("diff_id"),
    Key("media_type", str, True, check=_choice(LAYER_COMPRESSION, "a layer type")),
    Key("omitted", object),
    Key("provided_by", object, check=_names, wrong="`{where}{key}` is not a list of names"),
    Key("chain_id", object),  # read only when the layer is omitted
    _size_key("unpacked_size", required=False),
    wrong=_STRING,
)
_IMAGE = Table(
    Key("ref", str, True, check=_ref),
    Key("platform", str, True, check=_platform),
    Key("manifest_media_type", str, True, check=_choice(MANIFEST_TYPES, "an image manifest type")),
    Key("layers", list, True, wrong="`{where}{key}` is not a list"),
    Key("source", str, check=_text),
    _digest_key("index_digest", required=False),
    _digest_key("manifest_digest"),
    _size_key("manifest_size"),
    _digest_key("image_id"),
    _size_key("config_size"),
    Key("upstream", dict, wrong="`{where}{key}` is not an object"),
    wrong=_STRING,
)


def _checked(table: Table, obj: object, where: str) -> dict:
    """`obj` checked against `table`: a required key absent (or null) is reported as of the wrong type, an
    optional one that is null is absent; other keys are left alone (a newer imgtool's additions)."""
    if not isinstance(obj, dict):
        raise _bad(f"{where[:-1]} is not an object")
    values = {k: v for k, v in obj.items() if v is not None}
    values.update((k, None) for k in table.required if k not in values)
    return table.check(values, _fail, where, unknown=False)


def _image(x: object, i: int, version: int = 1) -> BundleImage:
    where = f"images[{i}]."
    v = _checked(_IMAGE, x, where)
    layers = tuple(_layer(layer, f"{where}layers[{j}].", version) for j, layer in enumerate(v["layers"]))
    if any(layer.omitted for layer in layers):
        for j, (layer, chain) in enumerate(zip(layers, chain_ids([x.diff_id for x in layers]))):
            if layer.omitted and layer.chain_id != chain:
                raise _bad(f"`{where}layers[{j}].chain_id` does not follow from the diff_ids")
    source = v.get("source")
    return BundleImage(
        ref=v["ref"], source=source if isinstance(source, str) else "", platform=v["platform"],
        index_digest=v.get("index_digest"), manifest_digest=v["manifest_digest"],
        manifest_media_type=v["manifest_media_type"], manifest_size=v["manifest_size"], image_id=v["image_id"],
        config_size=v["config_size"], layers=layers, upstream=_upstream(v.get("upstream"), where),
    )


def _layer(x: object, where: str, version: int) -> Layer:
    omitted = isinstance(x, dict) and x.get("omitted", False) is True
    if omitted and version < 2:
        raise _bad(f"`{where}omitted` needs format version 2")
    table = _LAYER if not omitted else _OMITTED_LAYER
    v = _checked(table, x, where)
    return Layer(v["digest"], v["size"], v["diff_id"], v["media_type"], omitted, v.get("chain_id") if omitted else None,
                 tuple(v.get("provided_by") or ()) if omitted else (), v.get("unpacked_size"))


# an omitted layer names the chain it completes
_OMITTED_LAYER = Table(*(_digest_key("chain_id") if k.name == "chain_id" else k for k in _LAYER.keys.values()),
                       wrong=_STRING)


def _upstream(x, where: str) -> Optional[dict]:
    """bundle.json's record of rewritten layers: checked for the fields push and describe read."""
    if x is None:
        return None
    _digest(x, "manifest_digest", where + "upstream.")
    _str(x, "layers", where + "upstream.")
    return x


def _upstream_indexes(x: object, images: Tuple[BundleImage, ...]) -> Tuple[UpstreamIndex, ...]:
    """bundle.json's copies of upstream's indexes: each the bytes of an index some image names as its
    `index_digest`, checked against that digest; raises VerifyError."""
    if x is None:
        return ()
    if not isinstance(x, list):
        raise _bad("`upstream_indexes` is not a list")
    named = {im.index_digest for im in images}
    out: List[UpstreamIndex] = []
    for i, item in enumerate(x):
        where = f"upstream_indexes[{i}]."
        if not isinstance(item, dict):
            raise _bad(f"{where[:-1]} is not an object")
        digest = _digest(item, "digest", where)
        media = _str(item, "media_type", where)
        if media not in INDEX_TYPES:
            raise _bad(f"`{where}media_type` is not an index type: {media!r}")
        size = _size(item, "size", where)
        if size > MAX_KEPT_INDEX:
            raise _bad(f"`{where}size` is over {MAX_KEPT_INDEX} bytes: {size}")
        try:
            data = base64.b64decode(_str(item, "data", where), validate=True)
        except (binascii.Error, ValueError):
            raise _bad(f"`{where}data` is not base64") from None
        if len(data) != size or Digest.of(data) != digest:
            raise _bad(f"`{where}data` is not upstream's index {digest}: its {len(data)} bytes have digest "
                       f"{Digest.of(data)}")
        try:
            parsed = parse_manifest(data, media)
        except ManifestError as e:
            raise _bad(f"`{where}data` is not an index: {e.message}") from None
        if not isinstance(parsed, Index) or parsed.media_type != media:
            raise _bad(f"`{where}data` is not an index of type {media}")
        if digest not in named:
            raise _bad(f"`{where}digest` {digest} is no image's index_digest")
        if any(x.digest == digest for x in out):
            raise _bad(f"`{where}digest` {digest} is listed twice")
        out.append(UpstreamIndex(digest, media, data))
    return tuple(out)


def _model_ref(text: str) -> str:
    """A hub's spelling (hf:ORG/NAME[@REV]): a bundle never names a directory of the connected side."""
    try:
        ref = parse_model_ref(text)
    except UsageError as e:
        raise Invalid("`{where}{key}` is not a model reference: {value!r}") from e
    if ref.directory is not None:
        raise Invalid("`{where}{key}` is not a model reference: {value!r}")
    return text


def _commit(text: str) -> str:
    """A commit: git's 40 hex digits, or (ModelScope, whose revisions may name none) a printable revision name."""
    if not (is_commit(text) or (is_printable(text) and 0 < len(text) <= 255 and "/" not in text)):
        raise Invalid("`{where}{key}` is not a commit: {value!r}")
    return text


def _file_path(text: str) -> str:
    if check_path(text) is not None:
        raise Invalid("`{where}{key}` is not a path under a model's directory: {value!r}")
    return text


def _git_oid(text: str) -> str:
    if not re.match(r"[0-9a-f]{40}\Z", text):
        raise Invalid("`{where}{key}` is not a git blob id: {value!r}")
    return text


_MODEL = Table(
    Key("ref", str, True, check=_model_ref),
    Key("source", str, check=_text),
    Key("commit", str, True, check=_commit),
    _digest_key("manifest_digest"),
    _size_key("manifest_size"),
    _digest_key("config_digest"),
    _size_key("config_size"),
    Key("files", list, True, wrong="`{where}{key}` is not a list"),
    wrong=_STRING,
)
_MODEL_FILE = Table(
    Key("path", str, True, check=_file_path),
    _size_key("size"),
    _digest_key("sha256"),
    Key("media_type", str, True, check=_choice(MODEL_LAYER_TYPES, "a model layer type")),
    Key("git_oid", str, check=_git_oid),
    Key("lfs", bool),
    Key("omitted", bool),
    _digest_key("modelcar", required=False),
    wrong=_STRING,
)


def _models(x: object, version: int) -> Tuple[BundleModel, ...]:
    """bundle.json's models, each file's name checked as a hub's would be, the recorded artifact digests checked to
    follow from the files; raises VerifyError."""
    if x is None:
        return ()
    if version < MODELS_VERSION:
        raise _bad(f"`models` needs format version {MODELS_VERSION}")
    if not isinstance(x, list):
        raise _bad("`models` is not a list")
    out: List[BundleModel] = []
    for i, item in enumerate(x):
        where = f"models[{i}]."
        v = _checked(_MODEL, item, where)
        files = []
        for j, f in enumerate(v["files"]):
            fv = _checked(_MODEL_FILE, f, f"{where}files[{j}].")
            if fv["media_type"] != layer_media_type(fv["path"]):
                raise _bad(f"`{where}files[{j}].media_type` is not {layer_media_type(fv['path'])} for {fv['path']!r}")
            files.append(ModelEntry(fv["path"], fv["size"], fv["sha256"], fv["media_type"], fv.get("git_oid"),
                                    fv.get("lfs", False), fv.get("omitted", False), fv.get("modelcar")))
        if [f.path for f in files] != sorted(f.path for f in files):
            raise _bad(f"`{where}files` are not in path order")
        if len({f.modelcar is None for f in files}) > 1:
            raise _bad(f"`{where}files`: some have a `modelcar` digest and some not (a model has both forms or one)")
        source = v.get("source")
        model = BundleModel(v["ref"], source if isinstance(source, str) else "", v["commit"], tuple(files),
                            v["manifest_digest"], v["manifest_size"], v["config_digest"], v["config_size"])
        try:
            model.snapshot().check()
        except UsageError as e:
            raise _bad(f"`{where}files`: {e.message}") from None
        manifest, config = model.artifact()
        if (Digest.of(manifest), len(manifest), Digest.of(config), len(config)) != (
                model.manifest_digest, model.manifest_size, model.config_digest, model.config_size):
            raise _bad(f"`{where}manifest_digest` does not follow from its files: the artifact of {model.ref} is "
                       f"{Digest.of(manifest)}")
        if any(m.model_ref.repo == model.model_ref.repo and m.model_ref.hub == model.model_ref.hub for m in out):
            raise _bad(f"{model.ref} is listed twice")
        out.append(model)
    return tuple(out)


def _archive(x) -> Archive:
    where = "archive."
    if not isinstance(x, dict):
        raise _bad("`archive` is not an object")
    name = _str(x, "name", where)
    if not safe_name(name):
        raise _bad(f"`archive.name` is not a plain file name: {name!r}")
    compression = _str(x, "compression", where)
    if compression not in COMPRESSIONS:
        raise _bad(f"unknown archive compression {compression!r}")
    return Archive(name, compression, _size(x, "size", where), _sha256_hex(x, where), _size(x, "tar_size", where))


def _part(x, where: str) -> Part:
    if not isinstance(x, dict):
        raise _bad(f"{where} is not an object")
    name = _str(x, "name", where + ".")
    if not safe_name(name) or name in RESERVED_NAMES:
        raise _bad(f"`{where}.name` is not a plain file name: {name!r}")
    return Part(name, _size(x, "size", where + "."), _sha256_hex(x, where + "."))


def part_label(index: int, count: int) -> str:
    """How messages name a part: `part 002` (1-based, as in the file names)."""
    return f"part {index + 1:0{max(3, len(str(count)))}d}"


def parse_expect(text: str) -> str:
    """`--expect` value (`sha256:<hex>` or `<hex>`) to hex; raises UsageError."""
    value = (text or "").strip().lower()
    if value.startswith("sha256:"):
        value = value[len("sha256:"):]
    if not _HEX64.match(value):
        raise UsageError(f"invalid --expect {text!r}: give the sha256 of bundle.json (64 hex digits)")
    return value


def bundle_images(images: Sequence[PulledImage], delta: Optional[DeltaPlan] = None) -> List[BundleImage]:
    """bundle.json's view of pulled images, leaving out the layers `delta` plans to leave out;
    raises UsageError for duplicates or inconsistent inputs."""
    out: List[BundleImage] = []
    for im in images:
        ref = im.ref.tagged if im.ref.tag else f"{im.ref.name}@{im.ref.digest or im.manifest_digest}"
        if any(b.ref == ref and b.platform.architecture == im.platform.architecture for b in out):
            raise UsageError(f"{ref} is listed twice for {im.platform} (one bundle holds one image per tag "
                             "and architecture)", hint="fetch one platform per architecture")
        if Digest.of(im.manifest_bytes) != im.manifest_digest or Digest.of(im.config_bytes) != im.image_id:
            raise ImgtoolError(f"{ref}: the manifest or config bytes do not match their digests")
        if len(im.config.diff_ids) != len(im.manifest.layers):
            raise ImgtoolError(f"{ref}: the config lists {len(im.config.diff_ids)} diff_ids for "
                               f"{len(im.manifest.layers)} layers")
        unpacked = list(im.unpacked_sizes) + [None] * (len(im.manifest.layers) - len(im.unpacked_sizes))
        layers = [Layer(d.digest, d.size, diff, d.media_type, unpacked_size=u)
                  for d, diff, u in zip(im.manifest.layers, im.config.diff_ids, unpacked)]
        for o in delta.omissions(im.config.diff_ids, im.platform.architecture) if delta else ():
            layers[o.index] = dataclasses.replace(layers[o.index], omitted=True, chain_id=o.chain_id,
                                                  provided_by=o.provided_by)
        if any(x.digest.algorithm != "sha256" for x in layers):
            raise ImgtoolError(f"{ref}: only sha256 layer digests are supported")
        out.append(BundleImage(ref, im.source, im.platform, im.index_digest, im.manifest_digest,
                               im.manifest.media_type, len(im.manifest_bytes), im.image_id,
                               len(im.config_bytes), tuple(layers), im.upstream))
    return out
