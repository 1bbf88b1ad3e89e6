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
@click.option("--models", "models_target", type=click.Choice(["hf", "modelscope", "image"]),
              help="Place the bundle's models into this cache, or import each into the runtime as its modelcar "
                   "image (image: models.local/HUB/ORG/NAME:COMMIT-modelcar, what a Kubernetes image volume or "
                   "Podman's --mount type=image mounts). Default: image on a Kubernetes node whose kubelet uses "
                   "containerd (when the bundle carries the modelcar form), else an hf: model into the Hugging Face "
                   "cache and a modelscope: one into ModelScope's (HF_HOME/HF_HUB_CACHE and MODELSCOPE_CACHE are "
                   "honoured).")
@click.option("--models-dir", metavar="DIR", type=click.Path(file_okay=False),
              help="Place the bundle's models into the plain directory DIR (DIR/ORG/NAME) instead of a cache.")
@click.option("--no-models", is_flag=True, help="Load the images only; place none of the bundle's models.")
@click.option("--models-only", is_flag=True,
              help="Place the bundle's models only; load no image (no runtime is asked anything, unless the "
                   "models are imported as images).")
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
    images only; a bundle of models alone needs no runtime. With --models image (the default on a
    Kubernetes node whose kubelet uses containerd), each model is imported into the runtime instead as
    its modelcar image, streamed from the bundle's files and checked on the way.
    """
    from ..load import load_bundle
    from ..bundle.reader import read_index
    from ..runtimes.choice import open_runtime

    bundle_usage(bundle_dir, expect)
    image = models_target == "image"
    models = _model_choice(None if image else models_target, models_dir, no_models, models_only, force, image)
    index, _ = read_index(bundle_dir)  # no bundle.json, or a broken one, is named before the runtime is asked anything
    p = progress()
    if models_only and not index.models:
        raise UsageError(f"--models-only: {bundle_dir} holds no model", hint="load it without --models-only")
    choice = None
    if index.models and models is not None and (image or not (models_target or models_dir)):
        choice = runtime_choice(runtime, address, namespace)
        image = _model_images(image, choice, index, bundle_dir, p)
    if image and choice is not None:
        say_choice(choice)
        with open_runtime(choice) as daemon:
            result = load_bundle(bundle_dir, daemon, tags=tags, expect=expect, force=force, quick=quick, progress=p,
                                 arch=arch, signers=signers, all_platforms=all_platforms, pin=not no_pin,
                                 model_images=True, images=not models_only)
        _say_loaded(p, result, as_json, choice, bool(index.images) and not models_only)
        return
    if models_only or not index.images:  # the models alone: no runtime is needed
        _models_alone(load_bundle(bundle_dir, None, expect=expect, force=force, quick=quick, progress=p,
                                  signers=signers, models=models), p, as_json)
        return
    choice = choice or runtime_choice(runtime, address, namespace)
    say_choice(choice)
    with open_runtime(choice) as daemon:
        result = load_bundle(bundle_dir, daemon, tags=tags, expect=expect, force=force, quick=quick, progress=p,
                             arch=arch, signers=signers, all_platforms=all_platforms, pin=not no_pin, models=models)
    _say_loaded(p, result, as_json, choice, True)


def _say_loaded(p, result, as_json, choice, images: bool) -> None:
    """What a load into a runtime says: the images (when the bundle's were loaded), the modelcars, the models."""
    if as_json:
        emit_json(dict(result.to_json(), runtime_choice=choice.reason() or None))
        return
    if not result.sent:
        for w in result.warnings:
            p.warn(w)
    if images:
        _say_images(p, result)
    _say_modelcars(p, result)
    _say_models(p, result)
    echo_signature(result.signature)


def _say_images(p, result) -> None:
    from ..model import format_size

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


def _say_modelcars(p, result) -> None:
    """Each model imported as its modelcar image, or held already."""
    from ..model import format_size

    where = f"{_runtime_title(result.daemon)}{_namespace_words(result.daemon)}"
    for im in result.modelcars:
        if im.finished:
            p.note(f"finished {im.ref}: an earlier load had left it unfinished ({im.finished})")
        pinned = ", pinned" if im.pinned else ""
        done = "held already" if not result.modelcars_sent else "imported"
        click.echo(f"model image {im.ref} ({im.platform}, {format_size(im.size)}{pinned}): {done} in {where}")


def _models_alone(result, p, as_json) -> None:
    """What a load of models without a runtime says."""
    if as_json:
        emit_json(result.to_json())
        return
    _say_models(p, result)
    if not result.models:
        click.echo(f"nothing placed from {result.dir}: --no-models")
    echo_signature(result.signature)


def _model_choice(target, models_dir, no_models, models_only, force, image=False):
    """Where the bundle's models go (None: nowhere, --no-models); raises UsageError for options that contradict."""
    from pathlib import Path

    from ..ends.model_dest import ModelChoice

    if no_models and (models_only or target or models_dir or image):
        raise UsageError("--no-models places no model: it cannot go with --models-only, --models or --models-dir")
    if (target or image) and models_dir:
        raise UsageError("--models and --models-dir both say where the models go: choose one")
    if no_models:
        return None
    return ModelChoice(target, Path(models_dir) if models_dir else None, force)


def _model_images(asked: bool, choice, index, bundle_dir, p) -> bool:
    """Whether the models go into the runtime as modelcar images: --models image (refused, exit 2, for a bundle
    that does not carry that form), or by default on a Kubernetes node whose kubelet uses containerd, where this
    load goes (an image volume is what mounts a model there); raises UsageError."""
    from ..ends.modelcar_source import carries_modelcars

    carries = carries_modelcars(index)
    if asked:
        if not carries:
            raise UsageError(f"--models image: {bundle_dir} does not carry the modelcar form of its models "
                             "(bundle.json records no modelcar digest for their files)",
                             hint="place the files instead (--models hf, --models modelscope or --models-dir DIR), "
                                  "or fetch the models again with an imgtool that records the modelcar form")
        return True
    if not (choice.kubelet_uses("containerd") and choice.loads_into("containerd")):
        return False
    if not carries:
        p.note("the kubelet uses containerd, but this bundle does not carry the modelcar form of its models: "
               "placing their files")
        return False
    p.note("the kubelet uses containerd: importing the models as modelcar images (--models hf places the files)")
    return True


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
