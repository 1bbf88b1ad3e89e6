"""HTTP client for the OCI distribution API: auth, retries, manifests, raw blob reads.

One `RegistryClient` per endpoint (a mirror's base URL). It speaks the anonymous
bearer-token flow (`WWW-Authenticate: Bearer realm=...,service=...,scope=...`), Basic
auth from `~/.docker/config.json` (looked up on the endpoint's first 401, once), retries transient
failures by the one `RetryPolicy` (honouring `Retry-After`, every wait ending at once when the run is
cancelled), and never logs or prints a credential or token.

The transport (requests, or registry_http's stdlib client on Python 3.7/3.8) stays in this room: a
blob is a `BlobStream`, and what a transport raises becomes a RegistryError here.
"""

import base64
import email.utils
import http.client
import json
import os
import random
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Optional, Tuple
from urllib.parse import urljoin, urlsplit

from .config import DEFAULT_HELPER_TIMEOUT, docker_config_dir, proxy_variable
from .errors import (Cancelled, CredentialHelperError, ImgtoolError, NotFoundError, RegistryError, RegistryUnavailable,
                     TagListingRefused, UsageError)
from .model import ACCEPT_MANIFESTS, MAX_MANIFEST_BYTES, Digest

if TYPE_CHECKING:  # requests is imported only where it runs (Python 3.9+): see default_transport
    import requests

USER_AGENT = "imgtool"
RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}


TRANSPORTS = ("requests", "http")


def default_transport() -> str:
    """"requests" where requests 2.32 and urllib3 2 run (Python 3.9+), else "http" (registry_http, stdlib only)."""
    return "requests" if sys.version_info >= (3, 9) else "http"


class _Net:
    """One transport's session factory and exception types: requests, or registry_http's stdlib twin of it."""

    def __init__(self, name: str):
        if name not in TRANSPORTS:
            raise UsageError(f"unknown registry transport {name!r}: one of {', '.join(TRANSPORTS)}")
        self.name = name
        if name == "http":
            from . import registry_http as lib
        else:
            import requests as lib  # type: ignore[no-redef]
        self.lib = lib
        self.error = lib.RequestException
        self.tls_error = lib.exceptions.SSLError
        self.proxy_error = lib.exceptions.ProxyError
        # what reading a streamed body may raise: the library's own types and what they wrap
        self.read_errors: tuple = (lib.RequestException, OSError, http.client.HTTPException)
        if name == "requests":
            import urllib3

            self.read_errors += (urllib3.exceptions.HTTPError,)

    def raw_reader(self, resp: "requests.Response") -> Callable[[int], bytes]:
        """`read(n)`: up to n bytes of the body as they arrive, never content-decoded (b"" at its end)."""
        if self.name == "http":
            return resp.read1
        raw = resp.raw
        read = getattr(raw, "read1", None) or raw.read  # read1: keep what arrived before a reset
        return lambda n: read(n, decode_content=False)


def docker_config_path() -> str:
    """`$DOCKER_CONFIG/config.json` or `~/.docker/config.json`."""
    return os.path.join(docker_config_dir(), "config.json")


def credentials_for(host: str, helper_timeout: float = DEFAULT_HELPER_TIMEOUT) -> Optional[Tuple[str, str]]:
    """(username, password) for a registry host as `docker login` stored them, or None.

    Resolved as docker-py's docker.auth resolves them (registry_http.docker_credentials, tested against
    it; docker-py runs a helper with no timeout): a credential helper named by `credHelpers` for this host
    or by `credsStore` (desktop keychains, `pass`), given `helper_timeout` seconds to answer, then the
    `auths` entries (with legacy full-URL keys). An identity token (OAuth) is not a password: None.
    Raises CredentialHelperError when a configured helper cannot be run, fails or does not answer in time.
    """
    from . import registry_http

    path = docker_config_path()
    if not os.path.isfile(path):
        return None
    try:
        entry = registry_http.docker_credentials(path, host, helper_timeout)
    except registry_http.HelperError as e:
        store = None
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f) or {}
            store = (doc.get("credHelpers") or {}).get(host) or doc.get("credsStore")
        except (OSError, ValueError, AttributeError):
            pass
        helper = f"docker-credential-{store}" if store else "the credential helper"
        if isinstance(e, registry_http.HelperTimeout):
            raise CredentialHelperError(
                f"{helper} named in {path} cannot give the credentials for {host}: it did not answer within "
                f"{e.seconds:g} s ($IMGTOOL_CREDENTIAL_HELPER_TIMEOUT)",
                hint=f"check that {helper} answers (`echo {host} | {helper} get`), or set "
                     f"$IMGTOOL_CREDENTIAL_HELPER_TIMEOUT higher, or remove credsStore/credHelpers from {path}") from e
        raise CredentialHelperError(
            f"{helper} named in {path} cannot give the credentials for {host}: {network_error_text(e)}",
            hint=f"install {helper} (or run `docker login {host}` again), or remove credsStore/credHelpers "
                 f"from {path}") from e
    except (OSError, ValueError, AttributeError, TypeError):
        return None  # an unreadable config: anonymous, as before
    if not isinstance(entry, dict):
        return None
    user = entry.get("Username") or entry.get("username")
    password = entry.get("Password") or entry.get("password")
    if user and password is not None:
        return str(user), str(password)
    return None


_CHALLENGE_PARAM = re.compile(r'(\w+)\s*=\s*(?:"([^"]*)"|([^\s,]+))')


def parse_challenge(header: str) -> Tuple[str, Dict[str, str]]:
    """Split `Bearer realm="...",service="..."` into ("bearer", {...})."""
    scheme, _, rest = (header or "").strip().partition(" ")
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _CHALLENGE_PARAM.finditer(rest)}
    return scheme.lower(), params


def registry_error_text(resp: "requests.Response") -> str:
    """The distribution error message of a response, or its status line."""
    try:
        errors = resp.json().get("errors") or []
        parts = [f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errors if isinstance(e, dict)]
        if parts:
            return "; ".join(parts)[:300]
    except (ValueError, AttributeError):
        pass
    return f"HTTP {resp.status_code} {resp.reason or ''}".strip()


def _retry_after(resp: "requests.Response") -> Optional[float]:
    """The seconds a 429/503's `Retry-After` asks for (a number or an HTTP date), or None."""
    if resp.status_code not in (429, 503):
        return None
    value = resp.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return None if parsed is None else max(parsed.timestamp() - time.time(), 0.0)


@dataclass(frozen=True)
class RetryPolicy:
    """The one retry policy of the registry side: how often a request is tried, how long to wait between
    tries. The client applies it to each request; the puller to each range of a blob (where a retry may go
    to another source, so the client does not retry those again). Every wait ends at once on cancel."""

    attempts: int = 4
    """Tries of one request; a range's every `attempts`-th failure on a source drops that source."""

    backoff: float = 0.5
    """Seconds before the second try, doubled for each further one (at most `max_backoff`), with jitter."""

    max_backoff: float = 8.0

    max_retry_after: float = 60.0
    """A registry's `Retry-After` is honoured up to this many seconds."""

    def delay(self, attempt: int, retry_after: Optional[float] = None) -> float:
        """Seconds to wait after the `attempt`-th failure (0-based), or what the registry asked for."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        base = min(self.backoff * (2 ** attempt), self.max_backoff)
        return base * (0.5 + random.random() / 2)

    @staticmethod
    def wait(seconds: float, cancel: Optional[threading.Event]) -> None:
        """Wait `seconds`, or until `cancel` is set: then raises Cancelled. Without an event the wait is
        still one Ctrl-C ends in the main thread (a lock wait, which a signal interrupts)."""
        if (cancel if cancel is not None else threading.Event()).wait(seconds):
            raise Cancelled("cancelled while waiting to try again")


class BlobStream:
    """A blob's bytes as the registry sends them (never content-decoded), its transport hidden.

    `whole` is True when the registry ignored the Range asked for and sends the whole blob (200, not
    206). `read(n)` gives up to n bytes as they arrive (b"" at the end) and raises RegistryError when the
    connection breaks or stalls; `close()` (or leaving `with`) ends the response.
    """

    def __init__(self, resp: "requests.Response", read: Callable[[int], bytes], errors: tuple, host: str):
        self.whole = resp.status_code == 200
        self._resp, self._read, self._errors, self._host = resp, read, errors, host

    def read(self, n: int) -> bytes:
        """Up to n bytes; raises RegistryError."""
        try:
            return self._read(n)
        except self._errors as e:
            raise RegistryError(f"{self._host}: {network_error_text(e)}") from e

    def read_up_to(self, limit: int) -> bytes:
        """The body until its end or `limit` bytes, whichever comes first; raises RegistryError."""
        chunks, total = [], 0
        while total < limit:
            chunk = self.read(min(65536, limit - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> "BlobStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RegistryClient:
    """Talks to one registry endpoint; thread-safe (one session per thread).

    `transport` is "requests" or "http" (registry_http's stdlib client, for Python 3.7/3.8); by
    default requests where it runs (default_transport). Both give the same answers and errors.
    """

    def __init__(self, base_url: str, *, insecure: bool = False, ca_cert: Optional[str] = None,
                 connect_timeout: float = 10.0, read_timeout: float = 60.0, retry: Optional[RetryPolicy] = None,
                 credentials: Optional[Tuple[str, str]] = None, use_docker_config: bool = True,
                 transport: Optional[str] = None, helper_timeout: float = DEFAULT_HELPER_TIMEOUT):
        self.base_url = base_url.rstrip("/")
        split = urlsplit(self.base_url)
        if split.scheme not in ("http", "https") or not split.netloc:
            raise UsageError(f"invalid registry URL {base_url!r}")
        self.host = split.netloc
        self._net = _Net(transport or default_transport())
        # Passed on every call: a Session's own `verify` loses to $REQUESTS_CA_BUNDLE.
        self.verify = False if insecure else (ca_cert or True)
        self.timeout = (connect_timeout, read_timeout)
        self.retry = retry or RetryPolicy()
        self._credentials = credentials
        self._credential_problem: Optional[CredentialHelperError] = None
        # looked up on the first 401 (a credential helper may run), once: most registries never ask
        self._looked_up = credentials is not None or not use_docker_config
        self._helper_timeout = helper_timeout
        self._login_lock = threading.Lock()
        self._tokens: Dict[str, str] = {}  # scope -> bearer token
        self._basic = False  # the registry asked for Basic auth
        self._lock = threading.Lock()
        self._local = threading.local()

    # -- plumbing --------------------------------------------------------

    def _session(self) -> "requests.Session":
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._net.lib.Session()
            s.headers["User-Agent"] = USER_AGENT
            if self._net.name == "requests":
                adapter = self._net.lib.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=16, max_retries=0)
                s.mount("http://", adapter)
                s.mount("https://", adapter)
            self._local.session = s
        return s

    def _unreachable(self, e: Exception, url: str) -> RegistryError:
        """The error for a request that could not be sent: the registry, or the proxy in between, named."""
        if isinstance(e, self._net.proxy_error):
            return RegistryError(f"cannot reach the proxy {proxy_named(url)} for {self.host}: {network_error_text(e)}",
                                 hint="check that variable (or unset it), or name this registry in $no_proxy to "
                                      "connect directly")
        return RegistryError(f"{self.host}: {network_error_text(e)}")

    def _login(self) -> Optional[Tuple[str, str]]:
        """The credentials for this endpoint, looked up when a registry first asks (once, whichever thread
        asks first); a helper that fails leaves us anonymous and is named if the registry then refuses."""
        with self._login_lock:
            if not self._looked_up:
                self._looked_up = True
                try:
                    self._credentials = credentials_for(self.host, self._helper_timeout)
                except CredentialHelperError as e:
                    self._credential_problem = e
            return self._credentials

    def _auth_header(self, scope: Optional[str]) -> Dict[str, str]:
        with self._lock:
            token = self._tokens.get(scope or "")
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self._basic and self._credentials:
            raw = base64.b64encode(":".join(self._credentials).encode()).decode()
            return {"Authorization": f"Basic {raw}"}
        return {}

    def _authenticate(self, resp: "requests.Response", scope: Optional[str]) -> bool:
        """React to a 401: fetch a bearer token or switch to Basic. False when nothing more to try."""
        scheme, params = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
        credentials = self._login()
        if scheme == "basic":
            if not credentials or self._basic:
                return False
            self._basic = True
            return True
        if scheme != "bearer" or not params.get("realm"):
            return False
        query = {}
        if params.get("service"):
            query["service"] = params["service"]
        want_scope = scope or params.get("scope")
        if want_scope:
            query["scope"] = want_scope
        auth = credentials if credentials else None
        try:
            r = self._session().get(params["realm"], params=query, auth=auth, timeout=self.timeout, verify=self.verify)
        except self._net.error as e:
            if isinstance(e, self._net.proxy_error):
                raise self._unreachable(e, params["realm"]) from e
            raise RegistryError(f"{self.host}: token request to {urlsplit(params['realm']).netloc} failed: {network_error_text(e)}") from e
        if r.status_code in (401, 403):
            raise self._auth_failed(f"{self.host}: the token service refused access ({registry_error_text(r)})",
                                    "check the credentials for this registry in ~/.docker/config.json (docker login)")
        if r.status_code != 200:
            raise RegistryError(f"{self.host}: token request failed: {registry_error_text(r)}")
        try:
            body = r.json()
            token = body.get("token") or body.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not token:
            raise RegistryError(f"{self.host}: the token service answered without a token")
        with self._lock:
            self._tokens[scope or ""] = str(token)
        return True

    def request(self, method: str, path: str, *, scope: Optional[str] = None, headers: Optional[dict] = None,
                stream: bool = False, timeout=None, retry: bool = True, data: Optional[bytes] = None,
                cancel: Optional[threading.Event] = None) -> "requests.Response":
        """Send a request with auth and retries (`self.retry`; none with `retry=False`); returns the final
        response (any status). `data` (bytes, so a retry can send it again) is the request body; a wait
        between tries ends when `cancel` is set.

        Raises RegistryError when the endpoint cannot be reached after the retries, Cancelled.
        """
        url = path if path.startswith(("http://", "https://")) else f"{self.base_url}{path}"
        attempts = self.retry.attempts if retry else 1
        auth_tries = 0
        attempt = 0
        while True:
            hdrs = dict(headers or {})
            hdrs.update(self._auth_header(scope))
            try:
                resp = self._session().request(method, url, headers=hdrs, stream=stream, timeout=timeout or self.timeout,
                                               allow_redirects=True, verify=self.verify, data=data)
            except self._net.tls_error as e:
                raise RegistryError(f"{self.host}: TLS verification failed: {network_error_text(e)}",
                                    hint="set ca_cert for this mirror in mirrors.toml, or insecure = true if you trust the network") from e
            except self._net.error as e:
                attempt += 1
                if attempt >= attempts:
                    raise self._unreachable(e, url) from e
                self.retry.wait(self.retry.delay(attempt - 1), cancel)
                continue
            if resp.status_code == 401 and auth_tries < 2:
                auth_tries += 1
                with self._lock:  # a stale token: drop it and ask again
                    self._tokens.pop(scope or "", None)
                resp.close()
                if self._authenticate(resp, scope):
                    continue
                return resp
            expired_redirect = resp.history and resp.status_code in (403, 410)
            if (resp.status_code in RETRY_STATUS or expired_redirect) and attempt + 1 < attempts:
                attempt += 1
                resp.close()
                self.retry.wait(self.retry.delay(attempt - 1, _retry_after(resp)), cancel)
                continue
            return resp

    # -- the API ---------------------------------------------------------

    def ping(self, timeout: Tuple[float, float] = (3.0, 5.0)) -> float:
        """GET /v2/; returns the latency in seconds. 401 counts as alive. Raises RegistryError."""
        start = time.monotonic()
        try:
            resp = self._session().get(f"{self.base_url}/v2/", timeout=timeout, verify=self.verify)
        except self._net.tls_error as e:
            raise RegistryError(f"{self.host}: TLS verification failed: {network_error_text(e)}") from e
        except self._net.error as e:
            raise self._unreachable(e, f"{self.base_url}/v2/") from e
        elapsed = time.monotonic() - start
        resp.close()
        if resp.status_code not in (200, 401):
            raise RegistryError(f"{self.host}: /v2/ answered HTTP {resp.status_code}")
        return elapsed

    def manifest(self, repository: str, reference: str, *, head: bool = False,
                 expect: Optional[Digest] = None, timeout=None) -> Tuple[bytes, str, Optional[Digest]]:
        """Fetch (or HEAD) a manifest: (bytes, content type, digest). Verifies `expect`.

        Raises NotFoundError (404), RegistryError (other failures), and RegistryError when
        the bytes do not match the digest asked for.
        """
        scope = f"repository:{repository}:pull"
        resp = self.request("HEAD" if head else "GET", f"/v2/{repository}/manifests/{reference}", scope=scope,
                            headers={"Accept": ACCEPT_MANIFESTS}, stream=True, timeout=timeout)
        with resp:
            if resp.status_code == 404:
                said = registry_error_text(resp) if not head else "HTTP 404"
                raise NotFoundError(f"{self.host}/{repository}:{reference} not found ({said})")
            if resp.status_code == 401:
                raise self._auth_failed(f"{self.host}/{repository}: authentication required (HTTP 401)",
                                        f"log in with `docker login {self.host}` (imgtool reads ~/.docker/config.json)")
            if resp.status_code != 200:
                detail = registry_error_text(resp) if not head else f"HTTP {resp.status_code}"
                raise RegistryError(f"{self.host}/{repository}: manifest {reference}: {detail}")
            ctype = resp.headers.get("Content-Type", "").split(";")[0].strip()
            header_digest = resp.headers.get("Docker-Content-Digest")
            if head:
                digest = _parse_digest_header(header_digest)
                return b"", ctype, digest
            try:
                data = _read_capped(resp, MAX_MANIFEST_BYTES, f"{self.host}/{repository} manifest {reference}")
            except self._net.error as e:
                raise RegistryError(f"{self.host}: {network_error_text(e)}") from e
        actual = Digest.of(data)
        wanted = expect or (Digest.parse(reference) if reference.startswith("sha256:") else None)
        if wanted is not None and actual != wanted:
            raise RegistryError(f"{self.host}/{repository}: manifest {reference} has digest {actual}, expected {wanted}")
        return data, ctype, actual

    def blob(self, repository: str, digest: Digest, start: int = 0, end: Optional[int] = None,
             timeout=None, retry: bool = True, cancel: Optional[threading.Event] = None) -> BlobStream:
        """Open a raw (not content-decoded) stream of the blob's bytes [start, end).

        `stream.whole` says the registry sent the whole blob instead (it ignored Range). `retry=False`:
        one try, for a caller that retries by the same policy itself (the puller, which may go elsewhere).
        Raises NotFoundError, RegistryUnavailable (a status worth trying again; its Retry-After),
        RegistryError, Cancelled.
        """
        headers = {"Accept-Encoding": "identity"}
        if start or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        resp = self.request("GET", f"/v2/{repository}/blobs/{digest}", scope=f"repository:{repository}:pull",
                            headers=headers, stream=True, timeout=timeout, retry=retry, cancel=cancel)
        if resp.status_code in (200, 206):
            return BlobStream(resp, self._net.raw_reader(resp), self._net.read_errors, self.host)
        text = registry_error_text(resp)
        resp.close()
        if resp.status_code == 404:
            raise NotFoundError(f"{self.host}/{repository}: blob {digest.short} not found")
        if resp.status_code in RETRY_STATUS or (resp.history and resp.status_code in (403, 410)):
            raise RegistryUnavailable(f"{self.host}/{repository}: blob {digest.short}: {text}",
                                      retry_after=_retry_after(resp), status=resp.status_code)
        raise RegistryError(f"{self.host}/{repository}: blob {digest.short}: {text}")

    def tags(self, repository: str, page_size: int = 1000) -> Iterator[str]:
        """Every tag of a repository, following `Link` pagination. Raises RegistryError."""
        path = f"{self.base_url}/v2/{repository}/tags/list?n={page_size}"
        seen = {path}
        while path:
            resp = self.request("GET", path, scope=f"repository:{repository}:pull")
            if resp.status_code in (401, 403, 404, 405):
                raise TagListingRefused(f"{self.host}/{repository}: tag listing refused (HTTP {resp.status_code})")
            if resp.status_code != 200:
                raise RegistryError(f"{self.host}/{repository}: tag list: {registry_error_text(resp)}")
            for tag in (resp.json().get("tags") or []):
                yield tag
            link = resp.headers.get("Link", "")
            m = re.match(r"<([^>]+)>", link)
            # RFC 8288: a relative link is relative to the URL that answered, not to base_url
            path = urljoin(resp.url, m.group(1)) if m else ""
            if path in seen:  # a server that links a page to itself must not loop us forever
                break
            seen.add(path)


    # -- pushing (imgtool push) -------------------------------------------

    @staticmethod
    def push_scope(repository: str) -> str:
        return f"repository:{repository}:pull,push"

    def _auth_failed(self, message: str, hint: str) -> ImgtoolError:
        """The registry wants credentials it did not get: when a credential helper failed, that is why."""
        if self._credential_problem is not None:
            return self._credential_problem
        return RegistryError(message, hint=hint)

    def _push_failed(self, resp: "requests.Response", repository: str, what: str) -> ImgtoolError:
        if resp.status_code in (401, 403):
            return self._auth_failed(f"{self.host}/{repository}: {what}: push refused (HTTP {resp.status_code}: "
                                     f"{registry_error_text(resp)})",
                                     f"log in with `docker login {self.host}` as a user allowed to push there "
                                     "(imgtool reads ~/.docker/config.json)")
        return RegistryError(f"{self.host}/{repository}: {what}: {registry_error_text(resp)}")

    def has_blob(self, repository: str, digest: Digest) -> bool:
        """HEAD the blob in `repository` (push scope, so the token serves the upload too). Raises RegistryError."""
        resp = self.request("HEAD", f"/v2/{repository}/blobs/{digest}", scope=self.push_scope(repository))
        resp.close()
        if resp.status_code == 200:
            return True
        if resp.status_code == 404:
            return False
        raise self._push_failed(resp, repository, f"blob {digest.short}")

    def mount_blob(self, repository: str, digest: Digest, source_repository: str) -> Optional[str]:
        """Cross-repository mount; None when mounted, else the upload URL the registry opened instead."""
        resp = self.request("POST", f"/v2/{repository}/blobs/uploads/?mount={digest}&from={source_repository}",
                            scope=self.push_scope(repository), data=b"", retry=False)
        resp.close()
        if resp.status_code == 201:
            return None
        if resp.status_code == 202 and resp.headers.get("Location"):
            return self._absolute(resp.headers["Location"])
        raise self._push_failed(resp, repository, f"mount of blob {digest.short}")

    def start_upload(self, repository: str) -> str:
        """Open an upload session; returns its URL. Raises RegistryError."""
        resp = self.request("POST", f"/v2/{repository}/blobs/uploads/", scope=self.push_scope(repository), data=b"")
        resp.close()
        if resp.status_code != 202 or not resp.headers.get("Location"):
            raise self._push_failed(resp, repository, "starting an upload")
        return self._absolute(resp.headers["Location"])

    def upload_chunk(self, repository: str, url: str, data: bytes, start: int) -> str:
        """PATCH bytes [start, start+len) to the session; returns the next URL. Raises RegistryError."""
        headers = {"Content-Type": "application/octet-stream",
                   "Content-Range": f"{start}-{start + len(data) - 1}"}
        resp = self.request("PATCH", url, scope=self.push_scope(repository), headers=headers, data=data, retry=False)
        resp.close()
        if resp.status_code != 202 or not resp.headers.get("Location"):
            raise self._push_failed(resp, repository, f"uploading bytes {start}-{start + len(data) - 1}")
        return self._absolute(resp.headers["Location"])

    def finish_upload(self, repository: str, url: str, digest: Digest, data: bytes = b"") -> None:
        """PUT ?digest= (with the last bytes, or all of a small blob). Raises RegistryError."""
        sep = "&" if "?" in url else "?"
        resp = self.request("PUT", f"{url}{sep}digest={digest}", scope=self.push_scope(repository),
                            headers={"Content-Type": "application/octet-stream"}, data=data, retry=False)
        resp.close()
        if resp.status_code not in (201, 204):
            raise self._push_failed(resp, repository, f"blob {digest.short}")

    def put_manifest(self, repository: str, reference: str, data: bytes, media_type: str) -> Optional[Digest]:
        """PUT the manifest bytes as they are (so its digest stays); returns the registry's digest."""
        resp = self.request("PUT", f"/v2/{repository}/manifests/{reference}", scope=self.push_scope(repository),
                            headers={"Content-Type": media_type}, data=data)
        resp.close()
        if resp.status_code not in (200, 201, 202):
            raise self._push_failed(resp, repository, f"manifest {reference}")
        return _parse_digest_header(resp.headers.get("Docker-Content-Digest"))

    def _absolute(self, location: str) -> str:
        if location.startswith(("http://", "https://")):
            return location
        return self.base_url + ("" if location.startswith("/") else "/") + location


def _parse_digest_header(value: Optional[str]) -> Optional[Digest]:
    try:
        return Digest.parse(value.strip()) if value else None
    except UsageError:
        return None


def _read_capped(resp: "requests.Response", limit: int, what: str) -> bytes:
    chunks, total = [], 0
    for chunk in resp.iter_content(65536):
        total += len(chunk)
        if total > limit:
            raise RegistryError(f"{what} is larger than {limit} bytes; refusing to read it")
        chunks.append(chunk)
    return b"".join(chunks)


def proxy_named(url: str) -> str:
    """The proxy the environment gives for `url` and the variable it came from, as requests and
    registry_http read them (urllib's order: lowercase first, then the scheme's, then all_proxy)."""
    named = proxy_variable(urlsplit(url).scheme)
    return f"{named[1]} (from ${named[0]})" if named else "(none named)"


def network_error_text(e: Exception, limit: int = 200) -> str:
    """One readable line for a network exception (urllib3 nests long reprs)."""
    text = " ".join(str(e).split())
    if isinstance(e, _timeouts()) or "timed out" in text:
        return "timed out"
    m = re.search(r"\[SSL: \w+\] ([^'\"]+?) \(_ssl\.c:\d+\)", text)  # OpenSSL's words, not urllib3's wrapping
    if m:
        return m.group(1)
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if m:
        return m.group(1).strip().rstrip(".").lower()
    for needle, said in (("RemoteDisconnected", "connection closed by the server"),
                         ("Connection reset", "connection reset"), ("Connection aborted", "connection aborted"),
                         ("IncompleteRead", "connection closed before the whole body arrived")):
        if needle in text:
            return said
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _timeouts() -> tuple:
    """The timeout exceptions of the transports loaded (one of requests' cannot exist unless requests is)."""
    found = [socket.timeout]
    for name in ("requests", "imgtool.registry_http"):
        lib = sys.modules.get(name)
        if lib is not None:
            found += [lib.exceptions.ConnectTimeout, lib.exceptions.ReadTimeout]
    return tuple(found)
