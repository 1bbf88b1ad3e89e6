"""A tiny distribution-API client for putting test images into the real registries.

Handles Basic auth (the `tls` registry) and the bearer-token challenge flow (the `token` registry,
served by tests.support.tokenissuer). Not product code: it trusts the registry and keeps
everything in memory.

    push_image("127.0.0.1:5000", "t1a2b/app", "v1", image)                  # HTTP, no auth
    push_image(svc.tls, repo, "v1", index, scheme="https", auth=svc.tls_auth, verify=svc.tls_ca)
    RegistryClient.for_service(svc, "token").push(repo, "v1", image)           # issuer running
"""

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union
from urllib.parse import urljoin

import requests

from .images import MANIFEST_ACCEPT, Image, Index, sha256_digest

ImageOrIndex = Union[Image, Index]
Auth = Optional[Tuple[str, str]]
Verify = Union[None, bool, str]


class RegistryHTTPError(RuntimeError):
    def __init__(self, response: requests.Response, what: str):
        body = response.text[:500]
        super().__init__(f"{what}: HTTP {response.status_code} {body}")
        self.response = response
        self.status_code = response.status_code


@dataclass(frozen=True)
class Fetched:
    body: bytes
    media_type: str  # Content-Type as served
    digest: Optional[str]  # Docker-Content-Digest header, if any
    status_code: int


def parse_challenge(header: str) -> Tuple[str, Dict[str, str]]:
    """'Bearer realm="x",service="y"' -> ("bearer", {"realm": "x", "service": "y"})."""
    scheme, _, rest = header.strip().partition(" ")
    params = dict(re.findall(r'([A-Za-z_]+)="([^"]*)"', rest))
    return scheme.lower(), params


class RegistryClient:
    """One registry (host:port); keeps bearer tokens per scope and learns Basic on first 401."""

    def __init__(self, registry: str, scheme: str = "http", auth: Auth = None,
                 verify: Verify = None, timeout: float = 60):
        self.registry = registry
        self.base = f"{scheme}://{registry}"
        self.auth = tuple(auth) if auth else None
        self.session = requests.Session()
        self.session.verify = True if verify is None else verify
        self.session.trust_env = False  # never send loopback traffic through a proxy
        self.timeout = timeout
        self._tokens: Dict[str, str] = {}
        self._basic = False
        self.token_requests = 0

    @classmethod
    def for_service(cls, services, name: str, auth: Auth = None) -> "RegistryClient":
        """Client for a registry of the test services by name: plain, mirror, tls or token."""
        if name == "tls":
            return cls(services.tls, "https", auth or services.tls_auth, services.tls_ca)
        return cls(getattr(services, name), "http", auth)

    def close(self) -> None:
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- HTTP with auth -----------------------------------------------------------------------

    def request(self, method: str, path_or_url: str, repo: Optional[str] = None,
                headers: Optional[dict] = None, **kw) -> requests.Response:
        """One request, answering a 401 challenge (Basic or Bearer) once."""
        url = path_or_url if "://" in path_or_url else self.base + path_or_url
        actions = "pull" if method in ("GET", "HEAD") else "pull,push"
        if method == "DELETE":
            actions = "*"
        scope = f"repository:{repo}:{actions}" if repo else ""
        headers = dict(headers or {})
        kw.setdefault("timeout", self.timeout)
        kw.setdefault("allow_redirects", True)

        def send() -> requests.Response:
            h = dict(headers)
            auth = None
            if scope in self._tokens:
                h["Authorization"] = "Bearer " + self._tokens[scope]
            elif self._basic and self.auth:
                auth = self.auth
            return self.session.request(method, url, headers=h, auth=auth, **kw)

        r = send()
        if r.status_code != 401:
            return r
        challenge = r.headers.get("WWW-Authenticate", "")
        kind, params = parse_challenge(challenge)
        if kind == "basic":
            if not self.auth or self._basic:
                return r
            self._basic = True
        elif kind == "bearer":
            self._tokens[scope] = self._fetch_token(params, scope)
        else:
            return r
        return send()

    def _fetch_token(self, params: Dict[str, str], scope: str) -> str:
        query = [("service", params.get("service", ""))]
        wanted = params.get("scope") or scope
        for s in wanted.split(" "):
            if s:
                query.append(("scope", s))
        self.token_requests += 1
        r = self.session.get(params["realm"], params=query, auth=self.auth, timeout=self.timeout)
        if r.status_code != 200:
            raise RegistryHTTPError(r, f"token request to {params['realm']}")
        body = r.json()
        return body.get("token") or body["access_token"]

    def _check(self, r: requests.Response, what: str, ok=(200, 201, 202, 204)) -> requests.Response:
        if r.status_code not in ok:
            raise RegistryHTTPError(r, what)
        return r

    # -- API ----------------------------------------------------------------------------------

    def ping(self) -> requests.Response:
        return self.request("GET", "/v2/")

    def blob_exists(self, repo: str, digest: str) -> bool:
        r = self.request("HEAD", f"/v2/{repo}/blobs/{digest}", repo)
        return r.status_code == 200

    def push_blob(self, repo: str, data: bytes, digest: Optional[str] = None) -> str:
        """Monolithic upload (POST, then PUT ?digest=); skipped when the blob is there."""
        digest = digest or sha256_digest(data)
        if self.blob_exists(repo, digest):
            return digest
        r = self._check(self.request("POST", f"/v2/{repo}/blobs/uploads/", repo),
                        f"start upload to {repo}", ok=(202,))
        location = urljoin(self.base + "/", r.headers["Location"])
        sep = "&" if "?" in location else "?"
        self._check(
            self.request("PUT", f"{location}{sep}digest={digest}", repo, data=data,
                         headers={"Content-Type": "application/octet-stream"}),
            f"upload {digest} to {repo}", ok=(201,))
        return digest

    def put_manifest(self, repo: str, reference: str, manifest_bytes: bytes,
                     media_type: str) -> str:
        """PUT a manifest by tag or digest; returns the digest the registry reports."""
        r = self._check(
            self.request("PUT", f"/v2/{repo}/manifests/{reference}", repo, data=manifest_bytes,
                         headers={"Content-Type": media_type}),
            f"put manifest {repo}:{reference}", ok=(201,))
        return r.headers.get("Docker-Content-Digest") or sha256_digest(manifest_bytes)

    def push(self, repo: str, tag: Optional[str], image: ImageOrIndex) -> str:
        """Blobs, then every manifest by digest (children first), then the tag; returns digest."""
        for digest, data in image.blobs().items():
            self.push_blob(repo, data, digest)
        for digest, (media_type, body) in image.manifests().items():
            self.put_manifest(repo, digest, body, media_type)
        if tag:
            self.put_manifest(repo, tag, image.manifest_bytes, image.manifest_media_type)
        return image.manifest_digest

    def get_manifest(self, repo: str, reference: str, accept: str = MANIFEST_ACCEPT,
                     check: bool = True) -> Fetched:
        r = self.request("GET", f"/v2/{repo}/manifests/{reference}", repo,
                         headers={"Accept": accept})
        if check:
            self._check(r, f"get manifest {repo}:{reference}", ok=(200,))
        return Fetched(r.content, r.headers.get("Content-Type", ""),
                       r.headers.get("Docker-Content-Digest"), r.status_code)

    def head_manifest(self, repo: str, reference: str, accept: str = MANIFEST_ACCEPT
                      ) -> Optional[str]:
        """The digest a tag points at, or None when it does not exist."""
        r = self.request("HEAD", f"/v2/{repo}/manifests/{reference}", repo,
                         headers={"Accept": accept})
        if r.status_code == 404:
            return None
        self._check(r, f"head manifest {repo}:{reference}", ok=(200,))
        return r.headers["Docker-Content-Digest"]

    def get_blob(self, repo: str, digest: str) -> bytes:
        r = self._check(self.request("GET", f"/v2/{repo}/blobs/{digest}", repo),
                        f"get blob {repo}@{digest}", ok=(200,))
        return r.content

    def delete_manifest(self, repo: str, digest: str) -> None:
        """Delete a manifest by digest; distribution drops every tag pointing at it too."""
        self._check(self.request("DELETE", f"/v2/{repo}/manifests/{digest}", repo),
                    f"delete manifest {repo}@{digest}", ok=(202,))

    def delete_tag(self, repo: str, tag: str) -> Optional[str]:
        """Make `tag` disappear; returns the digest it pointed at (None if it did not exist).

        Distribution 2.8 cannot delete a tag alone (DELETE by tag is "unsupported"), so this
        deletes the manifest it points at: other tags on the same digest go too. To move a tag,
        just put_manifest() the new manifest under it.
        """
        digest = self.head_manifest(repo, tag)
        if digest is None:
            return None
        self.delete_manifest(repo, digest)
        return digest

    def tags(self, repo: str) -> List[str]:
        r = self.request("GET", f"/v2/{repo}/tags/list", repo)
        if r.status_code == 404:
            return []
        self._check(r, f"list tags of {repo}", ok=(200,))
        return sorted(r.json().get("tags") or [])


# ---------------------------------------------------------------------------------------------
# one-call helpers (a new client per call: fine for tests)


def push_image(registry: str, repo: str, tag: Optional[str], image_or_index: ImageOrIndex,
               scheme: str = "http", auth: Auth = None, verify: Verify = None) -> str:
    """Push an Image or Index (every blob and manifest) and tag it; returns its digest."""
    with RegistryClient(registry, scheme, auth, verify) as c:
        return c.push(repo, tag, image_or_index)


def put_manifest(registry: str, repo: str, reference: str, manifest_bytes: bytes,
                 media_type: str, scheme: str = "http", auth: Auth = None,
                 verify: Verify = None) -> str:
    with RegistryClient(registry, scheme, auth, verify) as c:
        return c.put_manifest(repo, reference, manifest_bytes, media_type)


def get_manifest(registry: str, repo: str, reference: str, accept: str = MANIFEST_ACCEPT,
                 scheme: str = "http", auth: Auth = None, verify: Verify = None) -> Fetched:
    with RegistryClient(registry, scheme, auth, verify) as c:
        return c.get_manifest(repo, reference, accept)


def delete_tag(registry: str, repo: str, tag: str, scheme: str = "http", auth: Auth = None,
               verify: Verify = None) -> Optional[str]:
    with RegistryClient(registry, scheme, auth, verify) as c:
        return c.delete_tag(repo, tag)


# ---------------------------------------------------------------------------------------------
# the quay.io stand-ins


@dataclass(frozen=True)
class MirrorSet:
    """One image published the way quay.io, DaoCloud and NJU publish it, on the local registries.

    upstream: plain registry, `ns/vllm-ascend`          (quay.io/ns/vllm-ascend)
    daocloud: mirror registry, `quay.io/ns/vllm-ascend` (m.daocloud.io/quay.io/ns/vllm-ascend)
    nju:      mirror registry, `ns/vllm-ascend`          (quay.nju.edu.cn/ns/vllm-ascend)
    """

    namespace: str
    repo: str  # the path as quay.io knows it: ns/vllm-ascend
    tag: str
    digest: str
    plain: str  # host:port of the upstream stand-in
    mirror: str  # host:port serving both mirror styles
    daocloud_prefix: str = "quay.io"

    @property
    def image_ref(self) -> str:
        """The reference a user types: quay.io/ns/vllm-ascend:TAG."""
        return f"quay.io/{self.repo}:{self.tag}"

    @property
    def upstream(self) -> Tuple[str, str]:
        return self.plain, self.repo

    @property
    def daocloud(self) -> Tuple[str, str]:
        return self.mirror, f"{self.daocloud_prefix}/{self.repo}"

    @property
    def nju(self) -> Tuple[str, str]:
        return self.mirror, self.repo

    def mirrors_toml(self, names=("quay", "daocloud", "nju")) -> str:
        """A mirrors.toml (the product's format) sending quay.io to these registries."""
        entries = {
            "quay": f'name = "quay"\nregistry = "quay.io"\nurl = "http://{self.plain}"\n',
            "daocloud": f'name = "daocloud"\nregistry = "quay.io"\nurl = "http://{self.mirror}"\n'
                        f'prefix = "{self.daocloud_prefix}"\n',
            "nju": f'name = "nju"\nregistry = "quay.io"\nurl = "http://{self.mirror}"\n',
        }
        out = [f'default_image = "quay.io/{self.repo}"\n']
        for name in names:
            out.append("[[mirrors]]\n" + entries[name])
        return "\n".join(out)


def publish_mirrored(services, namespace: str, tag: str, image_or_index: ImageOrIndex,
                     targets=("upstream", "daocloud", "nju"), name: str = "vllm-ascend"
                     ) -> MirrorSet:
    """Push one image as quay.io (plain), DaoCloud (mirror, prefixed) and NJU (mirror) serve it.

    Leave a target out of `targets` to model a mirror that does not have the tag (yet).
    """
    repo = f"{namespace}/{name}"
    ms = MirrorSet(namespace=namespace, repo=repo, tag=tag,
                   digest=image_or_index.manifest_digest, plain=services.plain,
                   mirror=services.mirror)
    for target in targets:
        registry, path = getattr(ms, target)
        push_image(registry, path, tag, image_or_index)
    return ms
