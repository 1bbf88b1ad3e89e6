"""`imgtool push`: a bundle into a registry of the offline network, then `docker pull` from it.

Real distribution registries (plain HTTP, and TLS with Basic auth from ~/.docker/config.json),
the real test dockerd, and the FaultProxy to count what went over the wire.
"""

import base64
import json

import pytest

from imgtool.bundle.writer import write_bundle
from imgtool.delta import Have
from imgtool.errors import UsageError
from imgtool.model import Digest
from imgtool.progress import choose
from imgtool.push import parse_target, push_bundle
from tests.support.bundles import BlobDir, imgtool, parts_of, write
from tests.support.images import host_arch
from tests.support.proxy import FaultProxy

REPO = "quay.io/ascend/vllm-ascend"


def uploads(proxy):
    return [r for r in proxy.records if "/blobs/uploads/" in r.path and r.method in ("POST", "PATCH", "PUT")]


@pytest.fixture
def store(tmp_path):
    return BlobDir(tmp_path / "blobs")


@pytest.fixture
def proxy(services):
    p = FaultProxy(services.plain)
    yield p
    p.close()


def test_parse_target():
    assert parse_target("reg.local:5000/ai/team") == ("reg.local:5000", "ai/team")
    assert parse_target("harbor.local") == ("harbor.local", "")
    with pytest.raises(UsageError) as e:
        parse_target("reg.local/Bad Name")
    assert e.value.message == "invalid --to 'reg.local/Bad Name': expected HOST[:PORT][/NAMESPACE], e.g. harbor.local/ascend"


@pytest.mark.engines
def test_push_then_docker_pull_then_push_again_sends_no_blob(services, factory, store, tmp_path, proxy, uniq,
                                                             docker_cli, docker_cleanup):
    base = factory.layers(2)
    image = factory.image(host_arch(), layers=1, base=base)
    other = factory.image(host_arch(), layers=1, base=base)
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:v1"), store.pulled(other, "quay.io/ascend/cann:8.2")], store,
          chunk_size=700 * 1024)
    assert len(parts_of(out)) >= 4  # blobs are read across part boundaries

    result = push_bundle(out, f"{proxy.hostport}/{uniq}", insecure=True, progress=choose(True), chunk=256 * 1024)
    assert result.scheme == "http"
    # vllm-ascend: config + 3 layers uploaded; cann: its config and own layer uploaded, the 2 shared layers mounted
    assert (result.blobs_uploaded, result.blobs_mounted, result.blobs_present) == (6, 2, 0)
    patches = [r for r in uploads(proxy) if r.method == "PATCH"]
    assert len(patches) >= 4  # ~1 MiB layers in 256 KiB chunks
    assert [im.target for im in result.images] == [f"{proxy.hostport}/{uniq}/ascend/vllm-ascend:v1",
                                                   f"{proxy.hostport}/{uniq}/ascend/cann:8.2"]

    ref = f"{services.plain}/{uniq}/ascend/vllm-ascend:v1"
    docker_cleanup.image(ref, image.config_digest)
    docker_cli("pull", ref)
    assert docker_cli.holds(ref, image)

    proxy.clear()
    again = push_bundle(out, f"{proxy.hostport}/{uniq}", insecure=True, progress=choose(True))
    assert (again.blobs_uploaded, again.blobs_mounted, again.blobs_present) == (0, 0, 8)
    assert uploads(proxy) == []


def test_push_to_tls_registry_with_basic_auth_from_docker_config(services, factory, store, tmp_path, uniq, registry):
    image = factory.image(host_arch(), layers=2, media="oci")
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:v2")], store)
    home = tmp_path / "home"
    (home / ".docker").mkdir(parents=True)
    auth = base64.b64encode(f"{services.tls_user}:{services.tls_password}".encode()).decode()
    (home / ".docker" / "config.json").write_text(json.dumps({"auths": {services.tls: {"auth": auth}}}))
    env = {"HOME": str(home)}

    no_ca = imgtool("push", str(out), "--to", f"{services.tls}/{uniq}", env=env)
    assert no_ca.returncode == 4
    assert no_ca.stderr.splitlines()[-1] == ("hint: give its CA with --ca-cert FILE, or --insecure for a "
                                             "plain-HTTP registry")
    r = imgtool("push", str(out), "--to", f"{services.tls}/{uniq}", "--ca-cert", services.tls_ca, "--json", env=env)
    assert r.returncode == 0, r.stderr
    pushed = json.loads(r.stdout)
    assert pushed["scheme"] == "https" and pushed["blobs_uploaded"] == 3
    got = registry("tls").get_manifest(f"{uniq}/ascend/vllm-ascend", "v2")
    assert got.digest == image.manifest_digest

    (home / ".docker" / "config.json").write_text(json.dumps({"auths": {}}))
    refused = imgtool("push", str(out), "--to", f"{services.tls}/{uniq}", "--ca-cert", services.tls_ca, env=env)
    assert refused.returncode == 4
    assert refused.stderr.splitlines()[-1].startswith(f"hint: log in with `docker login {services.tls}`")


def test_delta_bundle_needs_its_base_in_the_registry(services, factory, store, tmp_path, proxy, uniq):
    base = factory.layers(2)
    old = factory.image(host_arch(), layers=1, base=base)
    new = factory.image(host_arch(), layers=1, base=base)
    have = Have("test")
    have.add([Digest.parse(d) for d in old.diff_ids], f"{REPO}:v1")
    delta = tmp_path / "delta"
    write_bundle(delta, [store.pulled(new, f"{REPO}:v2")], store.path, chunk_size=None, compress="none",
                 force=False, progress=choose(True), have=have, base={"kind": "bundle", "name": "v1"})
    target = f"{proxy.hostport}/{uniq}"
    r = imgtool("push", str(delta), "--to", target, "--insecure")
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"error: cannot push {delta}: it is a delta bundle and {proxy.hostport}/{uniq}/ascend/vllm-ascend lacks "
        f"2 of the layers it leaves out (first: {base[0].digest[7:19]}); nothing was pushed",
        f"hint: push the bundle of {REPO}:v1 to {target} first, or fetch a full bundle",
    ]
    assert uploads(proxy) == []
    full = tmp_path / "full"
    write(full, [store.pulled(old, f"{REPO}:v1")], store)
    assert imgtool("push", str(full), "--to", target, "--insecure").returncode == 0
    ok = imgtool("push", str(delta), "--to", target, "--insecure", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["blobs_uploaded"] == 2  # config + the new layer
