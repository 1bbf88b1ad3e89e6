"""`imgtool load`: the pipeline's bundle → runtime. The bundle checked before the runtime is asked anything (the
signature policy, bundle.json against SHA256SUMS and --expect, every part at its size; space, zstd and a delta's
base against the runtime), then streamed as one checked stream (ends/bundle_stream.py) into the runtime destination
(ends/runtime_dest.py), which lands it as every load into a runtime does (bundle/landing.py `land`).

One pass over the parts and never a copy on disk. On the way: every part's sha256, every tar header
byte-identical to the one bundle.json implies (the runtime is sent those headers, so a crafted member never
reaches it), every member's data hashed against its digest, padding and trailer zeros. The last member bytes
are held back until all of that matched; on any deviation the upload is cut short. Docker unpacks an upload
into a temporary directory and registers nothing before the archive is complete, so it drops a cut upload:
nothing is loaded. Then the whole bundle is checked as `imgtool verify` would, to name every damaged part.
Layer diff_ids are not recomputed for Docker and containerd (that means decompressing every layer, about as
long as their own load): they check them and load nothing when one differs; `imgtool verify` checks them
offline. Podman does not check them: its storage records the digest it computed while applying each layer, so
after a Podman load imgtool compares those with the config's and removes the image on a mismatch; where those
records cannot be read, every layer is decompressed and hashed while it streams instead. containerd reads the
whole archive into its content store before it records an image, and the Podman room writes the checked archive
whole before Podman reads it: on both, as on Docker, a cut stream records nothing (and their rooms remove what
they kept of it). Python 3.7: the pyz loads through this.
"""

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple

from .bundle.format import Archive, BundleIndex, bundle_images
from .bundle.landing import Applied, Cut, LoadResult, plan_load
from .bundle.reader import read_index
from .bundle.signature import enforce
from .bundle.verify import VerifyReport, check_before, deep_check
from .ends.bundle_stream import ArchiveSource
from .ends.model_dest import ModelChoice, ModelDestination
from .ends.modelcar_source import ModelcarSource
from .ends.runtime_dest import BundleLoad, RuntimeDestination
from .errors import DaemonError, ImgtoolError, UsageError, VerifyError
from .model import Digest, PulledImage
from .pipeline import copy
from .progress import Progress
from .trust import Verdict

if TYPE_CHECKING:
    from .pipeline import Plan
    from .placer import Placed
    from .runtimes.base import Runtime, RuntimeInfo

EACH_TO_ITS_CACHE = ModelChoice()  # an hf: model into the Hugging Face cache, a modelscope: one into ModelScope's


def load_bundle(bundle_dir: Path, daemon: Optional["Runtime"], *, tags: Sequence[str] = (),
                expect: Optional[str] = None, force: bool = False, quick: bool = False, progress: Progress,
                jobs: Optional[int] = None, arch: Optional[str] = None, signers: Optional[str] = None,
                all_platforms: bool = False, pin: bool = True,
                models: Optional[ModelChoice] = EACH_TO_ITS_CACHE, model_images: bool = False,
                images: bool = True) -> LoadResult:
    """Check the bundle, stream it into the runtime checking it on the way; tag and confirm by image ID.

    Of a tag held for several platforms, the runtime's (or `arch`'s) is loaded and named; with
    `all_platforms` every platform's image is loaded too, kept by ID (on containerd, which keeps only
    named images, by digest: REPO@sha256:...) while the tag names the runtime's.
    When the runtime already holds every image, nothing is sent, but the bundle is checked all the same
    (every part and blob; with quick, every part present at its size) before a tag is added. "Holds" means
    all of it: an image containerd recorded but did not unpack (a killed load) is unpacked now, and one
    whose blobs are missing is imported again. With `pin` (the default), each image is pinned where the
    runtime can (containerd's CRI label), so the kubelet's image GC leaves it.
    The bundle's models are placed as `models` says (None: none is): their members, after the images', are read
    from the same forward read as the images (the runtime is sent the images only), staged and checked, and made
    visible once the whole bundle was checked and the images loaded. `daemon` None: the models only (a bundle
    without images needs no runtime). With `model_images`, each model is imported into the runtime as its modelcar
    image instead (ends/modelcar_source.py: streamed from the raw files, the runtime's platform, named
    models.local/HUB/org/name:COMMIT-modelcar, pinned and unpacked as images are), after the images; `images`
    False: the modelcars only.
    Raises UsageError, VerifyError (nothing was loaded, tagged or placed; SignatureError, before Docker is
    asked anything, when the signature policy refuses the bundle), ImgtoolError (not enough space,
    incompatible Docker, a delta bundle's base missing), DaemonError.
    """
    started = time.monotonic()
    bundle_dir = Path(bundle_dir)
    jobs = jobs or os.cpu_count() or 2
    index, raw = read_index(bundle_dir)
    verdict = enforce(bundle_dir, raw, signers, doing="load")
    placing = None if model_images else ModelDestination(index, models, progress) if models is not None and \
        index.models else None
    if model_images:
        assert daemon is not None, "a modelcar is imported into a runtime"
        return _load_with_modelcars(bundle_dir, index, raw, verdict, daemon, images, started, tags=tags,
                                    expect=expect, force=force, quick=quick, progress=progress, jobs=jobs, arch=arch,
                                    all_platforms=all_platforms, pin=pin)
    if daemon is None:
        placed = _place_only(bundle_dir, index, raw, verdict, expect, quick, placing, progress, jobs)
        return LoadResult(bundle_dir, [], False, {"runtime": None}, seconds=time.monotonic() - started,
                          signature=verdict, models=placed)
    try:
        result = _load(bundle_dir, index, raw, verdict, daemon, placing, tags=tags, expect=expect, force=force,
                       quick=quick, progress=progress, jobs=jobs, arch=arch, all_platforms=all_platforms, pin=pin)
        if placing is not None:
            if placing.moves and not placing.staged:  # the runtime held every image: the models' own pass
                _stage_checked(bundle_dir, index, placing, None, progress, jobs)
            result.models = placing.commit()
    finally:
        if placing is not None:
            placing.release()
    result.seconds = time.monotonic() - started
    return result


def _load_with_modelcars(bundle_dir: Path, index: BundleIndex, raw: bytes, verdict: Verdict, daemon: "Runtime",
                         images: bool, started: float, *, tags: Sequence[str], expect: Optional[str], force: bool,
                         quick: bool, progress: Progress, jobs: int, arch: Optional[str], all_platforms: bool,
                         pin: bool) -> LoadResult:
    """The images (unless not `images`), then each model's modelcar image, from one more forward read of the bundle
    when one moves (that read checks the whole archive: the images' pass then checks only their part). A damaged
    part is named as for placement (VerifyError, exit 3) and the runtime registers no modelcar."""
    facts = daemon.info()
    source = ModelcarSource(bundle_dir, index, arch or facts.arch, jobs)
    reused = _reused_layers(bundle_dir, source, daemon, facts)
    destination = RuntimeDestination(daemon, progress, force=force, pin=pin, facts=facts, prefer=source.order,
                                     reused=reused)
    moves = not _modelcars_held(source, daemon, facts)
    if images and index.images:
        result = _load(bundle_dir, index, raw, verdict, daemon, None, tags=tags, expect=expect, force=force,
                       quick=quick, progress=progress, jobs=jobs, arch=arch, all_platforms=all_platforms, pin=pin,
                       later=moves)
    else:
        report = check_before(bundle_dir, index, raw, verdict, expect, not moves and not quick, progress, jobs)
        for w in report.warnings:
            progress.warn(w)
        result = LoadResult(bundle_dir, [], False, facts.to_json(), signature=verdict)
    if moves:
        progress.note(f"importing {len(index.models)} model(s) into {facts.title} as modelcar images ...")
    try:
        copied = copy(source, destination)
    except (VerifyError, Cut) as e:
        if source.stream is None:
            raise
        progress.note(f"stopped importing the modelcars: {e}; checking the whole bundle ...")
        raise _named(bundle_dir, index, VerifyReport(bundle_dir, index, ""), e, progress, jobs, False) from e
    finally:
        source.finish()
    result.modelcars = copied.result
    result.modelcars_sent = moves
    result.seconds = time.monotonic() - started
    return result


def _reused_layers(bundle_dir: Path, source: ModelcarSource, daemon: "Runtime", facts: "RuntimeInfo"
                   ) -> FrozenSet[Digest]:
    """The layers of the files a delta bundle left out, which the runtime must hold by digest (a modelcar of the
    base revision holds them where the path is the same) and which a modelcar image it holds records as that file
    (path and sha256: _vouched_layers); raises UsageError (a runtime whose import needs every layer), ImgtoolError
    (one it lacks: a file renamed since the base, the base modelcar not there, or a layer digest that is not the
    file's: bundle.json names whatever the inventory the delta was fetched against claimed, and an inventory
    crosses the gap unsigned)."""
    wanted = {d: v for d, v in source.reused.items() if d not in source.has()}
    if not wanted:
        return frozenset()
    if not facts.traits.reuses_blobs:
        raise UsageError(f"--models image: {bundle_dir} is a delta bundle that leaves out files of its models, and "
                         f"{facts.title} is sent every layer of an image (only containerd reuses a layer it holds by digest)",
                         hint="load --models image of a delta bundle needs containerd (which holds the base "
                              "revision's modelcar layers by digest); or place the files: --models hf (or "
                              "--models modelscope, --models-dir DIR)")
    vouched = _vouched_layers(daemon)
    held = {d for d in daemon.held_blobs(wanted) if (wanted[d][1].path, wanted[d][1].sha256) in vouched.get(d, ())}
    missing = sorted(set(wanted) - held, key=lambda d: (wanted[d][0].ref, wanted[d][1].path))
    if missing:
        model, f = wanted[missing[0]]
        raise ImgtoolError(f"refusing to load: {bundle_dir} is a delta bundle that leaves out {f.path} of {model.ref}"
                           f", and {facts.title} holds no modelcar layer of it at that path"
                           + (f" ({len(missing)} such files)" if len(missing) > 1 else ""),
                           hint="load the modelcar of the revision the delta was fetched against first (a file "
                                "renamed since then needs its bytes: fetch a full bundle), or place the files: "
                                "--models hf (or --models modelscope, --models-dir DIR)")
    return frozenset(wanted)


def _vouched_layers(daemon: "Runtime") -> Dict[Digest, Set[Tuple[str, Digest]]]:
    """Each layer of the modelcar images the runtime holds (whatever their names: every layer annotated with its path
    and sha256, modelcar.files_of), with the (path, sha256) its image's manifest annotates it with: what imgtool
    recorded when it imported that image (the new files' layers framed from bytes checked against
    their sha256, the reused ones vouched for here the same way). Raises DaemonError."""
    from . import modelcar

    out: Dict[Digest, Set[Tuple[str, Digest]]] = {}
    for im in daemon.inventory():
        if im.documents is None:
            continue
        try:
            files = modelcar.files_of(im.documents[0])
        except (ValueError, UsageError):
            continue  # not a modelcar imgtool framed (a layer without both annotations): it vouches for nothing
        for path, sha256, layer in files:
            out.setdefault(layer, set()).add((path, sha256))
    return out


def _modelcars_held(source: ModelcarSource, daemon: "Runtime", facts: "RuntimeInfo") -> bool:
    """The runtime holds every modelcar whole (as a load finds an image held: by the ID it gives it, every blob
    there; what is recorded but not unpacked is finished by the load, not sent again)."""
    every = BundleIndex("", "", tuple(bundle_images(source.images())), Archive("", "none", 0, "", 0), ())
    return plan_load(every, daemon, facts, (), None, False).loaded


def _load(bundle_dir: Path, index: BundleIndex, raw: bytes, verdict: Verdict, daemon: "Runtime",
          placing: Optional[ModelDestination], *, tags: Sequence[str], expect: Optional[str], force: bool,
          quick: bool, progress: Progress, jobs: int, arch: Optional[str], all_platforms: bool,
          pin: bool, later: bool = False) -> LoadResult:
    started = time.monotonic()
    destination = RuntimeDestination(daemon, progress, tags=tags, arch=arch, force=force, pin=pin,
                                     bundle=BundleLoad(bundle_dir, index, all_platforms))
    source = _CheckedBundle(bundle_dir, index, raw, verdict, expect, quick or later, progress, jobs, placing)
    facts = destination.facts
    try:
        copied = copy(source, destination)
    except DaemonError as e:
        if not daemon.left_behind():
            raise
        # the runtime stopped answering before the load could remove what it left: the next load finishes it
        raise DaemonError(e.message, hint=f"once {facts.title} answers again, run imgtool load {bundle_dir} again: it "
                                         "finishes what this load left (imgtool doctor lists it)") from e
    except (VerifyError, Cut) as e:
        if source.report is None or source.stream is None:
            raise  # refused before a byte was sent (check_before names every problem)
        # The upload was cut short and the runtime dropped it (or what it applied was refused and removed);
        # name every damaged part, as verify would.
        done = "refused what was loaded" if isinstance(e, Applied) else "stopped the upload"
        progress.note(f"{done}: {e}; checking the whole bundle ...")
        raise _named(bundle_dir, index, source.report, e, progress, jobs, not facts.checks_diff_ids) from e
    finally:
        source.finish()
    report = source.report
    assert report is not None
    sent = not copied.plan.destination.load.loaded
    if sent:
        warnings = destination.warnings + list(report.warnings)
        return LoadResult(bundle_dir, copied.result, True, facts.to_json(), report.unpacked_size, destination.sent,
                          time.monotonic() - started, warnings, verdict)
    return LoadResult(bundle_dir, copied.result, False, facts.to_json(), seconds=time.monotonic() - started,
                      warnings=list(report.warnings) + destination.warnings, signature=verdict)


def _place_only(bundle_dir: Path, index: BundleIndex, raw: bytes, verdict: Verdict, expect: Optional[str],
                quick: bool, placing: Optional[ModelDestination], progress: Progress, jobs: int) -> List["Placed"]:
    """The models of the bundle, no runtime (a bundle without images, or --models-only): checked before (every part
    at its size, SHA256SUMS, --expect; the whole bundle when no model moves), then one pass placing them."""
    moves = placing is not None and placing.moves
    report = check_before(bundle_dir, index, raw, verdict, expect, not moves and not quick, progress, jobs)
    for w in report.warnings:
        progress.warn(w)
    if placing is None:
        return []
    try:
        if moves:
            _stage_checked(bundle_dir, index, placing, report, progress, jobs)
        return placing.commit()
    finally:
        placing.release()


def _stage_checked(bundle_dir: Path, index: BundleIndex, placing: ModelDestination, report: Optional[VerifyReport],
                   progress: Progress, jobs: int) -> None:
    """One forward read of the bundle staging the models (every byte checked: the archive's headers, digests, trailer;
    each file by the placer); a deviation is named as verify would (raises VerifyError: nothing placed)."""
    try:
        with ArchiveSource(bundle_dir, index, jobs=jobs) as stream:
            placing.stage(stream.archive)
            stream.settle()
    except (VerifyError, Cut) as e:
        progress.note(f"stopped placing: {e}; checking the whole bundle ...")
        if report is None:
            report = VerifyReport(bundle_dir, index, "")
        raise _named(bundle_dir, index, report, e, progress, jobs, False) from e


def _named(bundle_dir: Path, index: BundleIndex, report: VerifyReport, e: Exception, progress: Progress, jobs: int,
           diff_ids: bool) -> VerifyError:
    """The refusal of a load whose stream deviated: the whole bundle checked as verify would, every damaged part
    named."""
    deep_check(bundle_dir, index, report, progress, jobs, diff_ids=diff_ids)
    report.raise_if_bad("load")
    return VerifyError(f"refusing to load: {bundle_dir}: {e} while loading, but not when checked again "
                       "(is something changing the bundle?); nothing was loaded")


class _CheckedBundle:
    """The bundle as load's source: checked as `check_before` checks it once what moves is known (the whole bundle
    when nothing will be streamed, and so checked on the way, unless `quick`), then read as one checked stream
    (ends/bundle_stream.py), hashing the layers' diff_ids where the runtime asks (Plan.diff_ids)."""

    def __init__(self, bundle_dir: Path, index: BundleIndex, raw: bytes, verdict: Verdict, expect: Optional[str],
                 quick: bool, progress: Progress, jobs: int, placing: Optional[ModelDestination] = None):
        self.dir, self.index, self.raw, self.verdict, self.expect, self.quick = (bundle_dir, index, raw, verdict,
                                                                                 expect, quick)
        self.progress, self.jobs, self.placing = progress, jobs, placing
        self.what = f"bundle {bundle_dir.name}"
        self.report: Optional[VerifyReport] = None
        self.stream: Optional[ArchiveSource] = None
        self._has = frozenset(d for im in index.images for d in [im.manifest_digest, im.image_id]
                              + [x.digest for x in im.layers if not x.omitted])

    def images(self) -> List[PulledImage]:
        return []  # the runtime destination plans from bundle.json (BundleLoad)

    def has(self) -> FrozenSet[Digest]:
        return self._has

    def start(self, plan: "Plan[Any]") -> None:
        """The bundle checked before the runtime sees a byte; the stream opened when something moves."""
        models = self.placing is not None and self.placing.moves  # then checked by the models' pass
        self.report = check_before(self.dir, self.index, self.raw, self.verdict, self.expect,
                                   not plan.moves and not self.quick and not models, self.progress, self.jobs)
        if plan.moves:  # nothing sent: the command says the warnings with the result
            for w in self.report.warnings:
                self.progress.warn(w)
            self.stream = ArchiveSource(self.dir, self.index, diff_ids=plan.diff_ids, jobs=os.cpu_count() or 2)

    def _open(self) -> ArchiveSource:
        assert self.stream is not None, "start() opens the stream before a blob is read"
        return self.stream

    def path(self, digest: Digest) -> None:
        return None

    def chunks(self, digest: Digest, size: int, what: str) -> Iterator[bytes]:
        return self._open().chunks(digest, size, what)

    def settle(self) -> None:
        """The models staged from the stream (their members follow the images'), then the rest of the archive checked,
        before the runtime gets the images' last bytes: a deviation anywhere loads and places nothing. When no model is
        placed, the images' part only is read."""
        if self.placing is not None and self.placing.moves:
            self.placing.stage(self._open().archive)
        elif self.index.models:  # no model is placed (--no-models, or each placed already): none of their bytes read
            self._open().settle_images()
            return
        self._open().settle()

    def cancel(self) -> None:
        self.finish()

    def finish(self) -> None:
        if self.stream is not None:
            self.stream.finish()
