"""A run on Kubernetes: the same `RunSpec` as a Pod or a Deployment, written as YAML; pure but for bundle.json.

What a preset means there (docs/presets.md says where each fact comes from): the cards are a count
of the Ascend device plugin's extended resource (the plugin chooses which and injects their
/dev/davinci* nodes and the management devices), /dev/shm is a memory-backed emptyDir of the shm
size, the driver and tool paths are read-only hostPath volumes, the cache a writable one the kubelet
creates, `privileged` a securityContext only when the preset or the user asks for it.

The YAML is written here, not by a library: imgtool.pyz runs on Kylin's Python 3.7 with the standard
library only. The emitter knows only what a manifest holds (mappings, lists, strings, integers,
booleans) and writes a string plain only when no YAML reader could take it for anything else.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import modelcar
from ..errors import UsageError
from ..model import ImageRef, Platform
from ..releases import pick_tag
from .preset import Preset, parse_resource_name
from .run import MODELCAR_MOUNT, MODELCAR_PATH, RunSpec

KINDS = ("pod", "deployment")
LABEL = "app.kubernetes.io/name"
SHM_VOLUME = "dshm"
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


# How a model (--model) reaches the Pod, by the cluster's Kubernetes version (docs/presets.md says why):
# image volumes (KEP-4639, `volumes[].image`) are on by default from 1.35 (beta; GA in 1.36), alpha or off by default
# before; a subPath of an image volume needs a runtime that honours the CRI's image_sub_path (containerd 2.2+,
# which 1.36 requires: containerd 2.1 mounts the image's root and ignores it). Older nodes get a hostPath of the
# placed directory.
IMAGE_VOLUMES_SINCE = (1, 35)
IMAGE_SUBPATH_SINCE = (1, 36)
MODEL_VOLUME = "model"
_KUBE_VERSION_RE = re.compile(r"^v?1\.([0-9]{1,3})(?:\.[0-9]{1,4})?\Z")


def parse_kube_version(text: str) -> Tuple[int, int]:
    """`1.35`, `v1.36.2` -> (1, 35); raises UsageError."""
    m = _KUBE_VERSION_RE.match(text.strip())
    if not m:
        raise UsageError(f"invalid --k8s-version {text!r}: expected the cluster's Kubernetes version, like 1.35")
    return 1, int(m.group(1))


def mounts_model_image(version: Optional[Tuple[int, int]]) -> bool:
    """Whether a cluster of `version` mounts a model as its modelcar image (None: not said, the hostPath)."""
    return version is not None and version >= IMAGE_VOLUMES_SINCE


@dataclass(frozen=True)
class KubeOptions:
    """What `--format k8s` adds: the workload's kind, the NPUs' resource name (default: the preset's) and the
    cluster's Kubernetes version (how a model is mounted)."""

    kind: str = "pod"
    resource_name: Optional[str] = None
    version: Optional[Tuple[int, int]] = None


@dataclass(frozen=True)
class BundleImage:
    """The image a bundle holds for the spec: pinned by manifest digest, for one architecture."""

    ref: str  # canonical name with tag: quay.io/ascend/vllm-ascend:v0.11.0rc1
    digest: str  # the manifest digest bundle.json names (what serve and push serve, what a pull records)
    architecture: str

    @property
    def pinned(self) -> str:
        """`NAME:TAG@sha256:...`: the tag for people; containerd and CRI-O resolve by the digest alone."""
        return f"{self.ref}@{self.digest}"


# --- the image from a bundle ---------------------------------------------------------------


def image_from_bundle(bundle_dir: str, preset: Preset, image: Optional[str], default_image: str,
                      architecture: Optional[str] = None) -> BundleImage:
    """The bundle's image for the run: `image` (already normalized) or else the newest tag for the preset, for
    `architecture` (needed when the bundle holds the tag for several); raises UsageError (none there, several
    platforms and no architecture, not that one), or what reading bundle.json raises."""
    from ..bundle.reader import read_index

    index, _ = read_index(Path(bundle_dir))
    held = [im for im in index.images if ImageRef.parse(im.ref).tag]
    if image is None:
        tags = [ImageRef.parse(im.ref).tag or "" for im in held if ImageRef.parse(im.ref).name == default_image]
        tag = pick_tag(tags, preset.tag_suffixes)
        if tag is None:
            raise UsageError(f"bundle {bundle_dir} holds no {default_image} image for preset {preset.name} "
                             f"(looked for tags {', '.join(preset.tag_patterns)})",
                             hint="name one with --image TAG, or give the bundle fetched for this hardware")
        image = f"{default_image}:{tag}"
    wanted = str(ImageRef.parse(image))
    found = [im for im in held if str(ImageRef.parse(im.ref)) == wanted]
    if not found:
        names = ", ".join(sorted({im.ref for im in index.images})) or "no images"
        raise UsageError(f"bundle {bundle_dir} holds no image {image}; it holds {names}")
    platforms = " and ".join(str(im.platform) for im in found)
    if architecture is not None:
        arch = Platform.parse(architecture).architecture
        found = [im for im in found if im.platform.architecture == arch]
        if not found:
            raise UsageError(f"bundle {bundle_dir} holds {image} for {platforms}, not for {arch}")
    if len(found) > 1:
        archs = " or ".join(f"--arch {im.platform.architecture}" for im in found)
        raise UsageError(f"bundle {bundle_dir} holds {image} for {platforms}: a Pod names one manifest",
                         hint=f"name the nodes' architecture with {archs} (the Pod is pinned to it), or leave out "
                              "--bundle to name the image by tag")
    return BundleImage(found[0].ref, str(found[0].manifest_digest), found[0].platform.architecture)


# --- the workload ----------------------------------------------------------------------------


def quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity: `1Gi`, `512Mi`, `64Ki`, or plain bytes."""
    for unit, scale in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def volume_name(path: str, taken: Sequence[str]) -> str:
    """A DNS label for a volume, from its path in the container (`/root/.cache` -> `root-cache`), unique."""
    base = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", path.lower())).strip("-")[:56].strip("-") or "volume"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    return name


def literal(text: str) -> str:
    """`text` as Kubernetes passes it on: it expands `$(NAME)` and turns `$$` into `$` in args and env values,
    where docker passes every character; each `$` doubled comes out as written."""
    return text.replace("$", "$$")


def manifest(spec: RunSpec, preset: Preset, options: KubeOptions, architecture: Optional[str] = None) -> Dict[str, Any]:
    """The Pod (or Deployment) for the spec, as plain data; raises UsageError for what Kubernetes cannot say."""
    resource = _checked(spec, preset, options)
    mounts, volumes = _volumes(spec, options)
    pod: Dict[str, Any] = {}
    if spec.network == "host":
        pod.update({"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"})
    if architecture:
        pod["nodeSelector"] = {"kubernetes.io/arch": architecture}
    pod.update({"containers": [_container(spec, resource, mounts)], "volumes": volumes})
    name = spec.name or ""
    labels = {LABEL: name}
    if options.kind == "pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": pod}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}


def _checked(spec: RunSpec, preset: Preset, options: KubeOptions) -> str:
    """The NPUs' resource name, once what Kubernetes cannot say is refused (UsageError)."""
    if options.kind not in KINDS:
        raise UsageError(f"invalid --kind {options.kind!r}: expected {' or '.join(KINDS)}")
    resource = options.resource_name if options.resource_name is not None else preset.resource_name
    if not resource:
        raise UsageError(f"preset {preset.name} names no Kubernetes resource for its NPUs",
                         hint="name the device plugin's: --resource-name huawei.com/Ascend910 (MindCluster, A2/A3), "
                              "huawei.com/Ascend310P (300I Duo), or your plugin's")
    if not _DNS_LABEL_RE.match(spec.name or ""):
        raise UsageError(f"invalid --name {spec.name or ''!r} for Kubernetes: lowercase letters, digits and '-', "
                         "starting and ending with a letter or digit, at most 63 characters")
    if spec.network not in (None, "host"):
        raise UsageError(f"--net {spec.network} has no Kubernetes equivalent: a Pod is on the cluster's network, "
                         "or with --net host (or --multi-node) on the node's")
    if spec.detach or not spec.remove:
        raise UsageError("-d and --no-rm have no meaning for --format k8s: the cluster runs the workload "
                         "in the background and removes it when you delete it (kubectl delete)")
    return parse_resource_name(resource)


def _volumes(spec: RunSpec, options: KubeOptions) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """The container's volumeMounts and the Pod's volumes: /dev/shm in memory, each mount as a hostPath (a model's
    placed directory must be there: type Directory), then a model's modelcar image as an image volume."""
    mounts: List[Dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    volumes: List[Dict[str, Any]] = [{"name": SHM_VOLUME,
                                      "emptyDir": {"medium": "Memory", "sizeLimit": quantity(spec.shm_size)}}]
    taken = [SHM_VOLUME]
    for m in spec.mounts:
        vname = volume_name(m.container, taken)
        taken.append(vname)
        # the preset's driver and tool paths are read-only; its caches (create) and -v mounts as written
        readonly = m.readonly or not (m.create or m.user)
        mounts.append({"name": vname, "mountPath": m.container, **({"readOnly": True} if readonly else {})})
        host: Dict[str, Any] = {"path": m.host}
        if m.create:
            host["type"] = "DirectoryOrCreate"
        elif spec.model is not None and spec.model.image is None and m == spec.model.mount:
            host["type"] = "Directory"  # an empty directory made in its place would serve nothing
        volumes.append({"name": vname, "hostPath": host})
    if spec.model is not None and spec.model.image is not None:
        vname = volume_name(MODEL_VOLUME, taken)
        # never Always (the default of a :latest tag): an air-gapped node cannot pull again, it has the image loaded
        volumes.append({"name": vname, "image": {"reference": spec.model.image, "pullPolicy": "IfNotPresent"}})
        if options.version is not None and options.version >= IMAGE_SUBPATH_SINCE:
            mounts.append({"name": vname, "mountPath": MODELCAR_PATH, "readOnly": True, "subPath": modelcar.ROOT})
        else:
            mounts.append({"name": vname, "mountPath": MODELCAR_MOUNT, "readOnly": True})
    return mounts, volumes


def _container(spec: RunSpec, resource: str, mounts: List[Dict[str, Any]]) -> Dict[str, Any]:
    container: Dict[str, Any] = {"name": spec.name or "", "image": spec.image, "imagePullPolicy": "IfNotPresent"}
    if spec.command:
        # docker run IMAGE CMD... replaces the image's CMD: args, not command
        container["args"] = [literal(a) for a in spec.command]
    else:
        container.update({"stdin": True, "tty": True})  # an image whose command is a shell stays up, as -it does
    if spec.env:
        container["env"] = [{"name": k, "value": literal(v)} for k, v in spec.env]
    if spec.ports:
        container["ports"] = [{"containerPort": p.container, **({"protocol": p.proto.upper()} if p.proto != "tcp" else {})}
                              for p in spec.ports]
    count = len(spec.cards)
    container["resources"] = {"limits": {resource: count}, "requests": {resource: count}}
    if spec.privileged:
        container["securityContext"] = {"privileged": True}
    container["volumeMounts"] = mounts
    return container


# --- YAML ------------------------------------------------------------------------------------

# A string is written plain only when it starts with a letter or "/" and holds nothing YAML gives a
# meaning to (no ": ", " #", quotes, flow brackets, leading indicators): then no reader takes it for a
# number, a date, a base-60 integer or a null. The words YAML 1.1 reads as booleans or null are quoted.
_PLAIN_RE = re.compile(r"^[A-Za-z/][A-Za-z0-9_./@:+=-]*\Z")
_RESERVED = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}
# Left raw by json.dumps(ensure_ascii=False) but not printable in YAML, or a line break there (NEL, LS, PS)
_ESCAPE_RE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar: JSON's escapes (all valid in YAML) plus \\uXXXX for what YAML cannot hold raw."""
    return _ESCAPE_RE.sub(lambda m: "\\u%04x" % ord(m.group()), json.dumps(text, ensure_ascii=False))


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if _PLAIN_RE.match(value) and not value.endswith(":") and value.lower() not in _RESERVED:
            return value
        return _quoted(value)
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _emit(value: Any, indent: int, out: List[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            head = f"{pad}{_scalar(str(key))}:"
            if isinstance(item, (dict, list)) and item:
                out.append(head)
                _emit(item, indent + 2 if isinstance(item, dict) else indent, out)
            elif isinstance(item, (dict, list)):
                out.append(f"{head} {'{}' if isinstance(item, dict) else '[]'}")
            else:
                out.append(f"{head} {_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                lines: List[str] = []
                _emit(item, indent + 2, lines)
                out.append(f"{pad}- {lines[0][indent + 2:]}")
                out.extend(lines[1:])
            elif isinstance(item, (dict, list)):
                if item:
                    raise TypeError("a list in a list is not written")
                out.append(f"{pad}- {'{}' if isinstance(item, dict) else '[]'}")
            else:
                out.append(f"{pad}- {_scalar(item)}")
    else:
        out.append(pad + _scalar(value))


def to_yaml(document: Dict[str, Any]) -> str:
    """One YAML document (block style, lists at their key's indent as kubectl writes them), ending in a newline."""
    lines: List[str] = []
    _emit(document, 0, lines)
    return "\n".join(lines) + "\n"
