"""imgtool load: check a bundle and stream it into Docker, containerd or Podman."""

import click

from .options import bundle_usage, common, json_option, runtime_choice, runtime_options, say_choice, signers_option
from .output import echo_signature, emit_json, progress, table


@click.command()
@click.argument("bundle_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--tag", "tags", multiple=True, metavar="NAME",
              help="Also tag the image NAME[:TAG] (SOURCE=NAME when the bundle holds several). Repeatable.")
@click.option("--expect", metavar="SHA256", help="The sha256 of bundle.json that `fetch` printed.")
@click.option("--force", is_flag=True, help="Load even when Docker's disk looks too small.")
@click.option("--arch", metavar="ARCH",
              help="Of a tag held for several architectures, load this one (default: the runtime host's).")
@click.option("--all-platforms", is_flag=True,
              help="Of a tag held for several architectures, load every one; the tag names the host's "
                   "(or --arch's), the others are kept by ID (on containerd: by digest, REPO@sha256:...).")
@click.option("--quick", is_flag=True,
              help="When Docker already holds the images: check only that every part is there at its size "
                   "(default: also every part's sha256 and every blob) before tagging.")
@click.option("--no-pin", is_flag=True,
              help="On containerd, leave the images unpinned (by default they are labelled io.cri-containerd.pinned="
                   "pinned, which the kubelet's image GC skips on containerd 1.7+).")
@signers_option
@runtime_options
@json_option("result")
@common
def load(bundle_dir, tags, expect, force, arch, all_platforms, quick, no_pin, signers, runtime, address, namespace,
         as_json):
    """Check a bundle, then stream it into Docker, containerd or Podman and confirm it.

    Every part's sha256, every tar header and every blob's digest are checked while the parts
    stream into the runtime; the first mismatch cuts the upload short, the runtime drops what it
    got and nothing is loaded (the runtime checks each layer's diff_id itself). Missing or
    wrong-size parts, SHA256SUMS and --expect are checked before the runtime is sent anything.
    On a Kubernetes node, the image goes where the kubelet reads images (containerd: its endpoint,
    namespace k8s.io, unpacked and pinned; cri-dockerd: Docker).
    """
    from ..load import load_bundle
    from ..bundle.reader import read_index
    from ..model import format_size
    from ..runtimes.choice import open_runtime

    bundle_usage(bundle_dir, expect)
    choice = runtime_choice(runtime, address, namespace)
    read_index(bundle_dir)  # no bundle.json, or a broken one, is named before the runtime is asked anything
    p = progress()
    say_choice(choice)
    with open_runtime(choice) as daemon:
        result = load_bundle(bundle_dir, daemon, tags=tags, expect=expect, force=force, quick=quick, progress=p,
                             arch=arch, signers=signers, all_platforms=all_platforms, pin=not no_pin)
    if as_json:
        emit_json(dict(result.to_json(), runtime_choice=choice.reason() or None))
        return
    if not result.sent:
        for w in result.warnings:
            p.warn(w)
    for im in result.images:
        if im.finished:
            p.note(f"finished {im.ref}: an earlier load had left it unfinished ({im.finished})")
    pinned = [im.ref for im in result.images if im.pinned]
    if pinned:
        p.note(f"pinned: {', '.join(pinned)} (io.cri-containerd.pinned=pinned: the kubelet's image GC keeps "
               "them on containerd 1.7+)")
    rows = [(", ".join(im.tags) or im.ref, im.docker_id[7:19], im.platform, format_size(im.size)) for im in result.images]
    click.echo(table(rows, ["name", "id", "platform", "size"]))
    where = _runtime_title(result.daemon)
    if result.sent:
        click.echo(f"loaded {len(result.images)} image(s) from {result.dir} in {result.seconds:.1f} s "
                   f"({format_size(result.bytes_sent)} sent to {where} {result.daemon['version']}"
                   f"{_namespace_words(result.daemon)})")
    else:
        click.echo(f"already loaded: nothing sent to {where} ({result.dir}{_namespace_words(result.daemon)})")
    echo_signature(result.signature)


def _runtime_title(facts: dict) -> str:
    return facts["title"]


def _namespace_words(facts: dict) -> str:
    return f", namespace {facts['namespace']}" if facts.get("namespace") else ""
