"""`imgtool load`: stream a bundle into Docker, checking it on the way, and confirm the result.

One pass over the parts and never a copy on disk. Before a byte goes out: bundle.json against
SHA256SUMS (and --expect), every part present at its size. On the way: every part's sha256,
every tar header byte-identical to the one bundle.json implies (Docker is sent those headers,
so a crafted member never reaches it), every member's data hashed against its digest, padding
and trailer zeros. The last member bytes are held back until all of that matched; on any
deviation the upload is cut short. Docker unpacks an upload into a temporary directory and
registers nothing before the archive is complete, so it drops a cut upload: nothing is loaded.
Then the whole bundle is checked as `imgtool verify` would, to name every damaged part.
Layer diff_ids are not recomputed for Docker and containerd (that means decompressing every
layer, about as long as their own load): they check them and load nothing when one differs;
`imgtool verify` checks them offline. Podman does not check them (a layer that is not its
diff_id's loads): its storage records the digest it computed while applying each layer, so after
a Podman load imgtool compares those with the config's and removes the image on a mismatch; where
those records cannot be read, every layer is decompressed and hashed while it streams instead.
The runtime (Docker, containerd, Podman: a runtime.Runtime) is passed in by the caller: this
module talks to none of them by itself. containerd reads the whole archive into its content store
before it records an image, and the Podman room writes the checked archive whole before Podman
reads it: on both, as on Docker, a cut stream records nothing (and their rooms remove what they
kept of it).
"""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from ..delta import describe_requirements, missing_chains, requirements
from ..errors import DaemonError, ImgtoolError, LayerRefused, UsageError, VerifyError
from ..model import Platform, familiar, foreign_arch_warning, is_docker_name
from ..progress import Progress
from . import hostcheck, layout
from .format import BundleImage, BundleIndex
from ..trust import Verdict

if TYPE_CHECKING:
    from ..placer import Placed
    from ..runtimes.base import ImageInfo, Runtime, RuntimeInfo, Unfinished




@dataclass
class LoadedImage:
    ref: str
    tags: List[str]  # every name the image now carries that we asked for
    image_id: str  # the config digest (bundle.json's image_id): the same on every runtime
    docker_id: str  # what this runtime calls it: image_id, or a manifest digest in containerd's image store
    platform: str
    size: int  # as Docker reports it (unpacked)
    was_present: bool
    pinned: bool = False  # labelled for the CRI as pinned: the kubelet's image GC leaves it (containerd)
    finished: str = ""  # what an earlier load had left unfinished and this one finished (containerd: the unpack)

    def to_json(self) -> dict:
        return {"ref": self.ref, "tags": self.tags, "image_id": self.image_id, "docker_id": self.docker_id,
                "platform": self.platform, "size": self.size, "was_present": self.was_present,
                "pinned": self.pinned, "finished": self.finished or None}


@dataclass
class LoadResult:
    dir: Path
    images: List[LoadedImage]
    sent: bool  # False: everything was already loaded, the runtime was not sent the archive
    daemon: dict  # the runtime's facts (RuntimeInfo.to_json(): "runtime" says which)
    unpacked_size: Optional[int] = None
    bytes_sent: int = 0
    seconds: float = 0.0
    warnings: List[str] = field(default_factory=list)
    signature: Optional[Verdict] = None  # bundle.json.sig under the site's policy
    models: List["Placed"] = field(default_factory=list)  # what placing each model did (ends/model_dest.py)
    # the models imported as modelcar images (`--models image`), and whether they were sent (False: held already)
    modelcars: List[LoadedImage] = field(default_factory=list)
    modelcars_sent: bool = False

    def to_json(self) -> dict:
        return {"dir": str(self.dir), "sent": self.sent, "images": [im.to_json() for im in self.images],
                "models": [m.to_json() for m in self.models],
                "modelcars": [im.to_json() for im in self.modelcars], "modelcars_sent": self.modelcars_sent,
                "runtime": self.daemon.get("runtime", "docker"), "daemon": self.daemon,
                "unpacked_size": self.unpacked_size, "bytes_sent": self.bytes_sent,
                "seconds": round(self.seconds, 3), "warnings": self.warnings,
                "signature": self.signature.to_json() if self.signature else None}


def parse_tags(values: Sequence[str], index: BundleIndex) -> Dict[str, List[str]]:
    """--tag NAME (one-image bundles) or --tag SOURCE=NAME -> {image ref: [names]}; raises UsageError."""
    out: Dict[str, List[str]] = {im.ref: [] for im in index.images}
    for value in values:
        source, sep, name = value.partition("=")
        if not sep:
            if len(index.images) != 1:
                refs = ", ".join(im.ref for im in index.images)
                raise UsageError(f"--tag {value}: this bundle holds {len(index.images)} images ({refs})",
                                 hint="say which: --tag SOURCE=NAME, SOURCE being an image's name or tag")
            source, name = index.images[0].ref, value
        name = name.strip()
        if ":" not in name.rsplit("/", 1)[-1]:
            name += ":latest"
        if not is_docker_name(name):
            raise UsageError(f"invalid --tag {value!r}: expected NAME[:TAG], e.g. vllm-ascend:prod")
        matches = [im for im in index.images if source in (im.ref, im.image_ref.tag, im.repo_tag)]
        if len(matches) != 1:
            raise UsageError(f"--tag {value}: {source!r} names {'no' if not matches else 'more than one'} image "
                             "of this bundle", hint="use the full name as bundle.json lists it")
        if name not in out[matches[0].ref]:
            out[matches[0].ref].append(name)
    return out


def land(daemon: "Runtime", facts: "RuntimeInfo", plan: "LoadPlan", send: Callable[[], int], progress: Progress,
         pin: bool) -> Tuple[List[LoadedImage], int]:
    """What every load into a runtime does around the archive's bytes (`send`: into `daemon.load_archive`, returns
    the bytes sent): the unpack containerd leaves to imgtool, Podman's applied diff_ids compared, and on any failure
    what the load registered removed; then each image named (canonical name, --tag), confirmed by its ID, named by
    digest where the runtime keeps names so (containerd), pinned. Shared by `load` (bundle → runtime) and the
    pipeline's runtime destination (ends/runtime_dest.py: registry → runtime). Raises what `send` raised,
    DaemonError."""
    try:
        sent = _sent(send, facts, plan.loading)
        _unpack(daemon, plan)
        if not facts.checks_diff_ids and facts.reports_applied_diff_ids:
            _check_applied(daemon, facts, plan.loading)
    except BaseException:
        try:
            _forget_failed_load(daemon, plan.loading, plan.present)
        except DaemonError as e:  # the runtime gone mid-way: its own error is the story, this a warning
            left = daemon.left_behind()  # what the room knows the load may have left, as imgtool's own
            progress.warn(f"could not check for what the failed load left in {facts.title} ({e.message})"
                          + (f": {left}" if left else ""))
        raise
    images = _tag_and_confirm(daemon, facts, plan.view, plan.wanted, plan.present, plan.ids)
    _digest_refs(daemon, facts, plan.view, plan.ids)
    _pin(daemon, images, plan.ids, pin, {})
    return images + _confirm_others(daemon, facts, plan), sent


def landed(daemon: "Runtime", facts: "RuntimeInfo", plan: "LoadPlan", progress: Progress, pin: bool
           ) -> List[LoadedImage]:
    """The runtime holds every image already (`plan.loaded`): what it lacks of one finished (containerd's unpack),
    then each named, confirmed and pinned as `land` does; nothing is sent."""
    finished = _finish(daemon, facts, plan, progress)
    images = _tag_and_confirm(daemon, facts, plan.view, plan.wanted, plan.present, plan.ids)
    _digest_refs(daemon, facts, plan.view, plan.ids)
    _pin(daemon, images, plan.ids, pin, finished)
    return images


@dataclass
class LoadPlan:
    """What a load sends and names: `view` is the bundle with the images to name (one platform per tag),
    `others` the further platforms --all-platforms loads, each with the ID this runtime gives it."""

    view: BundleIndex
    wanted: Dict[str, List[str]]  # extra tags (--tag) per image
    ids: Dict[str, str]  # ref -> the ID this runtime gives it
    present: Dict[str, Optional["ImageInfo"]]  # ref -> what the runtime holds under that ID
    others: List[BundleImage]
    other_ids: List[str]
    loaded: bool  # the runtime holds every one already (all of it, or enough to finish): nothing to send
    unfinished: Dict[str, "Unfinished"] = field(default_factory=dict)  # ref -> what the runtime lacks of it

    @property
    def loading(self) -> List[Tuple[BundleImage, str]]:
        return [(im, self.ids[im.ref]) for im in self.view.images] + list(zip(self.others, self.other_ids))


def plan_load(index: BundleIndex, daemon: "Runtime", facts: "RuntimeInfo", tags: Sequence[str], arch: Optional[str],
          all_platforms: bool) -> LoadPlan:
    # A bundle may hold several platforms of one tag: only one of them is loaded and named.
    view = dataclasses.replace(index, images=tuple(select_images(index, arch or facts.arch, arch is not None)))
    wanted = parse_tags(tags, view)
    ids = {im.ref: str(layout.runtime_image_id(im, facts.containerd_store)) for im in view.images}
    present = _lookup(daemon, view)(ids)
    others = [im for im in index.images if im not in view.images] if all_platforms else []
    other_ids = [str(layout.runtime_image_id(im, facts.containerd_store)) for im in others]
    loaded = all(present.values()) and all(daemon.image_info(i) is not None for i in other_ids)
    unfinished = {}
    for im in view.images:
        if present[im.ref] is not None:
            missing = daemon.incomplete(ids[im.ref], [str(layer.diff_id) for layer in im.layers])
            if missing is not None:
                unfinished[im.ref] = missing
    loaded = loaded and not any(u.needs_import for u in unfinished.values())
    return LoadPlan(view, wanted, ids, present, others, other_ids, loaded, unfinished)


def _finish(daemon: "Runtime", facts: "RuntimeInfo", plan: LoadPlan, progress: Progress) -> Dict[str, str]:
    """Finish what the runtime holds of each image but not all of (`plan.unfinished`: containerd's unpack);
    returns ref -> what was finished. Raises DaemonError."""
    done = {}
    unfinished = plan.unfinished
    for im in plan.view.images:
        if im.ref in unfinished:
            progress.note(f"{im.ref} is in {facts.title}, but {unfinished[im.ref].reason}: finishing it ...")
            daemon.finish(plan.ids[im.ref])
            done[im.ref] = unfinished[im.ref].reason
    return done


def _unpack(daemon: "Runtime", plan: LoadPlan) -> None:
    """After a load: finish each named image the runtime recorded but did not complete (containerd imports
    without unpacking, and imgtool unpacks under a lease of its own). Raises DaemonError."""
    for im in plan.view.images:
        image_id = plan.ids[im.ref]
        if daemon.incomplete(image_id, [str(layer.diff_id) for layer in im.layers]) is not None:
            daemon.finish(image_id)


def _pin(daemon: "Runtime", images: List[LoadedImage], ids: Dict[str, str], pin: bool, finished: Dict[str, str]) -> None:
    """Pin each image where the runtime can (the kubelet's image GC then leaves it), and record what was finished."""
    for loaded in images:
        loaded.finished = finished.get(loaded.ref, "")
        if pin:
            loaded.pinned = daemon.pin(ids[loaded.ref])


def before_sending(bundle_dir: Path, index: BundleIndex, daemon: "Runtime", facts: "RuntimeInfo", plan: LoadPlan,
                    force: bool) -> List[str]:
    """A delta's base there, then what this runtime can take (space, zstd, storage) of what will be sent, less
    the layer chains it already holds; returns the warnings, raises what refuses the load."""
    outgoing = dataclasses.replace(index, images=tuple(list(plan.view.images) + plan.others))
    if not plan.view.is_delta:
        return check_room(outgoing, daemon, facts, force)
    held = hostcheck.held_chains(daemon)  # a delta needs the runtime's chains
    check_base(bundle_dir, plan.view, daemon, facts.title, held)
    return _compatibility(outgoing, facts, None, force, held)


def _confirm_others(daemon: "Runtime", facts: "RuntimeInfo", plan: LoadPlan) -> List[LoadedImage]:
    """The further platforms --all-platforms loaded, each found in the runtime by its ID; raises DaemonError."""
    out = []
    for im, image_id in zip(plan.others, plan.other_ids):
        info = daemon.image_info(image_id)
        if info is None:
            raise DaemonError(f"{facts.traits.load_command} finished, but {im.ref} for {im.platform} "
                              f"(ID {image_id[7:19]}) is not in {facts.title}")
        out.append(LoadedImage(im.ref, [], str(im.image_id), info.id, str(im.platform), info.size, False))
    return out


def select_images(index: BundleIndex, arch: str, explicit: bool) -> List[BundleImage]:
    """The images to load: for a reference held for several platforms, the one for `arch` (the daemon's,
    or --arch); with an explicit --arch, only images of that arch. Raises UsageError."""
    wanted = Platform.parse(arch).architecture if arch else Platform.host().architecture
    by_ref: Dict[str, List[BundleImage]] = {}
    for im in index.images:
        by_ref.setdefault(im.ref, []).append(im)
    out = []
    for ref, images in by_ref.items():
        if len(images) == 1 and not explicit:
            out.append(images[0])  # a single-platform image: loaded as before (with a warning if foreign)
            continue
        match = [im for im in images if im.platform.architecture == wanted]
        if not match:
            held = ", ".join(str(im.platform) for im in images)
            whose = "--arch" if explicit else "this Docker host's"
            raise UsageError(f"{ref}: this bundle holds it for {held}, not for {whose} {wanted}",
                             hint="fetch it with --arch " + wanted if not explicit else "choose one with --arch")
        out.append(match[0])
    return out


def check_base(bundle_dir: Path, index: BundleIndex, daemon: "Runtime", title: str = "Docker",
               present: Optional[frozenset] = None) -> None:
    """A delta bundle loads only where the runtime (`title`: Docker, containerd, Podman) holds every chain it
    leaves out (`present`: its chains, asked for when not given); raises ImgtoolError naming the images
    (and the base bundle) to load first."""
    if present is None:
        present = hostcheck.held_chains(daemon)
    needed = index.omitted_chains()
    missing = missing_chains(needed, present)
    if not missing:
        return
    base = index.base or {}
    where = f" (from the {base.get('kind')} {base.get('name')})" if base.get("name") else ""
    raise ImgtoolError(f"refusing to load: {bundle_dir} is a delta bundle and {title} lacks {len(missing)} of the "
                       f"{len(needed)} layer chains it leaves out; nothing was loaded",
                       hint=f"load {describe_requirements(requirements(missing))}{where} first, then this bundle; "
                            "or fetch a full bundle (without --have/--base)")


def _names(image: BundleImage, wanted: Dict[str, List[str]]) -> List[str]:
    return ([image.repo_tag] if image.repo_tag else []) + wanted.get(image.ref, [])


def _has_tags(daemon: "Runtime", info: "ImageInfo", names: Sequence[str]) -> bool:
    have = {familiar(t) for t in info.tags}
    return all(familiar(daemon.stored_name(n)) in have for n in names)


def check_room(outgoing: BundleIndex, daemon: "Runtime", facts: "RuntimeInfo", force: bool) -> List[str]:
    """What this runtime can take (space, zstd, storage) of the images `outgoing` holds, less the layer chains it
    already holds; returns the warnings, raises what refuses the load (exit 5 for zstd, 1 for space)."""
    held: frozenset = frozenset()
    if facts.local:  # for the space check only: without them, every layer counts as unpacked here
        try:
            held = hostcheck.held_chains(daemon)
        except DaemonError:
            pass
    return _compatibility(outgoing, facts, None, force, held)


def _compatibility(index: BundleIndex, facts: "RuntimeInfo", unpacked: Optional[int], force: bool,
                   held: frozenset = frozenset()) -> List[str]:
    """Refuse what this runtime cannot take (the checks doctor lists: hostcheck; `held`: the layer chains it
    holds, not unpacked again); return the warnings."""
    zstd = hostcheck.zstd_check(index, facts)
    if zstd is not None:  # this runtime cannot read the bundle: the runtime's limit, exit 5 as load.sh's
        raise DaemonError(f"{zstd.detail}; nothing was loaded", hint=zstd.advice)
    warnings = []
    storage = hostcheck.storage_check(facts)
    if storage.status == "warn":
        warnings.append(f"storage: {storage.detail}: {storage.advice}")
    space = hostcheck.space_check(facts, index, unpacked, held)
    if space.status == "fail" and not force:
        raise ImgtoolError(space.detail, hint=f"{space.advice}; or pass --force to try anyway")
    if space.status == "fail":
        warnings.append(space.detail + " (--force: trying anyway)")
    elif space.status == "info":
        warnings.append(space.detail)
    return warnings


def arch_warnings(index: BundleIndex, host_arch: str, title: str = "Docker") -> List[str]:
    arch = host_arch or Platform.host().architecture
    return [w for w in (foreign_arch_warning(im.ref, str(im.platform), arch, host=title) for im in index.images) if w]


class Cut(VerifyError):
    """The archive deviates from bundle.json: the upload is cut short (load's full check then names why).

    A verification failure (exit 3) of the error root, so a deviation that escapes the full check (a pair that
    has none, a caller that lets it through) is still said as a refusal, never as an internal error."""


class Applied(Cut):
    """The runtime applied a layer whose content is not its diff_id (Podman does not check): the loaded image
    is removed again (load's full check then names the layer; `copy registry: runtime:` says this one)."""


def _not_its_diff_id(facts: "RuntimeInfo", im: BundleImage, bad: int, done: str) -> Applied:
    """The refusal of layer `bad` (from 0) of `im`, whose content the runtime `done` ("applied", "refused") is not
    its diff_id."""
    return Applied(f"layer {bad + 1} of {im.ref}: {facts.title} {done} content that is not its diff_id "
                   f"(blob {im.layers[bad].digest.short}); no image of {im.ref} was kept",
                   hint="the blob matches its digest, so the image is published this way (fetching it again gives "
                        "the same bytes): report it to the image's publisher")


def _sent(send: Callable[[], int], facts: "RuntimeInfo", images: Sequence[Tuple[BundleImage, str]]) -> int:
    """`send()`; a layer the runtime refused as not its diff_id (Podman 5) raised as Applied, as Podman 4.3's
    applied one is (_check_applied), naming the first layer of the images sent with that diff_id."""
    try:
        return send()
    except LayerRefused as e:
        for im, _ in images:
            bad = next((i for i, layer in enumerate(im.layers) if str(layer.diff_id) == e.diff_id), None)
            if bad is not None:
                raise _not_its_diff_id(facts, im, bad, "refused") from e
        raise


def _check_applied(daemon: "Runtime", facts: "RuntimeInfo", images: Sequence[Tuple[BundleImage, str]]) -> None:
    """Compare the diff_ids the runtime computed while it applied each image's layers (Podman's storage
    records them) with the config's; raises Applied naming the first image that differs, DaemonError when the
    runtime has no record of an image's layers (either way its removal is _forget_failed_load's)."""
    for im, image_id in images:
        applied = daemon.applied_diff_ids(image_id)
        expected = [str(layer.diff_id) for layer in im.layers]
        if applied is None:  # the runtime's own records, not the bundle: a runtime error, the image removed
            raise DaemonError(f"{facts.title} loaded {im.ref} but keeps no record of the layers it applied "
                              f"(image {image_id[7:19]}), so imgtool cannot confirm them; it was removed again",
                              hint=f"check {facts.title}'s storage ({facts.root_dir}), then load again")
        if applied != expected:
            bad = next((i for i, (a, b) in enumerate(zip(applied, expected)) if a != b), len(expected) - 1)
            raise _not_its_diff_id(facts, im, bad, "applied")


def outgoing_meta(index: BundleIndex, named: Sequence[BundleImage], others: Sequence[BundleImage],
                   digest_names: bool) -> Dict[str, bytes]:
    """The manifest.json / index.json the runtime gets in place of the archive's, when not every image goes
    out as the archive names it: a subset (the runtime's platform of a multi-platform tag) gets its own,
    naming it; with every platform (`others` besides the `named`), index.json names the tag's platform and,
    for a runtime that keeps only named images (Traits.digest_names: containerd), the others by digest."""
    if others:
        images = list(named) + list(others)
        names = [im.ref for im in named] + [layout.digest_name(im) if digest_names else None
                                            for im in others]
        return {"index.json": layout.named_index_json(images, names)}
    if len(named) < len(index.images):
        return {"manifest.json": layout.manifest_json(named), "index.json": layout.index_json(named)}
    return {}


def _digest_refs(daemon: "Runtime", facts: "RuntimeInfo", index: BundleIndex, ids: Dict[str, str]) -> None:
    """On containerd, each image is also named REPO@<the registry's manifest digest>, as the CRI plugin names
    an image it pulls (its RepoDigests): a Pod pinned by digest (`run-flags --format k8s --bundle`) then finds
    it on the node instead of pulling. The other runtimes keep digests their own way."""
    if not facts.traits.digest_names:
        return
    for im in index.images:  # (ctr images tag --force: naming it again is harmless)
        ref = im.image_ref
        daemon.tag(ids[im.ref], f"{ref.registry}/{ref.repository}@{im.manifest_digest}")


def _forget_failed_load(daemon: "Runtime", images: Sequence[Tuple[BundleImage, str]],
                        before: Dict[str, Optional["ImageInfo"]]) -> None:
    """Docker's containerd image store and containerd register an image before they unpack its layers,
    and keep it when the unpacking fails (a layer not matching its diff_id, a layer that is not a tar);
    Podman keeps a layer that is not its diff_id's (_check_applied). A failed load must leave nothing
    behind: remove what it registered of the (image, ID) pairs not held before (`before`: by the ID)."""
    held = {info.id for info in before.values() if info is not None}
    for _, image_id in images:
        if image_id not in held and daemon.image_info(image_id) is not None:
            daemon.remove_image(image_id)


MANY_IMAGES = 16  # more than this in a bundle: one listing of the daemon's images, not an inspect per image


def _lookup(daemon: "Runtime", index: BundleIndex) -> Callable[[Dict[str, str]], Dict[str, Optional["ImageInfo"]]]:
    """ids (ref -> the ID this Docker gives it) -> {ref: ImageInfo or None}: an inspect per image for a few
    images, one listing for many (14,000 images took 25 s of inspects where verify takes 3 s)."""
    if len(index.images) <= MANY_IMAGES:
        return lambda ids: {ref: daemon.image_info(image_id) for ref, image_id in ids.items()}

    def listed(ids: Dict[str, str]) -> Dict[str, Optional["ImageInfo"]]:
        every = daemon.images_by_id()
        return {ref: every.get(image_id) for ref, image_id in ids.items()}

    return listed


def _tag_and_confirm(daemon: "Runtime", facts: "RuntimeInfo", index: BundleIndex, wanted: Dict[str, List[str]],
                     before: dict, ids: Dict[str, str]) -> List[LoadedImage]:
    """Give each image its canonical name and --tag names, then confirm by the ID this runtime gives it
    (`ids`, see layout.runtime_image_id); raises DaemonError."""
    verb, title = facts.traits.load_command, facts.title
    out = []
    now = _lookup(daemon, index)({im.ref: ids[im.ref] for im in index.images})
    for im in index.images:
        image_id = ids[im.ref]
        info = now[im.ref]
        if info is None:
            raise DaemonError(f"{verb} finished, but {im.ref} (ID {image_id[7:19]}) is not in {title}")
        names = _names(im, wanted)
        tagged = False
        for name in names:
            if familiar(daemon.stored_name(name)) not in {familiar(t) for t in info.tags}:
                daemon.tag(image_id, name)
                tagged = True
        if tagged:  # what `now` says holds otherwise (an inspect for a few images; a listing has no platform)
            info = daemon.image_info(image_id)
        if info is None or info.id != image_id or not _has_tags(daemon, info, names):
            raise DaemonError(f"{verb} finished, but {im.ref} does not carry the names {', '.join(names)}")
        out.append(LoadedImage(im.ref, names, str(im.image_id), info.id, info.platform or str(im.platform), info.size,
                               before.get(im.ref) is not None))
    return out
