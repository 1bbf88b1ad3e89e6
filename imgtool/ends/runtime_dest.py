"""A container runtime (Docker, containerd, Podman: a `runtimes.base.Runtime`) as a pipeline destination: the
images it lacks are sent as the docker-archive `bundle.layout` arranges them (the headers a bundle's archive has),
each blob read through the source's `chunks`, the last member bytes held back until the source settled every
check (`settle`: a deviation cuts the stream and the runtime, which registers nothing before an archive is
complete, drops it), then landed as every load lands (`bundle.landing.land`: unpacked, named, confirmed by ID, named
by digest on containerd, pinned for the kubelet; what a failed load registered removed).

Two pairs end here: registry → runtime (`imgtool copy registry:REF runtime:`: `plan` chooses and checks, from the
images alone) and bundle → runtime (`imgtool load`: the bundle's own plan, `for_bundle`, with its delta and
platforms from bundle.json, from the checked stream of ends/bundle_stream.py). Python 3.7.
"""

import dataclasses
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence

from .. import __version__
from ..bundle import layout
from ..bundle.format import Archive, BundleIndex, bundle_images
from ..bundle.landing import LoadedImage, check_room, land, landed, plan_load
from ..model import Digest, PulledImage, foreign_arch_warning
from ..pipeline import Plan
from ..progress import Progress

if TYPE_CHECKING:
    from ..bundle.landing import LoadPlan
    from ..pipeline import Source
    from ..runtimes.base import Runtime, RuntimeInfo


class RuntimeDestination:
    def __init__(self, runtime: "Runtime", progress: Progress, *, tags: Sequence[str] = (),
                 arch: Optional[str] = None, force: bool = False, pin: bool = True,
                 facts: Optional["RuntimeInfo"] = None):
        self.runtime, self.progress, self.tags, self.arch, self.force, self.pin = (runtime, progress, tags, arch,
                                                                                   force, pin)
        self.facts = facts if facts is not None else runtime.info()
        self.what = self.facts.title
        self.warnings: List[str] = []
        self.sent = 0

    def plan(self, images: Sequence[PulledImage]) -> Plan:
        """The runtime's platform of each tag (as load chooses), what it holds already (nothing is read for an
        image it holds whole), and whether it can take the rest (space, zstd); raises UsageError, ImgtoolError,
        DaemonError."""
        every = BundleIndex("", __version__, tuple(bundle_images(images)), Archive("", "none", 0, "", 0), ())
        load = plan_load(every, self.runtime, self.facts, self.tags, self.arch, False)
        chosen = {im.manifest_digest for im in load.view.images}
        images = [im for im in images if im.manifest_digest in chosen]
        slots, tar_size = layout.arrange(layout.members(load.view.images))
        load = dataclasses.replace(load, view=dataclasses.replace(
            load.view, archive=Archive("", "none", tar_size, "", tar_size)))
        if not load.loaded:
            self.warnings = check_room(load.view, self.runtime, self.facts, self.force)
            self.warnings += [w for w in (foreign_arch_warning(im.ref, str(im.platform), self.facts.arch,
                                                               host=self.facts.title) for im in load.view.images) if w]
            for w in self.warnings:
                self.progress.warn(w)
        return self._plan(load, images, slots, tar_size)

    def for_bundle(self, load: "LoadPlan", replace: Dict[str, bytes]) -> Plan:
        """A bundle's own plan (bundle.landing.plan_load, checked by `load`): its images (a delta's left-out layers are
        not sent: the runtime holds them) and further platforms (`--all-platforms`), the archive's index.json /
        manifest.json replaced by `replace` where not every image goes out as the bundle names it."""
        members = [dataclasses.replace(m, size=len(replace[m.name]), content=replace[m.name],
                                       digest=Digest.of(replace[m.name])) if m.name in replace else m
                   for m in layout.members(list(load.view.images) + list(load.others), load.view.legacy_names)]
        slots, tar_size = layout.arrange(members)
        return self._plan(load, [], slots, tar_size)

    @staticmethod
    def _plan(load: "LoadPlan", images: Sequence[PulledImage], slots: List[layout.Slot], tar_size: int) -> Plan:
        layers = tuple(p.member.digest for p in slots if p.member.kind == "layer")
        # the runtime holds every image whole: nothing is read, so nothing is downloaded either
        return Plan(tuple(images), () if load.loaded else layers, frozenset(layers) if load.loaded else frozenset(),
                    {"load": load, "slots": (slots, tar_size)})

    def write(self, plan: Plan, source: "Source") -> List[LoadedImage]:
        """The archive streamed into the runtime and landed; raises what the source raised (nothing registered
        stays), DaemonError."""
        load = plan.extra["load"]
        if load.loaded:
            return landed(self.runtime, self.facts, load, self.progress, self.pin)
        slots, tar_size = plan.extra["slots"]
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

