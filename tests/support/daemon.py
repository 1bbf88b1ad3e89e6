"""The `docker` CLI against the test dockerd, and cleanup of what a test put into it."""

import os
import shutil
import subprocess
from typing import List, Optional, Union


class DockerCLIError(RuntimeError):
    def __init__(self, proc: subprocess.CompletedProcess):
        err = proc.stderr if isinstance(proc.stderr, str) else (proc.stderr or b"").decode(
            "utf-8", "replace")
        super().__init__(f"{' '.join(map(str, proc.args))} exited {proc.returncode}: {err.strip()}")
        self.proc = proc


class DockerCLI:
    """`docker -H <test daemon> ...`; call it like docker_cli("image", "inspect", ref)."""

    def __init__(self, docker_host: str, binary: Optional[str] = None):
        self.docker_host = docker_host
        self.binary = binary or os.environ.get("IMGTOOL_TEST_DOCKER_CLI") or shutil.which("docker")
        if not self.binary:
            raise RuntimeError("the docker CLI is not installed (apt-get install docker.io)")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("DOCKER_")}  # no context/TLS/host from the developer's shell
        env["DOCKER_CLI_HINTS"] = "false"
        self.env = env

    def __call__(self, *args, check: bool = True, input: Union[bytes, str, None] = None,
                 timeout: float = 300, text: bool = True) -> subprocess.CompletedProcess:
        """Run docker; raises DockerCLIError (with stderr) on a nonzero exit when check."""
        if text and isinstance(input, bytes):
            text = False
        proc = subprocess.run(
            [self.binary, "-H", self.docker_host, *map(str, args)],
            input=input, capture_output=True, text=text, timeout=timeout, env=self.env,
        )
        if check and proc.returncode != 0:
            raise DockerCLIError(proc)
        return proc

    def image_ids(self) -> List[str]:
        out = self("image", "ls", "-a", "-q", "--no-trunc").stdout
        return sorted(set(out.split()))

    def inspect_image(self, ref: str) -> Optional[dict]:
        """`docker image inspect` as a dict, or None when the image is not there."""
        import json

        proc = self("image", "inspect", ref, check=False)
        if proc.returncode != 0:
            return None
        return json.loads(proc.stdout)[0]

    def load(self, archive_path: Union[str, os.PathLike]) -> subprocess.CompletedProcess:
        return self("load", "-i", os.fspath(archive_path))

    # -- image identity, which depends on the engine's image store ----------------------------

    @property
    def containerd_store(self) -> bool:
        """True for the containerd image store (Docker 29's default; 26.1 with containerd-snapshotter)."""
        if self.docker_host not in _STORES:
            out = self("info", "--format", "{{json .DriverStatus}}").stdout
            _STORES[self.docker_host] = "io.containerd.snapshotter.v1" in out
        return _STORES[self.docker_host]

    def ids_of(self, image) -> List[str]:
        """The IDs this Docker may give a test image (tests.support.images.Image) once loaded or pulled.

        A graphdriver store: the config digest, always. The containerd store: the manifest digest it
        was imported by: the OCI twin a bundle's index.json names for a Docker v2 manifest, or the
        registry's manifest digest (an OCI manifest, or `docker pull`).
        """
        if not self.containerd_store:
            return [image.config_digest]
        from imgtool.bundle import layout

        return list(dict.fromkeys([str(layout.oci_descriptor_digest(bundle_view(image))), image.manifest_digest]))

    def bundle_id(self, image) -> str:
        """The ID this Docker gives the test image when it is loaded from a bundle (or its archive)."""
        return self.ids_of(image)[0]

    def find(self, image) -> Optional[dict]:
        """`docker image inspect` of the test image by the ID this Docker gives it, or None."""
        for image_id in self.ids_of(image):
            found = self.inspect_image(image_id)
            if found is not None:
                return found
        return None

    def holds(self, ref: str, image) -> bool:
        """Docker has `ref`, and it is `image` (by ID as this store names it, and by its layers)."""
        found = self.inspect_image(ref)
        return (found is not None and found["Id"] in self.ids_of(image)
                and found["RootFS"]["Layers"] == list(image.diff_ids))


_STORES: dict = {}


def bundle_view(image):
    """bundle.json's view (a BundleImage) of a test image, to ask imgtool.bundle.layout about it."""
    from imgtool.bundle.format import BundleImage, Layer
    from imgtool.model import Digest, Platform

    from .images import MEDIA_TYPES

    manifest_type, _, layer_type, _ = MEDIA_TYPES[image.media]
    layers = tuple(Layer(Digest.parse(x.digest), x.size, Digest.parse(x.diff_id), x.media_type or layer_type)
                   for x in image.layers)
    return BundleImage("example.com/test:v1", "", Platform.parse(image.platform), None,
                       Digest.parse(image.manifest_digest), manifest_type, len(image.manifest_bytes),
                       Digest.parse(image.config_digest), len(image.config_bytes), layers)


class DaemonCleanup:
    """Collects images/containers a test created; removes them when the test ends."""

    def __init__(self, cli: DockerCLI):
        self.cli = cli
        self.images: List[str] = []
        self.containers: List[str] = []

    def image(self, *refs: str) -> None:
        """Remove these images (tags or IDs) at the end of the test."""
        self.images.extend(refs)

    add = image

    def container(self, *names: str) -> None:
        self.containers.extend(names)

    def run(self) -> List[str]:
        """Remove everything registered; returns error messages (removal is best effort)."""
        errors = []
        if self.containers:
            proc = self.cli("rm", "-f", *self.containers, check=False)
            if proc.returncode != 0 and "No such container" not in proc.stderr:
                errors.append(proc.stderr.strip())
        for ref in reversed(self.images):
            proc = self.cli("rmi", "-f", ref, check=False)
            if proc.returncode != 0 and "No such image" not in proc.stderr:
                errors.append(proc.stderr.strip())
        self.images.clear()
        self.containers.clear()
        return errors


class DockerAPIRecorder:
    """A TCP listener on loopback relaying to a dockerd's unix socket, recording each request line.

    `DOCKER_HOST=tcp://<address>` then shows which API paths a client used (e.g. that a client
    pinned to API 1.39 never asked for anything newer). With `hold_after=N` the daemon's answers
    stop after N bytes in total until `release()`; `reached` is set when they do, so a test acts
    at a known point of a `docker save` stream (a kill mid-layer) instead of after a guessed sleep.
    With `cut=True` the connection is closed there instead: the daemon's answer ends mid-stream.
    With `keep=True` every byte the client sent the daemon is kept in `uploaded` (what a load sent, for a test to
    search: keep it small).
    """

    def __init__(self, docker_host: str, hold_after: Optional[int] = None, cut: bool = False, keep: bool = False):
        import re
        import socket
        import threading

        self.hold_after, self.sent, self.cut, self.keep = hold_after, 0, cut, keep
        self.uploaded = bytearray()
        self.reached, self.released = threading.Event(), threading.Event()

        self.target = docker_host[len("unix://"):]
        self.requests: List[str] = []
        self._lock = threading.Lock()
        self._request = re.compile(rb"(?:^|\r\n)(GET|POST|PUT|DELETE|HEAD) (/\S*) HTTP/1\.[01]\r\n")
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.address = "%s:%d" % self._server.getsockname()
        self._threads: List[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.target)
            for src, dst, record in ((client, upstream, True), (upstream, client, False)):
                t = threading.Thread(target=self._pipe, args=(src, dst, record), daemon=True)
                t.start()
                self._threads.append(t)

    def _pipe(self, src, dst, record: bool) -> None:
        import socket

        tail = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record:
                    window = tail + data
                    found = [m.group(2).decode("latin-1") for m in self._request.finditer(window)
                             if m.end() > len(tail)]  # not one already counted in the previous window
                    with self._lock:
                        self.requests += found
                        if self.keep:
                            self.uploaded += data
                    tail = data[-64:]  # a request line cut between two reads is found in the next window
                else:
                    data = self._gate(data, dst)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _gate(self, data: bytes, dst) -> bytes:
        """Send what the byte allowance lets through, hold until release(), and return the rest."""
        if self.hold_after is None or self.released.is_set():
            return data
        with self._lock:
            take = max(0, min(len(data), self.hold_after - self.sent))
            self.sent += take
        if take < len(data):
            dst.sendall(data[:take])
            self.reached.set()
            if self.cut:
                raise OSError("cut")  # _pipe's end shuts both sockets down
            self.released.wait()
            return data[take:]
        return data

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.released.set()
        self._server.close()
