"""nodeconfig.py and `imgtool serve --print-node-config`: what each node needs to pull from serve, exactly as a
node's administrator would paste it (the real pulls with these files are in test_serve.py and test_cluster.py)."""

import json
import subprocess
import sys

from imgtool.nodeconfig import node_config
from imgtool.runtimes.choice import mirror_parts
from tests.support.bundles import BlobDir, imgtool, write
from tests.support.images import host_arch

HTTP = """\
# what each node needs to pull from http://10.0.0.5:5000 (run the part for the node's runtime as root)
# --- containerd (Kubernetes nodes; ctr --hosts-dir, crictl, the kubelet)
# 1.6 and 1.7 read these files only when /etc/containerd/config.toml has config_path = "/etc/containerd/certs.d" \
under [plugins."io.containerd.grpc.v1.cri".registry] (2.x reads them by default); a change to hosts.toml needs no \
restart, one to config.toml does
# pods keep their image names (quay.io/...:TAG or @sha256:...); the mirror is asked first, the upstream registry \
only when it fails (unreachable offline)
# k3s and RKE2 write these files themselves, from /etc/rancher/k3s/registries.yaml (rke2/registries.yaml): \
mirrors: {quay.io: {endpoint: ["http://10.0.0.5:5000"]}}, and restart
mkdir -p /etc/containerd/certs.d/quay.io
cat > /etc/containerd/certs.d/quay.io/hosts.toml <<'EOF'
server = "https://quay.io"

[host."http://10.0.0.5:5000"]
  capabilities = ["pull", "resolve"]
EOF
# --- Podman, Buildah, CRI-O, skopeo (containers-registries.conf(5))
# images keep their names; `podman pull quay.io/...` asks the mirror first (Podman 2.1+ reads registries.conf.d; \
an older one: append the same lines to /etc/containers/registries.conf)
mkdir -p /etc/containers/registries.conf.d
cat > /etc/containers/registries.conf.d/imgtool-serve.conf <<'EOF'
[[registry]]
prefix = "quay.io"
location = "quay.io"

[[registry.mirror]]
location = "10.0.0.5:5000"
insecure = true
EOF
# --- Docker
# registry-mirrors mirrors Docker Hub only: Docker cannot mirror quay.io. Pull through this address by name instead \
(serve answers the path without the registry), then give it the upstream name:
#   docker pull 10.0.0.5:5000/ascend/vllm-ascend:v1 && docker tag 10.0.0.5:5000/ascend/vllm-ascend:v1 \
quay.io/ascend/vllm-ascend:v1
# plain HTTP needs insecure-registries (without it Docker speaks plain HTTP to 127.0.0.0/8 only)
# merge into /etc/docker/daemon.json (keep what it holds; then restart dockerd):
#   {
#     "insecure-registries": [
#       "10.0.0.5:5000"
#     ]
#   }
"""


def test_plain_http_for_quay_io_as_a_node_administrator_pastes_it():
    config = node_config("10.0.0.5:5000", "http", [("quay.io", "ascend/vllm-ascend:v1")], mirror_parts())
    assert "\n".join(config.lines()) + "\n" == HTTP
    assert config.to_json()["files"][-1] == {"runtime": "docker", "path": "/etc/docker/daemon.json", "merge": True,
                                             "content": '{\n  "insecure-registries": [\n    "10.0.0.5:5000"\n  ]\n}\n'}


def test_tls_writes_the_ca_where_each_runtime_looks_and_docker_hub_gets_registry_mirrors():
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    config = node_config("[fd00::5]:5443", "https", [("docker.io", "library/busybox:1"), ("quay.io", "a/b:v1")],
                         mirror_parts(), ca_pem=pem, ca_file="/etc/pki/site-ca.pem")
    files = {f.path: (f.content, f.merge) for f in config.files}
    assert files["/etc/containerd/certs.d/docker.io/hosts.toml"] == (
        'server = "https://registry-1.docker.io"\n\n[host."https://[fd00::5]:5443"]\n'
        '  capabilities = ["pull", "resolve"]\n  ca = "ca.crt"\n', False)
    for path in ("/etc/containerd/certs.d/docker.io/ca.crt", "/etc/containerd/certs.d/quay.io/ca.crt",
                 "/etc/containers/certs.d/[fd00::5]:5443/ca.crt", "/etc/docker/certs.d/[fd00::5]:5443/ca.crt"):
        assert files[path] == (pem, False), path
    assert files["/etc/docker/daemon.json"] == ('{\n  "registry-mirrors": [\n    "https://[fd00::5]:5443"\n  ]\n}\n', True)
    assert "insecure = true" not in files["/etc/containers/registries.conf.d/imgtool-serve.conf"][0]
    assert config.to_json()["ca"] == "/etc/pki/site-ca.pem"
    # without --tls-ca: hosts.toml still names ca.crt beside it, and the notes say which certificate to copy there
    bare = node_config("reg:5443", "https", [("quay.io", "a/b:v1")], mirror_parts(), tls_cert="/srv/tls/server.pem")
    assert "\n".join(bare.lines()).count(
        "# copy the CA certificate that issued /srv/tls/server.pem (a self-signed certificate: that file itself) to ") == 3


def test_print_node_config_reads_the_bundles_and_refuses_what_it_cannot_print(factory, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    out = tmp_path / "b"
    write(out, [store.pulled(factory.image(host_arch(), layers=1), "quay.io/ascend/vllm-ascend:v1")], store)
    r = imgtool("serve", str(out), "--listen", "0.0.0.0:5000", "--advertise", "10.0.0.5", "--print-node-config")
    assert (r.returncode, r.stdout) == (0, HTTP)
    r = imgtool("serve", str(out), "--listen", "0.0.0.0:5000", "--print-node-config", "--json")
    doc = json.loads(r.stdout)
    host = subprocess.run([sys.executable, "-c", "import socket; print(socket.gethostname())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert (doc["url"], doc["registries"]) == (f"http://{host}:5000", ["quay.io"])
    r = imgtool("serve", str(out), "--listen", "0.0.0.0:5000", "--print-node-config")
    assert r.stdout.splitlines()[0] == (f"# note: {host} is this host's name: nodes must resolve it, else give "
                                        "--advertise ADDR (listening on every address)")
    for args, error in [
        (["--listen", "127.0.0.1:0", "--print-node-config"], "error: --print-node-config needs the port nodes "
                                                             "connect to, not 0"),
        (["--json"], "error: --json goes with --print-node-config"),
        (["--advertise", "10.0.0.5:99999", "--print-node-config"], "error: invalid --advertise '10.0.0.5:99999': "
         "expected HOST or HOST:PORT (the address nodes reach this server by), e.g. 10.0.0.5 or node1.example:5000"),
        (["--tls-ca", str(out / "bundle.json"), "--print-node-config"], "error: --tls-ca goes with --tls-cert"),
        (["--tls-cert", str(out / "bundle.json"), "--tls-key", str(out / "bundle.json"), "--tls-ca",
          str(out / "bundle.json")], f"error: cannot use --tls-ca {out / 'bundle.json'}: it is not a PEM "
                                      "certificate (of at most 1048576 bytes)"),
    ]:
        r = imgtool("serve", str(out), *args)
        assert (r.returncode, r.stderr.splitlines()[0]) == (2, error), args
