"""imgtool sign: an SSH signature over a bundle's bundle.json."""

import click

from .options import bundle_usage, common, json_option, renamed
from .output import emit_json, progress


@click.command()
@click.argument("bundle_dir", metavar="DIR", type=click.Path(file_okay=False))
@renamed("--sign-key", old=("--key",), required=True, metavar="KEY",
         help="An SSH private key, or the .pub of a key that ssh-agent holds (ssh-add -l lists them).")
@click.option("--quick", is_flag=True,
              help="Check only sizes and checksums before signing (not every blob inside the parts).")
@renamed("--threads", old=("--jobs",), type=click.IntRange(1, 64), default=None, metavar="N",
         help="Hashing threads (default: the number of CPUs).")
@json_option("result")
@common
def sign(bundle_dir, sign_key, quick, threads, as_json):
    """Sign a bundle: DIR/bundle.json.sig, an SSH signature (ssh-keygen -Y sign) over bundle.json.

    bundle.json pins every part's size and sha256, so this signs the whole bundle. Offline
    sites that list your public key in an allowed_signers file then load only bundles you signed.
    Only a bundle that verifies is signed: first every check of `imgtool verify` but the signature
    (SHA256SUMS, load.sh, imgtool.pyz, every part, and unless --quick every blob and layer inside),
    exit 3 and nothing written otherwise. Signing again (another key) replaces the signature.
    """
    from ..bundle.signature import sign_bundle, signing_key_and_tool
    from ..bundle.verify import verify_bundle

    bundle_usage(bundle_dir, None)
    signing_key_and_tool(sign_key)  # no key file or no ssh-keygen is said before the parts are read
    p = progress()
    report = verify_bundle(bundle_dir, quick=quick, progress=p, jobs=threads, signature=False)
    for w in report.warnings:
        p.warn(w)
    report.raise_if_bad("sign")
    signed = sign_bundle(bundle_dir, sign_key, checked=report.bundle_json_sha256)
    if as_json:
        emit_json({"dir": bundle_dir, "signature": str(signed.path), "signer": signed.signer})
    else:
        click.echo(f"signed: {signed.path} by {signed.signer}")
