#!/usr/bin/env python3
"""imgtool serve under a crowd (issue 36 item 5), measured:

  alone      one `skopeo copy … oci:` of the image from `imgtool serve`
  crowd      the same beside 300 hostile connections (100 that say nothing, 100 that send a header line a
             second and never finish, 100 that read the biggest layer a byte a second: tests/support/crowd.py,
             one thread), with a manifest GET on a new connection every 0.25 s while the pull runs
  many       --concurrent (100) pulls at once from serve, and from the distribution registry holding the same image

The image is bench.py's vllm-ascend shape (scripts/benchimage.py, 17 gzip layers) at --scale, pushed to the
registry of the test services, fetched once into a bundle (untimed) and served from it. Each row is alternated
over --runs; the pulls' outputs go to --work-dir (put it on tmpfs: 100 pulls write 100 images). It prints the
markdown section docs/benchmarks.md keeps (and writes it to --output when given).

    scripts/bench_crowd.py                                  # scale 0.01 (~70 MB gzip), 3 runs, 100 at once
    scripts/bench_crowd.py --scale 0.05 --concurrent 20

Services: as bench.py (the running ones when every IMGTOOL_TEST_* variable is set, else its own). Not product code.
"""

import argparse
import os
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
import bench  # noqa: E402  (scripts/ is not a package)
from tests.support.crowd import Crowd  # noqa: E402

MB = 1000 * 1000


class Sampler:
    """A manifest GET on a new connection every `every` seconds until stopped: the latencies (a failure counts as
    its time, and is counted)."""

    def __init__(self, url: str, every: float = 0.25):
        self.url, self.every = url, every
        self.times: List[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler")

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                r = requests.get(self.url, timeout=60, headers={"Connection": "close"})
                if r.status_code != 200:
                    self.failed += 1
            except requests.RequestException:
                self.failed += 1
            self.times.append(time.monotonic() - t0)
            self._stop.wait(self.every)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=0.01, help="the image's size: 1 = the real one (~6.5 GB gzip)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--concurrent", type=int, default=100, help="pulls at once in the last row")
    p.add_argument("--work-dir", default="/dev/shm/imgtool-crowd", help="the image, the bundle and the pulls' outputs")
    p.add_argument("--services-dir", default="/tmp/imgtool-bench-svc")
    p.add_argument("--own-services", action="store_true")
    p.add_argument("--seed", default="crowd1")
    p.add_argument("--output", default="", help="also write the section to this file")
    p.add_argument("--serve-from", default="", metavar="DIR",
                   help="serve with the imgtool package of another checkout (e.g. main's, for the before row)")
    args = p.parse_args(argv)
    if args.serve_from:  # `python -m imgtool` with that checkout first on the path (fetch too: the same bundle format)
        bench.imgtool_cmd = lambda: [sys.executable, "-m", "imgtool"]
        os.environ["PYTHONPATH"] = str(Path(args.serve_from).resolve())
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    meta = bench.build_image(work, args.scale, args.seed, 6, full=False)
    im = bench.arm(meta)
    size = bench.compressed_size(meta)
    bench.log(f"image: {size / MB:.0f} MB compressed, {len(im['layers'])} layers")
    times: Dict[str, List[float]] = {}
    cpu: Dict[str, List[float]] = {}
    gets: List[float] = []
    failed = 0
    with bench.services(args) as env:
        repo = f"crowd{secrets.token_hex(3)}/vllm-ascend"
        bench.push_image(env.registry, repo, "v1", meta)
        b = bench.Bench(args, env, meta, repo)
        try:
            b.imgtool_fetch(keep=True)
            proc, hostport = b.serve_start()
            registry_pid = bench.listener_pid(int(env.registry.rsplit(":", 1)[1]))
            biggest = max(im["layers"], key=lambda x: x["size"])["digest"]
            manifest = f"http://{hostport}/v2/{repo}/manifests/v1"
            try:
                b.pulls(hostport, 1)  # untimed: warm, and serve's background check done
                b.pulls(env.registry, 1)

                def timed(key: str, pid, where: str, n: int) -> float:
                    before = bench.cpu_seconds(pid) if pid else 0.0
                    res = b.pulls(where, n)
                    if res.rc:
                        raise RuntimeError(f"{key}: a pull failed")
                    if pid:
                        cpu.setdefault(key, []).append(bench.cpu_seconds(pid) - before)
                    times.setdefault(key, []).append(res.seconds)
                    bench.log(f"  {key}: {res.seconds:.2f}s")
                    return res.seconds

                host, port = hostport.rsplit(":", 1)
                for r in range(args.runs):
                    order = ["alone", "crowd"] if r % 2 == 0 else ["crowd", "alone"]
                    for key in order:
                        if key == "alone":
                            timed("alone", proc.pid, hostport, 1)
                            continue
                        with Crowd(host, int(port), f"/v2/{repo}/blobs/{biggest}") as crowd:
                            with Sampler(manifest) as sampler:
                                timed("crowd", proc.pid, hostport, 1)
                            gets.extend(sampler.times)
                            failed += sampler.failed
                            bench.log(f"  crowd: {crowd.open_now()} hostile connections open, GETs max "
                                      f"{max(sampler.times):.3f}s of {len(sampler.times)}")
                for r in range(args.runs if args.concurrent else 0):
                    pair = [("many.serve", proc.pid, hostport), ("many.registry", registry_pid, env.registry)]
                    for key, pid, where in (pair if r % 2 == 0 else pair[::-1]):
                        timed(key, pid, where, args.concurrent)
                rss = bench.proc_status(proc.pid, "VmHWM")
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        finally:
            b.cleanup()
    text = section(args, size, len(im["layers"]), times, cpu, gets, failed, rss)
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


def section(args, size: int, layers: int, times: Dict[str, List[float]], cpu: Dict[str, List[float]],
            gets: List[float], failed: int, rss_kb: int) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}

    def spread(k: str) -> str:
        return f"{min(times[k]):.2f}–{max(times[k]):.2f}"

    def mbs(k: str, n: int) -> str:
        return f"{n * size / med[k] / MB:.0f}"

    n = args.concurrent
    ratio = med["crowd"] / med["alone"]
    many = med["many.registry"] / med["many.serve"] if n else 0.0
    rows = [
        "| pull | median s | runs (min–max) | MB/s | serve CPU s |",
        "|---|---:|---:|---:|---:|",
        f"| 1 from serve, alone | {med['alone']:.2f} | {spread('alone')} | {mbs('alone', 1)} | "
        f"{statistics.median(cpu.get('alone', [0])):.2f} |",
        f"| 1 from serve, beside 300 hostile connections | {med['crowd']:.2f} | {spread('crowd')} | {mbs('crowd', 1)} | "
        f"{statistics.median(cpu.get('crowd', [0])):.2f} |",
    ]
    if n:
        rows += [f"| {n} at once from serve | {med['many.serve']:.2f} | {spread('many.serve')} | {mbs('many.serve', n)} | "
                 f"{statistics.median(cpu.get('many.serve', [0])):.2f} |",
                 f"| {n} at once from the registry | {med['many.registry']:.2f} | {spread('many.registry')} | "
                 f"{mbs('many.registry', n)} | (registry: {statistics.median(cpu.get('many.registry', [0])):.2f}) |"]
    q = sorted(gets)
    p50, p99 = q[len(q) // 2], q[min(len(q) - 1, int(len(q) * 0.99))]
    return "\n".join([
        f"`scripts/bench_crowd.py --scale {args.scale:g} --runs {args.runs} --concurrent {n}"
        f"{' --serve-from ' + args.serve_from if args.serve_from else ''}`: the "
        f"{size / MB:.0f} MB ({layers} layers) arm64 image, `skopeo copy … oci:DIR` on loopback.", "",
        *rows, "",
        f"- Beside the crowd the pull took {ratio:.2f}× its time alone (goal: at most 2×).",
        f"- Manifest GETs on new connections during the crowded pulls: {len(gets)}, median {p50 * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {max(gets) * 1000:.0f} ms (goal: within 2 s), {failed} failed.",
        *([f"- {n} pulls at once: serve {many:.2f}× the registry's speed (the registry's median time over serve's)."]
          if n else []),
        f"- serve's peak RSS over the whole run: {rss_kb / 1024:.0f} MiB.", ""])


if __name__ == "__main__":
    sys.exit(main())
