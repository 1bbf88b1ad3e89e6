"""One exception root for imgtool; the CLI turns these into `error:`/`hint:` lines and exit codes."""

import copy
from typing import Any, Dict, Optional, Tuple, Type, TypeVar

_E = TypeVar("_E", bound="ImgtoolError")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_VERIFY = 3
EXIT_NETWORK = 4
EXIT_DOCKER = 5
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C

# What each code means, as the user reads it: the top-level --help and the README's table are this text
# (tests/test_errors.py holds README.md, docs/presets.md and docs/reliability.md to it).
EXIT_MEANINGS = (
    (EXIT_OK, "ok"),
    (EXIT_ERROR, "error"),
    (EXIT_USAGE, "bad usage or input (reference, platform, size, config file, path)"),
    (EXIT_VERIFY, "verification failed (also: a signature refused under an allowed_signers policy)"),
    (EXIT_NETWORK, "registry or network"),
    (EXIT_DOCKER, "the container runtime: Docker daemon, containerd (`ctr`), Podman (unreachable, refused, or none found)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C; `serve` also on SIGTERM)"),
)


def one_line(what: object, limit: int = 300) -> str:
    """An exception's (or a daemon's, a server's) text as one line of a message: whitespace and
    newlines collapsed, cut to `limit` characters with `...`."""
    text = " ".join(str(what).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def counted(n: int, noun: str, plural: Optional[str] = None) -> str:
    """`n` and the noun agreeing with it, for a message: "1 entry", "3 entries", "0 blobs" (`plural`: where adding
    an s is not the plural)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def exit_codes_help() -> str:
    """The exit codes as the top-level --help shows them (click keeps a paragraph after \\b as written)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {code:<3} {meaning}" for code, meaning in EXIT_MEANINGS)


class ImgtoolError(Exception):
    """A failure the user should see as one line (plus an optional hint)."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, hint: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def restated(self: _E, message: Optional[str] = None, hint: Optional[str] = None) -> _E:
        """A copy of this error (its type, exit code and fields) saying `message` and `hint` instead (None:
        as it was), for a caller that adds what it knows: raise it `from` this one, which stays as caught."""
        new = copy.copy(self)
        new.message = self.message if message is None else message
        new.hint = self.hint if hint is None else hint
        new.args = (new.message,)
        return new

    def __reduce__(self) -> Tuple[Any, ...]:
        # copied (restated) field by field: the subclasses' __init__ signatures differ
        return _rebuilt, (type(self), dict(self.__dict__), self.args)


def _rebuilt(cls: Type[ImgtoolError], fields: Dict[str, Any], args: Tuple[Any, ...]) -> ImgtoolError:
    new = cls.__new__(cls, *args)
    new.__dict__.update(fields)
    new.args = args
    return new


class UsageError(ImgtoolError):
    """Bad input: a reference, platform, size, option combination or path."""

    exit_code = EXIT_USAGE


class CredentialHelperError(UsageError):
    """The credential helper `docker login` stored the secret with (credsStore/credHelpers) failed."""


class ConfigError(UsageError):
    """A malformed configuration file (mirrors.toml, presets, bundle spec)."""


class VerifyError(ImgtoolError):
    """A digest, size or structure check failed; `problems` lists every finding."""

    exit_code = EXIT_VERIFY

    def __init__(self, message: str, hint: Optional[str] = None, problems=()):
        super().__init__(message, hint)
        self.problems = list(problems)


class CorruptBlob(VerifyError):
    """A download's blob kept arriving with other bytes than its digest names; `digest` is that digest (a caller
    that knows the blob by another name, a model's file, says so)."""

    def __init__(self, message: str, hint: Optional[str] = None, *, digest: str):
        super().__init__(message, hint)
        self.digest = digest


class SignatureError(VerifyError):
    """A bundle's signature refused (policy or a bad signature): `reason` says which, `signer` who signed.

    reason is the value of a refusing trust.State: unsigned, malformed, namespace, bad, unknown-signer,
    not-allowed, no-ssh-keygen.
    """

    def __init__(self, message: str, hint: Optional[str] = None, *, reason: str, signer: Optional[str] = None):
        super().__init__(message, hint)
        self.reason = reason
        self.signer = signer


class BlobDamaged(VerifyError):
    """`imgtool serve`: a blob's bytes in the parts differ from its digest, or its part cannot be read; that
    request is refused (500), the server goes on."""


class RegistryError(ImgtoolError):
    """A registry or network failure (after retries and every source)."""

    exit_code = EXIT_NETWORK


class RegistryUnavailable(RegistryError):
    """The registry answered a status worth trying again later (408, 425, 429, 5xx); `retry_after` is the
    wait it asked for (`Retry-After`, seconds), or None; `status` the HTTP status when there was one."""

    def __init__(self, message: str, hint: Optional[str] = None, retry_after: Optional[float] = None,
                 status: Optional[int] = None):
        super().__init__(message, hint)
        self.retry_after = retry_after
        self.status = status


class Cancelled(ImgtoolError):
    """A wait (a retry's back-off) ended because the run was cancelled: Ctrl-C, or a failure elsewhere
    that already has its own error."""


class NotFoundError(RegistryError):
    """The registry answered that a manifest, tag or blob does not exist."""


class TagListingRefused(RegistryError):
    """The registry (or mirror) does not list a repository's tags to us (401/403/404/405)."""


class LoginWithheld(RegistryError):
    """A registry refused access after imgtool kept its login from where the registry sent it (a plain-HTTP
    token service, plain HTTP itself): the hint says why and what would allow it."""


class ManifestError(RegistryError):
    """A manifest, index or config document is malformed or of an unsupported kind.

    Such documents come from a registry (exit 4); where one comes from elsewhere (a local `docker
    save`) the caller re-raises it as its own error (ExportError).
    """


class StoreError(ImgtoolError):
    """The cache directory cannot be written (permissions, disk full)."""


class DaemonError(ImgtoolError):
    """The Docker daemon is unreachable or refused an operation."""

    exit_code = EXIT_DOCKER


class ProgramFailed(DaemonError):
    """A runtime's tool (ctr, podman) ran and exited non-zero; `output` is what it said last, `said` every line of
    its error output (for a room that reads one of Podman's several reasons: runtimes/podman.py)."""

    def __init__(self, message: str, output: str, code: int, hint: Optional[str] = None, said: Tuple[str, ...] = ()):
        super().__init__(message, hint=hint)
        self.output = output
        self.code = code
        self.said = said


class LayerRefused(VerifyError):
    """The runtime refused a layer whose content is not the diff_id its image's config names (Podman 5 checks it
    while it loads; 4.3 applies it, and imgtool's look at what it applied refuses it): `diff_id` the config's,
    `found` what the content hashes to. Nothing of that image was kept."""

    def __init__(self, message: str, hint: Optional[str] = None, *, diff_id: str, found: str):
        super().__init__(message, hint)
        self.diff_id = diff_id
        self.found = found


class ExportError(DaemonError):
    """`docker save` produced something imgtool cannot make a bundle of (exit 5: Docker's output)."""


class SshKeygenError(ImgtoolError):
    """ssh-keygen could not be run, timed out, or could not sign."""


class SshKeygenMissing(SshKeygenError):
    """No ssh-keygen on PATH (OpenSSH's client tools are not installed)."""


class Interrupted(ImgtoolError):
    """Ctrl-C (or SIGTERM): the message says what was kept and how to go on."""

    exit_code = EXIT_INTERRUPTED
