"""`imgtool serve`: a read-only registry straight from bundles, pulled from by the real clients.

skopeo (digests equal to the bundle's), the private dockerds 20.10 and 26.1, containerd 1.6 and 1.7
through a hosts.toml mirror for quay.io (pods keep upstream names), TLS with the services' test CA,
8 pulls at once; hostile clients (bad names and digests, ranges past the end, writes, stalled and
flooding connections) and damaged bundles, at start and later. The server runs as a real process
(the CLI), also from imgtool.pyz under pyenv's python3.7.
"""

import dataclasses
import hashlib
import json
import os
import re
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, List, Optional

import pytest
import requests

from imgtool import serve
from imgtool.bundle.catalog import Catalog
from imgtool.bundle.inplace import InPlaceBlobs
from imgtool.bundle.reader import read_index
from imgtool.model import DOCKER_LIST, OCI_MANIFEST, Digest, format_size
from tests.support.bundles import BlobDir, damage_member, fetch_two_arch, imgtool, parts_of, random_layer, simple_image, write, write_delta
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

    def log(self, until: Optional[Callable[[List[str]], bool]] = None, timeout: float = 30) -> List[str]:
        """The log's lines; with `until`, once they satisfy it (a request's line is said after its answer went
        out, so a client can read the answer before the line is written), or as they are at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.log_path.read_text().splitlines()
            if until is None or until(lines) or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def printed_until(self, fragment: str) -> str:
        """What it printed on stdout after its first line, up to the line holding `fragment` (the bundle's
        description, the node configuration: all of it is printed before the first request is answered)."""
        said = ""
        while fragment not in said:
            line = self.proc.stdout.readline()
            assert line, said
            said += line
        return said

    def said(self, fragment: str) -> bool:
        """Whether a log line holds `fragment`, waiting for it as log(until=) does."""
        def holds(log: List[str]) -> bool:
            return any(fragment in line for line in log)

        return holds(self.log(until=holds))

    def stop(self, signum: int = signal.SIGINT) -> subprocess.CompletedProcess:
        """Ctrl-C (or another signal); the exit status and what it said on stderr after."""
        if self.proc.returncode is None:
            self.proc.send_signal(signum)
        out, _ = self.proc.communicate(timeout=60)
        self.log_file.close()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, self.log_path.read_text())


def _hosts_dir(tmp_path: Path, url: str) -> Path:
    """containerd's hosts dir (ctr --hosts-dir) sending quay.io's pulls to the server at `url`, written by hand."""
    hosts = tmp_path / "certs.d"
    (hosts / "quay.io").mkdir(parents=True)
    (hosts / "quay.io" / "hosts.toml").write_text(
        f'server = "https://quay.io"\n\n[host."{url}"]\n  capabilities = ["pull", "resolve"]\n')
    return hosts


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


@pytest.fixture
def big(tmp_path):
    """One image with a 32 MiB layer: more than loopback's socket buffers hold, so a client that stops reading
    stalls the server's sendfile."""
    store = BlobDir(tmp_path / "bigblobs")
    image = simple_image([random_layer(32 << 20, 7)], host_arch())
    out = tmp_path / "big"
    write(out, [store.pulled(image, f"{REPO}:big")], store)
    return out, image.layers[0]


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
    # outside the API: nothing, whatever the path names
    for target in ("/etc/passwd", "/../../etc/passwd", f"http://127.0.0.1:{s.port}/v2/../../etc/passwd", "/v2/x"):
        assert raw_request(s.port, "GET", target) == (404, ["NOT_FOUND"]), target
    # the server still serves, one log line per request
    assert get(base + "/").status_code == 200
    said = [re.sub(r" in [0-9.]+ s:", " in T s:", line) for line in s.log() if line.startswith("serve: ")]
    assert said == ["serve: all 9 blobs checked (4.1 MiB) in T s: every digest matches"]  # in the background, at start
    def requests_said(log: List[str]) -> List[str]:
        return [line for line in log if re.match(r"^127\.0\.0\.1 [A-Z]+ ", line)]

    expected = 18 + len(cases) + 4 + 1
    lines = requests_said(s.log(until=lambda log: len(requests_said(log)) >= expected))
    assert len(lines) == expected, lines  # 18 requests above, the cases, outside, the last /v2/
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


def test_a_damaged_or_compressed_or_unsigned_bundle_is_refused_at_start(bundle, factory, serving, tmp_path):
    out, vllm, cann = bundle
    part = parts_of(out)[1]
    whole = part.read_bytes()
    part.write_bytes(whole[:-1])
    r = imgtool("serve", str(out), "--listen", "127.0.0.1:0")
    assert r.returncode == 3
    assert r.stderr.splitlines()[-2:] == [
        f"error: refusing to serve: {out}: 1 problem; nothing is served",
        f"  - part 002 ({part.name}) is truncated: {len(whole) - 1} of {len(whole)} bytes; re-copy part 002 from the "
        "source medium"]
    assert r.stdout == ""
    part.write_bytes(whole)
    # a part of the right size with a byte changed: served at once (no part is hashed before the first pull), the
    # background check names the blobs it damaged, and each is refused per request, never served wrong. The byte
    # is one of cann's layer, found in the bundle itself (where it lies moves with the generated layers' sizes)
    layer = cann.layers[0].digest
    spans = damage_member(out, layer)
    s = serving(str(out), "--listen", "127.0.0.1:0")
    assert requests.get(f"{s.url}/v2/", timeout=60).status_code == 200
    # the background check's last line (a file the server writes: read until there)
    log = s.log(until=lambda log: any(line.startswith("serve: all ") for line in log), timeout=60)
    checked = [line for line in log if line.startswith("serve: ")]
    assert re.fullmatch(r"serve: all 9 blobs checked \(4\.1 MiB\) in \d+\.\d s: 1 damaged, refused per request",
                        checked[-1]), checked
    where = ", ".join(f"part {i + 1:03d}" for i in spans)
    assert checked[:-1] == [f"serve: layer 1 of quay.io/ascend/cann:8.2 (blob {layer.split(':')[1][:12]}) "
                            f"is damaged in {out} ({where}): its sha256 differs from its digest; it is not "
                            "served"], checked
    assert s.stop().returncode == 130

    store = BlobDir(tmp_path / "blobs2")
    packed = tmp_path / "packed"
    write(packed, [store.pulled(vllm, f"{REPO}:v1")], store, compress="gzip")
    r = imgtool("serve", str(packed), "--listen", "127.0.0.1:0")
    assert r.returncode == 2
    tar_size = read_index(packed)[0].archive.tar_size
    assert r.stderr.splitlines() == [
        f"error: cannot serve {packed}: it is a gzip-compressed bundle, whose blobs cannot be read in place; "
        "nothing is served",
        f"hint: serve it with --unpack-to DIR (unpacked once there: {format_size(tar_size)}), or fetch it without "
        "--compress"]

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
        "hint: sign it where it was made: imgtool sign DIR --sign-key KEY (or fetch --sign-key KEY)"]

    r = imgtool("serve", str(plain), "--tls-cert", str(key))
    assert (r.returncode, r.stderr.splitlines()) == (2, ["error: --tls-cert and --tls-key go together",
                                                         "hint: give both, or neither for plain HTTP"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = imgtool("serve", str(plain), "--listen", f"127.0.0.1:{port}")
    assert (r.returncode, r.stderr.splitlines()[-2:]) == (
        2, [f"error: cannot listen on 127.0.0.1:{port}: Address already in use",
            "hint: choose another --listen ADDR:PORT (a port below 1024 needs root)"])
    r = imgtool("serve", str(plain), "--listen", "localhost")
    assert (r.returncode, r.stderr.splitlines()) == (
        2, ["error: invalid --listen 'localhost': expected ADDR:PORT, e.g. 0.0.0.0:5000 or 127.0.0.1:5000"])


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_a_compressed_bundle_is_served_from_its_archive_unpacked_once(compress, factory, serving, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    image = factory.image(host_arch(), layers=3)
    out = tmp_path / "packed"
    write(out, [store.pulled(image, f"{REPO}:v1")], store, compress=compress, chunk_size=700 * 1024)
    index, _ = read_index(out)
    cache = tmp_path / "unpacked"
    r = imgtool("serve", str(out), "--listen", "127.0.0.1:0", "--unpack-to", str(cache))
    assert (r.returncode, r.stderr.splitlines()) == (2, [f"error: --unpack-to {cache} is not a directory",
                                                         "hint: create it, on a disk with room for the unpacked archive"])
    cache.mkdir()
    unpacked = cache / f"{index.archive.sha256}.tar"
    s = serving(str(out), "--listen", "127.0.0.1:0", "--unpack-to", str(cache))
    assert s.proc.stdout.readline().rstrip("\n") == f"  {REPO}: v1"
    assert s.proc.stdout.readline().rstrip("\n") == (
        f"note: {out} is {compress}-compressed: served from its archive unpacked into {unpacked}")
    assert unpacked.stat().st_size == index.archive.tar_size and [p.name for p in cache.iterdir()] == [unpacked.name]
    r = skopeo_copy(f"{s.hostport}/ascend/vllm-ascend:v1", tmp_path / "oci", "--src-tls-verify=false")
    assert r.returncode == 0, r.stderr
    layers = {x.digest.split(":")[1]: x.size for x in image.layers}
    assert layers.items() <= oci_blobs(tmp_path / "oci")["blobs"].items()
    assert s.stop().returncode == 130

    # the next start takes the unpacked archive as it is; a blob damaged in it is refused per request, never served
    inode = unpacked.stat().st_ino
    layer = image.layers[1]
    blob = Catalog([index]).blobs[Digest.parse(layer.digest)]
    os.chmod(unpacked, 0o644)
    with open(unpacked, "r+b") as f:
        f.seek(blob.start + 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    s = serving(str(out), "--listen", "127.0.0.1:0", "--unpack-to", str(cache))
    assert unpacked.stat().st_ino == inode
    r = requests.get(f"{s.url}/v2/ascend/vllm-ascend/blobs/{layer.digest}")
    assert (r.status_code, errors(r)) == (500, ["UNKNOWN"])
    assert r.json()["errors"][0]["message"] == (
        f"layer 2 of {REPO}:v1 (blob {layer.digest[7:19]}) is damaged in the unpacked archive {unpacked} of {out}: "
        "its sha256 differs from its digest; it is not served")
    r = requests.get(f"{s.url}/v2/ascend/vllm-ascend/blobs/{image.layers[0].digest}")
    assert hashlib.sha256(r.content).hexdigest() == image.layers[0].digest.split(":")[1]
    s.stop()

    # a part damaged in the bundle: refused at start (verify --quick), nothing unpacked
    unpacked.unlink()
    part = parts_of(out)[0]
    data = bytearray(part.read_bytes())
    data[-1] ^= 0xFF
    part.write_bytes(bytes(data))
    r = imgtool("serve", str(out), "--listen", "127.0.0.1:0", "--unpack-to", str(cache))
    assert (r.returncode, r.stdout, list(cache.iterdir())) == (3, "", [])
    assert r.stderr.splitlines()[-2] == f"error: refusing to serve: {out}: 1 problem; nothing is served"


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
    # a manifest is checked on every read
    manifest = catalog.blobs[Digest.parse(cann.manifest_digest)]
    first = catalog.spans(manifest)[0]
    holder = out / index.parts[first.part].name
    original = holder.read_bytes()
    changed = bytearray(original)
    changed[first.offset + 10] ^= 0x20
    holder.write_bytes(bytes(changed))
    r = requests.get(f"{s.url}/v2/ascend/cann/manifests/8.2")
    assert (r.status_code, errors(r)) == (500, ["UNKNOWN"])
    assert r.json()["errors"][0]["message"].startswith(f"manifest of quay.io/ascend/cann:8.2 (blob "
                                                       f"{cann.manifest_digest[7:19]}) is damaged in {out} (part ")
    holder.write_bytes(original)
    # put right again (the part re-copied): served again
    with open(part, "r+b") as f:
        f.seek(span.offset + span.length - 1)
        f.write(last)
    assert hashlib.sha256(requests.get(url).content).hexdigest() == layer.split(":")[1]
    assert any(line.endswith("is damaged in " + str(out) + f" (part {span.part:03d}, part {span.part + 1:03d}): its sha256 "
                             "differs from its digest; it is not served)") for line in s.log())


def skopeo_copy(src: str, dest: Path, *tls: str) -> subprocess.CompletedProcess:
    return subprocess.run(["skopeo", "copy", "--retry-times", "0", *tls, f"docker://{src}", f"oci:{dest}:pulled"],
                          capture_output=True, text=True, timeout=300)


def oci_blobs(dest: Path) -> dict:
    """What skopeo wrote: the manifest digest index.json names, and every blob checked against its name."""
    index = json.loads((dest / "index.json").read_text())
    found = {}
    for p in (dest / "blobs" / "sha256").iterdir():
        assert hashlib.sha256(p.read_bytes()).hexdigest() == p.name
        found[p.name] = p.stat().st_size
    return {"manifest": index["manifests"][0]["digest"], "blobs": found}


def test_skopeo_and_eight_pulls_at_once_get_the_bundles_digests(bundle, serving, tmp_path):
    out, vllm, cann = bundle
    s = serving(str(out), "--listen", "127.0.0.1:0")

    def blobs(image) -> dict:
        return {d.split(":")[1]: len(b) for d, b in image.blobs().items()}

    # skopeo writes a Docker v2 image into an OCI dir as an OCI image (manifest and config of its own): the
    # layers keep their digests. The OCI image keeps every digest, its manifest's too.
    names = [f"{s.hostport}/ascend/vllm-ascend:v1", f"{s.hostport}/quay.io/ascend/cann:8.2"]
    with ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda i: skopeo_copy(names[i % 2], tmp_path / f"oci{i}", "--src-tls-verify=false"),
                             range(8)))
    for i, r in enumerate(runs):
        assert r.returncode == 0, r.stderr
        got = oci_blobs(tmp_path / f"oci{i}")
        if i % 2:
            assert got == {"manifest": cann.manifest_digest,
                           "blobs": {**blobs(cann), cann.manifest_digest.split(":")[1]: len(cann.manifest_bytes)}}
        else:
            layers = {x.digest.split(":")[1]: x.size for x in vllm.layers}
            assert layers.items() <= got["blobs"].items() and len(got["blobs"]) == len(layers) + 2
    assert s.stop().returncode == 130
    requests_seen = [line for line in s.log() if " /v2/" in line]
    assert all(line.split()[3] in ("200", "404") for line in requests_seen), requests_seen  # 404: skopeo's probes


def test_over_tls_with_the_test_ca(bundle, serving, services, tmp_path):
    out, _, cann = bundle
    tls = Path(services.tls_ca).parent
    s = serving(str(out), "--listen", "127.0.0.1:0", "--tls-cert", str(tls / "server.pem"), "--tls-key",
                str(tls / "server.key"))
    assert s.scheme == "https"
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.crt").write_bytes(Path(services.tls_ca).read_bytes())
    r = skopeo_copy(f"{s.hostport}/ascend/cann:8.2", tmp_path / "oci", "--src-cert-dir", str(certs))
    assert r.returncode == 0, r.stderr
    assert oci_blobs(tmp_path / "oci")["manifest"] == cann.manifest_digest
    r = skopeo_copy(f"{s.hostport}/ascend/cann:8.2", tmp_path / "oci2")  # no CA: refused by the client
    assert r.returncode != 0 and "x509" in r.stderr
    assert requests.get(f"{s.url}/v2/", verify=services.tls_ca).status_code == 200
    # over TLS blobs are copied, not sendfile'd: whole, and a range, across two parts
    vllm = bundle[1]
    layer = crossing_layer(out, vllm)
    data = vllm.blobs()[layer]
    url = f"{s.url}/v2/ascend/vllm-ascend/blobs/{layer}"
    assert requests.get(url, verify=services.tls_ca).content == data
    r = requests.get(url, verify=services.tls_ca, headers={"Range": f"bytes=3-{len(data) - 2}"})
    assert (r.status_code, r.content) == (206, data[3:-1])


# Docker's containerd image store (26.1-containerd) does not take loopback registries as insecure by default;
# nodes pull from another node's address anyway, where every engine needs insecure-registries or TLS (README).
@pytest.mark.parametrize("engine", ["20.10", "26.1", "28.5"], indirect=True)
def test_docker_pulls_from_serve(bundle, serving, docker_cli, docker_cleanup, uniq, tmp_path, factory):
    out, vllm, _ = bundle
    s = serving(str(out), "--listen", "127.0.0.1:0")
    ref = f"{s.hostport}/ascend/vllm-ascend:v1"
    docker_cleanup.image(ref, vllm.config_digest)
    docker_cli("pull", ref)  # loopback registries are insecure by default: no daemon.json change
    assert docker_cli.holds(ref, vllm)


@pytest.mark.parametrize("version,tls", [("1.6", False), ("1.7", False), ("1.7", True), ("2.1", False)])
def test_containerd_pulls_the_upstream_name_through_a_hosts_toml_mirror(version, tls, factory, services, serving,
                                                                        tmp_path, uniq):
    node = ContainerdNode(f"containerd-{version}", services)
    store = BlobDir(tmp_path / "blobs")
    image = factory.image(host_arch(), layers=2)
    ref = f"{REPO}:{uniq}"  # a tag of its own: other tests' images on this containerd stay alone
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, ref)], store, chunk_size=700 * 1024)
    certs = Path(services.tls_ca).parent
    s = serving(str(out), "--listen", "127.0.0.1:0",
                *(["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")] if tls else []))
    hosts = tmp_path / "certs.d"
    (hosts / "quay.io").mkdir(parents=True)
    (hosts / "quay.io" / "hosts.toml").write_text(
        f'server = "https://quay.io"\n\n[host."{s.url}"]\n  capabilities = ["pull", "resolve"]\n'
        + (f'  ca = "{services.tls_ca}"\n' if tls else ""))
    node.removals.append(ref)
    try:
        r = node.ctr("images", "pull", "--hosts-dir", str(hosts), ref, check=False)
        assert r.returncode == 0, r.stderr
        assert [row[2] for row in node.refs() if row[0] == ref] == [image.manifest_digest]  # the registry's manifest
    finally:
        assert node.cleanup() == []
    # containerd asked with ?ns=quay.io, as a node's mirror does
    assert s.said(f"/v2/ascend/vllm-ascend/manifests/{uniq}?ns=quay.io 200"), s.log()


def read_until_closed(c: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's own timeout fails the test)."""
    data = b""
    while True:
        chunk = c.recv(65536)
        if not chunk:
            return data
        data += chunk


def answers(data: bytes) -> List[tuple]:
    """The (status, headers, body) of each response in `data`, in order (bodies by Content-Length)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        n = int(headers.get("content-length", "0"))
        out.append((int(lines[0].split(" ", 2)[1]), headers, rest[:n]))
        data = rest[n:]
    return out


def test_malformed_ranges_and_request_bodies_get_an_answer_never_a_dropped_connection(bundle, serving):
    """Issue 35 case 9: `Range: bytes=1-<5000 digits>` dropped the connection (ValueError from int()), and a GET's
    body was parsed as the next request. Every Range that is not one satisfiable bytes range is 416 with
    `Content-Range: bytes */SIZE`; a body is read and dropped (Content-Length up to 64 KiB), a bigger or chunked one
    is refused (413, 411) and the connection closed."""
    out, vllm, _ = bundle
    s = serving(str(out), "--listen", "127.0.0.1:0")
    layer = vllm.layers[0]
    size = len(vllm.blobs()[layer.digest])
    blob = f"/v2/ascend/vllm-ascend/blobs/{layer.digest}"

    def exchange(raw: bytes) -> List[tuple]:
        with socket.create_connection(("127.0.0.1", s.port), timeout=60) as c:
            c.sendall(raw)
            return answers(read_until_closed(c))

    for value in ("bytes=1-" + "9" * 5000, "bytes=" + "1" * 20 + "-", "bytes=5-2", "bytes=0-1,4-5", "items=0-1",
                  "bytes=abc", "bytes=-", "bytes=--1", "bytes=0-1 x", f"bytes={size}-"):
        got = exchange(f"GET {blob} HTTP/1.1\r\nHost: x\r\nRange: {value}\r\nConnection: close\r\n\r\n".encode())
        assert [(a[0], a[1].get("content-range"), json.loads(a[2])["errors"][0]["code"]) for a in got] == \
            [(416, f"bytes */{size}", "SIZE_INVALID")], value[:40]
    # a body that reads as a request is read as a body: two requests, two answers, no DELETE
    smuggled = b"DELETE /v2/ascend/vllm-ascend/manifests/v1 HTTP/1.1\r\nHost: x\r\n\r\n"
    got = exchange(f"GET /v2/ HTTP/1.1\r\nHost: x\r\nContent-Length: {len(smuggled)}\r\n\r\n".encode() + smuggled
                   + b"GET /v2/_catalog HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert [(a[0], a[2]) for a in got] == [(200, b"{}"), (200, b'{"repositories": ["ascend/cann", "ascend/vllm-ascend"]}')]
    # chunked, too big, malformed: refused and the connection closed (what follows is never read as a request)
    for head, status in ((b"Transfer-Encoding: chunked\r\n", 411), (b"Content-Length: 65537\r\n", 413),
                         (b"Content-Length: 1x\r\n", 400), (b"Content-Length: 1\r\nContent-Length: 2\r\n", 400)):
        got = exchange(b"GET /v2/ HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n" + smuggled)
        assert [a[0] for a in got] == [status], head
    assert not [line for line in s.log() if " DELETE " in line or "connection ended" in line]
    assert s.stop().returncode == 130


def test_tls_spoken_to_the_plain_port_is_answered_at_once(bundle, serving):
    """skopeo and Go clients with tls-verify=false try TLS first and fall back to HTTP when the answer is not TLS: a
    ClientHello (no line end in it) gets a 400 at once and the connection closed, not a wait for the rest of a
    request (the selector loop waited for the end of a head: every skopeo pull took 10 s more, Go's TLS handshake
    timeout)."""
    out, _, _ = bundle
    s = serving(str(out), "--listen", "127.0.0.1:0")
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as c:
        c.sendall(bytes([0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03]) + bytes(range(32, 64)))
        # http.server's answer to what has no HTTP version: the 400 page alone (socket.timeout after 5 s otherwise)
        assert b"Error code explanation: 400 - Bad request syntax" in read_until_closed(c)
    assert requests.get(f"{s.url}/v2/", timeout=60).status_code == 200


def stalled_download(port: int, layer) -> socket.socket:
    """A client that asks for the blob and reads only the status line."""
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.settimeout(120)
    reader.connect(("127.0.0.1", port))
    reader.sendall(f"GET /v2/ascend/vllm-ascend/blobs/{layer.digest} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert reader.recv(16) == b"HTTP/1.1 200 OK\r"
    return reader


def closed(c: socket.socket) -> bytes:
    """What the server sent before it closed the connection; a reset (closed with our bytes unread) reads as b""."""
    try:
        return read_until_closed(c)
    except ConnectionResetError:
        return b""


def cut_within(c: socket.socket, seconds: float) -> bool:
    """Whether the server closed (or reset) the connection within `seconds`, without reading what it sent."""
    poller = select.poll()
    poller.register(c, select.POLLRDHUP)
    return bool(poller.poll(seconds * 1000))


def test_idle_dripping_and_stalled_clients_make_room_and_are_cut(big, serving):
    """Issue 36 item 5: two connections taken (--max-clients 2), a third closes the one that waited longest for its
    request and is answered at once (main: it waited in the backlog until a worker's timeout); a request's line
    and headers must come whole within min(20, --timeout) s; a download that takes less than 1 KiB/s over --timeout
    is cut; a flood of connections opened and dropped changes nothing."""
    out, layer = big
    s = serving(str(out), "--listen", "127.0.0.1:0", "--max-clients", "2", "--timeout", "2")
    silent = socket.create_connection(("127.0.0.1", s.port), timeout=120)
    assert requests.get(f"{s.url}/v2/", timeout=60).status_code == 200  # the server has taken `silent` in
    # requests' kept-alive connection is idle now: `halfway` closes it (silently), not `silent`
    halfway = socket.create_connection(("127.0.0.1", s.port), timeout=120)
    halfway.sendall(b"GET /v2/ HTTP/1.1\r\nHost: x\r\n")
    third = socket.create_connection(("127.0.0.1", s.port), timeout=120)
    third.sendall(b"GET /v2/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert read_until_closed(third).startswith(b"HTTP/1.1 200 OK\r\n")
    assert closed(silent) == b""
    assert closed(halfway) == b""  # at its request deadline
    for c in (silent, halfway, third):
        c.close()
    log = s.log()  # one closed to make room (`silent`: `halfway` lived to its deadline)
    assert len([line for line in log if line.startswith("127.0.0.1 - closed to make room for a new connection (2 are "
                                                        "open): it had sent 0 bytes of a request in ")]) == 1, log
    assert [line for line in log if "request timed out" in line] == [
        "127.0.0.1 - request timed out: 28 bytes of a request in 2 s (the request line and headers must come within "
        "2 s); closed"], log

    # a client that asks for a blob and stops reading: cut, nothing held
    reader = stalled_download(s.port, layer)
    flood = [socket.create_connection(("127.0.0.1", s.port), timeout=120) for _ in range(300)]
    for c in flood:
        c.close()
    assert cut_within(reader, 30)  # reset by the server: it never took the blob (2 s to fill its buffers, 2 s stalled)
    assert closed(reader) == b""
    reader.close()
    assert requests.get(f"{s.url}/v2/", timeout=120).status_code == 200
    assert s.proc.poll() is None
    cut = [line for line in s.log() if line.startswith(f"127.0.0.1 GET /v2/ascend/vllm-ascend/blobs/{layer.digest} 200 ")]
    assert len(cut) == 1 and re.search(r" \(connection ended: the client took \d+ bytes in 2 s \(at least 1024 a "
                                       r"second\); cut\)$", cut[0]), cut


def test_pulls_and_a_manifest_get_beside_300_hostile_connections(services, serving, tmp_path, uniq):
    """Issue 36 item 5: a hundred nodes' worst (100 connections that say nothing, 100 that send a header line a second
    and never finish, 100 that read a 32 MiB blob a byte a second, each opened again when closed) beside a real
    `skopeo copy` and a real `ctr pull` through a hosts.toml mirror: both pulls get the image and a manifest GET
    answers at once (within 5 s on a loaded machine; 2 s is the goal the benchmark measures), while the whole crowd
    stays connected (main: its 64 workers were all held by the crowd and
    the GET waited for a 60 s timeout)."""
    from tests.support.crowd import Crowd

    node = ContainerdNode("containerd-1.7", services)
    store = BlobDir(tmp_path / "blobs")
    big = random_layer(32 << 20, 36)
    image = simple_image([big, random_layer(1 << 20, 37)], host_arch())
    ref = f"{REPO}:{uniq}"
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, ref)], store)
    s = serving(str(out), "--listen", "127.0.0.1:0")
    hosts = _hosts_dir(tmp_path, s.url)
    manifest = f"{s.url}/v2/ascend/vllm-ascend/manifests/{uniq}"

    def timed_get() -> float:
        started = time.monotonic()
        r = requests.get(manifest, timeout=10, headers={"Connection": "close"})
        assert (r.status_code, r.content) == (200, image.manifest_bytes)
        return time.monotonic() - started

    node.removals.append(ref)
    try:
        with Crowd("127.0.0.1", s.port, f"/v2/ascend/vllm-ascend/blobs/{big.digest}") as crowd, \
                ThreadPoolExecutor(2) as pool:
            first = timed_get()
            skopeo = pool.submit(skopeo_copy, f"{s.hostport}/{ref[len('quay.io/'):]}", tmp_path / "oci",
                                 "--src-tls-verify=false")
            ctr = pool.submit(node.ctr, "images", "pull", "--hosts-dir", str(hosts), ref, check=False)
            during = timed_get()
            r = skopeo.result()
            assert r.returncode == 0, r.stderr
            r = ctr.result()
            assert r.returncode == 0, r.stderr
            crowd.wait_ticks(3)  # the slow readers have been read from (the pulls may have ended within a tick)
            after = timed_get()
            assert crowd.open_now() >= 270 and crowd.read > 0  # (one closed by the server: open again within 1 s)
        # the goal is 2 s (docs/benchmarks.md measures it); asserted with room for a loaded 2-core machine, still far
        # below what the thread-per-connection server took (a worker freed only at a crowd connection's 60 s timeout)
        assert max(first, during, after) < 5.0, (first, during, after)
        assert {x.digest.split(":")[1] for x in image.layers} <= set(oci_blobs(tmp_path / "oci")["blobs"])
        assert [row[2] for row in node.refs() if row[0] == ref] == [image.manifest_digest]
    finally:
        assert node.cleanup() == []
    log = s.log()
    assert len([line for line in log if line.startswith(f"127.0.0.1 GET /v2/ascend/vllm-ascend/manifests/{uniq} 200 ")]) \
        >= 4, log  # the three GETs, skopeo's and ctr's


def test_a_big_blob_asked_for_before_its_check_goes_out_at_once_and_never_whole_when_wrong(big):
    """The first pull of a big layer never waits for its hash: a blob over 16 MiB asked for whole before the background
    check reached it is hashed as it is sent, its last bytes held back until all matched. Damaged, the answer is cut
    (the client never has the whole body) and every later request refused (500). In process, with no background
    check, so the request is surely first."""
    out, layer = big
    index, _ = read_index(out)
    catalog = Catalog([index])
    blob = catalog.blobs[Digest.parse(layer.digest)]
    path = f"/v2/ascend/vllm-ascend/blobs/{layer.digest}"

    def serving_alone(lines: list):
        server = serve._Server(serve.Settings(host="127.0.0.1", port=0), catalog, InPlaceBlobs([out], catalog),
                               lines.append)
        thread = threading.Thread(target=server.loop.run)  # not serve_forever: no background check
        thread.start()
        return server, thread

    lines: list = []
    server, thread = serving_alone(lines)
    try:
        r = requests.get(f"http://127.0.0.1:{server.server_address[1]}{path}", timeout=60)
        assert (r.status_code, hashlib.sha256(r.content).hexdigest()) == (200, layer.digest[7:])
    finally:
        server.stop()
        thread.join(timeout=60)
    gets = [line for line in lines if " GET " in line]
    assert len(gets) == 1 and re.match(rf"^127\.0\.0\.1 GET {path} 200 {layer.size} [0-9.]+s \(checked as it was sent\)$",
                                       gets[0]), gets

    span = catalog.spans(blob)[0]
    part = out / index.parts[span.part].name
    with open(part, "r+b") as f:  # a byte in the middle of the layer
        f.seek(span.offset + layer.size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    lines = []
    server, thread = serving_alone(lines)
    try:
        with socket.create_connection(server.server_address[:2], timeout=60) as c:
            c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            got = b""
            try:
                while True:
                    chunk = c.recv(1 << 20)
                    if not chunk:
                        break
                    got += chunk
            except ConnectionResetError:
                pass
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and f"Content-Length: {layer.size}".encode() in head
        assert layer.size // 2 < len(body) < layer.size  # sent as it was read, cut before the end
        r = requests.get(f"http://127.0.0.1:{server.server_address[1]}{path}", timeout=60)
        message = (f"layer 1 of {REPO}:big (blob {layer.digest[7:19]}) is damaged in {out} (part 001): its sha256 "
                   "differs from its digest; it is not served")
        assert (r.status_code, r.json()["errors"][0]["message"]) == (500, message)
    finally:
        server.stop()
        thread.join(timeout=60)
    gets = [line for line in lines if " GET " in line]
    assert len(gets) == 2 and gets[0].endswith(f" (checked as it was sent; {message} (cut before its last bytes))"), gets


def test_the_open_file_limit_is_raised_to_fit_the_connections_and_said(bundle, serving):
    """Each connection may hold two descriptors (its socket, the part file it sends from): a soft limit short of
    2 x --max-clients + 64 is raised to the hard limit, said once in the log; a hard limit short of it too leaves
    fewer connections, said with the remedy."""
    out, _, cann = bundle

    def started(limits: str) -> Server:
        s = serving(str(out), "--listen", "127.0.0.1:0", "--max-clients", "1000",
                    cmd=["prlimit", f"--nofile={limits}", sys.executable, "-m", "imgtool"])
        assert requests.get(f"{s.url}/v2/ascend/cann/manifests/8.2", timeout=60).content == cann.manifest_bytes
        return s

    s = started("256:4096")
    assert [line for line in s.log() if "open-file limit" in line] == [
        "serve: raised the open-file limit (ulimit -n) from 256 to 4096, its hard limit, for up to 1000 connections"]
    s = started("256:1024")
    assert [line for line in s.log() if "open-file limit" in line] == [
        "serve: raised the open-file limit (ulimit -n) from 256 to 1024, its hard limit, for up to 1000 connections",
        "serve: the open-file limit (ulimit -n 1024) leaves room for 480 connections, not 1000: raise its hard limit "
        "(LimitNOFILE= in a systemd unit) for more"]


def test_ctrl_c_ends_it_with_a_download_in_flight(big, serving):
    out, layer = big
    s = serving(str(out), "--listen", "127.0.0.1:0")
    reader = stalled_download(s.port, layer)  # the answer has started and stalls on this reader (timeout 60 s)
    stopped = s.stop()  # SIGINT: the stalled download is cut, every worker joined, no traceback
    reader.close()
    assert stopped.returncode == 130
    assert stopped.stderr.splitlines()[-1] == "error: interrupted: imgtool serve stopped after 1 requests"
    assert "Traceback" not in stopped.stderr

    s = serving(str(out), "--listen", "127.0.0.1:0")  # SIGTERM (systemd's stop): the same
    stopped = s.stop(signal.SIGTERM)
    assert stopped.returncode == 130
    assert stopped.stderr.splitlines()[-1] == "error: interrupted: imgtool serve stopped after 0 requests"


def test_serves_from_the_pyz_on_kylins_python_3_7(bundle, serving, tmp_path):
    out, _, cann = bundle
    pyz = tmp_path / "imgtool.pyz"
    r = imgtool("self-bundle", "-o", str(pyz), "-q")
    assert r.returncode == 0, r.stderr
    env = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"HOME={tmp_path}", "LANG=C.UTF-8",
           "IMGTOOL_CACHE=/nonexistent/imgtool-cache"]
    s = serving(str(out), "--listen", "127.0.0.1:0", cmd=[*env, *old_python("3.7"), str(pyz)], cwd=tmp_path)
    r = skopeo_copy(f"{s.hostport}/quay.io/ascend/cann:8.2", tmp_path / "oci", "--src-tls-verify=false")
    assert r.returncode == 0, r.stderr
    assert oci_blobs(tmp_path / "oci")["manifest"] == cann.manifest_digest
    stopped = s.stop()
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr


def test_a_served_bundle_is_not_replaced_by_fetch_force(services, factory, mirrored, tmp_path, serving):
    """Issue 35 case 10: `fetch --force` replaced a directory `imgtool serve` was serving, which then answered 500.
    serve holds the directory's lock (shared): fetch --force refuses, naming the server, and the server serves on;
    once it stops, the lock file is gone and the same fetch replaces the bundle. A serve of a directory a fetch is
    writing refuses, naming the fetch."""
    out, idx, repo = fetch_two_arch(services, factory, mirrored, tmp_path, "oci")
    before = (out / "bundle.json").read_bytes()
    s = serving(str(out), "--listen", "127.0.0.1:0")
    again = ["fetch", "--no-tool", "v3", "--arch", "amd64", "--mirrors", str(tmp_path / "mirrors.toml"), "-o", str(out),
             "--force", "-q"]
    r = imgtool(*again, env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 1, r.stderr
    assert [x for x in r.stderr.splitlines() if x.startswith(("error:", "hint:"))] == [
        f"error: {out} is being served by imgtool serve (pid {s.proc.pid}); it was not changed",
        "hint: stop that server first, or write the new bundle to another --output"]
    assert (out / "bundle.json").read_bytes() == before
    layer = idx.image("amd64").layers[0].digest
    got = requests.get(f"{s.url}/v2/{repo}/blobs/{layer}", timeout=60)
    assert (got.status_code, hashlib.sha256(got.content).hexdigest()) == (200, layer.split(":")[1])
    assert "unexpected file" not in "\n".join(s.log())  # the lock file is the bundle directory's own
    assert s.stop().returncode == 130
    assert not (out / ".imgtool-lock").exists()
    r = imgtool(*again, env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert (out / "bundle.json").read_bytes() != before
    from imgtool.dirlock import lock_output

    with lock_output(out, "fetch"):
        refused = imgtool("serve", str(out), "--listen", "127.0.0.1:0")
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == f"error: {out} is being written by imgtool fetch (pid {os.getpid()}); " \
                                             "nothing was done"


@pytest.fixture
def two_arch(services, factory, mirrored, tmp_path):
    """A tag published upstream as a Docker manifest list over amd64 and arm64, fetched as users do
    (`fetch --arch amd64,arm64`), served: (server factory args, bundle, the upstream index, the repo path)."""
    return fetch_two_arch(services, factory, mirrored, tmp_path, "docker", "--chunk-size", "1M")


def served_index(idx) -> bytes:
    """The index serve answers under the tag: a manifest list over the platforms the bundle holds, the same bytes
    `imgtool push` publishes."""
    return json.dumps({"schemaVersion": 2, "mediaType": DOCKER_LIST, "manifests": [
        {"mediaType": im.manifest_media_type, "digest": im.manifest_digest, "size": len(im.manifest_bytes),
         "platform": {"os": "linux", "architecture": im.architecture,
                      **({"variant": "v8"} if im.architecture == "arm64" else {})}}
        for im in idx.images]}, separators=(",", ":")).encode()


def as_older_bundle(out: Path) -> None:
    """The bundle as an imgtool before `upstream_indexes` wrote it: bundle.json without upstream's index (and
    SHA256SUMS to match)."""
    from imgtool.bundle.format import BundleIndex

    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    assert index.upstream_indexes
    doc = dataclasses.replace(index, upstream_indexes=()).to_bytes()
    (out / "bundle.json").write_bytes(doc)
    sums = (out / "SHA256SUMS").read_text().splitlines()
    (out / "SHA256SUMS").write_text("".join(
        (f"{hashlib.sha256(doc).hexdigest()}  bundle.json" if line.endswith("  bundle.json") else line) + "\n"
        for line in sums))


def test_a_tag_held_for_several_architectures_is_served_as_an_index(two_arch, serving, tmp_path):
    """A bundle of an imgtool that kept only upstream's index digest: served exactly as before."""
    out, idx, repo = two_arch
    as_older_bundle(out)
    s = serving(str(out), "--listen", "127.0.0.1:0")
    body = served_index(idx)
    digest = str(Digest.of(body))
    assert s.proc.stdout.readline().rstrip("\n") == f"  quay.io/{repo}: v3"
    assert s.proc.stdout.readline().rstrip("\n") == (
        f"note: quay.io/{repo}:v3 is served as an index of the 2 platforms the bundle holds (linux/amd64, "
        f"linux/arm64/v8): {digest}, not upstream's digest")
    for ref in ("v3", digest):
        r = requests.get(f"{s.url}/v2/{repo}/manifests/{ref}")
        assert (r.status_code, r.content, r.headers["Content-Type"], r.headers["Docker-Content-Digest"]) == \
            (200, body, DOCKER_LIST, digest)
        h = requests.head(f"{s.url}/v2/{repo}/manifests/{ref}?ns=quay.io")
        assert (h.status_code, h.headers["Docker-Content-Digest"], int(h.headers["Content-Length"]), h.content) == \
            (200, digest, len(body), b"")
    for image in idx.images:
        r = requests.get(f"{s.url}/v2/{repo}/manifests/{image.manifest_digest}")
        assert (r.status_code, r.content) == (200, image.manifest_bytes)
    # upstream's index digest (a Pod pinned by it): the bundle does not keep those bytes; the 404 says what to pull
    r = requests.get(f"{s.url}/v2/{repo}/manifests/{idx.manifest_digest}")
    assert (r.status_code, errors(r)) == (404, ["MANIFEST_UNKNOWN"])
    assert r.json()["errors"][0]["message"] == (
        f"quay.io/{repo}@{idx.manifest_digest} is upstream's index of tag v3, which the bundles do not keep (they "
        f"hold its platform manifests): pull quay.io/{repo}:v3 (here {digest}), or a platform manifest by digest")

    # skopeo: every platform (--all) into a dir: (which keeps manifests as served; oci: would convert the Docker
    # manifests), one platform by --override-arch; digests are the bundle's (the platforms' upstream's)
    r = subprocess.run(["skopeo", "copy", "--retry-times", "0", "--all", "--src-tls-verify=false",
                        f"docker://{s.hostport}/{repo}:v3", f"dir:{tmp_path / 'all'}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "all" / "manifest.json").read_bytes() == body
    for image in idx.images:
        assert (tmp_path / "all" / f"{image.manifest_digest[7:]}.manifest.json").read_bytes() == image.manifest_bytes
    blobs = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "all").iterdir()
             if "manifest" not in p.name and p.name != "version"}
    assert blobs == {d[7:]: d[7:] for im in idx.images for d in im.blobs() if d != im.manifest_digest}
    r = subprocess.run(["skopeo", "--override-arch", "arm64", "copy", "--retry-times", "0", "--src-tls-verify=false",
                        f"docker://{s.hostport}/{repo}:v3", f"oci:{tmp_path / 'arm'}:pulled"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    arm = idx.image("arm64")
    assert {x.digest.split(":")[1] for x in arm.layers} <= set(oci_blobs(tmp_path / "arm")["blobs"])
    assert s.stop().returncode == 130


@pytest.mark.parametrize("engine", ["20.10", "26.1"], indirect=True)
def test_docker_pulls_its_platform_of_a_two_arch_tag(two_arch, serving, docker_cli, docker_cleanup):
    out, idx, repo = two_arch
    s = serving(str(out), "--listen", "127.0.0.1:0")
    ref = f"{s.hostport}/{repo}:v3"
    mine = idx.image(host_arch())
    docker_cleanup.image(ref, mine.config_digest)
    docker_cli("pull", ref)  # the engine's own platform, by tag
    assert docker_cli.holds(ref, mine)


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_containerd_pulls_a_platform_of_a_two_arch_tag_through_the_mirror(two_arch, arch, services, serving,
                                                                          tmp_path):
    out, idx, repo = two_arch
    node = ContainerdNode("containerd-1.7", services)
    s = serving(str(out), "--listen", "127.0.0.1:0")
    hosts = _hosts_dir(tmp_path, s.url)
    ref = f"quay.io/{repo}:v3"
    node.removals.append(ref)
    try:
        r = node.ctr("images", "pull", "--hosts-dir", str(hosts), "--platform", f"linux/{arch}", ref, check=False)
        assert r.returncode == 0, r.stderr
        # the bundle keeps upstream's index and holds every platform it lists: the tag is upstream's digest
        assert [row[1:3] for row in node.refs() if row[0] == ref] == [[DOCKER_LIST, idx.manifest_digest]]
        manifest = idx.image(arch).manifest_digest
        assert s.said(f"/v2/{repo}/manifests/{manifest}?ns=quay.io 200"), s.log()
    finally:
        assert node.cleanup() == []


def test_a_delta_bundle_is_served_without_the_layers_it_leaves_out(factory, serving, tmp_path):
    delta = tmp_path / "delta"
    _, _, new = write_delta(delta, factory, BlobDir(tmp_path / "blobs"), REPO)
    s = serving(str(delta), "--listen", "127.0.0.1:0")
    assert s.proc.stdout.readline().rstrip("\n") == f"  {REPO}: v2"
    assert s.proc.stdout.readline().rstrip("\n") == (
        f"note: {delta} is a delta bundle: the 2 layers it leaves out are not served; only nodes that hold them "
        "already can pull its images")
    r = requests.get(f"{s.url}/v2/ascend/vllm-ascend/blobs/{new.layers[0].digest}")
    assert (r.status_code, errors(r)) == (404, ["BLOB_UNKNOWN"])
    r = requests.get(f"{s.url}/v2/ascend/vllm-ascend/blobs/{new.layers[2].digest}")
    assert hashlib.sha256(r.content).hexdigest() == new.layers[2].digest.split(":")[1]


def test_every_connection_sends_without_nagles_delay(bundle):
    """TCP_NODELAY on every connection: an answer written as headers, then body, is not held back (Nagle's
    algorithm waiting for the client's delayed ACK: 40 ms for each manifest and config on a kept-alive connection,
    what made 1 and 4 pulls slower than the distribution registry's). In process: the option is on the server's
    side of the socket."""
    out, _, _ = bundle
    index, _ = read_index(out)
    catalog = Catalog([index])
    server = serve._Server(serve.Settings(host="127.0.0.1", port=0), catalog, InPlaceBlobs([out], catalog),
                           lambda line: None)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        with socket.create_connection(server.server_address[:2], timeout=60) as c:
            c.sendall(b"GET /v2/ HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while not got.endswith(b"\r\n\r\n{}"):
                chunk = c.recv(4096)
                assert chunk, got
                got += chunk
            held = [conn.sock for conn in list(server.loop.conns.values())]
            assert [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in held] == [1]
    finally:
        server.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()


def test_tags_and_catalog_pages_say_where_the_next_one_is(factory, serving, tmp_path):
    """`?n=` pages carry the distribution API's `Link: <…>; rel="next"` while more follow, so clients that page
    (skopeo list-tags, crane ls) get every tag."""
    store = BlobDir(tmp_path / "blobs")
    image = factory.image(host_arch(), layers=1)
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:{tag}") for tag in ("a", "b", "c")], store)
    s = serving(str(out), "--listen", "127.0.0.1:0")
    r = requests.get(f"{s.url}/v2/ascend/vllm-ascend/tags/list?n=2")
    assert (r.json()["tags"], r.headers["Link"]) == (["a", "b"], '</v2/ascend/vllm-ascend/tags/list?n=2&last=b>; rel="next"')
    r = requests.get(f"{s.url}/v2/ascend/vllm-ascend/tags/list?n=2&last=b")
    assert (r.json()["tags"], "Link" in r.headers) == (["c"], False)
    r = requests.get(f"{s.url}/v2/_catalog?n=1")
    assert (r.json()["repositories"], "Link" in r.headers) == (["ascend/vllm-ascend"], False)
    r = subprocess.run(["skopeo", "list-tags", "--tls-verify=false", f"docker://{s.hostport}/ascend/vllm-ascend"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["Tags"] == ["a", "b", "c"], r.stderr


# --- pinned by upstream's index digest, through the configuration serve prints -------------------------------------

def node_files(lines: List[str]) -> dict:
    """What the node configuration's script writes: path -> the exact lines between `cat > PATH <<'EOF'` and EOF."""
    files, path = {}, None
    for line in lines:
        if path is None and line.startswith("cat > ") and line.endswith(" <<'EOF'"):
            path, files[line[6:-8]] = line[6:-8], ""
        elif path is not None and line == "EOF":
            path = None
        elif path is not None:
            files[path] += line + "\n"
    return files


def startup_node_config(s: Server, out: Path, *extra: str) -> dict:
    """The node configuration the running server printed at start, checked line for line against
    `serve --print-node-config` for its address; returns the files of `--print-node-config --json`."""
    printed = imgtool("serve", str(out), "--listen", f"127.0.0.1:{s.port}", "--print-node-config", *extra)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert lines[0] == f"# what each node needs to pull from {s.url} (run the part for the node's runtime as root)"
    started = [s.proc.stdout.readline().rstrip("\n") for _ in lines]  # printed at start: there to read
    assert started == lines
    js = imgtool("serve", str(out), "--listen", f"127.0.0.1:{s.port}", "--print-node-config", "--json", *extra)
    assert js.returncode == 0, js.stderr
    files = {f["path"]: f["content"] for f in json.loads(js.stdout)["files"] if not f["merge"]}
    assert node_files(lines) == files  # the script writes exactly the files --json gives
    return files


def test_a_pod_pinned_by_upstreams_index_digest_pulls_from_serve(two_arch, services, serving, tmp_path):
    """Issue 36 item 6: the bundle keeps upstream's index; serve answers it by tag and by digest, byte for byte, and
    containerd 1.7 (ctr pull --hosts-dir with the hosts.toml serve printed) and skopeo (registries.conf from serve's
    output) pull quay.io/...:TAG@sha256:<upstream's index digest> from it."""
    out, idx, repo = two_arch
    s = serving(str(out), "--listen", "127.0.0.1:0")
    assert s.proc.stdout.readline().rstrip("\n") == f"  quay.io/{repo}: v3"
    assert s.proc.stdout.readline().rstrip("\n") == (
        f"note: quay.io/{repo}:v3 is served as upstream's index {idx.manifest_digest} (linux/amd64, linux/arm64/v8)")
    files = startup_node_config(s, out)
    for ref in ("v3", idx.manifest_digest):
        r = requests.get(f"{s.url}/v2/{repo}/manifests/{ref}")
        assert (r.status_code, r.content, r.headers["Content-Type"], r.headers["Docker-Content-Digest"]) == \
            (200, idx.manifest_bytes, DOCKER_LIST, idx.manifest_digest)

    pinned = f"quay.io/{repo}:v3@{idx.manifest_digest}"  # as a GitOps manifest pins it
    hosts = tmp_path / "certs.d"
    (hosts / "quay.io").mkdir(parents=True)
    (hosts / "quay.io" / "hosts.toml").write_text(files["/etc/containerd/certs.d/quay.io/hosts.toml"])
    node = ContainerdNode("containerd-1.7", services)
    node.removals.append(pinned)
    try:
        r = node.ctr("images", "pull", "--hosts-dir", str(hosts), pinned, check=False)
        assert r.returncode == 0, r.stderr
        assert [row[1:3] for row in node.refs() if row[0] == pinned] == [[DOCKER_LIST, idx.manifest_digest]]
        assert node.ctr("content", "get", idx.manifest_digest).stdout.encode() == idx.manifest_bytes
        mine = idx.image(host_arch())
        assert node.ctr("content", "get", mine.manifest_digest).stdout.encode() == mine.manifest_bytes
        assert {x.digest for x in mine.layers} <= set(node.ctr("content", "ls", "--quiet").stdout.split())
    finally:
        assert node.cleanup() == []
    assert s.said(f"/v2/{repo}/manifests/{idx.manifest_digest}?ns=quay.io 200"), s.log()

    conf = tmp_path / "registries.conf"
    conf.write_text(files["/etc/containers/registries.conf.d/imgtool-serve.conf"])
    skopeo = ["skopeo", "--registries-conf", str(conf)]
    by_digest = f"docker://quay.io/{repo}@{idx.manifest_digest}"  # skopeo takes a tag or a digest, not both
    r = subprocess.run([*skopeo, "inspect", "--raw", "--retry-times", "0", by_digest], capture_output=True,
                       timeout=300)
    assert (r.returncode, r.stdout) == (0, idx.manifest_bytes), r.stderr
    r = subprocess.run([*skopeo, "copy", "--all", "--retry-times", "0", by_digest, f"dir:{tmp_path / 'all'}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "all" / "manifest.json").read_bytes() == idx.manifest_bytes
    for image in idx.images:
        assert (tmp_path / "all" / f"{image.manifest_digest[7:]}.manifest.json").read_bytes() == image.manifest_bytes
    assert s.stop().returncode == 130


def test_entries_the_bundle_lacks_are_not_served_and_tls_nodes_get_the_ca(services, factory, mirrored, serving,
                                                                          tmp_path):
    """Upstream's index with attestations (buildx --provenance), fetched for this host's platform only: the tag is
    that platform's manifest (as before), upstream's digest is answered byte for byte, every entry the bundle lacks
    is a 404 naming it; containerd 1.7 pulls by the pinned digest over TLS with the files serve printed (hosts.toml,
    and the CA from --tls-ca beside it)."""
    mine, other = host_arch(), {"amd64": "arm64", "arm64": "amd64"}[host_arch()]
    images = {arch: factory.image(arch, layers=1) for arch in ("amd64", "arm64")}
    idx = factory.attested([images["amd64"], images["arm64"]])
    ms = mirrored(idx, tag="v3", targets=("upstream",))
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\nurl = "http://{services.plain}"\n'
                   "upstream = true\ninsecure = true\n")
    out = tmp_path / "mine"
    r = imgtool("fetch", "--no-tool", f"quay.io/{ms.repo}:v3", "--arch", mine, "--mirrors", str(cfg), "-o", str(out),
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    certs = Path(services.tls_ca).parent
    tls = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"), "--tls-ca", services.tls_ca]
    s = serving(str(out), "--listen", "127.0.0.1:0", *tls)
    shown = {"amd64": "linux/amd64", "arm64": "linux/arm64/v8"}
    assert s.proc.stdout.readline().rstrip("\n") == f"  quay.io/{ms.repo}: v3"
    assert s.proc.stdout.readline().rstrip("\n") == (
        f"note: quay.io/{ms.repo}:v3 is served as its {shown[mine]} manifest; upstream's index {idx.manifest_digest} "
        f"by digest, without the 3 entries the bundles lack ({shown[other]}, attestation, attestation)")
    files = startup_node_config(s, out, *tls)
    ca = Path(services.tls_ca).read_text()
    assert files["/etc/containerd/certs.d/quay.io/ca.crt"] == ca
    assert files["/etc/containers/certs.d/" + s.hostport + "/ca.crt"] == ca
    assert files["/etc/docker/certs.d/" + s.hostport + "/ca.crt"] == ca

    base = f"{s.url}/v2/{ms.repo}/manifests"
    r = requests.get(f"{base}/v3", verify=services.tls_ca)
    assert (r.status_code, r.content) == (200, images[mine].manifest_bytes)  # as before: the platform's manifest
    r = requests.get(f"{base}/{idx.manifest_digest}", verify=services.tls_ca)
    assert (r.status_code, r.content, r.headers["Docker-Content-Digest"]) == (200, idx.manifest_bytes,
                                                                              idx.manifest_digest)
    of = f"upstream's index {idx.manifest_digest} (tag v3)"
    for digest, what in [(images[other].manifest_digest, f"the {shown[other]} manifest of {of}"),
                         (idx.attestations[0][0], f"an attestation manifest of {of}")]:
        r = requests.get(f"{base}/{digest}", verify=services.tls_ca)
        assert (r.status_code, errors(r)) == (404, ["MANIFEST_UNKNOWN"])
        assert r.json()["errors"][0]["message"] == (f"quay.io/{ms.repo}@{digest} is {what}, which the bundles served "
                                                    "here do not hold")

    hosts = tmp_path / "certs.d"
    for path, content in files.items():
        if path.startswith("/etc/containerd/certs.d/"):
            (hosts / path[len("/etc/containerd/certs.d/"):]).parent.mkdir(parents=True, exist_ok=True)
            (hosts / path[len("/etc/containerd/certs.d/"):]).write_text(content)
    assert 'ca = "ca.crt"' in (hosts / "quay.io" / "hosts.toml").read_text()  # beside it: the node's path works too
    pinned = f"quay.io/{ms.repo}:v3@{idx.manifest_digest}"
    node = ContainerdNode("containerd-1.7", services)
    node.removals.append(pinned)
    try:
        r = node.ctr("images", "pull", "--hosts-dir", str(hosts), "--platform", f"linux/{mine}", pinned, check=False)
        assert r.returncode == 0, r.stderr
        assert [row[2] for row in node.refs() if row[0] == pinned] == [idx.manifest_digest]
        assert node.ctr("content", "get", images[mine].manifest_digest).stdout.encode() == images[mine].manifest_bytes
    finally:
        assert node.cleanup() == []
