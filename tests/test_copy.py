"""`imgtool copy`: the pipeline's pairs no other verb names, end to end through the real CLI.

registry → runtime against the plain registry and every runtime of the matrix; bundle → bundle on bundles the
real `fetch` wrote.
"""

import json

import pytest

from tests.support.bundles import imgtool
from tests.support.images import host_arch


def _mirrors(tmp_path, services, repo):
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    return cfg


@pytest.mark.runtimes
def test_registry_to_runtime_lands_the_image_as_load_does(services, factory, mirrored, tmp_path, node):
    idx = factory.multiarch(media="oci", layers=2)
    ms = mirrored(idx, tag="v0.22.1rc1", targets=("upstream",))
    image, ref = idx.image(host_arch()), f"quay.io/{ms.repo}:v0.22.1rc1"
    cfg = _mirrors(tmp_path, services, ms.repo)
    env = dict(node.env, IMGTOOL_CACHE=str(tmp_path / "cache"))
    before = node.image_ids()
    node.remove_later(ref, "vllm:prod", node.bundle_id(image))
    r = imgtool("copy", "registry:v0.22.1rc1", "runtime:", "--mirrors-file", str(cfg), "--tag", "vllm:prod", env=env)
    assert r.returncode == 0, r.stderr
    assert set(node.image_ids()) - set(before) == {node.bundle_id(image)}
    assert ref in node.names(image) and "vllm:prod" in node.names(image)
    assert f"copied 1 image(s) from registry:v0.22.1rc1 to {node.title}" in r.stdout
    again = imgtool("copy", "registry:v0.22.1rc1", "runtime:", "--mirrors-file", str(cfg), "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert [im["ref"] for im in json.loads(again.stdout)["images"]] == [ref]


@pytest.mark.runtimes
def test_a_damaged_cached_blob_cuts_the_stream_and_the_runtime_keeps_nothing(services, factory, mirrored, tmp_path,
                                                                             node):
    idx = factory.multiarch(media="oci", layers=2)
    ms = mirrored(idx, tag="v0.22.1rc1", targets=("upstream",))
    image = idx.image(host_arch())
    cfg = _mirrors(tmp_path, services, ms.repo)
    cache = tmp_path / "cache"
    warm = imgtool("fetch", "v0.22.1rc1", "--arch", host_arch(), "--mirrors-file", str(cfg), "--no-tool",
                   "-o", str(tmp_path / "b"), env={"IMGTOOL_CACHE": str(cache)})
    assert warm.returncode == 0, warm.stderr
    last = image.layers[-1]
    blob = cache / "blobs" / "sha256" / last.digest.split(":")[1]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    before = node.image_ids()
    r = imgtool("copy", "registry:v0.22.1rc1", "runtime:", "--mirrors-file", str(cfg),
                env=dict(node.env, IMGTOOL_CACHE=str(cache)))
    assert r.returncode == 1, r.stderr
    assert f"error: blob {last.digest} (layer 2 of quay.io/{ms.repo}:v0.22.1rc1) in the cache does not match its " \
           f"digest: {blob}" in r.stderr
    assert node.image_ids() == before


@pytest.mark.parametrize("source, destination, message", [
    ("bundle:a", "registry:x", "error: copy bundle → registry is `push`'s job"),
    ("registry:v1", "bundle:b", "error: copy registry → bundle is `fetch`'s job"),
    ("bundle:a", "runtime:", "error: copy bundle → runtime is `load`'s job"),
    ("runtime:", "bundle:b", "error: cannot copy runtime → bundle: copy runs registry → runtime and bundle → bundle"),
    ("docker:x", "bundle:b", "error: invalid source 'docker:x': use registry:REF, bundle:DIR or runtime:[NAME]"),
    ("registry:v1", "runtime:cri-o", "error: invalid destination 'runtime:cri-o': the runtime is docker, containerd, "
                                     "podman or auto"),
    ("bundle:", "bundle:b", "error: invalid source 'bundle:': bundle: needs a directory"),
])
def test_pairs_and_ends_copy_does_not_run_are_usage_errors(source, destination, message):
    r = imgtool("copy", source, destination)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == message
