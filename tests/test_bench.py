"""scripts/bench.py keeps working: --quick against the running test services writes every row.

It checks the shape of the report, never a speed (this is a 2-core machine shared by a suite).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "scripts" / "bench.py"

sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402


def test_bench_quick_writes_every_row(services, tmp_path):
    out = tmp_path / "bench.md"
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--output", str(out),
                           "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "using the running test services" in proc.stderr
    text = out.read_text()
    assert text.startswith("# Benchmarks\n")
    for heading in ("## Machine", "## Image", "## Results", "## Targets", "## imgtool serve",
                    "## Peak memory (RSS) of imgtool"):
        assert heading + "\n" in text
    for label in ("| CPU |", "| RAM |", "| kernel |", "| Python |", "| Docker |", "| skopeo |",
                  "| load average at start |"):
        assert label in text
    # every measurement row is there with a number (none skipped)
    for _key, task, tool in bench.ROWS:
        row = re.search(rf"^\| {re.escape(task)} \| {re.escape(tool)} \| ([0-9.]+) \| 1 \|", text, re.M)
        assert row, f"no timing row for {task}: {tool}"
    for name, _key in bench.RSS_ROWS:
        row = re.search(rf"^\| imgtool {re.escape(name)} \| ([0-9]+) MiB \| ([0-9]+) MiB \|$", text, re.M)
        assert row, f"no memory row for imgtool {name}"
        assert int(row.group(1)) > 5 and int(row.group(2)) > 5  # a real measurement of a real process
    targets = re.findall(r"^\| (.+?) \| (.+?) \| (yes|no|) \|$", text.split("## Targets")[1], re.M)
    assert len(targets) == 18 and all(value != "skipped" for _, value, _ in targets)
    # over-download: bytes the registry sent against the blob bytes, for every case
    assert "## Over-download\n" in text
    for _key, name in bench.OVER_ROWS:
        row = re.search(rf"^\| {re.escape(name)} \| 1 \| ([0-9.]+) \| ([+-][0-9.]+) %", text, re.M)
        assert row, f"no over-download row for {name}"
        assert float(row.group(1)) > 0 and float(row.group(2)) >= 0  # every blob byte went through the proxy
    # imgtool serve against the registry: throughput at 1, 4 and 8 pulls at once, their ratio, each server's CPU
    # and memory (the registry found through /proc by its port)
    for n in bench.SERVE_PULLS:
        row = re.search(rf"^\| {n} \| ([0-9]+) \| ([0-9]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9]+) MiB \| "
                        r"([0-9]+) MiB \|$", text, re.M)
        assert row and int(row.group(6)) > 5 and int(row.group(7)) > 5, f"no serve row for {n} pulls"
    # the work directory keeps only the built images (cached), no run scratch space
    assert not list((tmp_path / "work").glob("run-*"))


def test_throttle_proxy_holds_a_connection_to_its_rate(services, registry, uniq):
    """Never ahead of its rate at any point of the body; no upper bound on the time, which only a
    busy machine would break (the proxy's sleeps are at least as long as asked, never shorter)."""
    import time

    import requests

    rate = 2 * bench.MB
    data = os.urandom(3 * bench.MB)
    digest = registry("plain").push_blob(f"{uniq}/blob", data)
    proxy = bench.ThrottleProxy(services.plain, rate)
    ahead = []
    try:
        s = requests.Session()
        s.trust_env = False
        got = bytearray()
        t0 = time.monotonic()
        with s.get(f"http://{proxy.address}/v2/{uniq}/blob/blobs/{digest}", stream=True) as r:
            for chunk in r.iter_content(64 * 1024):
                got += chunk
                # what may have arrived by now: rate x time, plus the 50 ms of credit the proxy
                # allows and the 64 KiB it sends before its first sleep
                allowed = rate * (time.monotonic() - t0 + 0.05) + 64 * 1024
                if len(got) > allowed:
                    ahead.append((len(got), int(allowed)))
    finally:
        proxy.close()
    assert r.status_code == 200 and bytes(got) == data
    assert ahead == [], f"bytes received ahead of {rate} B/s: {ahead[:5]}"
