"""A container runtime (Docker, containerd, Podman: a `runtimes.base.Runtime`) as a pipeline destination: the
images it lacks are sent as the docker-archive `bundle.layout` arranges them (the headers a bundle's archive has),
each blob read through the source's `chunks`, the last member bytes held back until the source settled every
check (`settle`: a deviation cuts the stream and the runtime, which registers nothing before an archive is
complete, drops it), then landed as every load lands (`bundle.landing.land`: unpacked, named, confirmed by ID, named
by digest on containerd, pinned for the kubelet; what a failed load registered removed).

The destination owns what every load into a runtime does before and after the bytes: what earlier runs left is
removed first (`Runtime.remove_debris`, before the space is counted), the platform of each tag chosen, what the
runtime holds found (an image held whole moves nothing), the space, zstd and a delta's base checked (`before`), the
diff_id policy stated (`Holding.diff_ids`: a runtime that checks no diff_id asks the source to), the images landed.
It plans either from the source's images (registry → runtime) or, given a `BundleLoad`, from bundle.json (bundle →
runtime, `imgtool load`: its delta and platforms, the archive's index.json / manifest.json rewritten where not every
image goes out as the bundle names it; the stream of ends/bundle_stream.py). Python 3.7.
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

from .. import __version__
from ..bundle import layout
from ..bundle.format import Archive, BundleImage, BundleIndex, bundle_images
from ..bundle.landing import (LoadedImage, LoadPlan, arch_warnings, before_sending, check_room, land, landed,
                              outgoing_meta, plan_load)
from ..model import Digest, PulledImage
from ..pipeline import Holding, Plan
from ..progress import Progress

if TYPE_CHECKING:
    from ..pipeline import Source
    from ..runtimes.base import Runtime, RuntimeInfo


@dataclass(frozen=True)
class BundleLoad:
    """A bundle loaded as its bundle.json plans it (`imgtool load`): the directory, its checked index, and whether
    every platform is loaded (`--all-platforms`)."""

    dir: Path
    index: BundleIndex
    all_platforms: bool = False


@dataclass(frozen=True)
class Landing:
    """A runtime destination's planned data (pipeline.Holding.destination): the load (bundle.landing.LoadPlan: the
    images, their IDs, what the runtime holds) and the archive's members at their offsets."""

    load: LoadPlan
    slots: Tuple[layout.Slot, ...]
    tar_size: int


class RuntimeDestination:
    def __init__(self, runtime: "Runtime", progress: Progress, *, tags: Sequence[str] = (),
                 arch: Optional[str] = None, force: bool = False, pin: bool = True,
                 facts: Optional["RuntimeInfo"] = None, bundle: Optional[BundleLoad] = None,
                 prefer: Sequence[Digest] = (), reused: FrozenSet[Digest] = frozenset()):
        self.runtime, self.progress, self.tags, self.arch, self.force, self.pin = (runtime, progress, tags, arch,
                                                                                   force, pin)
        self.bundle = bundle
        self.prefer = {d: i for i, d in enumerate(prefer)}  # the order the source hands blobs over in (a forward read)
        # layers the runtime holds by digest (traits.reuses_blobs) that the archive leaves out: a delta's modelcar
        self.reused = reused
        self.facts = facts if facts is not None else runtime.info()
        self.what = self.facts.title
        self.warnings: List[str] = []
        self.sent = 0

    def plan(self, images: Sequence[PulledImage]) -> "Holding[Landing]":
        """What earlier runs left removed; the runtime's platform of each tag (as load chooses) and what it holds
        already (an image held whole: every blob held, nothing is read); raises UsageError, DaemonError."""
        for said in self.runtime.remove_debris():  # before the space is counted: what they held is free again
            self.progress.warn(said)
        if self.bundle is not None:
            load = plan_load(self.bundle.index, self.runtime, self.facts, self.tags, self.arch,
                             self.bundle.all_platforms)
            replace = outgoing_meta(self.bundle.index, load.view.images, load.others, self.facts.traits.digest_names)
            members = [dataclasses.replace(m, size=len(replace[m.name]), content=replace[m.name],
                                           digest=Digest.of(replace[m.name])) if m.name in replace else m
                       for m in layout.members(list(load.view.images) + list(load.others), load.view.legacy_names)]
            slots, tar_size = layout.arrange(members)
            return self._holding(load, [], slots, tar_size)
        every = BundleIndex("", __version__, tuple(_leave_out(bundle_images(images), self.reused)),
                            Archive("", "none", 0, "", 0), ())
        load = plan_load(every, self.runtime, self.facts, self.tags, self.arch, False)
        chosen = {im.manifest_digest for im in load.view.images}
        images = [im for im in images if im.manifest_digest in chosen]
        members = layout.members(load.view.images)
        if self.prefer:  # the source's order first (a bundle's modelcar layers: its archive's), the rest by name
            members.sort(key=lambda m: self.prefer.get(m.digest, -1))
        slots, tar_size = layout.arrange(members)
        load = dataclasses.replace(load, view=dataclasses.replace(
            load.view, archive=Archive("", "none", tar_size, "", tar_size)))
        return self._holding(load, images, slots, tar_size)

    def _holding(self, load: LoadPlan, images: Sequence[PulledImage], slots: List[layout.Slot],
                 tar_size: int) -> "Holding[Landing]":
        # what is read from the source: every member but those imgtool makes (index.json, an OCI twin manifest)
        blobs = tuple(p.member.digest for p in slots if p.member.content is None)
        # the runtime holds every image whole: every blob is held, nothing is read (nor downloaded)
        held: FrozenSet[Digest] = frozenset(blobs) if load.loaded else frozenset()
        diff_ids = not (self.facts.checks_diff_ids or self.facts.reports_applied_diff_ids)
        return Holding(tuple(images), blobs, held, Landing(load, tuple(slots), tar_size), diff_ids=diff_ids)

    def before(self, plan: "Plan[Landing]") -> None:
        """What the runtime can take of what is sent (space, zstd, storage), a delta's base there; warns of those
        and of a foreign architecture; raises ImgtoolError. Nothing for an image held whole."""
        load = plan.destination.load
        if load.loaded:
            self.warnings = arch_warnings(load.view, self.facts.arch, self.facts.title)
            return
        if self.bundle is not None:
            self.warnings = before_sending(self.bundle.dir, self.bundle.index, self.runtime, self.facts, load,
                                           self.force)
        else:
            self.warnings = check_room(load.view, self.runtime, self.facts, self.force)
        self.warnings += arch_warnings(load.view, self.facts.arch, self.facts.title)
        for w in self.warnings:
            self.progress.warn(w)

    def write(self, plan: "Plan[Landing]", source: "Source") -> List[LoadedImage]:
        """The archive streamed into the runtime and landed; raises what the source raised (nothing registered
        stays), DaemonError."""
        load, slots, tar_size = plan.destination.load, list(plan.destination.slots), plan.destination.tar_size
        if load.loaded:
            return landed(self.runtime, self.facts, load, self.progress, self.pin)
        small: Dict[Digest, bytes] = {im.manifest_digest: im.manifest_bytes for im in plan.images}
        small.update({im.image_id: im.config_bytes for im in plan.images})
        outgoing = list(load.view.images) + list(load.others)
        platforms = tuple(sorted({str(im.platform) for im in outgoing}))

        def send() -> int:
            with self.progress.bar(tar_size, f"loading into {self.facts.runtime}") as bar:
                def held_back() -> Iterator[bytes]:
                    held: List[bytes] = []  # from the latest member data on: what goes out last
                    for data, is_data in layout.pieces(slots, tar_size, small,
                                                       lambda m: source.chunks(m.digest, m.size, m.what)):
                        if is_data:
                            yield from held
                            held = []
                        held.append(data)
                        self.sent += len(data)
                        bar.update(len(data))
                    source.settle()  # every deferred check (a bundle's digests, parts, trailer) before the last bytes
                    yield from held
                    self.progress.note(f"sent; {self.facts.title} is registering the layers ...")

                # the images named, so that what a load cut short leaves is known for imgtool's (containerd)
                self.runtime.load_archive(held_back(), platforms,
                                          images=[(im.ref, image_id) for im, image_id in load.loading])
            return self.sent

        images, _ = land(self.runtime, self.facts, load, send, self.progress, self.pin)
        return images

    def abort(self) -> None:
        """`land` removes what a failed load registered; before it, nothing was."""



def _leave_out(images: Sequence[BundleImage], reused: FrozenSet[Digest]) -> List[BundleImage]:
    """The images with each layer in `reused` marked omitted: not in the archive (the runtime holds the blob)."""
    return [dataclasses.replace(im, layers=tuple(dataclasses.replace(x, omitted=True) if x.digest in reused else x
                                                 for x in im.layers)) for im in images]
