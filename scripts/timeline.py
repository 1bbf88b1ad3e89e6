"""A fetch's timeline, for scripts/bench_models.py --timeline (issue 48's "two sources" row): when each phase ran
(resolving the commit on every endpoint, the listing, the small git files, the download), when each connection was
busy (every ranged request: asked, first byte, last byte), the bytes written per 100 ms, and every steal.

`install(path)` wraps the functions in the fetch process (the bench's CLI wrapper calls it before imgtool's main) and
writes the events to `path` at exit; `summary(path, t0)` reads them back as text, times from `t0` (the bench's
time.time() when it started the process). Not product code: imgtool/ never imports it.
"""

import atexit
import json
import os
import threading
import time
from collections import defaultdict
from typing import Dict, List

BIN = 0.1  # seconds per bytes-written bin


class _Log:
    def __init__(self):
        self.lock = threading.Lock()
        self.phases: List[list] = []  # [name, start, end]
        self.requests: List[list] = []  # [thread, source, start, first byte, end, bytes, blob, pos]
        self.steals: List[list] = []  # [time, bytes]
        self.bins: Dict[int, int] = defaultdict(int)
        self.blobs: List[list] = []  # [digest, opened, finished]
        self.local = threading.local()


LOG = _Log()


def _phase(name: str, fn):
    def wrapped(*a, **k):
        start = time.time()
        try:
            return fn(*a, **k)
        finally:
            with LOG.lock:
                LOG.phases.append([name if isinstance(name, str) else name(*a), start, time.time()])
    return wrapped


def _slow(name: str, fn, at_least: float = 0.005):
    """`fn`, its calls that take `at_least` seconds recorded as phases."""
    def wrapped(*a, **k):
        start = time.time()
        try:
            return fn(*a, **k)
        finally:
            if time.time() - start >= at_least:
                with LOG.lock:
                    LOG.phases.append([name, start, time.time()])
    return wrapped


def install(path: str) -> None:
    """Wrap the fetch's phases and the puller's requests; the events go to `path` (JSON) at exit."""
    from imgtool import hubs, model_pull, puller
    from imgtool.hubs import huggingface

    LOG.phases.append(["python up, imgtool not imported", time.time(), time.time()])
    hubs._probe = _phase(lambda hub, ref, timeout: f"probe {hub.name}", hubs._probe)
    model_pull.resolve = _phase("resolve (probes + listing)", model_pull.resolve)
    huggingface.HuggingFace.snapshot = _phase(lambda self, *a: f"listing {self.name}", huggingface.HuggingFace.snapshot)
    hubs.HubResolution.complete = _phase("complete (small git files)", hubs.HubResolution.complete)
    model_pull.download_blobs = _phase("download_blobs", model_pull.download_blobs)

    from imgtool.bundle import writer
    for fn in ("write_bundle", "_seal_archive", "_write_side_files", "_write_index"):
        setattr(writer, fn, _phase(f"bundle: {fn}", getattr(writer, fn)))
    for fn in ("fsync", "fdatasync"):
        setattr(os, fn, _slow(f"os.{fn}", getattr(os, fn)))

    sched = puller._Scheduler
    request, read, write, steal, opened, finish = (sched._request, sched._read, sched._write, sched._steal,
                                                   sched._open, sched._finish)

    def _request(self, source, rng):
        LOG.local.first = None
        start, pos = time.time(), rng.pos
        try:
            return request(self, source, rng)
        finally:
            with LOG.lock:
                LOG.requests.append([threading.current_thread().name, source.name, start, LOG.local.first,
                                     time.time(), rng.pos - pos, rng.blob.desc.digest.short, pos])

    def _read(self, blob, n, source, rng):
        chunk = read(self, blob, n, source, rng)
        if LOG.local.first is None:
            LOG.local.first = time.time()
        return chunk

    def _write(self, rng, chunk, source):
        write(self, rng, chunk, source)
        with LOG.lock:
            LOG.bins[int(time.time() / BIN)] += len(chunk)

    def _steal(self):
        rng = steal(self)
        if rng is not None:
            LOG.steals.append([time.time(), rng.end - rng.pos])
        return rng

    def _open(self, blob):
        LOG.blobs.append([blob.desc.digest.short, time.time(), None])
        return opened(self, blob)

    def _finish(self, job):
        try:
            return finish(self, job)
        finally:
            for b in LOG.blobs:
                if b[0] == job.desc.digest.short and b[2] is None:
                    b[2] = time.time()

    sched._request, sched._read, sched._write, sched._steal, sched._open, sched._finish = (
        _request, _read, _write, _steal, _open, _finish)

    def dump():
        with open(path, "w") as f:
            json.dump({"phases": LOG.phases, "requests": LOG.requests, "steals": LOG.steals, "blobs": LOG.blobs,
                       "bins": sorted(LOG.bins.items()), "exit": time.time()}, f)

    atexit.register(dump)


def summary(path: str, t0: float, step: float = 0.5) -> str:
    """The timeline at `path` as text, times in seconds from `t0`."""
    doc = json.load(open(path))
    out = []
    for name, a, b in sorted(doc["phases"], key=lambda p: p[1]):
        out.append(f"  {a - t0:6.2f} .. {b - t0:6.2f}  {name}")
    reqs = doc["requests"]
    if not reqs:
        return "\n".join(out)
    first = min(r[2] for r in reqs)
    last = max(r[4] for r in reqs)
    fb = sorted(r[3] - r[2] for r in reqs if r[3])
    out.append(f"  first request {first - t0:.2f}, last byte {last - t0:.2f}, exit {doc['exit'] - t0:.2f}; "
               f"{len(reqs)} requests, {len(doc['steals'])} steals, time to first byte median "
               f"{fb[len(fb) // 2] * 1000:.0f} ms, max {fb[-1] * 1000:.0f} ms")
    for d, a, b in doc["blobs"]:
        out.append(f"  blob {d}: opened {a - t0:.2f}, done {(b or 0) - t0:.2f}")
    # connections busy (inside a request) and MB/s, per `step`
    bins = dict((int(k), v) for k, v in doc["bins"])
    t = first
    out.append("  time   busy(src: n)            MB/s")
    srcs = sorted({r[1] for r in reqs})
    while t < last:
        busy = {s: sum(1 for r in reqs if r[1] == s and r[2] <= t + step / 2 < r[4]) for s in srcs}
        nbytes = sum(v for k, v in bins.items() if t <= k * BIN < t + step)
        out.append(f"  {t - t0:6.2f} " + " ".join(f"{s}:{n:2d}" for s, n in busy.items())
                   + f"   {nbytes / step / 1e6:6.1f}")
        t += step
    return "\n".join(out)
