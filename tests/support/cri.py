"""The kubelet's side of an image pull, and of a Pod: the CRI ImageService and RuntimeService of a containerd's CRI
plugin, over gRPC.

`crictl` is not packaged for Debian, so the tests speak CRI (k8s.io/cri-api, runtime.v1) themselves:
grpcio for the transport, and the few protobuf messages a pull needs encoded here by hand (field
numbers from cri-api's api.proto), so no generated code and no protobuf compiler. What the kubelet
does for a Pod's image: ImageStatus (present?), else PullImage; both resolve through the CRI plugin's
registry configuration (`config_path`, the hosts.toml mirrors), not through ctr's. What it does for a Pod
(RuntimeService): RunPodSandbox (here with the node's network: no CNI), CreateContainer with the Pod's mounts
(an image volume is a Mount whose `image` names the image the kubelet pulled: KEP-4639), StartContainer,
ExecSync; then StopPodSandbox and RemovePodSandbox, which take its containers with it.
"""

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

import grpc

_SERVICE = "/runtime.v1.ImageService/"
_RUNTIME = "/runtime.v1.RuntimeService/"
NODE_NETWORK = 2  # NamespaceMode.NODE: hostNetwork


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): strings and embedded messages."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _read_varint(data: bytes, i: int) -> Tuple[int, int]:
    n = shift = 0
    while True:
        byte = data[i]
        i += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, i


def _fields(data: bytes) -> Iterator[Tuple[int, object]]:
    """(field number, value) of a message: bytes for wire type 2, int for varints; others skipped."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            yield number, value
        elif wire == 2:
            size, i = _read_varint(data, i)
            yield number, data[i:i + size]
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")


def _image_spec(ref: str) -> bytes:
    return _field(1, ref.encode())  # ImageSpec.image


@dataclass
class CriImage:
    """runtime.v1.Image, the fields a test looks at."""

    id: str
    repo_tags: List[str]
    repo_digests: List[str]
    size: int
    pinned: bool = False  # the kubelet's image GC skips it


class ImageService:
    """The CRI image service at a containerd socket."""

    def __init__(self, socket: str, timeout: float = 300):
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: str, request: bytes) -> bytes:
        return self.channel.unary_unary(_SERVICE + method)(request, timeout=self.timeout)

    def pull(self, ref: str) -> str:
        """PullImage as the kubelet sends it (no auth: the mirror is the node's business); the image ref
        (the image's ID) the runtime answers. Raises grpc.RpcError with the runtime's message."""
        reply = self._call("PullImage", _field(1, _image_spec(ref)))
        return next((v.decode() for n, v in _fields(reply) if n == 1 and isinstance(v, bytes)), "")

    def status(self, ref: str) -> Optional[CriImage]:
        """ImageStatus: the image the runtime has under `ref`, or None (the kubelet then pulls)."""
        reply = self._call("ImageStatus", _field(1, _image_spec(ref)))
        image = next((v for n, v in _fields(reply) if n == 1 and isinstance(v, bytes)), None)
        if image is None:
            return None
        values: Dict[int, List[object]] = {}
        for n, v in _fields(image):
            values.setdefault(n, []).append(v)

        def strings(n: int) -> List[str]:
            return [v.decode() for v in values.get(n, []) if isinstance(v, bytes)]

        size = values.get(4, [0])[0]
        pinned = values.get(8, [0])[0]  # Image.pinned (bool, field 8 of cri-api's runtime.v1 Image)
        return CriImage(id=(strings(1) or [""])[0], repo_tags=strings(2), repo_digests=strings(3),
                        size=size if isinstance(size, int) else 0, pinned=pinned == 1)

    def remove(self, ref: str) -> None:
        """RemoveImage (what the kubelet's image GC sends); absent images are not an error."""
        self._call("RemoveImage", _field(1, _image_spec(ref)))


def _varint_field(number: int, value: int) -> bytes:
    """A varint field (wire type 0): ints, bools, enums."""
    return _varint(number << 3) + _varint(value)


def _strings(number: int, values) -> bytes:
    return b"".join(_field(number, v.encode()) for v in values)


@dataclass
class CriMount:
    """runtime.v1.Mount: a host path, or (`image`: the image ID the kubelet's pull returned) an image volume."""

    container_path: str
    host_path: str = ""
    readonly: bool = True
    image: str = ""
    image_sub_path: str = ""

    def encode(self) -> bytes:
        out = _field(1, self.container_path.encode())
        if self.host_path:
            out += _field(2, self.host_path.encode())
        if self.readonly:
            out += _varint_field(3, 1)
        if self.image:
            out += _field(9, _image_spec(self.image))  # Mount.image (cri-api v1.31+)
        if self.image_sub_path:
            out += _field(10, self.image_sub_path.encode())  # Mount.image_sub_path (v1.33+)
        return out


class RuntimeService:
    """The CRI runtime service at a containerd socket: a Pod sandbox on the node's network and its containers."""

    def __init__(self, socket: str, timeout: float = 120):
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: str, request: bytes) -> bytes:
        return self.channel.unary_unary(_RUNTIME + method)(request, timeout=self.timeout)

    @staticmethod
    def sandbox_config(name: str, uid: str, namespace: str = "default") -> bytes:
        """PodSandboxConfig of a Pod with hostNetwork: metadata, and linux.security_context.namespace_options."""
        metadata = _field(1, name.encode()) + _field(2, uid.encode()) + _field(3, namespace.encode())
        namespaces = _varint_field(1, NODE_NETWORK)
        linux = _field(2, _field(1, namespaces))
        return _field(1, metadata) + _field(8, linux)  # no hostname: the node's UTS namespace is shared

    def run_pod_sandbox(self, config: bytes) -> str:
        reply = self._call("RunPodSandbox", _field(1, config))
        return next(v.decode() for n, v in _fields(reply) if n == 1 and isinstance(v, bytes))

    def create_container(self, sandbox_id: str, sandbox_config: bytes, name: str, image: str,
                         command: List[str], mounts: List[CriMount]) -> str:
        """CreateContainer: `image` (its ID, as the kubelet names it), `command`, `mounts`; the container's ID."""
        config = (_field(1, _field(1, name.encode())) + _field(2, _image_spec(image)) + _strings(3, command)
                  + b"".join(_field(7, m.encode()) for m in mounts))
        reply = self._call("CreateContainer", _field(1, sandbox_id.encode()) + _field(2, config) + _field(3, sandbox_config))
        return next(v.decode() for n, v in _fields(reply) if n == 1 and isinstance(v, bytes))

    def start_container(self, container_id: str) -> None:
        self._call("StartContainer", _field(1, container_id.encode()))

    def exec_sync(self, container_id: str, cmd: List[str], timeout: int = 60) -> Tuple[int, bytes]:
        """(exit code, stdout): containerd 2.1's ExecSync returns no stderr."""
        reply = self._call("ExecSync", _field(1, container_id.encode()) + _strings(2, cmd) + _varint_field(3, timeout))
        out, code = b"", 0
        for n, v in _fields(reply):
            if n == 1 and isinstance(v, bytes):
                out = v
            elif n == 3 and isinstance(v, int):
                code = v
        return code, out

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        """StopPodSandbox, then RemovePodSandbox (its containers go with it)."""
        self._call("StopPodSandbox", _field(1, sandbox_id.encode()))
        self._call("RemovePodSandbox", _field(1, sandbox_id.encode()))
