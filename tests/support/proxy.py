"""A fault-injecting reverse proxy in front of a real registry (test support, not product).

Clients talk to the proxy as if it were the registry. Each request is matched against
the scripted faults (first match wins, each used `times` times); everything else is
forwarded unchanged, streaming. The proxy records every request (method, path, Range)
and how many body bytes it sent, so tests can assert what was transferred.
"""

import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, List, Optional, Tuple

CHUNK = 256 * 1024


@dataclass
class Fault:
    """One scripted misbehaviour: `kind` is reset|status|flip|stall|short|expiring_redirect|rate|no_range
    (the Range header is dropped: the whole blob comes back with 200)|headers (the upstream's answer with its
    headers passed through `edit`)|redirect (307 to `location` + the path: another host)|drip (the whole
    answer, status line and headers included, one byte every `seconds`)|drip_body (the headers at once, the
    body one byte every `seconds`). A `status` answer's body is `body` when given."""

    kind: str
    match: Callable[[str, str], bool]  # (method, path) -> bool
    times: int = 1
    after: int = 0  # reset/short/stall/flip: after this many body bytes
    status: int = 503
    headers: dict = field(default_factory=dict)
    seconds: float = 0.0  # stall length (0: until release()), or redirect lifetime
    rate: int = 0  # bytes/second for kind == "rate"
    body: Optional[bytes] = None  # status: the body instead of a distribution error
    edit: Optional[Callable[[List[Tuple[str, str]]], List[Tuple[str, str]]]] = None  # headers: the new headers
    location: str = ""  # redirect: where to (a base URL; the request's path is appended)
    used: int = 0
    released: threading.Event = field(default_factory=threading.Event, repr=False)
    arrived: threading.Event = field(default_factory=threading.Event, repr=False)  # set once it is first used

    def release(self) -> None:
        """End a stall that has no `seconds` (the proxy's close() ends it too)."""
        self.released.set()


class Gate:
    """Holds matching traffic until release(): new requests past the first `requests`, or body
    bytes past `bytes` in total over all matching requests. `reached` is set once something
    is held, so a test can act at a known point instead of after a guessed sleep."""

    def __init__(self, match: Callable[[str, str], bool], requests: Optional[int] = None,
                 bytes: Optional[int] = None):
        self.match, self.requests, self.bytes = match, requests, bytes
        self.lock = threading.Lock()
        self.passed_requests = 0
        self.passed_bytes = 0
        self.reached = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()

    def _hold(self) -> None:
        self.reached.set()
        self.released.wait()

    def request(self) -> None:
        """Called as a matching request arrives: waits here if it is one too many."""
        with self.lock:
            over = self.requests is not None and self.passed_requests >= self.requests
            self.passed_requests += 1
        if over and not self.released.is_set():
            self._hold()

    def allowance(self, n: int) -> int:
        """How many of the next n body bytes may go now (the rest after a hold)."""
        if self.bytes is None or self.released.is_set():
            return n
        with self.lock:
            take = max(0, min(n, self.bytes - self.passed_bytes))
            self.passed_bytes += take
        return take


@dataclass
class Record:
    method: str
    path: str
    range: Optional[str]
    status: int = 0
    sent: int = 0
    authorization: Optional[str] = None  # the Authorization header the client sent


def blob_path(path: str) -> bool:
    return "/blobs/sha256:" in path


class FaultProxy:
    """Start with `FaultProxy("127.0.0.1:5000")`; `url` is where clients connect."""

    def __init__(self, upstream: str, *, tls: Optional[Tuple[str, str]] = None, upstream_ca: Optional[str] = None):
        """`tls`: (certificate, key) to answer HTTPS; `upstream_ca`: the upstream speaks HTTPS, checked
        against this CA."""
        self.upstream = upstream
        self.scheme = "https" if tls else "http"
        self.upstream_ca = upstream_ca
        self.faults: List[Fault] = []
        self.records: List[Record] = []
        self.lock = threading.Lock()
        self._expiring = {}  # token -> (deadline, real path)
        self.gates: List[Gate] = []
        self.limit: Optional[Tuple[Callable[[str, str], bool], int]] = None  # limit_connections
        self.in_flight = self.refused = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy._handle(self)

            do_HEAD = do_GET
            do_POST = do_GET
            do_PUT = do_GET
            do_PATCH = do_GET
            do_DELETE = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.hostport}"

    def add(self, fault: Fault) -> Fault:
        with self.lock:
            self.faults.append(fault)
        return fault

    def gate(self, match: Callable[[str, str], bool], *, requests: Optional[int] = None,
             bytes: Optional[int] = None) -> Gate:
        """Hold matching requests past the first `requests`, or body bytes past `bytes` (see Gate)."""
        g = Gate(match, requests, bytes)
        with self.lock:
            self.gates.append(g)
        return g

    def wait_delivered(self, timeout: float = 60) -> bool:
        """Wait until every byte the proxy sent has been read by its client (no connection of
        the proxy has data queued in either socket, per /proc/net/tcp); False on timeout.

        After a gate holds, this is the point where the client has everything B1 counts."""
        port = f"{self.server.server_address[1]:04X}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open("/proc/net/tcp") as f:
                rows = [line.split() for line in f.read().splitlines()[1:]]
            queued = [r for r in rows if port in (r[1].split(":")[1], r[2].split(":")[1])
                      and r[4] != "00000000:00000000"]
            if not queued:
                return True
            time.sleep(0.01)
        return False

    def clear(self) -> None:
        with self.lock:
            for f in self.faults:
                f.release()
            for g in self.gates:
                g.release()
            self.faults.clear()
            self.records.clear()
            self.gates.clear()

    def close(self) -> None:
        with self.lock:
            for f in self.faults:
                f.release()
            for g in self.gates:
                g.release()
        self.server.shutdown()
        self.server.server_close()

    def blob_bytes_sent(self) -> int:
        """Body bytes of blob GETs sent so far (CDN downloads included)."""
        with self.lock:
            return sum(r.sent for r in self.records
                       if (blob_path(r.path) or r.path.startswith("/cdn/")) and r.method == "GET")

    def limit_connections(self, match: Callable[[str, str], bool], n: int) -> None:
        """Answer 503 to a matching request while `n` matching ones are being answered, as nginx's limit_conn
        does for a client over its limit; `refused` counts them."""
        self.limit = (match, n)

    def _admit(self, method: str, path: str) -> Optional[bool]:
        """None: not limited; True: counted in flight (call _leave); False: over the limit."""
        if self.limit is None or not self.limit[0](method, path):
            return None
        with self.lock:
            if self.in_flight >= self.limit[1]:
                self.refused += 1
                return False
            self.in_flight += 1
            return True

    def _leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def _take_fault(self, method: str, path: str) -> Optional[Fault]:
        with self.lock:
            for f in self.faults:
                if f.used < f.times and f.match(method, path):
                    f.used += 1
                    f.arrived.set()
                    return f
        return None

    # -- the request path ------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        method, path = h.command, h.path
        rec = Record(method, path, h.headers.get("Range"), authorization=h.headers.get("Authorization"))
        with self.lock:
            self.records.append(rec)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        # Faults match the path as requested: a CDN link (/cdn/<token>) is matched as such, so a
        # fault can target the redirected download without redirecting it again.
        fault = self._take_fault(method, path)
        with self.lock:
            gates = [g for g in self.gates if g.match(method, path)]
        for g in gates:
            g.request()
        if path.startswith("/cdn/"):
            token = path.split("/")[2]
            deadline, real = self._expiring.get(token, (0, ""))
            if time.monotonic() > deadline:
                self._reply(h, rec, 403, b"<Error>Request has expired</Error>", {"Content-Type": "application/xml"})
                return
            path = real
        admitted = self._admit(method, path)
        if admitted is False:
            self._reply(h, rec, 503, b"<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>",
                        {"Content-Type": "text/html"})
            return
        try:
            self._forward(h, rec, method, path, body, fault, gates)
        finally:
            if admitted:
                self._leave()

    def _forward(self, h, rec: Record, method: str, path: str, body, fault: Optional[Fault], gates: List[Gate]) -> None:
        if fault and fault.kind == "status":
            body = b'{"errors":[{"code":"UNAVAILABLE","message":"injected"}]}' if fault.body is None else fault.body
            self._reply(h, rec, fault.status, body, dict({"Content-Type": "application/json"}, **fault.headers))
            return
        if fault and fault.kind == "redirect":
            self._reply(h, rec, 307, b"", {"Location": fault.location + path})
            return
        if fault and fault.kind == "expiring_redirect":
            token = f"t{len(self._expiring)}x{int(time.monotonic() * 1000)}"
            self._expiring[token] = (time.monotonic() + fault.seconds, path)
            self._reply(h, rec, 307, b"", {"Location": f"{self.url}/cdn/{token}"})
            return
        drop = ("host", "connection", "accept-encoding") + (("range",) if fault and fault.kind == "no_range" else ())
        headers = {k: v for k, v in h.headers.items() if k.lower() not in drop}
        if self.upstream_ca:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.upstream, timeout=60, context=ssl.create_default_context(cafile=self.upstream_ca))
        else:
            conn = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            rec.status = resp.status
            out = []
            for k, v in resp.getheaders():
                if k.lower() in ("connection", "transfer-encoding"):
                    continue
                for scheme in ("http", "https"):
                    if k.lower() == "location" and v.startswith(f"{scheme}://{self.upstream}"):
                        v = self.url + v[len(f"{scheme}://{self.upstream}"):]
                out.append((k, v))
            if fault and fault.kind == "headers" and fault.edit is not None:
                out = fault.edit(out)
            if fault and fault.kind in ("drip", "drip_body"):
                self._drip(h, rec, resp, out, fault)
                return
            h.send_response(resp.status)
            for k, v in out:
                h.send_header(k, v)
            h.send_header("Connection", "close")
            h.end_headers()
            if method == "HEAD":
                return
            self._pump(h, resp, rec, fault, gates)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
        finally:
            conn.close()
            h.close_connection = True

    def _pump(self, h, resp, rec: Record, fault: Optional[Fault], gates: List[Gate]) -> None:
        sent = 0
        flipped = False
        start = time.monotonic()
        while True:
            chunk = resp.read(CHUNK)
            if not chunk:
                break
            if fault and fault.kind in ("reset", "short", "stall", "flip") and sent + len(chunk) > fault.after:
                cut = fault.after - sent
                if fault.kind == "flip" and not flipped:
                    b = bytearray(chunk)
                    b[cut] ^= 0x01
                    chunk = bytes(b)
                    flipped = True
                elif fault.kind in ("reset", "short"):
                    if cut > 0:
                        h.wfile.write(chunk[:cut])
                        sent += cut
                        rec.sent = sent
                    h.wfile.flush()
                    if fault.kind == "reset":
                        time.sleep(0.2)  # let the client read what was sent before the RST discards it
                        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    h.connection.close()
                    return
                elif fault.kind == "stall":
                    if cut > 0:
                        h.wfile.write(chunk[:cut])
                        sent += cut
                        rec.sent = sent
                        chunk = chunk[cut:]
                    h.wfile.flush()
                    fault.released.wait(fault.seconds or None)
                    fault = None
            if fault and fault.kind == "rate" and fault.rate:
                due = start + (sent + len(chunk)) / fault.rate
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            for g in gates:
                now = g.allowance(len(chunk))
                if now < len(chunk):
                    if now:
                        h.wfile.write(chunk[:now])
                        sent += now
                        rec.sent = sent
                    h.wfile.flush()
                    g._hold()
                    chunk = chunk[now:]
            h.wfile.write(chunk)
            sent += len(chunk)
            rec.sent = sent
        h.wfile.flush()

    def _drip(self, h, rec: Record, resp, headers: List[Tuple[str, str]], fault: Fault) -> None:
        """The answer one byte every `fault.seconds` (its head at once for drip_body), until it is sent or the
        proxy closes (a client that gave up)."""
        head = f"HTTP/1.1 {resp.status} {resp.reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
        head += "Connection: close\r\n\r\n"
        body = resp.read() if h.command != "HEAD" else b""
        if fault.kind == "drip_body":
            h.wfile.write(head.encode("latin-1"))
            h.wfile.flush()
            data = body
        else:
            data = head.encode("latin-1") + body
        h.close_connection = True
        for i in range(len(data)):
            if fault.released.wait(fault.seconds):
                return
            h.wfile.write(data[i:i + 1])
            h.wfile.flush()
            rec.sent += 1

    def _reply(self, h, rec: Record, status: int, body: bytes, headers: dict) -> None:
        rec.status = status
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
        h.close_connection = True
