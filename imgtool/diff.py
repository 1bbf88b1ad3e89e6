"""`imgtool diff OLD NEW`: what changed between two releases, and what a delta bundle would save.

Each side is a bundle (its directory or its bundle.json) or an inventory of an offline Docker
(`imgtool inventory -o FILE`). Images are matched by name and platform; layers by chain ID
(the layer on top of everything below it), which is exactly what `docker load` can skip when
the offline side already holds it, so "shared" bytes are what `fetch --base OLD` leaves out.
Pure apart from reading the two inputs.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .delta import INVENTORY_FORMAT, Inventory, chain_ids
from .errors import UsageError
from .fsutil import NotRegularFile, open_regular
from .model import Digest, format_size
from .model_diff import ModelRow, held_models, model_rows
from .model_diff import describe as describe_models


@dataclass(frozen=True)
class SideLayer:
    chain_id: Digest
    diff_id: Digest
    digest: Optional[Digest]  # the compressed blob (bundles only)
    size: Optional[int]  # compressed bytes (bundles only)


@dataclass(frozen=True)
class SideImage:
    name: str
    platform: str
    image_id: str
    layers: Tuple[SideLayer, ...]
    # every ID the image has in some Docker: a bundle's config digest (graphdriver stores) and the
    # manifest digest the containerd image store gives it once loaded; an inventory's one ID
    ids: Tuple[str, ...] = ()
    containerd_id: str = ""  # a bundle's image: the ID the containerd image store gives it once loaded

    def same_image(self, other: "SideImage") -> bool:
        return bool(set(self.ids or (self.image_id,)) & set(other.ids or (other.image_id,)))

    def shown_id(self, against: "Side") -> str:
        """The ID to print when compared with `against`: a bundle's image as the inventory's Docker would
        name it (the containerd store's manifest digest), so both IDs of a row are alike."""
        return self.containerd_id if against.containerd_store and self.containerd_id else self.image_id


@dataclass(frozen=True)
class Side:
    path: str
    kind: str  # bundle | inventory
    images: Tuple[SideImage, ...]
    containerd_store: bool = False  # an inventory of a Docker with the containerd image store
    gzip: Optional[dict] = None  # a bundle's `gzip`: what compressed the layers imgtool rewrote or exported
    # a bundle's models (bundle.format.BundleModel); an inventory's (model_diff.HeldModel: placed, or held as modelcar
    # images), compared by commit and files
    models: tuple = ()

    def compressor(self) -> str:
        """What gzip-compressed this side's layers, in words ("isal level 2")."""
        if self.gzip is None:
            return "an unrecorded compressor (the registry's, or an older imgtool's)"
        return f"{self.gzip.get('library')} level {self.gzip.get('level')}"

    def describe(self) -> str:
        plats = sorted({im.platform for im in self.images})
        return f"{self.path} ({self.kind}: {len(self.images)} image(s), {', '.join(plats) or 'no platforms'})"


def read_side(path: str) -> Side:
    """A bundle directory, a bundle.json, or an inventory JSON file; raises UsageError/VerifyError."""
    from .bundle.format import BUNDLE_JSON, FORMAT_NAME, BundleIndex
    from .bundle.verify import read_checked_index

    p = Path(path)
    if p.is_dir():  # checked against SHA256SUMS as verify does: diff says what a bundle holds, never an edited one
        return _from_bundle(path, read_checked_index(p, "diff"))
    if p.name == BUNDLE_JSON and p.is_file():
        return _from_bundle(path, read_checked_index(p.parent, "diff"))
    try:
        with open_regular(p) as f:
            data = f.read()
    except FileNotFoundError:
        raise UsageError(f"no such bundle or inventory: {path}") from None
    except NotRegularFile as e:
        raise UsageError(f"{path} is not a bundle directory or an inventory file ({e.kind})") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        kind = json.loads(data).get("format")
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        kind = None
    if kind == INVENTORY_FORMAT:
        inv = Inventory.from_bytes(data, path)
        images = []
        for im in inv.images:
            layers = tuple(SideLayer(c, d, None, None) for c, d in zip(chain_ids(im.diff_ids), im.diff_ids))
            for name in im.tags or (im.id,):
                images.append(SideImage(name, im.platform, im.id, layers))
        return Side(path, "inventory", tuple(images), inv.containerd_store, models=tuple(held_models(inv.models)))
    if kind == FORMAT_NAME:
        return _from_bundle(path, BundleIndex.from_bytes(data))
    raise UsageError(f"{path} is neither a bundle ({BUNDLE_JSON} or its directory) nor an imgtool inventory")


def _from_bundle(path: str, index) -> Side:
    from .bundle.layout import runtime_image_id

    images = []
    for im in index.images:
        chains = chain_ids([x.diff_id for x in im.layers])
        layers = tuple(SideLayer(c, x.diff_id, x.digest, x.size) for c, x in zip(chains, im.layers))
        # the IDs some Docker gives it: the config digest (graphdriver stores); in the containerd image store
        # the manifest digest it was imported by (loaded: the one index.json names; pulled: the registry's
        # manifest, upstream's before fetch rewrote layers, or upstream's index for this platform)
        upstream = (im.upstream or {}).get("manifest_digest")
        pulled = (im.manifest_digest, upstream, im.index_digest)
        ids = tuple(dict.fromkeys([str(runtime_image_id(im, store)) for store in (False, True)]
                                  + [str(x) for x in pulled if x]))
        images.append(SideImage(im.ref, str(im.platform), str(im.image_id), layers, ids,
                                str(runtime_image_id(im, True))))
    return Side(path, "bundle", tuple(images), gzip=index.gzip, models=tuple(index.models))


@dataclass
class LayerRow:
    status: str  # shared | added | removed
    layer: SideLayer
    images: List[str] = field(default_factory=list)  # "name (platform)" using it, on its side

    def to_json(self) -> dict:
        return {"status": self.status, "chain_id": str(self.layer.chain_id), "diff_id": str(self.layer.diff_id),
                "digest": str(self.layer.digest) if self.layer.digest else None, "size": self.layer.size,
                "images": self.images}


@dataclass
class ImageRow:
    status: str  # added | removed | changed | unchanged
    name: str
    platform: str
    old_id: Optional[str]
    new_id: Optional[str]

    def to_json(self) -> dict:
        return {"status": self.status, "name": self.name, "platform": self.platform,
                "old_id": self.old_id, "new_id": self.new_id}


@dataclass
class Diff:
    old: Side
    new: Side
    images: List[ImageRow]
    platforms: Dict[str, List[str]]  # added, removed, both
    layers: List[LayerRow]
    recompressed: int = 0  # shared layers (same content) held as other gzip bytes on each side
    models: List[ModelRow] = field(default_factory=list)  # model_diff.py

    @property
    def only_compression(self) -> bool:
        """The two sides hold the same images, layer for layer, and differ only in how layers were gzipped."""
        return bool(self.recompressed) and all(r.status == "unchanged" for r in self.images) and \
            all(r.status == "shared" for r in self.layers)

    def compression_line(self) -> Optional[str]:
        """What `describe` says about layers whose content is shared but whose gzip bytes differ."""
        if not self.recompressed:
            return None
        old, new = self.old.compressor(), self.new.compressor()
        how = f"{old} in old, {new} in new" if old != new else f"{old} on both sides (another library version?)"
        lead = "the bundles differ only by their gzip compressor" if self.only_compression else \
            f"{self.recompressed} shared layer(s) are other gzip bytes of the same content"
        return f"{lead}: the layers were compressed by {how}"

    def _bytes(self, statuses) -> Optional[int]:
        """Compressed bytes of the distinct blobs of the rows with these statuses (None: unknown)."""
        seen: Dict[str, int] = {}
        for row in self.layers:
            if row.status in statuses:
                if row.layer.size is None:
                    return None
                seen[str(row.layer.digest)] = row.layer.size
        return sum(seen.values())

    @property
    def totals(self) -> dict:
        count = {s: sum(1 for r in self.layers if r.status == s) for s in ("shared", "added", "removed")}
        new_total = self._bytes(("shared", "added"))
        added = self._bytes(("added",))
        return {"layers": count, "new_bytes": new_total, "added_bytes": added,
                "shared_bytes": None if new_total is None or added is None else new_total - added,
                "removed_bytes": self._bytes(("removed",))}

    def to_json(self) -> dict:
        return {"old": {"path": self.old.path, "kind": self.old.kind},
                "new": {"path": self.new.path, "kind": self.new.kind},
                "images": [r.to_json() for r in self.images], "platforms": self.platforms,
                "layers": [r.to_json() for r in self.layers], "totals": self.totals,
                "recompressed": {"layers": self.recompressed, "only_compression": self.only_compression,
                                 "old": self.old.gzip, "new": self.new.gzip},
                **({"models": [r.to_json() for r in self.models]} if self.models else {})}

    def describe(self) -> List[str]:
        """The text report, line by line."""
        size = lambda n: "?" if n is None else format_size(n)  # noqa: E731
        out = [f"old: {self.old.describe()}", f"new: {self.new.describe()}", "images:"]
        wn = max((len(r.name) for r in self.images), default=0)
        wp = max((len(r.platform) for r in self.images), default=0)
        for r in self.images:
            ids = {"added": r.new_id, "removed": r.old_id, "unchanged": r.new_id}.get(r.status)
            what = f"ID {_short(ids)}" if ids else f"ID {_short(r.old_id)} -> {_short(r.new_id)}"
            out.append(f"  {r.status:<9}  {r.name:<{wn}}  {r.platform:<{wp}}  {what}")
        p = self.platforms
        out.append("platforms: " + "; ".join(f"{k} {', '.join(p[k]) or '-'}" for k in ("added", "removed", "both")))
        t = self.totals
        c = t["layers"]
        out.append(f"layers: {c['shared']} shared ({size(t['shared_bytes'])}), {c['added']} added "
                   f"({size(t['added_bytes'])}), {c['removed']} removed ({size(t['removed_bytes'])})")
        for lr in sorted(self.layers, key=lambda lr: ("shared", "added", "removed").index(lr.status)):
            shown = lr.layer.digest.short if lr.layer.digest else "diff " + lr.layer.diff_id.short
            names = ", ".join(lr.images[:3]) + (f" +{len(lr.images) - 3} more" if len(lr.images) > 3 else "")
            out.append(f"  {lr.status:<7}  {shown:<17}  {size(lr.layer.size):>10}  {names}")
        line = self.compression_line()
        if line:
            out.append(line)
        if t["new_bytes"] is not None and t["added_bytes"] is not None and t["new_bytes"]:
            saved = t["new_bytes"] - t["added_bytes"]
            out.append(f"delta: a bundle of new against old (imgtool fetch --base OLD) carries "
                       f"{format_size(t['added_bytes'])} of layers instead of {format_size(t['new_bytes'])} "
                       f"(saves {format_size(saved)}, {100 * saved // t['new_bytes']}%)")
        return out + describe_models(self.models, self.old.models, self.new.models)


def _short(image_id: Optional[str]) -> str:
    return (image_id or "-").split(":")[-1][:12]


def diff_sides(old: Side, new: Side) -> Diff:
    """Compare two sides: images by (name, platform), platforms, layers by chain ID."""
    old_p = sorted({im.platform for im in old.images})
    new_p = sorted({im.platform for im in new.images})
    platforms = {"added": [p for p in new_p if p not in old_p], "removed": [p for p in old_p if p not in new_p],
                 "both": [p for p in new_p if p in old_p]}
    return Diff(old, new, _image_rows(old, new), platforms, _layer_rows(old, new), _recompressed(old, new),
                model_rows(old.models, new.models))


def _image_rows(old: Side, new: Side) -> List[ImageRow]:
    """Each image of either side, by (name, platform): added, changed, unchanged or removed, with the IDs shown."""
    old_by = {(im.name, im.platform): im for im in old.images}
    new_by = {(im.name, im.platform): im for im in new.images}
    rows: List[ImageRow] = []
    for key, im in new_by.items():
        was = old_by.get(key)
        if was is None:
            rows.append(ImageRow("added", im.name, im.platform, None, im.shown_id(old)))
            continue
        status = "unchanged" if was.same_image(im) else "changed"
        old_id, new_id = was.shown_id(new), im.shown_id(old)
        if status == "unchanged" and "inventory" in (old.kind, new.kind):  # as that Docker names it
            old_id = new_id = was.image_id if old.kind == "inventory" else im.image_id
        rows.append(ImageRow(status, im.name, im.platform, old_id, new_id))
    return rows + [ImageRow("removed", im.name, im.platform, im.shown_id(new), None)
                   for key, im in old_by.items() if key not in new_by]


def _layer_rows(old: Side, new: Side) -> List[LayerRow]:
    """Each layer chain of either side: shared, added or removed, with the images using it."""
    old_chains, new_chains = _chains(old), _chains(new)
    layers = [LayerRow("shared" if chain in old_chains else "added", layer, users)
              for chain, (layer, users) in new_chains.items()]
    return layers + [LayerRow("removed", layer, users)
                     for chain, (layer, users) in old_chains.items() if chain not in new_chains]


def _recompressed(old: Side, new: Side) -> int:
    """Layers both sides hold (the same chain) as different blobs: compressed by another compressor."""
    old_chains = _chains(old)
    count = 0
    for chain, (layer, _) in _chains(new).items():
        before = old_chains.get(chain)
        count += bool(before and before[0].digest and layer.digest and before[0].digest != layer.digest)
    return count


def _chains(side: Side) -> Dict[Digest, Tuple[SideLayer, List[str]]]:
    out: Dict[Digest, Tuple[SideLayer, List[str]]] = {}
    for im in side.images:
        for layer in im.layers:
            entry = out.setdefault(layer.chain_id, (layer, []))
            label = f"{im.name} ({im.platform})"
            if label not in entry[1]:
                entry[1].append(label)
    return out


def diff_paths(old: str, new: str) -> Diff:
    """Read both sides and compare them; raises UsageError/VerifyError for unreadable inputs."""
    return diff_sides(read_side(old), read_side(new))
