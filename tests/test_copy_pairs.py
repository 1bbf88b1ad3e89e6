"""`imgtool copy`'s pair matrix (issue 47): every pair copying.PAIRS accepts runs once against the real services and
lands the image (the runtime lists it by its ID, the registry serves its manifest digest, the bundle verifies); then
again, with a cache of its own (nothing to take from), where the destination already holds everything: not one
layer is downloaded (the source registry's blob GETs, counted by a proxy in front of it) and not one blob is sent
(the destination registry's uploads; a runtime's `was_present` / `sent`; a bundle's delta leaves every layer out).

docker → bundle has no second run: export cuts no delta, so a bundle destination of Docker's holds nothing.
One small seeded image per test; the runtime pairs once per kind of runtime (Docker 20.10, containerd 1.7,
Podman 4.3). Also: a containerd store's inventory makes `copy bundle: bundle: --have` name the held blobs and refuse
a zstd delta as fetch does (item 3); registry → runtime checks diff_ids where Podman's records cannot be read
(item 2).
"""

import json

import pytest

from tests.support.bundles import imgtool
from tests.support.images import host_arch
from tests.support.proxy import FaultProxy
from tests.support.registry import get_manifest


class Counted:
    """A seeded 2-layer image published upstream behind a counting proxy, and the mirrors.toml that reaches it."""

    def __init__(self, services, factory, mirrored, tmp_path, uniq):
        self.image = factory.image(host_arch(), layers=2, layer_size=96 * 1024)
        ms = mirrored(factory.index([self.image]), tag="v1", targets=("upstream",))
        self.proxy = FaultProxy(services.plain)
        self.ref = f"quay.io/{ms.repo}:v1"
        self.repo = ms.repo
        self.services, self.tmp = services, tmp_path
        self.cfg = tmp_path / "mirrors.toml"
        self.cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                            f'url = "http://{self.proxy.hostport}"\nupstream = true\ninsecure = true\n')
        self.namespace = f"{uniq}-copied"  # the destination registry: the same registry, behind the same proxy
        self.caches = 0

    def copy(self, *args, env=None, as_json=True):
        """`imgtool copy ARGS --json` (its result) with a cache of its own; the proxy's records start afresh."""
        self.caches += 1
        self.proxy.records.clear()
        e = dict(env or {}, IMGTOOL_CACHE=str(self.tmp / f"cache{self.caches}"))
        r = imgtool("copy", *args, "--mirrors-file", str(self.cfg), *(["--json"] if as_json else []), env=e)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout) if as_json else r

    def layer_gets(self):
        layers = {x.digest for x in self.image.layers}
        return [r.path for r in self.proxy.records if r.method == "GET" and r.path.rsplit("/", 1)[-1] in layers]

    def uploads(self):
        return [f"{r.method} {r.path}" for r in self.proxy.records if "/blobs/uploads" in r.path]

    @property
    def registry(self):
        return f"registry:{self.proxy.hostport}/{self.namespace}"

    def served(self, repo_path: str, tag: str = "v1") -> str:
        """The digest the destination registry serves for NAMESPACE/repo_path:tag."""
        got = get_manifest(self.services.plain, f"{self.namespace}/{repo_path}", tag)
        import hashlib

        return "sha256:" + hashlib.sha256(got.body).hexdigest()

    def close(self):
        self.proxy.close()


@pytest.fixture
def counted(services, factory, mirrored, tmp_path, uniq):
    c = Counted(services, factory, mirrored, tmp_path, uniq)
    yield c
    c.close()


def _manifests(bundle) -> list:
    return [im["manifest_digest"] for im in json.loads((bundle / "bundle.json").read_text())["images"]]


def _layers_omitted(bundle) -> list:
    return [bool(x.get("omitted")) for im in json.loads((bundle / "bundle.json").read_text())["images"]
            for x in im["layers"]]


def test_registry_to_bundle_and_registry_to_registry(counted):
    c = counted
    out = c.tmp / "fetched"
    got = c.copy("registry:v1", f"bundle:{out}", "--arch", host_arch())
    assert [im["image_id"] for im in got["images"]] == [c.image.config_digest]
    assert _manifests(out) == [c.image.manifest_digest] and imgtool("verify", str(out)).returncode == 0
    assert len(c.layer_gets()) == 2
    # the offline side holds the whole image (the bundle as --base): not one layer is downloaded
    again = c.copy("registry:v1", f"bundle:{c.tmp / 'delta'}", "--arch", host_arch(), "--base", str(out))
    assert again["delta"]["omitted_layers"] == 2 and _manifests(c.tmp / "delta") == [c.image.manifest_digest]
    assert _layers_omitted(c.tmp / "delta") == [True, True] and c.layer_gets() == []

    pushed = c.copy("registry:v1", c.registry, "--insecure")
    target = f"{c.proxy.hostport}/{c.namespace}/{c.repo}:v1"
    assert [(im["target"], im["manifest_digest"]) for im in pushed["images"]] == [(target, c.image.manifest_digest)]
    assert c.served(c.repo) == c.image.manifest_digest
    assert pushed["blobs_uploaded"] == 3 and len(c.layer_gets()) == 2
    # the destination registry holds every blob: none is downloaded, none is sent
    again = c.copy("registry:v1", c.registry, "--insecure")
    assert (again["blobs_uploaded"], again["blobs_present"]) == (0, 3)
    assert c.layer_gets() == [] and c.uploads() == []
    assert c.served(c.repo) == c.image.manifest_digest


def test_bundle_to_bundle_and_bundle_to_registry(counted):
    c = counted
    src = c.tmp / "src"
    c.copy("registry:v1", f"bundle:{src}", "--arch", host_arch())
    out = c.tmp / "cut"
    got = c.copy(f"bundle:{src}", f"bundle:{out}", "--compress", "gzip")
    assert _manifests(out) == [c.image.manifest_digest]
    assert imgtool("verify", str(out)).returncode == 0 and got["archive"]["compression"] == "gzip"
    again = c.copy(f"bundle:{src}", f"bundle:{c.tmp / 'delta'}", "--base", str(src))
    assert _layers_omitted(c.tmp / "delta") == [True, True] and again["delta"]["omitted_layers"] == 2
    assert _manifests(c.tmp / "delta") == [c.image.manifest_digest]

    pushed = c.copy(f"bundle:{src}", c.registry, "--insecure")
    assert [im["manifest_digest"] for im in pushed["images"]] == [c.image.manifest_digest]
    assert c.served(c.repo) == c.image.manifest_digest and pushed["blobs_uploaded"] == 3
    again = c.copy(f"bundle:{src}", c.registry, "--insecure")
    assert (again["blobs_uploaded"], again["blobs_present"]) == (0, 3) and c.uploads() == []


def test_docker_to_bundle_and_docker_to_registry(counted, docker_cli, docker_cleanup):
    c = counted
    src = c.tmp / "src"
    c.copy("registry:v1", f"bundle:{src}", "--arch", host_arch())
    docker_cleanup.image(c.ref, *docker_cli.ids_of(c.image))
    assert imgtool("load", str(src), docker_host=c.services.docker_host).returncode == 0
    docker = {"DOCKER_HOST": c.services.docker_host}

    out = c.tmp / "exported"
    got = c.copy(f"docker:{c.ref}", f"bundle:{out}", env=docker)
    assert [im["image_id"] for im in got["images"]] == [c.image.config_digest]
    assert imgtool("verify", str(out)).returncode == 0

    pushed = c.copy(f"docker:{c.ref}", c.registry, "--insecure", env=docker)
    digest = pushed["images"][0]["manifest_digest"]
    assert c.served(c.repo) == digest and pushed["blobs_uploaded"] == 3
    config = json.loads(get_manifest(c.services.plain, f"{c.namespace}/{c.repo}", "v1").body)["config"]["digest"]
    assert config == c.image.config_digest
    # export's gzip is deterministic: the same layers are the same blobs, which the registry holds
    again = c.copy(f"docker:{c.ref}", c.registry, "--insecure", env=docker)
    assert (again["blobs_uploaded"], again["images"][0]["manifest_digest"]) == (0, digest) and c.uploads() == []


@pytest.mark.parametrize("engine", ["20.10", "containerd-1.7", "podman-4.3"], indirect=True)
def test_registry_bundle_and_docker_to_each_kind_of_runtime(counted, node, docker_cli, docker_cleanup):
    c = counted
    env = dict(node.env)
    node.remove_later(c.ref, *node.ids_of(c.image))

    def landed(got, present):
        node.remove_later(c.ref, got["images"][0]["docker_id"])  # node.remove() forgets what it removed before
        assert [(im["image_id"], im["was_present"]) for im in got["images"]] == [(c.image.config_digest, present)]
        assert got["images"][0]["docker_id"] in node.image_ids()

    landed(c.copy("registry:v1", "runtime:", env=env), False)
    assert node.holds(c.ref, c.image) and len(c.layer_gets()) == 2
    landed(c.copy("registry:v1", "runtime:", env=env), True)  # held whole: not one layer downloaded
    assert c.layer_gets() == []

    src = c.tmp / "src"
    c.copy("registry:v1", f"bundle:{src}", "--arch", host_arch())
    node.remove(c.ref, *node.ids_of(c.image))
    got = c.copy(f"bundle:{src}", "runtime:", env=env)
    node.remove_later(c.ref, *node.ids_of(c.image))
    assert got["sent"] is True and node.holds(c.ref, c.image)
    again = c.copy(f"bundle:{src}", "runtime:", env=env)
    assert again["sent"] is False and [im["was_present"] for im in again["images"]] == [True]
    said = c.copy(f"bundle:{src}", "runtime:", env=env, as_json=False).stdout.splitlines()[-1]
    assert said.startswith(f"{node.title} ") and said.endswith(f" already holds the 1 image(s) of bundle:{src}: "
                                                               "nothing was sent")

    # docker → runtime: the image in Docker 20.10 (loaded from the bundle), copied into this runtime by name
    docker_cleanup.image(c.ref, *docker_cli.ids_of(c.image))
    assert imgtool("load", str(src), docker_host=c.services.docker_host).returncode == 0
    into = dict(env, DOCKER_HOST=c.services.docker_host)
    if node.kind != "docker":  # the same Docker holds it already: the first copy is the second
        node.remove(c.ref, *node.ids_of(c.image))
        landed(c.copy(f"docker:{c.ref}", f"runtime:{node.kind}", env=into), False)
    landed(c.copy(f"docker:{c.ref}", f"runtime:{node.kind}", env=into), True)


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_registry_to_a_podman_whose_records_cannot_be_read_checks_diff_ids_as_they_stream(services, mirrored, node,
                                                                                          monkeypatch, tmp_path):
    """Issue 47 item 2: Podman applies a layer whatever its diff_id, and where its storage's records cannot be read
    (another user's storage: a fault put in front of the real room) load hashes every layer while it streams.
    copy registry → runtime now does too (fetch --check-diff-ids' check, as each layer lands in the cache): the
    copy fails, exit 3, naming the layer, and Podman keeps nothing (it loaded the image before)."""
    from contextlib import nullcontext

    from imgtool.config import load_mirrors
    from imgtool.copying import CopyOptions, End, Reach, registry_to_runtime
    from imgtool.errors import VerifyError
    from imgtool.progress import Progress
    from imgtool.runtimes.podman import Podman
    from imgtool.store import Store
    from tests.support.bundles import random_layer, simple_image
    from tests.support.images import Layer, sha256_digest

    class Unrecorded(Podman):
        def _records_readable(self):
            return False

    good = random_layer(32 * 1024, seed=11)
    wrong = Layer(blob=good.blob, digest=good.digest, size=good.size, diff_id=sha256_digest(b"not this"),
                  uncompressed_size=good.uncompressed_size)
    image = simple_image([random_layer(16 * 1024, seed=12), wrong], host_arch(), seed=8)
    ms = mirrored(image, tag="wrongdiff", targets=("upstream",))
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    for key, value in node.env.items():
        monkeypatch.setenv(key, value)
    node.remove_later(f"quay.io/{ms.repo}:wrongdiff", image.config_digest)
    room = Unrecorded(staging_dir=str(tmp_path))
    assert not room.info().reports_applied_diff_ids and not room.info().checks_diff_ids
    before = node.snapshot()
    reach = Reach(Progress(), config=lambda: load_mirrors(str(cfg)), store=lambda: Store(tmp_path / "cache"),
                  runtime=lambda: nullcontext(room), docker=nullcontext)
    with pytest.raises(VerifyError) as e:
        registry_to_runtime(CopyOptions(End("registry", "wrongdiff"), End("runtime", "podman")), reach)
    assert e.value.exit_code == 3
    assert e.value.message.startswith(f"layer 2 of quay.io/{ms.repo}:wrongdiff ({good.digest}) from ")
    assert e.value.message.endswith(f": its content has diff_id {good.diff_id}, the config says "
                                    f"{sha256_digest(b'not this')}")
    assert node.leftovers(before) == []


@pytest.mark.parametrize("engine", ["26.1-containerd"], indirect=True)
def test_a_delta_cut_offline_for_a_containerd_store_names_its_blobs_or_is_refused_as_fetch(
        services, factory, mirrored, tmp_path, docker_cli, docker_cleanup):
    """Issue 47 item 3: `copy bundle: bundle: --have` against a containerd image store's inventory does what
    `fetch --have` does. The store keeps an image by its manifest's blobs: a zstd delta whose manifest names blobs
    the store never received (its base was loaded from a gzip bundle no registry serves) would load an image that
    store cannot save, push or export, so it is refused with fetch's words and nothing is written; with the base
    bundle (--base) the delta names the base's blobs, loads, and `docker save` holds every layer."""
    from tests.support.bundles import BlobDir, write
    from tests.test_delta import docker_saves_every_layer

    arch = host_arch()
    base = factory.layers(2, size=200_000)
    old = factory.image(arch, layers=1, base=base, layer_size=100_000)
    new = factory.image(arch, layers=1, base=base, layer_size=100_000)
    ms = mirrored(factory.index([factory.zstd_twin(new)]), tag="v2", targets=("upstream",))
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    env = {"IMGTOOL_CACHE": str(tmp_path / "cache")}
    old_ref, new_ref = f"quay.io/{ms.repo}-base:v1", f"quay.io/{ms.repo}:v2"
    docker_cleanup.image(new_ref, old_ref, *docker_cli.ids_of(old), *docker_cli.ids_of(new))
    store = BlobDir(tmp_path / "blobs")
    write(tmp_path / "v1", [store.pulled(old, old_ref)], store)
    assert imgtool("load", str(tmp_path / "v1"), docker_host=services.docker_host).returncode == 0
    inv = tmp_path / "inventory.json"
    assert imgtool("inventory", "-o", str(inv), docker_host=services.docker_host).returncode == 0
    assert json.loads(inv.read_text())["daemon"]["image_store"] == "containerd"
    full = tmp_path / "v2"  # the registry's zstd layers, kept as served
    r = imgtool("fetch", "--no-tool", "v2", "--layers", "as-is", "--mirrors", str(cfg), "-o", str(full), env=env)
    assert r.returncode == 0, r.stderr

    refused = tmp_path / "refused"
    r = imgtool("copy", f"bundle:{full}", f"bundle:{refused}", "--have", str(inv), "--mirrors-file", str(cfg),
                env={"IMGTOOL_CACHE": str(tmp_path / "offline-cache")})
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-2:] == [
        f"error: cannot make {new_ref} a delta for the containerd image store of the inventory inventory.json: its "
        "manifest must name the blobs that Docker holds for the 2 layers it leaves out, and neither the cache nor "
        f"any source has the manifest of {old_ref} ({docker_cli.bundle_id(old)})",
        "hint: give the bundle that image was loaded from with --base DIR, or fetch a full bundle (without --have)"]
    assert not refused.exists()

    delta = tmp_path / "delta"
    r = imgtool("copy", f"bundle:{full}", f"bundle:{delta}", "--have", str(inv), "--base", str(tmp_path / "v1"),
                "--mirrors-file", str(cfg), env={"IMGTOOL_CACHE": str(tmp_path / "offline-cache")})
    assert r.returncode == 0, r.stderr
    assert (f"{new_ref} (linux/{arch}): 2 left-out layers named as the offline Docker holds them (its base's "
            "blobs); the image ID is unchanged") in r.stderr
    doc = json.loads((delta / "bundle.json").read_text())["images"][0]
    assert [(x["digest"], x.get("omitted", False)) for x in doc["layers"]] == \
        [(x.digest, True) for x in base] + [(new.layers[-1].zstd().digest, False)]
    assert doc["upstream"]["base_blobs"] == [0, 1]
    assert imgtool("verify", str(delta)).returncode == 0
    r = imgtool("load", str(delta), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    assert docker_cli.inspect_image(new_ref)["RootFS"]["Layers"] == new.diff_ids
    docker_saves_every_layer(docker_cli, tmp_path, new_ref)
