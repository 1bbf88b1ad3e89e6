"""A bundle holding one tag for two architectures: fetch records both, `imgtool load` loads and names
only the daemon's (or --arch), plain `docker load` names neither, load.sh names the daemon's one,
and `imgtool push` publishes an index over both.
"""

import json
import subprocess

import pytest

from imgtool.bundle.format import BundleIndex
from tests.support.bundles import fetch_two_arch, imgtool
from tests.support.images import host_arch

OTHER = {"amd64": "arm64", "arm64": "amd64"}[host_arch()]


@pytest.fixture
def two_arch(services, factory, mirrored, tmp_path):
    out, idx, repo = fetch_two_arch(services, factory, mirrored, tmp_path, "oci")
    return out, idx, f"quay.io/{repo}:v3"


def test_fetch_holds_both_with_the_index_digest(two_arch):
    out, idx, ref = two_arch
    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    assert [(im.ref, im.platform.architecture) for im in index.images] == [(ref, "amd64"), (ref, "arm64")]
    assert {str(im.index_digest) for im in index.images} == {idx.manifest_digest}
    assert imgtool("verify", str(out)).returncode == 0


@pytest.mark.runtimes
def test_imgtool_load_names_only_the_hosts_platform(two_arch, node):
    out, idx, ref = two_arch
    mine, other = idx.image(host_arch()), idx.image(OTHER)
    node.remove_later(ref, *node.ids_of(mine), *node.ids_of(other))
    r = imgtool("load", str(out), "--json", env=node.env)
    assert r.returncode == 0, r.stderr
    assert [im["image_id"] for im in json.loads(r.stdout)["images"]] == [mine.config_digest]
    assert node.holds(ref, mine)
    assert not node.find(other)  # never sent to the runtime

    wrong = imgtool("load", str(out), "--arch", "s390x", env=node.env)
    assert wrong.returncode == 2
    assert wrong.stderr.splitlines()[0] == (f"error: {ref}: this bundle holds it for linux/amd64, linux/arm64/v8, "
                                            "not for --arch s390x")


@pytest.mark.runtimes(stores=True)
def test_all_platforms_loads_every_one_and_the_tag_names_the_hosts(two_arch, node):
    """--all-platforms: the other platform is loaded too, kept by ID (on containerd, by digest: it keeps only
    named images); the tag stays with the host's platform."""
    out, idx, ref = two_arch
    mine, other = idx.image(host_arch()), idx.image(OTHER)
    node.remove_later(ref, *node.ids_of(mine), *node.ids_of(other))
    r = imgtool("load", str(out), "--all-platforms", "--json", env=node.env)
    assert r.returncode == 0, r.stderr
    loaded = [(im["image_id"], im["tags"], im["platform"]) for im in json.loads(r.stdout)["images"]]
    assert loaded[0][:2] == (mine.config_digest, [ref]) and loaded[1][:2] == (other.config_digest, [])
    assert loaded[1][2].startswith(f"linux/{OTHER}")
    assert node.holds(ref, mine) and node.find(other)
    if node.kind == "containerd":
        repo = ref.rsplit(":", 1)[0]
        assert f"{repo}@{node.bundle_id(other)}" in [row[0] for row in node.refs()]
    again = imgtool("load", str(out), "--all-platforms", "--json", env=node.env)
    assert again.returncode == 0 and json.loads(again.stdout)["sent"] is False


@pytest.mark.engines(stores=True)
def test_plain_docker_load_names_neither_and_load_sh_names_the_hosts(services, two_arch, docker_cli,
                                                                    docker_cleanup):
    out, idx, ref = two_arch
    mine, other = idx.image(host_arch()), idx.image(OTHER)
    docker_cleanup.image(ref, mine.config_digest, other.config_digest)
    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    env = {"DOCKER": f"docker -H {services.docker_host}", "PATH": "/usr/bin:/bin:/usr/local/bin"}
    if docker_cli.containerd_store:
        # that store knows images by manifest digest and load.sh names them by config digest: it refuses
        before = docker_cli.image_ids()
        r = subprocess.run(["sh", str(out / "load.sh")], capture_output=True, text=True, env=env)
        assert r.returncode == 5
        assert r.stderr.splitlines()[-2:] == [
            f"load.sh: error: this bundle holds {ref} for several architectures, and load.sh cannot load and name "
            "the right one in the containerd image store of this Docker (that store knows images by manifest "
            "digest, load.sh names them by config digest); nothing was loaded",
            "load.sh: run instead, in this directory: imgtool load .   (it loads this host's architecture only)"]
        assert docker_cli.image_ids() == before
        return
    docker_cli.load(out / index.archive.name)
    assert docker_cli.inspect_image(ref) is None  # no architecture got the name
    assert docker_cli.find(other)["RepoTags"] == []
    r = subprocess.run(["sh", str(out / "load.sh")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert docker_cli.holds(ref, mine)


def test_push_two_arch_bundle_makes_an_index(services, two_arch, uniq, registry):
    out, idx, ref = two_arch
    r = imgtool("push", str(out), "--to", f"{services.plain}/{uniq}", "--insecure", "--json")
    assert r.returncode == 0, r.stderr
    pushed = json.loads(r.stdout)
    repo = f"{uniq}/{ref.split('/', 1)[1].rsplit(':', 1)[0]}"
    got = registry("plain").get_manifest(repo, "v3")
    doc = json.loads(got.body)
    assert doc["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert sorted((m["platform"]["architecture"], m["digest"]) for m in doc["manifests"]) == sorted(
        (im.architecture, im.manifest_digest) for im in idx.images)
    assert pushed["indexes"][0]["digest"] == got.digest
    assert pushed["indexes"][0]["upstream_index_digest"] == idx.manifest_digest
    # the bundle keeps the platform manifests, not upstream's index: the rebuilt one differs, and push says so
    assert got.digest != idx.manifest_digest
    assert pushed["warnings"] == [
        f"{services.plain}/{repo}:v3 is an index over the 2 platforms in the bundle; its digest {got.digest[7:19]} "
        f"differs from upstream's {idx.manifest_digest[7:19]} (pull by tag, or by the platform manifest digests, "
        "which are upstream's)"]


@pytest.mark.engines(stores=True)
def test_a_plain_docker_load_never_moves_the_tag_imgtool_gave_the_hosts_platform(services, two_arch, docker_cli,
                                                                                   docker_cleanup):
    """Issue 24 item 8: the containerd image store reads index.json, which named both platforms, so a
    plain `cat parts | docker load` after imgtool's load moved the tag to the other architecture.
    index.json leaves such a tag unnamed now, as manifest.json does, on every store."""
    out, idx, ref = two_arch
    mine, other = idx.image(host_arch()), idx.image(OTHER)
    docker_cleanup.image(ref, *docker_cli.ids_of(mine), *docker_cli.ids_of(other))
    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    assert json.loads((out / "bundle.json").read_text())["version"] == 3
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    assert docker_cli.holds(ref, mine)
    plain = subprocess.run(f"cat {' '.join(p.name for p in index.parts)} | docker -H {services.docker_host} load",
                           shell=True, cwd=out, capture_output=True, text=True, timeout=300)
    assert f"Loaded image: {ref}" not in plain.stdout, plain.stdout
    assert docker_cli.holds(ref, mine), plain.stdout + plain.stderr


def test_a_bundle_of_format_version_1_still_verifies_and_loads(services, factory, tmp_path, docker_cli,
                                                              docker_cleanup, monkeypatch):
    """A multi-arch bundle written before version 3 (index.json naming every platform) is read by its own
    layout: verify finds every member where it was, load loads the host's platform."""
    from imgtool.bundle import format as fmt
    from imgtool.bundle import layout
    from tests.support.bundles import BlobDir, write

    idx = factory.multiarch(("amd64", "arm64"), layers=1, media="oci")
    ref = "quay.io/ascend/vllm-ascend:old-format"
    store = BlobDir(tmp_path / "blobs")
    members = layout.members
    with monkeypatch.context() as m:  # what imgtool wrote before version 3
        m.setattr(layout, "members", lambda images, legacy_names=False: members(images, True))
        m.setattr(fmt.BundleIndex, "version", property(lambda self: 2 if self.is_delta else 1))
        write(tmp_path / "old", [store.pulled(idx.image(a), ref) for a in ("amd64", "arm64")], store)
    doc = json.loads((tmp_path / "old" / "bundle.json").read_text())
    assert doc["version"] == 1
    mine = idx.image(host_arch())
    docker_cleanup.image(ref, *docker_cli.ids_of(mine))
    r = imgtool("verify", str(tmp_path / "old"))
    assert r.returncode == 0, r.stderr
    r = imgtool("load", str(tmp_path / "old"), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    assert docker_cli.holds(ref, mine)


@pytest.mark.engines(stores=True)
def test_diff_of_the_bundle_against_a_docker_that_pulled_the_tag_upstream_is_unchanged(
        services, two_arch, docker_cli, docker_cleanup, tmp_path):
    """A Docker that pulled the multi-arch tag from the registry (the containerd store names it by the
    index digest bundle.json records) holds the same image for its platform: diff says unchanged."""
    out, idx, ref = two_arch
    mine = idx.image(host_arch())
    pulled = services.plain + "/" + ref.split("/", 1)[1]
    docker_cleanup.image(ref, pulled, *docker_cli.ids_of(mine), idx.manifest_digest)
    docker_cli("pull", pulled)
    docker_cli("tag", pulled, ref)
    inv = tmp_path / "inv.json"
    r = imgtool("inventory", "-o", str(inv), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    shown = docker_cli.inspect_image(ref)["Id"]
    assert shown in (mine.config_digest, idx.manifest_digest)
    for args in ((str(out), str(inv)), (str(inv), str(out))):
        r = imgtool("diff", *args)
        assert r.returncode == 0, r.stderr
        rows = [x.split() for x in r.stdout.splitlines() if x.startswith("  ") and ref in x.split()[1:2]]
        mine_row = [x for x in rows if x[2] == f"linux/{host_arch()}"]
        assert mine_row == [["unchanged", ref, f"linux/{host_arch()}", "ID", shown[7:19]]], r.stdout
