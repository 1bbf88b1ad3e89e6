"""What each node of a cluster needs to pull from `imgtool serve`: containerd's hosts.toml, Podman's registries.conf
mirror, Docker's daemon.json entries, and the CA to trust under --tls-cert. A pure function of the address nodes
reach the server by, the registries the bundles hold and the CA (no I/O); stdlib only, Python 3.7.

The text form is a shell script a node's administrator runs piece by piece: each file as a `cat > PATH <<'EOF'`
block holding exactly its bytes, everything else (Docker, what to restart) as `#` comments.
"""

import json
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

HUB = "docker.io"  # Docker Hub's registry name: containerd calls its server registry-1.docker.io, Docker mirrors it


def toml_string(text: str) -> str:
    return json.dumps(text)  # a TOML basic string is a JSON string for what a host name or path holds


@dataclass(frozen=True)
class NodeFile:
    """One file a node needs: its path there and its exact bytes; `merge`: keys to merge into an existing file."""

    path: str
    content: str
    merge: bool = False


@dataclass(frozen=True)
class Mirror:
    """The server as each runtime's snippet sees it: the address nodes reach it by, over `scheme`, the upstream
    registries and images (registry, path[:tag]) the bundles hold, and the CA's text to trust (--tls-ca)."""

    address: str  # HOST:PORT as nodes reach it ([v6]:PORT)
    scheme: str  # http | https
    registries: Tuple[str, ...]  # the upstream registries the bundles hold: quay.io, docker.io, ...
    images: Tuple[Tuple[str, str], ...]
    ca_pem: Optional[str] = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


@dataclass(frozen=True)
class RuntimePart:
    """What one runtime's nodes need (made by the runtime's room: `runtimes.mirror_parts`)."""

    runtime: str  # its name, as --json says it: containerd | podman | docker
    title: str  # who reads these files, for the script's heading
    files: Tuple[NodeFile, ...]
    notes: Tuple[str, ...]
    ca_path: str  # where its nodes look for the server's CA (said when --tls-ca was not given)


PartMaker = Callable[[Mirror], RuntimePart]


@dataclass(frozen=True)
class NodeConfig:
    """Every node's configuration for one server address."""

    mirror: Mirror
    parts: Tuple[RuntimePart, ...]
    ca_source: Optional[str]  # --tls-ca FILE, or the sentence naming the CA to copy when it was not given

    @property
    def url(self) -> str:
        return self.mirror.url

    @property
    def files(self) -> List[NodeFile]:
        return [f for part in self.parts for f in part.files]

    def to_json(self) -> dict:
        return {"url": self.url, "address": self.mirror.address, "registries": list(self.mirror.registries),
                "files": [{"runtime": part.runtime, "path": f.path, "content": f.content, "merge": f.merge}
                          for part in self.parts for f in part.files],
                "ca": self.ca_source, "notes": [f"{part.runtime}: {n}" for part in self.parts for n in part.notes]}

    def lines(self) -> List[str]:
        """The configuration as the lines of a shell script: comments, and a `cat > PATH <<'EOF'` per file."""
        out = [f"# what each node needs to pull from {self.url} (run the part for the node's runtime as root)"]
        made = set()
        for part in self.parts:
            out.append(f"# --- {part.title}")
            out.extend(f"# {note}" for note in part.notes)
            for f in part.files:
                if f.merge:
                    out.append(f"# merge into {f.path} (keep what it holds; then restart dockerd):")
                    out.extend(f"#   {line}" for line in f.content.splitlines())
                    continue
                folder = f.path.rsplit("/", 1)[0]
                if folder not in made:
                    made.add(folder)
                    out.append(f"mkdir -p {folder}")
                out.append(f"cat > {f.path} <<'EOF'")
                out.extend(f.content.splitlines())
                out.append("EOF")
        return out


def node_config(address: str, scheme: str, images: Sequence[Tuple[str, str]], parts: Sequence[PartMaker], *,
                ca_pem: Optional[str] = None, ca_file: Optional[str] = None,
                tls_cert: Optional[str] = None) -> NodeConfig:
    """The files and notes for nodes reaching serve at `address` (HOST:PORT) over `scheme`, for the `images` the
    bundles hold, as (upstream registry, path[:tag]), each runtime's from its room (`parts`); under TLS, `ca_pem`
    (the text of `ca_file`, --tls-ca) is written where each runtime looks for it, else the notes say which
    certificate to copy there (`tls_cert` names the server's)."""
    mirror = Mirror(address, scheme, tuple(sorted({registry for registry, _ in images})), tuple(images), ca_pem)
    made = [make(mirror) for make in parts]
    ca_source = None
    if mirror.tls:
        if ca_file is not None:
            ca_source = ca_file
        else:
            ca_source = (f"the CA certificate that issued {tls_cert or '--tls-cert'} (a self-signed certificate: that "
                         "file itself); serve --tls-ca FILE writes it into this configuration")
            copy = f"copy {ca_source.split(';')[0]} to "
            made = [RuntimePart(p.runtime, p.title, p.files, p.notes + (copy + p.ca_path,), p.ca_path) for p in made]
    return NodeConfig(mirror, tuple(made), ca_source)
