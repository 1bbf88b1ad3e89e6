"""load.sh: the shell file beside this module (imgtool/bundle/load.sh), with its parameters for one bundle.

Every bundle carries load.sh, a POSIX sh loader for hosts without Python or imgtool (issue 36 item 4). Its text is
a shell file of the package, read and checked (shellcheck) as any: the kubelet finder, the sums and signature
checks, the runtime choice, the space check, the clean-up after a failed `ctr images import` and the pin are all
there, each mirroring a room of imgtool's (kubelet.py, hostcheck.py, containerd.py). It begins with one block of
parameters; this module computes their values from bundle.json and writes them into that block, and nothing else
of the text changes from bundle to bundle (issue 47).

Every value reaches the script as an int or through `text.sh_quote` (docs/security.md, "What reaches a generated
script"); a list is written as a function that runs its argument once per item, the item's words after it.
"""

import pkgutil
import re
from typing import Dict, List, Sequence, Tuple, Union

from .. import __version__, modelcar
from ..delta import chain_ids, describe_requirements, requirements
from ..errors import counted
from ..model import (UNPACKED_PER_COMPRESSED, Digest, ImageConfig, ImageRef, Manifest, Platform, PulledImage,
                     format_size, parse_manifest)
from ..placement import marker
from ..runtimes import containerd, docker, kubelet, podman
from ..sshsig import NAMESPACE
from ..text import sh_quote
from .format import (BUNDLE_JSON, SHA256SUMS, SIGNATURE, TOOL_PYZ, BundleImage, BundleIndex, BundleModel,
                     bundle_images)
from .hostcheck import zstd_layer_refs
from . import catalog, layout
from .layout import runtime_image_id
from .texts import has_tool, multiarch_refs, ways

TEMPLATE = "load.sh"  # beside this module, in the package (and in imgtool.pyz)
BEGIN = "# ---- parameters:"  # the block's first and last lines start so
END = "# ---- end of parameters"
COMPRESSIONS = ("none", "gzip", "zstd")  # what load.sh unpacks the archive with: nothing, gzip -dc, zstd -dc

# the rooms' own numbers and words, so load.sh and imgtool say the same (bundle/hostcheck.py asks the rooms' traits)
PODMAN_STAGED_COPIES = podman.TRAITS.staged_copies  # Podman 4.3 holds 3.0 x the archive in its staging dir at its peak
PINNED = containerd.PINNED  # the CRI plugin reports such images pinned (1.7+)
ADVICE = {"docker": docker.SPACE_ADVICE, "containerd": containerd.SPACE_ADVICE, "podman": podman.SPACE_ADVICE}
STAGING_ADVICE = f"free space there, or {podman.TRAITS.staging_advice}"
# what to do about zstd layers on Docker before 23.0
ZSTD_REMEDY = ("upgrade Docker to 23.0 or later, or fetch the image again with imgtool fetch --layers compat "
               "(the default), which rewrites zstd layers as gzip: this bundle kept the registry's zstd bytes")

Word = Union[int, str]
Items = List[Tuple[Word, ...]]  # a list parameter: each item's words
Value = Union[Word, Items]

_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(=|\(\) \{)")


def load_sh(index: BundleIndex) -> bytes:
    """load.sh for this bundle: the package's load.sh with its parameters filled in."""
    return fill(template(), parameters(index)).encode()


def template() -> str:
    """The text of imgtool/bundle/load.sh (read through the package's loader: imgtool.pyz is a zip)."""
    data = pkgutil.get_data(__package__, TEMPLATE)
    if data is None:  # pragma: no cover - a loader without get_data
        raise FileNotFoundError(f"{__package__}/{TEMPLATE}")
    return data.decode("utf-8")


def parameters(index: BundleIndex) -> Dict[str, Value]:
    """The value of each parameter of load.sh for this bundle (load.sh's own comments say what each is)."""
    if index.archive.compression not in COMPRESSIONS:
        raise ValueError(f"load.sh cannot unpack a {index.archive.compression!r} archive")
    return {
        "written_by": f"imgtool {__version__}",
        "BUNDLE_JSON": BUNDLE_JSON, "SHA256SUMS": SHA256SUMS, "SIGNATURE": SIGNATURE, "sig_namespace": NAMESPACE,
        # kubelet.py's caps, the same numbers in load.sh (tests/test_load_sh.py holds them equal)
        "kube_max_file": kubelet.MAX_FILE, "kube_max_comm": kubelet.MAX_COMM, "kube_max_status": kubelet.MAX_STATUS,
        "podman_copies": PODMAN_STAGED_COPIES,
        "advice_docker": ADVICE["docker"], "advice_containerd": ADVICE["containerd"].format(namespace="@NAMESPACE@"),
        "advice_podman": ADVICE["podman"], "staging_advice": STAGING_ADVICE,
        "zstd_remedy": ZSTD_REMEDY, "pinned_label": PINNED,
        "image_count": len(index.images), "compression": index.archive.compression,
        "tar_size": index.archive.tar_size,
        "parts": [(p.name, p.size) for p in index.parts],
        "platforms": ", ".join(sorted({str(im.platform) for im in index.images})),
        "arches": [(arch,) for arch in sorted({im.platform.architecture for im in index.images})],
        "zstd_refs": ", ".join(zstd_layer_refs(index)),
        "multiarch_refs": ", ".join(multiarch_refs(index)),
        "multiarch_tags": _multiarch_tags(index),
        "base_images": _base_images(index), "base_chains": _base_chains(index),
        "image_ids": " ".join(dict.fromkeys(x for im in index.images for x in _ids(im))),
        # the manifest digests index.json names: what ctr import records each image by
        "manifests": " ".join(dict.fromkeys(str(runtime_image_id(im, True)) for im in index.images)),
        "layer_table": "\n".join(f"{chain} {int(c)} {int(u)} {ids}" for chain, c, u, ids in _layer_table(index)),
        "instead": f"python3 {TOOL_PYZ} load ." if has_tool(index) else "imgtool load .",
        "ways_en": ways(index, "en"), "ways_zh": ways(index, "zh"),
        **_model_parameters(index),
        **_modelcar_parameters(index),
    }


def _model_parameters(index: BundleIndex) -> Dict[str, Value]:
    """What load.sh needs of the bundle's models (issue 48): where the images' members end in the tar (the runtime
    is sent that prefix and the tar's end blocks), each model (its directory under --models-dir, as the placer's
    `dir` target names it; its reference; its commit; its `.imgtool-model.json`, the placer's bytes; its files and
    size in words), each file (the model's number, its path, size, sha256), and where each carried file's bytes lie
    in the parts of an uncompressed archive (sha256, part, offset in the part, length)."""
    if not index.models:  # the runtime is sent the whole archive, as before models
        return {"model_count": 0, "images_end": 0, "models": [], "model_files": [], "model_pieces": []}
    slots, _ = layout.arrange(layout.bundle_members(index))
    models: Items = []
    files: Items = []
    for i, m in enumerate(index.models, 1):
        snapshot = m.snapshot()
        ref = m.model_ref
        models.append((i, f"{ref.org}/{ref.name}", m.ref, m.commit, marker(snapshot, ref.revision).decode(),
                       f"{counted(len(m.files), 'file')}, {format_size(m.size)}"))
        files += [(i, f.path, f.size, f.sha256.hex) for f in m.files]
    pieces: Items = []
    if index.archive.compression == "none":
        starts, at = [], 0
        for p in index.parts:
            starts.append(at)
            at += p.size
        for slot in slots:
            if slot.member.kind != "model":
                continue
            begin, end = slot.data_offset, slot.end
            for part, start in zip(index.parts, starts):
                lo, hi = max(begin, start), min(end, start + part.size)
                if lo < hi:
                    pieces.append((slot.member.digest.hex, part.name, lo - start, hi - lo))
    return {"model_count": len(index.models), "images_end": layout.images_end(slots),
            "models": models, "model_files": files, "model_pieces": pieces}


def _modelcar_parameters(index: BundleIndex) -> Dict[str, Value]:
    """What load.sh needs to import each model as its modelcar image into containerd (issue 49), as
    ends/modelcar_source.py does: every byte of the OCI tar but the files' own, precomputed here (load.sh writes them
    with printf, the files' bytes cut from the parts between). `modelcars`: 1 when every model records its modelcar
    form and has a name an image can have. Per model and platform (`car_images`): the model's number, the
    architecture, the image's name, its manifest digest (the ID containerd knows it by), its top chain ID (its
    snapshot: unpacked), and the tar's members before the layers (index.json, manifest.json, oci-layout, the
    manifest and config blobs: their headers, bytes and padding). Per file (`car_layers`, path order): the model's
    number, its path, size and sha256, what precedes its bytes (the layer member's tar header, then the modelcar
    head) and how many NULs follow them (the modelcar tail: padding and the layer tar's end; a layer is whole
    blocks, so its member needs no padding of its own)."""
    cars: List[Tuple[BundleModel, modelcar.Modelcar, str]] = []
    for m in index.models:
        car, repo = m.modelcar(), catalog.model_repository(m)
        if car is None or repo is None:
            return {"modelcars": 0, "car_images": [], "car_layers": []}
        cars.append((m, car, f"{catalog.MODEL_REGISTRY}/{repo}:{modelcar.tag(m.commit)}"))
    images: Items = []
    layers: Items = []
    for i, (m, car, name) in enumerate(cars, 1):
        for os_, arch in modelcar.PLATFORMS:
            manifest_bytes, config_bytes = car.for_platform(os_, arch)
            manifest = parse_manifest(manifest_bytes)
            assert isinstance(manifest, Manifest)
            pulled = PulledImage(ref=ImageRef.parse(name), source=f"bundle {name}", platform=Platform(os_, arch),
                                 index_digest=car.digest, manifest_digest=Digest.of(manifest_bytes),
                                 manifest_bytes=manifest_bytes, manifest=manifest, config_bytes=config_bytes,
                                 config=ImageConfig.parse(config_bytes))
            small = {pulled.manifest_digest: manifest_bytes, pulled.image_id: config_bytes}
            members = [x for x in layout.members(bundle_images([pulled])) if x.kind != "layer"]
            slots, _ = layout.arrange(members)
            prefix = b"".join(s.header + (s.member.content if s.member.content is not None
                                          else small[s.member.digest]) + bytes(layout.padding(s.member.size))
                              for s in slots)
            top = chain_ids([d.digest for d in car.layers])[-1] if car.layers else ""
            images.append((i, arch, name, str(pulled.manifest_digest), str(top), _printf(prefix)))
        by_path = {f.path: f for f in m.files}
        for d in car.layers:
            f = by_path[d.annotations[modelcar.FILEPATH]]
            head = layout.header(layout.blob_name(d.digest), d.size) + modelcar.head(f.path, f.size)
            layers.append((i, f.path, f.size, f.sha256.hex, _printf(head), len(modelcar.tail(f.size))))
    return {"modelcars": 1 if cars else 0, "car_images": images, "car_layers": layers}


def _printf(data: bytes) -> str:
    """`data` as a format printf writes as these bytes: printable ASCII as itself but for `\\`, `%` and `'`, every
    other byte as a three-digit octal escape (NULs too: printf writes them)."""
    return "".join(chr(b) if 0x20 <= b < 0x7F and b not in b"\\%'" else "\\%03o" % b for b in data)


def fill(text: str, values: Dict[str, Value]) -> str:
    """`text` (load.sh) with each line of its parameter block written anew from `values`; raises ValueError when the
    block and `values` do not name the same parameters."""
    head, rest = text.split("\n" + BEGIN, 1)
    block, tail = rest.split("\n" + END, 1)
    first, *lines = block.split("\n")
    out, named = [head, BEGIN + first], []
    for line in lines:
        m = _NAME.match(line)
        if not m:
            if line and not line.startswith("#"):
                raise ValueError(f"load.sh's parameter block holds a line that sets no parameter: {line!r}")
            out.append(line)
            continue
        name = m.group(1)
        named.append(name)
        if name not in values:
            raise ValueError(f"load.sh's parameter {name} has no value")
        out.append(_assign(name, values[name]))
    unused = sorted(set(values) - set(named))
    if unused:
        raise ValueError(f"load.sh has no parameter {', '.join(unused)}")
    return "\n".join(out) + "\n" + END + tail


def _assign(name: str, value: Value) -> str:
    """`name=WORD`, or a list: `name() { "$@" WORD...; }`, an item a line."""
    if isinstance(value, list):
        if not value:
            return f"{name}() {{ :; }}"
        return "\n".join([f"{name}() {{"] + [f'    "$@" {" ".join(_word(w) for w in item)}' for item in value] + ["}"])
    return f"{name}={_word(value)}"


def _word(value: Word) -> str:
    """A value as one word of sh: an int as its digits, anything else single-quoted (text.sh_quote)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(int(value))
    return sh_quote(value)


def _multiarch_tags(index: BundleIndex) -> Items:
    """A tag held for several architectures has no RepoTags in manifest.json: load.sh names the runtime's one after
    the load (Docker with a graphdriver, Podman: both know the image by its config digest). (architecture, image
    ID, tag) of each such image, by architecture."""
    by_ref: Dict[str, List[BundleImage]] = {}
    for im in index.images:
        by_ref.setdefault(im.ref, []).append(im)
    multi = [ims for ims in by_ref.values() if len(ims) > 1 and ims[0].repo_tag]
    arches = sorted({im.platform.architecture for ims in multi for im in ims})
    return [(arch, str(im.image_id), str(im.repo_tag)) for arch in arches for ims in multi for im in ims
            if im.platform.architecture == arch]


def _base_images(index: BundleIndex) -> Items:
    """A delta bundle: for each group of images providing its left-out layers (any one of them does), the group in
    words, then the images."""
    if not index.is_delta:
        return []
    return [(_what(names), *names) for names in requirements(index.omitted_chains())]


def _base_chains(index: BundleIndex) -> Items:
    """A delta bundle, for containerd (its layers unpacked, snapshots named by chain ID): per image, the deepest
    left-out chain, which a snapshot holds with all below it; (who provides it in words, the chain ID)."""
    if not index.is_delta:
        return []
    chains: List[Tuple[str, Tuple[str, ...]]] = []
    for im in index.images:
        omitted = [x for x in im.layers if x.omitted and x.chain_id is not None]
        if omitted and (str(omitted[-1].chain_id), tuple(omitted[-1].provided_by)) not in chains:
            chains.append((str(omitted[-1].chain_id), tuple(omitted[-1].provided_by)))
    return [(_what(names), chain) for chain, names in chains]


def _what(names: Sequence[str]) -> str:
    return describe_requirements([tuple(names)])


def _ids(im: BundleImage) -> Tuple[str, str]:
    """The IDs a runtime knows the image by once loaded: its config digest (Docker's graphdriver store, Podman)
    and the manifest digest the archive's index.json names (Docker's containerd image store)."""
    return str(runtime_image_id(im, False)), str(runtime_image_id(im, True))


def _layer_table(index: BundleIndex) -> List[Tuple[str, int, int, str]]:
    """(chain ID, compressed, unpacked, the IDs of the images holding it) of every layer the bundle carries, once
    per chain, as hostcheck.need_for counts them."""
    seen: Dict[str, Tuple[str, int, int, List[str]]] = {}
    for im in index.images:
        for layer, chain in zip(im.layers, chain_ids([x.diff_id for x in im.layers])):
            if layer.omitted:
                continue
            row = seen.get(str(chain))
            if row is None:
                size = layer.unpacked_size if layer.unpacked_size is not None else int(layer.size * UNPACKED_PER_COMPRESSED)
                row = seen[str(chain)] = (str(chain), layer.size, size, [])
            row[3].extend(x for x in _ids(im) if x not in row[3])
    return [(chain, c, u, ",".join(ids)) for chain, c, u, ids in seen.values()]
