"""Layer chains, the offline inventory, and which layers a delta bundle may leave out. Pure.

Docker identifies a layer in its store by its *chain ID*: the diff_id of the first layer, and
for each further layer sha256(parent chain ID + " " + diff_id) (image-spec, "ChainID"). When
`docker load` meets a layer whose chain already exists it does not read the layer file at all,
so a bundle may omit every layer whose chain the offline Docker already has. This module
computes chains, reads and writes the inventory document (`imgtool inventory`), and plans
which layers of the images being bundled are covered. It does no I/O.
"""

import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .errors import UsageError
from .model import Descriptor, Digest, PulledImage, is_docker_name, is_platform, json_object

INVENTORY_FORMAT = "imgtool-inventory"
INVENTORY_VERSION = 1
MAX_INVENTORY = 64 * 1024 * 1024  # a daemon with thousands of images is still a few MiB


def chain_ids(diff_ids: Sequence[Digest]) -> List[Digest]:
    """The chain ID of every prefix of `diff_ids`, as Docker computes them."""
    out: List[Digest] = []
    for diff in diff_ids:
        if not out:
            out.append(diff)
        else:
            text = f"{out[-1]} {diff}".encode()
            out.append(Digest("sha256", hashlib.sha256(text).hexdigest()))
    return out


@dataclass(frozen=True)
class InventoryImage:
    """One image the offline Docker holds: its ID, names, and layers (RootFS diff_ids)."""

    id: str
    tags: Tuple[str, ...]
    platform: str
    diff_ids: Tuple[Digest, ...]
    pinned: Optional[bool] = None  # the kubelet's image GC skips it (containerd's CRI label); None: no such thing here
    # (manifest, config) as the runtime holds them, parsed, where it keeps the manifest (containerd): what inventory
    # reads a modelcar's files from (its layers' annotations); never written to the document
    documents: Optional[Tuple[dict, dict]] = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        """How messages name it: its first tag, else its short ID."""
        return self.tags[0] if self.tags else self.id.split(":")[-1][:12]

    def to_json(self) -> dict:
        out: Dict[str, object] = {"id": self.id, "tags": list(self.tags), "platform": self.platform,
                                  "diff_ids": [str(d) for d in self.diff_ids],
                                  "chain_id": str(chain_ids(self.diff_ids)[-1]) if self.diff_ids else None}
        if self.pinned is not None:
            out["pinned"] = self.pinned
        return out


@dataclass(frozen=True)
class InventoryModel:
    """One model placed on the offline host (issue 48): the reference with the revision it was placed as
    (`hf:ORG/NAME@main`; `@<commit>` when no branch names it), its commit, and each file's path, size and sha256
    (None only for a small non-LFS file of the Hugging Face cache that could not be read). `path`: where it lies.
    `image`: the modelcar image (issue 49) the runtime holds it as (`models.local/HUB/org/name:COMMIT-modelcar`), its
    files the image's layers; "" for a model placed as files. Each file's layer there is its path and bytes: a file
    a delta leaves out by its sha256 is a layer the runtime holds only where the path is the same."""

    ref: str
    commit: str
    files: Tuple[Tuple[str, int, Optional[Digest]], ...]
    path: str = ""
    image: str = ""
    # each file's modelcar layer digest, where the runtime holds it as one (`image`): a delta fetched against this
    # inventory names these layers for the files it leaves out, and so carries the modelcar form too
    layers: Tuple[Tuple[str, Digest], ...] = ()

    def to_json(self) -> dict:
        layers = dict(self.layers)
        files = []
        for p, n, d in self.files:
            entry = {"path": p, "size": n, "sha256": str(d) if d is not None else None}
            if p in layers:
                entry["modelcar"] = str(layers[p])
            files.append(entry)
        out = {"ref": self.ref, "commit": self.commit, "path": self.path, "files": files}
        if self.image:
            out["image"] = self.image
        return out


@dataclass(frozen=True)
class Inventory:
    """What an offline Docker holds (`imgtool inventory`), enough to know its layer chains; and the models placed
    on the host (`models`: what a model's delta may leave out)."""

    created: str
    daemon: dict
    images: Tuple[InventoryImage, ...]
    models: Tuple[InventoryModel, ...] = ()

    def to_json(self) -> dict:
        return {"format": INVENTORY_FORMAT, "version": INVENTORY_VERSION, "created": self.created,
                "daemon": self.daemon, "images": [im.to_json() for im in self.images],
                "models": [m.to_json() for m in self.models]}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2) + "\n").encode()

    @property
    def containerd_store(self) -> bool:
        """The Docker it was taken on keeps images in the containerd image store (recorded since issue 24:
        an older inventory says nothing and is taken for a graphdriver store)."""
        return self.daemon.get("image_store") == "containerd"

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "inventory") -> "Inventory":
        """Parse an inventory; raises UsageError naming what is wrong."""

        def bad(why: str) -> UsageError:
            return UsageError(f"{where} is not an imgtool inventory: {why}",
                              hint="write one on the offline host with `imgtool inventory -o FILE`")

        obj = json_object(data, MAX_INVENTORY, bad)
        if obj.get("format") != INVENTORY_FORMAT:
            raise bad(f"format is not {INVENTORY_FORMAT!r}")
        version = obj.get("version")
        if not isinstance(version, int) or version > INVENTORY_VERSION:
            raise UsageError(f"{where}: inventory version {version!r} is newer than this imgtool understands",
                             hint="upgrade imgtool on this host")
        images = []
        for i, x in enumerate(obj.get("images") or []):
            if not isinstance(x, dict) or not isinstance(x.get("id"), str) or not isinstance(x.get("diff_ids"), list):
                raise bad(f"images[{i}] is malformed")
            try:
                diffs = tuple(Digest.parse(d) for d in x["diff_ids"])
            except (UsageError, TypeError, AttributeError):
                raise bad(f"images[{i}].diff_ids holds something that is not a digest") from None
            images.append(InventoryImage(_image_id(x["id"], f"images[{i}].id", bad),
                                         _names(x.get("tags") or [], f"images[{i}].tags", bad),
                                         _platform(x.get("platform") or "", f"images[{i}].platform", bad), diffs))
        daemon = obj.get("daemon")
        if not isinstance(daemon, dict):
            daemon = {}
        return cls(str(obj.get("created") or ""), daemon, tuple(images), _models(obj.get("models"), bad))


def _models(value: object, bad: Callable[[str], UsageError]) -> Tuple[InventoryModel, ...]:
    """An inventory's `models` (absent: none); only the sha256s decide anything (what a delta leaves out)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad("models is not a list")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("ref"), str) or not isinstance(m.get("files"), list):
            raise bad(f"models[{i}] is malformed")
        files: List[Tuple[str, int, Optional[Digest]]] = []
        layers: List[Tuple[str, Digest]] = []
        for j, f in enumerate(m["files"]):
            where = f"models[{i}].files[{j}]"
            if not isinstance(f, dict) or not isinstance(f.get("path"), str) or not isinstance(f.get("size"), int) \
                    or isinstance(f.get("size"), bool) or f["size"] < 0:
                raise bad(f"{where} is malformed")
            if "modelcar" in f:
                layers.append((f["path"], _digest(f["modelcar"], f"{where}.modelcar", bad)))
            if f.get("sha256") is None:  # a small file inventory could not read: it decides nothing
                files.append((f["path"], f["size"], None))
                continue
            files.append((f["path"], f["size"], _digest(f["sha256"], f"{where}.sha256", bad)))
        path, image = m.get("path"), m.get("image")
        out.append(InventoryModel(m["ref"], str(m.get("commit") or ""), tuple(files), path if isinstance(path, str) else "",
                                  image if isinstance(image, str) else "", tuple(layers)))
    return tuple(out)


def _digest(value: object, where: str, bad: Callable[[str], UsageError]) -> Digest:
    try:
        return Digest.parse(value if isinstance(value, str) else "")
    except (UsageError, TypeError, AttributeError):
        raise bad(f"{where} is not a digest: {str(value)[:80]!r}") from None


# An inventory's names reach load.sh's base check, bundle.json and messages: each is checked against its
# grammar here, where it enters (docs/security.md).
def _image_id(value: str, where: str, bad: Callable[[str], UsageError]) -> str:
    try:
        Digest.parse(value)
    except UsageError:
        raise bad(f"{where} is not an image ID (sha256:<64 hex digits>): {value!r}") from None
    return value


def _names(values: object, where: str, bad: Callable[[str], UsageError]) -> Tuple[str, ...]:
    if not isinstance(values, list):
        raise bad(f"{where} is not a list")
    for j, name in enumerate(values):
        if not is_docker_name(name):
            raise bad(f"{where}[{j}] is not an image name ([HOST[:PORT]/]PATH[:TAG]): {name!r}")
    return tuple(values)


def _platform(value: object, where: str, bad: Callable[[str], UsageError]) -> str:
    if value and not is_platform(value):
        raise bad(f"{where} is not a platform (os/architecture[/variant]): {value!r}")
    return str(value)


@dataclass
class Have:
    """Layer chains the offline side is assumed to hold, each with the image names that provide it."""

    what: str = ""  # for messages: "inventory inv.json" / "base bundle DIR"
    chains: Dict[Digest, List[str]] = field(default_factory=dict)
    platforms: Dict[str, str] = field(default_factory=dict)  # image name -> its platform ("linux/arm64/v8")
    # The layer blob the offline Docker holds for a chain, where known (a base bundle names them). The
    # containerd image store keeps an image's blobs by digest: a delta's manifest must name these.
    blobs: Dict[Digest, Descriptor] = field(default_factory=dict)
    # Images of a containerd-store inventory, by name: their blobs are unknown until looked up (heldblobs.py)
    containerd: Dict[str, InventoryImage] = field(default_factory=dict)
    # model files the offline side holds, by sha256 (a placed model's, a base bundle's): the model named
    model_files: Dict[Digest, str] = field(default_factory=dict)
    # (sha256, path) -> the file's modelcar layer digest, as a base bundle records it, or an inventory of a runtime
    # that holds the model as its modelcar image
    modelcar_layers: Dict[Tuple[Digest, str], Digest] = field(default_factory=dict)

    def add_model(self, ref: str, sha256s: Iterable[Digest]) -> None:
        for d in sha256s:
            self.model_files.setdefault(d, ref)

    def add_modelcar_layers(self, layers: Iterable[Tuple[Digest, str, Digest]]) -> None:
        """(sha256, path, modelcar layer digest) of files a base bundle records: a delta's left-out file's layer."""
        for sha, path, layer in layers:
            self.modelcar_layers.setdefault((sha, path), layer)

    def add(self, diff_ids: Sequence[Digest], name: str, platform: str = "") -> None:
        for chain in chain_ids(diff_ids):
            names = self.chains.setdefault(chain, [])
            if name not in names:
                names.append(name)
        if platform:
            self.platforms.setdefault(name, platform)

    def add_blobs(self, diff_ids: Sequence[Digest], layers: Sequence[Descriptor]) -> None:
        """Record the blobs an image's layers are held as (its manifest's descriptors, in order)."""
        for chain, layer in zip(chain_ids(diff_ids), layers):
            self.blobs.setdefault(chain, layer)

    def merge(self, other: "Have") -> None:
        for d, ref in other.model_files.items():
            self.model_files.setdefault(d, ref)
        for key, car in other.modelcar_layers.items():
            self.modelcar_layers.setdefault(key, car)
        for chain, layer in other.blobs.items():
            self.blobs.setdefault(chain, layer)
        for name, image in other.containerd.items():
            self.containerd.setdefault(name, image)
        for chain, names in other.chains.items():
            mine = self.chains.setdefault(chain, [])
            mine += [n for n in names if n not in mine]
        for name, platform in other.platforms.items():
            self.platforms.setdefault(name, platform)
        self.what = " and ".join(x for x in (self.what, other.what) if x)

    def providers(self, chain: Digest, architecture: str = "") -> Tuple[str, ...]:
        """The images holding `chain`, those of `architecture` first (any one of them will do)."""
        names = self.chains.get(chain) or []

        def foreign(name: str) -> bool:
            parts = self.platforms.get(name, "").split("/")
            return bool(architecture) and (len(parts) < 2 or parts[1] != architecture)

        return tuple(sorted(names, key=foreign))


def have_from_inventory(inventory: Inventory, what: str) -> Have:
    have = Have(what)
    for im in inventory.images:
        have.add(im.diff_ids, im.name, im.platform)
        if inventory.containerd_store:
            have.containerd.setdefault(im.name, im)
    for m in inventory.models:
        have.add_model(m.ref, (d for _, _, d in m.files if d is not None))
        layers = dict(m.layers)
        have.add_modelcar_layers((d, p, layers[p]) for p, _, d in m.files if d is not None and p in layers)
    return have


@dataclass(frozen=True)
class Omission:
    """A layer left out of a delta bundle, and the chain the offline Docker must already hold."""

    index: int  # position in the image's layers
    chain_id: Digest
    provided_by: Tuple[str, ...]


def plan_omissions(diff_ids: Sequence[Digest], have: Optional[Have], architecture: str = "") -> List[Omission]:
    """Which layers of one image (by diff_ids) the offline side already has as whole chains.

    Only a leading run of layers can be covered: a chain includes every layer below it. Each
    omission names every image that provides its chain, those of `architecture` (the bundled
    image's) first.
    """
    out: List[Omission] = []
    if have is None:
        return out
    for i, chain in enumerate(chain_ids(diff_ids)):
        names = have.providers(chain, architecture)
        if not names:
            break
        out.append(Omission(i, chain, names))
    return out


@dataclass(frozen=True)
class DeltaPlan:
    """What a delta bundle leaves out, decided once, before anything downloads: fetch derives from it what
    is not downloaded and the puller's order, the writer what bundle.json records. Keyed by an image's
    diff_ids and architecture, which rewriting its layers (--layers compat) keeps, so the plan made for
    the pulled images holds for the rewritten ones. `base` is bundle.json's description of where `have`
    came from (a bundle, an inventory)."""

    have: Have
    base: Optional[dict]
    by_image: Dict[Tuple[Tuple[Digest, ...], str], Tuple[Omission, ...]]

    @classmethod
    def make(cls, have: Have, base: Optional[dict], images: Iterable[PulledImage]) -> "DeltaPlan":
        """The plan for these images, against the chains `have` holds."""
        keys = {(tuple(im.config.diff_ids), im.platform.architecture) for im in images}
        return cls(have, base, {key: tuple(plan_omissions(key[0], have, key[1])) for key in keys})

    def omissions(self, diff_ids: Sequence[Digest], architecture: str) -> Tuple[Omission, ...]:
        """The layers of that image left out; an image the plan was not made for is a bug (KeyError)."""
        return self.by_image[(tuple(diff_ids), architecture)]


def requirements(needed: Iterable[Tuple[Digest, Sequence[str]]]) -> List[Tuple[str, ...]]:
    """What the offline Docker must hold for these (chain, provided_by) pairs: one image of each tuple.

    Any one provider of a chain gives it. A chain whose providers include all of another's is
    covered by whichever image satisfies the other, so only the smallest provider sets remain
    (a delta of one image needs one image: one of those holding its deepest left-out chain).
    """
    sets: List[Tuple[str, ...]] = []
    for _, names in needed:
        names = tuple(dict.fromkeys(names))
        if names and names not in sets:
            sets.append(names)
    return [s for s in sets if not any(set(o) < set(s) for o in sets)]


def describe_requirements(reqs: Sequence[Tuple[str, ...]]) -> str:
    """"A; one of B, C" for messages."""
    return "; ".join(names[0] if len(names) == 1 else "one of " + ", ".join(names) for names in reqs)


def missing_chains(needed: Iterable[Tuple[Digest, Sequence[str]]], present: Iterable[Digest]
                   ) -> List[Tuple[Digest, Tuple[str, ...]]]:
    """The (chain, provided_by) pairs of `needed` whose chain is not in `present`, in order, once each."""
    have = set(present)
    out: List[Tuple[Digest, Tuple[str, ...]]] = []
    seen = set()
    for chain, names in needed:
        if chain not in have and chain not in seen:
            seen.add(chain)
            out.append((chain, tuple(names)))
    return out
