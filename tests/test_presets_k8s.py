"""`imgtool run-flags PRESET --format k8s`: the presets as Kubernetes Pods and Deployments.

Every manifest is checked twice: byte for byte against a golden, and against the Kubernetes API
schemas (kubernetes-validate, strict: an unknown field is an error) of several versions Ascend
clusters run. A broken manifest must fail that check, so the check is known to work.
"""

import json
import random

import pytest
import yaml
from kubernetes_validate import utils as kv

from imgtool import presets as P
from imgtool.presets.k8s import to_yaml
from tests.support.bundles import REPO, BlobDir, random_layer, simple_image, write
from tests.test_presets import imgtool

# kubernetes-validate 1.37.0 ships the schemas of 1.25 to 1.37; 1.24 is the oldest Ascend clusters run
# (MindCluster 6/7 and CCE), 1.25 the oldest it has, 1.28 a common one, 1.31 the last before image volumes' beta.
KUBE_VERSIONS = ("1.25", "1.28", "1.31")
# a Pod mounting a model (issue 49): the clusters of 2026, image volumes off by default (1.33, 1.34), on (1.35), GA (1.36)
MODEL_KUBE_VERSIONS = ("1.33", "1.34", "1.35", "1.36")
DIGEST_PREFIX = "quay.io/ascend/vllm-ascend:v0.11.0rc1@sha256:"


def validate(text, versions=KUBE_VERSIONS):
    """The YAML parsed and checked against each version's strict schema; returns the document."""
    doc = yaml.safe_load(text)
    for version in versions:
        assert kv.validate(doc, version, strict=True) == version
    return doc


def k8s(*args, home, code=0):
    r = imgtool("run-flags", *args, home=home)
    assert r.returncode == code, r.stderr
    return r


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    return h


MOUNTS = """\
    - name: usr-local-dcmi
      mountPath: /usr/local/dcmi
      readOnly: true
    - name: usr-local-bin-npu-smi
      mountPath: /usr/local/bin/npu-smi
      readOnly: true
    - name: usr-local-ascend-driver-lib64
      mountPath: /usr/local/Ascend/driver/lib64/
      readOnly: true
    - name: usr-local-ascend-driver-version-info
      mountPath: /usr/local/Ascend/driver/version.info
      readOnly: true
    - name: etc-ascend-install-info
      mountPath: /etc/ascend_install.info
      readOnly: true
    - name: root-cache
      mountPath: /root/.cache
"""
VOLUMES = """\
  - name: usr-local-dcmi
    hostPath:
      path: /usr/local/dcmi
  - name: usr-local-bin-npu-smi
    hostPath:
      path: /usr/local/bin/npu-smi
  - name: usr-local-ascend-driver-lib64
    hostPath:
      path: /usr/local/Ascend/driver/lib64/
  - name: usr-local-ascend-driver-version-info
    hostPath:
      path: /usr/local/Ascend/driver/version.info
  - name: etc-ascend-install-info
    hostPath:
      path: /etc/ascend_install.info
  - name: root-cache
    hostPath:
      path: /root/.cache
      type: DirectoryOrCreate
"""


def indent(text, n):
    return "".join(" " * n + line if line.strip() else line for line in text.splitlines(True))


A2_POD = f"""\
apiVersion: v1
kind: Pod
metadata:
  name: vllm-ascend
  labels:
    app.kubernetes.io/name: vllm-ascend
spec:
  containers:
  - name: vllm-ascend
    image: quay.io/ascend/vllm-ascend:v0.11.0rc1
    imagePullPolicy: IfNotPresent
    args:
    - vllm
    - serve
    - /models/Qwen3-8B
    - "--port"
    - "8000"
    env:
    - name: PYTORCH_NPU_ALLOC_CONF
      value: expandable_segments:True
    - name: VLLM_USE_MODELSCOPE
      value: "true"
    ports:
    - containerPort: 8000
    resources:
      limits:
        huawei.com/Ascend910: 2
      requests:
        huawei.com/Ascend910: 2
    volumeMounts:
    - name: dshm
      mountPath: /dev/shm
{MOUNTS}\
    - name: models
      mountPath: /models
      readOnly: true
  volumes:
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: "16Gi"
{VOLUMES}\
  - name: models
    hostPath:
      path: /data/models
"""

DUO_DEPLOYMENT = f"""\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: qwen
  labels:
    app.kubernetes.io/name: qwen
spec:
  replicas: 1
  selector:
    matchLabels:
      app.kubernetes.io/name: qwen
  template:
    metadata:
      labels:
        app.kubernetes.io/name: qwen
    spec:
      containers:
      - name: qwen
        image: quay.io/ascend/vllm-ascend:v0.11.0rc1-310p
        imagePullPolicy: IfNotPresent
        stdin: true
        tty: true
        ports:
        - containerPort: 8000
        resources:
          limits:
            huawei.com/Ascend310P: 16
          requests:
            huawei.com/Ascend310P: 16
        volumeMounts:
        - name: dshm
          mountPath: /dev/shm
{indent(MOUNTS, 4)}\
      volumes:
      - name: dshm
        emptyDir:
          medium: Memory
          sizeLimit: "1Gi"
{indent(VOLUMES, 4)}"""

# CCE's device plugin on an A5 (host network, hccn_tool, as the preset), privileged on request
A5_CCE_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: vllm-ascend
  labels:
    app.kubernetes.io/name: vllm-ascend
spec:
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  containers:
  - name: vllm-ascend
    image: quay.io/ascend/vllm-ascend:v0.11.0rc1-a5
    imagePullPolicy: IfNotPresent
    args:
    - bash
    resources:
      limits:
        huawei.com/ascend-1980: 8
      requests:
        huawei.com/ascend-1980: 8
    securityContext:
      privileged: true
    volumeMounts:
    - name: dshm
      mountPath: /dev/shm
    - name: usr-local-dcmi
      mountPath: /usr/local/dcmi
      readOnly: true
    - name: usr-local-ascend-driver-tools-hccn-tool
      mountPath: /usr/local/Ascend/driver/tools/hccn_tool
      readOnly: true
    - name: usr-local-bin-npu-smi
      mountPath: /usr/local/bin/npu-smi
      readOnly: true
    - name: usr-local-ascend-driver-lib64
      mountPath: /usr/local/Ascend/driver/lib64/
      readOnly: true
    - name: usr-local-ascend-driver-version-info
      mountPath: /usr/local/Ascend/driver/version.info
      readOnly: true
    - name: etc-ascend-install-info
      mountPath: /etc/ascend_install.info
      readOnly: true
    - name: root-cache
      mountPath: /root/.cache
  volumes:
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: "1Gi"
  - name: usr-local-dcmi
    hostPath:
      path: /usr/local/dcmi
  - name: usr-local-ascend-driver-tools-hccn-tool
    hostPath:
      path: /usr/local/Ascend/driver/tools/hccn_tool
  - name: usr-local-bin-npu-smi
    hostPath:
      path: /usr/local/bin/npu-smi
  - name: usr-local-ascend-driver-lib64
    hostPath:
      path: /usr/local/Ascend/driver/lib64/
  - name: usr-local-ascend-driver-version-info
    hostPath:
      path: /usr/local/Ascend/driver/version.info
  - name: etc-ascend-install-info
    hostPath:
      path: /etc/ascend_install.info
  - name: root-cache
    hostPath:
      path: /root/.cache
      type: DirectoryOrCreate
"""


def test_a2_pod_golden_and_valid(home):
    r = k8s("a2", "--format", "k8s", "--image", "v0.11.0rc1", "--devices", "0,1", "--shm-size", "16g",
            "--env-preset", "expandable-segments", "-e", "VLLM_USE_MODELSCOPE=true", "-v", "/data/models:/models:ro",
            "--", "vllm", "serve", "/models/Qwen3-8B", "--port", "8000", home=home)
    assert r.stdout == A2_POD
    assert r.stderr == ""
    doc = validate(r.stdout)
    assert doc["spec"]["containers"][0]["args"][-1] == "8000"  # a string, as the schema wants: quoted


def test_300i_duo_deployment_golden_and_valid(home):
    r = k8s("300i-duo", "--format", "k8s", "--kind", "deployment", "--name", "qwen", "--image", "v0.11.0rc1-310p",
            home=home)
    assert r.stdout == DUO_DEPLOYMENT
    validate(r.stdout)


def test_resource_name_for_another_device_plugin(home):
    r = k8s("a5", "--format", "k8s", "--resource-name", "huawei.com/ascend-1980", "--privileged",
            "--image", "v0.11.0rc1-a5", "--", "bash", home=home)
    assert r.stdout == A5_CCE_POD
    assert r.stderr.splitlines() == [
        "warning: --privileged: it gives the container every host device and all kernel capabilities and turns off "
        "its seccomp/AppArmor confinement; use it only with an image you trust (vllm-ascend FAQ 20)"]
    validate(r.stdout)
    # HAMi names the chip: the same Pod asks for its resource instead
    hami = k8s("a2", "--format", "k8s", "--resource-name", "huawei.com/Ascend910B", "--image", "v1", home=home)
    assert "        huawei.com/Ascend910B: 8\n" in hami.stdout
    validate(hami.stdout)


@pytest.mark.parametrize("kind", ["pod", "deployment"])
@pytest.mark.parametrize("preset", sorted(P.load_presets().names()))
def test_every_preset_validates_as_every_kind(preset, kind, home):
    extra = () if P.load_presets().get(preset).resource_name else ("--resource-name", "huawei.com/npu")
    multi = ("--multi-node",) if P.load_presets().get(preset).multi_node else ()
    for more in ((), multi):
        r = k8s(preset, "--format", "k8s", "--kind", kind, "--image", "v1", *extra, *more, home=home)
        doc = validate(r.stdout)
        assert doc["kind"] == {"pod": "Pod", "deployment": "Deployment"}[kind]
        assert json.loads(k8s(preset, "--format", "k8s", "--kind", kind, "--image", "v1", *extra, *more, "--json",
                              home=home).stdout) == doc


def test_a_broken_manifest_fails_validation(home):
    good = yaml.safe_load(k8s("a2", "--format", "k8s", "--image", "v1", home=home).stdout)
    wrong_field = json.loads(json.dumps(good))
    wrong_field["spec"]["containers"][0]["volumeMount"] = wrong_field["spec"]["containers"][0].pop("volumeMounts")
    wrong_type = json.loads(json.dumps(good))
    wrong_type["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = ["1Gi"]
    no_image = json.loads(json.dumps(good))
    del no_image["spec"]["containers"][0]["name"]
    for broken, where in ((wrong_field, ["spec", "containers", 0]),
                          (wrong_type, ["spec", "volumes", 0, "emptyDir", "sizeLimit"]),
                          (no_image, ["spec", "containers", 0])):
        for version in KUBE_VERSIONS:
            with pytest.raises(kv.ValidationError) as e:
                kv.validate(broken, version, strict=True)
            assert list(e.value.path) == where


def test_dollars_reach_the_container_as_docker_passes_them(home):
    # Kubernetes expands $(NAME) and turns $$ into $ in args and env values; docker passes them as written
    r = k8s("a2", "--format", "k8s", "--image", "v1", "-e", "A=x$(B)$$y$", "-e", "B=1", "--",
            "bash", "-c", "echo $$ $(B) $HOME", home=home)
    container = validate(r.stdout)["spec"]["containers"][0]
    assert container["args"] == ["bash", "-c", "echo $$$$ $$(B) $$HOME"]
    assert container["env"] == [{"name": "A", "value": "x$$(B)$$$$y$$"}, {"name": "B", "value": "1"}]
    assert '    - "echo $$$$ $$(B) $$HOME"\n' in r.stdout


def test_privileged_comes_from_the_preset_or_the_user(home):
    plain = yaml.safe_load(k8s("a3", "--format", "k8s", "--image", "v1", home=home).stdout)
    assert "securityContext" not in plain["spec"]["containers"][0]
    pro = k8s("200i-pro", "--format", "k8s", "--resource-name", "huawei.com/Ascend310P", "--image", "v1", home=home)
    container = validate(pro.stdout)["spec"]["containers"][0]
    assert container["securityContext"] == {"privileged": True}
    assert container["resources"]["limits"] == {"huawei.com/Ascend310P": 1}
    assert pro.stderr.startswith("warning: preset 200i-pro runs with --privileged, as the vllm-ascend docs do")


# --- the image by digest from a bundle ----------------------------------------------------------------------


def make_bundle(tmp_path, images):
    """A bundle holding (tag, arch, seed) images, written as fetch writes one."""
    store = BlobDir(tmp_path / "blobs")
    pulled, digests = [], {}
    for tag, arch, seed in images:
        image = simple_image([random_layer(1024, seed)], arch, seed=seed)
        pulled.append(store.pulled(image, f"{REPO}:{tag}"))
        digests[(tag, arch)] = image.manifest_digest
    out = tmp_path / "bundle"
    write(out, pulled, store)
    return out, digests


def test_bundle_pins_the_manifest_digest_and_the_architecture(tmp_path, home):
    bundle, digests = make_bundle(tmp_path, [("v0.11.0rc1", "arm64", 1), ("v0.10.0", "arm64", 2),
                                             ("v0.11.0rc1-310p", "amd64", 3)])
    r = k8s("a2", "--format", "k8s", "--bundle", str(bundle), home=home)  # the newest tag for a2 in the bundle
    assert r.stderr == ""
    doc = validate(r.stdout)
    assert doc["spec"]["containers"][0]["image"] == DIGEST_PREFIX + digests[("v0.11.0rc1", "arm64")][7:]
    assert f"    image: {DIGEST_PREFIX}{digests[('v0.11.0rc1', 'arm64')][7:]}\n" in r.stdout
    assert doc["spec"]["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    assert "  nodeSelector:\n    kubernetes.io/arch: arm64\n  containers:\n" in r.stdout
    duo = k8s("300i-duo", "--format", "k8s", "--kind", "deployment", "--bundle", str(bundle),
              "--image", "v0.11.0rc1-310p", home=home)
    pod = validate(duo.stdout)["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"{REPO}:v0.11.0rc1-310p@{digests[('v0.11.0rc1-310p', 'amd64')]}"
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    # a tag for other hardware: the same warning as for docker run
    other = k8s("a2", "--format", "k8s", "--bundle", str(bundle), "--image", "v0.11.0rc1-310p", home=home)
    assert other.stderr.splitlines() == [
        "warning: image tag v0.11.0rc1-310p does not look like one for preset a2 (expected vX.Y.Z or vX.Y.Z-openeuler)"]


def test_bundle_without_the_image_or_with_two_platforms_is_bad_input(tmp_path, home):
    bundle, _ = make_bundle(tmp_path, [("v0.11.0rc1", "arm64", 1), ("v0.11.0rc1", "amd64", 2)])
    r = k8s("a3", "--format", "k8s", "--bundle", str(bundle), home=home, code=2)
    assert r.stderr.splitlines() == [
        f"error: bundle {bundle} holds no {REPO} image for preset a3 (looked for tags vX.Y.Z-a3, vX.Y.Z-a3-openeuler)",
        "hint: name one with --image TAG, or give the bundle fetched for this hardware"]
    r = k8s("a2", "--format", "k8s", "--bundle", str(bundle), "--image", "v9", home=home, code=2)
    assert r.stderr.splitlines() == [f"error: bundle {bundle} holds no image {REPO}:v9; it holds {REPO}:v0.11.0rc1"]
    r = k8s("a2", "--format", "k8s", "--bundle", str(bundle), home=home, code=2)
    assert r.stderr.splitlines() == [
        f"error: bundle {bundle} holds {REPO}:v0.11.0rc1 for linux/arm64/v8 and linux/amd64: a Pod names one manifest",
        "hint: name the nodes' architecture with --arch arm64 or --arch amd64 (the Pod is pinned to it), or leave out "
        "--bundle to name the image by tag"]
    r = k8s("a2", "--format", "k8s", "--bundle", str(bundle), "--arch", "s390x", home=home, code=2)
    assert r.stderr.splitlines() == [
        f"error: bundle {bundle} holds {REPO}:v0.11.0rc1 for linux/arm64/v8 and linux/amd64, not for s390x"]
    r = k8s("a2", "--format", "k8s", "--image", "v1", "--arch", "arm64", home=home, code=2)
    assert r.stderr.splitlines() == [
        "error: --arch applies with --bundle: it chooses which of the bundle's manifests the Pod names"]
    r = k8s("a2", "--arch", "arm64", home=home, code=2)
    assert r.stderr.splitlines() == ["error: --arch applies to --format k8s"]


def test_bundle_of_two_architectures_pins_the_one_named(tmp_path, home):
    bundle, digests = make_bundle(tmp_path, [("v0.11.0rc1", "arm64", 1), ("v0.11.0rc1", "amd64", 2),
                                             ("v0.10.0", "amd64", 3)])
    for arch, given in (("arm64", "aarch64"), ("amd64", "amd64")):
        r = k8s("a2", "--format", "k8s", "--bundle", str(bundle), "--arch", given, home=home)
        pod = validate(r.stdout)["spec"]
        assert pod["containers"][0]["image"] == DIGEST_PREFIX + digests[("v0.11.0rc1", arch)][7:]
        assert pod["nodeSelector"] == {"kubernetes.io/arch": arch}
    r = k8s("a2", "--format", "k8s", "--bundle", str(bundle), "--image", "v0.10.0", "--arch", "arm64", home=home,
            code=2)
    assert r.stderr.splitlines() == [f"error: bundle {bundle} holds {REPO}:v0.10.0 for linux/amd64, not for arm64"]
    r = k8s("a2", "--format", "k8s", "--bundle", str(tmp_path / "nothing"), home=home, code=2)
    assert r.stderr.splitlines() == [f"error: no such bundle directory: {tmp_path / 'nothing'}"]


# --- --format and the options of docker run --------------------------------------------------------------------


def test_format_docker_and_podman_are_the_runtimes_commands(home):
    docker = k8s("a2", home=home)
    assert k8s("a2", "--format", "docker", home=home).stdout == docker.stdout
    assert k8s("a2", "--format", "docker", "--one-line", home=home).stdout == k8s("a2", "--one-line", home=home).stdout
    assert k8s("a2", "--format", "podman", home=home).stdout == k8s("a2", "--runtime", "podman", home=home).stdout
    assert k8s("a2", "--format", "podman", "--runtime", "podman", "--json", home=home).stdout == \
        k8s("a2", "--runtime", "podman", "--json", home=home).stdout


def test_placeholder_image_is_said_for_the_manifest(home):
    r = k8s("a3", "--format", "k8s", home=home)
    assert "    image: \"quay.io/ascend/vllm-ascend:<version>-a3\"\n" in r.stdout
    assert r.stderr.splitlines() == [
        "warning: no quay.io/ascend/vllm-ascend image for preset a3 is loaded here; replace <version> in the "
        "manifest, pass --image, or --bundle DIR"]
    validate(r.stdout)


@pytest.mark.parametrize("args, message", [
    (("a2", "--format", "docker", "--runtime", "podman"),
     ["error: --format docker and --runtime podman name different programs: give one"]),
    (("a2", "--kind", "deployment"), ["error: --kind applies to --format k8s"]),
    (("a2", "--runtime", "podman", "--resource-name", "huawei.com/Ascend910"),
     ["error: --resource-name applies to --format k8s"]),
    (("a2", "--bundle", "."), ["error: --bundle applies to --format k8s"]),
    (("a2", "--format", "k8s", "--one-line"), ["error: --one-line applies to --format docker and podman"]),
    (("200i-pro", "--format", "k8s", "--image", "v1"),
     ["error: preset 200i-pro names no Kubernetes resource for its NPUs",
      "hint: name the device plugin's: --resource-name huawei.com/Ascend910 (MindCluster, A2/A3), "
      "huawei.com/Ascend310P (300I Duo), or your plugin's"]),
    (("a2", "--format", "k8s", "--image", "v1", "--resource-name", "Ascend910"),
     ["error: invalid resource name 'Ascend910': expected DOMAIN/NAME outside kubernetes.io, e.g. huawei.com/Ascend910"]),
    (("a2", "--format", "k8s", "--image", "v1", "--resource-name", "kubernetes.io/npu"),
     ["error: invalid resource name 'kubernetes.io/npu': expected DOMAIN/NAME outside kubernetes.io, "
      "e.g. huawei.com/Ascend910"]),
    (("a2", "--format", "k8s", "--image", "v1", "--name", "My_Server"),
     ["error: invalid --name 'My_Server' for Kubernetes: lowercase letters, digits and '-', starting and ending "
      "with a letter or digit, at most 63 characters"]),
    (("a2", "--format", "k8s", "--image", "v1", "--net", "none"),
     ["error: --net none has no Kubernetes equivalent: a Pod is on the cluster's network, or with --net host "
      "(or --multi-node) on the node's"]),
    (("a2", "--format", "k8s", "--image", "v1", "-d"),
     ["error: -d and --no-rm have no meaning for --format k8s: the cluster runs the workload in the background "
      "and removes it when you delete it (kubectl delete)"]),
    (("a2", "--format", "k8s", "--kind", "job"),
     ["error: invalid value for '--kind': 'job' is not one of 'pod', 'deployment'",
      "hint: usage: imgtool run-flags [OPTIONS] PRESET [-- CMD...]; imgtool run-flags -h explains every option"]),
])
def test_bad_k8s_input_is_one_line_and_exit_2(args, message, home):
    r = k8s(*args, home=home, code=2)
    assert r.stdout == ""
    assert r.stderr.splitlines() == message


def test_a_user_preset_names_its_resource(tmp_path, home):
    f = tmp_path / "presets.toml"
    f.write_text('[presets.lab]\nextends = "300i-duo"\ncards = "0-3"\nresource_name = "huawei.com/Ascend310P-IPro"\n')
    r = k8s("lab", "--format", "k8s", "--image", "v1", "--presets", str(f), home=home)
    assert validate(r.stdout)["spec"]["containers"][0]["resources"]["limits"] == {"huawei.com/Ascend310P-IPro": 4}
    f.write_text('[presets.a2]\nresource_name = "Ascend910"\n')
    r = k8s("a2", "--presets", str(f), home=home, code=2)
    assert r.stderr.splitlines() == [
        f"error: {f}:2: presets.a2.resource_name: invalid resource name 'Ascend910': expected DOMAIN/NAME outside "
        "kubernetes.io, e.g. huawei.com/Ascend910"]


# --- the YAML writer -------------------------------------------------------------------------------------------

TRICKY = ["", " ", "yes", "No", "ON", "off", "y", "n", "true", "False", "null", "Null", "~", "-", "--", "- x", "1",
          "0x1F", "1e3", "012", "1_000", ".5", ".inf", ".NaN", "12:30:00", "2001-12-14", "1Gi", "8000:8000", "a: b",
          "a:", ":a", "a #b", "#a", "a#b", "@x", "`x", "!x", "&x", "*x", "%x", "|", ">", "?", "[a]", "{a}", "a,b",
          "'q'", '"q"', "back\\slash", "tab\there", "line\nbreak", "cr\r", "nel\x85", "ls\u2028", "ps\u2029",
          "bom\ufeff", "del\x7f", "c1\x9b", "nul\x00", "é", "昇腾", "emoji \U0001F600", "lone \ud800", "<<", "=",
          "/usr/local/Ascend/driver/lib64/", "expandable_segments:True", "huawei.com/Ascend910", "a/b@sha256:00",
          " lead", "trail ", "x:y:z", "=x", "+1", "-1", "0o17", "0b1", "+.inf", "Y", "NO"]


def random_document(rng, depth=0):
    def text():
        return rng.choice(TRICKY) if rng.random() < 0.7 else "".join(
            rng.choice("ab:# -'\"\\\n\t{}[],&*!|>%@`?é\x85\u2028") for _ in range(rng.randint(0, 6)))

    def value(d):
        r = rng.random()
        if d < 3 and r < 0.2:
            return {text(): value(d + 1) for _ in range(rng.randint(0, 3))}
        if d < 3 and r < 0.35:
            return [value(d + 1) if rng.random() < 0.6 else {text(): value(d + 1)} for _ in range(rng.randint(0, 3))]
        return rng.choice([text, text, lambda: rng.randint(-5, 1 << 40), lambda: rng.random() < 0.5])()

    return {text(): value(depth) for _ in range(rng.randint(1, 4))}


def without_nested_lists(doc):
    if isinstance(doc, dict):
        return {k: without_nested_lists(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [without_nested_lists(v) for v in doc if not (isinstance(v, list) and v)]
    return doc


def test_yaml_writer_round_trips_every_string():
    for s in TRICKY:
        doc = {s: s, "list": [s, {s: [s]}], "n": 7, "b": True, "e": {}, "l": []}
        assert yaml.safe_load(to_yaml(doc)) == doc, (s, to_yaml(doc))
    rng = random.Random(26)
    for _ in range(2000):
        doc = without_nested_lists(random_document(rng))
        assert yaml.safe_load(to_yaml(doc)) == doc, to_yaml(doc)


def test_yaml_writer_writes_plain_only_what_reads_back_as_that_string():
    assert to_yaml({"a": "huawei.com/Ascend910", "b": "yes", "c": "1Gi", "d": "a: b", "e": 8, "f": False}) == (
        'a: huawei.com/Ascend910\nb: "yes"\nc: "1Gi"\nd: "a: b"\ne: 8\nf: false\n')
    with pytest.raises(TypeError):
        to_yaml({"x": 1.5})


# --- a model in the Pod (issue 49): its modelcar image as an image volume, or the placed directory -------------------

def _placed_model(tmp_path):
    from tests.support.models import small_model
    from tests.test_placed import place_hf

    model = small_model(seed=49)
    placed = place_hf(model, tmp_path / "hf")
    return model, placed, {"HF_HUB_CACHE": str(tmp_path / "hf"), "MODELSCOPE_CACHE": str(tmp_path / "ms")}


def _model_pod(home, env, *args):
    from tests.test_placed import REPO

    r = imgtool("run-flags", "a2", "--format", "k8s", "--image", "v0.11.0rc1", "--model", REPO, *args, home=home,
                extra_env=env)
    assert r.returncode == 0, r.stderr
    pod = validate(r.stdout, KUBE_VERSIONS[-1:] + MODEL_KUBE_VERSIONS)
    return r, pod["spec"]


@pytest.mark.parametrize("version, form", [
    (None, "hostPath"), ("1.33", "hostPath"), ("1.34", "hostPath"),
    ("1.35", "image"), ("v1.35.2", "image"), ("1.36", "image+subPath"), ("1.37", "image+subPath"),
])
def test_a_model_is_its_modelcar_image_volume_from_1_35_and_a_host_path_before(version, form, tmp_path, home):
    model, placed, env = _placed_model(tmp_path)
    r, spec = _model_pod(home, env, *(("--k8s-version", version) if version else ()))
    container = spec["containers"][0]
    commit = model.head.commit
    reference = f"models.local/hf/imgtool-test/tiny-llm:{commit}-modelcar"
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in container["env"]
    assert {"name": "TRANSFORMERS_OFFLINE", "value": "1"} in container["env"]
    model_mount, model_volume = container["volumeMounts"][-1], spec["volumes"][-1]
    if form == "hostPath":
        folder = str(placed.path.parent.parent)
        assert container["args"][:3] == ["vllm", "serve", str(placed.path)]
        assert model_mount == {"name": model_mount["name"], "mountPath": folder, "readOnly": True}
        assert model_volume == {"name": model_mount["name"], "hostPath": {"path": folder, "type": "Directory"}}
        assert r.stderr.splitlines()[-1] == (
            f"model: a hostPath of {folder}: every node the Pod may run on needs the model placed there; "
            f"--k8s-version 1.35 or later mounts its modelcar image instead")
        return
    assert container["args"] == ["vllm", "serve", "/mnt/modelcar/models", "--served-model-name", "imgtool-test/tiny-llm"]
    # never Always: an air-gapped node cannot pull again
    assert model_volume == {"name": "model", "image": {"reference": reference, "pullPolicy": "IfNotPresent"}}
    if form == "image":  # containerd 2.1 mounts the image's root and ignores a subPath: none
        assert model_mount == {"name": "model", "mountPath": "/mnt/modelcar", "readOnly": True}
    else:
        assert model_mount == {"name": "model", "mountPath": "/mnt/modelcar/models", "readOnly": True,
                               "subPath": "models"}
    assert all("hostPath" not in v or "tiny-llm" not in v["hostPath"]["path"] for v in spec["volumes"])
    assert r.stderr.splitlines()[-1] == (
        f"model: the image volume {reference} at /mnt/modelcar/models (pullPolicy IfNotPresent): the node's runtime "
        f"must hold it (imgtool load of the bundle imports it)")


def test_an_image_volume_is_refused_by_the_schemas_before_1_31(tmp_path, home):
    """The check is known to work: the 1.28 schema has no image volume, so a 1.36 Pod fails against it."""
    _, _, env = _placed_model(tmp_path)
    r, _ = _model_pod(home, env, "--k8s-version", "1.36")
    with pytest.raises(Exception, match="image"):
        validate(r.stdout, ("1.28",))


def test_a_model_whose_commit_is_not_known_has_no_modelcar_to_mount(tmp_path, home):
    from tests.test_placed import REPO

    d = tmp_path / "models" / REPO
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")  # a download of the user's: no marker, no commit
    r = imgtool("run-flags", "a2", "--format", "k8s", "--model", REPO, "--models-dir", str(tmp_path / "models"),
                "--k8s-version", "1.35", home=home)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines()[-2:] == [
        f"error: {REPO} cannot be mounted as its modelcar image: the commit placed at {d} is not known "
        f"(a download imgtool did not place)",
        "hint: imgtool load BUNDLE places it with its commit; --k8s-version 1.34 mounts the placed directory instead "
        "(hostPath)"]
