"""imgtool push: a bundle's images into a registry."""

import click

from .options import bundle_usage, common, expect_option, json_option, signers_option
from .output import emit_json, progress


@click.command()
@click.argument("bundle_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--to", "to", required=True, metavar="HOST[:PORT][/NAMESPACE]",
              help="The registry inside the offline network (distribution, Harbor) and a namespace.")
@click.option("--insecure", is_flag=True, help="Unverified HTTPS, or plain HTTP (like dockerd's insecure-registries).")
@click.option("--ca-cert", type=click.Path(dir_okay=False), metavar="FILE", help="CA certificate of the registry.")
@expect_option()
@signers_option
@json_option("result")
@common
def push(bundle_dir, to, insecure, ca_cert, expect, signers, as_json):
    """Push a bundle's images (and models) into a registry, so many nodes `docker pull` instead of each loading it.

    Credentials come from ~/.docker/config.json (docker login). The target repository is
    NAMESPACE/ + the image's path without its registry host:
    quay.io/ascend/vllm-ascend:v1 --to reg:5000/ai  ->  reg:5000/ai/ascend/vllm-ascend:v1
    A model goes as its ModelPack artifact, tagged with its commit and revision:
    hf:Qwen/Qwen3-8B@main --to reg:5000/ai  ->  reg:5000/ai/hf/qwen/qwen3-8b:COMMIT and :main

    The bundle is checked as load checks it before the registry is asked anything (the signature
    policy, --expect, SHA256SUMS, every part at its size; exit 3 and nothing pushed), and every
    blob against its digest as it is read.
    """
    from ..config import network_waits
    from ..push import push_bundle

    bundle_usage(bundle_dir, expect)
    net = network_waits()  # $IMGTOOL_READ_TIMEOUT, $IMGTOOL_RESPONSE_TIMEOUT, $IMGTOOL_MIN_RATE, as the other verbs
    waits = {"read_timeout": net.read_timeout, "response_timeout": net.response_timeout, "min_rate": net.min_rate,
             "helper_timeout": net.helper_timeout}
    result = push_bundle(bundle_dir, to, insecure=insecure, ca_cert=ca_cert, progress=progress(), waits=waits,
                         expect=expect, signers=signers)
    for w in result.warnings:  # digests that differ from upstream's: said on stderr, as load's warnings are
        progress().warn(w)
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(result.describe())
