#!/usr/bin/env python3
"""Before and after, in one run: two versions of imgtool on the same image, alternating.

    eval "$(scripts/services.sh env)"          # the test services (a registry, Docker 20.10)
    scripts/compare.py eeac0db --scale 0.05    # that commit against this checkout

The older version is checked out (git worktree) and installed into its own venv under --work-dir;
this checkout runs as `python -m imgtool`. Each round runs, for each version in turn: `fetch` of the
bench image's arm64 platform (scripts/benchimage.py: the vllm-ascend-shaped one) with a fresh cache, the full `verify` of
that bundle, `copy` of it into a gzip bundle and of that back into an uncompressed one (the compressed archive read
forward: bundle/archive.py), and `load` into Docker 20.10 and into containerd 1.7's k8s.io (where the services run
it; the image removed before each load). Prints the medians,
each one's peak RSS, and the ratio after/before: above 1 is slower now; beside them the median CPU seconds (user +
system of imgtool and what it waited for, not a daemon's) and their ratio, which a busy machine hardly moves when it
swings the wall times by 3x, and the user part alone: the system part of one fetch of the same image by the same
version swung 2.9-7.8 s here (the kernel's page-cache reclaim), which moved HEAD against HEAD to 1.15x CPU, while the
user part (the hashing, Python) stayed within 0.3 s. Not product code.

Both versions run from bytecode compiled before the first timed run: pip compiles the older one's at install, and
this checkout's modules are compiled here (`compiled`). Without it, where PYTHONDONTWRITEBYTECODE is set (the
shells of the machine issue 47 was measured on set it), "after" compiled its ~80 modules from source on every run
(0.17 CPU s each time) while "before" read pip's .pyc: copy's 1.4 s at scale 0.05 came out 10-15 % slower for that
alone.
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (the image generator, the registry push, the command runner)

ROOT = Path(__file__).resolve().parent.parent


def old_imgtool(rev: str, work: Path) -> List[str]:
    """The command running imgtool at `rev`, installed once into work/old-REV."""
    where = work / f"old-{rev}"
    python = where / "venv" / "bin" / "python"
    if not python.exists():
        if where.exists():
            shutil.rmtree(where)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where / "src"), rev], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", str(where / "src")], check=True)
    # its console script, not `python -m imgtool`: -m puts the working directory first on sys.path, so run from
    # a checkout it imported that checkout's imgtool, and "before" measured the code it was compared with
    return [str(where / "venv" / "bin" / "imgtool")]


def compiled(root: Path) -> None:
    """This checkout's modules compiled to bytecode, as pip compiled the older version's when it installed it.

    compileall writes the .pyc files even under PYTHONDONTWRITEBYTECODE, where the interpreter never would (and
    into PYTHONPYCACHEPREFIX when that is set, where the timed runs read them with the same environment)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "imgtool")], check=True)


def _empty_k8s_io(address: str) -> None:
    """Every image record in the test containerd's k8s.io removed, with what only they held: a load leaves its
    name, the CRI's config-digest ref and ctr's import ref, and any one of them makes the next load a no-op."""
    ctr = ["ctr", "--address", address, "-n", "k8s.io", "images"]
    names = subprocess.run(ctr + ["ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    if names:
        subprocess.run(ctr + ["rm", "--sync", *names], capture_output=True, check=True)


def timed(cmd: List[str], env: Dict[str, str]) -> Tuple[float, int, float, float]:
    """(wall seconds, peak RSS in KiB, CPU seconds: user + system of the command and the children it waited for,
    and the user part alone)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = bench.run(cmd, env=env, rss=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user = after.ru_utime - before.ru_utime
    return r.seconds, r.rss_kb, user + (after.ru_stime - before.ru_stime), user


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", help="the git revision to compare against (e.g. the round's first commit)")
    p.add_argument("--scale", type=float, default=0.05, help="bench image scale (1 = the real image)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", default="bench1")
    p.add_argument("--work-dir", default="/tmp/imgtool-compare")
    p.add_argument("--jobs", help="only these jobs, comma-separated (e.g. fetch: a bisection of one verb)")
    args = p.parse_args(argv)
    registry, docker_host = os.environ.get("IMGTOOL_TEST_REGISTRY_PLAIN"), os.environ.get("IMGTOOL_TEST_DOCKER_HOST")
    if not registry or not docker_host:
        sys.exit('compare.py: the test services are not running: eval "$(scripts/services.sh env)"')
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    versions = {"before": old_imgtool(args.old, work), "after": [sys.executable, "-m", "imgtool"]}
    compiled(ROOT)
    meta = bench.build_image(work / "images", args.scale, args.seed, full=False)
    repo = f"cmp{os.getpid()}/vllm-ascend"
    bench.push_image(registry, repo, "v1", meta)
    mirrors = work / "mirrors.toml"
    mirrors.write_text(f'default_image = "{registry}/{repo}"\n[[mirrors]]\nname = "local"\n'
                       f'registry = "{registry}"\nurl = "http://{registry}"\nupstream = true\ninsecure = true\n')
    ref = f"{registry}/{repo}:v1"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "IMGTOOL_"))}
    env["DOCKER_HOST"] = docker_host
    docker = ["docker", "-H", docker_host]
    # containerd 1.7 (a Kubernetes node's), where the test services run it: the same load into k8s.io
    containerd = dict(item.split("=", 1) for item in os.environ.get("IMGTOOL_TEST_CONTAINERDS", "").split()).get("1.7")
    jobs = ["fetch", "verify", "copy", "copy-back", "load"] + (["load-containerd"] if containerd else [])
    if args.jobs:
        unknown = set(args.jobs.split(",")) - set(jobs)
        if unknown:
            sys.exit(f"compare.py: no such job here: {', '.join(sorted(unknown))} (the jobs: {', '.join(jobs)})")
        # the jobs after a fetch read its bundle, so a fetch always runs; it is timed only when asked for
        jobs = [j for j in jobs if j in args.jobs.split(",")]
    times: Dict[str, List[float]] = {}
    cpu: Dict[str, List[float]] = {}
    user: Dict[str, List[float]] = {}
    rss: Dict[str, int] = {}
    for n in range(args.runs):
        for name, cmd in (versions.items() if n % 2 == 0 else reversed(list(versions.items()))):
            out, cache = work / f"bundle-{name}", work / f"cache-{name}"
            gz, back = work / f"bundle-{name}-gz", work / f"bundle-{name}-back"
            for d in (out, cache, gz, back):
                shutil.rmtree(d, ignore_errors=True)
            e = dict(env, IMGTOOL_CACHE=str(cache))
            for job, argv_ in (("fetch", ["fetch", ref, "--arch", "arm64", "--mirrors", str(mirrors), "-o", str(out)]),
                               ("verify", ["verify", str(out)]),
                               ("copy", ["copy", f"bundle:{out}", f"bundle:{gz}", "--compress", "gzip"]),
                               ("copy-back", ["copy", f"bundle:{gz}", f"bundle:{back}"]),
                               ("load", ["load", str(out), "--runtime", "docker"]),
                               ("load-containerd", ["load", str(out), "--runtime", "containerd", "--address", str(containerd)])):
                if job not in jobs and job != "fetch":
                    continue
                if job == "load":
                    subprocess.run(docker + ["rmi", "-f", ref], capture_output=True)
                if job == "load-containerd":
                    _empty_k8s_io(str(containerd))
                # the page cache's dirty pages written back first: otherwise a job's write-back (a fetch's or a
                # copy's 300 MB at scale 0.05) throttles the writes of the next timed job, of either version, and
                # moved copy's system time between 0.4 and 1.6 s from one run to the next (issue 47's 1.3-1.8x)
                os.sync()
                seconds, kb, used, own = timed(cmd + ["-q", *argv_], e)
                if job not in jobs:
                    continue
                times.setdefault(f"{job}.{name}", []).append(seconds)
                cpu.setdefault(f"{job}.{name}", []).append(used)
                user.setdefault(f"{job}.{name}", []).append(own)
                rss[f"{job}.{name}"] = max(rss.get(f"{job}.{name}", 0), kb)
                print(f"run {n + 1} {name:6} {job:6} {seconds:7.2f} s  CPU {used:6.2f} s (user {own:5.2f} s)", file=sys.stderr, flush=True)
    subprocess.run(docker + ["rmi", "-f", ref], capture_output=True)
    for name in versions:
        for d in (work / f"bundle-{name}-gz", work / f"bundle-{name}-back"):
            shutil.rmtree(d, ignore_errors=True)
    if containerd:
        _empty_k8s_io(containerd)
    print(f"| job | before ({args.old}) | after | after/before | CPU before | after | after/before "
          "| user CPU before | after | after/before | peak RSS before | after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for job in jobs:
        b, a = statistics.median(times[f"{job}.before"]), statistics.median(times[f"{job}.after"])
        cb, ca = statistics.median(cpu[f"{job}.before"]), statistics.median(cpu[f"{job}.after"])
        ub, ua = statistics.median(user[f"{job}.before"]), statistics.median(user[f"{job}.after"])
        print(f"| {job} | {b:.2f} s | {a:.2f} s | {a / b:.2f} | {cb:.2f} s | {ca:.2f} s | {ca / cb:.2f} "
              f"| {ub:.2f} s | {ua:.2f} s | {ua / ub:.2f} "
              f"| {rss[f'{job}.before'] // 1024} MiB | {rss[f'{job}.after'] // 1024} MiB |")
    print(f"\nscale {args.scale:g}, {args.runs} runs each, alternating; load average at the end "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
