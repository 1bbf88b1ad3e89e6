"""Whom an offline site trusts to sign bundles, and what to do with what a signature says. Pure.

The site policy is an OpenSSH allowed_signers file: `--signers FILE`, else `$IMGTOOL_SIGNERS`,
else `~/.config/imgtool/allowed_signers`, else `/etc/imgtool/allowed_signers`. With a policy,
only a bundle whose bundle.json.sig ssh-keygen accepts for a key listed there passes; without
one, a signature present must still be good (it is checked and reported, its signer not judged).
"""

import os
import re
import shlex
import time
from enum import Enum
from pathlib import Path
from typing import Callable, List, Mapping, NamedTuple, Optional

from .errors import UsageError

SIGNERS_ENV = "IMGTOOL_SIGNERS"
SYSTEM_SIGNERS = Path("/etc/imgtool/allowed_signers")
USER_SIGNERS = Path(".config/imgtool/allowed_signers")  # under $HOME
SIGNATURE = "bundle.json.sig"  # the file a bundle's SSH signature over bundle.json is in (imgtool sign)


class State(Enum):
    """What a look at bundle.json.sig found (Finding.state, Verdict.state). The value is what `--json`
    prints and, for a refusal, SignatureError.reason."""

    UNSIGNED = "unsigned"
    MALFORMED = "malformed"
    NAMESPACE = "namespace"  # a good signature made for another purpose (not imgtool-bundle)
    BAD = "bad"
    NO_SSH_KEYGEN = "no-ssh-keygen"  # signed, and nothing here can check it
    VALID = "valid"  # good, no policy to judge the signer
    TRUSTED = "trusted"  # good, and the policy allows the signer
    UNKNOWN_SIGNER = "unknown-signer"
    NOT_ALLOWED = "not-allowed"  # listed, but not for imgtool bundles (namespaces=, expiry)


class Policy(NamedTuple):
    path: Path
    origin: str  # how it was chosen: --signers, $IMGTOOL_SIGNERS, the user's or the system's file

    def __str__(self) -> str:
        return f"{self.path} ({self.origin})" if self.origin not in ("--signers",) else str(self.path)


class Finding(NamedTuple):
    """What checking bundle.json.sig found: `state` (above) and what is known of the signer."""

    state: State
    signer: Optional[str] = None  # "ED25519 key SHA256:...": from the signature itself, checked or not
    principal: Optional[str] = None  # the allowed_signers name ssh-keygen accepted (State.TRUSTED)
    namespace: Optional[str] = None  # the signature's namespace (State.NAMESPACE)
    detail: Optional[str] = None  # why a signature is State.MALFORMED


class Verdict(NamedTuple):
    """Refuse (reason, message, hint) or go on (message: what to report; warning, if any)."""

    refuse: bool
    state: State
    message: str
    hint: Optional[str] = None
    warning: Optional[str] = None
    signer: Optional[str] = None
    principal: Optional[str] = None
    policy: Optional[Policy] = None

    def to_json(self) -> dict:
        return {"state": self.state.value, "signer": self.signer, "principal": self.principal,
                "policy": str(self.policy.path) if self.policy else None, "message": self.message}


def find_policy(option: Optional[str], env: Mapping[str, str], home: Optional[str],
                is_file: Callable[[Path], bool] = os.path.isfile, system: Path = SYSTEM_SIGNERS,
                exists: Callable[[Path], bool] = os.path.lexists) -> Optional[Policy]:
    """The allowed_signers file in force, or None; raises UsageError when --signers or $IMGTOOL_SIGNERS
    names a file that is not there, or a policy path holds something that is not a regular file (a FIFO,
    a directory, a dangling link): a site that set a policy never falls back to none."""

    def present(path: Path, origin: str) -> bool:
        if is_file(path):
            return True
        if exists(path):
            raise UsageError(f"{origin} {path} is not a regular file",
                             hint="an OpenSSH allowed_signers file: one line per key, NAME KEYTYPE BASE64")
        return False

    for value, origin in ((option, "--signers"), (env.get(SIGNERS_ENV), "$" + SIGNERS_ENV)):
        if value:
            if not present(Path(value), origin):
                raise UsageError(f"{origin} {value}: no such file",
                                 hint="an OpenSSH allowed_signers file: one line per key, NAME KEYTYPE BASE64")
            return Policy(Path(value), origin)
    if home:
        user = Path(home) / USER_SIGNERS
        if present(user, "the user's policy"):
            return Policy(user, "the user's policy")
    if present(system, "the site policy"):
        return Policy(system, "the site policy")
    return None


def _lines(text: str) -> List[List[str]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            out.append(shlex.split(line))
        except ValueError:  # unbalanced quotes: ssh-keygen will not accept that line either
            continue
    return out


def _principals(field: str) -> List[str]:
    return [p for p in field.split(",") if p and not p.startswith("!")]


def principals_for(text: str, public_key: str) -> List[str]:
    """The names an allowed_signers text gives the key `public_key` ("TYPE BASE64"), in file order."""
    key_type, _, blob = public_key.partition(" ")
    out: List[str] = []
    for tokens in _lines(text):
        if any(tokens[i] == key_type and tokens[i + 1] == blob for i in range(1, len(tokens) - 1)):
            out += [p for p in _principals(tokens[0]) if p not in out]
    return out


_OPTION = re.compile(r'(namespaces|valid-before|valid-after)=(?:"([^"]*)"|([^,\s]*))', re.IGNORECASE)


def _ssh_time(value: str) -> Optional[float]:
    """An allowed_signers time (YYYYMMDD[HHMM[SS]], local unless it ends in Z) as epoch seconds."""
    utc = value.upper().endswith("Z")
    digits = value.rstrip("Zz")
    formats = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}
    if len(digits) not in formats or not digits.isdigit():
        return None
    try:
        parsed = time.strptime(digits, formats[len(digits)])
    except ValueError:
        return None
    import calendar

    return float(calendar.timegm(parsed)) if utc else time.mktime(parsed)


def restrictions(text: str, public_key: str, namespace: str, now: float) -> List[str]:
    """Why the lines that list `public_key` do not allow it to sign in `namespace` at `now`: each
    option that refuses it, as written (`namespaces="git"`, `valid-before="20200101"`)."""
    key_type, _, blob = public_key.partition(" ")
    out: List[str] = []
    for raw in text.splitlines():
        tokens = raw.split()
        if key_type not in tokens or blob not in tokens or raw.lstrip().startswith("#"):
            continue
        head = raw[:raw.index(key_type)]
        for m in _OPTION.finditer(head):
            name, value = m.group(1).lower(), m.group(2) if m.group(2) is not None else m.group(3)
            written = f'{name}="{value}"'
            if name == "namespaces" and namespace not in [v.strip() for v in value.split(",")]:
                out.append(f"{written} does not include {namespace}")
            elif name == "valid-before":
                t = _ssh_time(value)
                if t is not None and now >= t:
                    out.append(f"{written} has passed")
            elif name == "valid-after":
                t = _ssh_time(value)
                if t is not None and now < t:
                    out.append(f"{written} is still ahead")
    return list(dict.fromkeys(out))


def is_pattern(principal: str) -> bool:
    """An allowed_signers principal that is a pattern (`*@site`), not a name."""
    return any(c in principal for c in "*?")


def all_principals(text: str) -> List[str]:
    """Every name an allowed_signers text lists (for keys signed by a listed cert-authority)."""
    out: List[str] = []
    for tokens in _lines(text):
        out += [p for p in _principals(tokens[0]) if p not in out]
    return out


def judge(policy: Optional[Policy], found: Finding) -> Verdict:
    """Refuse or go on, and the words for either."""
    state, signer = found.state, found.signer

    def refuse(message: str, hint: Optional[str]) -> Verdict:
        return Verdict(True, state, message, hint, signer=signer, policy=policy)

    if state is State.MALFORMED:
        return refuse(f"{SIGNATURE} is not an SSH signature ({found.detail})",
                      "copy bundle.json.sig again from the source medium, or sign the bundle again")
    if state is State.NAMESPACE:
        return refuse(f"{SIGNATURE} was made for namespace {found.namespace!r}, not 'imgtool-bundle' "
                      f"(signed by {signer}): it is not a bundle signature",
                      "sign bundles with imgtool sign DIR --sign-key KEY (or fetch --sign-key KEY)")
    if state is State.BAD:
        return refuse(f"bad signature: {SIGNATURE} (by {signer}) does not match bundle.json: bundle.json was "
                      "changed after it was signed, or the signature is another bundle's",
                      "copy bundle.json and bundle.json.sig again from the source medium")
    if policy is None:
        if state is State.UNSIGNED:
            return Verdict(False, state, "not signed", policy=policy)
        if state is State.NO_SSH_KEYGEN:
            return Verdict(False, state, "signed, not checked", signer=signer, policy=policy,
                           warning=f"{SIGNATURE} was not checked: ssh-keygen not found "
                                   "(install openssh-client; no allowed_signers policy here, so this is not a refusal)")
        return Verdict(False, state, f"signed by {signer} (good signature; no allowed_signers policy here, "
                                     "so who signed was not checked)", signer=signer, policy=policy)
    if state is State.TRUSTED:
        if found.principal and is_pattern(found.principal):  # a pattern is no one's name: name the key
            return Verdict(False, state, f"signed by {signer}, allowed by {policy.path} (as {found.principal})",
                           signer=signer, principal=found.principal, policy=policy)
        return Verdict(False, state, f"signed by {found.principal} ({signer}), allowed by {policy.path}",
                       signer=signer, principal=found.principal, policy=policy)
    if state is State.UNSIGNED:
        return refuse(f"not signed (no {SIGNATURE}), and {policy} requires a signature by a key it lists",
                      "sign it where it was made: imgtool sign DIR --sign-key KEY (or fetch --sign-key KEY)")
    if state is State.NO_SSH_KEYGEN:
        return refuse(f"cannot check {SIGNATURE}: ssh-keygen not found, and {policy} requires a signature",
                      "install OpenSSH's client tools (openssh-client / openssh), which bring ssh-keygen")
    if state is State.NOT_ALLOWED:
        why = found.detail or "its namespaces= or valid-after/valid-before options"
        return refuse(f"signed by {signer}, listed in {policy} but not allowed to sign imgtool bundles: {why}",
                      f"check that key's line in {policy.path}")
    return refuse(f"signed by a key not in {policy}: {signer}",
                  f"if that key is your release engineer's, add its public key to {policy.path} "
                  "(a line NAME KEYTYPE BASE64); a stranger's signature is a reason not to load it")
