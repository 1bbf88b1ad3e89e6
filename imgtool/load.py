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
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from .bundle.format import BundleIndex
from .bundle.landing import (Applied, Cut, LoadedImage, LoadResult, arch_warnings, before_sending, landed,
                          outgoing_meta, plan_load)
from .bundle.reader import read_index
from .bundle.signature import enforce
from .bundle.verify import VerifyReport, check_before, deep_check
from .ends.bundle_stream import ArchiveSource
from .ends.runtime_dest import RuntimeDestination
from .errors import DaemonError, VerifyError
from .pipeline import copy
from .progress import Progress

if TYPE_CHECKING:
    from .bundle.landing import LoadPlan
    from .runtimes.base import Runtime, RuntimeInfo


def load_bundle(bundle_dir: Path, daemon: "Runtime", *, tags: Sequence[str] = (), expect: Optional[str] = None,
                force: bool = False, quick: bool = False, progress: Progress, jobs: Optional[int] = None,
                arch: Optional[str] = None, signers: Optional[str] = None, all_platforms: bool = False,
                pin: bool = True) -> LoadResult:
    """Check the bundle, stream it into the runtime checking it on the way; tag and confirm by image ID.

    Of a tag held for several platforms, the runtime's (or `arch`'s) is loaded and named; with
    `all_platforms` every platform's image is loaded too, kept by ID (on containerd, which keeps only
    named images, by digest: REPO@sha256:...) while the tag names the runtime's.
    When the runtime already holds every image, nothing is sent, but the bundle is checked all the same
    (every part and blob; with quick, every part present at its size) before a tag is added. "Holds" means
    all of it: an image containerd recorded but did not unpack (a killed load) is unpacked now, and one
    whose blobs are missing is imported again. With `pin` (the default), each image is pinned where the
    runtime can (containerd's CRI label), so the kubelet's image GC leaves it.
    Raises UsageError, VerifyError (nothing was loaded or tagged; SignatureError, before Docker is
    asked anything, when the signature policy refuses the bundle), ImgtoolError (not enough space,
    incompatible Docker, a delta bundle's base missing), DaemonError.
    """
    started = time.monotonic()
    bundle_dir = Path(bundle_dir)
    jobs = jobs or os.cpu_count() or 2
    index, raw = read_index(bundle_dir)
    verdict = enforce(bundle_dir, raw, signers, doing="load")
    for said in daemon.remove_debris():  # before the space is counted: what they held is free again
        progress.warn(said)
    facts = daemon.info()
    plan = plan_load(index, daemon, facts, tags, arch, all_platforms)
    report = check_before(bundle_dir, index, raw, verdict, expect, plan.loaded and not quick, progress, jobs)
    warnings = list(report.warnings) + arch_warnings(plan.view, facts.arch, facts.title)
    if plan.loaded:
        images = landed(daemon, facts, plan, progress, pin)
        return LoadResult(bundle_dir, images, False, facts.to_json(), seconds=time.monotonic() - started,
                          warnings=warnings, signature=verdict)

    warnings = before_sending(bundle_dir, index, daemon, facts, plan, force) + warnings
    for w in warnings:
        progress.warn(w)
    images, sent = _send(bundle_dir, index, daemon, facts, plan, report, progress, jobs, pin)
    return LoadResult(bundle_dir, images, True, facts.to_json(), report.unpacked_size, sent,
                      time.monotonic() - started, warnings, verdict)


def _send(bundle_dir: Path, index: BundleIndex, daemon: "Runtime", facts: "RuntimeInfo", plan: "LoadPlan",
          report: VerifyReport, progress: Progress, jobs: int, pin: bool) -> Tuple[List[LoadedImage], int]:
    """The pipeline's bundle → runtime: the bundle as one checked stream into the runtime destination, landed there
    (`land`). A stream cut short (or what Podman applied, refused) is then checked whole, naming every damaged part
    (VerifyError)."""
    replace = outgoing_meta(index, plan.view.images, plan.others, facts.traits.digest_names)
    destination = RuntimeDestination(daemon, progress, facts=facts, pin=pin)
    try:
        with ArchiveSource(bundle_dir, index, diff_ids=not (facts.checks_diff_ids or facts.reports_applied_diff_ids),
                           jobs=os.cpu_count() or 2) as source:
            copied = copy(source, destination, plan=destination.for_bundle(plan, replace))
        return copied.result, destination.sent
    except DaemonError as e:
        if not daemon.left_behind():
            raise
        # the runtime stopped answering before the load could remove what it left: the next load finishes it
        raise DaemonError(e.message, hint=f"once {facts.title} answers again, run imgtool load {bundle_dir} again: it "
                                         "finishes what this load left (imgtool doctor lists it)") from e
    except (VerifyError, Cut) as e:
        # The upload was cut short and the runtime dropped it (or what it applied was refused and removed);
        # name every damaged part, as verify would.
        done = "refused what was loaded" if isinstance(e, Applied) else "stopped the upload"
        progress.note(f"{done}: {e}; checking the whole bundle ...")
        deep_check(bundle_dir, index, report, progress, jobs, diff_ids=not facts.checks_diff_ids)
        report.raise_if_bad("load")
        raise VerifyError(f"refusing to load: {bundle_dir}: {e} while loading, but not when checked again "
                          "(is something changing the bundle?); nothing was loaded") from e
