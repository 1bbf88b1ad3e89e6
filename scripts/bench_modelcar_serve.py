#!/usr/bin/env python3
"""serve: the modelcar layers against the raw layers (issue 49: "serve moves the modelcar layers at >= 0.9x its
throughput for the raw layers").

A model-only bundle of a generated model (tests/support/models.py `generated_model`: SHARDS shards of --shard-mb MB
and the small files) with its modelcar layer digests (as fetch records them) is served by `imgtool serve` on
loopback; curl GETs every shard's raw blob and its modelcar layer whole into /dev/null, alternating raw and modelcar
per run so both meet the same page cache and load; each blob was read once before timing (warm cache: what is
measured is serve, not the disk). Prints a markdown table: seconds and MB/s per kind per run, and the ratio.

    scripts/bench_modelcar_serve.py --shard-mb 1024 --runs 3

Not product code: imgtool/ never imports it.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARDS = 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shard-mb", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work-dir", default="")
    args = p.parse_args()
    from tests.support.bundles import BlobDir, put_model, write
    from tests.support.models import generated_model

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="imgtool-bench-car-"))
    store = BlobDir(work / "blobs")
    model = put_model(store, generated_model(seed="car", shards=SHARDS, shard_bytes=args.shard_mb * 1000 * 1000,
                                             sha_cache=work / "sha"), modelcar=True)
    out = work / "bundle"
    write(out, [], store, models=[model])
    subprocess.run(["rm", "-rf", str(store.root)], check=True)  # the bundle alone on disk
    proc = subprocess.Popen([sys.executable, "-m", "imgtool", "serve", str(out), "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        url = re.search(r"(https?://[^\s/]+)", first).group(1)  # type: ignore[union-attr]
        base = f"{url}/v2/hf/imgtool-bench/big-llm/blobs/"
        shards = [f for f in model.files if f.size >= args.shard_mb * 1000 * 1000 // 2]
        kinds = {"raw": [str(f.sha256) for f in shards], "modelcar": [str(f.modelcar) for f in shards]}
        size = {"raw": sum(f.size for f in shards), "modelcar": sum(f.size + 1536 for f in shards)}
        for digests in kinds.values():  # warm: the page cache holds the parts, serve checked every blob
            for d in digests:
                get(base + d)
        rows = {k: [] for k in kinds}
        for _ in range(args.runs):
            for kind, digests in kinds.items():
                started = time.monotonic()
                for d in digests:
                    get(base + d)
                rows[kind].append(time.monotonic() - started)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("| kind | bytes | runs (s) | median MB/s |\n|---|---|---|---|")
    rate = {}
    for kind, times in rows.items():
        rate[kind] = size[kind] / statistics.median(times) / 1e6
        print(f"| {kind} | {size[kind]} | {', '.join(f'{t:.2f}' for t in times)} | {rate[kind]:.0f} |")
    print(f"\nmodelcar / raw throughput: {rate['modelcar'] / rate['raw']:.2f}x")
    if not args.work_dir:
        subprocess.run(["rm", "-rf", str(work)], check=True)


def get(url: str) -> None:
    r = subprocess.run(["curl", "-sf", "-o", os.devnull, url], timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"curl {url}: exit {r.returncode}")


if __name__ == "__main__":
    main()
