"""`imgtool push`: a bundle into a registry of the offline network, then `docker pull` from it.

Real distribution registries (plain HTTP, TLS with Basic auth from ~/.docker/config.json, and
bearer tokens), the real test dockerd, and the FaultProxy to count what went over the wire. Also
from imgtool.pyz under pyenv's python3 3.7 and 3.8 (`env -i`, the stdlib registry client), which
must store the same bytes and say the same words as 3.11's imgtool.
"""

import base64
import json
import os
import subprocess

import pytest

from imgtool.errors import UsageError
from imgtool.progress import choose
from imgtool.push import parse_target, push_bundle
from tests.support.bundles import BlobDir, imgtool, parts_of, write, write_delta
from tests.support.images import host_arch
from tests.support.proxy import FaultProxy
from tests.test_puller import HELPER
from tests.test_selfbundle import OLD_PYTHONS, old_python

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


@pytest.mark.engines(stores=True)
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
    delta = tmp_path / "delta"
    base, old, _ = write_delta(delta, factory, store, REPO)
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


# --- from Kylin's own python3 (3.7) and 3.8, through imgtool.pyz ------------------------------------

@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    tool = tmp_path_factory.mktemp("pyz") / "imgtool.pyz"
    r = imgtool("self-bundle", "-o", str(tool), "-q")
    assert r.returncode == 0, r.stderr
    return tool


def run_old(python, *args, home, path=()):
    """`env -i python3.X imgtool.pyz ...`: that Python's stdlib, HOME's docker config, helpers on `path`."""
    env = ["env", "-i", "PATH=" + ":".join([*map(str, path), "/usr/sbin:/usr/bin:/sbin:/bin"]), f"HOME={home}",
           "LANG=C.UTF-8", "IMGTOOL_CACHE=/nonexistent/imgtool-cache"]
    return subprocess.run([*env, *python, *args], capture_output=True, text=True, cwd=home, timeout=300)


def _pushed(stdout: str) -> dict:
    """--json of a push, without what differs between two pushes of the same bundle (time, namespace)."""
    doc = json.loads(stdout)
    doc.pop("seconds")
    for im in doc["images"]:
        im["target"] = im["target"].split("/", 3)[3]  # HOST/UNIQ/old|new/...
    return doc


@pytest.mark.parametrize("version", OLD_PYTHONS)
def test_push_from_kylins_python_stores_what_3_11_stores(version, services, factory, store, tmp_path, uniq, pyz,
                                                         registry):
    python = old_python(version)
    base = factory.layers(2)
    image = factory.image(host_arch(), layers=1, base=base, media="oci")
    other = factory.image(host_arch(), layers=1, base=base)
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:v1"), store.pulled(other, "quay.io/ascend/cann:8.2")], store,
          chunk_size=700 * 1024)
    home = tmp_path / "home"
    home.mkdir()

    old = run_old(python, str(pyz), "push", str(out), "--to", f"{services.plain}/{uniq}/old", "--insecure", "--json",
                  home=home)
    assert old.returncode == 0, old.stderr
    new = imgtool("push", str(out), "--to", f"{services.plain}/{uniq}/new", "--insecure", "--json",
                  env={"HOME": str(home)})
    assert new.returncode == 0, new.stderr
    assert _pushed(old.stdout) == _pushed(new.stdout)
    assert (json.loads(old.stdout)["blobs_uploaded"], json.loads(old.stdout)["blobs_mounted"]) == (6, 2)
    plain = registry("plain")
    for name, im, tag in (("vllm-ascend", image, "v1"), ("cann", other, "8.2")):
        got = plain.get_manifest(f"{uniq}/old/ascend/{name}", tag)
        assert got.body == plain.get_manifest(f"{uniq}/new/ascend/{name}", tag).body == im.manifest_bytes

    # pulled back by another client, which checks every blob against its digest
    pulled = tmp_path / "pulled"
    r = subprocess.run(["skopeo", "copy", "--src-tls-verify=false",
                        f"docker://{services.plain}/{uniq}/old/ascend/vllm-ascend:v1", f"dir:{pulled}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for digest, data in image.blobs().items():
        assert (pulled / digest.split(":", 1)[1]).read_bytes() == data

    again = run_old(python, str(pyz), "push", str(out), "--to", f"{services.plain}/{uniq}/old", "--insecure", "--json",
                    home=home)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["blobs_present"] == 8


@pytest.mark.parametrize("version", OLD_PYTHONS)
def test_push_from_kylins_python_logs_in_as_3_11_does(version, services, factory, store, tmp_path, uniq, pyz,
                                                      token_issuer, registry):
    """A token registry with the login in a credential helper, and a TLS registry with Basic auth in
    config.json: the same results, and a refused login in the same words, on both paths."""
    python = old_python(version)
    image = factory.image(host_arch(), layers=2, media="oci")
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:v2")], store)
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    (home / ".docker").mkdir(parents=True)
    bin_dir.mkdir()
    user, password = "robot", "s3cret-" + uniq
    token_issuer.credentials = {user: password}
    token_issuer.anonymous_actions = ()
    helper = bin_dir / "docker-credential-imgtooltest"

    def login(secret):
        helper.write_text(HELPER.format(host=services.token, user=user, password=secret))
        helper.chmod(0o755)

    config = home / ".docker" / "config.json"
    config.write_text(json.dumps({"auths": {services.token: {}}, "credsStore": "imgtooltest"}))
    env311 = {"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    target = f"{services.token}/{uniq}"

    login(password)
    ok = run_old(python, str(pyz), "push", str(out), "--to", target, "--insecure", "--json", home=home,
                 path=[bin_dir])
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["scheme"] == "http" and json.loads(ok.stdout)["blobs_uploaded"] == 3
    assert (bin_dir / "docker-credential-imgtooltest.asked").read_text().split()[0] == services.token
    assert {r.account for r in token_issuer.requests if r.token} == {user}
    assert password not in ok.stdout + ok.stderr
    got = registry("token", auth=(user, password)).get_manifest(f"{uniq}/ascend/vllm-ascend", "v2")
    assert got.body == image.manifest_bytes

    login("wrong")
    old = run_old(python, str(pyz), "push", str(out), "--to", target, "--insecure", home=home, path=[bin_dir])
    new = imgtool("push", str(out), "--to", target, "--insecure", env=env311)
    assert (old.returncode, old.stderr) == (new.returncode, new.stderr)
    assert old.returncode == 4
    assert old.stderr.splitlines() == [
        f"error: {services.token}: the token service refused access (UNAUTHORIZED)",
        "hint: check the credentials for this registry in ~/.docker/config.json (docker login)"]

    gone = run_old(python, str(pyz), "push", str(out), "--to", target, "--insecure", home=home)  # helper not on PATH
    gone311 = imgtool("push", str(out), "--to", target, "--insecure", env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert (gone.returncode, gone.stderr) == (gone311.returncode, gone311.stderr)
    assert gone.stderr.splitlines()[0] == (
        f"error: docker-credential-imgtooltest named in {config} cannot give the credentials for {services.token}: "
        "docker-credential-imgtooltest not installed or not available in PATH")

    # TLS: the system CAs do not know the test CA; --ca-cert does; Basic auth from config.json
    auth = base64.b64encode(f"{services.tls_user}:{services.tls_password}".encode()).decode()
    config.write_text(json.dumps({"auths": {services.tls: {"auth": auth}}}))
    tls = f"{services.tls}/{uniq}"
    no_ca = run_old(python, str(pyz), "push", str(out), "--to", tls, home=home)
    no_ca311 = imgtool("push", str(out), "--to", tls, env={"HOME": str(home)})
    assert (no_ca.returncode, no_ca.stderr) == (no_ca311.returncode, no_ca311.stderr)
    assert no_ca.stderr.splitlines() == [
        f"error: cannot reach the registry {services.tls} over HTTPS: {services.tls}: TLS verification failed: "
        "certificate verify failed: unable to get local issuer certificate",
        "hint: give its CA with --ca-cert FILE, or --insecure for a plain-HTTP registry"]
    r = run_old(python, str(pyz), "push", str(out), "--to", tls, "--ca-cert", services.tls_ca, "--json", home=home)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["scheme"] == "https"
    assert registry("tls").get_manifest(f"{uniq}/ascend/vllm-ascend", "v2").body == image.manifest_bytes


# --- compressed bundles: the archive read once, in order --------------------------------------------

def _fetch_three(services, factory, mirrored, tmp_path):
    """One two-arch tag (v5) published upstream, fetched through the real CLI three times: uncompressed, gzip
    and zstd (1 MiB parts); returns ({compression: bundle dir}, the index, its repository path)."""
    base = factory.layers(1)
    idx = factory.multiarch(("amd64", "arm64"), layers=2, base=base, media="docker")
    ms = mirrored(idx, tag="v5", targets=("upstream",))
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    out = {}
    for compression in ("none", "gzip", "zstd"):
        out[compression] = tmp_path / compression
        r = imgtool("fetch", "--no-tool", "v5", "--arch", "amd64,arm64", "--mirrors", str(cfg), "-o",
                    str(out[compression]), "--chunk-size", "1M", "--compress", compression,
                    env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
        assert r.returncode == 0, r.stderr
    return out, idx, ms.repo


def _pulled_back(ref: str, into) -> dict:
    """skopeo copy --all of what a push stored (skopeo checks every blob against its digest): file -> bytes."""
    r = subprocess.run(["skopeo", "copy", "--all", "--src-tls-verify=false", f"docker://{ref}", f"dir:{into}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {p.name: p.read_bytes() for p in into.iterdir() if p.name != "version"}


def test_a_compressed_bundle_pushes_what_the_uncompressed_one_pushes(services, factory, mirrored, tmp_path, uniq):
    bundles, idx, repo = _fetch_three(services, factory, mirrored, tmp_path)
    assert len(parts_of(bundles["gzip"])) >= 3 and len(parts_of(bundles["zstd"])) >= 3
    pushed, stored = {}, {}
    for compression, out in bundles.items():
        r = imgtool("push", str(out), "--to", f"{services.plain}/{uniq}/{compression}", "--insecure", "--json")
        assert r.returncode == 0, (compression, r.stderr)
        pushed[compression] = _pushed(r.stdout)
        for ix in pushed[compression]["indexes"]:
            ix["target"] = ix["target"].split("/", 3)[3]
        pushed[compression]["warnings"] = [w.replace(f"/{uniq}/{compression}/", "/")
                                           for w in pushed[compression]["warnings"]]
        stored[compression] = _pulled_back(f"{services.plain}/{uniq}/{compression}/{repo}:v5",
                                           tmp_path / f"pulled-{compression}")
    assert pushed["gzip"] == pushed["zstd"] == pushed["none"]
    assert sorted(im["manifest_digest"] for im in pushed["none"]["images"]) == sorted(
        idx.image(arch).manifest_digest for arch in ("amd64", "arm64"))
    # every manifest and every layer, byte for byte: the index over both platforms, each platform's manifest,
    # configs and layers (the shared base layer once)
    layers = {x.digest.split(":", 1)[1] for arch in ("amd64", "arm64") for x in idx.image(arch).layers}
    assert layers <= set(stored["none"]) and len(layers) == 5
    assert stored["gzip"] == stored["zstd"] == stored["none"]
    for arch in ("amd64", "arm64"):
        for digest, data in idx.image(arch).blobs().items():
            assert stored["zstd"][digest.split(":", 1)[1]] == data


def test_a_compressed_bundle_with_a_damaged_part_pushes_no_manifest(services, factory, mirrored, tmp_path, uniq,
                                                                     registry):
    bundles, idx, repo = _fetch_three(services, factory, mirrored, tmp_path)
    for compression in ("gzip", "zstd"):
        parts = parts_of(bundles[compression])
        victim = len(parts) // 2
        data = bytearray(parts[victim].read_bytes())
        data[len(data) // 2] ^= 0x55
        parts[victim].write_bytes(bytes(data))
        label = f"part {victim + 1:03d}"
        r = imgtool("push", str(bundles[compression]), "--to", f"{services.plain}/{uniq}/{compression}", "--insecure")
        assert r.returncode == 3, r.stderr
        assert r.stderr.splitlines()[0] == (f"error: {label} ({parts[victim].name}) is damaged: its sha256 differs "
                                            f"from bundle.json; re-copy {label} from the source medium")
        assert registry("plain").head_manifest(f"{uniq}/{compression}/{repo}", "v5") is None
        for arch in ("amd64", "arm64"):
            assert registry("plain").head_manifest(f"{uniq}/{compression}/{repo}",
                                                   idx.image(arch).manifest_digest) is None
