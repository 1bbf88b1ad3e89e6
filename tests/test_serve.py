"""`imgtool serve`: a read-only registry straight from bundles, pulled from by the real clients.

skopeo (digests equal to the bundle's), the private dockerds 20.10 and 26.1, containerd 1.6 and 1.7
through a hosts.toml mirror for quay.io (pods keep upstream names), TLS with the services' test CA,
8 pulls at once; hostile clients (bad names and digests, ranges past the end, writes, stalled and
flooding connections) and damaged bundles, at start and later. The server runs as a real process
(the CLI), also from imgtool.pyz under pyenv's python3.7.
"""

import hashlib
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional

import pytest
import requests

from imgtool.bundle.catalog import Catalog
from imgtool.bundle.reader import read_index
from imgtool.model import OCI_MANIFEST, Digest
from tests.support.bundles import BlobDir, imgtool, parts_of, write
from tests.support.images import host_arch
from tests.support.runtimes import ContainerdNode
from tests.test_selfbundle import old_python

REPO = "quay.io/ascend/vllm-ascend"
ROOT = Path(__file__).resolve().parents[1]
START = re.compile(r"^serving .* at (https?)://([^/]+)/ \(Ctrl-C stops\)$")


class Server:
    """`imgtool serve ...` as a process: its URL once it printed it, its log (stderr) lines, Ctrl-C."""

    def __init__(self, *args: str, cmd: Optional[List[str]] = None, env=None, cwd=None):
        self.log_path = Path(args[0]).parent / f"serve-{os.urandom(3).hex()}.log"
        self.log_file = open(self.log_path, "w")
        cmd = cmd or [sys.executable, "-m", "imgtool"]
        self.proc = subprocess.Popen([*cmd, "serve", *args], stdout=subprocess.PIPE, stderr=self.log_file,
                                     text=True, env=env, cwd=cwd)
        self.first = self._line(300)
        m = START.match(self.first or "")
        if not m:
            self.proc.kill()
            self.proc.wait(timeout=60)
            raise AssertionError(f"imgtool serve did not start: {self.first!r}\n{self.log_path.read_text()}")
        self.scheme, self.hostport = m.group(1), m.group(2)
        self.url = f"{self.scheme}://{self.hostport}"
        self.port = int(self.hostport.rsplit(":", 1)[1])

    def _line(self, timeout: float) -> str:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.proc.kill()
                raise AssertionError(f"imgtool serve printed nothing in {timeout} s")
        return self.proc.stdout.readline().rstrip("\n")

    def log(self) -> List[str]:
        self.log_file.flush()
        return self.log_path.read_text().splitlines()

    def stop(self) -> subprocess.CompletedProcess:
        """Ctrl-C; the exit status and what it said on stderr after."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=60)
        self.log_file.close()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, self.log_path.read_text())


@pytest.fixture
def serving():
    started = []

    def start(*args: str, **kw) -> Server:
        s = Server(*args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def bundle(factory, tmp_path):
    """Two repositories: vllm-ascend (Docker v2, 3 layers) and cann (OCI), parts of 700 KiB (blobs cross them)."""
    store = BlobDir(tmp_path / "blobs")
    vllm = factory.image(host_arch(), layers=3)
    cann = factory.image(host_arch(), layers=1, media="oci")
    out = tmp_path / "bundle"
    write(out, [store.pulled(vllm, f"{REPO}:v1"), store.pulled(cann, "quay.io/ascend/cann:8.2")], store,
          chunk_size=700 * 1024)
    assert len(parts_of(out)) >= 4
    return out, vllm, cann


def errors(r: requests.Response) -> List[str]:
    return [e["code"] for e in r.json()["errors"]]


def crossing_layer(out: Path, image) -> str:
    """A layer of `image` whose bytes lie in two parts."""
    index, _ = read_index(out)
    catalog = Catalog([index])
    for layer in image.layers:
        if len({s.part for s in catalog.spans(catalog.blobs[Digest.parse(layer.digest)])}) > 1:
            return layer.digest
    raise AssertionError("no layer crosses a part boundary")


def test_the_distribution_api_by_tag_digest_and_range(bundle, serving):
    out, vllm, cann = bundle
    s = serving(str(out), "--listen", "127.0.0.1:0")
    get = requests.get
    base = s.url + "/v2"

    r = get(base + "/")
    assert (r.status_code, r.json(), r.headers["Docker-Distribution-API-Version"]) == (200, {}, "registry/2.0")
    assert get(base + "/_catalog").json() == {"repositories": ["ascend/cann", "ascend/vllm-ascend"]}
    for name, query in (("ascend/vllm-ascend", ""), ("quay.io/ascend/vllm-ascend", ""),
                        ("ascend/vllm-ascend", "?ns=quay.io")):
        assert get(f"{base}/{name}/tags/list{query}").json() == {"name": name, "tags": ["v1"]}
        r = get(f"{base}/{name}/manifests/v1{query}")
        assert r.status_code == 200
        assert r.content == vllm.manifest_bytes  # the registry's bytes, as the bundle holds them
        assert r.headers["Docker-Content-Digest"] == vllm.manifest_digest
        assert r.headers["Content-Type"] == vllm.manifest_media_type
    h = requests.head(f"{base}/ascend/cann/manifests/8.2")
    assert (h.status_code, h.headers["Content-Type"], h.headers["Docker-Content-Digest"],
            int(h.headers["Content-Length"])) == (200, OCI_MANIFEST, cann.manifest_digest, len(cann.manifest_bytes))
    assert h.content == b""
    # by digest: the registry's manifest, and the OCI twin the archive's index.json names for a Docker v2 image
    assert get(f"{base}/ascend/vllm-ascend/manifests/{vllm.manifest_digest}").content == vllm.manifest_bytes
    index = json.loads(out.joinpath("bundle.json").read_text())
    from imgtool.bundle.layout import oci_manifest

    twin = oci_manifest(read_index(out)[0].images[0])
    assert twin is not None and index["images"][0]["manifest_digest"] == vllm.manifest_digest
    r = get(f"{base}/ascend/vllm-ascend/manifests/{Digest.of(twin)}")
    assert (r.content, r.headers["Content-Type"], r.headers["Docker-Content-Digest"]) == \
        (twin, OCI_MANIFEST, str(Digest.of(twin)))

    # blobs: whole, HEAD, ranges (one crossing two parts), a suffix, past the end
    layer = crossing_layer(out, vllm)
    data = vllm.blobs()[layer]
    r = get(f"{base}/ascend/vllm-ascend/blobs/{layer}")
    assert (r.status_code, hashlib.sha256(r.content).hexdigest(), r.headers["Docker-Content-Digest"]) == \
        (200, layer.split(":")[1], layer)
    h = requests.head(f"{base}/ascend/vllm-ascend/blobs/{layer}")
    assert (h.status_code, int(h.headers["Content-Length"]), h.content) == (200, len(data), b"")
    r = get(f"{base}/ascend/vllm-ascend/blobs/{layer}", headers={"Range": "bytes=1000-"})
    assert (r.status_code, r.content, r.headers["Content-Range"]) == \
        (206, data[1000:], f"bytes 1000-{len(data) - 1}/{len(data)}")
    r = get(f"{base}/ascend/vllm-ascend/blobs/{layer}", headers={"Range": "bytes=10-19"})
    assert (r.status_code, r.content) == (206, data[10:20])
    r = get(f"{base}/ascend/vllm-ascend/blobs/{layer}", headers={"Range": "bytes=-7"})
    assert (r.status_code, r.content) == (206, data[-7:])
    r = get(f"{base}/ascend/vllm-ascend/blobs/{layer}", headers={"Range": f"bytes={len(data)}-"})
    assert (r.status_code, r.headers["Content-Range"], errors(r)) == (416, f"bytes */{len(data)}", ["SIZE_INVALID"])
    config = get(f"{base}/quay.io/ascend/vllm-ascend/blobs/{vllm.config_digest}")
    assert config.content == vllm.config_bytes

    # what is not there, and what is refused
    cases = [
        ("GET", "/ascend/vllm-ascend/manifests/v2", 404, "MANIFEST_UNKNOWN"),
        ("GET", f"/ascend/vllm-ascend/manifests/sha256:{'0' * 64}", 404, "MANIFEST_UNKNOWN"),
        ("GET", f"/ascend/vllm-ascend/blobs/sha256:{'0' * 64}", 404, "BLOB_UNKNOWN"),
        ("GET", f"/ascend/vllm-ascend/blobs/{cann.config_digest}", 404, "BLOB_UNKNOWN"),  # another repository's
        ("GET", "/ascend/vllm-ascend/manifests/v1?ns=docker.io", 404, "NAME_UNKNOWN"),
        ("GET", "/ascend/nothing/tags/list", 404, "NAME_UNKNOWN"),
        ("GET", "/ascend/vllm-ascend/blobs/sha256:abc", 400, "DIGEST_INVALID"),
        ("GET", "/ascend/vllm-ascend/blobs/v1", 400, "DIGEST_INVALID"),
        ("GET", "/ascend/vllm-ascend/manifests/sha256:XYZ", 400, "DIGEST_INVALID"),
        ("GET", "/../../etc/passwd/blobs/" + layer, 400, "NAME_INVALID"),
        ("GET", "/ascend/../vllm-ascend/blobs/" + layer, 400, "NAME_INVALID"),
        ("GET", "//etc/passwd/blobs/" + layer, 400, "NAME_INVALID"),
        ("GET", "/%2e%2e/%2e%2e/etc/passwd/manifests/v1", 400, "NAME_INVALID"),
        ("GET", "/ascend/vllm-ascend/manifests/..", 400, "TAG_INVALID"),
        ("PUT", "/ascend/vllm-ascend/manifests/v1", 405, "UNSUPPORTED"),
        ("POST", "/ascend/vllm-ascend/blobs/uploads/", 405, "UNSUPPORTED"),
        ("PATCH", "/ascend/vllm-ascend/blobs/uploads/x", 405, "UNSUPPORTED"),
        ("DELETE", f"/ascend/vllm-ascend/manifests/{vllm.manifest_digest}", 405, "UNSUPPORTED"),
    ]
    for method, path, status, code in cases:
        r = raw_request(s.port, method, "/v2" + path, b"{}" if method in ("PUT", "POST", "PATCH") else b"")
        assert (r[0], r[1]) == (status, [code]), (method, path, r)
    # the server still serves, one log line per request
    assert get(base + "/").status_code == 200
    lines = [line for line in s.log() if " /v2" in line]
    assert len(lines) == 18 + len(cases) + 1, lines  # 18 requests above, the cases, the last /v2/
    assert lines[-1].startswith("127.0.0.1 GET /v2/ 200 2 ")
    stopped = s.stop()
    assert stopped.returncode == 130
    assert stopped.stderr.splitlines()[-1] == f"error: interrupted: imgtool serve stopped after {len(lines)} requests"


def raw_request(port: int, method: str, path: str, body: bytes = b"", host: str = "127.0.0.1"):
    """One request sent as written (no client normalising `..`): (status, error codes)."""
    with socket.create_connection((host, port), timeout=60) as c:
        c.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                  "Connection: close\r\n\r\n".encode() + body)
        data = b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, [e["code"] for e in json.loads(payload)["errors"]] if payload else []


def test_a_damaged_or_compressed_or_unsigned_bundle_is_refused_at_start(bundle, factory, tmp_path):
    out, vllm, _ = bundle
    part = parts_of(out)[1]
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    r = imgtool("serve", str(out), "--listen", "127.0.0.1:0")
    assert r.returncode == 3
    assert r.stderr.splitlines()[-2:] == [
        f"error: refusing to serve: {out}: 1 problem; nothing is served",
        f"  - part 002 ({part.name}) is damaged: its sha256 differs from bundle.json; re-copy part 002 from the "
        "source medium"]
    assert r.stdout == ""

    store = BlobDir(tmp_path / "blobs2")
    packed = tmp_path / "packed"
    write(packed, [store.pulled(vllm, f"{REPO}:v1")], store, compress="gzip")
    r = imgtool("serve", str(packed), "--listen", "127.0.0.1:0")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: cannot serve {packed}: it is a gzip-compressed bundle, whose blobs cannot be read in place; "
        "nothing is served",
        "hint: fetch (or export) the bundle without --compress to serve it; `imgtool load` takes it as it is"]

    plain = tmp_path / "plain"
    write(plain, [store.pulled(vllm, f"{REPO}:v1")], store)
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "release", "-f", str(key)], check=True,
                   timeout=60)
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"release@example.org {(tmp_path / 'key.pub').read_text().split(' ', 2)[0]} "
                       f"{(tmp_path / 'key.pub').read_text().split(' ', 2)[1]}\n")
    r = imgtool("serve", str(plain), "--listen", "127.0.0.1:0", "--signers", str(signers))
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr.splitlines() == [
        f"error: refusing to serve {plain}: not signed (no bundle.json.sig), and {signers} requires a signature by "
        "a key it lists; nothing is served",
        "hint: sign it where it was made: imgtool sign DIR --key KEY (or fetch --sign-key KEY)"]

    r = imgtool("serve", str(plain), "--tls-cert", str(key))
    assert (r.returncode, r.stderr.splitlines()) == (2, ["error: --tls-cert and --tls-key go together",
                                                         "hint: give both, or neither for plain HTTP"])
    r = imgtool("serve", str(plain), "--listen", "localhost")
    assert (r.returncode, r.stderr.splitlines()) == (
        2, ["error: invalid --listen 'localhost': expected ADDR:PORT, e.g. 0.0.0.0:5000 or 127.0.0.1:5000"])


def test_a_part_damaged_while_served_is_refused_per_request_never_served_wrong(bundle, serving):
    out, vllm, cann = bundle
    s = serving(str(out), "--listen", "127.0.0.1:0")
    layer = crossing_layer(out, vllm)
    url = f"{s.url}/v2/ascend/vllm-ascend/blobs/{layer}"
    assert hashlib.sha256(requests.get(url).content).hexdigest() == layer.split(":")[1]

    index, _ = read_index(out)
    catalog = Catalog([index])
    blob = catalog.blobs[Digest.parse(layer)]
    span = catalog.spans(blob)[-1]  # the layer's last bytes, in the next part
    part = out / index.parts[span.part].name
    with open(part, "r+b") as f:
        f.seek(span.offset + span.length - 1)
        last = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([last[0] ^ 0xFF]))
    for _ in range(2):  # refused each time, the ranges too
        r = requests.get(url)
        assert (r.status_code, errors(r)) == (500, ["UNKNOWN"])
        assert r.json()["errors"][0]["message"] == (
            f"layer {vllm.layers.index(next(x for x in vllm.layers if x.digest == layer)) + 1} of {REPO}:v1 "
            f"(blob {layer[7:19]}) is damaged in {out} (part {span.part:03d}, part {span.part + 1:03d}): its "
            "sha256 differs from its digest; it is not served")
        r = requests.get(url, headers={"Range": "bytes=0-9"})
        assert r.status_code == 500
    # other blobs, in other parts, are still served
    r = requests.get(f"{s.url}/v2/ascend/cann/manifests/8.2")
    assert (r.status_code, r.content) == (200, cann.manifest_bytes)
    # put right again (the part re-copied): served again
    with open(part, "r+b") as f:
        f.seek(span.offset + span.length - 1)
        f.write(last)
    assert hashlib.sha256(requests.get(url).content).hexdigest() == layer.split(":")[1]
    assert any(line.endswith("is damaged in " + str(out) + f" (part {span.part:03d}, part {span.part + 1:03d}): its sha256 "
                             "differs from its digest; it is not served)") for line in s.log())
