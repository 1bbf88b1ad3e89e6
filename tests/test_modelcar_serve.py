"""The modelcar form toward registries (issue 49, docs/serve.md "Models", docs/push.md "Models"): `imgtool serve`
answers models.local/HUB/org/name:COMMIT-modelcar (and :REVISION-modelcar) with the modelcar index, its platform
manifests and configs, and each layer streamed from the raw file in the parts (head + bytes + tail, HEAD and Range
anywhere in it); real clients pull it (skopeo into an OCI layout, containerd 1.7 through the hosts.toml
`serve --print-node-config` prints) and find each file's bytes under /models; `imgtool push` sends it beside the
ModelPack artifact.
"""

import hashlib
import io
import json
import subprocess
import tarfile

import pytest
import requests

from imgtool import modelcar
from imgtool.model import OCI_INDEX, Digest
from tests.support.bundles import BlobDir, imgtool, put_model, write
from tests.support.images import host_arch
from tests.support.models import small_model
from tests.test_model_registry import models_local_hosts_dir
from tests.test_serve import serving  # noqa: F401  (the fixture)

REPO = "quay.io/ascend/vllm-ascend"
MODEL_REPO = "hf/imgtool-test/tiny-llm"


@pytest.fixture
def with_car(factory, tmp_path, request):
    """A bundle of one image and one model with its modelcar layer digests (as fetch records them), parts of 64 KiB
    (files and their layers cross them); the files by path."""
    store = BlobDir(tmp_path / "blobs")
    hub = small_model(seed=49)
    model = put_model(store, hub, modelcar=True)
    out = tmp_path / "bundle"
    write(out, [store.pulled(factory.image(host_arch(), layers=1), f"{REPO}:v1")], store, chunk_size=64 << 10,
          models=[model], compress=getattr(request, "param", "none"))
    files = {f.path: f.read() for f in hub.resolve("main").files.values()}
    return out, model, files


def layer_file(data: bytes) -> tuple:
    """(path, mode, bytes) of the one file a modelcar layer holds."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        (member,) = tar.getmembers()
        return member.name, member.mode, tar.extractfile(member).read()


def expected_layer(path: str, data: bytes) -> bytes:
    return modelcar.head(path, len(data)) + data + modelcar.tail(len(data))


def test_serve_answers_the_modelcar_by_commit_and_revision_and_skopeo_copies_it_whole(with_car, serving, tmp_path):  # noqa: F811
    out, model, files = with_car
    car = model.modelcar()
    s = serving(str(out), "--listen", "127.0.0.1:0")
    base, name = f"{s.url}/v2/{MODEL_REPO}", f"{s.hostport}/{MODEL_REPO}"
    for tag in (f"{model.commit}-modelcar", "main-modelcar"):
        m = requests.get(f"{base}/manifests/{tag}", timeout=30)
        assert (m.status_code, m.headers["Content-Type"], m.headers["Docker-Content-Digest"], m.content) == \
            (200, OCI_INDEX, str(car.digest), car.index)
    said = s.printed_until("docker pull")
    assert (f"is served as its ModelPack artifact models.local/{MODEL_REPO}@{model.manifest_digest} and its modelcar "
            f"image models.local/{MODEL_REPO}:{model.commit}-modelcar ({car.digest})") in said, said
    assert "cat > /etc/containerd/certs.d/models.local/hosts.toml <<'EOF'" in said, said  # the node config covers it
    tags = requests.get(f"{base}/tags/list", timeout=30).json()["tags"]
    assert tags == sorted([model.commit, "main", f"{model.commit}-modelcar", "main-modelcar"])
    # every platform of the index, its manifest, config and layers, checked by skopeo against their digests
    oci = tmp_path / "oci"
    r = subprocess.run(["skopeo", "copy", "--all", "--preserve-digests", "--retry-times", "0", "--src-tls-verify=false",
                        f"docker://{name}:{model.commit}-modelcar", f"oci:{oci}:car"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    index = json.loads((oci / "index.json").read_text())
    assert index["manifests"][0]["digest"] == str(car.digest)
    blobs = oci / "blobs" / "sha256"
    for _, arch, manifest, config in car.manifests:
        assert (blobs / Digest.of(manifest).hex).read_bytes() == manifest, arch
        assert (blobs / Digest.of(config).hex).read_bytes() == config, arch
    for f in model.files:  # each layer's digest is bundle.json's, and it holds the file, read-only, under /models
        data = (blobs / f.modelcar.hex).read_bytes()
        assert Digest.of(data) == f.modelcar
        path, mode, body = layer_file(data)
        assert (path, mode, hashlib.sha256(body).hexdigest()) == (f"models/{f.path}", 0o444, f.sha256.hex)


def test_a_modelcar_layer_answers_head_and_every_range_from_the_raw_file(with_car, serving):  # noqa: F811
    out, model, files = with_car
    s = serving(str(out), "--listen", "127.0.0.1:0")
    base = f"{s.url}/v2/{MODEL_REPO}"
    shard = max(model.files, key=lambda f: f.size)  # crosses parts
    layer = expected_layer(shard.path, files[shard.path])
    url = f"{base}/blobs/{shard.modelcar}"
    head = requests.head(url, timeout=30)
    assert (head.status_code, head.headers["Content-Length"], head.headers["Docker-Content-Digest"]) == \
        (200, str(len(layer)), str(shard.modelcar))
    whole = requests.get(url, timeout=30)
    assert (whole.status_code, Digest.of(whole.content)) == (200, shard.modelcar)
    h = len(modelcar.head(shard.path, shard.size))
    end = h + shard.size
    for a, b in ((0, 99), (100, h + 999), (h - 1, h), (h + shard.size // 2, h + shard.size // 2 + 1), (end - 10, end + 10),
                 (end + 5, len(layer) - 1), (0, len(layer) - 1)):
        r = requests.get(url, headers={"Range": f"bytes={a}-{b}"}, timeout=30)
        assert (r.status_code, r.content, r.headers["Content-Range"]) == \
            (206, layer[a:b + 1], f"bytes {a}-{b}/{len(layer)}"), (a, b)
    config = Digest.of(model.modelcar().manifests[0][3])
    assert requests.get(f"{base}/blobs/{config}", timeout=30).content == model.modelcar().manifests[0][3]
    # the image's repository does not answer the model's layers
    assert requests.get(f"{s.url}/v2/ascend/vllm-ascend/blobs/{shard.modelcar}", timeout=30).status_code == 404


def test_the_modelcar_layer_of_a_damaged_file_is_refused_never_served_wrong(with_car, serving):  # noqa: F811
    from tests.support.bundles import damage_member

    out, model, _ = with_car
    shard = next(f for f in model.files if f.path == "model-00002-of-00002.safetensors")
    spans = damage_member(out, shard.sha256)
    s = serving(str(out), "--listen", "127.0.0.1:0")
    for headers in ({}, {"Range": "bytes=600-700"}):
        r = requests.get(f"{s.url}/v2/{MODEL_REPO}/blobs/{shard.modelcar}", headers=headers, timeout=30)
        assert r.status_code == 500, headers
        assert r.json()["errors"][0]["message"] == (
            f"{shard.path} of {model.ref} (blob {shard.sha256.short}) is damaged in {out} "
            f"({', '.join(f'part {i + 1:03d}' for i in spans)}): its sha256 differs from its digest; it is not served")


def test_containerd_pulls_and_unpacks_the_modelcar_through_the_printed_hosts_toml(
        with_car, serving, services, tmp_path, uniq):  # noqa: F811
    out, model, files = with_car
    s = serving(str(out), "--listen", "127.0.0.1:0")
    hosts_dir = models_local_hosts_dir(out, s.port, tmp_path)
    ctr = ["ctr", "--address", services.containerd("1.7"), "-n", f"imgtool-{uniq}"]
    ref = f"models.local/{MODEL_REPO}:{model.commit}-modelcar"
    car = model.modelcar()
    try:
        r = subprocess.run([*ctr, "images", "pull", "--hosts-dir", str(hosts_dir), ref], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        rows = subprocess.run([*ctr, "images", "ls"], capture_output=True, text=True, timeout=60).stdout.splitlines()
        assert [row.split()[:3] for row in rows[1:]] == [[ref, OCI_INDEX, str(car.digest)]]
        check = subprocess.run([*ctr, "images", "check"], capture_output=True, text=True, timeout=60).stdout
        assert "complete" in check.splitlines()[1], check  # every blob of the host's platform is there
        for f in model.files:
            data = subprocess.run([*ctr, "content", "get", str(f.modelcar)], capture_output=True, timeout=60).stdout
            path, _, body = layer_file(data)
            assert (path, hashlib.sha256(body).hexdigest()) == (f"models/{f.path}", f.sha256.hex)
    finally:
        subprocess.run([*ctr, "images", "rm", "--sync", ref], capture_output=True, timeout=60)
        subprocess.run([*ctr[:3], "namespaces", "rm", ctr[4]], capture_output=True, timeout=60)
    assert s.said(f"/v2/{MODEL_REPO}/manifests/{model.commit}-modelcar?ns=models.local 200"), s.log()
    platform = next(Digest.of(m) for o, a, m, _ in car.manifests if a == host_arch())
    assert s.said(f"/v2/{MODEL_REPO}/manifests/{platform}?ns=models.local 200"), s.log()  # by the index's entry


@pytest.mark.parametrize("with_car", ["none", "zstd"], indirect=True)  # zstd: read once, in archive order
def test_push_sends_the_modelcar_beside_the_artifact_and_a_second_push_sends_nothing(with_car, services, uniq,
                                                                                      tmp_path):
    out, model, files = with_car
    car = model.modelcar()
    to = f"{services.plain}/{uniq}"
    first = imgtool("push", str(out), "--to", to, "--insecure", "--json")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    target = f"{to}/{MODEL_REPO}"
    (pushed,) = doc["models"]
    assert (pushed["modelcar"], pushed["modelcar_digest"]) == (f"{target}:{model.commit}-modelcar", str(car.digest))
    # the image's config and layer; the artifact's config and files; the modelcar's two configs and its layers
    assert doc["blobs_uploaded"] == 2 + 1 + len(model.files) + 2 + len(model.files)
    for tag in (f"{model.commit}-modelcar", "main-modelcar"):
        raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{target}:{tag}"],
                             capture_output=True, timeout=120)
        assert raw.returncode == 0, raw.stderr
        assert raw.stdout == car.index
    inspect = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--override-arch", "arm64",
                              f"docker://{target}:main-modelcar"], capture_output=True, text=True, timeout=120)
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["Layers"] == [str(f.modelcar) for f in model.files]
    # the layers as the registry stores them: each bundle.json's digest, each holding its file
    dest = tmp_path / "oci"
    r = subprocess.run(["skopeo", "copy", "--preserve-digests", "--src-tls-verify=false",
                        f"docker://{target}:main-modelcar", f"oci:{dest}:car"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    for f in model.files:
        path, _, body = layer_file((dest / "blobs" / "sha256" / f.modelcar.hex).read_bytes())
        assert (path, body) == (f"models/{f.path}", files[f.path])
    again = imgtool("push", str(out), "--to", to, "--insecure", "--json")
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["blobs_uploaded"], json.loads(again.stdout)["bytes_uploaded"]) == (0, 0)


def test_a_registry_holding_the_artifact_gets_only_the_modelcar_its_files_read_not_uploaded_again(
        factory, services, uniq, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    hub = small_model(seed=50)
    image = store.pulled(factory.image(host_arch(), layers=1), f"{REPO}:v1")
    plain, withcar = tmp_path / "plain", tmp_path / "car"
    write(plain, [image], store, models=[put_model(store, hub)])
    model = put_model(store, hub, modelcar=True)
    write(withcar, [image], store, models=[model])
    to = f"{services.plain}/{uniq}"
    assert imgtool("push", str(plain), "--to", to, "--insecure").returncode == 0
    r = imgtool("push", str(withcar), "--to", to, "--insecure", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["blobs_uploaded"] == 2 + len(model.files)  # the modelcar's configs and layers only
    assert doc["bytes_uploaded"] == sum(len(c) for *_, c in model.modelcar().manifests) + sum(
        d.size for d in model.modelcar().layers)
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                          f"docker://{to}/{MODEL_REPO}:{model.commit}-modelcar"], capture_output=True, timeout=120)
    assert raw.stdout == model.modelcar().index


def test_a_delta_pushes_its_modelcar_only_where_the_base_s_modelcar_is(factory, services, uniq, tmp_path):
    from tests.support.models import two_revisions

    store = BlobDir(tmp_path / "blobs")
    hub = two_revisions(seed=6)
    image = store.pulled(factory.image(host_arch(), layers=1), f"{REPO}:v1")
    v1 = put_model(store, hub, "v1")
    omitted = {f.sha256 for f in v1.files}
    delta_model = put_model(store, hub, "main", omitted=omitted, modelcar=True)  # the base's digests, as fetch takes
    bundles = {}
    for name, models in (("plain", [v1]), ("car", [put_model(store, hub, "v1", modelcar=True)]),
                         ("delta", [delta_model])):
        bundles[name] = tmp_path / name
        write(bundles[name], [image], store, models=models)
    for base in ("plain", "car"):
        to = f"{services.plain}/{uniq}/{base}"
        assert imgtool("push", str(bundles[base]), "--to", to, "--insecure").returncode == 0
        r = imgtool("push", str(bundles["delta"]), "--to", to, "--insecure", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        (pushed,) = doc["models"]
        if base == "plain":  # the base's modelcar layers are not there: the delta's modelcar cannot be whole
            assert "modelcar" not in pushed
            left = sorted(f.path for f in delta_model.files if f.omitted)
            assert doc["warnings"] == [
                f"the modelcar of {delta_model.ref} is not pushed: {uniq}/{base}/{MODEL_REPO} lacks the modelcar "
                f"layers of {len(left)} file(s) the delta leaves out (first: {left[0]}); its ModelPack artifact is"]
        else:
            assert pushed["modelcar_digest"] == str(delta_model.modelcar().digest)
            raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                                  f"docker://{to}/{MODEL_REPO}:main-modelcar"], capture_output=True, timeout=120)
            assert raw.stdout == delta_model.modelcar().index
