"""`imgtool serve`: a read-only OCI distribution endpoint straight from bundles (no copy, no unpacking; a
compressed bundle only from its archive unpacked once with --unpack-to).

Every node of a cluster pulls from one node holding the bundle: `GET /v2/`, manifests by tag and
digest, blobs by digest with Range, tags/list, _catalog; writes are 405. Names and digests are
looked up in bundle.catalog (a function of bundle.json); nothing a request says is ever a path. A bundle's
models are answered as their ModelPack artifacts, `models.local/HUB/org/name` by commit and revision.
A bundle is served only after the signature policy and `verify --quick`'s checks passed (an uncompressed
bundle's parts by size: no part is hashed before the first pull); each blob's digest
is checked in the background from the start (a blob asked for before its turn: then, or as it is sent),
and again when a part file it lies in changed since, so a part damaged later is refused per request,
never served wrong (bundle/inplace.py). Blobs go out with sendfile from the part files. Connections are
held by one selector loop, answers computed by a small pool (connections.py): an idle, dripping or slow
client holds a descriptor, never a worker. Standard library only: it runs from imgtool.pyz on Python 3.7.
"""

import functools
import io
import json
import re
import signal
import socket
import ssl
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import parse_qs, quote

from . import __version__, modelcar
from .bundle.catalog import DIGEST, MODEL_REGISTRY, TAG, Blob, Catalog, Repository, valid_name
from .bundle.inplace import Hashing, InPlaceBlobs, require_unpack_dir, unpack_archive
from .bundle.reader import read_index
from .bundle.verify import verify_bundle
from .connections import MAX_BODY, MAX_HEAD, Answer, BytesSpan, FileSpan, Limits, Loop
from .dirlock import lock_served
from .errors import BlobDamaged, Interrupted, UsageError, counted
from .fsutil import NotRegularFile, open_regular
from .model import Digest, format_size, is_attestation
from .nodeconfig import NodeConfig, node_config
from .runtimes.choice import mirror_parts
from .progress import Progress

MAX_CLIENTS = 4096  # connections held at once (a few hundred nodes, several each); then idle ones make room
TIMEOUT = 60.0  # an answer must move IMGTOOL_MIN_RATE bytes a second over each TIMEOUT seconds
REQUEST = 20.0  # seconds a request line and headers may take, whole (at most TIMEOUT)
IDLE = 15.0  # seconds a kept-alive connection may wait for its next request (at most TIMEOUT)
WORKERS = 16  # answers computed at once (a route, a stat, a manifest read, a small blob's first hash)
BACKLOG = 1024
RESERVE = 64  # descriptors beside the connections': the listener, bundles' lock files, manifests read
API_VERSION = ("Docker-Distribution-API-Version", "registry/2.0")

_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]*)$")
_TAGS = re.compile(r"^/v2/(?P<name>.+)/tags/list$")
_RANGE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$")  # 19 digits: past any size; longer is malformed, not a number
MAX_CA = 1024 * 1024  # --tls-ca: a CA bundle is a few KiB


@dataclass(frozen=True)
class Settings:
    """How to listen: address and port, TLS files, the client bounds."""

    host: str = "0.0.0.0"
    port: int = 5000
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    max_clients: int = MAX_CLIENTS
    timeout: float = TIMEOUT
    min_rate: int = 1024  # bytes a second (config.min_rate: $IMGTOOL_MIN_RATE)
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
    # the images' repositories first: a runtime's notes show the first as the example pull (a model's artifact is
    # no image a runtime runs)
    repos = sorted(catalog.repositories.items(), key=lambda kv: (kv[0][0] == MODEL_REGISTRY, kv[0]))
    images = [(r.registry, r.path + (f":{max(r.tags)}" if r.tags else "")) for _, r in repos]
    return node_config(address, settings.scheme, images, mirror_parts(), ca_pem=ca, ca_file=settings.tls_ca if ca else None,
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
            head = f"{repo.name}:{tag} is served as an index of the {counted(len(digests), 'platform')} the bundle holds " \
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
            out.append(f"{head}; upstream's index {d} by digest, without the {counted(len(lacking), 'entry', 'entries')} "
                       f"the bundles lack ({', '.join(lacking)})")
    return out


def model_notes(catalog: Catalog) -> List[str]:
    """What startup says of each model: the artifact it is served as, or why it is not."""
    out = []
    for model, name in catalog.models:
        what = (f"{model.ref} (commit {model.commit[:12]}, {counted(len(model.files), 'file')}, "
                f"{format_size(model.size)})")
        if name is None:
            out.append(f"{what} is not served: {model.model_ref.repo} is not a repository name a registry takes")
            continue
        left = len(model.files) - len(model.carried)
        car = model.modelcar()
        out.append(f"{what} is served as its ModelPack artifact {name}@{model.manifest_digest}"
                   + (f" and its modelcar image {name}:{modelcar.tag(model.commit)} ({car.digest})" if car else "")
                   + (f"; the {counted(left, 'file')} the delta leaves out {'is' if left == 1 else 'are'} not served"
                      if left else ""))
    return out


def open_bundles(dirs: Sequence[Path], *, signers: Optional[str], progress: Progress,
                 unpack_to: Optional[Path] = None) -> Tuple[Catalog, Dict[int, Path]]:
    """Each bundle read, then checked as `verify --quick` does under the signature policy (an uncompressed one's
    parts by size only: its blobs are checked as they are served); a compressed one
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
    for d, index in zip(dirs, indexes):
        # an uncompressed bundle's parts are not hashed here: every blob served is checked against its digest (in
        # the background from the start, or before or as it is sent), so the first pull waits for no hash; a
        # compressed one's parts are, as its archive is unpacked from them anyway
        report = verify_bundle(Path(d), quick=True, progress=progress, signers=signers, doing="serve",
                               hash_parts=index.archive.compression != "none")
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


class _Server:
    """The listening socket, the connection loop over it, the answers, the background check of every blob."""

    def __init__(self, settings: Settings, catalog: Catalog, parts: InPlaceBlobs, log: Callable[[str], None]):
        self.settings, self.catalog, self.parts, self._log = settings, catalog, parts, log
        self.log_lock = threading.Lock()
        self.requests = 0
        self.tls: Optional[ssl.SSLContext] = None
        self.stopping = threading.Event()
        self.checker: Optional[threading.Thread] = None
        self.interrupted = False
        connections = _room_for(settings.max_clients, self.log)
        self.socket = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((settings.host, settings.port))
            self.socket.listen(BACKLOG)
        except OSError as e:
            self.socket.close()
            raise UsageError(f"cannot listen on {settings.host}:{settings.port}: {e.strerror or e}",
                             hint="choose another --listen ADDR:PORT (a port below 1024 needs root)") from None
        self.server_address = self.socket.getsockname()
        if settings.tls_cert:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                self.tls.load_cert_chain(settings.tls_cert, settings.tls_key)
            except (OSError, ssl.SSLError) as e:
                self.socket.close()
                raise UsageError(f"cannot use --tls-cert {settings.tls_cert} with --tls-key {settings.tls_key}: "
                                 f"{getattr(e, 'strerror', None) or e}",
                                 hint="give a PEM certificate (chain) and its PEM private key") from None
        limits = Limits(connections=connections, request=min(REQUEST, settings.timeout),
                        idle=min(IDLE, settings.timeout), rate=settings.min_rate, window=settings.timeout)
        self.loop = Loop(self.socket, self._answer, limits=limits, workers=WORKERS, log=self.log, tls=self.tls)

    def log(self, line: str, request: bool = False) -> None:
        with self.log_lock:
            self.requests += request
            self._log(line)

    def interrupt(self) -> None:
        """Ctrl-C or SIGTERM (a signal handler's call): the loop ends at its next turn, then serve() says so."""
        self.interrupted = True
        self.loop.request_stop()

    def serve_forever(self) -> None:
        """Check every blob in the background and answer until stop() (or a signal's KeyboardInterrupt)."""
        if self.checker is None:
            self.checker = threading.Thread(target=self._check_all, name="serve-check")
            self.checker.start()
        self.loop.run()

    def _check_all(self) -> None:
        started = time.monotonic()
        try:
            done = self.parts.check_all(self.stopping, lambda e: self.log(f"serve: {e.message}"))
        except Exception as e:  # a bug: said; each blob is still checked before (or as) it is served
            self.log(f"serve: the background check of the blobs ended: {type(e).__name__}: {_printable(str(e))}")
            return
        if done is not None:
            blobs, size, bad = done
            self.log(f"serve: all {counted(blobs, 'blob')} checked ({format_size(size)}) in {time.monotonic() - started:.1f} s: " +
                     (f"{bad} damaged, refused per request" if bad else "every digest matches"))

    def _answer(self, client_address: Tuple, data: bytes, started: float, whole: bool) -> Answer:
        return _Handler(self, client_address, data, started).answer(whole)

    def stop(self) -> None:
        """Close the listener, cut every open connection and join every thread (again: nothing to do)."""
        self.stopping.set()
        self.loop.stop()
        if self.checker is not None:
            self.checker.join()
        self.socket.close()


def _room_for(connections: int, log: Callable[[str], None]) -> int:
    """How many connections the open-file limit leaves room for (each may hold a socket and a part file): the soft
    limit raised to the hard one when it is lower than that needs, said in the log; fewer when even that is short."""
    try:
        import resource
    except ImportError:  # not on Linux: as the system allows
        return connections
    need = 2 * connections + RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = hard if hard != resource.RLIM_INFINITY else need
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log(f"serve: raised the open-file limit (ulimit -n) from {soft} to {target}, its hard limit, for up to "
                f"{connections} connections")
            soft = target
        except (ValueError, OSError) as e:
            log(f"serve: cannot raise the open-file limit (ulimit -n) from {soft}: {e}")
    if soft != resource.RLIM_INFINITY and soft < need:
        fit = max((soft - RESERVE) // 2, 1)
        log(f"serve: the open-file limit (ulimit -n {soft}) leaves room for {fit} connections, not {connections}: "
            "raise its hard limit (LimitNOFILE= in a systemd unit) for more")
        return fit
    return connections


class _Handler(BaseHTTPRequestHandler):
    """One request, whole in `data`: its answer, written into memory (the loop sends it)."""

    protocol_version = "HTTP/1.1"
    server_version = f"imgtool/{__version__}"
    server: _Server  # type: ignore[assignment]  # not a socketserver's: the loop reads and sends

    def __init__(self, server: _Server, client_address: Tuple, data: bytes, started: float):
        # not super().__init__: socketserver's would read and answer a socket; here the loop does both
        self.server = server
        self.client_address = client_address
        self.rfile = io.BytesIO(data)
        self.out = io.BytesIO()
        self.wfile = self.out
        self.close_connection = True
        self.status, self.started, self.note = 0, started, ""
        self.head_len = 0
        self.spans: List[Union[FileSpan, BytesSpan]] = []
        self.check: Optional[Hashing] = None
        self.logged = False

    def version_string(self) -> str:
        return self.server_version  # not Python's version: nothing a client needs

    def answer(self, whole: bool) -> Answer:
        if whole:
            self.handle_one_request()
        else:
            self.command, self.path, self.request_version, self.requestline = "", "", "HTTP/1.1", ""
            self.send_error(431, f"request line and headers longer than {MAX_HEAD} bytes")
            self.close_connection = True
        head = self.out.getvalue()
        return Answer(head, self.head_len or len(head), self.spans, self.check, self.close_connection,
                      self._done if self.logged else None)

    def end_headers(self) -> None:
        super().end_headers()
        self.head_len = self.wfile.tell()

    # --- the one log line per request ---------------------------------------------------------

    def log_request(self, code="-", size="-") -> None:
        self.status = int(code) if str(code).isdigit() else 0

    def log_message(self, format, *args) -> None:  # http.server's own errors (a bad request line)
        self.server.log(f"{self.client_address[0]} - {_printable(format % args)}")

    def _logged(self, head: bool) -> None:
        self.logged = True  # its line is said once the answer went out (or was cut): _done
        try:
            self._drop_body()
            self._route(head)
        except _Refusal as r:
            self._refuse(r, head)
        except BlobDamaged as e:
            self.note = e.message
            self._refuse(_Refusal(500, "UNKNOWN", e.message), head)
        except ConnectionError as e:
            self.close_connection = True
            self.note = f"connection ended: {type(e).__name__}"

    def _done(self, sent: int, note: str) -> None:
        line = (f"{self.client_address[0]} {self.command} {_printable(self.path)} {self.status or '-'} "
                f"{sent} {time.monotonic() - self.started:.3f}s")
        notes = "; ".join(n for n in (self.note, note) if n)
        self.server.log(line + (f" ({notes})" if notes else ""), request=True)

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
        catalog = self.server.catalog
        size = catalog.size_of(digest)
        if digest not in repo.blobs or size is None:
            raise _Refusal(404, "BLOB_UNKNOWN", f"{repo.name} has no blob {digest} in the bundles served here")
        wanted = parse_range(self.headers.get("Range"), size)
        start, end = wanted if wanted else (0, size)
        headers = [API_VERSION, ("Content-Type", "application/octet-stream"), ("Content-Length", str(end - start)),
                   ("Docker-Content-Digest", str(digest)), ("Accept-Ranges", "bytes"), ("Etag", f'"{digest}"')]
        if wanted:
            headers.append(("Content-Range", f"bytes {start}-{end - 1}/{size}"))
        # the bytes in the parts: the blob's, or a modelcar layer's raw file (the head and tail are bundle.json's)
        framed = catalog.framed.get(digest)
        blob = catalog.blobs.get(framed.raw if framed is not None else digest)
        if not head and blob is not None:  # a big blob asked for whole before its turn is checked as it goes out
            if framed is None:
                self.check = self.server.parts.check(blob, whole=not wanted)
            elif start < len(framed.head) + framed.raw_size and end > len(framed.head):  # some of the file is sent
                self.check = self.server.parts.check(blob, whole=start <= len(framed.head) and
                                                     end >= len(framed.head) + framed.raw_size)
            if self.check is not None:
                self.note = "checked as it was sent"
        self.send_response(206 if wanted else 200)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.spans = self._body(digest, blob, start, end)

    def _body(self, digest: Digest, blob: Optional[Blob], start: int, end: int) -> List[Union[FileSpan, BytesSpan]]:
        """What a blob's answer sends: its bytes in the parts (`blob`'s: the blob, or a modelcar layer's raw file)
        and the bytes bundle.json makes."""
        out: List[Union[FileSpan, BytesSpan]] = []
        for p in self.server.catalog.pieces(digest, start, end):
            if isinstance(p, bytes):
                out.append(BytesSpan(p))
            else:
                assert blob is not None  # a span lies in the parts of a blob the catalog holds
                out.append(FileSpan(functools.partial(self.server.parts.open, blob, p.part), p.offset, p.length))
        return out


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



def serve(dirs: Sequence[Path], catalog: Catalog, settings: Settings, *, say: Callable[[str], None],
          log: Callable[[str], None], unpacked: Optional[Dict[int, Path]] = None) -> Served:
    """Answer the distribution API from the catalog's bundles until Ctrl-C or SIGTERM; raises UsageError (cannot
    listen, bad TLS files), Interrupted (Ctrl-C, SIGTERM: every connection closed, every worker joined)."""
    started = time.monotonic()
    server = _Server(settings, catalog, InPlaceBlobs(dirs, catalog, unpacked), log)
    old = {}
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C and SIGTERM (systemd's stop) ask the loop to end rather than raise wherever the main thread is (a
        # KeyboardInterrupt inside the pool's submit left a thread never started, which its shutdown cannot join)
        for signum in (signal.SIGINT, signal.SIGTERM):
            old[signum] = signal.signal(signum, lambda signum, frame: server.interrupt())
    try:
        startup(dirs, catalog, settings, server.server_address, unpacked or {}, say)
        server.serve_forever()
        if server.interrupted:
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        server.stop()  # first: the requests cut short are logged and counted
        raise Interrupted(f"interrupted: imgtool serve stopped after {server.requests} requests") from None
    finally:
        server.stop()
        for signum, handler in old.items():
            signal.signal(signum, handler)
    return Served(server.requests, time.monotonic() - started)


def startup(dirs: Sequence[Path], catalog: Catalog, settings: Settings, address: Tuple, unpacked: Dict[int, Path],
            say: Callable[[str], None]) -> None:
    """What serve says as it starts: where it listens, what it serves, each bundle's notes, and what every node needs
    (nodeconfig); raises UsageError (a bad --tls-ca)."""
    host, port = str(address[0]), address[1]
    shown = f"[{host}]" if ":" in host else host
    tags = sum(len(r.tags) for r in catalog.repositories.values())
    say(f"serving {counted(len(catalog.repositories), 'repository', 'repositories')} ({counted(tags, 'tag')}) from "
        f"{counted(len(dirs), 'bundle')} at {settings.scheme}://{shown}:{port}/ (Ctrl-C stops)")
    for repo in sorted(catalog.repositories.values(), key=lambda r: r.name):
        say(f"  {repo.name}: {', '.join(sorted(repo.tags)) or '(by digest only)'}")
    for d, index in zip(dirs, catalog.indexes):
        if index.is_delta:
            n = len(index.omitted_chains())
            say(f"note: {d} is a delta bundle: the {counted(n, 'layer')} it leaves out {'is' if n == 1 else 'are'} "
                f"not served; only nodes that hold {'it' if n == 1 else 'them'} already can pull its images")
    for b, path in sorted(unpacked.items()):
        say(f"note: {dirs[b]} is {catalog.indexes[b].archive.compression}-compressed: served from its archive "
            f"unpacked into {path}")
    for conflict in catalog.conflicts:
        say(f"note: {conflict} differs between the bundles: the first bundle's is served")
    for line in model_notes(catalog):
        say(f"note: {line}")
    for repo in catalog.repositories.values():
        for note in index_notes(repo):
            say(f"note: {note}")
    nodes, why = nodes_need(catalog, settings, port)
    if why:
        say(f"note: {why}")
    for line in nodes.lines():
        say(line)
