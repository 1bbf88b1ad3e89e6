"""What each node of a cluster needs to pull from `imgtool serve`: containerd's hosts.toml, Podman's registries.conf
mirror, Docker's daemon.json entries, and the CA to trust under --tls-cert. A pure function of the address nodes
reach the server by, the registries the bundles hold and the CA (no I/O); stdlib only, Python 3.7.

The text form is a shell script a node's administrator runs piece by piece: each file as a `cat > PATH <<'EOF'`
block holding exactly its bytes, everything else (Docker, what to restart) as `#` comments.
"""

import json
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

CERTS_D = "/etc/containerd/certs.d"  # containerd 2.x reads it by default; 1.6/1.7's CRI when config_path names it
PODMAN_DROP_IN = "/etc/containers/registries.conf.d/imgtool-serve.conf"
DAEMON_JSON = "/etc/docker/daemon.json"
_HUB = "docker.io"
_HUB_SERVER = "https://registry-1.docker.io"  # containerd's name for Docker Hub's registry


@dataclass(frozen=True)
class NodeFile:
    """One file a node needs: its path there and its exact bytes; `merge`: keys to merge into an existing file."""

    runtime: str  # containerd | podman | docker
    path: str
    content: str
    merge: bool = False

    def to_json(self) -> dict:
        return {"runtime": self.runtime, "path": self.path, "content": self.content, "merge": self.merge}


@dataclass(frozen=True)
class NodeConfig:
    """Every node's configuration for one server address."""

    address: str  # HOST:PORT as nodes reach it ([v6]:PORT)
    scheme: str  # http | https
    registries: Tuple[str, ...]  # the upstream registries the bundles hold: quay.io, docker.io, ...
    files: Tuple[NodeFile, ...]
    ca_source: Optional[str]  # --tls-ca FILE, or the sentence naming the CA to copy when it was not given
    notes: Tuple[str, ...]

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    def to_json(self) -> dict:
        return {"url": self.url, "address": self.address, "registries": list(self.registries),
                "files": [f.to_json() for f in self.files], "ca": self.ca_source, "notes": list(self.notes)}

    def lines(self) -> List[str]:
        """The configuration as the lines of a shell script: comments, and a `cat > PATH <<'EOF'` per file."""
        out = [f"# what each node needs to pull from {self.url} (run the part for the node's runtime as root)"]
        made = set()
        by_runtime = {"containerd": "containerd (Kubernetes nodes; ctr --hosts-dir, crictl, the kubelet)",
                      "podman": "Podman, Buildah, CRI-O, skopeo (containers-registries.conf(5))",
                      "docker": "Docker"}
        for runtime, title in by_runtime.items():
            out.append(f"# --- {title}")
            out.extend(f"# {note}" for note in _notes_for(runtime, self))
            for f in self.files:
                if f.runtime != runtime:
                    continue
                if f.merge:
                    out.append(f"# merge into {f.path} (keep what it holds; then restart dockerd):")
                    out.extend(f"#   {line}" for line in f.content.splitlines())
                    continue
                if f.path.rsplit("/", 1)[0] not in made:
                    made.add(f.path.rsplit("/", 1)[0])
                    out.append(f"mkdir -p {f.path.rsplit('/', 1)[0]}")
                out.append(f"cat > {f.path} <<'EOF'")
                out.extend(f.content.splitlines())
                out.append("EOF")
        return out


def _notes_for(runtime: str, config: NodeConfig) -> List[str]:
    prefix = f"{runtime}: "
    return [n[len(prefix):] for n in config.notes if n.startswith(prefix)]


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a TOML basic string is a JSON string for what a host name or path holds


def node_config(address: str, scheme: str, images: Sequence[Tuple[str, str]], *, ca_pem: Optional[str] = None,
                ca_file: Optional[str] = None, tls_cert: Optional[str] = None) -> NodeConfig:
    """The files and notes for nodes reaching serve at `address` (HOST:PORT) over `scheme`, for the `images` the
    bundles hold, as (upstream registry, path[:tag]); under TLS, `ca_pem` (the text of `ca_file`, --tls-ca) is
    written where each runtime looks for it, else the notes say which certificate to copy there (`tls_cert` names
    the server's)."""
    tls = scheme == "https"
    registries = tuple(sorted({registry for registry, _ in images}))
    files: List[NodeFile] = []
    notes: List[str] = []
    url = f"{scheme}://{address}"
    for registry in registries:
        server = _HUB_SERVER if registry == _HUB else f"https://{registry}"
        hosts = f"server = {_toml_string(server)}\n\n[host.{_toml_string(url)}]\n  capabilities = [\"pull\", \"resolve\"]\n"
        if tls:
            hosts += "  ca = \"ca.crt\"\n"  # relative: the directory of this hosts.toml
        files.append(NodeFile("containerd", f"{CERTS_D}/{registry}/hosts.toml", hosts))
        if tls and ca_pem is not None:
            files.append(NodeFile("containerd", f"{CERTS_D}/{registry}/ca.crt", ca_pem))
    notes.append(f"containerd: 1.6 and 1.7 read these files only when /etc/containerd/config.toml has "
                 f"config_path = \"{CERTS_D}\" under [plugins.\"io.containerd.grpc.v1.cri\".registry] (2.x reads "
                 "them by default); a change to hosts.toml needs no restart, one to config.toml does")
    notes.append("containerd: pods keep their image names (quay.io/...:TAG or @sha256:...); the mirror is asked "
                 "first, the upstream registry only when it fails (unreachable offline)")
    notes.append("containerd: k3s and RKE2 write these files themselves, from /etc/rancher/k3s/registries.yaml "
                 f"(rke2/registries.yaml): mirrors: {{{registries[0] if registries else 'quay.io'}: {{endpoint: "
                 f"[\"{url}\"]}}}}, and restart")
    mirrors = []
    for registry in registries:
        mirrors.append(f"[[registry]]\nprefix = {_toml_string(registry)}\nlocation = {_toml_string(registry)}\n\n"
                       f"[[registry.mirror]]\nlocation = {_toml_string(address)}\n"
                       + ("" if tls else "insecure = true\n"))
    if mirrors:
        files.append(NodeFile("podman", PODMAN_DROP_IN, "\n".join(mirrors)))
    if tls and ca_pem is not None:
        files.append(NodeFile("podman", f"/etc/containers/certs.d/{address}/ca.crt", ca_pem))
    notes.append("podman: images keep their names; `podman pull quay.io/...` asks the mirror first (Podman 2.1+ reads "
                 "registries.conf.d; an older one: append the same lines to /etc/containers/registries.conf)")
    daemon: dict = {}
    if _HUB in registries:
        daemon["registry-mirrors"] = [url]
    if not tls:
        daemon["insecure-registries"] = [address]
    if daemon:
        files.append(NodeFile("docker", DAEMON_JSON, json.dumps(daemon, indent=2) + "\n", merge=True))
    if tls and ca_pem is not None:
        files.append(NodeFile("docker", f"/etc/docker/certs.d/{address}/ca.crt", ca_pem))
    others = [(r, path) for r, path in images if r != _HUB]
    if others:
        registry, path = others[0]
        notes.append(f"docker: registry-mirrors mirrors Docker Hub only: Docker cannot mirror "
                     f"{', '.join(r for r in registries if r != _HUB)}. Pull through this address by name instead "
                     "(serve answers the path without the registry), then give it the upstream name:")
        notes.append(f"docker:   docker pull {address}/{path} && docker tag {address}/{path} {registry}/{path}")
    if _HUB in registries:
        notes.append("docker: Docker Hub images (docker.io) keep their names through registry-mirrors")
    if not tls:
        notes.append("docker: plain HTTP needs insecure-registries (without it Docker speaks plain HTTP to 127.0.0.0/8 "
                     "only)")
    ca_source = None
    if tls:
        if ca_file is not None:
            ca_source = ca_file
        else:
            ca_source = (f"the CA certificate that issued {tls_cert or '--tls-cert'} (a self-signed certificate: "
                         "that file itself); serve --tls-ca FILE writes it into this configuration")
            for runtime, where in (("containerd", f"{CERTS_D}/<registry>/ca.crt"),
                                   ("podman", f"/etc/containers/certs.d/{address}/ca.crt"),
                                   ("docker", f"/etc/docker/certs.d/{address}/ca.crt")):
                notes.append(f"{runtime}: copy {ca_source.split(';')[0]} to {where}")
    return NodeConfig(address, scheme, registries, tuple(files), ca_source, tuple(notes))
