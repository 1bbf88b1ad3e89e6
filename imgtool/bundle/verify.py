"""`imgtool verify`: is this bundle directory exactly what the fetch wrote?

Checks bundle.json (format, version, --expect, SHA256SUMS), every part (presence, size,
sha256), and unless quick, every member of the archive (archive.py, strict): blob digests, layer
diff_ids, structure. Every problem is collected and named with the part that holds it.
"""

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..errors import VerifyError
from ..fsutil import NotRegularFile, open_regular
from ..progress import Progress
from ..trust import Verdict
from .format import BUNDLE_JSON, LOAD_SH, LOCK_NAME, README_TXT, SHA256SUMS, SIGNATURE, TOOL_PYZ, BundleIndex, parse_expect
from .signature import enforce
from .archive import walk_archive
from .reader import DAMAGED, Problem, hash_part, part_problem, part_unreadable, read_index, stat_parts


# raise_if_bad's words per verb: (the refusal, what it did not do); any other verb: "bundle failed verification"
REFUSALS = {
    "load": ("refusing to load", "; nothing was loaded"),
    "sign": ("refusing to sign", "; nothing was signed"),
    "serve": ("refusing to serve", "; nothing is served"),
    "copy": ("refusing to copy", "; nothing was written"),
    "push": ("refusing to push", "; nothing was pushed"),
    "base": ("refusing to use the base bundle", "; nothing was written"),  # fetch --base DIR
    "diff": ("refusing to compare", ""),
}


@dataclass
class VerifyReport:
    dir: Path
    index: BundleIndex
    bundle_json_sha256: str
    problems: List[Problem] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    quick: bool = False
    parts_checked: int = 0
    blobs_checked: int = 0
    layers_checked: int = 0
    unpacked_size: Optional[int] = None
    bytes_read: int = 0
    seconds: float = 0.0
    skipped: Optional[str] = None  # why the archive walk did not run
    signature: Optional[Verdict] = None  # bundle.json.sig under the site's policy (signature.enforce)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_bad(self, doing: str = "verify") -> None:
        """Raise VerifyError listing every problem, if there are any."""
        if self.problems:
            n = len(self.problems)
            what, tail = REFUSALS.get(doing, ("bundle failed verification", ""))
            raise VerifyError(f"{what}: {self.dir}: {n} problem{'s' if n != 1 else ''}{tail}",
                              problems=[p.message for p in self.problems])

    def to_json(self) -> dict:
        return {
            "dir": str(self.dir),
            "ok": self.ok,
            "bundle_json_sha256": self.bundle_json_sha256,
            "quick": self.quick,
            "images": [{"ref": im.ref, "platform": str(im.platform), "image_id": str(im.image_id)}
                       for im in self.index.images],
            "parts": len(self.index.parts),
            "parts_checked": self.parts_checked,
            "blobs_checked": self.blobs_checked,
            "layers_checked": self.layers_checked,
            "unpacked_size": self.unpacked_size,
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
            "omitted": [{"chain_id": str(c), "provided_by": list(n)} for c, n in self.index.omitted_chains()],
            "problems": [p.to_json() for p in self.problems],
            "warnings": list(self.warnings),
            "signature": self.signature.to_json() if self.signature else None,
        }


def verify_bundle(bundle_dir: Path, *, expect: Optional[str] = None, quick: bool = False,
                  progress: Progress, jobs: Optional[int] = None, signers: Optional[str] = None,
                  signature: bool = True, doing: str = "verify", hash_parts: bool = True) -> VerifyReport:
    """Check a bundle directory and report every problem; raises UsageError/VerifyError only when
    there is no readable bundle.json, SignatureError when the signature policy refuses it, before
    any part is read (call `raise_if_bad()` on the result to fail on problems). `signature=False`:
    every check but the signature policy (what `sign` checks: the signature is what it is about to make).
    `doing`: the verb a signature refusal names ("serve": refusing to serve DIR). `hash_parts=False` (quick only):
    the parts' sizes, not their sha256 (serve: it checks every blob it hands out against its digest instead)."""
    started = time.monotonic()
    bundle_dir = Path(bundle_dir)
    index, raw = read_index(bundle_dir)
    verdict = enforce(bundle_dir, raw, signers, doing=doing) if signature else None
    report = VerifyReport(bundle_dir, index, hashlib.sha256(raw).hexdigest(), quick=quick, signature=verdict)
    if verdict is not None and verdict.warning:
        report.warnings.append(verdict.warning)
    check_metadata(bundle_dir, index, report, expect)
    if quick and not hash_parts:
        report.problems += stat_parts(bundle_dir, index)
    else:
        check_parts(bundle_dir, index, report, progress, jobs or os.cpu_count() or 2, quick=quick, diff_ids=True)
    report.seconds = time.monotonic() - started
    return report


def check_source(bundle_dir: Path, *, signers: Optional[str], expect: Optional[str], doing: str, progress: Progress,
                 jobs: Optional[int] = None) -> Tuple[BundleIndex, VerifyReport]:
    """A bundle another verb reads (`doing`: copy, push), checked as load checks it before a byte goes out: the
    signature policy, then check_before (its parts' content is checked as it streams, by the verb). Returns the
    index to read the bundle by (not read again: what was checked is what is read) and the report (its warnings);
    raises UsageError, SignatureError, VerifyError."""
    bundle_dir = Path(bundle_dir)
    index, raw = read_index(bundle_dir)
    verdict = enforce(bundle_dir, raw, signers, doing=doing)
    return index, check_before(bundle_dir, index, raw, verdict, expect, False, progress,
                               jobs or os.cpu_count() or 2, doing)


def read_checked_index(bundle_dir: Path, doing: str) -> BundleIndex:
    """bundle.json read and checked as verify checks it against SHA256SUMS and the files beside it (not the parts,
    not the signature), for the verbs that read bundle.json only (diff, fetch --base); raises UsageError, VerifyError
    worded for `doing` (REFUSALS)."""
    bundle_dir = Path(bundle_dir)
    index, raw = read_index(bundle_dir)
    report = VerifyReport(bundle_dir, index, hashlib.sha256(raw).hexdigest())
    check_metadata(bundle_dir, index, report, None)
    report.raise_if_bad(doing)
    return index


def check_before(bundle_dir: Path, index: BundleIndex, raw: bytes, verdict: Verdict, expect: Optional[str],
                 whole: bool, progress: Progress, jobs: int, doing: str = "load") -> VerifyReport:
    """Before a runtime, a registry or a new bundle sees a byte or a name: bundle.json against SHA256SUMS and
    --expect, every part there at its size. When something is wrong, or nothing will be streamed (and so checked
    on the way: `whole`), check the whole bundle as verify does, so every problem is named at once; raises
    VerifyError worded for `doing` (REFUSALS)."""
    report = VerifyReport(bundle_dir, index, hashlib.sha256(raw).hexdigest(), signature=verdict)
    if verdict.warning:
        report.warnings.append(verdict.warning)
    check_metadata(bundle_dir, index, report, expect)
    if report.problems or stat_parts(bundle_dir, index) or whole:
        check_parts(bundle_dir, index, report, progress, jobs, quick=False, diff_ids=False)
    report.raise_if_bad(doing)
    return report


def check_parts(bundle_dir: Path, index: BundleIndex, report: VerifyReport, progress: Progress, jobs: int, *,
                quick: bool, diff_ids: bool) -> None:
    """Every part present at its size and its sha256; unless quick, the archive walk too (every blob, and
    with diff_ids every layer's diff_id). Missing or wrong-size parts skip the walk, not the other parts."""
    stat_problems = stat_parts(bundle_dir, index)
    report.problems += stat_problems
    if quick or stat_problems:
        if not quick:
            report.skipped = "missing or wrong-size parts"
        _hash_parts_parallel(bundle_dir, index, report, {p.parts[0] for p in stat_problems}, progress, jobs)
    else:
        deep_check(bundle_dir, index, report, progress, jobs, diff_ids=diff_ids)


def check_metadata(bundle_dir: Path, index: BundleIndex, report: VerifyReport, expect: Optional[str]) -> None:
    """--expect, SHA256SUMS, load.sh/README.txt, and files that do not belong."""
    if expect is not None:
        want = parse_expect(expect)
        if want != report.bundle_json_sha256:
            report.problems.append(Problem(
                f"bundle.json does not match --expect: its sha256 is {report.bundle_json_sha256[:16]}..., "
                f"expected {want[:16]}...; this is not the published bundle, or bundle.json was changed"))
    sums = _read_sums(bundle_dir / SHA256SUMS)
    if sums is None:
        report.warnings.append(f"{SHA256SUMS} is missing or unreadable (imgtool does not need it; "
                               "`sha256sum -c` and load.sh do)")
    elif sums.get(BUNDLE_JSON) != report.bundle_json_sha256:
        report.problems.append(Problem(f"bundle.json does not match {SHA256SUMS}: it was changed after the fetch; "
                                       "copy bundle.json and SHA256SUMS again from the source medium"))
    for f in index.files:
        path = bundle_dir / f.name
        try:
            digest = _file_sha256(path) if path.stat().st_size == f.size else ""
        except OSError:
            report.warnings.append(f"{f.name} is missing (only needed to load without imgtool)")
            continue
        if digest != f.sha256:
            message = f"{f.name} does not match bundle.json: it was changed after the fetch"
            if f.name in (LOAD_SH, TOOL_PYZ):  # code that people run: treat a change as damage
                report.problems.append(Problem(message + f"; copy {f.name} again from the source medium"))
            else:
                report.warnings.append(message)
    known = {BUNDLE_JSON, SHA256SUMS, SIGNATURE, LOAD_SH, README_TXT, LOCK_NAME} | {p.name for p in index.parts} | \
        {f.name for f in index.files}
    try:
        stray = sorted(entry.name for entry in os.scandir(bundle_dir) if entry.name not in known)
    except OSError:
        stray = []
    for name in stray:
        report.warnings.append(f"unexpected file in the bundle directory: {name} (not part of the bundle; ignored)")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_sums(path: Path) -> Optional[Dict[str, str]]:
    try:
        with open_regular(path) as f:
            text = f.read(1 << 20).decode("utf-8", errors="replace") if os.fstat(f.fileno()).st_size <= 1 << 20 \
                else ""
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if sep and len(digest) == 64:
            out[name.lstrip("*")] = digest
    return out


def _hash_parts_parallel(bundle_dir: Path, index: BundleIndex, report: VerifyReport, skip: set,
                         progress: Progress, jobs: int) -> None:
    todo = [i for i in range(len(index.parts)) if i not in skip]
    total = sum(index.parts[i].size for i in todo)
    with progress.bar(total, "checking parts") as bar, ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo) or 1))) as pool:
        futures = {i: pool.submit(hash_part, bundle_dir / index.parts[i].name, bar.update) for i in todo}
        for i, fut in futures.items():
            try:
                digest = fut.result()
            except NotRegularFile as e:
                report.problems.append(part_problem(index, i, f"is not a regular file ({e.kind})"))
                continue
            except OSError as e:
                report.problems.append(part_unreadable(index, i, bundle_dir / index.parts[i].name, e))
                continue
            report.parts_checked += 1
            report.bytes_read += index.parts[i].size
            if digest != index.parts[i].sha256:
                report.problems.append(part_problem(index, i, DAMAGED))
    report.problems.sort(key=lambda p: p.parts or (-1,))


def deep_check(bundle_dir: Path, index: BundleIndex, report: VerifyReport, progress: Progress, jobs: int,
               diff_ids: bool) -> None:
    """One pass over the parts: each part's sha256 plus the strict archive walk (archive.py).

    Problems the walk finds inside a damaged part are dropped: "re-copy part N" says it all.
    """
    with progress.bar(index.archive.size, "checking bundle") as bar:
        result, parts = walk_archive(bundle_dir, index, diff_ids=diff_ids, jobs=jobs, on_bytes=bar.update)
    report.bytes_read += parts.position
    report.parts_checked = len(index.parts)
    bad = set(parts.bad)
    report.problems += [part_problem(index, i, DAMAGED) for i in sorted(bad)]
    kept = [p for p in result.problems if p.parts and not bad.intersection(p.parts)] if bad else result.problems
    if len(kept) < len(result.problems):
        report.skipped = "findings inside damaged parts are left out: re-copy those parts first"
    report.problems += kept
    report.blobs_checked = result.blobs_checked
    report.layers_checked = result.layers_checked
    report.unpacked_size = result.unpacked_size if not result.problems else None

