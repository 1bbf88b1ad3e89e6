"""Signed bundles: `imgtool sign`, `fetch/export --sign-key`, and the offline site's allowed_signers policy.

Every signature here is made and checked by the real ssh-keygen (Debian's openssh-client) with
keys generated in the test. Each refusal the issue lists is tested on imgtool, on imgtool.pyz under
Kylin's Python 3.7 (`env -i`) and on load.sh; a refused bundle leaves Docker without a new image.
"""

import hashlib
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from imgtool import sshsig, trust
from imgtool.errors import SignatureError, UsageError
from imgtool.trust import Finding, Policy, find_policy, judge, principals_for
from tests.support.bundles import BlobDir, damaged_part_line, fetch_from_registry, imgtool, write
from tests.support.images import host_arch

REPO = "quay.io/ascend/vllm-ascend"


class Keys:
    """Two ed25519 keys (the release engineer's and a stranger's) and allowed_signers files for them."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.release = self._make("release", "release@example.com")
        self.stranger = self._make("stranger", "someone@elsewhere")

    def _make(self, name, comment):
        key = self.root / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
                       check=True, timeout=60)
        return key

    def fingerprint(self, key: Path) -> str:
        """"ED25519 key SHA256:..." from ssh-keygen -l itself."""
        out = subprocess.run(["ssh-keygen", "-l", "-f", f"{key}.pub"], capture_output=True, text=True,
                             check=True, timeout=60).stdout.split()
        return f"{out[-1].strip('()')} key {out[1]}"

    def signers(self, *lines: str, name: str = "allowed_signers") -> Path:
        path = self.root / name
        path.write_text("".join(line + "\n" for line in lines))
        return path

    def line(self, principal: str, key: Path, options: str = "") -> str:
        return " ".join(x for x in (principal, options, (key.parent / f"{key.name}.pub").read_text().strip()) if x)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return Keys(tmp_path_factory.mktemp("keys"))


def env_for(tmp_path, **extra):
    """No site policy but what the test sets: HOME is the test's, $IMGTOOL_SIGNERS empty."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "IMGTOOL_SIGNERS": "", **extra}


@pytest.fixture
def bundle(factory, tmp_path):
    """A fresh 3-part bundle of a host-arch image, unsigned, plus the image."""
    store = BlobDir(tmp_path / "blobs")
    image = factory.image(host_arch(), layers=2)
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:signed")], store, chunk_size=512 * 1024)
    return out, image


def sign(out, key, tmp_path):
    r = imgtool("sign", str(out), "--sign-key", str(key), env=env_for(tmp_path))
    assert r.returncode == 0, r.stderr
    return r


def err_lines(r):
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:", "warning:", "  - "))]


def remake_sums(out: Path) -> None:
    """What someone covering their tracks does: SHA256SUMS made to match the edited bundle.json."""
    lines = []
    for line in (out / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        if name == "bundle.json":
            digest = hashlib.sha256((out / name).read_bytes()).hexdigest()
        lines.append(f"{digest}  {name}")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def edit_bundle_json(out: Path) -> None:
    doc = json.loads((out / "bundle.json").read_text())
    doc["images"][0]["source"] = "a mirror the attacker prefers"
    (out / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    remake_sums(out)


def resign_other_namespace(out: Path, key: Path) -> None:
    data = (out / "bundle.json").read_bytes()
    r = subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", "git"], input=data, capture_output=True,
                       timeout=60, check=True)
    (out / "bundle.json.sig").write_bytes(r.stdout)


# --- the pure parts: the envelope, the policy file, the verdicts ----------------------------------

def test_the_envelope_names_the_key_as_ssh_keygen_does(keys, tmp_path):
    data = b"bundle.json bytes\n"
    sig = sshsig.sign(data, keys.release)
    env = sshsig.parse_signature(sig)
    assert env.namespace == "imgtool-bundle"
    assert env.key_name == keys.fingerprint(keys.release)
    assert env.public_key == " ".join((keys.root / "release.pub").read_text().split()[:2])
    for junk in (b"", b"not a signature", sig.replace(b"SSH SIGNATURE", b"PGP SIGNATURE"), sig[:60] + b"\n" + sig[-30:]):
        with pytest.raises(sshsig.BadEnvelope):
            sshsig.parse_signature(junk)


def test_the_policy_file_in_force(tmp_path):
    home = tmp_path / "home"
    system = tmp_path / "etc" / "allowed_signers"
    user = home / ".config" / "imgtool" / "allowed_signers"
    explicit = tmp_path / "mine"
    for p in (system, user, explicit):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x ssh-ed25519 AAAA\n")
    env = {"IMGTOOL_SIGNERS": str(explicit)}
    assert find_policy(None, {}, str(home), system=system) == Policy(user, "the user's policy")
    assert find_policy(None, {}, str(tmp_path / "nobody"), system=system) == Policy(system, "the site policy")
    assert find_policy(None, env, str(home), system=system) == Policy(explicit, "$IMGTOOL_SIGNERS")
    assert find_policy(str(system), env, str(home), system=system) == Policy(system, "--signers")
    assert find_policy(None, {"IMGTOOL_SIGNERS": ""}, None, system=tmp_path / "none") is None
    # a policy someone set and that is gone is never "no policy"
    with pytest.raises(UsageError, match=r"^\$IMGTOOL_SIGNERS .*/gone: no such file$"):
        find_policy(None, {"IMGTOOL_SIGNERS": str(tmp_path / "gone")}, str(home), system=system)
    with pytest.raises(UsageError, match=r"^--signers .*/gone: no such file$"):
        find_policy(str(tmp_path / "gone"), {}, str(home), system=system)


def test_principals_of_a_key_in_an_allowed_signers_file():
    text = ('# release engineers\n\n'
            'alice@site,bob@site ssh-ed25519 AAAAkey1 alice laptop\n'
            '  carol@site namespaces="imgtool-bundle,git" valid-after="20250101" ssh-ed25519 AAAAkey2\n'
            '"dave@site" ssh-ed25519 AAAAkey1\n'
            'broken "quote ssh-ed25519 AAAAkey1\n'
            '!eve@site ssh-ed25519 AAAAkey1\n')
    assert principals_for(text, "ssh-ed25519 AAAAkey1") == ["alice@site", "bob@site", "dave@site"]
    assert principals_for(text, "ssh-ed25519 AAAAkey2") == ["carol@site"]
    assert principals_for(text, "ssh-rsa AAAAkey1") == []
    assert trust.all_principals(text) == ["alice@site", "bob@site", "carol@site", "dave@site"]


def test_what_is_refused_with_and_without_a_policy():
    policy = Policy(Path("/etc/imgtool/allowed_signers"), "the site policy")
    key = "ED25519 key SHA256:abc"
    refused_anyway = [Finding(trust.State.MALFORMED, detail="not base64"), Finding(trust.State.NAMESPACE, key, namespace="git"),
                      Finding(trust.State.BAD, key)]
    for found in refused_anyway:
        assert judge(None, found).refuse and judge(policy, found).refuse, found
    for state in (trust.State.UNSIGNED, trust.State.NO_SSH_KEYGEN, trust.State.UNKNOWN_SIGNER, trust.State.NOT_ALLOWED):
        assert judge(policy, Finding(state, key)).refuse, state
    assert judge(None, Finding(trust.State.UNSIGNED)) == trust.Verdict(False, trust.State.UNSIGNED, "not signed")
    no_tool = judge(None, Finding(trust.State.NO_SSH_KEYGEN, key))
    assert not no_tool.refuse and no_tool.warning.startswith("bundle.json.sig was not checked: ssh-keygen not found")
    assert judge(None, Finding(trust.State.VALID, key)).message == \
        "signed by ED25519 key SHA256:abc (good signature; no allowed_signers policy here, so who signed was not checked)"
    ok = judge(policy, Finding(trust.State.TRUSTED, key, principal="alice@site"))
    assert not ok.refuse and ok.message == \
        "signed by alice@site (ED25519 key SHA256:abc), allowed by /etc/imgtool/allowed_signers"
    assert judge(policy, Finding(trust.State.UNKNOWN_SIGNER, key)).message == \
        "signed by a key not in /etc/imgtool/allowed_signers (the site policy): ED25519 key SHA256:abc"


# --- imgtool: sign, verify, load ---------------------------------------------------------------

def test_signed_bundle_verifies_and_is_reported_with_and_without_a_policy(bundle, keys, tmp_path):
    out, _ = bundle
    who = keys.fingerprint(keys.release)
    assert sign(out, keys.release, tmp_path).stdout == f"signed: {out}/bundle.json.sig by {who}\n"
    assert (out / "bundle.json.sig").stat().st_mode & 0o777 == 0o644
    # the signature is in neither file list: SHA256SUMS and bundle.json are what they were
    assert "bundle.json.sig" not in (out / "SHA256SUMS").read_text() + (out / "bundle.json").read_text()

    plain = imgtool("verify", str(out), env=env_for(tmp_path))
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[-1] == \
        f"signature: signed by {who} (good signature; no allowed_signers policy here, so who signed was not checked)"
    assert "unexpected file" not in plain.stderr

    signers = keys.signers(keys.line("release@example.com", keys.release), keys.line("old@example.com", keys.stranger))
    strict = imgtool("verify", str(out), "--signers", str(signers), "--json", env=env_for(tmp_path))
    assert strict.returncode == 0, strict.stderr
    assert json.loads(strict.stdout)["signature"] == {
        "state": "trusted", "signer": who, "principal": "release@example.com", "policy": str(signers),
        "message": f"signed by release@example.com ({who}), allowed by {signers}"}

    # the user's own policy file is found without an option
    user = tmp_path / "home" / ".config" / "imgtool" / "allowed_signers"
    user.parent.mkdir(parents=True)
    user.write_text(keys.line("release@example.com", keys.release) + "\n")
    found = imgtool("verify", str(out), "--quick", env=env_for(tmp_path))
    assert found.stdout.splitlines()[-1] == f"signature: signed by release@example.com ({who}), allowed by {user}"

    (out / "bundle.json.sig").unlink()
    unsigned = imgtool("verify", str(out), "--quick", env=env_for(tmp_path, HOME=str(tmp_path / "nobody")))
    assert unsigned.returncode == 0 and "signature" not in unsigned.stdout  # no policy, no signature: as before


REFUSALS = {
    # name: (how the bundle is spoilt, the reason line after "DIR: ")
    "unsigned": (lambda out, keys: (out / "bundle.json.sig").unlink(),
                 "not signed (no bundle.json.sig), and {signers} requires a signature by a key it lists"),
    "edited": (lambda out, keys: edit_bundle_json(out),
               "bad signature: bundle.json.sig (by {release}) does not match bundle.json: bundle.json was changed "
               "after it was signed, or the signature is another bundle's"),
    "stranger": (lambda out, keys: sign_with(out, keys.stranger),
                 "signed by a key not in {signers}: {stranger}"),
    "namespace": (lambda out, keys: resign_other_namespace(out, keys.release),
                  "bundle.json.sig was made for namespace 'git', not 'imgtool-bundle' (signed by {release}): "
                  "it is not a bundle signature"),
}


def sign_with(out, key):
    (out / "bundle.json.sig").write_bytes(sshsig.sign((out / "bundle.json").read_bytes(), key))


def words(template, keys, signers):
    return template.format(signers=signers, release=keys.fingerprint(keys.release),
                           stranger=keys.fingerprint(keys.stranger))


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_refusal_on_verify_and_load_names_reason_and_signer(case, bundle, keys, tmp_path, services, docker_cli):
    out, image = bundle
    sign(out, keys.release, tmp_path)
    signers = keys.signers(keys.line("release@example.com", keys.release), name=f"signers-{case}")
    spoil, reason = REFUSALS[case]
    spoil(out, keys)
    reason = words(reason, keys, f"{signers} ($IMGTOOL_SIGNERS)")
    env = env_for(tmp_path, IMGTOOL_SIGNERS=str(signers))

    r = imgtool("verify", str(out), env=env)
    assert r.returncode == 3, r.stderr
    assert err_lines(r)[0] == f"error: bundle failed verification: {out}: {reason}"
    assert err_lines(r)[1].startswith("hint: ")

    before = docker_cli.image_ids()
    r = imgtool("load", str(out), env=env, docker_host=services.docker_host)
    assert r.returncode == 3, r.stderr
    assert err_lines(r)[0] == f"error: refusing to load {out}: {reason}; nothing was loaded"
    assert docker_cli.image_ids() == before and docker_cli.find(image) is None


def test_a_bad_signature_is_refused_even_without_a_policy(bundle, keys, tmp_path):
    out, _ = bundle
    sign(out, keys.release, tmp_path)
    edit_bundle_json(out)
    r = imgtool("verify", str(out), env=env_for(tmp_path))
    assert r.returncode == 3
    assert err_lines(r)[0].startswith(f"error: bundle failed verification: {out}: bad signature: ")
    (out / "bundle.json.sig").write_text("-----BEGIN SSH SIGNATURE-----\nnot base64!\n-----END SSH SIGNATURE-----\n")
    r = imgtool("verify", str(out), env=env_for(tmp_path))
    assert r.returncode == 3
    assert err_lines(r)[:2] == [
        f"error: bundle failed verification: {out}: bundle.json.sig is not an SSH signature (not base64)",
        "hint: copy bundle.json.sig again from the source medium, or sign the bundle again"]


@pytest.mark.parametrize("options, why", [
    ('namespaces="git"', 'namespaces="git" does not include imgtool-bundle'),
    ('valid-before="20200101"', 'valid-before="20200101" has passed'),
    ('valid-after="20990101Z"', 'valid-after="20990101Z" is still ahead'),
])
def test_a_key_listed_but_restricted_is_refused_naming_the_option(options, why, bundle, keys, tmp_path):
    out, _ = bundle
    sign(out, keys.release, tmp_path)
    signers = keys.signers(keys.line("release@example.com", keys.release, options), name="restricted")
    r = imgtool("verify", str(out), "--signers", str(signers), env=env_for(tmp_path))
    assert r.returncode == 3
    assert err_lines(r)[0] == (f"error: bundle failed verification: {out}: signed by {keys.fingerprint(keys.release)}, "
                               f"listed in {signers} but not allowed to sign imgtool bundles: {why}")


def test_a_pattern_principal_is_not_shown_as_the_signers_name(bundle, keys, tmp_path):
    out, _ = bundle
    sign(out, keys.release, tmp_path)
    signers = keys.signers(keys.line("*@example.com", keys.release), name="pattern")
    r = imgtool("verify", str(out), "--signers", str(signers), env=env_for(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == (f"signature: signed by {keys.fingerprint(keys.release)}, allowed by {signers} "
                                         "(as *@example.com)")


def test_without_ssh_keygen_a_policy_refuses_and_no_policy_warns(bundle, keys, tmp_path):
    out, _ = bundle
    sign(out, keys.release, tmp_path)
    signers = keys.signers(keys.line("release@example.com", keys.release), name="no-tool")
    r = imgtool("verify", str(out), "--signers", str(signers), env=env_for(tmp_path, PATH="/nonexistent"))
    assert r.returncode == 3
    assert err_lines(r)[:2] == [
        f"error: bundle failed verification: {out}: cannot check bundle.json.sig: ssh-keygen not found, "
        f"and {signers} requires a signature",
        "hint: install OpenSSH's client tools (openssh-client / openssh), which bring ssh-keygen"]
    r = imgtool("verify", str(out), "--quick", env=env_for(tmp_path, PATH="/nonexistent"))
    assert r.returncode == 0, r.stderr
    assert "warning: bundle.json.sig was not checked: ssh-keygen not found" in r.stderr


def test_a_missing_signers_file_is_bad_usage(bundle, tmp_path):
    out, _ = bundle
    r = imgtool("verify", str(out), env=env_for(tmp_path, IMGTOOL_SIGNERS=str(tmp_path / "gone")))
    assert r.returncode == 2
    assert err_lines(r)[0] == f"error: $IMGTOOL_SIGNERS {tmp_path / 'gone'}: no such file"


def test_signed_bundle_loads_under_the_policy(bundle, keys, tmp_path, services, docker_cli, docker_cleanup):
    out, image = bundle
    sign(out, keys.release, tmp_path)
    signers = keys.signers(keys.line("release@example.com", keys.release), name="load-ok")
    docker_cleanup.image(f"{REPO}:signed", image.config_digest)
    r = imgtool("load", str(out), "--signers", str(signers), env=env_for(tmp_path), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == (f"signature: signed by release@example.com "
                                         f"({keys.fingerprint(keys.release)}), allowed by {signers}")
    assert docker_cli.holds(f"{REPO}:signed", image)


def test_sign_errors(bundle, keys, tmp_path):
    out, _ = bundle
    r = imgtool("sign", str(out), "--sign-key", str(tmp_path / "nokey"), env=env_for(tmp_path))
    assert r.returncode == 2
    assert err_lines(r)[0] == f"error: signing key {tmp_path / 'nokey'} does not exist or is not a file"
    r = imgtool("sign", str(tmp_path), "--sign-key", str(keys.release), env=env_for(tmp_path))
    assert r.returncode != 0 and not (tmp_path / "bundle.json.sig").exists()
    r = imgtool("sign", str(out), "--sign-key", str(keys.release), env=env_for(tmp_path, PATH="/nonexistent"))
    assert r.returncode == 1
    assert err_lines(r)[0] == "error: ssh-keygen not found on PATH"
    assert not (out / "bundle.json.sig").exists()


def flip_a_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_sign_signs_only_a_bundle_that_verifies(bundle, keys, tmp_path):
    """A damaged bundle never gets a valid signature: sign runs verify's checks first (issue 24 item 3)."""
    out, _ = bundle
    sign(out, keys.release, tmp_path)
    old_sig = (out / "bundle.json.sig").read_bytes()
    doc = json.loads((out / "bundle.json").read_text())
    part = out / doc["parts"][0]["name"]
    flip_a_byte(part, doc["parts"][0]["size"] // 2)
    for quick in ((), ("--quick",)):
        r = imgtool("sign", str(out), "--sign-key", str(keys.stranger), *quick, env=env_for(tmp_path))
        assert r.returncode == 3, r.stderr
        assert err_lines(r) == [
            f"error: refusing to sign: {out}: 1 problem; nothing was signed",
            damaged_part_line(out, 0)]
        assert (out / "bundle.json.sig").read_bytes() == old_sig

    # what the issue did: the part's sha256 changed in bundle.json too (and SHA256SUMS remade)
    doc["parts"][0]["sha256"] = hashlib.sha256(part.read_bytes()).hexdigest()
    (out / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = []
    for line in (out / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        if name in ("bundle.json", part.name):
            digest = hashlib.sha256((out / name).read_bytes()).hexdigest()
        lines.append(f"{digest}  {name}")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    r = imgtool("sign", str(out), "--sign-key", str(keys.stranger), env=env_for(tmp_path))
    assert r.returncode == 3, r.stderr
    assert err_lines(r)[0].startswith(f"error: refusing to sign: {out}: ")
    assert any("is damaged: its sha256 differs from its digest" in line for line in err_lines(r)[1:]), r.stderr
    assert (out / "bundle.json.sig").read_bytes() == old_sig
    # --quick checks sizes and checksums only, as it says: the blob inside is not read
    r = imgtool("sign", str(out), "--sign-key", str(keys.stranger), "--quick", env=env_for(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (out / "bundle.json.sig").read_bytes() != old_sig


def test_kylins_python_signs_too(bundle, keys, tmp_path):
    """A release host may be a Kylin box as well: `python3.7 imgtool.pyz sign` writes the signature
    that imgtool on 3.11 verifies under the policy."""
    from imgtool import selfbundle
    from tests.test_selfbundle import old_python

    out, _ = bundle
    pyz = tmp_path / "imgtool.pyz"
    selfbundle.build(pyz)
    r = run_37(old_python("3.7"), str(pyz), "sign", str(out), "--sign-key", str(keys.release), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    who = keys.fingerprint(keys.release)
    assert r.stdout == f"signed: {out}/bundle.json.sig by {who}\n"
    signers = keys.signers(keys.line("release@example.com", keys.release), name="signed-on-kylin")
    v = imgtool("verify", str(out), "--signers", str(signers), env=env_for(tmp_path))
    assert v.returncode == 0, v.stderr
    assert v.stdout.splitlines()[-1] == f"signature: signed by release@example.com ({who}), allowed by {signers}"


def test_signing_with_a_key_held_by_ssh_agent(bundle, keys, tmp_path):
    """--sign-key KEY.pub: ssh-keygen asks the agent for the private half."""
    out, _ = bundle
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        env = env_for(tmp_path, SSH_AUTH_SOCK=str(sock))
        add = subprocess.run(["ssh-add", str(keys.release)], capture_output=True, text=True, timeout=60,
                             env={**os.environ, **env})
        assert add.returncode == 0, add.stderr
        r = imgtool("sign", str(out), "--sign-key", f"{keys.release}.pub", env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"signed: {out}/bundle.json.sig by {keys.fingerprint(keys.release)}\n"
        signers = keys.signers(keys.line("release@example.com", keys.release), name="agent")
        assert imgtool("verify", str(out), "--quick", "--signers", str(signers), env=env).returncode == 0
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)


def test_sign_after_write_is_atomic_and_a_rewrite_drops_the_old_signature(factory, keys, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    pulled = [store.pulled(factory.image(host_arch(), layers=1), f"{REPO}:v1")]
    out = tmp_path / "b"
    write(out, pulled, store)
    sign(out, keys.release, tmp_path)
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]
    write(out, pulled, store, force=True)  # --force: the old signature is the old bundle's, gone with it
    assert not (out / "bundle.json.sig").exists()


# --- fetch --sign-key, the pyz on Kylin's Python 3.7, load.sh --------------------------------------

def run_37(python, *args, cwd, signers=None, docker_host=None):
    """Kylin's python3 under `env -i` (as tests/test_selfbundle.py runs it), PATH with ssh-keygen."""
    env = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"HOME={cwd}", "LANG=C.UTF-8",
           "IMGTOOL_CACHE=/nonexistent/imgtool-cache"]
    if signers:
        env.append(f"IMGTOOL_SIGNERS={signers}")
    if docker_host:
        env.append(f"DOCKER_HOST={docker_host}")
    return subprocess.run([*env, *python, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def load_sh(out, services, signers=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "IMGTOOL_SIGNERS"))}
    env["DOCKER_HOST"] = services.docker_host
    if signers:
        env["IMGTOOL_SIGNERS"] = str(signers)
    return subprocess.run(["sh", "load.sh"], cwd=out, capture_output=True, text=True, env=env, timeout=300)


def test_fetch_signs_and_kylins_python_and_load_sh_refuse_what_imgtool_refuses(services, factory, mirrored, keys,
                                                                               tmp_path, docker_cli, docker_cleanup):
    from tests.test_selfbundle import old_python

    python = old_python("3.7")
    out, image, ref, r = fetch_from_registry(services, factory, mirrored, tmp_path, "--sign-key", str(keys.release))
    who = keys.fingerprint(keys.release)
    assert r.stdout.splitlines()[-2:] == [
        f"signed: {out}/bundle.json.sig by {who}",
        f"offline side, where allowed_signers lists this key: imgtool load {out}   (the installed imgtool; "
        f"python3 {out}/imgtool.pyz load {out}, or: sh {out}/load.sh check the policy too, but for damage only)"]
    signers = keys.signers(keys.line("release@example.com", keys.release), name="kylin")
    pristine = {p.name: p.read_bytes() for p in out.iterdir()}
    label = f"{signers} ($IMGTOOL_SIGNERS)"

    help_ = subprocess.run(["sh", "load.sh", "--help"], cwd=out, capture_output=True, text=True, timeout=60).stdout
    assert "This script protects against DAMAGE only: whoever can edit the bundle can edit" in help_
    assert "本脚本只能防范损坏：能改动镜像包的人也能改动 load.sh（和 imgtool.pyz）。" in help_
    readme = (out / "README.txt").read_text()
    assert "  2. Install that copy: sudo python3 imgtool.pyz self-install" in readme.splitlines()
    assert "  2. 安装这份副本：sudo python3 imgtool.pyz self-install" in readme.splitlines()

    ok = run_37(python, "imgtool.pyz", "verify", ".", cwd=out, signers=signers)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[-1] == f"signature: signed by release@example.com ({who}), allowed by {signers}"

    sh_words = {
        "unsigned": f"not signed (no bundle.json.sig), and {signers} requires a signature by a key it lists",
        "edited": "bad signature: bundle.json.sig does not match bundle.json or is not an imgtool bundle signature "
                  "(ssh-keygen: Signature verification failed: incorrect signature)",
        "stranger": f"signed by a key not in {signers}: {keys.fingerprint(keys.stranger)}",
        "namespace": "bad signature: bundle.json.sig does not match bundle.json or is not an imgtool bundle signature "
                     "(ssh-keygen: Couldn't verify signature: namespace does not match)",
    }
    for case, (spoil, reason) in sorted(REFUSALS.items()):
        spoil(out, keys)
        before = docker_cli.image_ids()
        bad = run_37(python, "imgtool.pyz", "verify", ".", cwd=out, signers=signers)
        assert bad.returncode == 3, (case, bad.stderr)
        assert err_lines(bad)[0] == f"error: bundle failed verification: .: {words(reason, keys, label)}", case
        bad = run_37(python, "imgtool.pyz", "load", ".", cwd=out, signers=signers, docker_host=services.docker_host)
        assert bad.returncode == 3, (case, bad.stderr)
        assert err_lines(bad)[0] == f"error: refusing to load .: {words(reason, keys, label)}; nothing was loaded"
        sh = load_sh(out, services, signers)
        assert sh.returncode == 3, (case, sh.stderr)
        assert f"load.sh: error: {sh_words[case]}; nothing was loaded" in sh.stderr.splitlines(), (case, sh.stderr)
        assert docker_cli.image_ids() == before and docker_cli.find(image) is None
        for name, data in pristine.items():
            (out / name).write_bytes(data)

    # parts swapped under a re-made SHA256SUMS: the signed bundle.json still pins them, and load.sh checks that
    part = sorted(p for p in out.iterdir() if re.search(r"\.part\d+$", p.name))[-1]
    part.write_bytes(part.read_bytes()[:-1] + bytes([part.read_bytes()[-1] ^ 1]))
    sums = (out / "SHA256SUMS").read_text().splitlines()
    fixed = [f"{hashlib.sha256(part.read_bytes()).hexdigest()}  {part.name}" if line.endswith(part.name) else line
             for line in sums]
    (out / "SHA256SUMS").write_text("\n".join(fixed) + "\n")
    sh = load_sh(out, services, signers)
    assert sh.returncode == 3
    assert f"    {part.name}: FAILED" in sh.stderr.splitlines()
    assert "load.sh: error: the bundle was changed after it was signed; nothing was loaded" in sh.stderr.splitlines()
    assert docker_cli.find(image) is None
    for name, data in pristine.items():
        (out / name).write_bytes(data)

    docker_cleanup.image(ref, image.config_digest)
    sh = load_sh(out, services, signers)
    assert sh.returncode == 0, sh.stderr
    assert f"load.sh: bundle.json is signed by release@example.com ({signers})" in sh.stderr.splitlines()
    assert docker_cli.holds(ref, image)
    docker_cli("image", "rm", "-f", ref)
    loaded = run_37(python, "imgtool.pyz", "load", ".", cwd=out, signers=signers, docker_host=services.docker_host)
    assert loaded.returncode == 0, loaded.stderr
    assert docker_cli.holds(ref, image)


def test_signature_error_carries_reason_and_signer(bundle, keys, tmp_path):
    from imgtool.bundle.signature import enforce

    out, _ = bundle
    sign(out, keys.release, tmp_path)
    signers = keys.signers(keys.line("other@example.com", keys.stranger), name="typed")
    with pytest.raises(SignatureError) as e:
        enforce(out, (out / "bundle.json").read_bytes(), str(signers), env={"HOME": str(tmp_path)})
    assert (e.value.reason, e.value.signer, e.value.exit_code) == \
        ("unknown-signer", keys.fingerprint(keys.release), 3)


def test_fetch_from_a_spec_and_export_sign_too(services, factory, mirrored, keys, tmp_path, docker_cli, docker_cleanup):
    from tests.support.images import write_docker_archive

    who = keys.fingerprint(keys.release)
    signers = keys.signers(keys.line("release@example.com", keys.release), name="spec-export")
    idx = factory.multiarch(media="oci", layers=1)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    root = tmp_path / "release"
    root.mkdir()
    (root / "mirrors.toml").write_text(
        f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
        f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    (root / "bundle.toml").write_text(f'images = ["v1"]\narch = ["{host_arch()}"]\nmirrors = "mirrors.toml"\n')
    env = env_for(tmp_path, IMGTOOL_CACHE=str(tmp_path / "cache"))
    spec_out = tmp_path / "from-spec"
    r = imgtool("fetch", "-f", str(root / "bundle.toml"), "-o", str(spec_out), "--no-tool",
                "--sign-key", str(keys.release), "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signature"] == {"path": str(spec_out / "bundle.json.sig"), "signer": who}
    assert imgtool("verify", str(spec_out), "--signers", str(signers), env=env).returncode == 0

    image = factory.image(host_arch(), layers=1)
    ref = f"quay.io/{tmp_path.name.lower()[:20]}x/vllm-ascend:signed"
    write_docker_archive(image, tmp_path / "in.tar", ref)
    docker_cleanup.image(ref, image.config_digest)
    docker_cli("load", "-i", tmp_path / "in.tar")
    # a key that is not there fails before Docker is asked for the image
    nokey = imgtool("export", ref, "-o", str(tmp_path / "nokey"), "--sign-key", str(tmp_path / "nokey.key"),
                    env=env, docker_host=services.docker_host)
    assert nokey.returncode == 2 and err_lines(nokey)[0] == f"error: --sign-key {tmp_path / 'nokey.key'}: no such file"
    assert not (tmp_path / "nokey").exists()
    exported = tmp_path / "exported"
    r = imgtool("export", ref, "-o", str(exported), "--no-tool", "--sign-key", str(keys.release), env=env,
                docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == [
        f"signed: {exported}/bundle.json.sig by {who}",
        f"offline side, where allowed_signers lists this key: imgtool load {exported}   (the installed imgtool; "
        f"sh {exported}/load.sh check the policy too, but for damage only)"]  # --no-tool: no pyz to name
    ok = imgtool("verify", str(exported), "--signers", str(signers), env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[-1] == f"signature: signed by release@example.com ({who}), allowed by {signers}"


@pytest.mark.runtimes(stores=True)
def test_a_stranger_s_signature_is_refused_before_any_runtime_sees_the_bundle(bundle, keys, tmp_path, node):
    """The site policy holds on containerd and Podman as on Docker: same words, exit 3, nothing there."""
    out, image = bundle
    sign_with(out, keys.stranger)
    signers = keys.signers(keys.line("release@example.com", keys.release), name="signers-runtime")
    env = env_for(tmp_path, IMGTOOL_SIGNERS=str(signers))
    env.update(node.env)
    before = node.snapshot()
    r = imgtool("load", str(out), env=env)
    assert r.returncode == 3, r.stderr
    reason = words(REFUSALS["stranger"][1], keys, f"{signers} ($IMGTOOL_SIGNERS)")
    assert err_lines(r)[0] == f"error: refusing to load {out}: {reason}; nothing was loaded"
    assert node.leftovers(before) == [] and not node.find(image)
