"""Signed bundles: bundle.json.sig, an SSH signature over bundle.json's bytes, made and checked.

bundle.json pins the size and sha256 of every part and file, so signing it signs the bundle.
Signing runs after the bundle is complete (bundle.json written last); the signature is written
atomically beside it, so a bundle is complete-and-unsigned for a moment, never signed-and-half-
written. Every verb that reads a bundle's parts (`verify`, `load`, `copy`, `push`, `serve`, `self-update`) calls
`enforce` first, before any part is read, a runtime or a registry is asked, or anything is written.
"""

import hashlib
import os
import time
from pathlib import Path
from typing import Mapping, NamedTuple, Optional

from .. import sshsig, trust
from ..config import signers_variable
from ..errors import ImgtoolError, SignatureError, SshKeygenError, SshKeygenMissing, UsageError
from ..fsutil import fsync_dir, write_atomic
from .format import BUNDLE_JSON, SIGNATURE
from .reader import read_index


class Signed(NamedTuple):
    path: Path  # bundle.json.sig
    signer: str  # "ED25519 key SHA256:..."


PROBE_NAMESPACE = "imgtool-key-check"  # never a bundle's: the probe's signature cannot pass for one


def check_key(key: str) -> None:
    """Before a long fetch or export: the key file is there, ssh-keygen too, and the key signs here (a
    probe, signed as the bundle will be: a passphrase key without a terminal, or a .pub whose key
    ssh-agent lacks, fails now, not after the download); raises UsageError, SshKeygenMissing."""
    if not Path(key).is_file():
        raise UsageError(f"--sign-key {key}: no such file",
                         hint="a private key (e.g. ~/.ssh/id_ed25519), or its .pub when ssh-agent holds the key")
    try:
        sshsig.sign(b"imgtool checks that this key can sign before it downloads\n", Path(key), PROBE_NAMESPACE)
    except SshKeygenMissing:
        raise
    except SshKeygenError as e:
        raise UsageError(f"--sign-key {key}: ssh-keygen cannot sign with it{_no_terminal()}; nothing was "
                         "downloaded",
                         hint="load the key into ssh-agent (ssh-add KEY) and give its .pub: "
                              "--sign-key KEY.pub; or run on a terminal, where its passphrase is asked") from e


def signing_key_and_tool(key: str) -> None:
    """`sign`'s first check: the key file and ssh-keygen are there; raises UsageError, SshKeygenMissing."""
    sshsig.key_and_tool(Path(key))


def _no_terminal() -> str:
    """", which has no terminal to ask a passphrase on" when this process has no controlling terminal."""
    try:
        os.close(os.open("/dev/tty", os.O_RDWR))
    except OSError:
        return " without a terminal to ask its passphrase on"
    return ""


def sign_bundle(bundle_dir: Path, key: str, checked: Optional[str] = None) -> Signed:
    """Sign DIR/bundle.json with `key`, writing DIR/bundle.json.sig atomically (replacing an older one).
    `checked`: the sha256 of the bundle.json that was verified before, which must still be there.

    Raises UsageError (not a bundle, no key), VerifyError (unreadable bundle.json), SshKeygenError.
    """
    bundle_dir = Path(bundle_dir)
    _, raw = read_index(bundle_dir)
    if checked is not None and hashlib.sha256(raw).hexdigest() != checked:
        raise UsageError(f"{bundle_dir / BUNDLE_JSON} changed while the bundle was being checked; nothing was "
                         "written", hint="sign it again once nothing else writes the bundle")
    signature = sshsig.sign(raw, Path(key))
    if (bundle_dir / BUNDLE_JSON).read_bytes() != raw:
        raise UsageError(f"{bundle_dir / BUNDLE_JSON} changed while it was being signed; nothing was written",
                         hint="sign it again once nothing else writes the bundle")
    write_atomic(bundle_dir / SIGNATURE, signature, 0o644)
    fsync_dir(bundle_dir)
    return Signed(bundle_dir / SIGNATURE, sshsig.parse_signature(signature).key_name)


def sign_written(bundle_dir: Path, key: str, written: str) -> Signed:
    """sign_bundle for fetch and export, right after the writer finished: `written` is the sha256 of
    the bundle.json the writer wrote (it hashed every part and checked every blob as it wrote them, so
    the bundle is not read again: `imgtool sign`'s check would double the cost for nothing), and only
    that bundle.json is signed. A failure says the bundle is complete but unsigned, and how to sign
    it; raises what sign_bundle raises."""
    try:
        return sign_bundle(bundle_dir, key, checked=written)
    except ImgtoolError as e:
        raise e.restated(f"the bundle {bundle_dir} is complete but not signed: {e.message}",
                         f"{e.hint + '; then ' if e.hint else ''}sign it: imgtool sign {bundle_dir} --sign-key {key}") from e


def examine(bundle_dir: Path, raw: bytes, policy: Optional[trust.Policy]) -> trust.Finding:
    """What bundle.json.sig says about `raw` (bundle.json's bytes), asking ssh-keygen; raises
    SshKeygenError (it timed out or could not run), UsageError (the policy file is unreadable)."""
    path = Path(bundle_dir) / SIGNATURE
    try:
        data = sshsig.read_signature(path)
        if data is None:
            return trust.Finding(trust.State.UNSIGNED)
        envelope = sshsig.parse_signature(data)
    except sshsig.BadEnvelope as e:
        return trust.Finding(trust.State.MALFORMED, detail=str(e))
    signer = envelope.key_name
    if envelope.namespace != sshsig.NAMESPACE:
        return trust.Finding(trust.State.NAMESPACE, signer, namespace=envelope.namespace)
    try:
        if not sshsig.valid(raw, path, envelope):
            return trust.Finding(trust.State.BAD, signer)
        if policy is None:
            return trust.Finding(trust.State.VALID, signer)
        try:
            text = policy.path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise UsageError(f"cannot read {policy}: {e.strerror}") from e
        listed = trust.principals_for(text, envelope.public_key)
        for principal in listed or trust.all_principals(text):
            if sshsig.verifies(raw, path, policy.path, principal):
                return trust.Finding(trust.State.TRUSTED, signer, principal=principal)
    except SshKeygenMissing:
        return trust.Finding(trust.State.NO_SSH_KEYGEN, signer)
    if listed:
        why = trust.restrictions(text, envelope.public_key, sshsig.NAMESPACE, time.time())
        return trust.Finding(trust.State.NOT_ALLOWED, signer, detail="; ".join(why) or None)
    return trust.Finding(trust.State.UNKNOWN_SIGNER, signer)


def enforce(bundle_dir: Path, raw: bytes, signers: Optional[str] = None, *, doing: str = "verify",
            env: Optional[Mapping[str, str]] = None) -> trust.Verdict:
    """The site's policy applied to this bundle: the verdict to report, or SignatureError (exit 3)
    naming the reason and the signer. Raises UsageError (a policy named but missing), SshKeygenError."""
    home = os.path.expanduser("~") if env is None else env.get("HOME")
    if env is None:
        variable = signers_variable()
        env = {} if variable is None else {trust.SIGNERS_ENV: variable}
    policy = trust.find_policy(signers, env, home)
    verdict = trust.judge(policy, examine(bundle_dir, raw, policy))
    if verdict.refuse:
        head = {"load": f"refusing to load {bundle_dir}", "update": f"refusing to update imgtool from {bundle_dir}",
                "serve": f"refusing to serve {bundle_dir}", "copy": f"refusing to copy {bundle_dir}",
                "push": f"refusing to push {bundle_dir}"}.get(doing, f"bundle failed verification: {bundle_dir}")
        tail = {"load": "; nothing was loaded", "update": "; nothing was updated", "serve": "; nothing is served",
                "copy": "; nothing was written", "push": "; nothing was pushed"}.get(doing, "")
        raise SignatureError(f"{head}: {verdict.message}{tail}", hint=verdict.hint, reason=verdict.state.value,
                             signer=verdict.signer)
    return verdict
