"""`imgtool inventory`: what this host's runtime (Docker, containerd, Podman) holds, and the models placed here, as the
document delta.py defines, written atomically.

A model the runtime holds as its modelcar image (`load --models image`: `models.local/HUB/org/name:COMMIT-modelcar`)
is a held model too (`image` names it): its files are its manifest's layers, each annotated with the file's path and
sha256 (modelcar.files_of), each file's size read from its layer's tar head (a blob's first bytes, never the file).
One the runtime holds only partly, or whose manifest it does not keep (Docker, Podman) or that names no files, is
not listed, and `notes` says why.

The verb's core function; commands/ prints. Runs on the offline side, so from imgtool.pyz on
Python 3.7/3.8 too (no newer syntax or stdlib here).
"""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

from . import config, modelcar
from .bundle.catalog import MODEL_REGISTRY, hub_repository
from .delta import Inventory, InventoryImage, InventoryModel
from .errors import ImgtoolError, UsageError
from .fsutil import write_atomic
from .model import Digest, utc_time
from .placed import held_models
from .weights import HUBS

if TYPE_CHECKING:
    from .runtimes.base import Runtime


@dataclass
class InventoryResult:
    inventory: Inventory
    data: bytes  # the document, as written to `path` or to be printed
    path: Optional[Path] = None  # where it was written; None: nowhere (standard output is the caller's)
    notes: List[str] = field(default_factory=list)  # each modelcar image not listed as a held model, and why

    @property
    def layers(self) -> int:
        """Distinct layers (diff_ids) over all images."""
        return len({d for im in self.inventory.images for d in im.diff_ids})


def check_output(output: Optional[str]) -> Optional[Path]:
    """Where the inventory goes (None: standard output); raises UsageError for a missing directory, before
    the runtime is asked anything."""
    path = Path(output) if output else None
    if path is not None and not path.absolute().parent.is_dir():
        raise UsageError(f"cannot write the inventory {output}: no such directory {path.absolute().parent}")
    return path


def take_inventory(runtime: "Runtime", path: Optional[Path] = None, models_dirs: Sequence[Path] = ()) -> InventoryResult:
    """Ask the runtime (Docker, containerd, Podman: opened by the caller) for its images and their
    layers, and list the models placed on this host (the Hugging Face and ModelScope caches, `models_dirs`: placed.py);
    with `path` (check_output's), write the document there. Raises DaemonError, ImgtoolError (cannot write `path`)."""
    facts = runtime.info()
    images = runtime.inventory()
    about = {"version": facts.version, "arch": facts.arch, "driver": facts.driver, "image_store": facts.image_store,
             "runtime": facts.runtime}
    if facts.namespace:
        about["namespace"] = facts.namespace
    models = held_models(config.hf_hub_cache(), config.modelscope_cache(), models_dirs)
    cars, notes = held_modelcars(runtime, images)
    inv = Inventory(utc_time(time.time()), about, tuple(images), tuple(models + cars))
    data = inv.to_bytes()
    if path is not None:
        try:
            write_atomic(path, data, 0o644)
        except OSError as e:
            raise ImgtoolError(f"cannot write the inventory {path}: {e.strerror or e}") from e
    return InventoryResult(inv, data, path, notes)


def modelcar_name(name: str) -> Optional[Tuple[str, str, str]]:
    """(hub, org/name, commit) of a modelcar image's name (`models.local/HUB/org/name:COMMIT-modelcar`), else None."""
    repo, _, tag = name.rpartition(":")
    head, _, rest = repo.partition("/")
    hub, _, org_name = rest.partition("/")
    if head != MODEL_REGISTRY or hub not in HUBS or org_name.count("/") != 1 or not tag.endswith(modelcar.TAG_SUFFIX):
        return None
    commit = tag[:-len(modelcar.TAG_SUFFIX)]
    return (hub, org_name, commit) if commit and hub_repository(hub, org_name) == f"{hub}/{org_name}" else None


def held_modelcars(runtime: "Runtime", images: Sequence[InventoryImage]) -> Tuple[List[InventoryModel], List[str]]:
    """The models the runtime holds whole as modelcar images, sorted by image name, and a note for each modelcar
    image it holds that is not listed (why). Raises DaemonError."""
    found: Dict[str, InventoryImage] = {}
    for im in images:
        for name in im.tags:
            if modelcar_name(name) is not None:
                found.setdefault(name, im)
    models, notes = [], []
    for name in sorted(found):
        model = _held_modelcar(runtime, name, found[name])
        if isinstance(model, str):
            notes.append(f"{name}: not listed as a held model: {model}")
        else:
            models.append(model)
    return models, notes


def _held_modelcar(runtime: "Runtime", name: str, im: InventoryImage) -> Union[InventoryModel, str]:
    """The model an image holds, or why it is not one inventory lists."""
    hub, repo, commit = modelcar_name(name) or ("", "", "")
    if im.documents is None:
        return f"{runtime.traits.title} does not give imgtool the image's manifest, whose layers name the files"
    manifest, conf = im.documents
    labels = (conf.get("config") or {}).get("Labels") or {}
    if labels.get("org.opencontainers.image.revision") != commit:
        return f"its labels do not name commit {commit}"
    named = "/".join(str(labels.get("org.opencontainers.image.source") or "").split("/")[-2:])
    if named.lower() == repo:
        repo = named  # the hub's own letter case (the image's name is lowercase)
    try:
        files = modelcar.files_of(manifest)
    except (ValueError, UsageError) as e:
        return f"its manifest does not name its files ({e})"
    unfinished = runtime.incomplete(im.id, [str(d) for d in im.diff_ids])
    if unfinished is not None:
        return f"{runtime.traits.title} holds it only partly ({unfinished.reason})"
    sizes = {str(x.get("digest")): x.get("size") for x in manifest.get("layers") or () if isinstance(x, dict)}
    out: List[Tuple[str, int, Optional[Digest]]] = []
    layers: List[Tuple[str, Digest]] = []
    for path, sha256, layer in files:
        size = sizes.get(str(layer))
        first = runtime.blob_head(str(layer), modelcar.head_length(path)) if isinstance(size, int) else None
        n = modelcar.file_size(path, size, first) if first is not None and isinstance(size, int) else None
        if n is None:
            return f"the layer of {path} is not its file framed as a modelcar frames it"
        out.append((path, n, sha256))
        layers.append((path, layer))
    return InventoryModel(f"{hub}:{repo}@{commit}", commit, tuple(out), "", name, tuple(layers))
