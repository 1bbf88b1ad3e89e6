"""HTTP client for the OCI distribution API: auth, retries, manifests, raw blob reads.

One `RegistryClient` per endpoint (a mirror's base URL). It speaks the anonymous
bearer-token flow (`WWW-Authenticate: Bearer realm=...,service=...,scope=...`), Basic
auth from `~/.docker/config.json` (looked up on the endpoint's first 401, once), retries transient
failures by the one `RetryPolicy` (honouring `Retry-After`, every wait ending at once when the run is
cancelled), and never logs or prints a credential or token.

The transport (requests, or registry_http's stdlib client on Python 3.7/3.8) stays in this room: a
blob is a `BlobStream`, and what a transport raises becomes a RegistryError here. The room's other
modules hold no transport: registry_auth.py (who a login may go to, the tokens and Basic state of an
endpoint) and registry_answers.py (answers read whole, blob streams, error texts, the RetryPolicy).
"""

import http.client
import json
import os
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Optional, Tuple, Union
from urllib.parse import urljoin, urlsplit

from . import deadline
from .config import DEFAULT_HELPER_TIMEOUT, DEFAULT_MIN_RATE, docker_config_dir
from .errors import (CredentialHelperError, ImgtoolError, NotFoundError, RegistryError, RegistryUnavailable,
                     TagListingRefused, UsageError)
from .model import ACCEPT_MANIFESTS, MAX_MANIFEST_BYTES, Digest, json_object
from .registry_answers import (MAX_ANSWER_BYTES, MAX_ERROR_BYTES, RETRY_STATUS, Answer, BlobStream, RetryPolicy,
                               network_error_text, registry_error_text, retry_after)
from .registry_auth import Auth, Credentials, TokenAsk, origin
from .transport import Waited, Waits, new_session, read_capped, tls_verify, unreachable

if TYPE_CHECKING:  # requests is imported only where it runs (Python 3.9+): see default_transport
    import requests

TRANSPORTS = ("requests", "http")

MAX_TAG_PAGES = 1000  # a repository's tag list: a registry that links pages forever stops here,
MAX_TAGS = 100_000  # or at this many tags (quay.io's busiest repositories list a few thousand),
MAX_TAG_LIST_BYTES = 16 * 1024 * 1024  # or at this many bytes of pages in all


def _netloc(url: str) -> str:
    return urlsplit(url).netloc


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


class RegistryClient(Waited):
    """Talks to one registry endpoint; thread-safe (one session per thread).

    `transport` is "requests" or "http" (registry_http's stdlib client, for Python 3.7/3.8); by
    default requests where it runs (default_transport). Both give the same answers and errors.

    A login (Basic, or a bearer token got with it) goes only to the endpoint's own origin (scheme, host,
    port), and to the token service its 401 names when the endpoint is reached over TLS; never over plain
    HTTP unless `insecure`; never to a `Link`, a `Location` or a redirect on another origin.
    """

    def __init__(self, base_url: str, *, insecure: bool = False, ca_cert: Optional[str] = None,
                 connect_timeout: float = 10.0, read_timeout: float = 60.0, retry: Optional[RetryPolicy] = None,
                 credentials: Optional[Tuple[str, str]] = None, use_docker_config: bool = True,
                 transport: Optional[str] = None, helper_timeout: float = DEFAULT_HELPER_TIMEOUT,
                 response_timeout: Optional[float] = None, min_rate: int = DEFAULT_MIN_RATE):
        self.base_url = base_url.rstrip("/")
        split = urlsplit(self.base_url)
        self.host = split.netloc
        # looked up on the first 401 (a credential helper may run), once: most registries never ask
        lookup = (lambda: credentials_for(self.host, helper_timeout)) if use_docker_config else None
        try:
            self.auth = Auth(self.base_url, self.host, insecure=insecure, credentials=credentials, lookup=lookup)
        except ValueError:
            raise UsageError(f"invalid registry URL {base_url!r}") from None
        self._net = _Net(transport or default_transport())
        self.verify = tls_verify(insecure, ca_cert)  # passed on every call (transport.py says why)
        # an answer's headers (and a small answer's body, again) within the response deadline; a blob's body at
        # `min_rate` bytes/s over each `read_timeout` seconds spent waiting for it
        self.waits = Waits.of(connect_timeout, read_timeout, response_timeout, min_rate)
        self.retry = retry or RetryPolicy()
        self._local = threading.local()

    # -- plumbing --------------------------------------------------------

    def _session(self) -> "requests.Session":
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = new_session(self._net.lib)
        return s

    def _unreachable(self, e: Exception, url: str) -> RegistryError:
        """The error for a request that could not be sent: the registry, or the proxy in between, named."""
        return unreachable(self.host, e, url, self._net.proxy_error)

    def _authenticate(self, resp: Answer, scope: Optional[str]) -> bool:
        """React to a 401: fetch a bearer token or switch to Basic. False when nothing more to try."""
        ask = self.auth.challenged(resp.headers.get("WWW-Authenticate", ""), scope)
        if not isinstance(ask, TokenAsk):
            return ask
        r = self._token_answer(ask.realm, ask.query, ask.login)
        if r.status_code in (401, 403):
            raise self.auth.failed(f"{self.host}: the token service refused access ({registry_error_text(r)})",
                                   "check the credentials for this registry in ~/.docker/config.json (docker login)")
        if r.status_code != 200:
            raise RegistryError(f"{self.host}: token request failed: {registry_error_text(r)}")
        self.auth.keep_token(scope, r.body, MAX_ANSWER_BYTES)
        return True

    def _token_answer(self, realm: str, query: Dict[str, str], auth: Optional[Credentials]) -> Answer:
        """The token service's whole answer (capped). Raises RegistryError."""
        seconds = self.response_timeout
        try:
            with deadline.watching(seconds) as watch:
                r = self._session().get(realm, params=query, auth=auth, timeout=self.timeout, verify=self.verify,
                                        stream=True)
            if watch.expired:
                r.close()
                raise self._too_slow(seconds)
            return Answer(r, self._whole(r, MAX_ANSWER_BYTES, f"{self.host}: the token service's answer", seconds))
        except self._net.error as e:
            if watch.expired:
                raise self._too_slow(seconds) from e
            if isinstance(e, self._net.proxy_error):
                raise self._unreachable(e, realm) from e
            raise RegistryError(f"{self.host}: token request to {_netloc(realm)} failed: {network_error_text(e)}") from e

    def _answer(self, resp: "requests.Response", limit: int) -> Answer:
        """An answer whose body only says why (an error): what of it arrives, at most `limit` bytes."""
        try:
            return Answer(resp, self._whole(resp, limit, self.host))
        except (ImgtoolError, *self._net.read_errors):
            return Answer(resp, b"")
        finally:
            resp.close()

    def _whole(self, resp: "requests.Response", limit: int, what: str, seconds: Optional[float] = None) -> bytes:
        """A streamed body read to its end (which releases the connection for the next request), at most
        `limit` bytes, within `seconds` (the response timeout); raises RegistryError past either (the response
        closed), and the transport's errors."""
        try:
            return read_capped(self._net.raw_reader(resp), limit, what, seconds or self.response_timeout,
                               self._too_slow)
        finally:
            resp.close()  # read to its end, the connection goes back to the pool; else it is not reused

    def request(self, method: str, path: str, *, scope: Optional[str] = None, headers: Optional[dict] = None,
                timeout=None, retry: bool = True, data: Optional[bytes] = None,
                cancel: Optional[threading.Event] = None, limit: int = MAX_ANSWER_BYTES, what: str = "") -> Answer:
        """Send a request with auth and retries and read its whole answer (at most `limit` bytes; `what` names
        it past that). Raises RegistryError (unreachable after the retries, too large, too slow), Cancelled."""
        resp = self.open(method, path, scope=scope, headers=headers, timeout=timeout, retry=retry, data=data,
                         cancel=cancel)
        if isinstance(resp, Answer):
            return resp
        try:
            body = self._whole(resp, limit, what or f"{self.host}: the answer to {method} {urlsplit(resp.url).path}",
                               self._seconds(timeout))
        except self._net.read_errors as e:
            raise RegistryError(f"{self.host}: {network_error_text(e)}") from e
        return Answer(resp, body)

    def open(self, method: str, path: str, *, scope: Optional[str] = None, headers: Optional[dict] = None,
             timeout=None, retry: bool = True, data: Optional[bytes] = None,
             cancel: Optional[threading.Event] = None) -> Union["requests.Response", Answer]:
        """Send a request with auth and retries (`self.retry`; none with `retry=False`); returns the final
        response (any status), its body not yet read (a refusal of the login: read, as an Answer). `data`
        (bytes, so a retry can send it again) is the request body; a wait between tries ends when `cancel` is set.

        Raises RegistryError when the endpoint cannot be reached after the retries, when the answer's headers
        do not arrive within the response timeout (not tried again: the source is too slow), or when an answer
        from another origin (a `Link`, a `Location`, a redirect) asks for a login; Cancelled.
        """
        url = path if path.startswith(("http://", "https://")) else f"{self.base_url}{path}"
        attempts = self.retry.attempts if retry else 1
        auth_tries = 0
        attempt = 0
        while True:
            try:
                resp = self._send(method, url, scope, headers, timeout, data)
            except self._net.error as e:
                attempt += 1
                if attempt >= attempts:
                    raise self._unreachable(e, url) from e
                self.retry.wait(self.retry.delay(attempt - 1), cancel)
                continue
            if resp.status_code == 401 and auth_tries < 2:
                auth_tries += 1
                self.auth.forget(scope)  # a stale token: drop it and ask again
                refusal = self._answer(resp, MAX_ERROR_BYTES)  # read first: the token service may share its connection
                if self._authenticate(refusal, scope):
                    continue
                return refusal
            expired_redirect = resp.history and resp.status_code in (403, 410)
            if (resp.status_code in RETRY_STATUS or expired_redirect) and attempt + 1 < attempts:
                attempt += 1
                resp.close()
                self.retry.wait(self.retry.delay(attempt - 1, retry_after(resp)), cancel)
                continue
            return resp

    def _send(self, method: str, url: str, scope: Optional[str], headers: Optional[dict], timeout,
              data: Optional[bytes]) -> "requests.Response":
        """One try of `open`, with the login for `url` and its deadline; returns the response, its body not yet
        read. Raises the network's error (to be tried again), RegistryError for what another try would not
        change: the deadline passed, TLS verification failed, another origin asks for a login."""
        hdrs = dict(headers or {})
        hdrs.update(self.auth.header(scope, url))
        seconds = self._seconds(timeout) + len(data or b"") / self.min_rate  # a body to send: at the rate
        try:
            with deadline.watching(seconds) as watch:
                resp = self._session().request(method, url, headers=hdrs, stream=True, timeout=timeout or self.timeout,
                                               allow_redirects=True, verify=self.verify, data=data)
        except self._net.error as e:
            if watch.expired:  # its socket shut by the watchdog: the source is too slow, not down
                raise self._too_slow(seconds) from e
            if isinstance(e, self._net.tls_error):
                raise RegistryError(f"{self.host}: TLS verification failed: {network_error_text(e)}",
                                    hint="set ca_cert for this mirror in mirrors.toml, or insecure = true if you "
                                         "trust the network") from e
            raise
        if watch.expired:  # the headers came in just as the deadline passed: the body is cut off
            resp.close()
            raise self._too_slow(seconds)
        if resp.status_code == 401 and not self.auth.same_origin(resp.url):
            resp.close()
            raise RegistryError(f"{self.host} sent imgtool on to {_netloc(resp.url)}, which asks for a login: "
                                f"imgtool sends the login for {self.host} to {self.host} only")
        return resp

    # -- the API ---------------------------------------------------------

    def ping(self, timeout: Tuple[float, float] = (3.0, 5.0)) -> float:
        """GET /v2/; returns the latency in seconds. 401 counts as alive. Raises RegistryError."""
        start = time.monotonic()
        seconds = self._seconds(timeout)
        try:
            with deadline.watching(seconds) as watch:
                resp = self._session().get(f"{self.base_url}/v2/", timeout=timeout, verify=self.verify, stream=True)
            if watch.expired:
                resp.close()
                raise self._too_slow(seconds)
            self._whole(resp, MAX_ERROR_BYTES, f"{self.host}: /v2/", seconds)
        except self._net.tls_error as e:
            raise RegistryError(f"{self.host}: TLS verification failed: {network_error_text(e)}") from e
        except self._net.read_errors as e:
            if watch.expired:
                raise self._too_slow(seconds) from e
            raise self._unreachable(e, f"{self.base_url}/v2/") from e
        elapsed = time.monotonic() - start
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
                            headers={"Accept": ACCEPT_MANIFESTS}, timeout=timeout, limit=MAX_MANIFEST_BYTES,
                            what=f"{self.host}/{repository} manifest {reference}")
        if resp.status_code == 404:
            said = registry_error_text(resp) if not head else "HTTP 404"
            raise NotFoundError(f"{self.host}/{repository}:{reference} not found ({said})")
        if resp.status_code == 401:
            raise self.auth.failed(f"{self.host}/{repository}: authentication required (HTTP 401)",
                                    f"log in with `docker login {self.host}` (imgtool reads ~/.docker/config.json)")
        if resp.status_code != 200:
            detail = registry_error_text(resp) if not head else f"HTTP {resp.status_code}"
            raise RegistryError(f"{self.host}/{repository}: manifest {reference}: {detail}")
        ctype = resp.headers.get("Content-Type", "").split(";")[0].strip()
        header_digest = resp.headers.get("Docker-Content-Digest")
        if head:
            digest = _parse_digest_header(header_digest)
            return b"", ctype, digest
        data = resp.body
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
        resp = self.open("GET", f"/v2/{repository}/blobs/{digest}", scope=f"repository:{repository}:pull",
                         headers=headers, timeout=timeout, retry=retry, cancel=cancel)
        if resp.status_code in (200, 206) and not isinstance(resp, Answer):
            return BlobStream(resp, self._net.raw_reader(resp), self._net.read_errors, self.host,
                              deadline.Rate(self.min_rate, self.timeout[1]))
        answer = resp if isinstance(resp, Answer) else self._answer(resp, MAX_ERROR_BYTES)
        text = registry_error_text(answer)
        if resp.status_code == 404:
            raise NotFoundError(f"{self.host}/{repository}: blob {digest.short} not found")
        if resp.status_code in RETRY_STATUS or (resp.history and resp.status_code in (403, 410)):
            raise RegistryUnavailable(f"{self.host}/{repository}: blob {digest.short}: {text}",
                                      retry_after=retry_after(resp), status=resp.status_code)
        raise RegistryError(f"{self.host}/{repository}: blob {digest.short}: {text}")

    def tags(self, repository: str, page_size: int = 1000) -> Iterator[str]:
        """Every tag of a repository, following `Link` pagination, at most MAX_TAGS tags in MAX_TAG_PAGES pages
        of MAX_TAG_LIST_BYTES in all. Raises RegistryError (TagListingRefused), one line for any answer that
        is not a tag list."""
        where = f"{self.host}/{repository} tag list"
        url = f"{self.base_url}/v2/{repository}/tags/list?n={page_size}"
        seen = {url}
        pages = count = size = 0
        while url:
            pages += 1
            if pages > MAX_TAG_PAGES:
                raise RegistryError(f"{where}: more than {MAX_TAG_PAGES} pages; imgtool stops reading there")
            resp = self.request("GET", url, scope=f"repository:{repository}:pull", what=where,
                                limit=min(MAX_ANSWER_BYTES, MAX_TAG_LIST_BYTES - size))
            if resp.status_code in (401, 403, 404, 405):
                raise TagListingRefused(f"{self.host}/{repository}: tag listing refused (HTTP {resp.status_code})")
            if resp.status_code != 200:
                raise RegistryError(f"{self.host}/{repository}: tag list: {registry_error_text(resp)}")
            size += len(resp.body)
            doc = json_object(resp.body, MAX_ANSWER_BYTES, lambda why: RegistryError(f"{where}: {why}"))
            tags = doc.get("tags") or []
            if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                raise RegistryError(f"{where}: \"tags\" is not a list of strings")
            count += len(tags)
            if count > MAX_TAGS:
                raise RegistryError(f"{where}: more than {MAX_TAGS} tags; imgtool stops reading there")
            yield from tags
            url = self._next_page(resp, where)
            if url in seen:  # a server that links a page to itself must not loop us forever
                break
            seen.add(url)

    @staticmethod
    def _next_page(resp: Answer, where: str) -> str:
        """The URL a tag page's `Link` names ("" for none); RFC 8288: relative to the URL that answered."""
        link = resp.headers.get("Link") or ""
        if not link:
            return ""
        m = re.match(r"\s*<([^<>]*)>", link)
        try:
            if not m:
                raise ValueError(link)
            url = urljoin(resp.url, m.group(1).strip())
            origin(url)
        except ValueError:
            raise RegistryError(f"{where}: a malformed Link header {link[:200]!r}") from None
        return url

    # -- pushing (imgtool push) -------------------------------------------

    @staticmethod
    def push_scope(repository: str) -> str:
        return f"repository:{repository}:pull,push"

    def _push_failed(self, resp: Answer, repository: str, what: str) -> ImgtoolError:
        if resp.status_code in (401, 403):
            return self.auth.failed(f"{self.host}/{repository}: {what}: push refused (HTTP {resp.status_code}: "
                                     f"{registry_error_text(resp)})",
                                     f"log in with `docker login {self.host}` as a user allowed to push there "
                                     "(imgtool reads ~/.docker/config.json)")
        return RegistryError(f"{self.host}/{repository}: {what}: {registry_error_text(resp)}")

    def has_blob(self, repository: str, digest: Digest) -> bool:
        """HEAD the blob in `repository` (push scope, so the token serves the upload too). Raises RegistryError."""
        resp = self.request("HEAD", f"/v2/{repository}/blobs/{digest}", scope=self.push_scope(repository))
        if resp.status_code == 200:
            return True
        if resp.status_code == 404:
            return False
        raise self._push_failed(resp, repository, f"blob {digest.short}")

    def mount_blob(self, repository: str, digest: Digest, source_repository: str) -> Optional[str]:
        """Cross-repository mount; None when mounted, else the upload URL the registry opened instead."""
        resp = self.request("POST", f"/v2/{repository}/blobs/uploads/?mount={digest}&from={source_repository}",
                            scope=self.push_scope(repository), data=b"", retry=False)
        if resp.status_code == 201:
            return None
        if resp.status_code == 202 and resp.headers.get("Location"):
            return self._absolute(resp.headers["Location"], repository)
        raise self._push_failed(resp, repository, f"mount of blob {digest.short}")

    def start_upload(self, repository: str) -> str:
        """Open an upload session; returns its URL. Raises RegistryError."""
        resp = self.request("POST", f"/v2/{repository}/blobs/uploads/", scope=self.push_scope(repository), data=b"")
        if resp.status_code != 202 or not resp.headers.get("Location"):
            raise self._push_failed(resp, repository, "starting an upload")
        return self._absolute(resp.headers["Location"], repository)

    def upload_chunk(self, repository: str, url: str, data: bytes, start: int) -> str:
        """PATCH bytes [start, start+len) to the session; returns the next URL. Raises RegistryError."""
        headers = {"Content-Type": "application/octet-stream",
                   "Content-Range": f"{start}-{start + len(data) - 1}"}
        resp = self.request("PATCH", url, scope=self.push_scope(repository), headers=headers, data=data, retry=False)
        if resp.status_code != 202 or not resp.headers.get("Location"):
            raise self._push_failed(resp, repository, f"uploading bytes {start}-{start + len(data) - 1}")
        return self._absolute(resp.headers["Location"], repository)

    def finish_upload(self, repository: str, url: str, digest: Digest, data: bytes = b"") -> None:
        """PUT ?digest= (with the last bytes, or all of a small blob). Raises RegistryError."""
        sep = "&" if "?" in url else "?"
        resp = self.request("PUT", f"{url}{sep}digest={digest}", scope=self.push_scope(repository),
                            headers={"Content-Type": "application/octet-stream"}, data=data, retry=False)
        if resp.status_code not in (201, 204):
            raise self._push_failed(resp, repository, f"blob {digest.short}")

    def put_manifest(self, repository: str, reference: str, data: bytes, media_type: str) -> Optional[Digest]:
        """PUT the manifest bytes as they are (so its digest stays); returns the registry's digest."""
        resp = self.request("PUT", f"/v2/{repository}/manifests/{reference}", scope=self.push_scope(repository),
                            headers={"Content-Type": media_type}, data=data)
        if resp.status_code not in (200, 201, 202):
            raise self._push_failed(resp, repository, f"manifest {reference}")
        return _parse_digest_header(resp.headers.get("Docker-Content-Digest"))

    def _absolute(self, location: str, repository: str) -> str:
        """An upload `Location` as a URL (relative to the endpoint); raises RegistryError when malformed. One on
        another origin is used without the login (see `open`)."""
        url = location if location.startswith(("http://", "https://")) else (
            self.base_url + ("" if location.startswith("/") else "/") + location)
        try:
            origin(url)
        except ValueError:
            raise RegistryError(f"{self.host}/{repository}: the registry answered with a malformed upload Location "
                                f"{location[:200]!r}") from None
        return url


def _parse_digest_header(value: Optional[str]) -> Optional[Digest]:
    try:
        return Digest.parse(value.strip()) if value else None
    except UsageError:
        return None
