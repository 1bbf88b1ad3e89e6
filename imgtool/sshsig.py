"""The ssh-keygen room: SSH signatures (`ssh-keygen -Y sign/verify`) over a bundle's bundle.json.

No cryptography here: ssh-keygen signs and checks. This module only runs it (with timeouts,
deciding on its exit status, never on its words) and reads the signature's envelope (the
SSHSIG armour: which key signed, for which namespace), so that a refusal can name the signer
and the reason. Standard library only and Python 3.7-compatible: imgtool.pyz verifies on
Kylin's own python3.
"""

import base64
import binascii
import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import List, NamedTuple, Optional

from .errors import SshKeygenError, SshKeygenMissing, UsageError
from .fsutil import NotRegularFile, open_regular

NAMESPACE = "imgtool-bundle"  # ssh-keygen -n: a signature made for git or a file elsewhere is not one of ours
SIGN_TIMEOUT = 300.0  # a person may type a passphrase or touch a security key
CHECK_TIMEOUT = 60.0
MAX_SIGNATURE = 64 * 1024  # an SSH signature is a few hundred bytes (RSA 4096: about 1 KB)
_ARMOR_BEGIN = "-----BEGIN SSH SIGNATURE-----"
_ARMOR_END = "-----END SSH SIGNATURE-----"
_MAGIC = b"SSHSIG"
INSTALL_HINT = "install OpenSSH's client tools (Debian/Ubuntu: openssh-client; Kylin, openEuler: openssh), " \
               "which bring ssh-keygen"


class Envelope(NamedTuple):
    """What an SSH signature says about itself (not yet checked): the signer's key and the namespace."""

    key_type: str  # e.g. ssh-ed25519
    key_blob: bytes  # the public key as SSH wire bytes
    namespace: str

    @property
    def fingerprint(self) -> str:
        """SHA256:... as `ssh-keygen -l` prints it."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.key_blob).digest()).decode().rstrip("=")

    @property
    def public_key(self) -> str:
        """The key as an authorized_keys / allowed_signers line writes it: TYPE BASE64."""
        return f"{self.key_type} {base64.b64encode(self.key_blob).decode()}"

    @property
    def key_name(self) -> str:
        """ED25519 key SHA256:..., as ssh-keygen names a key."""
        kind = self.key_type.replace("ssh-", "").split("-")[0].split("@")[0].upper()
        return f"{kind} key {self.fingerprint}"


class BadEnvelope(ValueError):
    """The bytes are not an SSH signature (armour, magic, version or fields)."""


def parse_signature(text: bytes) -> Envelope:
    """The envelope of an armoured SSH signature; raises BadEnvelope."""
    try:
        lines = text.decode("ascii").strip().splitlines()
    except UnicodeDecodeError:
        raise BadEnvelope("not text") from None
    if len(lines) < 3 or lines[0].strip() != _ARMOR_BEGIN or lines[-1].strip() != _ARMOR_END:
        raise BadEnvelope("no SSH SIGNATURE armour")
    try:
        blob = base64.b64decode("".join(x.strip() for x in lines[1:-1]), validate=True)
    except (binascii.Error, ValueError):
        raise BadEnvelope("not base64") from None
    if not blob.startswith(_MAGIC):
        raise BadEnvelope("no SSHSIG magic")
    try:
        (version,) = struct.unpack_from(">I", blob, len(_MAGIC))
        if version != 1:
            raise BadEnvelope(f"SSHSIG version {version}, not 1")
        key, pos = _string(blob, len(_MAGIC) + 4)
        namespace, _ = _string(blob, pos)
        key_type, _ = _string(key, 0)
        return Envelope(key_type.decode("ascii"), key, namespace.decode("utf-8"))
    except (struct.error, UnicodeDecodeError):
        raise BadEnvelope("truncated or malformed fields") from None


def _string(data: bytes, pos: int):
    (n,) = struct.unpack_from(">I", data, pos)
    pos += 4
    if pos + n > len(data):
        raise struct.error("string runs past the end")
    return data[pos:pos + n], pos + n


def ssh_keygen() -> str:
    """The ssh-keygen on PATH; raises SshKeygenMissing."""
    found = shutil.which("ssh-keygen")
    if not found:
        raise SshKeygenMissing("ssh-keygen not found on PATH", hint=INSTALL_HINT)
    return found


def _run(args: List[str], *, stdin, timeout: float, interactive: bool = False) -> subprocess.CompletedProcess:
    """ssh-keygen ARGS; its output captured (stderr passed through when a person may be asked for a passphrase)."""
    try:
        return subprocess.run([ssh_keygen()] + args, stdin=stdin, stdout=subprocess.PIPE,
                              stderr=None if interactive else subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SshKeygenError(f"ssh-keygen {args[0]} {args[1]} did not finish within {timeout:.0f} s") from None
    except OSError as e:
        raise SshKeygenError(f"cannot run ssh-keygen: {e.strerror}", hint=INSTALL_HINT) from e


def key_and_tool(key: Path) -> None:
    """The cheap part of signing's preconditions: the key file is there and so is ssh-keygen;
    raises UsageError, SshKeygenMissing."""
    if not Path(key).is_file():
        raise UsageError(f"signing key {key} does not exist or is not a file",
                         hint="give a private key (e.g. ~/.ssh/id_ed25519), or its .pub when ssh-agent holds it")
    ssh_keygen()


def sign(data: bytes, key: Path, namespace: str = NAMESPACE) -> bytes:
    """An armoured SSH signature of `data` by `key`: a private key file, or the .pub of a key that
    ssh-agent holds (SSH_AUTH_SOCK). Raises UsageError (no key file), SshKeygenMissing, SshKeygenError."""
    key = Path(key)
    key_and_tool(key)
    with tempfile.TemporaryDirectory(prefix="imgtool-sign-") as tmp:
        # ssh-keygen writes FILE.sig beside FILE; a file, not stdin, because a passphrase prompt
        # without a terminal would read stdin
        message = Path(tmp, "message")
        message.write_bytes(data)
        r = _run(["-Y", "sign", "-q", "-f", str(key), "-n", namespace, str(message)], stdin=subprocess.DEVNULL,
                 timeout=SIGN_TIMEOUT, interactive=True)
        signature = Path(tmp, "message.sig")
        if r.returncode != 0 or not signature.is_file():
            raise SshKeygenError(f"ssh-keygen could not sign with {key} (exit {r.returncode})",
                                 hint="a .pub key needs the private key in ssh-agent (ssh-add -l lists it); "
                                      "a passphrase is asked on the terminal")
        return signature.read_bytes()


def verifies(data: bytes, signature: Path, allowed_signers: Path, identity: str,
             namespace: str = NAMESPACE) -> bool:
    """Whether ssh-keygen accepts `signature` over `data` as `identity`'s per `allowed_signers`
    (its key, namespaces= and validity options). Raises SshKeygenMissing, SshKeygenError."""
    with tempfile.TemporaryFile() as message:
        message.write(data)
        message.seek(0)
        r = _run(["-Y", "verify", "-f", str(allowed_signers), "-I", identity, "-n", namespace, "-s", str(signature)],
                 stdin=message, timeout=CHECK_TIMEOUT)
    return r.returncode == 0


def valid(data: bytes, signature: Path, envelope: Envelope, namespace: str = NAMESPACE) -> bool:
    """Whether `signature` is a good signature over `data` by the key it names, whoever that is.

    `ssh-keygen -Y verify` against a one-line allowed_signers holding that key: what
    `-Y check-novalidate` does, but OpenSSH 8.1 (openEuler 20.03) has only sign and verify.
    Raises SshKeygenMissing, SshKeygenError.
    """
    with tempfile.TemporaryDirectory(prefix="imgtool-check-") as tmp:
        allowed = Path(tmp, "allowed_signers")
        allowed.write_text(f"signer {envelope.public_key}\n")
        return verifies(data, signature, allowed, "signer", namespace)


def read_signature(path: Path) -> Optional[bytes]:
    """The signature file's bytes, or None when there is none; raises BadEnvelope when it is too big
    or unreadable."""
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_SIGNATURE:
                raise BadEnvelope(f"{size} bytes, too big for an SSH signature")
            return f.read(MAX_SIGNATURE + 1)
    except FileNotFoundError:
        return None
    except NotRegularFile as e:
        raise BadEnvelope(f"it is {e.kind}, not a regular file") from None
    except OSError as e:
        raise BadEnvelope(f"cannot be read ({e.strerror})") from None
