"""`imgtool push`: a bundle's images and models into a registry inside the air-gapped network.

One push, then every node `docker pull`s from that registry (an A3 SuperPoD does not load the
same 6.5 GB bundle on each node). The pipeline's bundle → registry: the bundle is the source
(ends/bundle_source.py: blobs read in place from the parts, never extracted, or a `--compress`ed
bundle's archive decompressed once, in order; each blob checked against its digest on the way),
the registry the destination (ends/registry_dest.py: a blob it holds is skipped (HEAD), one
another repository of this push holds is mounted, the rest uploaded; then the manifests byte for
byte, so their digests and the image IDs stay the same). This module is the verb: the target, the
client, the copy, the result.

Target repository = NAMESPACE + the image's repository path without its registry host:
`quay.io/ascend/vllm-ascend:v1` pushed `--to reg.local:5000/mirror` becomes
`reg.local:5000/mirror/ascend/vllm-ascend:v1`. A model's ModelPack artifact goes to NAMESPACE + HUB/org/name, under
its commit and revision (ends/registry_models.py).
"""

import re
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from .ends.bundle_source import BundleSource
from .ends.registry_dest import CHUNK, PushedImage, PushResult, RegistryDestination, target_repository
from .errors import RegistryError, UsageError
from .pipeline import copy
from .progress import Progress
from .registry import RegistryClient

__all__ = ["CHUNK", "PushedImage", "PushResult", "connect", "parse_target", "push_bundle", "target_repository"]

_TARGET = re.compile(r"^(?P<host>[A-Za-z0-9.-]+(?::[0-9]+)?|\[[0-9A-Fa-f:]+\](?::[0-9]+)?)"
                     r"(?:/(?P<ns>[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*))?/?$")


def parse_target(text: str) -> Tuple[str, str]:
    """`HOST[:PORT][/NAMESPACE]` -> (host, namespace or ""); raises UsageError."""
    text = (text or "").strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    m = _TARGET.match(text)
    if not m:
        raise UsageError(f"invalid --to {text!r}: expected HOST[:PORT][/NAMESPACE], e.g. harbor.local/ascend")
    return m.group("host"), m.group("ns") or ""


def connect(host: str, insecure: bool, ca_cert: Optional[str], waits: Dict[str, Any]) -> Tuple[RegistryClient, str]:
    """An HTTPS client for the registry `host`, and the scheme it answered on; with `insecure`, unverified HTTPS or
    else plain HTTP (as dockerd's insecure-registries). Raises UsageError, RegistryError."""
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
                progress: Progress, chunk: int = CHUNK, waits: Optional[Dict[str, Any]] = None,
                expect: Optional[str] = None, signers: Optional[str] = None) -> PushResult:
    """Push every image of the bundle to the registry `to`; `waits`: the client's read_timeout, response_timeout
    and min_rate (commands/push.py's, from the environment; None: the defaults). The bundle is checked as `load`
    checks it before the registry is asked anything (the signature policy, `expect`, bundle.json against SHA256SUMS
    and the files, every part there at its size: verify.check_source), then every blob as it is read. Raises
    UsageError, SignatureError/VerifyError (exit 3, nothing pushed), RegistryError, ImgtoolError (a delta bundle
    whose base the registry lacks)."""
    from .bundle.verify import check_source

    started = time.monotonic()
    host, namespace = parse_target(to)
    index, report = check_source(Path(bundle_dir), signers=signers, expect=expect, doing="push", progress=progress)
    source = BundleSource(Path(bundle_dir), index)
    client, scheme = connect(host, insecure, ca_cert, waits or {})
    destination = RegistryDestination(client, host, namespace, scheme, progress, chunk=chunk, omitted=source.omitted,
                                      prefer=source.order, rewind=source.rewind, name=str(bundle_dir), to=to,
                                      models=index.models)
    try:
        result = copy(source, destination).result
    finally:
        source.finish()  # a refusal in plan (before the copy started the source) leaves no reading thread either
    result.seconds = time.monotonic() - started
    result.warnings[:0] = report.warnings
    return result
