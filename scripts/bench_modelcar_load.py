#!/usr/bin/env python3
"""load --models image into containerd against `ctr images import` of a prebuilt modelcar archive (issue 49:
"streaming the modelcar into containerd takes <= 1.1x a ctr images import of a prebuilt modelcar archive of the same
model").

A model-only bundle of a generated model (tests/support/models.py `generated_model`: SHARDS shards of --shard-mb MB
and the small files) with its modelcar layer digests, as fetch records them; the same model's modelcar written once,
untimed, as the OCI layout tar an operator would import (index named by io.containerd.image.name, the layers the
very bytes imgtool frames). Each run, alternating: every record of the image removed (`ctr images rm --sync` of its
tag, its repo@digest names and the CRI's sha256:CONFIG record: its content and snapshots go with them), then
`ctr -n k8s.io images import` of the tar (the containerd's own ctr: 2.x imports through the transfer service), then
the image removed again and
`imgtool load BUNDLE --models-only --models image` into the same namespace. Both unpack into the overlayfs
snapshotter; imgtool also checks every file's sha256 and every part on the way and pins the image.
Needs the test services' containerd (`eval "$(scripts/services.sh env)"`).

    scripts/bench_modelcar_load.py --containerd 2.1 --shard-mb 1024 --runs 3

Prints a markdown table: seconds, CPU seconds (of the command; containerd's own work is not counted) and the ratio.
Not product code: imgtool/ never imports it.
"""

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARDS = 2


class _Chunks(io.RawIOBase):
    """An iterator of bytes as a file tarfile can read, never more than one chunk in memory."""

    def __init__(self, chunks):
        self._chunks, self._left = iter(chunks), b""

    def readable(self):
        return True

    def readinto(self, buf):
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buf), len(self._left))
        buf[:n], self._left = self._left[:n], self._left[n:]
        return n


def write_archive(model, revision, name: str, path: Path) -> None:
    """The modelcar of `model` (a BundleModel with its modelcar digests) as an OCI layout tar named `name`."""
    from imgtool import modelcar
    from imgtool.model import OCI_INDEX, Digest

    car = model.modelcar()
    entry = {"mediaType": OCI_INDEX, "digest": str(car.digest), "size": len(car.index),
             "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}
    by_path = {f.path: f for f in revision.files.values()}

    def add(tar, member, size, chunks):
        info = tarfile.TarInfo(member)
        info.size, info.mode = size, 0o644
        tar.addfile(info, io.BufferedReader(_Chunks(chunks), 1 << 20))

    with tarfile.open(path, "w") as tar:
        add(tar, "oci-layout", 30, [b'{"imageLayoutVersion":"1.0.0"}'])
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}).encode()
        add(tar, "index.json", len(index), [index])
        docs = [car.index] + [d for _o, _a, m, c in car.manifests for d in (m, c)]
        for doc in docs:
            add(tar, "blobs/sha256/" + Digest.of(doc).hex, len(doc), [doc])
        for f in model.files:
            src = by_path[f.path]
            add(tar, "blobs/sha256/" + f.modelcar.hex, modelcar.layer_size(f.path, f.size),
                modelcar.layer_chunks(f.path, f.size, src.chunks()))


def timed(cmd, env=None):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--containerd", default="2.1", help="which of the services' containerds (1.7, 2.1)")
    p.add_argument("--shard-mb", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work-dir", default="")
    args = p.parse_args()
    from imgtool.bundle.catalog import model_repository
    from imgtool import modelcar
    from tests.support.bundles import BlobDir, put_model, write
    from tests.support.models import generated_model

    socks = dict(i.split("=", 1) for i in os.environ.get("IMGTOOL_TEST_CONTAINERDS", "").split())
    if args.containerd not in socks:
        sys.exit(f'bench_modelcar_load.py: no containerd {args.containerd} among the services: eval "$(scripts/services.sh env)"')
    sock = socks[args.containerd]
    own_ctr = Path(sock).parent / "bin" / "ctr"
    ctr = [str(own_ctr) if own_ctr.exists() else "ctr", "--address", sock, "-n", "k8s.io"]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="imgtool-bench-carload-"))
    store = BlobDir(work / "blobs")
    hub_model = generated_model(seed="carload", shards=SHARDS, shard_bytes=args.shard_mb * 1000 * 1000,
                                sha_cache=work / "sha")
    model = put_model(store, hub_model, modelcar=True)
    out = work / "bundle"
    write(out, [], store, models=[model])
    subprocess.run(["rm", "-rf", str(store.root)], check=True)  # the bundle alone on disk
    name = f"models.local/{model_repository(model)}:{modelcar.tag(model.commit)}"
    archive = work / "modelcar.tar"
    write_archive(model, hub_model.resolve("main"), name, archive)
    size = sum(f.size for f in model.files)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "IMGTOOL_"))}
    jobs = {"ctr images import (prebuilt modelcar)": ctr + ["images", "import", str(archive)],
            "imgtool load --models image": [sys.executable, "-m", "imgtool", "-q", "load", str(out), "--models-only",
                                            "--models", "image", "--runtime", "containerd", "--address", sock,
                                            "--namespace", "k8s.io"]}
    repository = name.rsplit(":", 1)[0]
    from imgtool.model import Digest

    config_ids = {str(Digest.of(config)) for _o, _a, _m, config in model.modelcar().manifests}  # the CRI's ID records

    def remove_all() -> None:
        """Every record of the image (its tag, and the repo@digest names a load or the CRI adds: one left keeps every
        blob and snapshot, and the next run would send nothing), removed with their content."""
        names = subprocess.run(ctr + ["images", "ls", "-q"], capture_output=True, text=True).stdout.split()
        ours = [n for n in names if n.startswith((repository + ":", repository + "@")) or n in config_ids]
        if ours:
            subprocess.run(ctr + ["images", "rm", "--sync", *ours], capture_output=True)

    times = {k: [] for k in jobs}
    cpu = {k: [] for k in jobs}
    for n in range(args.runs):
        for job, cmd in (list(jobs.items()) if n % 2 == 0 else list(reversed(jobs.items()))):
            remove_all()
            os.sync()
            s, c = timed(cmd, env)
            times[job].append(s)
            cpu[job].append(c)
            print(f"run {n + 1} {job}: {s:.2f} s, CPU {c:.2f} s", file=sys.stderr, flush=True)
    remove_all()
    base = "ctr images import (prebuilt modelcar)"
    print(f"| containerd {args.containerd}, {size / 1e9:.2f} GB model | seconds (median of {args.runs}) | MB/s | "
          f"CPU s | ratio |")
    print("|---|---|---|---|---|")
    for job in jobs:
        t = statistics.median(times[job])
        print(f"| {job} | {t:.2f} | {size / 1e6 / t:.0f} | {statistics.median(cpu[job]):.2f} | "
              f"{t / statistics.median(times[base]):.2f} |")
    print(f"\nload average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    subprocess.run(["rm", "-rf", str(work)], check=True)


if __name__ == "__main__":
    main()
