"""`imgtool push`: a bundle's images into a registry inside the air-gapped network.

One push, then every node `docker pull`s from that registry (an A3 SuperPoD does not load the
same 6.5 GB bundle on each node). Blobs are read in place from the bundle's parts (never
extracted), each checked against its digest on the way; a blob the registry already holds
(HEAD) is skipped, one another repository of this push holds is mounted, the rest are uploaded
(monolithic when small, PATCH chunks when big). Then the manifests, byte for byte as the
source registry served them (so their digests, and the image IDs, stay the same).

Target repository = NAMESPACE + the image's repository path without its registry host:
`quay.io/ascend/vllm-ascend:v1` pushed `--to reg.local:5000/mirror` becomes
`reg.local:5000/mirror/ascend/vllm-ascend:v1`.
"""

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .bundle.format import BundleImage
from .bundle.layout import platform_index
from .bundle.reader import BlobReader, read_index
from .errors import ImgtoolError, RegistryError, UsageError
from .model import Digest, format_size
from .progress import Progress
from .registry import RegistryClient

CHUNK = 16 * 1024 * 1024  # blobs above this go up as PATCH chunks of this size (bounded memory)
_TARGET = re.compile(r"^(?P<host>[A-Za-z0-9.-]+(?::[0-9]+)?|\[[0-9A-Fa-f:]+\](?::[0-9]+)?)"
                     r"(?:/(?P<ns>[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*))?/?$")


@dataclass
class PushedImage:
    ref: str
    target: str  # host/repo:tag as `docker pull` takes it
    manifest_digest: str
    platform: str

    def to_json(self) -> dict:
        return {"ref": self.ref, "target": self.target, "manifest_digest": self.manifest_digest,
                "platform": self.platform}


@dataclass
class PushResult:
    registry: str
    scheme: str
    images: List[PushedImage]
    blobs_uploaded: int = 0
    bytes_uploaded: int = 0
    blobs_present: int = 0
    blobs_mounted: int = 0
    seconds: float = 0.0
    warnings: List[str] = field(default_factory=list)
    indexes: List[dict] = field(default_factory=list)  # multi-arch tags: the index pushed for each

    def to_json(self) -> dict:
        return {"registry": self.registry, "scheme": self.scheme, "images": [im.to_json() for im in self.images],
                "blobs_uploaded": self.blobs_uploaded, "bytes_uploaded": self.bytes_uploaded,
                "blobs_present": self.blobs_present, "blobs_mounted": self.blobs_mounted,
                "indexes": self.indexes, "seconds": round(self.seconds, 3), "warnings": self.warnings}

    def describe(self) -> str:
        lines = [f"pushed {len(self.images)} image(s) to {self.registry} in {self.seconds:.1f} s: "
                 f"{self.blobs_uploaded} blobs uploaded ({format_size(self.bytes_uploaded)}), "
                 f"{self.blobs_mounted} mounted, {self.blobs_present} already there"]
        width = max(len(im.target) for im in self.images)
        for im in self.images:
            lines.append(f"  {im.target.ljust(width)}  {im.platform}  {im.manifest_digest}")
        for ix in self.indexes:
            lines.append(f"  {ix['target']}  index over {', '.join(ix['platforms'])}  {ix['digest']}")
        first = self.indexes[0]["target"] if self.indexes else self.images[0].target
        lines.append("nodes: docker pull " + first)
        return "\n".join(lines)


def parse_target(text: str) -> Tuple[str, str]:
    """`HOST[:PORT][/NAMESPACE]` -> (host, namespace or ""); raises UsageError."""
    text = (text or "").strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    m = _TARGET.match(text)
    if not m:
        raise UsageError(f"invalid --to {text!r}: expected HOST[:PORT][/NAMESPACE], e.g. harbor.local/ascend")
    return m.group("host"), m.group("ns") or ""


def target_repository(namespace: str, image: BundleImage) -> str:
    """NAMESPACE + the image's repository path without the registry host."""
    repo = image.image_ref.repository
    return f"{namespace}/{repo}" if namespace else repo


def _client(host: str, insecure: bool, ca_cert: Optional[str], waits: Dict[str, Any]) -> Tuple[RegistryClient, str]:
    """An HTTPS client; with --insecure, unverified HTTPS or else plain HTTP (as dockerd's insecure-registries)."""
    if ca_cert and not Path(ca_cert).is_file():
        raise UsageError(f"--ca-cert {ca_cert}: no such file")
    client = RegistryClient(f"https://{host}", insecure=insecure, ca_cert=ca_cert, **waits)
    try:
        client.ping()
        return client, "https"
    except RegistryError as e:
        if not insecure:
            raise RegistryError(f"cannot reach the registry {host} over HTTPS: {e.message}",
                                hint="give its CA with --ca-cert FILE, or --insecure for a plain-HTTP registry") from e
    client = RegistryClient(f"http://{host}", insecure=True, **waits)
    client.ping()
    return client, "http"


def push_bundle(bundle_dir: Path, to: str, *, insecure: bool = False, ca_cert: Optional[str] = None,
                progress: Progress, chunk: int = CHUNK, waits: Optional[Dict[str, Any]] = None) -> PushResult:
    """Push every image of the bundle to the registry `to`; `waits`: the client's read_timeout, response_timeout
    and min_rate (commands/push.py's, from the environment; None: the defaults). Raises UsageError, VerifyError,
    RegistryError, ImgtoolError (a delta bundle whose base the registry lacks)."""
    started = time.monotonic()
    bundle_dir = Path(bundle_dir)
    index, _ = read_index(bundle_dir)
    reader = BlobReader(bundle_dir, index)
    host, namespace = parse_target(to)
    client, scheme = _client(host, insecure, ca_cert, waits or {})
    targets = [(im, target_repository(namespace, im)) for im in index.images]
    _check_delta_base(client, targets, bundle_dir, host, to)
    result = PushResult(host, scheme, [])
    blobs = _plan_blobs(client, targets)
    result.blobs_present = blobs.present
    _push_blobs(client, reader, blobs, result, progress, chunk)
    for repo, images in _by_tag(targets):
        _push_manifests(client, reader, host, repo, images, result)
    result.seconds = time.monotonic() - started
    return result


@dataclass
class _BlobPlan:
    """The blobs the registry lacks, in push order, and where it holds the others (to mount from)."""

    todo: List[Tuple[str, Digest]] = field(default_factory=list)  # (repository, blob)
    where: Dict[Digest, str] = field(default_factory=dict)  # blob -> a repository of this registry known to hold it
    present: int = 0  # (repository, blob) pairs already there


def _check_delta_base(client: RegistryClient, targets: List[Tuple[BundleImage, str]], bundle_dir: Path, host: str,
                      to: str) -> None:
    """A delta bundle lacks some layers: the registry must hold them already (the base pushed before);
    raises ImgtoolError before anything is pushed."""
    missing = [(repo, layer) for im, repo in targets for layer in im.omitted if not client.has_blob(repo, layer.digest)]
    if not missing:
        return
    names = list(dict.fromkeys(n for _, layer in missing for n in layer.provided_by[:1]))
    repo, first = missing[0]
    raise ImgtoolError(f"cannot push {bundle_dir}: it is a delta bundle and {host}/{repo} lacks "
                       f"{len(missing)} of the layers it leaves out (first: {first.digest.short}); "
                       "nothing was pushed",
                       hint=f"push the bundle of {', '.join(names)} to {to} first, or fetch a full bundle")


def _plan_blobs(client: RegistryClient, targets: List[Tuple[BundleImage, str]]) -> _BlobPlan:
    """Ask the registry (HEAD) for each config and layer of each target repository, once per pair."""
    plan = _BlobPlan()
    seen = set()
    for im, repo in targets:
        for digest in [im.image_id] + [x.digest for x in im.layers if not x.omitted]:
            if (repo, digest) in seen:
                continue
            seen.add((repo, digest))
            if client.has_blob(repo, digest):
                plan.present += 1
                plan.where.setdefault(digest, repo)
            else:
                plan.todo.append((repo, digest))
    return plan


def _push_blobs(client: RegistryClient, reader: BlobReader, plan: _BlobPlan, result: PushResult, progress: Progress,
                chunk: int) -> None:
    """Each blob of the plan mounted from another repository of this push when one holds it, else uploaded."""
    with progress.bar(sum(reader.size(d) for _, d in plan.todo), "push") as bar:
        for repo, digest in plan.todo:
            url = None
            source = plan.where.get(digest)
            if source and source != repo:
                url = client.mount_blob(repo, digest, source)  # None: mounted; else where to upload instead
                if url is None:
                    result.blobs_mounted += 1
                    bar.update(reader.size(digest))
                    continue
            _upload(client, reader, repo, digest, url, bar, chunk)
            result.blobs_uploaded += 1
            result.bytes_uploaded += reader.size(digest)
            plan.where.setdefault(digest, repo)


def _by_tag(targets: List[Tuple[BundleImage, str]]) -> List[Tuple[str, List[BundleImage]]]:
    """(repository, the images of one tag there): one image, or one per platform of a multi-arch tag."""
    groups: Dict[Tuple[str, str], List[BundleImage]] = {}
    for im, repo in targets:
        groups.setdefault((repo, im.ref), []).append(im)
    return [(repo, images) for (repo, _ref), images in groups.items()]


def _push_manifests(client: RegistryClient, reader: BlobReader, host: str, repo: str, images: List[BundleImage],
                    result: PushResult) -> None:
    """The manifests of one tag: a single platform under the tag; several by digest, then an index under the tag."""
    tag = images[0].image_ref.tag
    index_tag = tag if len(images) > 1 else None
    for im in images:
        _push_manifest(client, reader, host, repo, im, tag if tag and index_tag is None else None, result)
    if index_tag is not None:
        _push_index(client, host, repo, index_tag, images, result)


def _push_manifest(client: RegistryClient, reader: BlobReader, host: str, repo: str, im: BundleImage,
                   tag: Optional[str], result: PushResult) -> None:
    """One platform manifest, byte for byte from the bundle, under `tag` or else its digest; raises RegistryError
    when the registry stores it under another digest."""
    data = b"".join(reader.chunks(im.manifest_digest))
    reference = tag or str(im.manifest_digest)
    got = client.put_manifest(repo, reference, data, im.manifest_media_type)
    if got is not None and got != im.manifest_digest:
        raise RegistryError(f"{host}/{repo}: the registry stored the manifest as {got}, "
                            f"not {im.manifest_digest}")
    target = f"{host}/{repo}{':' if tag else '@'}{reference}"
    result.images.append(PushedImage(im.ref, target, str(im.manifest_digest), str(im.platform)))
    if im.upstream is not None:  # fetch rewrote layers: the bundle holds its own manifest
        theirs = Digest.parse(im.upstream["manifest_digest"])
        result.warnings.append(
            f"{target} ({im.platform}) is the manifest this bundle holds: fetch rewrote "
            f"its layers (--layers {im.upstream['layers']}), so its digest {im.manifest_digest.short} differs "
            f"from upstream's {theirs.short}; the image ID (config) is upstream's")


def _push_index(client: RegistryClient, host: str, repo: str, tag: str, images: List[BundleImage],
                result: PushResult) -> None:
    """An index over the platforms of a multi-arch tag, under the tag (layout.platform_index, as `serve` answers it)."""
    media, body = platform_index(images)
    digest = client.put_manifest(repo, tag, body, media) or Digest.of(body)
    upstream = images[0].index_digest
    result.indexes.append({"target": f"{host}/{repo}:{tag}", "digest": str(digest),
                           "platforms": [str(im.platform) for im in images],
                           "upstream_index_digest": str(upstream) if upstream else None})
    if upstream and str(upstream) != str(digest):
        result.warnings.append(
            f"{host}/{repo}:{tag} is an index over the {len(images)} platforms in the bundle; its digest "
            f"{digest.short} differs from upstream's {upstream.short} (pull by tag, or by "
            "the platform manifest digests" + (")" if any(im.upstream for im in images) else
                                              ", which are upstream's)"))


def _upload(client: RegistryClient, reader: BlobReader, repo: str, digest: Digest, url: Optional[str], bar,
            chunk: int) -> None:
    """Upload one blob from the bundle: one PUT when small, PATCH chunks then PUT when big."""
    url = url or client.start_upload(repo)
    size = reader.size(digest)
    if size <= chunk:
        data = b"".join(reader.chunks(digest))
        client.finish_upload(repo, url, digest, data)
        bar.update(size)
        return
    buf = bytearray()
    pos = 0
    for data in reader.chunks(digest):
        buf += data
        while len(buf) >= chunk:
            url = client.upload_chunk(repo, url, bytes(buf[:chunk]), pos)
            pos += chunk
            del buf[:chunk]
            bar.update(chunk)
    # the digest was checked when `chunks` ended: only now is the upload committed
    client.finish_upload(repo, url, digest, bytes(buf))
    bar.update(len(buf))
