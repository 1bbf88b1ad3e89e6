"""Who one registry endpoint's login may go to, and the state of proving who we are to it.

`Auth` holds an endpoint's credentials (looked up on its first 401, once, through the lookup registry.py
hands in: `docker login`'s store, maybe a credential helper), its bearer tokens per scope and whether it
asked for Basic. The origin rules (docs/security.md): a login, or a token got with it, goes only to the
endpoint's own origin (scheme, host, port) and, when the endpoint is reached over TLS, to the token service
its 401 names; never over plain HTTP unless the endpoint is `insecure`; never to a `Link`, a `Location` or a
redirect on another origin. The token request itself is sent by registry.py (the transport stays there).
"""

import base64
import re
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union
from urllib.parse import urlsplit

from .errors import CredentialHelperError, ImgtoolError, LoginWithheld, RegistryError
from .model import json_object

Origin = Tuple[str, str, int]
Credentials = Tuple[str, str]


def origin(url: str) -> Origin:
    """(scheme, host, port) of a URL, the port filled in: what a login is stored for. Raises ValueError."""
    split = urlsplit(url)
    scheme = split.scheme.lower()
    port = split.port  # ValueError for a malformed port
    if scheme not in ("http", "https") or not split.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    return scheme, split.hostname.lower(), port or (443 if scheme == "https" else 80)


_CHALLENGE_PARAM = re.compile(r'(\w+)\s*=\s*(?:"([^"]*)"|([^\s,]+))')


def parse_challenge(header: str) -> Tuple[str, Dict[str, str]]:
    """Split `Bearer realm="...",service="..."` into ("bearer", {...})."""
    scheme, _, rest = (header or "").strip().partition(" ")
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _CHALLENGE_PARAM.finditer(rest)}
    return scheme.lower(), params


@dataclass(frozen=True)
class TokenAsk:
    """A bearer challenge answered: the token service to ask, its query, and the login sent with it (None:
    anonymous)."""

    realm: str
    query: Dict[str, str]
    login: Optional[Credentials]


class Auth:
    """One endpoint's login and tokens; thread-safe. `lookup` gives the credentials when the endpoint first
    asks (it may raise CredentialHelperError: we stay anonymous, and name it if the registry then refuses)."""

    def __init__(self, base_url: str, host: str, *, insecure: bool, credentials: Optional[Credentials],
                 lookup: Optional[Callable[[], Optional[Credentials]]]):
        self.base_url, self.host, self.insecure = base_url, host, insecure
        self.origin = origin(base_url)  # ValueError for a malformed URL
        self.credentials = credentials
        self.lookup = lookup if credentials is None else None  # None: nothing (more) to look up
        self.credential_problem: Optional[CredentialHelperError] = None
        self.withheld: Optional[str] = None  # why the login was not sent to the token service named
        self.tokens: Dict[str, str] = {}  # scope -> bearer token
        self.basic = False  # the registry asked for Basic auth
        self._login_lock = threading.Lock()
        self._lock = threading.Lock()

    def login(self) -> Optional[Credentials]:
        """The credentials for this endpoint, looked up when a registry first asks (once, whichever thread
        asks first); a helper that fails leaves us anonymous and is named if the registry then refuses."""
        with self._login_lock:
            if self.lookup is not None:
                lookup, self.lookup = self.lookup, None
                try:
                    self.credentials = lookup()
                except CredentialHelperError as e:
                    self.credential_problem = e
            return self.credentials

    def may_send_login(self, url: str, realm: bool = False) -> bool:
        """Whether this endpoint's login (or a token got with it) may go to `url`: its own origin, or (`realm`)
        the token service it named when reached over TLS; plain HTTP only for an `insecure` endpoint."""
        try:
            there = origin(url)
        except ValueError:
            return False
        if there[0] != "https" and not self.insecure:
            return False
        if there == self.origin:
            return True
        return realm and (self.origin[0] == "https" or self.insecure)

    def same_origin(self, url: str) -> bool:
        try:
            return origin(url) == self.origin
        except ValueError:
            return False

    def header(self, scope: Optional[str], url: str) -> Dict[str, str]:
        """What proves who we are to `url`: nothing unless it is this endpoint (a token was got with the
        login only where `may_send_login` allowed it)."""
        if not self.same_origin(url):
            return {}
        with self._lock:
            token = self.tokens.get(scope or "")
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self.basic and self.credentials and self.may_send_login(url):
            raw = base64.b64encode(":".join(self.credentials).encode()).decode()
            return {"Authorization": f"Basic {raw}"}
        return {}

    def forget(self, scope: Optional[str]) -> None:
        """The token for `scope` was refused (expired): ask again."""
        with self._lock:
            self.tokens.pop(scope or "", None)

    def challenged(self, header: str, scope: Optional[str]) -> Union[bool, TokenAsk]:
        """A 401's `WWW-Authenticate`: True to try again (Basic from now on), False when nothing more can be
        tried, or the token service to ask. Raises RegistryError for a realm that is not an http(s) URL."""
        scheme, params = parse_challenge(header)
        credentials = self.login()
        if scheme == "basic":
            if credentials and not self.may_send_login(self.base_url):
                self.withheld = (f"imgtool sends the login for {self.host} over plain HTTP only to a registry "
                                 "marked insecure (insecure = true in mirrors.toml, or --insecure)")
                return False
            if not credentials or self.basic:
                return False
            self.basic = True
            return True
        realm = params.get("realm") or ""
        if scheme != "bearer" or not realm:
            return False
        try:
            origin(realm)
        except ValueError:
            raise RegistryError(f"{self.host}: its 401 names a token service that is not an http(s) URL: "
                                f"{realm[:200]!r}") from None
        query = {}
        if params.get("service"):
            query["service"] = params["service"]
        want_scope = scope or params.get("scope")
        if want_scope:
            query["scope"] = want_scope
        login = None
        if credentials and self.may_send_login(realm, realm=True):
            login = credentials
        elif credentials:
            self.withheld = (f"imgtool did not send the login for {self.host} to the token service it names, "
                             f"{realm[:200]}: that is plain HTTP (mark {self.host} insecure in mirrors.toml, or "
                             "--insecure, only if you trust the network)")
        return TokenAsk(realm, query, login)

    def keep_token(self, scope: Optional[str], body: bytes, limit: int) -> None:
        """The token service's answer (200): keep its token for `scope`. Raises RegistryError without one."""
        try:
            doc = json_object(body, limit, ValueError)
            token = doc.get("token") or doc.get("access_token")
        except ValueError:
            token = None
        if not token or not isinstance(token, str):
            raise RegistryError(f"{self.host}: the token service answered without a token")
        with self._lock:
            self.tokens[scope or ""] = token

    def failed(self, message: str, hint: str) -> ImgtoolError:
        """The registry wants credentials it did not get: when a credential helper failed, that is why; when
        the login was kept from a plain-HTTP token service, that is."""
        if self.credential_problem is not None:
            return self.credential_problem
        if self.withheld is not None:
            return LoginWithheld(message, hint=self.withheld)
        return RegistryError(message, hint=hint)
