"""Which blobs the offline Docker holds for the layers a delta bundle leaves out (`fetch --have/--base`).

The containerd image store (Docker 29's default) keeps an image as its manifest's blobs, by digest,
and its unpacked layers as snapshots, by chain ID. A delta's left-out layers are found as snapshots,
so the image runs; but if its manifest names those layers by blobs the store never received (the
registry's zstd blobs, when the base was loaded as gzip), `docker save`, `docker push` and
`imgtool export` fail. So the delta's manifest must name the blobs the base holds: a base bundle
lists them; a containerd-store inventory lists only image IDs (manifest digests), whose manifests
are looked up here: in the cache, from the sources by digest, or by tag (the OCI twin a bundle's
index.json names for a Docker v2 manifest). A graphdriver store saves from its layers: nothing to do.
"""

from typing import Dict, List, Optional, Sequence, Tuple

from .bundle import layout
from .bundle.format import BundleImage, bundle_images
from .config import MirrorConfig
from .delta import DeltaPlan, InventoryImage, chain_ids
from .errors import ImgtoolError, UsageError
from .mirrors import Clients, resolve, sources_for
from .model import LAYER_COMPRESSION, Descriptor, Digest, Index, Manifest, Platform, PulledImage, parse_manifest
from .progress import Progress
from .resolve import resolve_image
from .store import Store

LeftOut = List[Tuple[int, Digest]]  # (layer index, chain ID) of each layer an image's bundle leaves out


def held_blobs(images: Sequence[PulledImage], delta: DeltaPlan, config: MirrorConfig, mirror: str, store: Store,
               progress: Progress, timeout: float = 5.0, clients: Optional[Clients] = None
               ) -> Tuple[List[LeftOut], Dict[Digest, Descriptor]]:
    """Each image's left-out layers, and the blob (by chain ID) the offline Docker holds each as, where known.

    Raises UsageError when the offline Docker is a containerd image store and the blobs of a left-out
    zstd layer cannot be found (the delta would load an image that store cannot save, push or export);
    warns when those of gzip or plain layers cannot (they are the base's if it came from the same registry)."""
    have = delta.have
    held = dict(have.blobs)
    looked: Dict[str, Optional[Tuple[Descriptor, ...]]] = {}
    left_out: List[LeftOut] = []
    for im in bundle_images(images, delta):
        omitted = [(i, x.chain_id, x.provided_by) for i, x in enumerate(im.layers) if x.omitted and x.chain_id]
        left_out.append([(i, chain) for i, chain, _ in omitted])
        need = [o for o in omitted if o[1] not in held and any(n in have.containerd for n in o[2])]
        if not need:
            continue
        bases = [have.containerd[n] for n in need[-1][2] if n in have.containerd]
        _look_up(bases, held, looked, config, mirror, store, timeout, clients)
        missing = [o for o in need if o[1] not in held]
        if missing:
            _say_missing(im, [i for i, _, _ in missing], bases, have.what, progress)
    return left_out, held


def _look_up(bases: Sequence[InventoryImage], held: Dict[Digest, Descriptor],
             looked: Dict[str, Optional[Tuple[Descriptor, ...]]], config: MirrorConfig, mirror: str, store: Store,
             timeout: float, clients: Optional[Clients]) -> None:
    """Add to `held` the blobs of the first of `bases` (images holding the deepest left-out chain, so every
    chain below it) whose manifest the cache or a source has; `looked` remembers each base's answer."""
    for base in bases:
        if base.id not in looked:
            looked[base.id] = _manifest_layers(base, config, mirror, store, timeout, clients)
        found = looked[base.id]
        if found is not None:
            for chain, blob in zip(chain_ids(base.diff_ids), found):
                held.setdefault(chain, blob)
            return


def _say_missing(im: BundleImage, missing: Sequence[int], bases: Sequence[InventoryImage], what: str, progress: Progress) -> None:
    """Refuse (zstd layers) or warn (gzip, plain) for left-out layers whose blobs in the store are not known."""
    why = f"neither the cache nor any source has the manifest of {', '.join(f'{b.name} ({b.id})' for b in bases)}"
    if any(LAYER_COMPRESSION.get(im.layers[i].media_type) == "zstd" for i in missing):
        # the registry's zstd blobs: a base loaded as gzip (from a bundle, by imgtool or docker) never holds them
        raise UsageError(
            f"cannot make {im.ref} a delta for the containerd image store of the {what}: its manifest "
            f"must name the blobs that Docker holds for the {len(missing)} layers it leaves out, and {why}",
            hint="give the bundle that image was loaded from with --base DIR, or fetch a full bundle "
                 "(without --have)")
    # gzip or plain blobs: the base holds these very blobs if it came from the same registry's
    progress.warn(f"{im.ref}: cannot check that the containerd image store of the {what} holds the "
                  f"blobs named for the {len(missing)} layers this delta leaves out ({why}): if that image's "
                  "layers are other blobs, `docker save` and `docker push` of this one will fail; --base DIR "
                  "with its bundle makes sure")


def _manifest_layers(base: InventoryImage, config: MirrorConfig, mirror: str, store: Store,
                     timeout: float, clients: Optional[Clients]) -> Optional[Tuple[Descriptor, ...]]:
    """The layer blobs of the manifest `base.id` names (the containerd store's image ID), or None if not found."""
    try:
        digest, platform = Digest.parse(base.id), Platform.parse(base.platform)
    except UsageError:
        return None
    layers = _cached(digest, platform, store)
    if layers is not None:
        return layers if len(layers) == len(base.diff_ids) else None
    for tag in base.tags:
        try:
            ref = config.parse_ref(tag)
        except UsageError:
            continue
        # by digest: an OCI manifest or an index as the registry serves it (a bundle of it, `docker pull`);
        # by tag: a Docker v2 manifest, loaded from a bundle as its OCI twin (bundle/layout.py)
        for wanted in (ref.with_digest(digest), ref.with_digest(None)):
            try:
                res = resolve(wanted, sources_for(wanted, config, mirror, clients), timeout)
                image = resolve_image(res, platform, store)
            except ImgtoolError:
                continue
            ids = {image.manifest_digest, image.index_digest,
                   layout.oci_descriptor_digest(bundle_images([image])[0])}
            if digest in ids and [str(d) for d in image.config.diff_ids] == [str(d) for d in base.diff_ids]:
                return image.manifest.layers
    return None


def _cached(digest: Digest, platform: Platform, store: Store) -> Optional[Tuple[Descriptor, ...]]:
    """The layers of a manifest (or of `platform`'s in an index) the cache holds as `digest`, or None."""
    for _ in range(2):
        if not store.has(digest):
            return None
        try:
            parsed = parse_manifest(store.read_bytes(digest))
            if isinstance(parsed, Manifest):
                return parsed.layers
            if not isinstance(parsed, Index):
                return None
            digest = parsed.select(platform).digest
        except (ImgtoolError, OSError):
            return None
    return None
