#!/usr/bin/env python3
"""Models (issue 48): imgtool's download of a model from a Hugging Face endpoint against the real client's.

A seeded model (tests/support/models.py `generated_model`: five shards of 4 GB and the small files at --scale 1,
20 GB; --scale 0.05 is 1 GB) is served by the loopback Hugging Face stand-in (tests/support/hub.py) from bytes
made as they are sent, never stored on disk, in a process of its own, behind bench.py's ThrottleProxy (which
counts what it forwards and, on the constrained link, holds each TCP connection to --rate MB/s). Each contestant
downloads the whole model into an empty directory on the same disk:

  imgtool   `imgtool_fetch_cmd`: for now `pull_model` into a store (regions=None), through the one downloader
            (puller.download_blobs: ranged, over every agreeing endpoint). Fetch into a bundle is being built;
            once `imgtool fetch hf:ORG/NAME` carries models, `imgtool_fetch_cmd` is the one function to change.
  hf        huggingface_hub's `snapshot_download` (the real client, from the hub-clients venv scripts/test.sh makes),
            default settings (its default is max_workers=8) and, with --hf-workers, others.

Rows: download time on loopback; on a --rate MB/s-per-connection link, one source and two (imgtool takes both
endpoints; the client can use one, $HF_ENDPOINT); bytes written by the downloading process (/proc/self/io wchar,
sockets included: a few kB) against the model's bytes; SIGKILL once half the model was received, then a rerun:
the bytes downloaded again against what the killed run received; peak RSS (GNU time).

    scripts/bench_models.py --scale 0.05                  # 1 GB, a few minutes; writes the table to stdout
    scripts/bench_models.py --scale 1 --output x.md       # the issue's 20 GB model (60 GB of free disk)

Not product code: imgtool/ never imports it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

MB = 1000 * 1000
REPO = "imgtool-bench/big-llm"
SHARDS = 5
FULL_SHARD = 4 << 30  # --scale 1: five of them, the 20 GB model

_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"bench_models: [{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# --- the hub, in a process of its own ------------------------------------------------------------------------

def serve(scale: float, seed: str, cache: Path) -> None:
    """The stand-in serving the generated model until stdin closes; prints {"url", "bytes"} once listening."""
    from tests.support.hub import Hub
    from tests.support.models import generated_model

    model = generated_model(seed=seed, repo_id=REPO, shards=SHARDS, shard_bytes=int(FULL_SHARD * scale), sha_cache=cache)
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

def pull(endpoints: Sequence[str], store_dir: str) -> None:
    """imgtool's side, in this process: resolve, complete, pull_model into the store; prints what it did."""
    from imgtool import hubs
    from imgtool.config import HubEnvironment, MirrorConfig, ModelMirror
    from imgtool.model_pull import pull_model
    from imgtool.progress import Progress
    from imgtool.store import Store
    from imgtool.weights import parse_model_ref

    ref = parse_model_ref(f"hf:{REPO}")
    config = MirrorConfig("quay.io/ascend/vllm-ascend", (), "mirrors.toml",
                          model_mirrors=tuple(ModelMirror(f"m{i + 1}", "hf", url) for i, url in enumerate(endpoints[1:])))
    env = HubEnvironment(hf_endpoint=endpoints[0], hf_default=None, modelscope_default=None)
    res = hubs.resolve(ref, hubs.open_hubs(ref, config, env))
    store = Store(Path(store_dir))
    stats = pull_model(res.complete(store), store, Progress(), regions=None)
    print(json.dumps({"per_source": stats.per_source, "resumed": stats.resumed_bytes, "io": _io()}), flush=True)


def _io() -> Dict[str, int]:
    out = {}
    for line in open("/proc/self/io"):
        k, v = line.split(":")
        out[k] = int(v)
    return out


def imgtool_fetch_cmd(endpoints: Sequence[str], dest: Path) -> List[str]:
    """imgtool's download of the model from `endpoints` (the first as $HF_ENDPOINT, the rest as [[model_mirrors]])
    into `dest`. Today `pull_model` into a store; once fetch carries models, `imgtool fetch hf:ORG/NAME` here."""
    return [sys.executable, __file__, "pull", "--store", str(dest)] + [f"--endpoint={e}" for e in endpoints]


_HF = """
import json, sys, warnings
warnings.simplefilter("ignore")
from huggingface_hub import snapshot_download
kw = {} if sys.argv[3] == "default" else {"max_workers": int(sys.argv[3])}
snapshot_download(sys.argv[1], cache_dir=sys.argv[2], **kw)
print(json.dumps({"io": {l.split(":")[0]: int(l.split(":")[1]) for l in open("/proc/self/io")}}), flush=True)
"""


def hf_python() -> str:
    python = ROOT / ".venv" / "hub-clients" / "bin" / "python"
    if not python.exists():
        sys.exit(f"{python} is missing: scripts/test.sh makes it (the real hub clients)")
    return str(python)


def hf_cmd(dest: Path, workers: str) -> List[str]:
    return [hf_python(), "-c", _HF, REPO, str(dest), workers]


def hf_env(endpoint: str, home: Path) -> Dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8", "NO_PROXY": "*",
            "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_ETAG_TIMEOUT": "60", "HF_HUB_DOWNLOAD_TIMEOUT": "60"}


# --- measuring -----------------------------------------------------------------------------------------------

class Run:
    def __init__(self, seconds: float, rss_kb: int, written: int, sent: int, out: dict):
        self.seconds, self.rss_kb, self.written, self.sent, self.out = seconds, rss_kb, written, sent, out


def timed(cmd: List[str], env: Optional[Dict[str, str]], proxies: Sequence) -> Run:
    """Run `cmd` to its end: its wall time, peak RSS, bytes it wrote, bytes the proxies sent it."""
    from bench import run

    before = sum(p.sent for p in proxies)
    r = run(cmd, env=env, cwd=ROOT, rss=True)
    doc = json.loads(r.out.strip().splitlines()[-1])
    return Run(r.seconds, r.rss_kb, doc["io"]["wchar"], sum(p.sent for p in proxies) - before, doc)


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
    import shutil

    d = work / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def main_bench(args) -> int:
    from bench import ThrottleProxy

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="hfhome-", dir=work))
    rate = args.rate * MB
    log(f"the model: {SHARDS} shards of {int(FULL_SHARD * args.scale) / MB:.0f} MB (scale {args.scale}), generated")
    hub1, hub2 = HubProcess(args), HubProcess(args)
    total = hub1.bytes
    results: Dict[str, List[Run]] = {}
    kills: Dict[str, Tuple[int, int]] = {}
    contestants = [("imgtool", lambda urls, d: (imgtool_fetch_cmd(urls, d), None))] + [
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
                        if n == 2 and name != "imgtool":
                            continue  # the client reads one endpoint ($HF_ENDPOINT): its one-source row stands
                        cmd, env = make(urls, fresh(work, "dest"))
                        log(f"{link}: {name}")
                        run = timed(cmd, env, proxies)
                        results.setdefault(f"{link}|{name}", []).append(run)
                        log(f"  {run.seconds:.1f} s, {run.sent / MB:.0f} MB sent, {run.written / MB:.0f} MB written, "
                            f"peak RSS {run.rss_kb / 1024:.0f} MiB {run.out.get('per_source', '')}")
            finally:
                for p in proxies:
                    p.close()
        proxy = ThrottleProxy(hub1.url[7:], 0.0)
        try:
            for name, make in contestants[:2] if args.kill else []:
                dest = fresh(work, "dest")
                cmd, env = make([f"http://{proxy.address}"], dest)
                got = killed_half_way(cmd, env, proxy, total)
                rerun = timed(cmd, env, [proxy])
                kills[name] = (got, got + rerun.sent - total)
                log(f"kill: {name}: received {got / MB:.0f} MB, then {rerun.sent / MB:.0f} MB: "
                    f"{kills[name][1] / MB:.0f} MB again")
        finally:
            proxy.close()
    finally:
        hub1.close()
        hub2.close()
    text = report(results, kills, total, args)
    if args.output:
        Path(args.output).write_text(text)
    print(text)
    return 0


def report(results: Dict[str, List[Run]], kills: Dict[str, Tuple[int, int]], total: int, args) -> str:
    def med(key: str, attr: str) -> Optional[float]:
        runs = results.get(key)
        return statistics.median(getattr(r, attr) for r in runs) if runs else None

    names = sorted({k.split("|")[1] for k in results}, key=lambda n: (n != "imgtool", n))
    hf = next(n for n in names if n != "imgtool")
    lines = [f"Model: {SHARDS} shards of {int(FULL_SHARD * args.scale) / MB:,.0f} MB plus the small files, "
             f"{total / MB:,.0f} MB (--scale {args.scale}); median of {args.runs} run(s).", "",
             "| row | imgtool | " + " | ".join(n for n in names if n != "imgtool") + " | imgtool vs the client |",
             "|---|---|" + "---|" * (len(names) - 1) + "---|"]
    links = sorted({k.split("|")[0] for k in results}, key=lambda s: ("MB/s" in s, "two" in s))
    for link in links:
        cells = []
        for n in names:
            v = med(f"{link}|{n}", "seconds")
            cells.append(f"{v:.1f} s" if v is not None else "(one endpoint only)")
        mine = med(f"{link}|imgtool", "seconds")
        base = med(f"{link}|{hf}", "seconds") or med(f"{link.replace('two sources', 'one source')}|{hf}", "seconds")
        ratio = f"{base / mine:.2f}× faster" if mine and base else "-"
        lines.append(f"| download time, {link} | " + " | ".join(cells) + f" | {ratio} |")
    first = links[0]
    if not kills:
        return "\n".join(lines) + "\n"
    cells = []
    for n in names:
        w = med(f"{first}|{n}", "written")
        cells.append(f"{w / MB:,.0f} MB ({(w / total - 1) * 100:+.2f} %)" if w is not None else "-")
    lines.append(f"| bytes written by the downloading process ({first}), vs {total / MB:,.0f} MB | " + " | ".join(cells)
                 + " | |")
    cells = []
    for n in names:
        k = kills.get(n)
        cells.append(f"{k[1] / MB:,.0f} MB of {k[0] / MB:,.0f} MB received ({k[1] / k[0] * 100:.1f} %)" if k else "-")
    lines.append("| SIGKILL half-way, rerun: downloaded again | " + " | ".join(cells) + " | |")
    cells = []
    for n in names:
        peaks = [r.rss_kb for k, runs in results.items() if k.endswith("|" + n) for r in runs]
        cells.append(f"{max(peaks) / 1024:.0f} MiB" if peaks else "-")
    lines.append("| peak RSS (any run) | " + " | ".join(cells) + " | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="bench", choices=("bench", "serve", "pull"))
    p.add_argument("--scale", type=float, default=1.0, help="of the 20 GB model (0.05: 1 GB)")
    p.add_argument("--seed", default="bench1")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--rate", type=float, default=20.0, help="constrained link: MB/s per TCP connection")
    p.add_argument("--hf-workers", nargs="*", default=["default"],
                   help="the client's max_workers to run (default: its default, 8); e.g. default 16")
    p.add_argument("--links", nargs="*", default=["loopback", "one", "two"], choices=("loopback", "one", "two"),
                   help="the download-time rows to run: on loopback, --rate from one source, from two")
    p.add_argument("--kill", action=argparse.BooleanOptionalAction, default=True,
                   help="the SIGKILL half-way and rerun row (and the bytes and RSS rows)")
    p.add_argument("--work-dir", default="/tmp/imgtool-bench-models")
    p.add_argument("--output", default="")
    p.add_argument("--endpoint", action="append", default=[])
    p.add_argument("--store", default="")
    args = p.parse_args(argv)
    if args.mode == "serve":
        serve(args.scale, args.seed, Path(args.work_dir) / "sha256")
        return 0
    if args.mode == "pull":
        pull(args.endpoint, args.store)
        return 0
    return main_bench(args)


if __name__ == "__main__":
    sys.exit(main())
