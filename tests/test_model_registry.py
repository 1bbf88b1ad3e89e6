"""A bundle's models toward registries (issue 48): each model's CNCF ModelPack artifact served by `imgtool serve` and
pushed by `imgtool push`, read back by the real clients (skopeo, plain HTTP GETs of every blob checked against the
file's sha256) and by Debian's distribution registry 2.8, which stores it under bundle.json's `manifest_digest`.
"""

import hashlib
import json
import subprocess

import pytest
import requests

from imgtool.bundle.format import BundleIndex
from imgtool.errors import ManifestError
from imgtool.model import OCI_MANIFEST, Digest, format_size, parse_manifest
from imgtool.weights import MODEL_ARTIFACT, MODEL_CONFIG, WEIGHT_RAW, read_modelpack
from tests.support.bundles import BlobDir, imgtool, put_model, write
from tests.support.images import host_arch
from tests.support.models import small_model, two_revisions
from tests.test_serve import serving  # noqa: F401  (the fixture)

REPO = "quay.io/ascend/vllm-ascend"
MODEL_REPO = "hf/imgtool-test/tiny-llm"  # hf:imgtool-test/tiny-llm as a registry names it


@pytest.fixture
def with_model(factory, tmp_path, request):
    """A bundle of one image and one model (hf:imgtool-test/tiny-llm@main), parts of 64 KiB (files cross them;
    compressed as the test's parameter asks, else not); the model's files by path, as the hub holds them."""
    store = BlobDir(tmp_path / "blobs")
    hub = small_model(seed=3)
    model = put_model(store, hub)
    out = tmp_path / "bundle"
    write(out, [store.pulled(factory.image(host_arch(), layers=1), f"{REPO}:v1")], store, chunk_size=64 << 10,
          models=[model], compress=getattr(request, "param", "none"))
    files = {f.path: b"".join(f.chunks()) for f in hub.resolve("main").files.values()}
    return out, model, files


def test_an_image_manifest_refuses_a_modelpack_artifact_which_is_read_as_one(with_model):
    _, model, files = with_model
    manifest, config = model.artifact()
    with pytest.raises(ManifestError) as e:
        parse_manifest(manifest, OCI_MANIFEST)
    first = min(files)
    assert e.value.message == (f"the manifest is an OCI artifact ({MODEL_ARTIFACT}), not an image: its layer "
                               f"{model.files[0].sha256.short} is {model.files[0].media_type}")
    assert first == model.files[0].path
    artifact, paths = read_modelpack(manifest)
    assert artifact.config.digest == model.config_digest and artifact.config.media_type == MODEL_CONFIG
    assert [(p, d.digest, d.size) for p, d in paths] == [(f.path, f.sha256, f.size) for f in model.files]
    # an image manifest with an odd layer type is still refused as before
    odd = json.loads(manifest)
    del odd["artifactType"]
    with pytest.raises(ManifestError) as e:
        parse_manifest(json.dumps(odd).encode(), OCI_MANIFEST)
    assert e.value.message.startswith("unsupported layer media type 'application/vnd.cncf.model.")
    with pytest.raises(ManifestError) as e:
        read_modelpack(json.dumps(odd).encode())
    assert e.value.message == f"not a {MODEL_ARTIFACT} artifact: its artifactType is 'None'"


def _get(url: str, **kw) -> requests.Response:
    return requests.get(url, timeout=30, **kw)


def test_serve_answers_each_model_as_its_modelpack_artifact(with_model, serving, tmp_path):  # noqa: F811
    out, model, files = with_model
    s = serving(str(out), "--listen", "127.0.0.1:0")
    base = f"{s.url}/v2"
    name = f"{s.hostport}/{MODEL_REPO}"
    # skopeo reads the manifest by the commit, bundle.json's manifest digest
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{name}:{model.commit}"],
                         capture_output=True, timeout=120)
    assert raw.returncode == 0, raw.stderr
    assert Digest.of(raw.stdout) == model.manifest_digest
    # and copies the whole artifact by the revision's tag: every blob's name is its sha256
    dest = tmp_path / "dir"
    r = subprocess.run(["skopeo", "copy", "--retry-times", "0", "--src-tls-verify=false", f"docker://{name}:main",
                        f"dir:{dest}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (dest / "manifest.json").read_bytes() == raw.stdout
    for f in model.files:
        assert hashlib.sha256((dest / f.sha256.hex).read_bytes()).hexdigest() == f.sha256.hex
    # plain GETs: the manifest's content type, each file's bytes whole and by range, the config
    m = _get(f"{base}/{MODEL_REPO}/manifests/main")
    assert (m.status_code, m.headers["Content-Type"], m.headers["Docker-Content-Digest"]) == \
        (200, OCI_MANIFEST, str(model.manifest_digest))
    assert json.loads(m.content)["artifactType"] == MODEL_ARTIFACT
    for f in model.files:
        got = _get(f"{base}/{MODEL_REPO}/blobs/{f.sha256}")
        assert (got.status_code, got.content) == (200, files[f.path]), f.path
    shard = next(f for f in model.files if f.media_type == WEIGHT_RAW)
    part = _get(f"{base}/{MODEL_REPO}/blobs/{shard.sha256}", headers={"Range": "bytes=1000-1999"})
    assert (part.status_code, part.content, part.headers["Content-Range"]) == \
        (206, files[shard.path][1000:2000], f"bytes 1000-1999/{shard.size}")
    config = _get(f"{base}/{MODEL_REPO}/blobs/{model.config_digest}")
    assert Digest.of(config.content) == model.config_digest
    # the listings, and containerd's ?ns= of the model's registry name
    assert _get(f"{base}/_catalog").json() == {"repositories": ["ascend/vllm-ascend", MODEL_REPO]}
    assert _get(f"{base}/{MODEL_REPO}/tags/list").json() == {"name": MODEL_REPO, "tags": [model.commit, "main"]}
    assert _get(f"{base}/{MODEL_REPO}/manifests/{model.commit}?ns=models.local").status_code == 200
    # an image's repository does not answer the model's blobs
    assert _get(f"{base}/ascend/vllm-ascend/blobs/{shard.sha256}").status_code == 404
    said = s.printed_until("docker pull")
    assert (f"note: hf:imgtool-test/tiny-llm@main (commit {model.commit[:12]}, 9 files, 85.2 KiB) is served as its "
            f"ModelPack artifact models.local/{MODEL_REPO}@{model.manifest_digest}") in said, said
    # the node configuration covers the model's registry name: containerd's hosts.toml for models.local
    assert "cat > /etc/containerd/certs.d/models.local/hosts.toml <<'EOF'" in said, said
    assert f"docker pull {s.hostport}/ascend/vllm-ascend:v1" in said, said  # Docker's example is the image


@pytest.mark.parametrize("with_model", ["none", "zstd"], indirect=True)  # zstd: read in archive order, models last
def test_push_sends_the_modelpack_artifact_and_a_second_push_sends_no_blob(with_model, services, uniq):
    out, model, _ = with_model
    to = f"{services.plain}/{uniq}"
    first = imgtool("push", str(out), "--to", to, "--insecure", "--json")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    target = f"{to}/{MODEL_REPO}"
    assert doc["models"] == [{"ref": "hf:imgtool-test/tiny-llm@main", "target": f"{target}:{model.commit}",
                              "tags": [model.commit, "main"], "manifest_digest": str(model.manifest_digest),
                              "files": 9, "size": model.size}]
    assert doc["blobs_uploaded"] == 2 + 1 + len(model.files)  # the image's config and layer, the model's config
    for tag in (model.commit, "main"):
        raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{target}:{tag}"],
                             capture_output=True, timeout=120)
        assert raw.returncode == 0, raw.stderr
        assert Digest.of(raw.stdout) == model.manifest_digest
    again = imgtool("push", str(out), "--to", to, "--insecure")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0].endswith(
        f"0 blobs uploaded (0 B), 0 mounted, {2 + 1 + len(model.files)} already there"), again.stdout
    assert (f"  {target}:{model.commit} (also :main)  ModelPack artifact of hf:imgtool-test/tiny-llm@main, 9 files, "
            f"85.2 KiB  {model.manifest_digest}") in again.stdout.splitlines()


def test_a_new_revision_pushes_only_its_changed_file_and_a_delta_needs_its_base(factory, services, tmp_path, uniq):
    store = BlobDir(tmp_path / "blobs")
    hub = two_revisions(seed=5)
    v1, v2 = put_model(store, hub, "v1"), put_model(store, hub, "main")
    changed = [f for f in v2.files if f.sha256 not in {g.sha256 for g in v1.files}]
    assert len(changed) == 1
    image = store.pulled(factory.image(host_arch(), layers=1), f"{REPO}:v1")
    to = f"{services.plain}/{uniq}"
    delta = tmp_path / "delta"
    write(delta, [image], store, models=[put_model(store, hub, "main", omitted={f.sha256 for f in v1.files})])
    refused = imgtool("push", str(delta), "--to", to, "--insecure")
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == (
        f"error: cannot push {delta}: it is a delta bundle and {to}/{MODEL_REPO} lacks {len(v1.files) - 1} of the "
        f"model files it leaves out (first: {v2.files[0].path} of hf:imgtool-test/tiny-llm@main); nothing was pushed")
    full = tmp_path / "v1"
    write(full, [image], store, models=[v1])
    assert imgtool("push", str(full), "--to", to, "--insecure").returncode == 0
    r = imgtool("push", str(delta), "--to", to, "--insecure", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["blobs_uploaded"] == 2  # the new revision's config and its one changed shard
    assert doc["bytes_uploaded"] == v2.config_size + changed[0].size
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{to}/{MODEL_REPO}:main"],
                         capture_output=True, timeout=120)
    assert Digest.of(raw.stdout) == v2.manifest_digest
    assert BundleIndex.from_bytes((delta / "bundle.json").read_bytes()).models[0].manifest_digest == v2.manifest_digest


def models_local_hosts_dir(out, port: int, tmp_path):
    """A containerd --hosts-dir holding the models.local hosts.toml `serve --print-node-config` prints for the
    server on `port`, as a node would install it."""
    printed = imgtool("serve", str(out), "--listen", f"127.0.0.1:{port}", "--print-node-config", "--json")
    assert printed.returncode == 0, printed.stderr
    hosts = {f["path"]: f["content"] for f in json.loads(printed.stdout)["files"]}
    certs = tmp_path / "certs.d" / "models.local"
    certs.mkdir(parents=True)
    (certs / "hosts.toml").write_text(hosts["/etc/containerd/certs.d/models.local/hosts.toml"])
    return certs.parent


def test_containerd_fetches_the_artifact_by_its_models_local_name_through_the_printed_hosts_toml(
        with_model, serving, services, tmp_path, uniq):  # noqa: F811
    """What issue 49's image volume needs of serve: a node resolves models.local/HUB/org/name:COMMIT through the
    hosts.toml `serve --print-node-config` printed and gets every blob (containerd 1.7 fetches it; it cannot unpack
    an artifact, which CRI-O mounts and issue 49's modelcar image is for)."""
    out, model, files = with_model
    s = serving(str(out), "--listen", "127.0.0.1:0")
    hosts_dir = models_local_hosts_dir(out, s.port, tmp_path)
    ctr = ["ctr", "--address", services.containerd("1.7"), "-n", f"imgtool-{uniq}"]
    ref = f"models.local/{MODEL_REPO}:{model.commit}"
    try:
        r = subprocess.run([*ctr, "content", "fetch", "--hosts-dir", str(hosts_dir), ref], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        rows = subprocess.run([*ctr, "images", "ls"], capture_output=True, text=True, timeout=60).stdout.splitlines()
        assert [row.split()[:3] for row in rows[1:]] == [[ref, OCI_MANIFEST, str(model.manifest_digest)]]
        for f in model.files:
            got = subprocess.run([*ctr, "content", "get", str(f.sha256)], capture_output=True, timeout=60).stdout
            assert got == files[f.path], f.path
    finally:
        subprocess.run([*ctr, "images", "rm", "--sync", ref], capture_output=True, timeout=60)
        subprocess.run([*ctr[:3], "namespaces", "rm", ctr[4]], capture_output=True, timeout=60)
    assert s.said(f"/v2/{MODEL_REPO}/manifests/{model.commit}?ns=models.local 200"), s.log()


def test_a_damaged_model_file_is_refused_per_request_never_served_wrong(with_model, serving):  # noqa: F811
    from tests.support.bundles import damage_member

    out, model, files = with_model
    shard = next(f for f in model.files if f.path == "model-00002-of-00002.safetensors")
    spans = damage_member(out, shard.sha256)  # the same size: serve starts (parts by size), the blob's check fails
    s = serving(str(out), "--listen", "127.0.0.1:0")
    url = f"{s.url}/v2/{MODEL_REPO}/blobs/{shard.sha256}"
    for headers in ({}, {"Range": "bytes=0-9"}):
        r = _get(url, headers=headers)
        assert r.status_code == 500, headers
        assert r.json()["errors"][0]["message"] == (
            f"{shard.path} of {model.ref} (blob {shard.sha256.short}) is damaged in {out} "
            f"({', '.join(f'part {i + 1:03d}' for i in spans)}): its sha256 differs from its digest; it is not served")
    # the model's other files are served
    other = next(f for f in model.files if f.path == "config.json")
    assert _get(f"{s.url}/v2/{MODEL_REPO}/blobs/{other.sha256}").content == files[other.path]


def test_a_model_whose_name_no_registry_takes_is_not_served_and_startup_says_so(factory, tmp_path):
    from imgtool.bundle.catalog import Catalog, model_repository
    from imgtool.serve import model_notes

    store = BlobDir(tmp_path / "blobs")
    odd = put_model(store, small_model(seed=2, repo_id="Some-Org/Tiny-"))  # a hub's name, no registry's
    fine = put_model(store, small_model(seed=2, repo_id="Some-Org/Tiny.LLM_v2"))
    assert (model_repository(odd), model_repository(fine)) == (None, "hf/some-org/tiny.llm_v2")
    out = tmp_path / "b"
    write(out, [store.pulled(factory.image(layers=1), f"{REPO}:v1")], store, models=[odd, fine])
    catalog = Catalog([BundleIndex.from_bytes((out / "bundle.json").read_bytes())])
    assert sorted(catalog.names()) == ["ascend/vllm-ascend", "hf/some-org/tiny.llm_v2"]
    assert model_notes(catalog)[0] == (f"hf:Some-Org/Tiny-@main (commit {odd.commit[:12]}, 9 files, "
                                       f"{format_size(odd.size)}) is not served: Some-Org/Tiny- is not a repository "
                                       "name a registry takes")
