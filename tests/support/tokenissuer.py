"""A small bearer-token issuer for the `token` registry (quay.io-style auth, for real).

Distribution 2.8 with `auth: token` accepts an ES256 JWT whose header carries the issuer's
self-signed certificate in `x5c` when that certificate is its rootcertbundle; the claims are
iss, sub, aud (= service), exp, nbf, iat, jti and access. This issuer answers

    GET  /token?service=S&scope=repository:NAME:pull,push[&scope=...]   (Basic auth optional)
    POST /token  (OAuth2 form: grant_type=password|refresh_token, service, scope, username, ...)

with {"token", "access_token", "expires_in", "issued_at"}, and records every request so tests can
assert how many tokens a client asked for.

    with TokenIssuer(key_pem, cert_pem, issuer="imgtool-test-issuer",
                     service="imgtool-test-registry", port=5001) as iss:
        ...
        assert iss.count == 1
"""

import base64
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional, Sequence
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def parse_scope(scope: str) -> Optional[dict]:
    """'repository:ns/app:pull,push' -> {"type", "name", "actions"}; None if malformed."""
    kind, sep, rest = scope.partition(":")
    name, sep2, actions = rest.rpartition(":")
    if not (sep and sep2 and kind and name):
        return None
    return {"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]}


@dataclass
class TokenRequest:
    """What one request to the issuer asked for and what it got."""

    method: str
    path: str
    service: Optional[str]
    scopes: List[str]
    account: Optional[str]  # user name from Basic auth / form, None when anonymous
    status: int
    granted: List[dict] = field(default_factory=list)
    token: Optional[str] = None
    time: float = 0.0


class TokenIssuer:
    """Threaded HTTP token issuer; `start()`/`stop()` or use as a context manager.

    Policy, all settable between tests (reset() restores the defaults):
      credentials       None: anyone gets what it asks for; {user: password}: Basic/password
                        logins are checked (wrong -> 401) and anonymous requests get only
                        `anonymous_actions` (empty -> 401).
      anonymous_actions actions granted without credentials when credentials are set.
      grant             optional callable(account, scope_dict) -> allowed actions list.
      lifetime          expires_in / exp - iat, seconds.
      fail_next(status, count)  answer the next `count` token requests with `status`.
    """

    def __init__(self, key_pem_path: str, cert_pem_path: str, *, issuer: str, service: str,
                 host: str = "127.0.0.1", port: int = 0, lifetime: int = 300,
                 credentials: Optional[Dict[str, str]] = None,
                 anonymous_actions: Sequence[str] = ("pull",)):
        with open(key_pem_path, "rb") as fh:
            self._key = serialization.load_pem_private_key(fh.read(), password=None)
        if not isinstance(self._key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_pem_path}: not an EC private key (ES256 needs P-256)")
        with open(cert_pem_path, "rb") as fh:
            cert = x509.load_pem_x509_certificate(fh.read())
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self.issuer = issuer
        self.service = service
        self.host = host
        self.port = port
        self._defaults = dict(lifetime=lifetime, credentials=credentials,
                              anonymous_actions=tuple(anonymous_actions))
        self._lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self.reset()

    # -- state --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget recorded requests and restore the default policy."""
        with self._lock:
            self.requests: List[TokenRequest] = []
            self.lifetime: int = self._defaults["lifetime"]
            self.credentials: Optional[Dict[str, str]] = self._defaults["credentials"]
            self.anonymous_actions = self._defaults["anonymous_actions"]
            self.grant: Optional[Callable[[Optional[str], dict], List[str]]] = None
            self._failures: List[int] = []

    def fail_next(self, status: int = 503, count: int = 1) -> None:
        with self._lock:
            self._failures.extend([status] * count)

    @property
    def count(self) -> int:
        """Token requests answered so far (any outcome)."""
        return len(self.requests)

    @property
    def issued(self) -> int:
        """Tokens actually handed out."""
        return sum(1 for r in self.requests if r.token)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def realm(self) -> str:
        return f"{self.url}/token"

    # -- tokens -------------------------------------------------------------------------------

    def make_token(self, access: List[dict], account: Optional[str] = None,
                   lifetime: Optional[int] = None, now: Optional[float] = None) -> str:
        """Sign a JWT granting `access` ([{type, name, actions}]); usable without the server."""
        now = int(now if now is not None else time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": [self._x5c]}
        claims = {
            "iss": self.issuer,
            "sub": account or "",
            "aud": self.service,
            "exp": now + (lifetime if lifetime is not None else self.lifetime),
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(16),
            "access": access,
        }
        signing_input = (_b64url(json.dumps(header, separators=(",", ":")).encode()) + "." +
                         _b64url(json.dumps(claims, separators=(",", ":")).encode()))
        der = self._key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return signing_input + "." + _b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))

    def _decide(self, account: Optional[str], password: Optional[str], scopes: List[str]):
        """-> (status, granted access list or None)."""
        creds = self.credentials
        if creds is not None and account is not None:
            if creds.get(account) != password:
                return 401, None
            allowed_actions = None  # everything asked for
        elif creds is not None:
            if not self.anonymous_actions:
                return 401, None
            allowed_actions = set(self.anonymous_actions)
        else:
            allowed_actions = None
        access = []
        for scope in scopes:
            parsed = parse_scope(scope)
            if parsed is None:
                return 400, None
            actions = parsed["actions"]
            if allowed_actions is not None:
                actions = [a for a in actions if a in allowed_actions]
            if self.grant is not None:
                permitted = set(self.grant(account, dict(parsed)))
                actions = [a for a in actions if a in permitted]
            access.append({**parsed, "actions": actions})
        return 200, access

    # -- HTTP ---------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(h.path)
        if split.path.rstrip("/") not in ("/token", "/v2/auth"):
            return self._reply(h, 404, {"errors": [{"code": "NOT_FOUND"}]})
        params = parse_qs(split.query, keep_blank_values=True)
        account = password = None
        if method == "POST":
            length = int(h.headers.get("Content-Length") or 0)
            form = parse_qs(h.rfile.read(length).decode(), keep_blank_values=True)
            for k, v in form.items():
                params.setdefault(k, []).extend(v)
            if form.get("grant_type", [""])[0] == "password":
                account = form.get("username", [None])[0]
                password = form.get("password", [None])[0]
        authz = h.headers.get("Authorization", "")
        if authz.lower().startswith("basic "):
            try:
                account, _, password = base64.b64decode(authz[6:]).decode().partition(":")
            except ValueError:
                account, password = "", None
        scopes = [s for v in params.get("scope", []) for s in v.split(" ") if s]
        service = params.get("service", [None])[0]
        record = TokenRequest(method=method, path=h.path, service=service, scopes=scopes,
                              account=account, status=0, time=time.time())
        with self._lock:
            failure = self._failures.pop(0) if self._failures else None
            self.requests.append(record)
        if failure is not None:
            record.status = failure
            return self._reply(h, failure, {"errors": [{"code": "UNAVAILABLE",
                                                        "message": "injected failure"}]})
        if service is not None and service != self.service:
            record.status = 400
            return self._reply(h, 400, {"errors": [{"code": "INVALID_SERVICE",
                                                    "message": f"unknown service {service}"}]})
        status, access = self._decide(account, password, scopes)
        record.status = status
        if status != 200:
            extra = {"WWW-Authenticate": 'Basic realm="imgtool-test-issuer"'} if status == 401 else {}
            return self._reply(h, status, {"errors": [{"code": "UNAUTHORIZED" if status == 401
                                                       else "INVALID_SCOPE"}]}, extra)
        lifetime = self.lifetime
        token = self.make_token(access, account, lifetime)
        record.granted = access
        record.token = token
        body = {"token": token, "access_token": token, "expires_in": lifetime,
                "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._reply(h, 200, body)

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, body: dict, headers=None) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def start(self) -> "TokenIssuer":
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                issuer._handle(self, "GET")

            def do_POST(self):  # noqa: N802
                issuer._handle(self, "POST")

            def log_message(self, fmt, *args):  # keep pytest output clean
                pass

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server((self.host, self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="token-issuer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "TokenIssuer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
