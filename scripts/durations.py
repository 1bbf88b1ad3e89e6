#!/usr/bin/env python3
"""Where the suite's time goes, from the output of `PYTEST_ADDOPTS=--durations=0 scripts/test.sh`.

    PYTEST_ADDOPTS=--durations=0 scripts/test.sh 2>&1 | tee run.log
    python3 scripts/durations.py run.log [--top 15]

Prints markdown: each pytest run's wall time as pytest reported it (the fast tier, then the services
tier), the test time per tier and per module (setup + call + teardown, summed over workers), and the
slowest tests. docs/testing.md keeps the tables of the runs before and after a change.
"""

import argparse
import collections
import re
import sys

DURATION = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)")
SUMMARY = re.compile(r"^=*\s*(?:\d+ \w+, )*\d+ (?:passed|failed)\b.* in ([\d.]+)s")
ENGINE = re.compile(r"\[(?:[^\]]*-)?(20\.10|26\.1-containerd|26\.1|containerd-1\.6|containerd-1\.7|podman-4\.3)(?:-[^\]]*)?\]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    runs = []  # [(wall seconds, {test: seconds})] in the order pytest printed them
    current = collections.Counter()
    with open(args.log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = DURATION.match(line)
            if m:
                current[m.group(3)] += float(m.group(1))
                continue
            m = SUMMARY.match(line.strip())
            if m:
                runs.append((float(m.group(1)), current))
                current = collections.Counter()
    if not runs:
        print(f"{args.log}: no pytest summary line found", file=sys.stderr)
        return 1
    names = ["fast tier", "services tier"] if len(runs) == 2 else [f"run {i + 1}" for i in range(len(runs))]
    print("| pytest run | wall | tests over 5 ms | test time (summed) |\n|---|---|---|---|")
    for name, (wall, tests) in zip(names, runs):
        print(f"| {name} | {wall:.0f} s | {len(tests)} | {sum(tests.values()):.0f} s |")
    print(f"| **all** | **{sum(w for w, _ in runs):.0f} s** | {sum(len(t) for _, t in runs)} | "
          f"{sum(sum(t.values()) for _, t in runs):.0f} s |")
    everything = collections.Counter()
    for _, tests in runs:
        everything.update(tests)
    modules = collections.Counter()
    engines = collections.Counter()
    for test, seconds in everything.items():
        modules[test.split("::")[0]] += seconds
        m = ENGINE.search(test)
        engines[m.group(1) if m else "(none)"] += seconds
    print("\n| module | test time |\n|---|---|")
    for module, seconds in modules.most_common(args.top):
        print(f"| {module} | {seconds:.0f} s |")
    print("\n| runtime a test is parametrized on | test time |\n|---|---|")
    for engine, seconds in engines.most_common():
        print(f"| {engine} | {seconds:.0f} s |")
    print("\n| slowest tests | time |\n|---|---|")
    for test, seconds in everything.most_common(args.top):
        print(f"| `{test}` | {seconds:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
