"""A bundle's models as a registry holds them: each model's CNCF ModelPack artifact (registry_dest.py's part for
models; issue 48).

The artifact is what the bundle's archive holds and `serve` answers (bundle.json's `manifest_digest`): its config
and one raw layer per file (the layer digest is the file's sha256), pushed blob by blob like an image's (a blob the
registry holds is skipped), then the manifest byte for byte, last, under the model's tags. The repository is
NAMESPACE + the path serve gives it (bundle/catalog.py `model_repository`: HUB/org/name), so
`hf:Qwen/Qwen3-8B@main` pushed `--to reg.local:5000/mirror` is `reg.local:5000/mirror/hf/qwen/qwen3-8b:COMMIT` and
`:main`.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..bundle.catalog import model_repository, model_tags
from ..bundle.format import BundleModel
from ..errors import ImgtoolError, RegistryError
from ..model import OCI_MANIFEST, Digest
from ..registry import RegistryClient


@dataclass
class PushedModel:
    ref: str
    target: str  # host/repo:commit
    tags: List[str]
    manifest_digest: str
    files: int
    size: int

    def to_json(self) -> dict:
        return {"ref": self.ref, "target": self.target, "tags": self.tags, "manifest_digest": self.manifest_digest,
                "files": self.files, "size": self.size}


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


def push_model(client: RegistryClient, host: str, repo: str, model: BundleModel) -> PushedModel:
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
    return PushedModel(model.ref, target, tags, str(model.manifest_digest), len(model.files), model.size)
