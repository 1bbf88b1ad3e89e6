#!/usr/bin/env python3
"""Models (issue 48): imgtool's download of a model from a Hugging Face endpoint against the real client's, and the
rows of the issue's table that need imgtool's bundle.

A seeded model (tests/support/models.py `generated_model`: five shards of 4 GB and the small files at --scale 1,
20 GB; --scale 0.25 is 5 GB; a tag v2 changing shard CHANGED) is served by the loopback Hugging Face stand-in
(tests/support/hub.py) from bytes made as they are sent, never stored on disk, in a process of its own, behind
bench.py's ThrottleProxy (which counts what it forwards and, on the constrained link, holds each TCP connection to
--rate MB/s). Each contestant downloads the whole model into an empty directory on the same disk:

  imgtool   `imgtool_fetch_cmd`: the verb users run, `imgtool fetch hf:ORG/NAME -o DIR --no-tool`, the first endpoint
            as $HF_ENDPOINT and the second as a [[model_mirrors]] entry of a mirrors.toml (--connections N: runs with
            fetch's --connections N; default: fetch's own default).
  hf        huggingface_hub's `snapshot_download` (the real client, from the hub-clients venv scripts/test.sh makes),
            default settings (its default is max_workers=8) and, with --hf-workers, others.

Rows: download time on loopback; on a --rate MB/s-per-connection link, one source and two (imgtool takes both
endpoints; the client can use one, $HF_ENDPOINT). After imgtool's first loopback fetch (--bundle-rows): the bytes the
fetch process wrote to storage (/proc/self/io write_bytes at its exit) against the bundle's bytes; `imgtool verify`;
placement (`place_model` fed from the bundle's parts by the members' offsets, as load's reader feeds it) against
`cp -r` of the bundle (then sync: placement fsyncs); the delta bundle of tag v2 (`fetch hf:ORG/NAME@v2 --base`)
against the full one. Then SIGKILL once half the model was received, and a rerun: the bytes downloaded again against
what the killed run received. Peak RSS (GNU time) of every run. Each output is removed once measured.

    scripts/bench_models.py --scale 0.25 --connections 12 16     # 5 GB, about 5 minutes; the table to stdout
    scripts/bench_models.py --scale 1 --links loopback --no-kill --no-bundle-rows   # the issue's 20 GB model
    scripts/bench_models.py placement --bundle DIR --runs 3   # the placement rows alone, of a bundle made already
    scripts/bench_models.py --scale 0.025 --rate 2 --links two --no-kill --no-bundle-rows --hf-workers --timeline
        # two sources where the link decides, each imgtool run's timeline (scripts/timeline.py) on stderr

Not product code: imgtool/ never imports it.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

MB = 1000 * 1000
REPO = "imgtool-bench/big-llm"
SHARDS = 5
FULL_SHARD = 4 << 30  # --scale 1: five of them, the 20 GB model
MAX_CONNECTIONS = 0  # fetch --max-connections for every imgtool run (--max-connections; 0: fetch's default)
TIMELINE = False  # --timeline: each imgtool run records its timeline (scripts/timeline.py), summarised in the log
CHANGED = 2  # the shard the newer revision (tag v2) changes: the delta row

_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"bench_models: [{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# --- the hub, in a process of its own ------------------------------------------------------------------------

def serve(scale: float, seed: str, cache: Path) -> None:
    """The stand-in serving the generated model until stdin closes; prints {"url", "bytes"} once listening."""
    from tests.support.hub import Hub
    from tests.support.models import generated_model

    model = generated_model(seed=seed, repo_id=REPO, shards=SHARDS, shard_bytes=int(FULL_SHARD * scale), sha_cache=cache,
                            changed_shard=CHANGED)
    with Hub([model], flavour="hf") as hub:
        print(json.dumps({"url": hub.url, "bytes": sum(f.size for f in model.head.files.values())}), flush=True)
        sys.stdin.read()


class HubProcess:
    def __init__(self, args):
        self.p = subprocess.Popen([sys.executable, __file__, "serve", "--scale", str(args.scale), "--seed", args.seed,
                                   "--work-dir", args.work_dir], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, cwd=ROOT)  # a killed client's reset is printed there
        assert self.p.stdout is not None
        doc = json.loads(self.p.stdout.readline())
        self.url, self.bytes = doc["url"], doc["bytes"]

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


# --- the contestants -----------------------------------------------------------------------------------------

# The CLI with the hubs' own defaults (huggingface.co, modelscope.cn) taken away, as tests/test_fetch_models.py runs
# it: the loopback endpoints ($HF_ENDPOINT, the [[model_mirrors]]) are the only ones. At exit it writes its
# /proc/self/io (every thread's; fetch with --no-tool runs no program) to $BENCH_IO.
_CLI = """
import atexit, dataclasses, json, os, sys
def _io():
    with open(os.environ["BENCH_IO"], "w") as f:
        json.dump({l.split(":")[0]: int(l.split(":")[1]) for l in open("/proc/self/io")}, f)
atexit.register(_io)
if os.environ.get("BENCH_TIMELINE"):
    sys.path.insert(0, os.environ["BENCH_SCRIPTS"])
    import timeline
    timeline.install(os.environ["BENCH_TIMELINE"])
from imgtool import config
_read = config.hub_environment
config.hub_environment = lambda: dataclasses.replace(_read(), hf_default=None, modelscope_default=None)
from imgtool.cli import main
sys.argv[0] = "imgtool"
main()
"""


def imgtool_cmd(*args: str) -> List[str]:
    return [sys.executable, "-c", _CLI, *args]


def imgtool_env(endpoint: str, cache: Path, io: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_"))}
    env.update(HF_ENDPOINT=endpoint, IMGTOOL_CACHE=str(cache), BENCH_IO=str(io), NO_PROXY="*")
    if TIMELINE:
        env.update(BENCH_TIMELINE=str(io.parent / "timeline.json"), BENCH_SCRIPTS=str(ROOT / "scripts"))
    return env


def mirrors_toml(endpoints: Sequence[str], path: Path) -> Path:
    """mirrors.toml naming every endpoint after the first as a [[model_mirrors]] entry."""
    text = 'default_image = "quay.io/ascend/vllm-ascend"\n'
    for i, url in enumerate(endpoints[1:]):
        text += f'[[model_mirrors]]\nname = "m{i + 2}"\nhub = "hf"\nurl = "{url}"\ninsecure = true\n'
    path.write_text(text)
    return path


def imgtool_fetch_cmd(endpoints: Sequence[str], dest: Path, connections: Optional[int] = None,
                      ref: str = f"hf:{REPO}", more: Sequence[str] = ()) -> Tuple[List[str], Dict[str, str]]:
    """The verb users run: `imgtool fetch hf:ORG/NAME -o DEST/bundle` from `endpoints` (the first as $HF_ENDPOINT,
    the rest as [[model_mirrors]]), its cache in DEST/cache; (command, environment)."""
    cfg = mirrors_toml(endpoints, dest / "mirrors.toml")
    args = ["fetch", ref, "-o", str(dest / "bundle"), "--no-tool", "--mirrors", str(cfg), *more]
    if connections:
        args += ["--connections", str(connections)]
    if MAX_CONNECTIONS:
        args += ["--max-connections", str(MAX_CONNECTIONS)]
    return imgtool_cmd(*args), imgtool_env(endpoints[0], dest / "cache", dest / "io.json")


_HF = """
import json, sys, warnings
warnings.simplefilter("ignore")
from huggingface_hub import snapshot_download
kw = {} if sys.argv[3] == "default" else {"max_workers": int(sys.argv[3])}
snapshot_download(sys.argv[1], cache_dir=sys.argv[2], **kw)
json.dump({l.split(":")[0]: int(l.split(":")[1]) for l in open("/proc/self/io")}, open(sys.argv[4], "w"))
"""


def hf_python() -> str:
    python = ROOT / ".venv" / "hub-clients" / "bin" / "python"
    if not python.exists():
        sys.exit(f"{python} is missing: scripts/test.sh makes it (the real hub clients)")
    return str(python)


def hf_cmd(dest: Path, workers: str) -> List[str]:
    return [hf_python(), "-c", _HF, REPO, str(dest / "hf"), workers, str(dest / "io.json")]


def hf_env(endpoint: str, home: Path) -> Dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8", "NO_PROXY": "*",
            "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_ETAG_TIMEOUT": "60", "HF_HUB_DOWNLOAD_TIMEOUT": "60"}


# --- measuring -----------------------------------------------------------------------------------------------

class Run:
    def __init__(self, seconds: float, rss_kb: int, io: Dict[str, int], sent: int):
        self.seconds, self.rss_kb, self.io, self.sent = seconds, rss_kb, io, sent
        self.started = 0.0  # time.time() when the process was started

    @property
    def written(self) -> int:
        """Bytes the process sent to storage (/proc/PID/io write_bytes: page cache dirtied, sockets not counted)."""
        return self.io.get("write_bytes", 0)


def timed(cmd: List[str], env: Optional[Dict[str, str]], proxies: Sequence = (), io: Optional[Path] = None) -> Run:
    """Run `cmd` to its end: its wall time, peak RSS, its /proc/self/io at exit (from `io`), bytes the proxies sent."""
    from bench import run

    subprocess.run(["sync"], check=False, timeout=600)  # an earlier run's dirty pages are not this run's to write
    before = sum(p.sent for p in proxies)
    started = time.time()
    r = run(cmd, env=env, cwd=ROOT, rss=True)
    doc = json.loads(io.read_text()) if io is not None and io.exists() else {}
    out = Run(r.seconds, r.rss_kb, doc, sum(p.sent for p in proxies) - before)
    out.started = started
    return out


def killed_half_way(cmd: List[str], env: Optional[Dict[str, str]], proxy, total: int) -> int:
    """Start `cmd`, SIGKILL it once the proxy's client acknowledged half of `total`: what it had received."""
    start = proxy.received()
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    due = time.monotonic() + 3600
    while p.poll() is None and proxy.received() - start < total // 2 and time.monotonic() < due:
        time.sleep(0.01)
    p.kill()
    p.wait()
    time.sleep(0.5)  # the proxy's connections end
    return proxy.received() - start


def fresh(work: Path, name: str) -> Path:
    d = work / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def tree_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


# --- placement: place_model fed from the bundle's parts ------------------------------------------------------

def place(bundle: Path, dest: Path, target: str) -> None:
    """Every model of `bundle` placed under `dest` in `target`'s layout by placer.place_model, each file handed over as
    load's reader hands an uncompressed bundle's (Regions: where its member's data lies in the parts, by
    layout.arrange of bundle_members; the placer copies it in the kernel and hashes the copy)."""
    from imgtool.bundle import layout
    from imgtool.bundle.format import BundleIndex
    from imgtool.placer import place_model

    index = BundleIndex.from_bytes((bundle / "bundle.json").read_bytes())
    slots, _ = layout.arrange(layout.bundle_members(index))
    at = {s.member.digest: s for s in slots}
    spans = []  # (start in the tar stream, size, path)
    pos = 0
    for part in index.parts:
        spans.append((pos, part.size, bundle / part.name))
        pos += part.size

    def regions(f) -> List[Tuple[Path, int, int]]:
        s = at[f.sha256]
        return [(path, max(s.data_offset, start) - start, min(s.end, start + size) - max(s.data_offset, start))
                for start, size, path in spans if start < s.end and s.data_offset < start + size]

    from imgtool import placer

    Regions = getattr(placer, "Regions", None)
    if Regions is None:  # a tree from before the kernel's copy (a "before" run): the bytes in pieces, as it took them
        def read(f) -> Iterable[bytes]:
            for path, offset, length in regions(f):
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    while length:
                        piece = fh.read(min(length, 1 << 20))
                        if not piece:
                            raise OSError(f"{path}: short")
                        length -= len(piece)
                        yield piece
    else:
        def read(f):  # type: ignore[misc]
            return Regions(tuple((str(p), o, n) for p, o, n in regions(f)))

    for m in index.models:
        placed = place_model(m.snapshot(), target, dest, read, m.model_ref.revision)
        print(json.dumps({"placed": str(placed.path), "files": placed.files, "written": placed.written}), flush=True)


def placement_rows(args, work: Path, bundle: Path, rows: Dict[str, str]) -> None:
    """placement (`place_model` as load feeds it; `imgtool load --models-only --models-dir`, the verb) against
    `cp -r` of the bundle then sync (placement fsyncs each file), and cp -r alone; each output removed once measured.
    With --runs N, each is run N times, interleaved, and the median taken."""
    out = work / "placed"
    times: Dict[str, List[float]] = {}
    rss: Dict[str, int] = {}
    placed = 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_"))}
    env.update(IMGTOOL_CACHE=str(work / "imgtool-cache"), BENCH_IO=str(work / "io-load.json"))
    contestants = [
        ("place", lambda: [sys.executable, __file__, "place", "--bundle", str(bundle), "--dest", str(out / "m"),
                           "--target", args.target], None),
        ("load", lambda: imgtool_cmd("load", str(bundle), "--models-only", "--models-dir", str(out / "m")), env),
        ("cp", lambda: ["bash", "-c", 'cp -r "$0" "$1" && sync -f "$1"', str(bundle), str(out / "copy")], None),
        ("cp-plain", lambda: ["cp", "-r", str(bundle), str(out / "copy")], None),
    ]
    for _ in range(max(1, args.runs)):
        for name, cmd, cenv in contestants:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            r = timed(cmd(), cenv)
            times.setdefault(name, []).append(r.seconds)
            rss[name] = max(rss.get(name, 0), r.rss_kb)
            if name == "place":
                placed = tree_bytes(out)
            log(f"  {name}: {r.seconds:.1f} s, peak RSS {r.rss_kb / 1024:.0f} MiB")
    shutil.rmtree(out, ignore_errors=True)
    t = {k: statistics.median(v) for k, v in times.items()}
    rows["place"] = (f"{t['place']:.1f} s ({placed / MB:,.0f} MB, --target {args.target}) vs cp -r + sync "
                     f"{t['cp']:.1f} s: {t['place'] / t['cp']:.2f}×; cp -r alone {t['cp-plain']:.1f} s: "
                     f"{t['place'] / t['cp-plain']:.2f}×")
    rows["place|load --models-dir"] = (f"{t['load']:.1f} s vs cp -r + sync {t['cp']:.1f} s: {t['load'] / t['cp']:.2f}×; "
                                       f"cp -r alone: {t['load'] / t['cp-plain']:.2f}×")
    rows["rss|place"] = f"{rss['place'] / 1024:.0f} MiB"
    rows["rss|load"] = f"{rss['load'] / 1024:.0f} MiB"
    log(f"place: {rows['place']}; load: {rows['place|load --models-dir']}")


# --- the run -------------------------------------------------------------------------------------------------

def main_bench(args) -> int:
    from bench import ThrottleProxy

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="hfhome-", dir=work))
    rate = args.rate * MB
    log(f"the model: {SHARDS} shards of {int(FULL_SHARD * args.scale) / MB:.0f} MB (scale {args.scale}), generated")
    load_before = os.getloadavg()
    hub1, hub2 = HubProcess(args), HubProcess(args)
    total = hub1.bytes
    results: Dict[str, List[Run]] = {}
    rows: Dict[str, str] = {}
    conns = args.connections or [None]
    contestants = [(f"imgtool --connections {c}" if c else "imgtool",
                    lambda urls, d, c=c: imgtool_fetch_cmd(urls, d, c)) for c in conns] + [
        (f"hf (max_workers={w})" if w != "default" else "hf (default: max_workers=8)",
         lambda urls, d, w=w: (hf_cmd(d, w), hf_env(urls[0], home))) for w in args.hf_workers]
    try:
        links = [("loopback", 0.0, 1), (f"{args.rate:g} MB/s per connection, one source", rate, 1),
                 (f"{args.rate:g} MB/s per connection, two sources", rate, 2)]
        for (link, r, n), which in zip(links, ("loopback", "one", "two")):
            if which not in args.links:
                continue
            proxies = [ThrottleProxy(hub1.url[7:], r), ThrottleProxy(hub2.url[7:], r)][:n]
            urls = [f"http://{p.address}" for p in proxies]
            try:
                for _ in range(args.runs):
                    for name, make in contestants:
                        if n == 2 and not name.startswith("imgtool"):
                            continue  # the client reads one endpoint ($HF_ENDPOINT): its one-source row stands
                        dest = fresh(work, "dest")
                        cmd, env = make(urls, dest)
                        log(f"{link}: {name}")
                        run = timed(cmd, env, proxies, dest / "io.json")
                        results.setdefault(f"{link}|{name}", []).append(run)
                        log(f"  {run.seconds:.1f} s, {run.sent / MB:.0f} MB sent, {run.written / MB:.0f} MB written, "
                            f"peak RSS {run.rss_kb / 1024:.0f} MiB, load average {os.getloadavg()[0]:.2f}")
                        if TIMELINE and (dest / "timeline.json").exists():
                            from timeline import summary
                            log("  timeline (seconds from the start of the run):\n" + summary(
                                str(dest / "timeline.json"), run.started))
                        if which == "loopback" and name.startswith("imgtool") and args.bundle_rows:
                            bundle_rows(args, work, dest, urls, run, total, rows)
                            args.bundle_rows = False  # once
            finally:
                for p in proxies:
                    p.close()
        if not args.keep:
            shutil.rmtree(work / "dest", ignore_errors=True)
        if args.kill:
            proxy = ThrottleProxy(hub1.url[7:], 0.0)
            try:
                for name, make in contestants[:1] + (contestants[len(conns):len(conns) + 1] if args.kill_client else []):
                    dest = fresh(work, "killed")
                    cmd, env = make([f"http://{proxy.address}"], dest)
                    got = killed_half_way(cmd, env, proxy, total)
                    rerun = timed(cmd, env, [proxy], dest / "io.json")
                    again = got + rerun.sent - total
                    rows[f"kill|{name}"] = (f"{again / MB:,.0f} MB of {got / MB:,.0f} MB received "
                                            f"({again / got * 100:.1f} %)")
                    log(f"kill: {name}: received {got / MB:.0f} MB, then {rerun.sent / MB:.0f} MB: {again / MB:.0f} MB "
                        "again")
                    shutil.rmtree(dest, ignore_errors=True)
            finally:
                proxy.close()
    finally:
        hub1.close()
        hub2.close()
    load = (load_before, os.getloadavg())
    text = report(results, rows, total, args, load)
    if args.output:
        Path(args.output).write_text(text)
    print(text)
    return 0


def bundle_rows(args, work: Path, dest: Path, urls: Sequence[str], fetched: Run, total: int, rows: Dict[str, str]
                ) -> None:
    """The rows that need the bundle the loopback fetch wrote: bytes written, verify, placement against cp -r, the
    delta of a new revision; each output removed once measured."""
    bundle = dest / "bundle"
    size = tree_bytes(bundle)
    rows["size"] = str(size)
    io = fetched.io
    rows["written"] = (f"{fetched.written / MB:,.0f} MB vs the bundle's {size / MB:,.0f} MB "
                       f"({(fetched.written / size - 1) * 100:+.2f} %; wchar {io.get('wchar', 0) / MB:,.0f} MB, "
                       f"cancelled {io.get('cancelled_write_bytes', 0) / MB:,.0f} MB)")
    rows["rss|fetch"] = f"{fetched.rss_kb / 1024:.0f} MiB"
    log(f"  bytes written: {rows['written']}")
    env = imgtool_env(urls[0], dest / "cache", dest / "io-verify.json")
    v = timed(imgtool_cmd("verify", str(bundle)), env, io=dest / "io-verify.json")
    rows["verify"] = f"{v.seconds:.1f} s"
    rows["rss|verify"] = f"{v.rss_kb / 1024:.0f} MiB"
    log(f"verify: {v.seconds:.1f} s, peak RSS {v.rss_kb / 1024:.0f} MiB")
    placement_rows(args, work, bundle, rows)
    # the delta: tag v2 changes shard CHANGED; fetched against this bundle as --base
    dd = fresh(work, "delta")
    cmd, env = imgtool_fetch_cmd(urls, dd, ref=f"hf:{REPO}@v2", more=["--base", str(bundle)])
    d = timed(cmd, env, io=dd / "io.json")
    dsize = tree_bytes(dd / "bundle")
    rows["delta"] = (f"{dsize / MB:,.0f} MB of the full {size / MB:,.0f} MB ({dsize / size * 100:.1f} %), "
                     f"fetched in {d.seconds:.1f} s")
    rows["rss|delta"] = f"{d.rss_kb / 1024:.0f} MiB"
    log(f"delta: {rows['delta']}")
    shutil.rmtree(dd, ignore_errors=True)


def report(results: Dict[str, List[Run]], rows: Dict[str, str], total: int, args, load=None) -> str:
    def med(key: str, attr: str) -> Optional[float]:
        runs = results.get(key)
        return statistics.median(getattr(r, attr) for r in runs) if runs else None

    names = sorted({k.split("|")[1] for k in results}, key=lambda n: (not n.startswith("imgtool"), n))
    mine = [n for n in names if n.startswith("imgtool")]
    hf = next((n for n in names if not n.startswith("imgtool")), None)
    lines = [f"Model: {SHARDS} shards of {int(FULL_SHARD * args.scale) / MB:,.0f} MB plus the small files, "
             f"{total / MB:,.0f} MB (--scale {args.scale}); median of {args.runs} run(s)."]
    if load:
        lines.append("Load average (1, 5, 15 min) at the start: " + " ".join(f"{x:.2f}" for x in load[0])
                     + "; at the end: " + " ".join(f"{x:.2f}" for x in load[1]) + ".")
    lines += ["", "| row | " + " | ".join(names) + " | imgtool vs the client |",
              "|---|" + "---|" * len(names) + "---|"]
    links = sorted({k.split("|")[0] for k in results}, key=lambda s: ("MB/s" in s, "two" in s))
    for link in links:
        cells = []
        for n in names:
            v = med(f"{link}|{n}", "seconds")
            cells.append(f"{v:.1f} s" if v is not None else "(one endpoint only)")
        base = hf and (med(f"{link}|{hf}", "seconds")
                       or med(f"{link.replace('two sources', 'one source')}|{hf}", "seconds"))
        ratios = []
        for n in mine:
            t = med(f"{link}|{n}", "seconds")
            if t and base:
                ratios.append(f"{base / t:.2f}× faster ({t / base:.2f}× the time)" + (f" [{n}]" if len(mine) > 1 else ""))
        lines.append(f"| download time, {link} | " + " | ".join(cells) + f" | {'; '.join(ratios) or '-'} |")
    blank = " | " * (len(names) - 1)
    labels = [("written", "bytes written on the connected side (fetch's write_bytes), vs the bundle's"),
              ("kill", "SIGKILL half-way, rerun: downloaded again"),
              ("verify", "verify of the bundle"),
              ("place", "placement (place_model as load feeds it; load --models-dir) vs cp -r of the bundle"),
              ("delta", "a new revision changing 1 of 5 shards: the delta bundle (fetch --base)")]
    for key, label in labels:
        hits = [(k, v) for k, v in rows.items() if k == key or k.startswith(key + "|")]
        for k, v in hits:
            who = k.split("|")[1] if "|" in k else ""
            lines.append(f"| {label}{' (' + who + ')' if who else ''} | {v}{blank} | |")
    peaks = {n: max(r.rss_kb for k, runs in results.items() if k.endswith("|" + n) for r in runs) for n in names}
    rss = "; ".join(f"{k.split('|')[1]} {v}" for k, v in rows.items() if k.startswith("rss|"))
    lines.append("| peak RSS (any download run) | " + " | ".join(f"{peaks[n] / 1024:.0f} MiB" for n in names) + " | |")
    if rss:
        lines.append(f"| peak RSS of imgtool's verbs | {rss}{blank} | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="bench", choices=("bench", "serve", "place", "placement"))
    p.add_argument("--scale", type=float, default=1.0, help="of the 20 GB model (0.05: 1 GB)")
    p.add_argument("--seed", default="bench1")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--rate", type=float, default=20.0, help="constrained link: MB/s per TCP connection")
    p.add_argument("--hf-workers", nargs="*", default=["default"],
                   help="the client's max_workers to run (default: its default, 8); e.g. default 16")
    p.add_argument("--connections", nargs="*", type=int, default=[],
                   help="imgtool fetch --connections values to run (default: fetch's own default)")
    p.add_argument("--max-connections", type=int, default=0, help="imgtool fetch --max-connections (default: fetch's)")
    p.add_argument("--links", nargs="*", default=["loopback", "one", "two"], choices=("loopback", "one", "two"),
                   help="the download-time rows to run: on loopback, --rate from one source, from two")
    p.add_argument("--kill", action=argparse.BooleanOptionalAction, default=True,
                   help="the SIGKILL half-way and rerun row (imgtool's)")
    p.add_argument("--kill-client", action=argparse.BooleanOptionalAction, default=False,
                   help="the kill row for the client too (it downloads everything again)")
    p.add_argument("--bundle-rows", action=argparse.BooleanOptionalAction, default=True,
                   help="after the first loopback fetch: bytes written, verify, placement vs cp -r, the delta")
    p.add_argument("--timeline", action="store_true",
                   help="record each imgtool run's timeline (scripts/timeline.py) and print it to stderr")
    p.add_argument("--keep", action="store_true", help="keep the last download's output (work-dir/dest)")
    p.add_argument("--target", default="hf", choices=("hf", "modelscope", "dir"), help="placement's layout")
    p.add_argument("--work-dir", default="/tmp/imgtool-bench-models")
    p.add_argument("--output", default="")
    p.add_argument("--bundle", default="")
    p.add_argument("--dest", default="")
    args = p.parse_args(argv)
    global MAX_CONNECTIONS, TIMELINE
    MAX_CONNECTIONS, TIMELINE = args.max_connections, args.timeline
    if args.mode == "serve":
        serve(args.scale, args.seed, Path(args.work_dir) / "sha256")
        return 0
    if args.mode == "place":
        place(Path(args.bundle), Path(args.dest), args.target)
        return 0
    if args.mode == "placement":  # the placement rows alone, against a bundle made already (--bundle)
        rows: Dict[str, str] = {}
        load_before = os.getloadavg()
        placement_rows(args, Path(args.work_dir), Path(args.bundle), rows)
        text = (f"Load average at the start: {' '.join(f'{x:.2f}' for x in load_before)}; at the end: "
                f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; median of {max(1, args.runs)} run(s).\n"
                + "\n".join(f"| {k} | {v} |" for k, v in rows.items()) + "\n")
        if args.output:
            Path(args.output).write_text(text)
        print(text)
        return 0
    return main_bench(args)


if __name__ == "__main__":
    sys.exit(main())
