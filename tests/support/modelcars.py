"""A seeded model's modelcar image (imgtool/modelcar.py) as an OCI layout tar, and its import into a runtime.

Until `imgtool load` imports the modelcar itself, the tests that mount one build it here from the same pure
functions (modelcar.image, modelcar.layer_chunks) and import it with the runtime's own command, as an operator
would: `ctr -n k8s.io images import` (the namespace the kubelet's CRI reads), `podman load`.

    tar = write_modelcar(model.head, "hf", "imgtool-test/tiny-llm", tmp_path / "modelcar.tar")
    ref = modelcar_name("hf", "imgtool-test/tiny-llm", model.head.commit)
"""

import io
import json
import tarfile
from pathlib import Path
from typing import Iterable, Tuple

from imgtool import modelcar
from imgtool.bundle.catalog import modelcar_reference
from imgtool.model import OCI_INDEX, Digest
from tests.support.models import Revision


def modelcar_name(hub: str, repo: str, commit: str) -> str:
    ref = modelcar_reference(hub, repo, commit)
    assert ref is not None
    return ref


def modelcar_of(revision: Revision, hub: str, repo: str) -> modelcar.Modelcar:
    files = [modelcar.LayerFile(f.path, f.size, modelcar.layer_digest(f.path, f.size, f.chunks()),
                                 Digest.parse("sha256:" + f.sha256))
             for f in revision.files.values()]
    return modelcar.image(files, f"{hub}:{repo}", revision.commit)


def _add(tar: tarfile.TarFile, name: str, size: int, chunks: Iterable[bytes]) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    tar.addfile(info, io.BytesIO(b"".join(chunks)))  # a test model's files are small


def write_modelcar(revision: Revision, hub: str, repo: str, path: Path) -> Path:
    """The modelcar of `revision` as an OCI layout tar, its index named (io.containerd.image.name, and
    org.opencontainers.image.ref.name for the tag) as `modelcar_name` says; returns `path`."""
    car = modelcar_of(revision, hub, repo)
    name = modelcar_name(hub, repo, revision.commit)
    entry = {"mediaType": OCI_INDEX, "digest": str(car.digest), "size": len(car.index),
             "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}
    blobs = {str(car.digest): car.index}
    for _os, _arch, manifest, config in car.manifests:
        for doc in (manifest, config):
            blobs[str(Digest.of(doc))] = doc
    with tarfile.open(path, "w") as tar:
        _add(tar, "oci-layout", 30, [b'{"imageLayoutVersion":"1.0.0"}'])
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}).encode()
        _add(tar, "index.json", len(index), [index])
        for digest, doc in blobs.items():
            _add(tar, "blobs/sha256/" + digest.split(":", 1)[1], len(doc), [doc])
        by_path = {f.path: f for f in revision.files.values()}
        done = set()
        for f, layer in zip(sorted(by_path), car.layers):
            if str(layer.digest) in done:
                continue
            done.add(str(layer.digest))
            ff = by_path[f]
            _add(tar, "blobs/sha256/" + layer.digest.hex, layer.size, modelcar.layer_chunks(ff.path, ff.size, ff.chunks()))
    return path


def modelcar_bundle(tmp_path: Path, model, repo: str = "imgtool-test/tiny-llm") -> Tuple[Path, str]:
    """A model-only bundle of `model`'s head with its modelcar digests (what `load --models image` imports), and
    the modelcar's name."""
    from tests.support.bundles import BlobDir, put_model, write

    store = BlobDir(tmp_path / "modelcar-blobs")
    bundle = tmp_path / "modelcar-bundle"
    write(bundle, [], store, models=[put_model(store, model, "main", modelcar=True)])
    return bundle, modelcar_name("hf", repo, model.head.commit)


def read_every_file(where: str, tool: str = "") -> str:
    """A shell line a container runs: each file under `where` with its sha256 (sorted), then `read-only` if
    writing there fails (`tool`: the busybox to run the applets through, where the image links only a few)."""
    t = f"{tool} " if tool else ""
    return (f"cd {where} && {t}find . -type f | {t}sort | {t}xargs {t}sha256sum && "
            f"({t}touch config.json 2>/dev/null || echo read-only)")


def assert_read_every_file(stdout: str, bundle: Path) -> None:
    """What read_every_file printed: every file of the bundle's model with bundle.json's sha256, and read-only."""
    lines = stdout.splitlines()
    assert lines[-1:] == ["read-only"], stdout
    doc = json.loads((bundle / "bundle.json").read_text())
    assert sorted(ln.split() for ln in lines[:-1]) == sorted(
        [f["sha256"][len("sha256:"):], "./" + f["path"]] for f in doc["models"][0]["files"])
