"""imgtool run-flags and imgtool run: a container for an Ascend preset, printed or started."""

import click

from ..runtimes.choice import CHOICES, PROGRAMS
from .options import common, json_option, mirrors_option, presets_option, runtime_choice, say_choice
from .output import emit_json, progress


class _CommandAfterDashes(click.Command):
    """A verb whose words after `--` are the container's command, kept apart from IMAGE."""

    def parse_args(self, ctx, args):
        if "--" in args:
            i = args.index("--")
            ctx.meta["imgtool.container_command"] = tuple(args[i + 1:])
            args = args[:i]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx):
        return super().collect_usage_pieces(ctx) + ["[-- CMD...]"]


def run_options(f):
    """The options `run-flags` and `run` share: what changes the container."""
    options = [
        click.option("--devices", metavar="0,1|0-7|all",
                     help="Cards /dev/davinciN to pass (default: all of the preset's; run: those present)."),
        click.option("--shm-size", metavar="SIZE", help="Size of /dev/shm, e.g. 16g (default: the preset's)."),
        click.option("--privileged", is_flag=True,
                     help="Add --privileged (never added unless asked for or required by the preset)."),
        click.option("--net", "network", metavar="host|bridge|none|NAME", help="Container network; host drops -p."),
        click.option("--multi-node", is_flag=True, help="Multi-node serving: host network plus hccn_tool."),
        click.option("--name", metavar="NAME", help="Container name (default: vllm-ascend)."),
        click.option("--env-preset", "env_presets", multiple=True, metavar="NAME",
                     help="deterministic (FAQ 15) or expandable-segments (FAQ 12); repeatable."),
        click.option("-e", "--env", multiple=True, metavar="NAME=VALUE", help="Environment variable; repeatable."),
        click.option("-v", "--volume", "volumes", multiple=True, metavar="/HOST:/CONTAINER[:ro]",
                     help="Extra bind mount, e.g. the model directory; repeatable."),
        click.option("--model", metavar="ORG/NAME[@REV]",
                     help="Serve this placed model (hf:ORG/NAME, modelscope:ORG/NAME pin the hub): mount it read-only, "
                          "set the offline environment, and run `vllm serve` on it (words after -- that are options "
                          "are added to it). Looks in the Hugging Face cache, then ModelScope's."),
        click.option("--models", type=click.Choice(["hf", "modelscope"]), default=None,
                     help="--model: look only in this cache (HF_HUB_CACHE or HF_HOME; MODELSCOPE_CACHE)."),
        click.option("--models-dir", metavar="DIR", default=None,
                     help="--model: look in DIR/ORG/NAME (where `imgtool load --models-dir DIR` places it)."),
        click.option("-p", "--publish", multiple=True, metavar="[IP:]HOST:CONTAINER",
                     help="Published port, replacing the preset's 8000:8000; repeatable."),
        click.option("-d", "--detach", is_flag=True, help="Start in the background, like docker run -itd."),
        click.option("--rm/--no-rm", "remove", default=True, show_default=True,
                     help="Remove the container when it exits."),
        click.option("--runtime", type=click.Choice(CHOICES), default="auto", show_default=True,
                     help="The runtime: `docker run` or `podman run` (the same flags; podman also gets --pull=never); "
                          "auto chooses as load does: on a Kubernetes node the kubelet's runtime (containerd: a Pod, "
                          "run-flags --format k8s), elsewhere the first of Docker, containerd, Podman that answers."),
        mirrors_option,
        presets_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _run_spec(preset_name, kw, program=PROGRAMS[0], model_form=None):
    """(PresetSet, Preset, RunSpec without image, MirrorConfig) from a verb's options, rendered for `program`;
    `model_form(model)` says how --model's placed model is mounted (default: its directory)."""
    from .. import presets as P
    from ..config import load_mirrors

    pset = P.load_presets(kw.pop("presets_file"))
    preset = pset.get(preset_name)
    command = click.get_current_context().meta.get("imgtool.container_command", ())
    model = _served_model(kw["model"], kw["models"], kw["models_dir"])
    if model is not None and model_form is not None:
        model = model_form(model)
    opts = P.RunOptions(
        devices=kw["devices"], shm_size=kw["shm_size"], privileged=kw["privileged"], network=kw["network"],
        name=kw["name"] or P.DEFAULT_NAME, env_presets=tuple(kw["env_presets"]), env=tuple(kw["env"]),
        volumes=tuple(kw["volumes"]), publish=tuple(kw["publish"]), multi_node=kw["multi_node"],
        detach=kw["detach"], remove=kw["remove"], command=command, program=program, model=model)
    spec = P.build_spec(pset, preset_name, opts)
    return pset, preset, spec, load_mirrors(kw["mirrors_file"])


def _served_model(text, models, models_dir):
    """--model's placed model as the container serves it (None without --model), said on stderr with where it was
    found and what is wrong with it. Raises UsageError: not placed (naming where it looked), options that disagree."""
    from .. import presets as P
    from ..errors import UsageError
    from ..placed import WHERE, find_model, parse_wanted

    if text is None:
        for given, flag in ((models, "--models"), (models_dir, "--models-dir")):
            if given is not None:
                raise UsageError(f"{flag} applies with --model: it says where to look for the model")
        return None
    placed, notes = find_model(parse_wanted(text), models, models_dir)
    for path in (placed.folder, placed.path):
        if ":" in str(path) or "," in str(path):  # -v HOST:CONTAINER[:ro] and --mount cannot say it
            raise UsageError(f"cannot mount {path}: a ':' or ',' in the path",
                             hint="place the model under a path without them (--models-dir DIR, HF_HUB_CACHE)")
    progress().note(f"model: {placed.describe()}, from {WHERE[placed.target]}")
    for note in notes:
        progress().note(note)
    for problem in placed.problems:
        progress().warn(f"{placed.ref}: {problem} (imgtool doctor lists the placed models)")
    return P.ServedModel(placed.repo, placed.target, str(placed.folder), str(placed.path), placed.hub, placed.commit)


ASK_TIMEOUT = 5  # run-flags asks the runtime about local images, and needs no runtime at all


def _ask_runtime(choice):
    """The runtime `choice` names (auto: as load chooses), opened to ask about local images, or None when none
    answers (run-flags needs no runtime): the caller closes it."""
    from ..errors import DaemonError
    from ..runtimes.choice import open_runtime

    try:
        return open_runtime(choice, timeout=ASK_TIMEOUT, create=False)
    except DaemonError:
        return None


def _local_tags(repository, runtime):
    """Tags of `repository` in `runtime`, or None when there is none or it cannot be asked."""
    from ..errors import DaemonError

    try:
        return runtime.local_tags(repository) if runtime is not None else None
    except DaemonError:
        return None


def _arch_warning(spec, runtime):
    """The runtime's warning for an image of another architecture, or None (also when it cannot be asked)."""
    from ..errors import DaemonError

    try:
        return runtime.arch_warning(spec.image) if runtime is not None else None
    except DaemonError:
        return None  # run-flags works without a runtime


def _warn_spec(spec, preset, default_image, runtime):
    from .. import presets as P

    warning = P.privileged_warning(spec)
    if warning:
        progress().warn(warning)
    mismatch = P.suffix_mismatch(preset, spec.image, default_image)
    if mismatch:
        progress().warn(mismatch)
    if not spec.image_is_placeholder:  # the same warning as load and doctor: exec format error ahead
        wrong_arch = _arch_warning(spec, runtime)
        if wrong_arch:
            progress().warn(wrong_arch)


def _image_to_run(spec, preset, image, default_image, local_tags):
    """The spec with IMAGE (a bare tag: of the default image), else the newest local image for the preset;
    raises UsageError when there is none. `local_tags(repository)` asks the runtime."""
    from .. import presets as P
    from ..errors import UsageError

    if image:
        return spec.with_image(P.normalize_image(image, default_image))
    newest, placeholder = P.default_image_for(preset, default_image, local_tags(default_image))
    if placeholder:
        raise UsageError(f"no {default_image} image for preset {preset.name} is loaded in {spec.program.title} "
                         f"(looked for tags {', '.join(preset.tag_patterns)})",
                         hint=f"name one: imgtool run {preset.name} IMAGE, or load a bundle first: imgtool load DIR")
    return spec.with_image(newest)


@click.command("run-flags", cls=_CommandAfterDashes)
@click.argument("preset")
@click.option("--image", metavar="REF",
              help="Image or tag (default: the newest one for PRESET loaded in the runtime, else a placeholder).")
@run_options
@click.option("--one-line", is_flag=True, help="Print the command on one line instead of one flag per line.")
@click.option("--format", "fmt", type=click.Choice([p.name for p in PROGRAMS] + ["k8s"]), default=None,
              help="docker run, podman run, or a Kubernetes Pod/Deployment as YAML (default: --runtime's).")
@click.option("--kind", type=click.Choice(["pod", "deployment"]), default=None,
              help="k8s: a Pod (the default) or a Deployment.")
@click.option("--resource-name", metavar="DOMAIN/NAME",
              help="k8s: the device plugin's NPU resource (default: the preset's, e.g. huawei.com/Ascend910).")
@click.option("--bundle", "bundle_dir", metavar="DIR",
              help="k8s: name the image by the manifest digest this bundle holds for it (and its architecture).")
@click.option("--arch", metavar="ARCH",
              help="k8s --bundle: of a tag the bundle holds for several architectures, pin this one's manifest.")
@click.option("--k8s-version", "kube_version", metavar="1.N",
              help="k8s --model: the cluster's Kubernetes version. 1.35+ mounts the model's modelcar image as an "
                   "image volume (1.36+ with a subPath); older, or not given: a hostPath of the placed directory.")
@json_option("flags")
@common
def run_flags(preset, image, one_line, as_json, fmt, kind, resource_name, bundle_dir, arch, kube_version, **kw):
    """Print the docker (or podman) run command for PRESET (a2, a3, 300i-duo, 200i-pro, a5, ...), ready to paste,
    or with --format k8s a Kubernetes Pod (or Deployment) for it.

    Words after -- become the container's command:

    \b
        imgtool run-flags a2 -v /data/models:/models -- vllm serve /models/Qwen3-8B
        imgtool run-flags a2 --model Qwen/Qwen3-8B -- --tensor-parallel-size 2
        imgtool run-flags a2 --format k8s --bundle DIR -- vllm serve Qwen/Qwen3-8B > pod.yaml
    """

    choice = runtime_choice(kw.pop("runtime"), None, None)
    # a Pod whose image --image or --bundle names is for a cluster: no local runtime is asked anything (each
    # runtime that does not answer cost up to ASK_TIMEOUT, and Podman's CLI starts slowly)
    runtime = None if fmt == "k8s" and (image or bundle_dir) else _ask_runtime(choice)
    try:
        fmt, program = _run_format(choice, runtime, fmt)
        if runtime is not None and fmt != "k8s" and runtime.traits.run_program != program:
            runtime.close()
            runtime = None  # the runtime that answered is not the one the command is for: not asked
        kube = _kube_options(fmt, kind, resource_name, kube_version)
        _run_flags(preset, image, one_line, as_json, fmt, kube, bundle_dir, arch, kw, program, runtime)
    finally:
        if runtime is not None:
            runtime.close()


def _run_format(choice, runtime, fmt):
    """(the format, the program rendered): --format's, else the chosen runtime's `run` program, else (a runtime
    without one: containerd, whose containers the kubelet starts) a Pod. Raises UsageError."""
    from ..errors import UsageError
    from ..runtimes.choice import ROOMS

    if choice.effective != "auto":
        traits = ROOMS[choice.effective]
    else:  # the runtime that answered, as load would choose it; Docker's syntax when none does
        traits = runtime.traits if runtime is not None else next(iter(ROOMS.values()))
    programs = {p.name: p for p in PROGRAMS}
    if fmt is None:
        return ("k8s", PROGRAMS[0]) if traits.run_program is None else (traits.run_program.name, traits.run_program)
    if fmt in programs and choice.runtime != "auto" and traits.run_program != programs[fmt]:
        raise UsageError(f"--format {fmt} and --runtime {choice.runtime} name different programs: give one")
    return fmt, programs.get(fmt, traits.run_program or PROGRAMS[0])


def _kube_options(fmt, kind, resource_name, kube_version):
    """--format k8s's options (None for docker and podman); raises UsageError for one given without it."""
    from .. import presets as P
    from ..errors import UsageError

    if fmt != "k8s":
        for given, flag in ((kind, "--kind"), (resource_name, "--resource-name"), (kube_version, "--k8s-version")):
            if given is not None:
                raise UsageError(f"{flag} applies to --format k8s")
        return None
    version = P.parse_kube_version(kube_version) if kube_version is not None else None
    return P.KubeOptions(kind=kind or "pod", resource_name=resource_name, version=version)


def _run_flags(preset, image, one_line, as_json, fmt, kube, bundle_dir, arch, kw, program, runtime):
    from .. import presets as P
    from ..errors import UsageError

    if fmt != "k8s":
        for given, flag in ((bundle_dir, "--bundle"), (arch, "--arch")):
            if given is not None:
                raise UsageError(f"{flag} applies to --format k8s")
    elif one_line:
        raise UsageError("--one-line applies to --format docker and podman")
    elif arch is not None and bundle_dir is None:
        raise UsageError("--arch applies with --bundle: it chooses which of the bundle's manifests the Pod names")
    if fmt == "k8s":
        form = (lambda m: m.as_image()) if P.mounts_model_image(kube.version) else None
    else:
        form = _engine_model_form(runtime)
    pset, p, spec, config = _run_spec(preset, kw, program, form)
    if fmt == "k8s":
        _k8s_flags(spec, p, image, config.default_image, kube, bundle_dir, arch, as_json, runtime)
        _say_kube_model(spec)
        return
    if image:
        spec = spec.with_image(P.normalize_image(image, config.default_image))
    else:
        spec = spec.with_image(*P.default_image_for(p, config.default_image,
                                                    _local_tags(config.default_image, runtime)))
    _warn_spec(spec, p, config.default_image, runtime)
    if spec.image_is_placeholder:
        progress().warn(f"no {config.default_image} image for preset {p.name} is loaded here; "
                        f"replace {P.PLACEHOLDER_TAG} in the command or pass --image")
    if as_json:
        emit_json(spec.to_json())
    else:
        click.echo(P.render_command(spec, one_line=one_line))


def _say_kube_model(spec):
    """How the Pod gets --model's model, on stderr."""
    model = spec.model
    if model is None:
        return
    if model.image is not None:
        progress().note(f"model: the image volume {model.image} at {model.path} (pullPolicy IfNotPresent): the "
                        f"node's runtime must hold it (imgtool load of the bundle imports it)")
    else:
        progress().note(f"model: a hostPath of {model.folder}: every node the Pod may run on needs the model placed "
                        f"there; --k8s-version 1.35 or later mounts its modelcar image instead")


def _engine_model_form(runtime):
    """How `docker run`/`podman run` mount --model's model: its modelcar image where the runtime can mount images
    and holds that one, else (also when no runtime answers) the placed directory."""
    from ..errors import DaemonError

    def form(model):
        image = model.modelcar
        if runtime is None or image is None:
            return model
        try:
            if runtime.mounts_images() and runtime.has_image(image):
                return model.as_image()
        except DaemonError:
            pass  # run-flags works without a runtime: the directory
        return model

    return form


def _k8s_flags(spec, preset, image, default_image, options, bundle_dir, arch, as_json, runtime):
    """run-flags --format k8s: the Pod or Deployment, by digest from a bundle, else by tag (as for docker)."""
    from .. import presets as P

    architecture = pinned = None
    if bundle_dir is not None:
        wanted = P.normalize_image(image, default_image) if image else None
        held = P.image_from_bundle(bundle_dir, preset, wanted, default_image, arch)
        spec, architecture, pinned = spec.with_image(held.ref), held.architecture, held.pinned
    elif image:
        spec = spec.with_image(P.normalize_image(image, default_image))
    else:
        spec = spec.with_image(*P.default_image_for(preset, default_image, _local_tags(default_image, runtime)))
    doc = P.manifest(spec, preset, options, architecture)  # bad input is exit 2 before any warning
    for warning in (P.privileged_warning(spec), P.suffix_mismatch(preset, spec.image, default_image)):
        if warning:
            progress().warn(warning)
    if spec.image_is_placeholder:
        progress().warn(f"no {default_image} image for preset {preset.name} is loaded here; "
                        f"replace {P.PLACEHOLDER_TAG} in the manifest, pass --image, or --bundle DIR")
    if pinned is not None:  # warned about by tag (its hardware suffix), written by digest
        doc = P.manifest(spec.with_image(pinned), preset, options, architecture)
    if as_json:
        emit_json(doc)
    else:
        click.echo(P.to_yaml(doc), nl=False)


@click.command("run", cls=_CommandAfterDashes)
@click.argument("preset")
@click.argument("image", required=False)
@run_options
@click.option("--allow-missing-devices", is_flag=True,
              help="Leave out absent device nodes and host files (to try a preset on a machine without NPUs).")
@common
def run_cmd(preset, image, allow_missing_devices, **kw):
    """Start a container for PRESET through Docker (or podman) and follow it; exits with its exit code.

    Uses the cards of this host within the preset's range. IMAGE defaults to the newest
    image for PRESET loaded in the runtime. Words after -- are the container's command:

    \b
        imgtool run a3 v0.11.0rc1-a3 -v /data/models:/models -- vllm serve /models/Qwen3-32B
        imgtool run a3 --model Qwen/Qwen3-32B -- --tensor-parallel-size 4
    """
    from .. import presets as P
    from ..runtimes.choice import ROOMS, open_runtime, refuse_without_run, runner

    choice = runtime_choice(kw.pop("runtime"), None, None)
    devices_given = P.explicit_cards(kw["devices"])
    pset, p, spec, config = _run_spec(preset, kw)
    spec, left_out = P.fit_to_host(spec, pset, devices_given, allow_missing_devices)
    if left_out:
        progress().note(f"--allow-missing-devices: leaving out {len(left_out)} absent path(s): {', '.join(left_out)}")
    say_choice(choice)
    if choice.effective in ROOMS:
        refuse_without_run(ROOMS[choice.effective])  # before asking it anything
    with open_runtime(choice, timeout=None) as opened:  # a container's output may pause for hours: no read timeout
        runtime, program = runner(opened)
        spec = spec.for_program(program)
        if spec.model is not None and _engine_model_form(runtime)(spec.model).image is not None:
            spec = spec.with_model_image()
        spec = _image_to_run(spec, p, image, config.default_image, runtime.local_tags)
        _warn_spec(spec, p, config.default_image, runtime)
        code, container = runtime.run_container(spec, lambda interactive: P.render_argv(spec.for_terminal(interactive)))
    if spec.detach:
        click.echo(container)
    click.get_current_context().exit(code)
