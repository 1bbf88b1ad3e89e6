"""The hubs room's transport: one endpoint's GETs over requests (Python 3.9+, the connected side), with the rules
issue 35 gave the registry room (one copy of them, shared with it: transport.py) and one more.

- A login (the hub's token) goes only to the endpoint's own origin (scheme, host, port). Redirects are followed
  here, hop by hop, so a `Location` on another origin (the hub's storage bridge, a CDN with a presigned URL) is
  asked without it; no cookie is kept, and `~/.netrc` adds nothing.
- Every answer's headers come within the response timeout (`deadline.watching`: the socket is shut when it
  passes); a JSON answer is read whole, at most a cap, within it too; a file's body comes at a minimum rate
  (`BlobStream`, `deadline.Rate`).
- The one `RetryPolicy`: network failures and 408/425/429/5xx tried again, `Retry-After` honoured, for JSON
  answers here; a file's ranges are tried once here and again by the puller (which may go to another source).
"""

import http.client
import threading
from typing import TYPE_CHECKING, Dict, Optional, Tuple
from urllib.parse import urljoin, urlsplit

from .. import deadline
from ..config import DEFAULT_MIN_RATE
from ..errors import NotFoundError, RegistryError, RegistryUnavailable
from ..model import json_object
from ..registry_answers import MAX_ERROR_BYTES, RETRY_STATUS, Answer, BlobStream, RetryPolicy, network_error_text, retry_after
from ..registry_auth import origin
from ..transport import Waited, Waits, new_session, read_capped, tls_verify, unreachable

if TYPE_CHECKING:
    import requests

MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)


def _no_netrc(request):
    """An auth that changes nothing: given to requests, it keeps ~/.netrc's login off every request (a redirect's
    target too), so the only login sent is the one this room adds for the endpoint's own origin."""
    return request


class HubHttp(Waited):
    """One hub endpoint's requests; thread-safe (one session per thread). `login` (headers carrying the token) is
    sent only to `base_url`'s origin; `login_hint` says how to give a token when the hub asks for one."""

    def __init__(self, base_url: str, *, login: Optional[Dict[str, str]] = None, login_hint: str = "",
                 insecure: bool = False, ca_cert: Optional[str] = None, connect_timeout: float = 10.0,
                 read_timeout: float = 60.0, response_timeout: Optional[float] = None,
                 min_rate: int = DEFAULT_MIN_RATE, retry: Optional[RetryPolicy] = None):
        import requests
        import urllib3

        self.base_url = base_url.rstrip("/")
        self.origin = origin(self.base_url)  # ValueError for a URL that is not http(s)
        self.host = urlsplit(self.base_url).netloc
        self._login = dict(login or {})
        self.login_hint = login_hint
        self.verify = tls_verify(insecure, ca_cert)
        self.waits = Waits.of(connect_timeout, read_timeout, response_timeout, min_rate)
        self.retry = retry or RetryPolicy()
        self._local = threading.local()
        self._error = requests.RequestException
        self._tls_error = requests.exceptions.SSLError
        self._proxy_error = requests.exceptions.ProxyError
        self.read_errors: tuple = (requests.RequestException, OSError, http.client.HTTPException,
                                   urllib3.exceptions.HTTPError)

    @property
    def has_login(self) -> bool:
        return bool(self._login)

    def _session(self) -> "requests.Session":
        s = getattr(self._local, "session", None)
        if s is None:
            import requests

            s = self._local.session = new_session(requests, keep_cookies=False)
        return s

    def login_for(self, url: str) -> Dict[str, str]:
        """The login headers for `url`: the endpoint's own origin only."""
        try:
            return dict(self._login) if origin(url) == self.origin else {}
        except ValueError:
            return {}

    def send(self, url: str, headers: Optional[Dict[str, str]] = None, timeout=None) -> "requests.Response":
        """One GET of `url` with its redirects followed here (each hop within the response timeout, the login only
        on this endpoint's origin); the final response, its body not read. Raises the transport's errors (worth
        another try) and RegistryError (too slow, TLS refused, a redirect that is not an http(s) URL, too many)."""
        seconds = self._seconds(timeout)
        for _ in range(MAX_REDIRECTS + 1):
            hdrs = dict(headers or {})
            hdrs.update(self.login_for(url))
            try:
                with deadline.watching(seconds) as watch:
                    resp = self._session().get(url, headers=hdrs, stream=True, timeout=timeout or self.timeout,
                                               allow_redirects=False, verify=self.verify, auth=_no_netrc)
            except self._error as e:
                if watch.expired:
                    raise self._too_slow(seconds) from e
                if isinstance(e, self._tls_error):
                    raise RegistryError(f"{urlsplit(url).netloc}: TLS verification failed: {network_error_text(e)}",
                                        hint="set ca_cert for this endpoint in mirrors.toml ([[model_mirrors]])") from e
                raise
            if watch.expired:
                resp.close()
                raise self._too_slow(seconds)
            if resp.status_code not in REDIRECTS:
                return resp
            location = resp.headers.get("Location") or ""
            resp.close()
            try:
                url = urljoin(url, location)
                origin(url)
            except ValueError:
                raise RegistryError(f"{self.host}: redirected to {location[:200]!r}, not an http(s) URL") from None
        raise RegistryError(f"{self.host}: more than {MAX_REDIRECTS} redirects")

    def _whole(self, resp: "requests.Response", limit: int, what: str, seconds: float, cut: bool = False) -> bytes:
        """The body read to its end, at most `limit` bytes (`cut`: what fits, else RegistryError past it), within
        `seconds` of now; the response closed."""
        raw = resp.raw
        read = getattr(raw, "read1", None) or raw.read
        try:
            return read_capped(lambda n: read(n, decode_content=False), limit, what, seconds, self._too_slow, cut)
        finally:
            resp.close()

    def get(self, url: str, *, limit: int, what: str, timeout=None, cancel: Optional[threading.Event] = None,
            retry: bool = True) -> Answer:
        """GET `url` and read its answer whole (a 200's at most `limit` bytes, an error's what fits in 64 KiB),
        tried again by the RetryPolicy on a network failure or a 408/425/429/5xx (its `Retry-After` honoured);
        returns the last answer, whatever its status. Raises RegistryError, Cancelled."""
        attempts = self.retry.attempts if retry else 1
        attempt = 0
        seconds = self._seconds(timeout)
        while True:
            try:
                resp = self.send(url, {"Accept": "application/json"}, timeout)
                if resp.status_code in RETRY_STATUS and attempt + 1 < attempts:
                    attempt += 1
                    wait = retry_after(resp)
                    resp.close()
                    self.retry.wait(self.retry.delay(attempt - 1, wait), cancel)
                    continue
                ok = resp.status_code == 200
                return Answer(resp, self._whole(resp, limit if ok else MAX_ERROR_BYTES, what, seconds, cut=not ok))
            except self.read_errors as e:
                attempt += 1
                if attempt >= attempts:
                    raise unreachable(self.host, e, url, self._proxy_error, "hub") from e
                self.retry.wait(self.retry.delay(attempt - 1), cancel)

    def stream(self, url: str, start: int, end: Optional[int], what: str) -> Tuple[BlobStream, int, Dict[str, str]]:
        """One try of a file's raw bytes [start, end) (end None: to its end): (the stream, the status (200: the
        server sent the whole file, Range ignored; 206), the answer's headers). Raises NotFoundError (404),
        RegistryUnavailable (a status worth another try; its Retry-After), RegistryError."""
        headers = {}
        if start or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            resp = self.send(url, headers)
        except self.read_errors as e:
            raise unreachable(self.host, e, url, self._proxy_error, "hub") from e
        if resp.status_code in (200, 206):
            raw = resp.raw
            read = getattr(raw, "read1", None) or raw.read
            stream = BlobStream(resp, lambda n: read(n, decode_content=False), self.read_errors,
                                urlsplit(resp.url).netloc, deadline.Rate(self.min_rate, self.timeout[1]))
            return stream, resp.status_code, dict(resp.headers)
        try:
            answer = Answer(resp, self._whole(resp, MAX_ERROR_BYTES, what, self.response_timeout, cut=True))
        except self.read_errors:
            answer = Answer(resp, b"")
        raise self.refused(answer, what)

    def refused(self, answer: Answer, what: str) -> RegistryError:
        """The error for an answer that is not what was asked for: NotFoundError (404), RegistryUnavailable
        (408/425/429/5xx, with its Retry-After), a login asked for (401/403, with how to give one), else
        RegistryError; each naming the host that answered and what the hub said."""
        status = answer.status_code
        host = urlsplit(answer.url).netloc if answer.url else self.host
        said = hub_error_text(answer)
        if status == 404:
            return NotFoundError(f"{host}: {what}: not found ({said})")
        if status in RETRY_STATUS:
            return RegistryUnavailable(f"{host}: {what}: {said}", retry_after=retry_after(answer), status=status)
        if status in (401, 403):
            sent = "with the token given" if self.has_login else "without a token"
            return RegistryError(f"{host}: {what}: refused {sent} ({said}): the model is gated or private",
                                 hint=self.login_hint or None)
        return RegistryError(f"{host}: {what}: {said}")


def hub_error_text(answer: Answer) -> str:
    """What a hub's error answer says: Hugging Face's `X-Error-Code`/`X-Error-Message` or `{"error"}`, ModelScope's
    `{"Message"}`; else the status line. One line, at most 200 characters."""
    status = f"HTTP {answer.status_code}"
    code = answer.headers.get("X-Error-Code") or ""
    message = answer.headers.get("X-Error-Message") or ""
    if not message:
        try:
            doc = json_object(answer.body, MAX_ERROR_BYTES, ValueError)
            found = doc.get("error") or doc.get("Message") or ""
            message = found if isinstance(found, str) else ""
        except (ValueError, AttributeError, TypeError):
            pass
    text = " ".join(" ".join(p for p in (status, code, message) if p).split())
    return text if len(text) <= 200 else text[:197] + "..."
