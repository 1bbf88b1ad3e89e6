"""`imgtool doctor [DIR]`: a checklist for the offline host, each failure with what to do.

Checks the runtimes (Docker, containerd, Podman: each found, its version, storage or snapshotter,
namespace, free space where its images land, against the bundle's need when DIR is given), on a
Kubernetes node the kubelet's runtime (and whether the choice sends images elsewhere) and its image
GC thresholds against the image filesystem's use, the architecture (against the bundle's),
unpigz (dockerd uses it to decompress layers), zstd layers against Docker's version, and the OS
(Kylin: vllm-ascend FAQ 19, zstd layers on Docker before 23.0).
The models placed on this host (issue 48: the Hugging Face cache, ModelScope's, and a plain directory when named),
each with its revision, commit and size, a failure when a file is missing or of another size than the listing its
placement wrote, a warning when it is not read-only.
What loads of imgtool's cut short left in a runtime (Podman's temporaries and imgtool's archive copy, containerd's
import lease, an image left half-loaded) is listed, each with what removes or finishes it.
Reads only; never loads anything, nor creates anything (Podman's storage is not asked for when it is not
there yet: any podman command but `--version` would create it).
"""

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

import os

from .bundle.hostcheck import Check, held_chains, need_for, space_check, storage_check, zstd_check
from .errors import DaemonError, ImgtoolError
from .model import Platform, format_size
from .runtimes.base import Debris, RuntimeInfo
from .runtimes.choice import ROOMS, Choice, open_runtime

if TYPE_CHECKING:
    from .bundle.format import BundleIndex
    from .runtimes.kubelet import Kubelet
    from .runtimes.base import Runtime

def runtime_checks(checks: List[Check], index: Optional["BundleIndex"], choice: Choice) -> List[RuntimeInfo]:
    """A line per runtime asked about (each of Docker, containerd, Podman with "auto"), and for each found
    its storage, free space and zstd lines against `index`; returns the facts of those found, in the
    order `load --runtime auto` tries them. A runtime that is not there fails only when none is."""
    from dataclasses import replace

    names = choice.asked()
    found: List[RuntimeInfo] = []
    absent: List[Check] = []
    for name in names:
        try:
            runtime = open_runtime(replace(choice, runtime=name), timeout=15, create=False)  # doctor creates nothing
            try:
                facts = runtime.info()
                held = _held(runtime) if index is not None and facts.local else frozenset()
                left = _debris(runtime)
            finally:
                runtime.close()
        except ImgtoolError as e:
            absent.append(Check(name, "fail", e.message, ROOMS[name].absent_advice))
            continue
        found.append(facts)
        checks.append(Check(name, "ok", _describe(facts)))
        zstd = zstd_check(index, facts) if index is not None else None
        if zstd is not None:
            checks.append(zstd)
        checks.append(storage_check(facts))
        checks.append(space_check(facts, index, held_chains=held))
        checks.extend(Check(name, "warn", f"{d.what}", d.advice) for d in left)
    for check in absent:
        if found and not (choice.follows_kubelet and choice.loads_into(check.name)):
            check = Check(check.name, "info", check.detail)  # another runtime is here: this one's absence is a fact
        checks.append(check)
    if choice.follows_kubelet and choice.kubelet is not None:  # auto loads into the kubelet's runtime, and no other
        found.sort(key=lambda f: not choice.loads_into(f.runtime))
        if found and choice.loads_into(found[0].runtime):
            checks.append(Check("runtime", "ok", f"imgtool load uses {_describe(found[0])} (--runtime auto: "
                                                 f"the kubelet's, from {choice.kubelet.source})"))
    elif found and choice.runtime == "auto":
        checks.append(Check("runtime", "ok", f"imgtool load uses {_describe(found[0])} (--runtime auto)"))
    return found


def kubelet_checks(checks: List[Check], choice: Choice, found: List[RuntimeInfo], index: Optional["BundleIndex"]) -> None:
    """On a Kubernetes node: the kubelet's runtime, a warning when the choice sends images elsewhere, and the
    image filesystem's use against the kubelet's image GC thresholds."""
    k = choice.kubelet
    if k is None:
        return
    theirs = [f for f in found if choice.kubelet_uses(f.runtime)]
    if choice.elsewhere():
        checks.append(Check("kubelet", "warn", choice.elsewhere(),
                            "Pods on this node will not find the images there: leave --runtime at auto (and --address, "
                            "--namespace, CONTAINERD_ADDRESS, CONTAINERD_NAMESPACE unset) to load where the kubelet looks"))
    elif choice.follows_kubelet and not theirs:
        checks.append(Check("kubelet", "fail", f"the kubelet uses {k.describe()}, which does not answer",
                            "start it; imgtool load --runtime auto loads only there"))
    else:
        checks.append(Check("kubelet", "ok", f"the kubelet uses {k.describe()}"))
    if theirs:
        checks.append(image_gc_check(theirs[0], k, index))


def image_gc_check(facts: RuntimeInfo, k: "Kubelet", index: Optional["BundleIndex"]) -> Check:
    """The image filesystem's use (where the runtime keeps images) against imageGCHighThresholdPercent."""
    where = k.gc_source or "the kubelet's default"
    gc = f"the kubelet's image GC removes unused images above {k.gc_high}% (imageGCHighThresholdPercent, {where}) " \
         f"down to {k.gc_low}%"
    if not facts.local or not facts.root_dir or not os.path.isdir(facts.root_dir):
        return Check("image-gc", "info", f"cannot read the image filesystem's use from here; {gc}")
    st = os.statvfs(facts.root_dir)
    total = st.f_blocks * st.f_frsize
    used = total - st.f_bavail * st.f_frsize
    if total <= 0:
        return Check("image-gc", "info", f"cannot read the image filesystem's use under {facts.root_dir}; {gc}")
    now = 100 * used // total
    after = ""
    if index is not None:
        need = need_for(index, facts, frozenset(), None)
        later = 100 * (used + need.total) // total
        after = f", about {later}% with this bundle loaded"
        now = max(now, later)
    pinned = f"; imgtool pins what it loads ({facts.title} 1.7+ reports it pinned, and the GC leaves it)" \
        if facts.traits.pins_for_kubelet else f"; {facts.title} cannot pin an image for the kubelet"
    detail = f"image filesystem {facts.root_dir}: {100 * used // total}% used{after}; {gc}{pinned}"
    if now >= k.gc_high:
        return Check("image-gc", "warn", detail, "free space there, or the kubelet will remove unpinned images no "
                     "running container uses (an air-gapped node cannot pull them back)")
    return Check("image-gc", "ok", detail)


def _held(runtime: "Runtime") -> frozenset:
    """The layer chains the runtime holds (not unpacked again by a load); none when it cannot list them."""
    try:
        return held_chains(runtime)
    except DaemonError:
        return frozenset()


def _debris(runtime: "Runtime") -> List[Debris]:
    """What loads of imgtool's cut short left in the runtime (read only: the next load removes it); none when it
    cannot be listed."""
    try:
        return runtime.debris()
    except DaemonError:
        return []


def _describe(facts: RuntimeInfo) -> str:
    return facts.traits.describe(facts)


def model_checks(models_dir: Optional[str] = None) -> List[Check]:
    """A line per placed model (every snapshot in the HF cache) with its size, and what is wrong with it; one
    `models` line when none is placed, naming where doctor looked."""
    from .fsutil import tree_size
    from .placed import WHERE, cache_root, placed_models, staging_left

    places = [("hf", cache_root("hf")), ("modelscope", cache_root("modelscope"))]
    if models_dir is not None:
        places.append(("dir", Path(models_dir)))
    checks: List[Check] = []
    for target, root in places:
        for m in placed_models(target, root):
            detail = m.describe() + ("" if m.checked else " (no listing from a placement: sizes not checked)")
            if not m.problems:
                checks.append(Check("model", "ok", detail))
                continue
            broken = [p for p in m.problems if not p.startswith("not read-only")]
            advice = (f"place it again: imgtool load BUNDLE (a bundle that holds {m.ref})" if broken else
                      f"chmod -R a-w {m.folder} (a file that can be written can change under the server unnoticed); "
                      f"imgtool load places models read-only")
            checks.append(Check("model", "fail" if broken else "warn", f"{detail}: {'; '.join(m.problems)}", advice))
        for left in staging_left(target, root):
            checks.append(Check("model", "warn", f"{left} ({format_size(tree_size(str(left)))}) is what a stopped "
                                                 f"placement left", "the next imgtool load of that model resumes or "
                                                                    "removes it"))
    if not checks:
        where = ", ".join(f"{WHERE[t]} ({root})" for t, root in places)
        checks.append(Check("models", "info", f"none placed in {where}",
                            "imgtool load BUNDLE places the models a bundle holds"))
    return checks


def read_os_release(path: Path = Path("/etc/os-release")) -> Dict[str, str]:
    out: Dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            out[key.strip()] = value.strip().strip('"').strip("'")
    return out


def os_check(os_release: Path = Path("/etc/os-release")) -> Check:
    rel = read_os_release(os_release)
    name = rel.get("PRETTY_NAME") or rel.get("NAME") or "unknown Linux"
    ids = " ".join((rel.get("ID", ""), rel.get("ID_LIKE", ""), rel.get("NAME", ""))).lower()
    if "kylin" in ids:
        return Check("os", "info", f"{name} (Kylin)",
                     "vllm-ascend FAQ 19: if Docker says `invalid tar header`, it met a zstd-compressed layer, "
                     "which Docker reads only from 23.0 on: bring the image with gzip layers (imgtool fetch writes "
                     "them by default, --layers compat), or upgrade Docker; a wrong architecture shows only at `docker run`, "
                     "as `exec format error`")
    return Check("os", "ok", name)


def run_checks(bundle_dir: Optional[str] = None, os_release: Path = Path("/etc/os-release"),
               choice: Optional[Choice] = None, models_dir: Optional[str] = None) -> List[Check]:
    """Every check, in order; never raises for a failed check (it becomes a `fail` line). The runtime
    checks are of `choice`'s runtime, or with "auto" of every runtime found (the first is the one
    `load` would use: its facts decide the arch and pigz lines)."""
    from .bundle.reader import read_index, stat_parts

    checks: List[Check] = []
    index = None
    if bundle_dir is not None:
        try:
            index, _ = read_index(Path(bundle_dir))
            problems = stat_parts(Path(bundle_dir), index)
            refs = ", ".join(im.ref for im in index.images)
            if problems:
                checks.append(Check("bundle", "fail", "; ".join(p.message for p in problems),
                                    f"then run: imgtool verify {bundle_dir}"))
            else:
                checks.append(Check("bundle", "ok", f"{refs}: {len(index.parts)} part(s), "
                                    f"{format_size(index.archive.size)} ({index.archive.compression}); "
                                    f"sizes only, `imgtool verify {bundle_dir}` checks every byte"))
        except ImgtoolError as e:
            checks.append(Check("bundle", "fail", e.message, e.hint or ""))

    choice = choice or Choice()
    found = runtime_checks(checks, index, choice)
    kubelet_checks(checks, choice, found, index)
    facts = found[0] if found else None
    host_arch = facts.arch if facts is not None else Platform.host().architecture
    if index is not None:
        wrong = [f"{im.ref} is {im.platform}" for im in index.images if im.platform.architecture != host_arch]
        if wrong:
            checks.append(Check("arch", "fail", f"this host is linux/{host_arch}; " + "; ".join(wrong),
                                f"fetch the images again with --arch {host_arch}"))
        else:
            checks.append(Check("arch", "ok", f"linux/{host_arch}, as the bundle's images"))
    else:
        checks.append(Check("arch", "info", f"this host is linux/{host_arch}",
                            f"fetch bundles for it with: imgtool fetch TAG --arch {host_arch}"))

    if facts is not None and not facts.local:
        checks.append(Check("pigz", "info", f"the daemon is remote ({facts.host}): unpigz matters on its host"))
    elif shutil.which("unpigz"):
        checks.append(Check("pigz", "ok", f"unpigz at {shutil.which('unpigz')} (dockerd uses it to decompress layers)"))
    else:
        checks.append(Check("pigz", "warn", "unpigz not found: dockerd decompresses layers with its slower "
                            "built-in gzip", "install the pigz package from the OS media (yum install pigz, "
                            "apt install pigz)"))
    checks.append(os_check(os_release))
    checks.extend(model_checks(models_dir))
    return checks


