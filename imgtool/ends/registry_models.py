"""A bundle's models as a registry holds them: each model's CNCF ModelPack artifact (registry_dest.py's part for
models; issue 48).

The artifact is what the bundle's archive holds and `serve` answers (bundle.json's `manifest_digest`): its config
and one raw layer per file (the layer digest is the file's sha256), pushed blob by blob like an image's (a blob the
registry holds is skipped), then the manifest byte for byte, last, under the model's tags. The repository is
NAMESPACE + the path serve gives it (bundle/catalog.py `model_repository`: HUB/org/name), so
`hf:Qwen/Qwen3-8B@main` pushed `--to reg.local:5000/mirror` is `reg.local:5000/mirror/hf/qwen/qwen3-8b:COMMIT` and
`:main`.

Beside it goes the model's modelcar image (issue 49, modelcar.py), where bundle.json records its layer digests: each
layer uploaded as the raw file's bytes pass (its head, the bytes, its tail: streamed, never stored), the configs
and platform manifests by digest, then the index under each artifact tag with `-modelcar` after it.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .. import modelcar
from ..bundle.catalog import TAG, model_repository, model_tags
from ..bundle.format import BundleModel, ModelEntry
from ..errors import ImgtoolError, RegistryError
from ..model import OCI_INDEX, OCI_MANIFEST, Digest
from ..registry import RegistryClient


@dataclass
class PushedModel:
    ref: str
    target: str  # host/repo:commit
    tags: List[str]
    manifest_digest: str
    files: int
    size: int
    modelcar: Optional[str] = None  # host/repo:commit-modelcar, when the bundle records the modelcar form
    modelcar_digest: Optional[str] = None  # its index's

    def to_json(self) -> dict:
        out = {"ref": self.ref, "target": self.target, "tags": self.tags, "manifest_digest": self.manifest_digest,
               "files": self.files, "size": self.size}
        if self.modelcar is not None:
            out.update(modelcar=self.modelcar, modelcar_digest=self.modelcar_digest)
        return out


@dataclass(frozen=True)
class Frame:
    """A modelcar layer the registry lacks: uploaded to `repo` as its raw file's bytes pass, framed."""

    repo: str
    digest: Digest
    head: bytes
    tail: bytes
    size: int


@dataclass
class Modelcars:
    """What the modelcars need pushed: per raw file (sha256), the layers framed around it; the configs."""

    frames: Dict[Digest, List[Frame]] = field(default_factory=dict)
    configs: List[Tuple[str, Digest, bytes]] = field(default_factory=list)  # (repository, digest, bytes)
    present: int = 0
    skipped: Dict[str, str] = field(default_factory=dict)  # a model's ref -> why its modelcar is not pushed


def modelcar_blobs(client: RegistryClient, targets: Sequence[Tuple[BundleModel, str]]) -> Modelcars:
    """Ask the registry (HEAD) for each modelcar config and layer in its repository, once per pair; a model whose
    bundle records no modelcar form has none. (A delta's omitted file: its layer must be there, as its raw file.)"""
    out, seen = Modelcars(), set()
    for model, repo in targets:
        car = model.modelcar()
        if car is None:
            continue
        lacking = [f for f in model.files if f.omitted and f.modelcar and not client.has_blob(repo, f.modelcar)]
        if lacking:  # a delta whose base was pushed without its modelcar: the layers of its left-out files are not
            out.skipped[model.ref] = (f"the modelcar of {model.ref} is not pushed: {repo} lacks the modelcar layers "
                                      f"of {len(lacking)} file(s) the delta leaves out (first: {lacking[0].path}); "
                                      "its ModelPack artifact is")
            continue
        wanted: List[Tuple[Digest, Optional[bytes], Optional[ModelEntry]]] = [
            (Digest.of(config), config, None) for _, _, _, config in car.manifests]
        wanted += [(f.modelcar, None, f) for f in model.carried if f.modelcar is not None]
        for digest, config, f in wanted:
            if (repo, digest) in seen:
                continue
            seen.add((repo, digest))
            if client.has_blob(repo, digest):
                out.present += 1
            elif f is None:
                assert config is not None
                out.configs.append((repo, digest, config))
            else:
                out.frames.setdefault(f.sha256, []).append(Frame(repo, digest, modelcar.head(f.path, f.size),
                                                                 modelcar.tail(f.size),
                                                                 modelcar.layer_size(f.path, f.size)))
    return out


class Streamed:
    """One blob uploaded as its bytes pass: PATCH per `chunk` bytes, then the PUT that commits it (all in the PUT
    when `size` is one chunk or less)."""

    def __init__(self, client: RegistryClient, repo: str, digest: Digest, size: int, chunk: int,
                 url: Optional[str] = None):
        self.client, self.repo, self.digest, self.size = client, repo, digest, size
        self.chunk = chunk if size > chunk else size + 1
        self.url = url or client.start_upload(repo)
        self.buf, self.pos = bytearray(), 0

    def feed(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= self.chunk:
            self.url = self.client.upload_chunk(self.repo, self.url, bytes(self.buf[:self.chunk]), self.pos)
            self.pos += self.chunk
            del self.buf[:self.chunk]

    def finish(self) -> None:
        """The PUT that commits the blob (the registry checks its digest)."""
        self.client.finish_upload(self.repo, self.url, self.digest, bytes(self.buf))


def push_modelcar(client: RegistryClient, host: str, repo: str, model: BundleModel) -> Optional[Tuple[str, str]]:
    """The modelcar's platform manifests by digest, then its index under each artifact tag with `-modelcar` after
    it (every blob is in by now); (target, index digest), or None when the bundle records no modelcar form. Raises
    RegistryError (refused, or stored under another digest)."""
    car = model.modelcar()
    if car is None:
        return None
    for _, _, manifest, _ in car.manifests:
        _put(client, host, repo, str(Digest.of(manifest)), manifest, OCI_MANIFEST, model)
    tags = [t for t in (modelcar.tag(t) for t in model_tags(model)) if TAG.match(t)]
    for tag in tags or [str(car.digest)]:
        _put(client, host, repo, tag, car.index, OCI_INDEX, model)
    return f"{host}/{repo}" + (f":{tags[0]}" if tags else f"@{car.digest}"), str(car.digest)


def _put(client: RegistryClient, host: str, repo: str, reference: str, data: bytes, media: str,
         model: BundleModel) -> None:
    got: Optional[Digest] = client.put_manifest(repo, reference, data, media)
    if got is not None and got != Digest.of(data):
        raise RegistryError(f"{host}/{repo}: the registry stored the modelcar manifest of {model.ref} as {got}, "
                            f"not {Digest.of(data)}")


def model_targets(models: Sequence[BundleModel], namespace: str) -> Tuple[List[Tuple[BundleModel, str]], List[str]]:
    """Each model with the repository it goes to, and a warning for each model no registry can name."""
    out, warnings = [], []
    for model in models:
        path = model_repository(model)
        if path is None:
            warnings.append(f"{model.ref} is not pushed: {model.model_ref.repo} is not a repository name a registry "
                            "takes")
            continue
        out.append((model, f"{namespace}/{path}" if namespace else path))
    return out, warnings


def model_blobs(targets: Sequence[Tuple[BundleModel, str]]) -> List[Tuple[str, Digest, int]]:
    """(repository, digest, size) of every blob each artifact needs there that the bundle carries (a delta's
    omitted files: check_model_base), its config first, each once per repository (a file two revisions share is one
    blob)."""
    out, seen = [], set()
    for model, repo in targets:
        for digest, size in [(model.config_digest, model.config_size)] + [(f.sha256, f.size) for f in model.carried]:
            if (repo, digest) not in seen:
                seen.add((repo, digest))
                out.append((repo, digest, size))
    return out


def check_model_base(client: RegistryClient, targets: Sequence[Tuple[BundleModel, str]], host: str, name: str,
                     to: str) -> None:
    """A delta bundle leaves model files out: the registry must hold them already in the model's repository (a
    manifest naming a blob it lacks is refused); raises ImgtoolError before anything is pushed."""
    missing = [(model, repo, f) for model, repo in targets for f in model.files
               if f.omitted and not client.has_blob(repo, f.sha256)]
    if not missing:
        return
    model, repo, first = missing[0]
    raise ImgtoolError(f"cannot push {name}: it is a delta bundle and {host}/{repo} lacks {len(missing)} of the "
                       f"model files it leaves out (first: {first.path} of {model.ref}); nothing was pushed",
                       hint=f"push the bundle of the revision it was cut against to {to} first, or fetch a full bundle")


def push_model(client: RegistryClient, host: str, repo: str, model: BundleModel, car: bool = True) -> PushedModel:
    """The artifact's manifest, byte for byte, under each of its tags (every blob is in by now); raises
    RegistryError (refused, or stored under another digest)."""
    manifest, _ = model.artifact()
    tags = model_tags(model)
    for tag in tags or [str(model.manifest_digest)]:
        got: Optional[Digest] = client.put_manifest(repo, tag, manifest, OCI_MANIFEST)
        if got is not None and got != model.manifest_digest:
            raise RegistryError(f"{host}/{repo}: the registry stored the ModelPack manifest of {model.ref} as {got}, "
                                f"not {model.manifest_digest}")
    target = f"{host}/{repo}" + (f":{tags[0]}" if tags else f"@{model.manifest_digest}")
    pushed = push_modelcar(client, host, repo, model) if car else None
    return PushedModel(model.ref, target, tags, str(model.manifest_digest), len(model.files), model.size,
                       *(pushed or (None, None)))
