"""A container runtime (Docker, containerd, Podman: a `runtimes.base.Runtime`) as a pipeline destination: the
images it lacks are sent as the docker-archive `bundle.layout` places them (the same headers a bundle's archive
has), each blob read through the source's `chunks` (checked before its last bytes go out, so a damaged blob cuts
the stream and the runtime registers nothing), then landed as `imgtool load` lands a bundle (`bundle.load.land`:
unpacked, named, confirmed by ID, named by digest on containerd, pinned for the kubelet).

What `imgtool copy registry:REF runtime:` runs on a connected node: no bundle, no copy on disk but the cache's."""

import dataclasses
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from .. import __version__
from ..bundle import layout
from ..bundle.format import Archive, BundleIndex, bundle_images
from ..bundle.load import LoadedImage, check_room, land, landed, plan_load
from ..model import Digest, PulledImage, foreign_arch_warning
from ..pipeline import Plan
from ..progress import Progress

if TYPE_CHECKING:
    from ..pipeline import Blobs
    from ..runtimes.base import Runtime


class RuntimeDestination:
    def __init__(self, runtime: "Runtime", progress: Progress, *, tags: Sequence[str] = (),
                 arch: Optional[str] = None, force: bool = False, pin: bool = True):
        self.runtime, self.progress, self.tags, self.arch, self.force, self.pin = (runtime, progress, tags, arch,
                                                                                   force, pin)
        self.facts = runtime.info()
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
        placed, tar_size = layout.place(layout.members(load.view.images))
        view = dataclasses.replace(load.view, archive=Archive("", "none", tar_size, "", tar_size))
        load = dataclasses.replace(load, view=view)
        if load.loaded:
            return Plan(tuple(images), (), frozenset(), {"load": load})
        self.warnings = check_room(view, self.runtime, self.facts, self.force)
        self.warnings += [w for w in (foreign_arch_warning(im.ref, str(im.platform), self.facts.arch,
                                                           host=self.facts.title) for im in view.images) if w]
        for w in self.warnings:
            self.progress.warn(w)
        order = tuple(p.member.digest for p in placed if p.member.kind == "layer")
        return Plan(tuple(images), order, frozenset(), {"load": load, "placed": (placed, tar_size)})

    def write(self, plan: Plan, source: "Blobs") -> List[LoadedImage]:
        """The archive streamed into the runtime and landed; raises what the source raised (nothing registered
        stays), DaemonError."""
        load = plan.extra["load"]
        if load.loaded:
            return landed(self.runtime, self.facts, load, self.progress, self.pin)
        placed, tar_size = plan.extra["placed"]
        small: Dict[Digest, bytes] = {im.manifest_digest: im.manifest_bytes for im in plan.images}
        small.update({im.image_id: im.config_bytes for im in plan.images})
        platforms = tuple(sorted({str(im.platform) for im in plan.images}))

        def send() -> int:
            with self.progress.bar(tar_size, f"loading into {self.facts.runtime}") as bar:
                def counted():
                    for data in layout.pieces(placed, tar_size, small,
                                              lambda m: source.chunks(m.digest, m.size, m.what)):
                        self.sent += len(data)
                        bar.update(len(data))
                        yield data
                    self.progress.note(f"sent; {self.facts.title} is registering the layers ...")

                self.runtime.load_archive(counted(), platforms)
            return self.sent

        images, _ = land(self.runtime, self.facts, load, send, self.progress, self.pin)
        return images

    def abort(self) -> None:
        """`land` removes what a failed load registered; before it, nothing was."""
