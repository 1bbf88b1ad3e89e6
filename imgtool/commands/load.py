"""imgtool load: check a bundle and stream it into Docker, containerd or Podman."""

import click

from .options import bundle_usage, common, json_option, runtime_choice, runtime_options, say_choice, signers_option
from ..errors import UsageError
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
@click.option("--models", "models_target", type=click.Choice(["hf", "modelscope"]),
              help="Place the bundle's models into this cache (default: an hf: model into the Hugging Face cache, "
                   "a modelscope: one into ModelScope's; HF_HOME/HF_HUB_CACHE and MODELSCOPE_CACHE are honoured).")
@click.option("--models-dir", metavar="DIR", type=click.Path(file_okay=False),
              help="Place the bundle's models into the plain directory DIR (DIR/ORG/NAME) instead of a cache.")
@click.option("--no-models", is_flag=True, help="Load the images only; place none of the bundle's models.")
@click.option("--models-only", is_flag=True,
              help="Place the bundle's models only; load no image (no runtime is asked anything).")
@signers_option
@runtime_options
@json_option("result")
@common
def load(bundle_dir, tags, expect, force, arch, all_platforms, quick, no_pin, models_target, models_dir, no_models,
         models_only, signers, runtime, address, namespace, as_json):
    """Check a bundle, then stream it into Docker, containerd or Podman and confirm it; place its models.

    Every part's sha256, every tar header and every blob's digest are checked while the parts
    stream into the runtime; the first mismatch cuts the upload short, the runtime drops what it
    got and nothing is loaded (the runtime checks each layer's diff_id itself). Missing or
    wrong-size parts, SHA256SUMS and --expect are checked before the runtime is sent anything.
    On a Kubernetes node, the image goes where the kubelet reads images (containerd: its endpoint,
    namespace k8s.io, unpacked and pinned; cri-dockerd: Docker).

    The bundle's models are placed where their clients read them offline (the Hugging Face cache,
    ModelScope's, or --models-dir), each file checked against its sha256, read-only and atomically:
    nothing appears under a model's name before the whole bundle was checked. The runtime is sent the
    images only; a bundle of models alone needs no runtime.
    """
    from ..load import load_bundle
    from ..bundle.reader import read_index
    from ..model import format_size
    from ..runtimes.choice import open_runtime

    bundle_usage(bundle_dir, expect)
    models = _model_choice(models_target, models_dir, no_models, models_only, force)
    index, _ = read_index(bundle_dir)  # no bundle.json, or a broken one, is named before the runtime is asked anything
    p = progress()
    if models_only and not index.models:
        raise UsageError(f"--models-only: {bundle_dir} holds no model", hint="load it without --models-only")
    if models_only or not index.images:  # the models alone: no runtime is needed
        _models_alone(load_bundle(bundle_dir, None, expect=expect, force=force, quick=quick, progress=p,
                                  signers=signers, models=models), p, as_json)
        return
    choice = runtime_choice(runtime, address, namespace)
    say_choice(choice)
    with open_runtime(choice) as daemon:
        result = load_bundle(bundle_dir, daemon, tags=tags, expect=expect, force=force, quick=quick, progress=p,
                             arch=arch, signers=signers, all_platforms=all_platforms, pin=not no_pin, models=models)
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
    _say_models(p, result)
    echo_signature(result.signature)


def _models_alone(result, p, as_json) -> None:
    """What a load of models without a runtime says."""
    if as_json:
        emit_json(result.to_json())
        return
    _say_models(p, result)
    if not result.models:
        click.echo(f"nothing placed from {result.dir}: --no-models")
    echo_signature(result.signature)


def _model_choice(target, models_dir, no_models, models_only, force):
    """Where the bundle's models go (None: nowhere, --no-models); raises UsageError for options that contradict."""
    from pathlib import Path

    from ..ends.model_dest import ModelChoice

    if no_models and (models_only or target or models_dir):
        raise UsageError("--no-models places no model: it cannot go with --models-only, --models or --models-dir")
    if target and models_dir:
        raise UsageError("--models and --models-dir both say where the models go: choose one")
    if no_models:
        return None
    return ModelChoice(target, Path(models_dir) if models_dir else None, force)


def _say_models(p, result) -> None:
    """Where each model was placed (the placer's line), after what each placement found left by a stopped one."""
    for placed in result.models:
        for note in placed.notes:
            p.note(note)
        click.echo(placed.line())


def _runtime_title(facts: dict) -> str:
    return facts["title"]


def _namespace_words(facts: dict) -> str:
    return f", namespace {facts['namespace']}" if facts.get("namespace") else ""
