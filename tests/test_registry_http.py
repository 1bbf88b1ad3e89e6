"""registry_http: the stdlib registry client imgtool.pyz pushes with on Python 3.7/3.8.

Each test asks the same real registry the same questions through both transports (requests and
the stdlib client) behind the same `RegistryClient` methods and expects the same answers and the
same error texts: the old-Python path is not a second product. tests/test_push.py runs it for real
under pyenv's 3.7 and 3.8.
"""

import base64
import json
import re
import selectors
import socket
import socketserver
import threading
import warnings

from imgtool import registry, registry_http
from imgtool.errors import ImgtoolError
from imgtool.model import Digest
from imgtool.progress import choose
from imgtool.push import push_bundle
from imgtool.registry import RegistryClient, credentials_for, default_transport
from tests.support.bundles import BlobDir, write
from tests.support.images import host_arch
from tests.support.proxy import FaultProxy
from tests.support.registry import RegistryClient as PushClient
from tests.test_puller import HELPER

TRANSPORTS = ("requests", "http")
ABSENT = Digest.parse("sha256:" + "0" * 64)


def outcome(call):
    """What a user sees of one call: its value, or the error's class, message, hint and exit code."""
    try:
        return ("ok", call())
    except ImgtoolError as e:
        return (type(e).__name__, e.message, e.hint, e.exit_code)


def same(call):
    """call(transport) through both transports: the one outcome they agree on."""
    found = [outcome(lambda t=t: call(t)) for t in TRANSPORTS]
    assert found[0] == found[1], found
    return found[0]


def test_the_stdlib_client_is_the_default_only_below_python_3_9():
    assert default_transport() == "requests"  # this venv: 3.9+


def test_reads_and_errors_are_the_same_through_both_transports(services, factory, uniq):
    idx = factory.multiarch(media="oci", layers=2)
    repo = f"{uniq}/vllm-ascend"
    with PushClient.for_service(services, "plain") as c:
        c.push(repo, "v1", idx)
    image = idx.image(f"linux/{host_arch()}")
    layer = Digest.parse(image.layers[0].digest)

    def client(t):
        return RegistryClient(f"http://{services.plain}", transport=t, use_docker_config=False)

    assert same(lambda t: client(t).ping() >= 0) == ("ok", True)
    got = same(lambda t: client(t).manifest(repo, "v1"))
    assert got == ("ok", (idx.manifest_bytes, idx.manifest_media_type, Digest.parse(idx.manifest_digest)))
    assert same(lambda t: client(t).manifest(repo, "v1", head=True))[1][2] == Digest.parse(idx.manifest_digest)
    assert same(lambda t: list(client(t).tags(repo))) == ("ok", ["v1"])
    assert same(lambda t: (client(t).has_blob(repo, layer), client(t).has_blob(repo, ABSENT))) == ("ok", (True, False))

    def ranged(t):  # a BlobStream on both: the transport stays inside the registry room
        with client(t).blob(repo, layer, start=10, end=1010) as blob:
            return blob.whole, blob.read_up_to(300), blob.read_up_to(10_000)
    assert same(ranged) == ("ok", (False, image.layers[0].blob[10:310], image.layers[0].blob[310:1010]))

    assert same(lambda t: client(t).manifest(repo, "v9")) == (
        "NotFoundError", f"{services.plain}/{repo}:v9 not found (MANIFEST_UNKNOWN: manifest unknown)", None, 4)
    assert same(lambda t: client(t).blob(repo, ABSENT)) == (
        "NotFoundError", f"{services.plain}/{repo}: blob {ABSENT.short} not found", None, 4)
    assert same(lambda t: RegistryClient("http://127.0.0.1:1", transport=t).ping()) == (
        "RegistryError", "127.0.0.1:1: connection refused", None, 4)


def test_tls_and_basic_auth_are_the_same_through_both_transports(services, factory, uniq, monkeypatch):
    idx = factory.multiarch(layers=1)
    repo = f"{uniq}/vllm-ascend"
    with PushClient.for_service(services, "tls", auth=services.tls_auth) as c:
        c.push(repo, "v1", idx)
    url = f"https://{services.tls}"
    login = (services.tls_user, services.tls_password)

    def read(t, **kw):
        return RegistryClient(url, transport=t, use_docker_config=False, **kw).manifest(repo, "v1")[2]

    assert same(lambda t: read(t, ca_cert=services.tls_ca, credentials=login)) == (
        "ok", Digest.parse(idx.manifest_digest))
    assert same(lambda t: read(t, insecure=True, credentials=login)) == ("ok", Digest.parse(idx.manifest_digest))
    assert same(lambda t: read(t, credentials=login)) == (
        "RegistryError", f"{services.tls}: TLS verification failed: certificate verify failed: unable to get local "
        "issuer certificate",
        "set ca_cert for this mirror in mirrors.toml, or insecure = true if you trust the network", 4)
    with monkeypatch.context() as env:  # requests' own variable for a site CA: honoured on both
        env.setenv("REQUESTS_CA_BUNDLE", services.tls_ca)
        assert same(lambda t: read(t, credentials=login)) == ("ok", Digest.parse(idx.manifest_digest))
    assert same(lambda t: read(t, ca_cert=services.tls_ca, credentials=(services.tls_user, "wrong"))) == (
        "RegistryError", f"{services.tls}/{repo}: authentication required (HTTP 401)",
        f"log in with `docker login {services.tls}` (imgtool reads ~/.docker/config.json)", 4)


def test_bearer_tokens_are_asked_for_the_same_way_through_both_transports(services, factory, uniq, token_issuer):
    repo = f"{uniq}/vllm-ascend"
    token_issuer.credentials = {"robot": "s3cret"}
    token_issuer.anonymous_actions = ()
    data = b"pushed through the token flow"
    digest = Digest.of(data)
    asked = []
    for t in TRANSPORTS:
        seen = token_issuer.count
        c = RegistryClient(f"http://{services.token}", transport=t, insecure=True, credentials=("robot", "s3cret"))
        assert c.has_blob(repo, digest) is (t == "http")  # requests pushed it first
        if t == "requests":
            c.finish_upload(repo, c.start_upload(repo), digest, data)
        asked.append([(r.account, r.service, r.scopes, r.status) for r in token_issuer.requests[seen:]])
    # one token per client, with the login, for pull and push; reused for the upload
    assert asked[0] == asked[1] == [("robot", services.token_service, [f"repository:{repo}:pull,push"], 200)]

    def refused(t):
        c = RegistryClient(f"http://{services.token}", transport=t, insecure=True, credentials=("robot", "wrong"))
        return c.has_blob(repo, digest)
    kind, message, hint, code = same(refused)
    assert (kind, code) == ("RegistryError", 4)
    assert message == f"{services.token}: the token service refused access (UNAUTHORIZED)", message


def _normal(records):
    """The proxy's records without what differs by chance (upload session IDs and their state)."""
    return [(r.method, re.sub(r"/uploads/[^?]+(\?.*)?$", "/uploads/ID", r.path), r.status) for r in records]


def test_push_sends_the_same_requests_through_both_transports(services, factory, tmp_path, uniq, monkeypatch):
    store = BlobDir(tmp_path / "blobs")
    base = factory.layers(2)
    one = factory.image(host_arch(), layers=1, base=base)
    two = factory.image(host_arch(), layers=1, base=base)
    out = tmp_path / "bundle"
    write(out, [store.pulled(one, "quay.io/ascend/vllm-ascend:v1"), store.pulled(two, "quay.io/ascend/cann:8.2")],
          store, chunk_size=700 * 1024)
    proxy = FaultProxy(services.plain)
    try:
        results, sent = [], []
        for t in TRANSPORTS:
            monkeypatch.setattr(registry, "default_transport", lambda t=t: t)
            proxy.clear()
            result = push_bundle(out, f"{proxy.hostport}/{uniq}/{t}", insecure=True, progress=choose(True),
                                 chunk=256 * 1024)
            results.append(result.to_json())
            sent.append(_normal(proxy.records))
    finally:
        proxy.close()
    for r in results:
        r.pop("seconds")
        for im in r["images"]:
            im["target"] = im["target"].replace("/requests/", "/T/").replace("/http/", "/T/")
    assert results[0] == results[1]
    assert (results[1]["blobs_uploaded"], results[1]["blobs_mounted"]) == (6, 2)
    norm = [[(m, p.replace(f"/{t}/", "/T/").replace(f"from={uniq}/{t}/", "from=T/"), s) for m, p, s in rows]
            for t, rows in zip(TRANSPORTS, sent)]
    assert norm[0] == norm[1]
    assert sum(1 for m, _, _ in norm[1] if m == "PATCH") >= 4  # ~1 MiB layers in 256 KiB chunks
    with PushClient.for_service(services, "plain") as c:
        for name, image in (("vllm-ascend", one), ("cann", two)):
            a = c.get_manifest(f"{uniq}/requests/ascend/{name}", image.manifest_digest)
            b = c.get_manifest(f"{uniq}/http/ascend/{name}", image.manifest_digest)
            assert a.body == b.body == image.manifest_bytes


class ConnectProxy:
    """A forward proxy that only tunnels (CONNECT host:port), as site proxies do for https; records targets."""

    def __init__(self):
        self.targets = []
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                head = self.request.makefile("rb")
                method, target, _ = head.readline().decode("latin-1").split(" ", 2)
                while head.readline() not in (b"\r\n", b"\n", b""):
                    pass
                proxy.targets.append((method, target))
                if method != "CONNECT":
                    self.request.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                    return
                host, port = target.rsplit(":", 1)
                with socket.create_connection((host, int(port)), timeout=10) as upstream:
                    self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    _relay(self.request, upstream)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True  # a tunnel ends when either side closes, or after 5 s idle
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _relay(a: socket.socket, b: socket.socket) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        while True:
            ready = sel.select(timeout=5)
            if not ready:
                return
            for key, _ in ready:
                data = key.fileobj.recv(65536)
                if not data:
                    return
                key.data.sendall(data)


def test_proxies_from_the_environment_are_used_as_requests_uses_them(services, factory, uniq, monkeypatch):
    """$http_proxy (the whole request to the proxy), $https_proxy (a CONNECT tunnel), $no_proxy."""
    idx = factory.multiarch(layers=1)
    repo = f"{uniq}/vllm-ascend"
    with PushClient.for_service(services, "plain") as c:
        c.push(repo, "v1", idx)
    with PushClient.for_service(services, "tls", auth=services.tls_auth) as c:
        c.push(repo, "v1", idx)
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    forward, tunnel = FaultProxy(services.plain), ConnectProxy()
    monkeypatch.setenv("http_proxy", forward.url)
    monkeypatch.setenv("https_proxy", tunnel.url)
    login = (services.tls_user, services.tls_password)

    def ask(t):
        forward.clear()
        del tunnel.targets[:]
        plain = RegistryClient(f"http://{services.plain}", transport=t, use_docker_config=False)
        tls = RegistryClient(f"https://{services.tls}", transport=t, ca_cert=services.tls_ca, credentials=login)
        return (plain.manifest(repo, "v1")[2], tls.manifest(repo, "v1")[2],
                [(r.method, r.path) for r in forward.records], sorted(set(tunnel.targets)))
    try:
        via = [ask(t) for t in TRANSPORTS]
        assert via[0] == via[1] == (Digest.parse(idx.manifest_digest), Digest.parse(idx.manifest_digest),
                                    [("GET", f"http://{services.plain}/v2/{repo}/manifests/v1")],
                                    [("CONNECT", services.tls)])
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        direct = [ask(t) for t in TRANSPORTS]
        assert direct[0] == direct[1] and direct[1][2:] == ([], [])
    finally:
        forward.close()
        tunnel.close()


def _config(home, doc):
    (home / ".docker").mkdir(parents=True, exist_ok=True)
    (home / ".docker" / "config.json").write_text(json.dumps(doc))


def test_credentials_are_read_from_docker_config_as_docker_py_reads_them(tmp_path, monkeypatch):
    """registry_http.docker_credentials (what imgtool resolves with, on both transports) against docker.auth:
    the same logins, the same refusals."""
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    helper = bin_dir / "docker-credential-imgtooltest"
    helper.write_text(HELPER.format(host="helped.example:5000", user="alice", password="from-helper"))
    helper.chmod(0o755)
    broken = bin_dir / "docker-credential-broken"
    broken.write_text("#!/bin/sh\necho 'the keyring is locked'\nexit 3\n")
    broken.chmod(0o755)
    basic = base64.b64encode(b"bob:pa:ss").decode()

    path = home / ".docker" / "config.json"

    def both(host):
        """credentials_for's outcome, after its resolution (registry_http's, for every transport: it has a
        helper timeout, docker-py has none) gave what docker-py's docker.auth gives."""
        assert _resolved_by_docker_py(path, host) == _resolved_by_the_twin(path, host), host
        return outcome(lambda: credentials_for(host))

    _config(home, {"auths": {"reg.example": {"auth": basic}, "https://legacy.example/v1/": {"auth": basic},
                             "token.example": {"identitytoken": "x"}, "helped.example:5000": {}}})
    assert both("reg.example") == both("legacy.example") == ("ok", ("bob", "pa:ss"))
    assert both("token.example") == both("helped.example:5000") == both("other.example") == ("ok", None)

    _config(home, {"auths": {"reg.example": {"auth": basic}}, "credsStore": "imgtooltest"})
    assert both("helped.example:5000") == ("ok", ("alice", "from-helper"))
    assert both("reg.example") == ("ok", ("bob", "pa:ss"))  # the helper has none: auths
    _config(home, {"credHelpers": {"helped.example:5000": "imgtooltest", "locked.example": "broken",
                                   "gone.example": "missing"}})
    assert both("helped.example:5000") == ("ok", ("alice", "from-helper"))
    assert both("reg.example") == ("ok", None)
    assert both("locked.example") == (
        "CredentialHelperError", f"docker-credential-broken named in {path} cannot give the credentials for "
        'locked.example: Credentials store docker-credential-broken exited with "the keyring is locked ".',  # docker's words
        f"install docker-credential-broken (or run `docker login locked.example` again), or remove "
        f"credsStore/credHelpers from {path}", 2)
    assert both("gone.example")[1] == (
        f"docker-credential-missing named in {path} cannot give the credentials for gone.example: "
        "docker-credential-missing not installed or not available in PATH")
    path.write_text("{not json")
    assert both("reg.example") == ("ok", None)  # an unreadable config: anonymous, on both


def _entry(entry):
    if not isinstance(entry, dict):
        return ("ok", None)
    user, password = entry.get("Username") or entry.get("username"), entry.get("Password") or entry.get("password")
    return ("ok", (user, password) if user and password is not None else None)


def _resolved_by_docker_py(path, host):
    from docker.auth import load_config
    from docker.errors import DockerException

    try:
        with warnings.catch_warnings():  # docker-py warns on stderr when a helper is missing
            warnings.simplefilter("ignore")
            return _entry(load_config(config_path=str(path)).resolve_authconfig(host))
    except DockerException as e:
        return ("helper", str(e.__cause__ if e.__cause__ is not None else e))  # the helper's words (StoreError)
    except (OSError, ValueError, AttributeError, TypeError):
        return ("ok", None)  # an unreadable config: anonymous


def _resolved_by_the_twin(path, host):
    try:
        return _entry(registry_http.docker_credentials(str(path), host))
    except registry_http.HelperError as e:
        return ("helper", str(e))
    except (OSError, ValueError, AttributeError, TypeError):
        return ("ok", None)  # an unreadable config: anonymous


def test_a_dead_proxy_is_named_not_the_registry_through_both_transports(services, monkeypatch):
    """$https_proxy / $HTTP_PROXY pointing at nothing: the proxy and its variable are named, decided on the
    exception type (requests' ProxyError; the stdlib client knows it was connecting to a proxy)."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:1")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:1")
    hint = "check that variable (or unset it), or name this registry in $no_proxy to connect directly"
    fast = registry.RetryPolicy(attempts=1)
    for url, host, var in ((f"https://{services.tls}", services.tls, "$https_proxy"),
                           (f"http://{services.plain}", services.plain, "$HTTP_PROXY")):
        def client(t, url=url):
            return RegistryClient(url, transport=t, use_docker_config=False, ca_cert=services.tls_ca, retry=fast)
        want = ("RegistryError", f"cannot reach the proxy http://127.0.0.1:1 (from {var}) for {host}: "
                "connection refused", hint, 4)
        assert same(lambda t: client(t).ping()) == want
        assert same(lambda t: client(t).manifest("a/b", "v1")) == want
    monkeypatch.setenv("no_proxy", "127.0.0.1")  # the proxy is not asked: the registry itself answers
    assert same(lambda t: RegistryClient("http://127.0.0.1:1", transport=t, retry=fast).ping()) == (
        "RegistryError", "127.0.0.1:1: connection refused", None, 4)
