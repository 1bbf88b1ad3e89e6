"""`imgtool serve`: a read-only OCI distribution endpoint straight from bundles (no copy, no unpacking; a
compressed bundle only from its archive unpacked once with --unpack-to).

Every node of a cluster pulls from one node holding the bundle: `GET /v2/`, manifests by tag and
digest, blobs by digest with Range, tags/list, _catalog; writes are 405. Names and digests are
looked up in bundle.catalog (a function of bundle.json); nothing a request says is ever a path.
A bundle is served only after `verify --quick` and the signature policy passed; each blob's digest
is checked the first time it is read (and again when a part file it lies in changed since), so a
part damaged later is refused per request, never served wrong. Blobs go out with sendfile from the
part files. One bounded pool of worker threads; every socket has a timeout. Standard library only:
it runs from imgtool.pyz on Python 3.7.
"""

import json
import os
import re
import signal
import socket
import ssl
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import TCPServer
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import parse_qs, quote

from . import __version__
from .bundle.catalog import DIGEST, TAG, Blob, Catalog, Repository, valid_name
from .bundle.inplace import InPlaceBlobs, require_unpack_dir, unpack_archive
from .bundle.reader import read_index
from .bundle.verify import verify_bundle
from .dirlock import lock_served
from .errors import BlobDamaged, Interrupted, UsageError
from .fsutil import NotRegularFile, open_regular
from .model import Digest, format_size, is_attestation
from .nodeconfig import NodeConfig, node_config
from .progress import Progress

MAX_CLIENTS = 64  # connections served at once; more wait in the listen backlog
TIMEOUT = 60.0  # seconds a client may stay silent (or not read) before its connection is closed
IDLE = 15.0  # seconds a kept-alive connection may wait for its next request
BACKLOG = 256
API_VERSION = ("Docker-Distribution-API-Version", "registry/2.0")

_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]*)$")
_TAGS = re.compile(r"^/v2/(?P<name>.+)/tags/list$")
_RANGE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$")  # 19 digits: past any size; longer is malformed, not a number
MAX_CA = 1024 * 1024  # --tls-ca: a CA bundle is a few KiB
MAX_BODY = 64 * 1024  # a GET or HEAD has no use for a body: one this small is read and dropped, a bigger one refused


@dataclass(frozen=True)
class Settings:
    """How to listen: address and port, TLS files, the client bounds."""

    host: str = "0.0.0.0"
    port: int = 5000
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    max_clients: int = MAX_CLIENTS
    timeout: float = TIMEOUT
    advertise: Optional[Tuple[str, Optional[int]]] = None  # --advertise: the host (and port) nodes reach it by
    tls_ca: Optional[str] = None  # --tls-ca: the CA certificate nodes trust, written into the node configuration

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"


def parse_listen(text: str) -> Tuple[str, int]:
    """`ADDR:PORT`, `:PORT` or `[v6]:PORT` -> (address, port); raises UsageError."""
    m = re.match(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]*)):(?P<port>[0-9]{1,5})$", text or "")
    if not m or int(m.group("port")) > 65535:
        raise UsageError(f"invalid --listen {text!r}: expected ADDR:PORT, e.g. 0.0.0.0:5000 or 127.0.0.1:5000")
    return m.group("v6") or m.group("host") or "0.0.0.0", int(m.group("port"))


def parse_advertise(text: str) -> Tuple[str, Optional[int]]:
    """`--advertise HOST[:PORT]` (`[v6]:PORT`) -> (host, port or None); raises UsageError."""
    m = re.match(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?))"
                 r"(?::(?P<port>[0-9]{1,5}))?$", text or "")
    if not m or (m.group("port") and not 0 < int(m.group("port")) <= 65535):
        raise UsageError(f"invalid --advertise {text!r}: expected HOST or HOST:PORT (the address nodes reach this "
                         "server by), e.g. 10.0.0.5 or node1.example:5000")
    return m.group("v6") or m.group("host"), int(m.group("port")) if m.group("port") else None


_WILDCARD = ("", "0.0.0.0", "::")


def advertised(settings: Settings, port: int) -> Tuple[str, str]:
    """HOST:PORT nodes reach the server by (--advertise, else the --listen address, else on every address this
    host's name: socket.gethostname, no DNS asked), and the reason for a note."""
    host, why = settings.host, ""
    if settings.advertise is not None:
        host, port = settings.advertise[0], settings.advertise[1] or port
    elif host in _WILDCARD:
        host = socket.gethostname()
        why = (f"{host} is this host's name: nodes must resolve it, else give --advertise ADDR (listening on every "
               "address)")
    return (f"[{host}]" if ":" in host else host) + f":{port}", why


def read_ca(path: str) -> str:
    """--tls-ca's PEM text: a regular file of at most 1 MiB holding certificates; raises UsageError."""
    hint = "give the PEM certificate of the CA that issued --tls-cert"
    try:
        with open_regular(path) as f:
            data = f.read(MAX_CA + 1)
    except (OSError, NotRegularFile) as e:
        raise UsageError(f"cannot use --tls-ca {path}: {getattr(e, 'strerror', None) or e}", hint=hint) from None
    text = data.decode("ascii", "replace")
    if len(data) > MAX_CA or "-----BEGIN CERTIFICATE-----" not in text:
        raise UsageError(f"cannot use --tls-ca {path}: it is not a PEM certificate (of at most {MAX_CA} bytes)",
                         hint=hint)
    try:
        ssl.create_default_context(cadata=text)  # what a node's TLS client will do with it
    except (ssl.SSLError, ValueError) as e:
        raise UsageError(f"cannot use --tls-ca {path}: {e}", hint=hint) from None
    return text if text.endswith("\n") else text + "\n"


def nodes_need(catalog: Catalog, settings: Settings, port: int) -> Tuple[NodeConfig, str]:
    """What each node needs to pull from this server (nodeconfig.py), and why its address, for a note; raises
    UsageError (a bad --tls-ca)."""
    address, why = advertised(settings, port)
    ca = read_ca(settings.tls_ca) if settings.tls_cert and settings.tls_ca else None
    images = [(r.registry, r.path + (f":{max(r.tags)}" if r.tags else "")) for _, r in sorted(catalog.repositories.items())]
    return node_config(address, settings.scheme, images, ca_pem=ca, ca_file=settings.tls_ca if ca else None,
                       tls_cert=settings.tls_cert), why


def index_notes(repo: Repository) -> List[str]:
    """What startup says of each tag answered with an index, and of upstream's indexes answered by digest."""
    out = []
    for tag in sorted(repo.tags):
        digests, served = repo.tags[tag], repo.resolve(tag)
        platforms = ", ".join(repo.manifests[d].platform for d in digests)
        if served is not None and repo.served_upstream(served):
            out.append(f"{repo.name}:{tag} is served as upstream's index {served} ({platforms})")
            continue
        upstream = [d for d, t in repo.upstream.items() if t == tag and repo.served_upstream(d)]
        if served in repo.indexes.values():
            head = f"{repo.name}:{tag} is served as an index of the {len(digests)} platforms the bundle holds " \
                   f"({platforms}): {served}"
        elif upstream:
            head = f"{repo.name}:{tag} is served as its {platforms} manifest"
        else:
            continue
        if not upstream:
            out.append(head + ", not upstream's digest")
        for d in upstream:
            lacking = [("attestation" if is_attestation(e) else str(e.platform or "?"))
                       for e in repo.kept[d].entries if e.digest in repo.lacking]
            out.append(f"{head}; upstream's index {d} by digest, without the {len(lacking)} entries the bundles "
                       f"lack ({', '.join(lacking)})")
    return out


def open_bundles(dirs: Sequence[Path], *, signers: Optional[str], progress: Progress,
                 unpack_to: Optional[Path] = None) -> Tuple[Catalog, Dict[int, Path]]:
    """Each bundle read, then checked as `verify --quick` does under the signature policy; a compressed one
    unpacked into `unpack_to` (refused without it). The catalog, and each compressed bundle's unpacked archive;
    raises UsageError (not a bundle, compressed without --unpack-to), VerifyError/SignatureError (refused),
    ImgtoolError (no room to unpack)."""
    indexes = []
    for d in dirs:
        index, _ = read_index(Path(d))
        if index.archive.compression != "none" and unpack_to is None:
            raise UsageError(f"cannot serve {d}: it is a {index.archive.compression}-compressed bundle, whose blobs "
                             "cannot be read in place; nothing is served",
                             hint=f"serve it with --unpack-to DIR (unpacked once there: "
                                  f"{format_size(index.archive.tar_size)}), or fetch it without --compress")
        indexes.append(index)
    if unpack_to is not None and any(index.archive.compression != "none" for index in indexes):
        require_unpack_dir(unpack_to)
    for d in dirs:
        report = verify_bundle(Path(d), quick=True, progress=progress, signers=signers, doing="serve")
        for w in report.warnings:
            progress.warn(w)
        report.raise_if_bad("serve")
    unpacked = {}
    for b, (d, index) in enumerate(zip(dirs, indexes)):
        if index.archive.compression != "none" and unpack_to is not None:
            unpacked[b] = unpack_archive(Path(d), index, unpack_to, progress)
    return Catalog(indexes), unpacked


def hold_bundles(dirs: Sequence[Path]) -> ExitStack:
    """The bundle directories' shared locks (dirlock.py), held while they are served: `fetch --force` and
    `export --force` refuse to replace a served bundle, naming this server. Raises DirectoryBusy while a fetch
    or export writes one of them."""
    held = ExitStack()
    try:
        for d in dirs:
            lock = lock_served(Path(d))
            if lock is not None:  # None: this user cannot write there, so neither replace it
                held.enter_context(lock)
    except BaseException:
        held.close()
        raise
    return held


class _Refusal(Exception):
    """An error document to answer with: status, distribution error code, message."""

    def __init__(self, status: int, code: str, message: str, headers: Sequence[Tuple[str, str]] = ()):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, list(headers)


def parse_range(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """A single `bytes=` range as [start, end), None when there is no Range header; raises _Refusal 416 for any
    other Range: past the end, last before first, several ranges, another unit, numbers of more than 19 digits
    (int() of thousands of digits raised ValueError and dropped the connection), anything malformed."""
    if header is None:
        return None
    m = _RANGE.match(header.strip())
    if not m or not (m.group(1) or m.group(2)):
        raise _unsatisfiable(header, size, "is not one range of bytes=FIRST-LAST, bytes=FIRST- or bytes=-SUFFIX")
    first, last = m.group(1), m.group(2)
    if not first:
        n = int(last)
        if n == 0 or size == 0:
            raise _unsatisfiable(header, size)
        return max(size - n, 0), size
    start = int(first)
    if last and int(last) < start:
        raise _unsatisfiable(header, size, "ends before it starts")
    if start >= size:
        raise _unsatisfiable(header, size)
    return start, min(int(last) + 1, size) if last else size


def _unsatisfiable(header: str, size: int, why: str = "") -> _Refusal:
    what = _printable(header, 80)
    return _Refusal(416, "SIZE_INVALID", f"range {what} {why}" if why else
                    f"range {what} is not within the blob ({size} bytes)", [("Content-Range", f"bytes */{size}")])


class _Server(HTTPServer):
    """An HTTP server whose connections are handled by a bounded pool of worker threads."""

    request_queue_size = BACKLOG

    def __init__(self, settings: Settings, catalog: Catalog, parts: InPlaceBlobs, log: Callable[[str], None]):
        self.settings, self.catalog, self.parts, self._log = settings, catalog, parts, log
        self.address_family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        self.slots = threading.BoundedSemaphore(settings.max_clients)
        self.pool = ThreadPoolExecutor(max_workers=settings.max_clients, thread_name_prefix="serve")
        self.active: set = set()
        self.active_lock = threading.Lock()
        self.log_lock = threading.Lock()
        self.requests = 0
        self.stopped = False
        self.tls: Optional[ssl.SSLContext] = None
        try:
            super().__init__((settings.host, settings.port), _Handler)
        except OSError as e:
            self.pool.shutdown(wait=True)
            raise UsageError(f"cannot listen on {settings.host}:{settings.port}: {e.strerror or e}",
                             hint="choose another --listen ADDR:PORT (a port below 1024 needs root)") from None
        if settings.tls_cert:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                self.tls.load_cert_chain(settings.tls_cert, settings.tls_key)
            except (OSError, ssl.SSLError) as e:
                self.stop()
                raise UsageError(f"cannot use --tls-cert {settings.tls_cert} with --tls-key {settings.tls_key}: "
                                 f"{getattr(e, 'strerror', None) or e}",
                                 hint="give a PEM certificate (chain) and its PEM private key") from None

    def log(self, line: str, request: bool = False) -> None:
        with self.log_lock:
            self.requests += request
            self._log(line)

    def process_request(self, request, client_address) -> None:
        # blocks the accept loop while every worker is busy: a flood waits in the backlog, never a thread each
        self.slots.acquire()
        with self.active_lock:
            self.active.add(request)
        try:
            self.pool.submit(self._work, request, client_address)
        except RuntimeError:  # the pool is shut down: stopping
            self._done(request)

    def _work(self, request, client_address) -> None:
        conn = request
        try:
            if self.tls is not None:  # the handshake here, in the worker and under the timeout, never in the accept loop
                request.settimeout(self.settings.timeout)
                conn = self.tls.wrap_socket(request, server_side=True)
                with self.active_lock:
                    self.active.discard(request)
                    self.active.add(conn)
            self.finish_request(conn, client_address)
        # A client gone mid-answer, a failed TLS handshake, and a bug in one answer too: one line, and the server goes
        # on with the other connections (as socketserver's handle_error; a traceback with --debug is not worth a dead
        # registry under a whole cluster).
        except Exception as e:
            self.log(f"{client_address[0]} - connection ended: {type(e).__name__}: {_printable(str(e))}")
        finally:
            self._done(conn)

    def server_bind(self) -> None:
        # HTTPServer's asks DNS for the host's name (getfqdn): an air-gapped host may wait on that
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def _done(self, request) -> None:
        self.shutdown_request(request)
        with self.active_lock:
            self.active.discard(request)
        self.slots.release()

    def stop(self) -> None:
        """Close the listener, cut every open connection and join every worker (again: nothing to do)."""
        if self.stopped:
            return
        self.stopped = True
        self.server_close()
        with self.active_lock:
            open_now = list(self.active)
        for conn in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.pool.shutdown(wait=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"imgtool/{__version__}"
    server: _Server

    def version_string(self) -> str:
        return self.server_version  # not Python's version: nothing a client needs

    def setup(self) -> None:
        self.wait = self.server.settings.timeout
        self.idle = False
        self.request.settimeout(self.wait)
        # headers and a small body are two writes: with Nagle's algorithm the second waits for the client's delayed
        # ACK (40 ms per manifest, config and /v2/ on a kept-alive connection); blobs go out in full segments anyway
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()
        self.status, self.sent, self.started, self.note = 0, 0, time.monotonic(), ""

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            # a kept-alive connection waits for its next request a shorter while (Docker keeps idle ones)
            self.idle = True
            self.connection.settimeout(min(IDLE, self.wait))
            self.status, self.sent, self.started, self.note = 0, 0, time.monotonic(), ""
            self.handle_one_request()

    def parse_request(self) -> bool:
        self.idle = False
        self.started = time.monotonic()
        self.connection.settimeout(self.wait)
        return super().parse_request()

    # --- the one log line per request ---------------------------------------------------------

    def log_request(self, code="-", size="-") -> None:
        self.status = int(code) if str(code).isdigit() else 0

    def log_message(self, format, *args) -> None:  # http.server's own errors (bad request line, timeout)
        if self.idle:  # a kept-alive connection closed after its last request: nothing to say
            return
        self.server.log(f"{self.client_address[0]} - {_printable(format % args)}")

    def _logged(self, head: bool) -> None:
        try:
            self._drop_body()
            self._route(head)
        except _Refusal as r:
            self._refuse(r, head)
        except BlobDamaged as e:
            self.note = e.message
            self._refuse(_Refusal(500, "UNKNOWN", e.message), head)
        except (ConnectionError, socket.timeout) as e:
            self.close_connection = True
            self.note = f"connection ended: {type(e).__name__}"
        finally:
            line = (f"{self.client_address[0]} {self.command} {_printable(self.path)} {self.status or '-'} "
                    f"{self.sent} {time.monotonic() - self.started:.3f}s")
            self.server.log(line + (f" ({self.note})" if self.note else ""), request=True)

    def _drop_body(self) -> None:
        """Read a request's body (Content-Length, at most MAX_BODY) and drop it, so it is never parsed as the next
        request; refuse one that is chunked (411) or too big or unreadable in length (413, 400), and close."""
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            raise _Refusal(411, "UNSUPPORTED", "a request body must have a Content-Length (no Transfer-Encoding)")
        length = self.headers.get_all("Content-Length") or []
        if not length:
            return
        if len(set(length)) != 1 or not re.match(r"^\d{1,19}$", length[0].strip()):
            self.close_connection = True
            raise _Refusal(400, "UNSUPPORTED", "malformed Content-Length")
        n = int(length[0])
        if n > MAX_BODY:
            self.close_connection = True
            raise _Refusal(413, "UNSUPPORTED", f"a request body of {n} bytes (at most {MAX_BODY} are read)")
        if self.command not in ("GET", "HEAD"):
            self.close_connection = True  # a write is refused whatever it sends: not read, the connection ends
            return
        while n > 0:
            got = self.rfile.read(min(n, MAX_BODY))
            if not got:
                self.close_connection = True
                raise ConnectionError("the client ended the connection in a request body")
            n -= len(got)

    def do_GET(self) -> None:
        self._logged(False)

    def do_HEAD(self) -> None:
        self._logged(True)

    def _write_refused(self) -> None:
        self.close_connection = True  # its body (if any) is not read: the connection ends with the answer
        self._logged(False)

    do_POST = do_PUT = do_PATCH = do_DELETE = _write_refused

    # --- answers --------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, head: bool, headers: Sequence[Tuple[str, str]] = (),
              content_type: str = "application/json") -> None:
        self.send_response(status)
        for k, v in [API_VERSION, ("Content-Type", content_type), ("Content-Length", str(len(body)))] + list(headers):
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)
            self.sent += len(body)

    def _refuse(self, r: _Refusal, head: bool) -> None:
        body = json.dumps({"errors": [{"code": r.code, "message": r.message, "detail": {}}]}).encode()
        self._send(r.status, body, head, r.headers)

    def _json(self, obj: dict, head: bool, headers: Sequence[Tuple[str, str]] = ()) -> None:
        self._send(200, json.dumps(obj).encode(), head, headers)

    def _listing(self, key: str, items: List[str], params: Dict[str, List[str]], head: bool, **fields: str) -> None:
        """A page of a sorted list (`?n=N&last=X`), with the API's `Link: <…>; rel="next"` while more follow."""
        page, more = _page(items, params)
        path = self.path.partition("?")[0]
        link = [("Link", f'<{path}?n={len(page)}&last={quote(page[-1], safe="/")}>; rel="next"')] if more else []
        self._json({**fields, key: page}, head, link)

    def _route(self, head: bool) -> None:
        if self.command not in ("GET", "HEAD"):
            raise _Refusal(405, "UNSUPPORTED", "this registry is read-only (imgtool serve)", [("Allow", "GET, HEAD")])
        path, _, query = self.path.partition("?")
        params = parse_qs(query)
        if path in ("/v2", "/v2/"):
            return self._json({}, head)
        if path == "/v2/_catalog":
            return self._listing("repositories", self.server.catalog.names(), params, head)
        m = _TAGS.match(path) or _PATH.match(path)
        if not m:
            raise _Refusal(404, "NOT_FOUND", "no such endpoint of the distribution API")
        name = m.group("name")
        if not valid_name(name):
            raise _Refusal(400, "NAME_INVALID", "invalid repository name")
        ns = params.get("ns", [None])[-1]
        repo = self.server.catalog.repository(name, ns)
        if repo is None:
            raise _Refusal(404, "NAME_UNKNOWN", f"repository {name} is not in the bundles served here")
        if "kind" not in m.groupdict():
            return self._listing("tags", sorted(repo.tags), params, head, name=name)
        if m.group("kind") == "manifests":
            return self._manifest(repo, m.group("ref"), head)
        return self._blob(repo, m.group("ref"), head)

    def _manifest(self, repo: Repository, ref: str, head: bool) -> None:
        if DIGEST.match(ref):
            digest = Digest.parse(ref)
        elif TAG.match(ref):
            found = repo.resolve(ref)
            if found is None:
                raise _Refusal(404, "MANIFEST_UNKNOWN", f"{repo.name} has no tag {ref} in the bundles served here")
            digest = found
        else:
            raise _Refusal(400, "DIGEST_INVALID" if ":" in ref else "TAG_INVALID", "invalid tag or digest")
        manifest = repo.manifests.get(digest)
        blob = self.server.catalog.blobs.get(digest)
        if manifest is None or (blob is None and manifest.data is None):
            raise _Refusal(404, "MANIFEST_UNKNOWN", repo.why_missing(digest))
        headers = [("Docker-Content-Digest", str(digest)), ("Etag", f'"{digest}"')]
        if head:
            size = blob.size if blob is not None else len(manifest.data or b"")
            self.send_response(200)
            for k, v in [API_VERSION, ("Content-Type", manifest.media_type), ("Content-Length", str(size))] + headers:
                self.send_header(k, v)
            self.end_headers()
            return
        # an index (generated, or upstream's as kept) is bundle.json's, which verify checked; a manifest is read and
        # checked
        data = self.server.parts.read(blob) if blob is not None else manifest.data or b""
        self._send(200, data, False, headers, manifest.media_type)

    def _blob(self, repo: Repository, ref: str, head: bool) -> None:
        if not DIGEST.match(ref):
            raise _Refusal(400, "DIGEST_INVALID", "invalid digest: expected sha256:<64 lowercase hex digits>")
        digest = Digest.parse(ref)
        blob = self.server.catalog.blobs.get(digest)
        if digest not in repo.blobs or blob is None:
            raise _Refusal(404, "BLOB_UNKNOWN", f"{repo.name} has no blob {digest} in the bundles served here")
        wanted = parse_range(self.headers.get("Range"), blob.size)
        start, end = wanted if wanted else (0, blob.size)
        headers = [API_VERSION, ("Content-Type", "application/octet-stream"), ("Content-Length", str(end - start)),
                   ("Docker-Content-Digest", str(digest)), ("Accept-Ranges", "bytes"), ("Etag", f'"{digest}"')]
        if wanted:
            headers.append(("Content-Range", f"bytes {start}-{end - 1}/{blob.size}"))
        if not head:
            self.server.parts.check(blob)
        self.send_response(206 if wanted else 200)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self._sendfile(blob, start, end)

    def _sendfile(self, blob: Blob, start: int, end: int) -> None:
        """The bytes from the part files with sendfile (one call per part the range crosses); over TLS, which
        sendfile cannot encrypt, copied in 1 MiB pieces (socket.sendfile's fallback sends 8 KiB at a time)."""
        parts = self.server.parts
        for span in self.server.catalog.spans(blob, start, end):
            with parts.open(blob, span.part) as f:
                if isinstance(self.connection, ssl.SSLSocket):
                    n = _copy(f, self.connection, span.offset, span.length)
                else:
                    n = _sendfile(f, self.connection, span.offset, span.length, self.wait)
            self.sent += n
            if n != span.length:  # the part shrank under us: the answer is cut, the client sees it short
                self.close_connection = True
                self.note = "a part file shrank while it was sent"
                return


def _sendfile(f, conn: socket.socket, offset: int, length: int, timeout: float) -> int:
    """`length` bytes of file `f` from `offset` sent on `conn` by the kernel: how many (fewer: the file ended);
    raises socket.timeout when the client took nothing for `timeout` seconds.

    socket.sendfile on a socket with a timeout (non-blocking underneath) sends what fits in the socket buffer, then
    polls, then wakes a Python thread to send the next piece: on a loaded host each wakeup waits for the CPU and the
    GIL. Blocking sendfile with SO_SNDTIMEO lets the kernel send the whole span in one call, the timeout its own."""
    seconds = int(timeout)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                    struct.pack("ll", seconds, int((timeout - seconds) * 1e6)))
    conn.settimeout(None)
    sent = 0
    try:
        while sent < length:
            try:
                n = os.sendfile(conn.fileno(), f.fileno(), offset + sent, length - sent)
            except BlockingIOError:  # SO_SNDTIMEO passed without a byte taken
                raise socket.timeout("timed out") from None
            if n == 0:
                break
            sent += n
    finally:
        conn.settimeout(timeout)
    return sent


def _copy(f, conn: socket.socket, offset: int, length: int) -> int:
    """`length` bytes of file `f` from `offset` sent on `conn` through one 1 MiB buffer: how many (fewer: the file
    ended)."""
    buf = bytearray(min(length, 1 << 20) or 1)
    view = memoryview(buf)
    f.seek(offset)
    sent = 0
    while sent < length:
        n = f.readinto(view[:min(length - sent, len(buf))])
        if not n:
            break
        conn.sendall(view[:n])
        sent += n
    return sent


def _page(items: List[str], params: Dict[str, List[str]]) -> Tuple[List[str], bool]:
    """`?last=X&n=N` pagination of a sorted list, as the distribution API's: the page, and whether more follow."""
    last = params.get("last", [None])[-1]
    if last is not None:
        items = [x for x in items if x > last]
    n = params.get("n", [""])[-1]
    if not n.isdigit():
        return items, False
    return items[:int(n)], 0 < int(n) < len(items)


def _printable(text: str, limit: int = 300) -> str:
    out = "".join(c if " " <= c < "\x7f" else "?" for c in text)
    return out if len(out) <= limit else out[:limit - 3] + "..."


@dataclass
class Served:
    requests: int
    seconds: float


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def serve(dirs: Sequence[Path], catalog: Catalog, settings: Settings, *, say: Callable[[str], None],
          log: Callable[[str], None], unpacked: Optional[Dict[int, Path]] = None) -> Served:
    """Answer the distribution API from the catalog's bundles until Ctrl-C or SIGTERM; raises UsageError (cannot
    listen, bad TLS files), Interrupted (Ctrl-C, SIGTERM: every connection closed, every worker joined)."""
    started = time.monotonic()
    server = _Server(settings, catalog, InPlaceBlobs(dirs, catalog, unpacked), log)
    old = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM (systemd's stop) ends it as Ctrl-C does
        old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        host, port = str(server.server_address[0]), server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        tags = sum(len(r.tags) for r in catalog.repositories.values())
        say(f"serving {len(catalog.repositories)} repositories ({tags} tags) from {len(dirs)} bundle(s) at "
            f"{settings.scheme}://{shown}:{port}/ (Ctrl-C stops)")
        for repo in sorted(catalog.repositories.values(), key=lambda r: r.name):
            say(f"  {repo.name}: {', '.join(sorted(repo.tags)) or '(by digest only)'}")
        for d, index in zip(dirs, catalog.indexes):
            if index.is_delta:
                say(f"note: {d} is a delta bundle: the {len(index.omitted_chains())} layers it leaves out are not "
                    "served; only nodes that hold them already can pull its images")
        for b, path in sorted((unpacked or {}).items()):
            say(f"note: {dirs[b]} is {catalog.indexes[b].archive.compression}-compressed: served from its archive "
                f"unpacked into {path}")
        for conflict in catalog.conflicts:
            say(f"note: {conflict} differs between the bundles: the first bundle's is served")
        for repo in catalog.repositories.values():
            for note in index_notes(repo):
                say(f"note: {note}")
        nodes, why = nodes_need(catalog, settings, port)
        if why:
            say(f"note: {why}")
        for line in nodes.lines():
            say(line)
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        server.stop()  # first: the requests cut short are logged and counted
        raise Interrupted(f"interrupted: imgtool serve stopped after {server.requests} requests") from None
    finally:
        server.stop()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    return Served(server.requests, time.monotonic() - started)

