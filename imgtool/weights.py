"""Model weights as values (issue 48): a model reference, a snapshot's files with the hub's digests, the CNCF
ModelPack artifact that carries them in a bundle, and the names the hubs' caches give a model. Pure: no I/O, stdlib
only, Python 3.7 (the pyz places models on the offline host).

A model is a manifest with layers like an image: one raw layer per file, whose digest is the file's sha256 (the hub
gives it: Hugging Face's `lfs.sha256` / `X-Linked-Etag`, ModelScope's `Sha256`), so the hub, bundle.json and
`verify` agree without hashing the bytes again. The path goes in `org.cncf.model.filepath`.
"""

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import ManifestError, UsageError
from .model import OCI_MANIFEST, Artifact, Descriptor, Digest, parse_artifact

MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"  # the manifest's artifactType
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT_RAW = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG_RAW = "application/vnd.cncf.model.weight.config.v1.raw"
DOC_RAW = "application/vnd.cncf.model.doc.v1.raw"
MODEL_LAYER_TYPES = (WEIGHT_RAW, WEIGHT_CONFIG_RAW, DOC_RAW)
FILEPATH = "org.cncf.model.filepath"  # the annotation that names a layer's file
HUBS = ("hf", "modelscope")
MAX_FILES = 100_000  # a listing longer than this is not a model (DeepSeek-R1 has 180 files)
MAX_PATH = 1024

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}\Z")  # a hub's ORG or NAME
_COMMIT = re.compile(r"[0-9a-f]{40}\Z")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}\Z")
# what a weight file is; config and tokenizer files are the weight's config; the rest is a doc
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".msgpack", ".h5", ".ckpt", ".npz")
_WEIGHT_CONFIG = re.compile(r"(config|generation_config|tokenizer|tokenizer_config|special_tokens_map|vocab|merges|"
                            r"added_tokens|preprocessor_config|chat_template|.*\.index)\.(json|txt|model|jinja)\Z"
                            r"|.*\.tiktoken\Z|tokenizer\.model\Z")


@dataclass(frozen=True)
class ModelRef:
    """`hf:ORG/NAME[@REVISION]`, `modelscope:ORG/NAME[@REVISION]`: where a model's files come from; with `directory`,
    a snapshot someone already downloaded (`hf:ORG/NAME[@REVISION]=DIR`, or a Hugging Face cache's
    `.../models--ORG--NAME/snapshots/<commit>`), read from there instead of the hub."""

    hub: str  # hf | modelscope
    repo: str  # ORG/NAME
    revision: Optional[str] = None  # a branch, tag or commit; None: the hub's default branch
    directory: Optional[str] = None  # a local snapshot of the model (docs/models.md "A local directory")
    spelled: str = field(default="", compare=False)  # the text as given, for a local directory

    @property
    def asked(self) -> str:
        """The reference as the user wrote it (what bundle.toml and bundle.lock name); the hub's spelling
        (`str`) is what a bundle records."""
        return self.spelled or str(self)

    @property
    def default_revision(self) -> str:
        return self.revision or ("master" if self.hub == "modelscope" else "main")

    @property
    def org(self) -> str:
        return self.repo.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.repo.split("/", 1)[1]

    def __str__(self) -> str:
        return f"{self.hub}:{self.repo}" + (f"@{self.revision}" if self.revision else "")


_PATH_STARTS = ("/", "./", "../", "~/")  # a local directory; an image reference never starts so
_HF_SNAPSHOT = re.compile(r"(?:.*/)?models--([^/]+?)--([^/]+)/snapshots/([^/]+)/*\Z")


def is_model_ref(text: str) -> bool:
    """Whether `text` names a model (hf:, modelscope:, a local directory) rather than an image."""
    return (text.split(":", 1)[0] in HUBS and ":" in text) or text.startswith(_PATH_STARTS)


def parse_model_ref(text: str) -> ModelRef:
    """`hf:ORG/NAME[@REVISION]`, `modelscope:ORG/NAME[@REVISION]`, either with `=DIR` (a local snapshot of it), or
    a Hugging Face cache's snapshot directory (`.../models--ORG--NAME/snapshots/<commit>`: it names the model and
    the commit itself); raises UsageError naming what is wrong."""
    if text.startswith(_PATH_STARTS):
        return _snapshot_dir(text)
    hub, sep, rest = text.partition(":")
    if not sep or hub not in HUBS:
        raise UsageError(f"invalid model reference {text!r}: use hf:ORG/NAME[@REVISION] or modelscope:ORG/NAME[@REVISION]")
    rest, eq, directory = rest.partition("=")
    if eq and not directory.strip():
        raise UsageError(f"invalid model reference {text!r}: no directory after '=' (hf:ORG/NAME=DIR)")
    ref = _hub_ref(text, hub, rest)
    return ModelRef(ref.hub, ref.repo, ref.revision, directory, text) if eq else ref


def _snapshot_dir(text: str) -> ModelRef:
    m = _HF_SNAPSHOT.match(text)
    if not m:
        raise UsageError(f"{text}: a directory names no model by itself: use hf:ORG/NAME=DIR (or "
                         "modelscope:ORG/NAME=DIR), or give a Hugging Face cache's snapshot directory "
                         "(.../models--ORG--NAME/snapshots/<commit>)")
    org, name, commit = m.groups()
    if not (_NAME.match(org) and _NAME.match(name)) or not is_commit(commit):
        raise UsageError(f"{text}: not a Hugging Face cache's snapshot directory "
                         "(.../models--ORG--NAME/snapshots/<40 hex commit>)")
    return ModelRef("hf", f"{org}/{name}", commit, text, text)


def _hub_ref(text: str, hub: str, rest: str) -> ModelRef:
    repo, at, revision = rest.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts) or ".." in repo:
        raise UsageError(f"invalid model reference {text!r}: the model is ORG/NAME (letters, digits, . _ -)")
    if at and not (_REVISION.match(revision) and ".." not in revision):
        raise UsageError(f"invalid model reference {text!r}: {revision!r} is not a revision (a branch, tag or commit)")
    return ModelRef(hub, repo, revision if at else None)


def is_commit(text: str) -> bool:
    return bool(_COMMIT.match(text))


def check_path(path: str) -> Optional[str]:
    """Why a file name from a hub cannot be a path under a model's directory, or None when it can: relative, no
    `.`/`..` component, no empty component, printable, at most MAX_PATH characters. File names are data."""
    if not path or len(path) > MAX_PATH:
        return "an empty or too long name"
    if path.startswith("/") or "\\" in path:
        return "an absolute path" if path.startswith("/") else "a backslash in the name"
    if any(unicodedata.category(c)[0] == "C" for c in path):
        return "a control character in the name"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "a `.`, `..` or empty component"
    return None


@dataclass(frozen=True)
class ModelFile:
    """One file of a model's snapshot, as the hub lists it: its path, size and sha256 (LFS files; small files the
    hub gives only a git blob id for are hashed when downloaded), and its git blob id where the hub has one (the
    Hugging Face cache names a small file's blob by it)."""

    path: str
    size: int
    sha256: Optional[Digest]  # None: not given by the hub (a small git file): computed on download
    git_oid: Optional[str] = None  # the git blob sha1 (Hugging Face), for its cache's blob name
    lfs: bool = False  # stored in LFS/Xet (the Hugging Face cache names its blob by the sha256)

    @property
    def media_type(self) -> str:
        return layer_media_type(self.path)


def layer_media_type(path: str) -> str:
    """ModelPack's media type for a file: weights, the weights' config (config, tokenizer), else a doc."""
    base = path.rsplit("/", 1)[-1].lower()
    if base.endswith(_WEIGHT_SUFFIXES):
        return WEIGHT_RAW
    if _WEIGHT_CONFIG.match(base):
        return WEIGHT_CONFIG_RAW
    return DOC_RAW


@dataclass(frozen=True)
class ModelSnapshot:
    """A model at one commit: every file with its digest. What lock pins (the commit) and what a bundle carries."""

    ref: ModelRef
    commit: str  # the 40-hex commit the revision resolved to (ModelScope: its revision's commit id, or the revision)
    files: Tuple[ModelFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def check(self) -> None:
        """Refuse a listing that cannot be placed: a bad name, a name twice, a file and a directory of one name,
        too many files; raises UsageError naming the first."""
        if len(self.files) > MAX_FILES:
            raise UsageError(f"{self.ref}: {len(self.files)} files is more than a model holds ({MAX_FILES})")
        seen: Dict[str, ModelFile] = {}
        for f in self.files:
            why = check_path(f.path)
            if why is not None:
                raise UsageError(f"{self.ref}: the hub lists {f.path!r}, {why}: not a file name imgtool places")
            if f.path in seen:
                raise UsageError(f"{self.ref}: the hub lists {f.path!r} twice")
            seen[f.path] = f
        for path in seen:
            parent = path.rsplit("/", 1)[0] if "/" in path else ""
            while parent:
                if parent in seen:
                    raise UsageError(f"{self.ref}: the hub lists {parent!r} as a file and as a directory")
                parent = parent.rsplit("/", 1)[0] if "/" in parent else ""


def hf_folder(repo: str) -> str:
    """The Hugging Face cache's folder of a model: models--ORG--NAME."""
    return "models--" + repo.replace("/", "--")


def modelscope_folder(repo: str) -> str:
    """ModelScope's cache folder of a model, under its cache root: models/ORG/NAME with each `.` stored as `___`
    (the layout current clients read first, and older ones wrote)."""
    org, name = repo.split("/", 1)
    return f"models/{org}/{name.replace('.', '___')}"


def modelpack(snapshot: ModelSnapshot, created: Optional[str] = None) -> Tuple[bytes, bytes, List[Descriptor]]:
    """The ModelPack artifact of a snapshot: (manifest bytes, config bytes, the layers) with one raw layer per file,
    its digest the file's sha256 (every file must have one by now); the files in path order, so the artifact is a
    pure function of the snapshot. `created` (ModelPack's optional createdAt) is left out by bundles: one commit is
    then one artifact digest in every bundle and registry, and a resumed fetch plans the same archive. Raises
    ValueError for a file without its sha256."""
    layers = []
    for f in sorted(snapshot.files, key=lambda f: f.path):
        if f.sha256 is None:
            raise ValueError(f"{f.path}: no sha256 yet")
        layers.append(Descriptor(f.media_type, f.sha256, f.size, annotations={FILEPATH: f.path}))
    config = {
        "descriptor": {**({"createdAt": created} if created else {}), "name": snapshot.ref.repo,
                       "revision": snapshot.commit, "sourceURL": source_url(snapshot.ref)},
        "config": {},
        "modelfs": {"type": "layers", "diff_ids": [str(d.digest) for d in layers]},
    }
    config_bytes = _canonical(config)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": MODEL_ARTIFACT,
        "config": Descriptor(MODEL_CONFIG, Digest.of(config_bytes), len(config_bytes)).to_json(),
        "layers": [d.to_json() for d in layers],
        "annotations": {"org.opencontainers.image.source": source_url(snapshot.ref),
                        "org.opencontainers.image.revision": snapshot.commit},
    }
    return _canonical(manifest), config_bytes, layers


def files_of(layers: Sequence[Descriptor]) -> List[Tuple[str, Descriptor]]:
    """(path, layer) of a ModelPack artifact's layers; raises ValueError for a layer without a safe path."""
    out = []
    for d in layers:
        path = (d.annotations or {}).get(FILEPATH, "")
        why = check_path(path)
        if why is not None:
            raise ValueError(f"layer {d.digest.short}: {FILEPATH} {path!r} is {why}")
        out.append((path, d))
    return out


def read_modelpack(data: bytes, content_type: Optional[str] = None) -> Tuple[Artifact, List[Tuple[str, Descriptor]]]:
    """A ModelPack manifest as a registry or bundle holds it: the artifact, and (path, layer) of each file; raises
    ManifestError (not a ModelPack artifact, a layer of another media type, a config of another type, a layer
    without a safe `org.cncf.model.filepath`). An image manifest is parse_manifest's, which refuses this one."""
    artifact = parse_artifact(data, MODEL_ARTIFACT, MODEL_LAYER_TYPES, content_type)
    if artifact.config.media_type != MODEL_CONFIG:
        raise ManifestError(f"not a ModelPack artifact: its config is {artifact.config.media_type!r}, "
                            f"not {MODEL_CONFIG}")
    try:
        return artifact, files_of(artifact.layers)
    except ValueError as e:
        raise ManifestError(f"malformed ModelPack manifest: {e}") from None


def source_url(ref: ModelRef) -> str:
    return {"hf": "https://huggingface.co/", "modelscope": "https://modelscope.cn/models/"}.get(ref.hub, "") + ref.repo


def _canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
