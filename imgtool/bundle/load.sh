#!/bin/sh
# Load this imgtool bundle into Docker, containerd or Podman on a host without Python or imgtool.
# README.txt and bundle.json list the images.
#
# Every bundle carries this file: imgtool/bundle/load.sh of the imgtool that wrote the bundle, with the values of
# the parameters below written in for that bundle by imgtool/bundle/loadsh.py. Everything after them is the same
# in every bundle. Each piece says which part of imgtool it mirrors: load.sh checks and says what imgtool does.
# Single quotes hold text that is meant as written, never an expansion: the parameters, awk's and sed's programs.
# shellcheck disable=SC2016
set -u

# ---- parameters: bundle/loadsh.py writes each line below anew for every bundle -------------------------------
# Each value is a number, or one single-quoted word (imgtool.text.sh_quote: sh expands nothing in it), so a value
# of bundle.json is data to sh, never code. A list is a function that runs the command it is given once per item,
# with the item's words after it: `parts check_size` runs `check_size NAME SIZE` for every part.
#
# imgtool's own names, numbers and words, the same in imgtool and here:
# the imgtool that wrote this (for people who read it)
# shellcheck disable=SC2034
written_by='imgtool 0.1.0'
# the bundle's files (bundle/format.py) and the namespace of its signature (sshsig.py: ssh-keygen -n)
BUNDLE_JSON='bundle.json'
SHA256SUMS='SHA256SUMS'
SIGNATURE='bundle.json.sig'
sig_namespace='imgtool-bundle'
# what the kubelet finder reads of this host at most, in bytes (runtimes/kubelet.py): a configuration file or a
# command line, /proc/PID/comm, /proc/PID/status
kube_max_file=1048576
kube_max_comm=64
kube_max_status=4096
# the copies of the archive Podman holds in its staging dir at its peak (runtimes/podman.py)
podman_copies=3
# how to make room where each runtime keeps images (runtimes/*.py; @NAMESPACE@: containerd's namespace)
advice_docker=''
advice_containerd=''
advice_podman=''
staging_advice=''
# what to do about zstd layers on Docker before 23.0
zstd_remedy=''
# the label that pins an image in containerd: the kubelet's image GC leaves it (runtimes/containerd.py)
pinned_label='io.cri-containerd.pinned=pinned'
#
# this bundle, from its bundle.json:
# how many images it holds; its archive's compression (none, gzip or zstd) and the size of its tar, unpacked
image_count=0
compression='none'
tar_size=0
# its parts, in order: name, size in bytes
parts() { :; }
# the platforms of its images, as said (linux/amd64, linux/arm64), and their architectures, a list
platforms=''
arches() { :; }
# the images with zstd-compressed layers (Docker reads them from 23.0 on), as said; '': none
zstd_refs=''
# the tags it holds for several architectures, as said ('': none), and each such tag's images: the architecture,
# the image ID, the tag
multiarch_refs=''
multiarch_tags() { :; }
# a delta bundle: for each group of left-out layers, what provides them in words, then the images that do (any
# one); and for containerd, per image, the same words and the deepest left-out chain (its snapshot holds all below)
base_images() { :; }
base_chains() { :; }
# the IDs a runtime knows its images by (config digests, and manifest digests: Docker's containerd image store),
# the manifest digests (what ctr import records each image by), and every layer it carries once per chain: chain
# ID, compressed size, unpacked size, the IDs of the images that hold it (bundle/hostcheck.py counts the same)
image_ids=''
manifests=''
layer_table=''
# what loads one platform of a multi-arch tag instead of load.sh, and the three ways to load (README.txt's too)
instead='imgtool load .'
ways_en=''
ways_zh=''
# its models (issue 48): how many, and where the images' members end in its tar (the runtime is sent that much,
# then the tar's end blocks: never a model's byte); each model: its number, its directory under --models-dir
# (ORG/NAME), its reference, its commit, its .imgtool-model.json (the bytes imgtool's placer writes), its files and
# size in words; each file: the model's number, its path, size and sha256; and where each carried file's bytes lie
# in the parts of an uncompressed archive: its sha256, the part, the offset in the part, the length
model_count=0
images_end=0
models() { :; }
model_files() { :; }
model_pieces() { :; }
# its models as modelcar images (issue 49; bundle/loadsh.py says what each is): whether they carry that form (1, or
# 0), each image per model and architecture (the model's number, the architecture, the name, the manifest digest,
# the top chain ID, the tar's bytes before the layers as a printf format), each file's layer (the model's number,
# the path, size and sha256, the bytes before the file's as a printf format, the NULs after them)
modelcars=0
car_images() { :; }
car_layers() { :; }
# ---- end of parameters ---------------------------------------------------------------------------------------

usage() {
    cat <<'EOF'
usage: sh load.sh [--runtime docker|containerd|podman] [--no-pin] [--force] [--help]
                  [--models image | --models-dir DIR] [--models-only] [--no-models]

Checks every file of this bundle against SHA256SUMS (naming any damaged or
missing part; without a SHA256SUMS naming every part, against the sha256
bundle.json gives for each, else it refuses: exit 3), checks that the runtime
has room for the images, then streams the parts in order into the runtime.
On a Kubernetes node it loads where the kubelet reads images, as its
configuration says (a kubelet process's flags, /var/lib/kubelet, /etc/crictl.yaml,
k3s/RKE2 and MicroK8s sockets): its containerd at that socket, namespace k8s.io,
unpacked and pinned (io.cri-containerd.pinned=pinned; --no-pin: not), or Docker
for cri-dockerd; and it says why. Elsewhere, the first of:
  docker       `docker load`, when the docker command is there and its daemon answers;
  containerd   else `ctr images import` (a Kubernetes node): the socket is
               $CONTAINERD_ADDRESS (default /run/containerd/containerd.sock), the
               namespace $CONTAINERD_NAMESPACE (default k8s.io, the kubelet's), as ctr
               reads them; only this host's platform is imported and unpacked;
  podman       else `podman load`.
It prints the runtime it chose; with none of them it says why for each and exits 5.
--runtime NAME (or IMGTOOL_RUNTIME=NAME) uses that runtime and no other.
--force loads even when the runtime's root seems to lack the room (exit 1 without).
A failed ctr import leaves nothing: what it recorded is removed.
A bundle's models (an uncompressed bundle's) are placed with --models-dir DIR into
DIR/ORG/NAME, as imgtool load --models-dir places them: each file checked with
sha256sum, read-only, staged beside DIR/ORG/NAME and renamed at the end; the
runtime is sent the images only. --models image imports each model into
containerd instead as its modelcar image (models.local/HUB/ORG/NAME:COMMIT-modelcar,
what a Kubernetes image volume mounts), every file checked with sha256sum first,
then streamed from the parts (the default on a node whose kubelet uses
containerd); not on Docker or Podman (use imgtool load --models image there).
--models-only places (or imports) the models and loads no image; --no-models
loads the images only. For the Hugging Face or ModelScope cache, use imgtool load.
Set DOCKER, CTR or PODMAN to run one another way, e.g.  DOCKER="sudo docker" sh load.sh
Signed bundles: under an allowed_signers policy ($IMGTOOL_SIGNERS, else
~/.config/imgtool/allowed_signers, else /etc/imgtool/allowed_signers, as imgtool
finds it) it checks bundle.json.sig with `ssh-keygen -Y verify` and every file
against the signed bundle.json, and refuses (exit 3) an unsigned bundle, a bad
signature, or a key not listed; without a policy a present signature must still
be good.
This script protects against DAMAGE only: whoever can edit the bundle can edit
load.sh (and imgtool.pyz) too. Against an edited bundle, load it with the host's
installed imgtool (README.txt, "Who checks the bundle"):  imgtool load .
EOF
    printf '\n%s\n\n' "$ways_en"
    cat <<'EOF'
用法: sh load.sh [--runtime docker|containerd|podman] [--no-pin] [--force]
先按 SHA256SUMS 校验本目录的每个文件（指出损坏或缺失的分卷；SHA256SUMS 缺失或未列出每个分卷时，按 bundle.json
给出的 sha256 校验，两者都不行则拒绝导入，退出码 3），再检查运行时的存储目录空间是否足够，然后按顺序把分卷送入容器运行时。
在 Kubernetes 节点上，按 kubelet 的配置（kubelet 进程的参数、/var/lib/kubelet、/etc/crictl.yaml、k3s/RKE2 与
MicroK8s 的套接字）导入 kubelet 读取镜像的地方：它的 containerd（该套接字，命名空间 k8s.io，解压并固定，
即 io.cri-containerd.pinned=pinned；--no-pin 则不固定），或 cri-dockerd 对应的 Docker，并说明原因。其他主机依次尝试：
  docker       有 docker 命令且其守护进程有响应时，用 `docker load`；
  containerd   否则用 `ctr images import`（Kubernetes 节点）：套接字为 $CONTAINERD_ADDRESS
               （默认 /run/containerd/containerd.sock），命名空间为 $CONTAINERD_NAMESPACE
               （默认 k8s.io，即 kubelet 使用的），与 ctr 读取的变量相同；只导入并解压本机平台的镜像；
  podman       否则用 `podman load`。
会打印所选的运行时；三者都没有时逐一说明原因并以退出码 5 结束。
--runtime 名称（或 IMGTOOL_RUNTIME=名称）指定运行时，不再尝试其他运行时。
--force：运行时存储目录空间看似不足时仍然导入（不加时退出码 1）。ctr 导入失败时，会删除这次导入记录的内容。
镜像包中的模型（未压缩的镜像包）用 --models-dir 目录 放到 目录/组织/名称：逐个文件用 sha256sum 校验、只读、
先在旁边暂存，最后改名到位；运行时只收到镜像部分。--models-only 只放模型（无需运行时）；--no-models 只导入镜像。
--models image：把每个模型作为 modelcar 镜像导入 containerd（先用 sha256sum 校验每个文件，再从分卷流式导入；
kubelet 使用 containerd 的节点上默认如此）；Docker、Podman 上请用 imgtool load --models image。
要放进 Hugging Face 或 ModelScope 缓存，请用 imgtool load（或 pyz）。
可用 DOCKER、CTR、PODMAN 变量改变调用方式，例如 DOCKER="sudo docker" sh load.sh
签名的镜像包：有 allowed_signers 策略时（与 imgtool 相同的查找顺序：$IMGTOOL_SIGNERS、
~/.config/imgtool/allowed_signers、/etc/imgtool/allowed_signers），先用 `ssh-keygen -Y verify` 校验
bundle.json.sig，并按已签名的 bundle.json 校验每个文件；未签名、签名无效或签名密钥不在文件中时拒绝导入
（退出码 3）；没有策略时，已有的签名也必须有效。
本脚本只能防范损坏：能改动镜像包的人也能改动 load.sh（和 imgtool.pyz）。要防范被改动的镜像包，
请用主机上安装好的 imgtool 导入（见 README.txt “谁来校验镜像包”）：imgtool load .
EOF
    printf '\n%s\n' "$ways_zh"
}

runtime=${IMGTOOL_RUNTIME:-auto}
no_pin=""
force=""
models_dir=""
models_only=""
no_models=""
models_target=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --no-pin) no_pin=1; shift ;;
        --force) force=1; shift ;;
        --models-only) models_only=1; shift ;;
        --no-models) no_models=1; shift ;;
        --models=*) models_target=${1#--models=}; shift ;;
        --models)
            if [ $# -lt 2 ]; then echo "load.sh: error: --models needs a value: image" >&2; exit 2; fi
            models_target=$2; shift 2 ;;
        --models-dir=*) models_dir=${1#--models-dir=}; shift ;;
        --models-dir)
            if [ $# -lt 2 ]; then echo "load.sh: error: --models-dir needs a directory" >&2; exit 2; fi
            models_dir=$2; shift 2 ;;
        --runtime=*) runtime=${1#--runtime=}; shift ;;
        --runtime)
            if [ $# -lt 2 ]; then echo "load.sh: error: --runtime needs a value: docker, containerd or podman" >&2; exit 2; fi
            runtime=$2; shift 2 ;;
        *) echo "load.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
case "$models_target" in
    ''|image) ;;
    hf|modelscope)
        echo "load.sh: error: --models $models_target: load.sh places models into a plain directory (--models-dir DIR) or imports them into containerd (--models image); for the $models_target cache run: $instead --models $models_target" >&2
        exit 2 ;;
    *) echo "load.sh: error: unknown --models '$models_target': image (or --models-dir DIR)" >&2; exit 2 ;;
esac
if [ -n "$no_models" ] && [ -n "$models_only$models_dir$models_target" ]; then
    echo "load.sh: error: --no-models places no model: it cannot go with --models-only, --models or --models-dir" >&2
    exit 2
fi
if [ -n "$models_target" ] && [ -n "$models_dir" ]; then
    echo "load.sh: error: --models and --models-dir both say where the models go: choose one" >&2
    exit 2
fi
if [ -n "$models_target" ] && [ "$modelcars" -eq 0 ]; then
    echo "load.sh: error: --models image: this bundle does not carry the modelcar form of its models (bundle.json records no modelcar digest for their files)" >&2
    echo "load.sh: place the files instead (--models-dir DIR), or fetch the models again with an imgtool that records the modelcar form" >&2
    exit 2
fi
if [ -n "$models_only" ] && [ "$model_count" -eq 0 ]; then
    echo "load.sh: error: --models-only: this bundle holds no model" >&2
    exit 2
fi
case "$models_dir" in ''|/*) ;; *) models_dir="$(pwd)/$models_dir" ;; esac
case "$runtime" in
    auto|docker|containerd|podman) ;;
    *) echo "load.sh: error: unknown runtime '$runtime' (--runtime or IMGTOOL_RUNTIME): docker, containerd, podman or auto" >&2
       exit 2 ;;
esac

here=$(dirname "$0")
# The allowed_signers policy, found as imgtool finds it: $IMGTOOL_SIGNERS, then the user's
# ~/.config/imgtool/allowed_signers, then the site's /etc/imgtool/allowed_signers.
signers=${IMGTOOL_SIGNERS:-}
if [ -n "$signers" ]; then
    case "$signers" in /*) ;; *) signers="$(pwd)/$signers" ;; esac
    if [ ! -f "$signers" ]; then
        echo "load.sh: error: \$IMGTOOL_SIGNERS $signers: no such file" >&2
        echo "load.sh: an OpenSSH allowed_signers file: one line per key, NAME KEYTYPE BASE64" >&2
        exit 2
    fi
else
    for f in "${HOME:+$HOME/.config/imgtool/allowed_signers}" /etc/imgtool/allowed_signers; do
        [ -n "$f" ] || continue
        if [ -f "$f" ]; then signers=$f; break; fi
        if [ -e "$f" ] || [ -L "$f" ]; then
            echo "load.sh: error: $f is not a regular file (an allowed_signers policy must be one)" >&2
            exit 2
        fi
    done
fi
cd "$here" || exit 1
DOCKER=${DOCKER:-docker}
CTR=${CTR:-ctr}
PODMAN=${PODMAN:-podman}
address=${CONTAINERD_ADDRESS:-}  # else the kubelet's, else /run/containerd/containerd.sock
namespace=${CONTAINERD_NAMESPACE:-k8s.io}

# Nothing is read that is not a regular file: a FIFO, or a link to /dev/zero, would be read forever.
not_regular() {
    echo "load.sh: error: $1 is not a regular file; re-copy it from the source medium; nothing was loaded" >&2
    exit 3
}
for f in "$BUNDLE_JSON" "$SHA256SUMS" "$SIGNATURE"; do
    if [ -e "$f" ] || [ -L "$f" ]; then [ -f "$f" ] || not_regular "$f"; fi
done
check_size() {
    if [ -e "$1" ] || [ -L "$1" ]; then
        [ -f "$1" ] || not_regular "$1"
        # shellcheck disable=SC2012  # ls -n is POSIX and reads no byte of the file (stat is not POSIX, wc -c may read)
        size=$(ls -lnL -- "$1" | awk '{ print $5 }')
        if [ "$size" != "$2" ]; then
            echo "load.sh: error: $1 is $size bytes, $BUNDLE_JSON says $2; re-copy it from the source medium; nothing was loaded" >&2
            exit 3
        fi
    fi
}
parts check_size
if [ -f "$SHA256SUMS" ]; then
    while read -r _ name; do
        name=${name#\*}
        if [ -e "$name" ] || [ -L "$name" ]; then [ -f "$name" ] || not_regular "$name"; fi
    done <"$SHA256SUMS"
fi

# Signed bundles: under an allowed_signers policy, bundle.json must carry a good signature by a key
# listed there; without one, a signature that is there must still be good (as imgtool checks it). A
# good signature makes every file answer to the signed bundle.json (SHA256SUMS is not signed).
refuse() {
    echo "load.sh: error: $1; nothing was loaded" >&2
    [ -z "${2:-}" ] || echo "load.sh: $2" >&2
    exit 3
}
signed=""
if [ -z "$signers" ] && [ -f "$SIGNATURE" ]; then
    if command -v ssh-keygen >/dev/null 2>&1; then
        if ! found=$(ssh-keygen -Y check-novalidate -n "$sig_namespace" -s "$SIGNATURE" <"$BUNDLE_JSON" 2>/dev/null); then
            why=$(ssh-keygen -Y check-novalidate -n "$sig_namespace" -s "$SIGNATURE" <"$BUNDLE_JSON" 2>&1 >/dev/null | tr -d '\r' | tail -n 1)
            refuse "bad signature: $SIGNATURE does not match $BUNDLE_JSON or is not an imgtool bundle signature (ssh-keygen: $why)" \
                "copy $BUNDLE_JSON and $SIGNATURE again from the source medium"
        fi
        echo "load.sh: $BUNDLE_JSON is signed by $(printf '%s\n' "$found" | sed 's/.* with //') (good signature; no allowed_signers policy here, so who signed was not checked)" >&2
        signed=1
    else
        echo "load.sh: warning: $SIGNATURE was not checked: ssh-keygen not found (no allowed_signers policy here, so this is not a refusal)" >&2
    fi
fi
if [ -n "$signers" ]; then
    [ -r "$signers" ] || refuse "$signers cannot be read"
    command -v ssh-keygen >/dev/null 2>&1 || \
        refuse "cannot check $SIGNATURE: ssh-keygen not found, and $signers requires a signature" \
            "install OpenSSH's client tools (openssh-client / openssh), which bring ssh-keygen"
    [ -f "$SIGNATURE" ] || refuse "not signed (no $SIGNATURE), and $signers requires a signature by a key it lists" \
        "sign it where it was made: imgtool sign DIR --sign-key KEY"
    signer=""
    set -f
    # shellcheck disable=SC2094  # ssh-keygen only reads the policy, as this loop does
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line#"${line%%[! 	]*}"}
        case "$line" in ''|'#'*) continue ;; esac
        names=$(printf '%s\n' "${line%%[ 	]*}" | tr -d '"')
        old_ifs=$IFS
        IFS=,
        for name in $names; do
            case "$name" in ''|'!'*) continue ;; esac
            if ssh-keygen -Y verify -f "$signers" -I "$name" -n "$sig_namespace" -s "$SIGNATURE" <"$BUNDLE_JSON" >/dev/null 2>&1; then
                signer=$name
                break
            fi
        done
        IFS=$old_ifs
        [ -z "$signer" ] || break
    done <"$signers"
    set +f
    if [ -z "$signer" ]; then
        if found=$(ssh-keygen -Y check-novalidate -n "$sig_namespace" -s "$SIGNATURE" <"$BUNDLE_JSON" 2>/dev/null); then
            refuse "signed by a key not in $signers: $(printf '%s\n' "$found" | sed 's/.* with //')" \
                "if that key is your release engineer's, add its public key to $signers"
        fi
        why=$(ssh-keygen -Y check-novalidate -n "$sig_namespace" -s "$SIGNATURE" <"$BUNDLE_JSON" 2>&1 >/dev/null | tr -d '\r' | tail -n 1)
        refuse "bad signature: $SIGNATURE does not match $BUNDLE_JSON or is not an imgtool bundle signature (ssh-keygen: $why)" \
            "copy $BUNDLE_JSON and $SIGNATURE again from the source medium"
    fi
    echo "load.sh: $BUNDLE_JSON is signed by $signer ($signers)" >&2
    signed=1
fi
if [ -n "$signed" ]; then
    command -v sha256sum >/dev/null 2>&1 || refuse "sha256sum not found: cannot check the files against the signed $BUNDLE_JSON"
    sums=$(awk '/^  "(parts|files)": \[/ { s = 1; next } /^  []]/ { s = 0 }
        s && /"name": "/ { n = $2; gsub(/[",]/, "", n) }
        s && /"sha256": "/ { h = $2; gsub(/[",]/, "", h); print h "  " n }' "$BUNDLE_JSON")
    bad=$(printf '%s\n' "$sums" | sha256sum -c - 2>/dev/null | grep -v ': OK$')
    if [ -n "$bad" ] || [ -z "$sums" ]; then
        echo "load.sh: error: these files do not match the signed $BUNDLE_JSON:" >&2
        printf '%s\n' "${bad:-    (no files listed)}" | sed 's/^/    /' >&2
        refuse "the bundle was changed after it was signed" "re-copy them from the source medium, then run load.sh again"
    fi
fi

# What the files are checked against: SHA256SUMS when it names every part; else the sha256 bundle.json gives
# for every part (and file); else nothing can check the parts, and nothing is loaded. (A signed bundle had its
# files checked against the signed bundle.json above.)
only_new() {  # the lines of stdin that are not lines of $1
    before=$1 awk 'BEGIN { n = split(ENVIRON["before"], a, "\n"); for (i = 1; i <= n; i++) seen[a[i]] = 1 } !($0 in seen)'
}
print_name() { printf '%s\n' "$1"; }
part_names() {
    parts print_name
}
sums_file="$SHA256SUMS"
why_not_sums=""
if [ ! -f "$SHA256SUMS" ]; then
    why_not_sums="$SHA256SUMS is missing"
elif [ ! -s "$SHA256SUMS" ]; then
    why_not_sums="$SHA256SUMS is empty"
else
    unlisted=$(part_names | only_new "$(sed -n 's/^[0-9a-f]\{64\} [ *]//p' "$SHA256SUMS")" | tr '\n' ' ')
    [ -z "$unlisted" ] || why_not_sums="$SHA256SUMS does not name every part (not: ${unlisted% })"
fi
if [ -n "$why_not_sums" ]; then
    # the sums bundle.json gives, in sha256sum -c's form (the awk of the signature check above)
    sums=$(awk '/^  "(parts|files)": \[/ { s = 1; next } /^  []]/ { s = 0 }
        s && /"name": "/ { n = $2; gsub(/[",]/, "", n) }
        s && /"sha256": "/ { h = $2; gsub(/[",]/, "", h); if (h ~ /^[0-9a-f]+$/ && length(h) == 64) print h "  " n }' "$BUNDLE_JSON" 2>/dev/null)
    missing=$(part_names | only_new "$(printf '%s\n' "$sums" | sed -n 's/^[0-9a-f]\{64\}  //p')" | tr '\n' ' ')
    if [ -n "$signed" ]; then
        sums_file=""  # checked against the signed bundle.json already
    elif [ ! -f "$BUNDLE_JSON" ] || [ -n "$missing" ] || [ -z "$sums" ]; then
        printf 'load.sh: error: cannot check the parts: %s, and %s does not give the sha256 of every part; %s\n' \
            "$why_not_sums" "$BUNDLE_JSON" "nothing was loaded" >&2
        echo "load.sh: copy $SHA256SUMS and $BUNDLE_JSON again from the source medium (or check the bundle with: imgtool verify .)" >&2
        exit 3
    else
        echo "load.sh: $why_not_sums: checking the files against the sha256 $BUNDLE_JSON gives for them ..." >&2
        sums_file=-
    fi
fi

if [ -z "$sums_file" ]; then
    :  # a signed bundle: every file was checked against the signed bundle.json
elif command -v sha256sum >/dev/null 2>&1; then
    [ "$sums_file" = - ] || echo "load.sh: checking the files against $SHA256SUMS ..." >&2
    bad=$(printf '%s\n' "${sums:-}" | sha256sum -c "$sums_file" 2>/dev/null | grep -v ': OK$')
    # a file that is there and cannot be opened is a permission problem (re-copying it would not help)
    unreadable=$(printf '%s\n' "$bad" | sed -n 's/: FAILED open or read$//p' | while IFS= read -r f; do
        if [ -e "$f" ]; then printf '%s\n' "$f"; fi
    done)
    if [ -n "$unreadable" ]; then
        echo "load.sh: error: these files cannot be read by this user (a permission problem: they are not damaged):" >&2
        printf '%s\n' "$unreadable" | sed 's/^/    /' >&2
        echo "load.sh: let this user read them (chmod a+r FILE, or chown it), or run load.sh as their owner; nothing was loaded" >&2
        exit 3
    fi
    if [ -n "$bad" ]; then
        echo "load.sh: error: these files are damaged or missing:" >&2
        echo "$bad" | sed 's/^/    /' >&2
        echo "load.sh: re-copy them from the source medium, then run load.sh again" >&2
        exit 3
    fi
else
    echo "load.sh: error: sha256sum not found: cannot check the parts; nothing was loaded" >&2
    echo "load.sh: install coreutils (or busybox), which brings sha256sum; or load with imgtool" >&2
    exit 3
fi

# The models (issue 48), as imgtool's placer places them into a plain directory (its `dir` target): DIR/ORG/NAME
# holding the files (0444; directories 0555) and .imgtool-model.json, staged in DIR/ORG/.imgtool-staging-PID-RANDOM
# and renamed to DIR/ORG/NAME at the end, so a half-placed model is never visible under its name. Each file's bytes
# are cut from the parts (already checked above) and checked again with sha256sum against bundle.json's sha256.
model_not_placed() {  # $1: why (exit 3 when the bytes are wrong, else 1)
    [ -z "${staging:-}" ] || { chmod -R u+w "$staging" 2>/dev/null; rm -rf "$staging"; }
    echo "load.sh: error: $1; nothing was placed" >&2
    exit "${2:-1}"
}
cut_piece() {  # $1: a sha256, $2: a part, $3: the offset in it, $4: the length: the bytes, if $1 is this file's
    [ "$1" = "$file_sha" ] || return 0
    found=1
    tail -c +"$(($3 + 1))" -- "$2" | head -c "$4" >>"$staging/partial"
}
stage_file() {  # $1: a model's number, $2: a path, $3: its size, $4: its sha256
    [ "$1" = "$model_no" ] || return 0
    file_sha=$4
    found=""
    : >"$staging/partial"
    model_pieces cut_piece
    [ -n "$found" ] || model_not_placed "$model_ref: $2: this bundle does not carry its bytes (a delta bundle leaves out the files the other side holds)"
    # shellcheck disable=SC2012  # ls -n is POSIX (see check_size)
    got=$(ls -lnL -- "$staging/partial" | awk '{ print $5 }')
    read_sha=$(sha256sum <"$staging/partial" | awk '{ print $1 }')
    if [ "$got" != "$3" ] || [ "$read_sha" != "$4" ]; then
        model_not_placed "$model_ref: $2: its bytes do not match its sha256 (sha256:$(printf '%.12s' "$read_sha") read, $(printf '%.12s' "$4") expected)" 3
    fi
    chmod 444 "$staging/partial"
    mkdir -p -- "$(dirname -- "$staging/tree/$2")"
    mv -- "$staging/partial" "$staging/tree/$2"
}
file_there() {  # $1: a model's number, $2: a path, $3: its size: unchanged is cleared when it is not there so
    [ "$1" = "$model_no" ] || return 0
    # shellcheck disable=SC2012
    if [ ! -f "$dest/$2" ] || [ "$(ls -lnL -- "$dest/$2" | awk '{ print $5 }')" != "$3" ]; then unchanged=""; fi
}
place_model() {  # $1: its number, $2: ORG/NAME, $3: its reference, $4: its commit, $5: its marker, $6: in words
    model_no=$1; model_ref=$3
    dest="$models_dir/$2"
    folder=$(dirname -- "$dest")
    marker_file="$dest/.imgtool-model.json"
    unchanged=""
    if [ -f "$marker_file" ] && printf '%s' "$5" | cmp -s - "$marker_file"; then
        unchanged=1
        model_files file_there
    fi
    if [ -n "$unchanged" ]; then
        echo "load.sh: $3 is placed already in $dest ($6): nothing to do" >&2
        return 0
    fi
    if { [ -e "$dest" ] || [ -L "$dest" ]; } && [ ! -f "$marker_file" ] && [ -z "$force" ]; then
        echo "load.sh: error: $dest exists and was not placed by imgtool: $3 was not placed" >&2
        echo "load.sh: move it away, or run load.sh with --force to replace it" >&2
        exit 1
    fi
    mkdir -p -- "$folder" || model_not_placed "$3: cannot create $folder"
    staging="$folder/.imgtool-staging-$$-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
    mkdir -p -- "$staging/tree" || model_not_placed "$3: cannot create $staging"
    model_files stage_file
    if ! printf '%s' "$5" >"$staging/tree/.imgtool-model.json"; then model_not_placed "$3: cannot write its marker"; fi
    chmod 444 "$staging/tree/.imgtool-model.json"
    find "$staging/tree" -depth -type d -exec chmod 555 {} + || model_not_placed "$3: cannot seal $staging/tree"
    if [ -e "$dest" ] || [ -L "$dest" ]; then
        chmod u+w "$dest" 2>/dev/null
        mv -- "$dest" "$staging/old" || model_not_placed "$3: cannot move $dest aside"
    fi
    mv -- "$staging/tree" "$dest" || model_not_placed "$3: cannot rename $staging/tree to $dest"
    chmod -R u+w "$staging" 2>/dev/null
    rm -rf "$staging"
    staging=""
    echo "load.sh: placed $3 (commit $(printf '%.12s' "$4")) in $dest ($6)" >&2
}
place_models() {
    [ "$model_count" -gt 0 ] && [ -z "$no_models" ] || return 0
    if [ -z "$models_dir" ]; then
        echo "load.sh: this bundle also holds $model_count model(s): place them with sh load.sh --models-dir DIR, or with $instead (the Hugging Face or ModelScope cache)" >&2
        return 0
    fi
    if [ "$compression" != none ]; then
        echo "load.sh: error: load.sh places models from an uncompressed bundle only, and this one is $compression-compressed; nothing was placed" >&2
        echo "load.sh: place them with $instead --models-dir \"$models_dir\"" >&2
        exit 1
    fi
    command -v sha256sum >/dev/null 2>&1 || model_not_placed "sha256sum not found: cannot check the models' files"
    models place_model
}

# After a failed `ctr images import` (a damaged archive, the disk full during the unpack; containerd 1.7 keeps
# an image it could not complete, which the CRI then reports present): remove the image records it created and
# the blobs it wrote, as imgtool's containerd room does. ctr's own lease, which held what it had unpacked, ended
# with ctr; `images rm --sync` then lets containerd's GC take the snapshots. What was there before stays.
# shellcheck disable=SC2086  # the names and digests ctr listed, split into words (no globbing)
forget() {
    set -f
    new=$(bounded ctr images ls -q 2>/dev/null | only_new "$images_before")
    [ -z "$new" ] || bounded ctr images rm --sync $new >/dev/null 2>&1
    left=$(bounded ctr content ls -q 2>/dev/null | only_new "$blobs_before")
    [ -z "$left" ] || bounded ctr content rm $left >/dev/null 2>&1
    set +f
    if [ -n "$new$left" ]; then
        printf 'load.sh: removed what the failed import had recorded: %s image record(s), %s blob(s)\n' \
            "$(printf '%s' "$new" | grep -c .)" "$(printf '%s' "$left" | grep -c .)" >&2
    fi
}

# The models as modelcar images (issue 49), as imgtool load --models image imports them (ends/modelcar_source.py):
# per model, an OCI layout tar of this host's platform written to `ctr images import` (the namespace, the pin and the
# clean-up of a failed import as for the images): index.json, manifest.json, oci-layout, the manifest and config
# (bytes precomputed by loadsh.py, written by printf), then each file's layer: its tar header and the modelcar head
# (printf), the file's bytes cut from the parts, its NULs. Nothing is stored: the bytes go from the parts to ctr.
# Every file is checked with sha256sum before the import begins, reading its bytes once more: ctr registers the
# image once the tar ends, and sh cannot hold the last bytes back until a hash running beside the stream says yes
# (imgtool does). containerd checks each layer against its digest (the recorded modelcar digest) as it writes it,
# so a byte that changed between the check and the stream fails the import, and what it recorded is removed.
car_refuse() {  # $1: why (exit 3 when the bytes are wrong, else 1)
    echo "load.sh: error: $1; nothing was imported" >&2
    exit "${2:-1}"
}
car_pick() {  # a car_images item: this model's image for this host's architecture
    [ "$1" = "$model_no" ] && [ "$2" = "$arch" ] || return 0
    car_name=$3; car_manifest=$4; car_chain=$5; car_prefix=$6
}
cut_out() {  # a model_pieces item: the bytes, if $1 is this file's
    [ "$1" = "$file_sha" ] || return 0
    tail -c +"$(($3 + 1))" -- "$2" | head -c "$4"
}
has_piece() { [ "$1" != "$file_sha" ] || found=1; }
file_bytes() {  # $1: a sha256: the file's bytes from the parts
    file_sha=$1
    model_pieces cut_out
}
car_check() {  # a car_layers item: the file's bytes match its sha256
    [ "$1" = "$model_no" ] || return 0
    file_sha=$4
    found=""
    [ "$3" -ne 0 ] || found=1
    model_pieces has_piece
    [ -n "$found" ] || car_refuse "$model_ref: this bundle is a delta that leaves out some of its files ($2), and its modelcar image needs every file"
    read_sha=$(file_bytes "$4" | sha256sum | awk '{ print $1 }')
    if [ "$read_sha" != "$4" ]; then
        car_refuse "$model_ref: $2: its bytes do not match its sha256 (sha256:$(printf '%.12s' "$read_sha") read, $(printf '%.12s' "$4") expected)" 3
    fi
}
car_layer() {  # a car_layers item: the layer's tar member
    [ "$1" = "$model_no" ] || return 0
    # shellcheck disable=SC2059  # the format is loadsh.py's: octal escapes and printable bytes, no % (bundle/loadsh.py)
    printf "$5"
    file_bytes "$4"
    head -c "$6" /dev/zero
}
car_tar() {
    # shellcheck disable=SC2059  # as in car_layer
    printf "$car_prefix"
    car_layers car_layer
    head -c 1024 /dev/zero  # the tar's end
}
car_held() {  # containerd holds the image under its name, unpacked
    [ -n "$(bounded ctr images ls 2>/dev/null | awk -v n="$car_name" -v d="$car_manifest" 'NR > 1 && $1 == n && $3 == d')" ] &&
        { [ -z "$car_chain" ] || bounded ctr snapshots info "$car_chain" >/dev/null 2>&1; }
}
car_pin() {  # every name of the image (the CRI's sha256:<config> one too), as the images are pinned
    [ -z "$no_pin" ] || return 0
    rows=$(bounded ctr images ls 2>/dev/null | awk -v d="$car_manifest" 'NR > 1 && $3 == d { print $1 }')
    set -f
    for name in $rows; do
        if ! said=$(bounded ctr images label "$name" "$pinned_label" 2>&1 >/dev/null); then
            set +f
            echo "load.sh: error: cannot pin $name (ctr images label: $said); the image is imported, not pinned" >&2
            exit 5
        fi
    done
    set +f
    car_pinned=", pinned"
}
import_modelcar() {  # a models item: $1: its number, $3: its reference, $6: its files and size in words
    model_no=$1; model_ref=$3
    car_name=""
    car_images car_pick
    [ -n "$car_name" ] || car_refuse "$3: its modelcar has no image for $platform"
    car_pinned=""
    if car_held; then
        car_pin
        echo "load.sh: model image $car_name ($platform, $6$car_pinned): held already in containerd, namespace $namespace" >&2
        return 0
    fi
    car_layers car_check
    images_before=$(bounded ctr images ls -q 2>/dev/null)
    blobs_before=$(bounded ctr content ls -q 2>/dev/null)
    car_tar | run ctr images import --platform "$platform" -
    status=$?
    if [ "$status" -ne 0 ]; then
        echo "load.sh: error: ctr images import of $car_name failed (exit $status)" >&2
        forget
        exit "$status"
    fi
    car_pin
    echo "load.sh: model image $car_name ($platform, $6$car_pinned): imported in containerd, namespace $namespace" >&2
}
import_modelcars() {
    if [ "$compression" != none ]; then
        echo "load.sh: error: load.sh imports modelcar images from an uncompressed bundle only, and this one is $compression-compressed; nothing was imported" >&2
        echo "load.sh: import them with $instead --models image" >&2
        exit 1
    fi
    command -v sha256sum >/dev/null 2>&1 || car_refuse "sha256sum not found: cannot check the models' files"
    models import_modelcar
}
models_then_done() {  # the models, the last step of every load: placed, or imported (car)
    if [ -n "$car" ]; then import_modelcars; else place_models; fi
    echo "load.sh: done" >&2
}
car=""
if [ "$image_count" -eq 0 ] || [ -n "$models_only" ]; then  # the models alone, placed: no runtime is asked anything
    if [ -z "$models_target" ] && { [ -n "$models_dir" ] || [ -n "$no_models" ]; }; then
        place_models
        echo "load.sh: done" >&2
        exit 0
    fi
fi

# A compressed archive is unpacked on its way into the runtime, by gzip or zstd.
case "$compression" in
    gzip|zstd)
        if ! command -v "$compression" >/dev/null 2>&1; then
            echo "load.sh: error: $compression is not installed; the archive is $compression-compressed" >&2
            echo "load.sh: install $compression, or use: imgtool load \"$here\"" >&2
            exit 1
        fi ;;
esac

# The runtime: Docker when its daemon answers, else containerd (a Kubernetes node) when ctr and its
# socket are there, else Podman; --runtime / IMGTOOL_RUNTIME names one. Every question asked of a
# runtime has a time limit (where coreutils' timeout is there); the load itself has none, as docker load.
#
# `within SECONDS COMMAND ARGS...` runs COMMAND within that limit ('': none). The runtimes' commands are named
# docker, ctr and podman: DOCKER, CTR and PODMAN hold each a command with its words (DOCKER="sudo docker"), split
# into words here and nowhere else, and ctr is asked at this load's socket and namespace.
# shellcheck disable=SC2086
within() {
    limit=$1
    shift
    case "$1" in
        docker) shift; set -- $DOCKER "$@" ;;
        ctr) shift; set -- $CTR -a "$address" -n "$namespace" "$@" ;;
        podman) shift; set -- $PODMAN "$@" ;;
    esac
    if [ -n "$limit" ] && command -v timeout >/dev/null 2>&1; then timeout "$limit" "$@"; else "$@"; fi
}
bounded() { within 60 "$@"; }
run() { within '' "$@"; }
# containerd is asked first what imgtool asks it first, `ctr version`, within imgtool's 30 s (ctr itself gives up
# on a socket that accepts and never answers after 10 s, as under imgtool), in imgtool's words: a socket that does
# not answer is said once, not met again by every later question (each of which would wait 10 s more).
ctr_answers() {
    said=$(within 30 ctr version 2>&1 >/dev/null)
    status=$?
    [ "$status" -ne 0 ] || return 0
    said=$(printf '%s\n' "$said" | tr -d '\r' | sed '/^$/d' | tail -n 1)
    if [ "$status" -eq 124 ] || [ -z "$said" ]; then echo "containerd: \`ctr version\` did not finish within 30 s"
    else echo "cannot reach containerd at $address: $said"; fi
}
why_not() {
    case "$1" in
        docker)
            if ! command -v "${DOCKER%% *}" >/dev/null 2>&1; then echo "not installed"
            elif ! bounded docker version >/dev/null 2>&1; then echo "its daemon does not answer"; fi ;;
        containerd)
            if ! command -v "${CTR%% *}" >/dev/null 2>&1; then echo "no ctr command"
            elif [ ! -S "$address" ]; then echo "no socket at $address"
            else ctr_answers; fi ;;
        podman)
            command -v "${PODMAN%% *}" >/dev/null 2>&1 || echo "not installed" ;;
    esac
}

# The kubelet of this node, found as imgtool finds it (imgtool/runtimes/kubelet.py), in this order: a running
# kubelet's command line (--container-runtime-endpoint, else --config FILE's containerRuntimeEndpoint; k3s runs it
# inside its own process, on its own containerd), kubeadm's flags file, /var/lib/kubelet/config.yaml,
# /etc/crictl.yaml, then k3s/RKE2's and MicroK8s's containerd sockets. A kubelet in another PID or mount namespace
# (a kind node's, a container's) is another node's. cri-dockerd means Docker. Only read, never written.
# Only root steers root's load: a kubelet process counts when every uid of it is 0 and it is alive; root's
# kubelets that name different runtimes are none of them followed. A file counts when it is a regular file owned
# by root, writable by root alone, not empty and at most $kube_max_file bytes, and is read only up to its size
# (/proc/kmsg says 0; a FIFO is no regular file). A value holding a control character (a newline, which the
# command line read a line per argument would split) is no value. Every read of the host's files has a cap.
kube_runtime=""; kube_endpoint=""; kube_source=""; kube_said=""
kube_nl='
'
kube_warn() {  # a warning, once (as imgtool says each once)
    case "$kube_nl$kube_said$kube_nl" in *"$kube_nl$1$kube_nl"*) return 0 ;; esac
    kube_said="$kube_said$kube_nl$1"
    echo "load.sh: warning: $1" >&2
}
kube_flag() {  # stdin: the arguments, one a line; the last value of --$1 (--$1=V or --$1 V, as pflag takes it)
    awk -v f="$1" 'BEGIN { p = f "=" }
        { if (want) { v = $0; want = 0 } if (index($0, p) == 1) v = substr($0, length(p) + 1); else if ($0 == f) want = 1 }
        END { printf "%s", v }'
}
kube_valid() {  # $1 is a value (no control character in it); else said, as $2 holding one
    if printf '%s' "$1" | awk '/[\001-\037\177]/ { bad = 1 } END { exit !bad }'; then
        kube_warn "$2 holds a control character: not followed"; return 1
    fi
}
kube_file() {  # $1 counts as a file of the kubelet's (absent: silently not); sets kube_size
    [ -e "$1" ] || return 1
    if [ ! -f "$1" ]; then kube_warn "cannot read $1: not a regular file"; return 1; fi
    # shellcheck disable=SC2012  # the mode, owner and size, from POSIX ls (stat is not POSIX)
    facts=$(ls -lnLd -- "$1" 2>/dev/null | awk 'NR == 1 { print substr($1, 1, 10), $3, $5 }')
    [ -n "$facts" ] || return 1  # gone since
    mode=${facts%% *}; facts=${facts#* }; owner=${facts%% *}; kube_size=${facts#* }
    why=""
    if [ "$owner" != 0 ]; then why="owned by uid $owner, not by root"
    else
        case "$mode" in ?????w*|????????w*) why="writable by others than root (mode $mode)" ;; esac
    fi
    if [ -n "$why" ]; then :
    elif [ "$kube_size" -gt "$kube_max_file" ]; then why="$kube_size bytes is too big for a configuration file"
    elif [ "$kube_size" -eq 0 ]; then why="its size is 0 (an empty file, or one of the kernel's)"
    elif [ ! -r "$1" ]; then why="Permission denied"
    fi
    if [ -n "$why" ]; then kube_warn "cannot read $1: $why"; return 1; fi
}
kube_read() {  # the text of the file $1, up to the size kube_file found (and within a minute, as every wait here)
    bounded head -c "$kube_size" -- "$1" 2>/dev/null | tr -d '\r'
}
kube_key() {  # kube_value: the top-level scalar $2 of the small YAML (or JSON) file $1, as kubelet.read_keys reads it
    kube_value=""
    kube_file "$1" || return 0
    kube_value=$(kube_read "$1" | awk -v k="$2" -v q="'" '
        NR == 1 && /^[ \t]*[{]/ { json = 1 }
        json { text = text $0 "\n"; next }
        /^[ \t#-]/ || !/:/ { next }
        { key = $0; sub(/:.*/, "", key); gsub(/^[ \t]+|[ \t]+$/, "", key); gsub("^[\"" q "]+|[\"" q "]+$", "", key)
          if (key != k) next
          rest = substr($0, index($0, ":") + 1); gsub(/^[ \t]+|[ \t]+$/, "", rest)
          c = substr(rest, 1, 1)
          if (c == "\"" || c == q) { end = index(substr(rest, 2), c); if (end > 0) v = substr(rest, 2, end - 1); next }
          sub(/ #.*/, "", rest); gsub(/[ \t]+$/, "", rest)
          if (rest != "" && index("[{|>&*!", substr(rest, 1, 1)) == 0) v = rest }
        END { if (json && match(text, "\"" k "\"[ \t\r\n]*:[ \t\r\n]*\"[^\"]*\"")) {
                  v = substr(text, RSTART, RLENGTH); sub(/^"[^"]*"[ \t\r\n]*:[ \t\r\n]*"/, "", v); sub(/"$/, "", v) }
              printf "%s", v }' 2>/dev/null)
}
runtime_of() {  # which runtime an endpoint is: cri-dockerd (and the old dockershim) mean Docker
    name=${1%/}; name=${name##*/}
    case "$name" in
        *dockerd*|*dockershim*) echo docker ;;
        *crio*) echo cri-o ;;
        *isulad*) echo isulad ;;
        *) echo containerd ;;
    esac
}
kube_set() { kube_endpoint=$1; kube_source=$2; kube_runtime=${3:-$(runtime_of "$1")}; }
kube_from_args() {  # $1: the kubelet's arguments, one a line; $2: where they were read. 1: none named; 2: no value
    value=$(printf '%s\n' "$1" | kube_flag --container-runtime-endpoint)
    config=$(printf '%s\n' "$1" | kube_flag --config)
    kube_valid "$value" "$2: --container-runtime-endpoint" || return 2
    kube_valid "$config" "$2: --config" || return 2
    if [ -n "$value" ]; then kube_set "$value" "$2"; return 0; fi
    if [ -n "$config" ]; then
        kube_key "$config" containerRuntimeEndpoint
        if [ -n "$kube_value" ]; then
            kube_valid "$kube_value" "$config: containerRuntimeEndpoint" || return 2
            kube_set "$kube_value" "$config"; return 0
        fi
    fi
    if [ "$(printf '%s\n' "$1" | kube_flag --container-runtime)" = docker ]; then  # before 1.24: the dockershim
        kube_set unix:///var/run/dockershim.sock "$2" docker; return 0
    fi
    return 1
}
# shellcheck disable=SC2012  # the namespace a link names, from POSIX ls (readlink is not POSIX)
ns_of() { ls -l "/proc/$1/ns/$2" 2>/dev/null | sed -n 's/.* -> //p'; }
same_namespaces() {  # where they cannot be compared (not root), the kubelet is taken as this node's; gone: none
    for ns in pid mnt; do
        theirs=$(ns_of "$1" "$ns"); ours=$(ns_of self "$ns")
        if [ -z "$theirs" ]; then [ "$(id -u)" != 0 ] || return 1; continue; fi
        [ -z "$ours" ] || [ "$theirs" = "$ours" ] || return 1
    done
}
kube_found=""  # "pid runtime endpoint" of each of root's kubelets, a line each
kube_first=""  # the first one's runtime, endpoint and source, a line each
# shellcheck disable=SC2013  # a pid a line: digits only, split as words
for pid in $(grep -lxE 'kubelet|k3s|k3s-server|k3s-agent' /proc/[0-9]*/comm 2>/dev/null | sed 's|^/proc/||; s|/comm$||' | sort -n); do
    # (the groups: a redirection that fails is reported to the stderr in force before its own 2>/dev/null applies;
    # a process that ended since the listing is no kubelet)
    comm=$( { head -c "$kube_max_comm" "/proc/$pid/comm"; } 2>/dev/null) || continue
    case "$comm" in kubelet|k3s|k3s-server|k3s-agent) ;; *) continue ;; esac
    # a NUL ends an argument; a newline in one becomes \001, which kube_valid refuses as imgtool refuses the newline
    args=$( { head -c "$kube_max_file" "/proc/$pid/cmdline" | tr '\n\000' '\001\n'; } 2>/dev/null) || continue
    [ -n "$args" ] || continue  # a zombie, or a kernel thread
    # read after the command line: the process was root's, and alive, as that was read
    { head -c "$kube_max_status" "/proc/$pid/status" | awk '$1 == "State:" { s = $2 } $1 == "Uid:" { n = NF; u = $2 $3 $4 $5 }
        END { exit !(s != "" && s != "Z" && s != "X" && n == 5 && u == "0000") }'; } 2>/dev/null || continue
    same_namespaces "$pid" || continue
    case "$comm" in kubelet) source="the kubelet's command line, pid $pid" ;; *) source="k3s's command line, pid $pid" ;; esac
    kube_from_args "$(printf '%s\n' "$args" | sed 1d)" "$source"
    case $? in
        0) ;;
        2) continue ;;
        *) case "$comm" in
               k3s*)  # the embedded kubelet: on k3s's containerd, or on cri-dockerd with --docker
                   if printf '%s\n' "$args" | grep -qx -e --docker; then
                       kube_set unix:///run/k3s/cri-dockerd/cri-dockerd.sock "$source" docker
                   else
                       kube_set unix:///run/k3s/containerd/containerd.sock "$source" containerd
                   fi ;;
               *) kube_set unix:///run/containerd/containerd.sock "$source: no endpoint given, the kubelet's default" containerd ;;
           esac ;;
    esac
    kube_found="$kube_found$pid $kube_runtime $kube_endpoint$kube_nl"
    [ -n "$kube_first" ] || kube_first="$kube_runtime$kube_nl$kube_endpoint$kube_nl$kube_source"
done
kube_runtime=""; kube_endpoint=""; kube_source=""
if [ -n "$kube_first" ]; then
    if [ "$(printf '%s' "$kube_found" | sed 's/^[^ ]* //' | sort -u | awk 'END { print NR }')" -gt 1 ]; then
        named=$(printf '%s' "$kube_found" | awk '{ e = $0; sub(/^[^ ]* [^ ]* /, "", e)
            printf "%spid %s: %s at %s", (NR > 1 ? ", " : ""), $1, $2, e }')
        kube_warn "kubelets that name different runtimes run here ($named): none of them is followed"
    else
        kube_runtime=${kube_first%%"$kube_nl"*}; rest=${kube_first#*"$kube_nl"}
        kube_endpoint=${rest%%"$kube_nl"*}; kube_source=${rest#*"$kube_nl"}
    fi
fi
if [ -z "$kube_runtime" ] && kube_file /var/lib/kubelet/kubeadm-flags.env; then
    text=$(kube_read /var/lib/kubelet/kubeadm-flags.env)
    while IFS= read -r line; do
        value=$(printf '%s\n' "$line" | sed -n 's/^[[:blank:]]*KUBELET_KUBEADM_ARGS[[:blank:]]*=//p' |
            sed "s/^[[:blank:]]*//; s/[[:blank:]]*\$//; s/^\"//; s/\"\$//; s/^'//; s/'\$//")
        [ -n "$value" ] || continue
        set -f
        # shellcheck disable=SC2086  # the flags' words, split as the kubelet's systemd unit splits them (no globbing)
        kube_from_args "$(printf '%s\n' $value)" /var/lib/kubelet/kubeadm-flags.env && { set +f; break; }
        set +f
    done <<KUBEADM_FLAGS
$text
KUBEADM_FLAGS
fi
if [ -z "$kube_runtime" ]; then
    for f in /var/lib/kubelet/config.yaml:containerRuntimeEndpoint /etc/crictl.yaml:runtime-endpoint; do
        kube_key "${f%%:*}" "${f#*:}"
        if [ -n "$kube_value" ] && kube_valid "$kube_value" "${f%%:*}: ${f#*:}"; then
            kube_set "$kube_value" "${f%%:*}"; break
        fi
    done
fi
if [ -z "$kube_runtime" ]; then
    k3s=/run/k3s/containerd/containerd.sock; microk8s=/var/snap/microk8s/common/run/containerd.sock
    if [ -e "$k3s" ]; then kube_set "unix://$k3s" "k3s/RKE2's containerd socket, $k3s" containerd
    elif [ -e "$microk8s" ]; then kube_set "unix://$microk8s" "MicroK8s's containerd socket, $microk8s" containerd; fi
fi
kube_address=${kube_endpoint#unix://}
follows=""
case "$runtime:$kube_runtime" in auto:containerd|auto:docker) runtime=$kube_runtime; follows=1 ;; esac
[ -n "$address" ] || { [ "$kube_runtime" = containerd ] && address=$kube_address; } || address=/run/containerd/containerd.sock
# where the images go when that is not where the kubelet reads them: said, then done as asked
elsewhere=""
case "$kube_runtime" in
    '') ;;
    containerd|docker)
        theirs="the kubelet reads images from $kube_runtime at $kube_endpoint (from $kube_source)"
        if [ "$runtime" != auto ] && [ "$runtime" != "$kube_runtime" ]; then
            elsewhere="$theirs, but --runtime $runtime sends them to $runtime"
        elif [ "$runtime" = containerd ] && [ "$address" != "$kube_address" ]; then
            elsewhere="$theirs, but this load goes to containerd at $address (CONTAINERD_ADDRESS)"
        elif [ "$runtime" = containerd ] && [ "$namespace" != k8s.io ]; then
            elsewhere="$theirs, namespace k8s.io, but this load goes to namespace $namespace (CONTAINERD_NAMESPACE)"
        fi ;;
    *) elsewhere="the kubelet uses $kube_runtime at $kube_endpoint (from $kube_source), which load.sh does not load into" ;;
esac
[ -z "$elsewhere" ] || echo "load.sh: warning: $elsewhere: Pods on this node will not find the images there" >&2

# The models as modelcar images (as imgtool load chooses, commands/load.py): --models image, or by default when the
# kubelet reads images from containerd and this load goes there (an image volume is what mounts a model there).
if [ -n "$models_target" ]; then
    car=1
elif [ "$model_count" -gt 0 ] && [ -z "$models_dir$no_models" ] && [ "$kube_runtime" = containerd ] && \
        [ "$runtime" = containerd ]; then
    if [ "$modelcars" -eq 0 ]; then
        echo "load.sh: the kubelet uses containerd, but this bundle does not carry the modelcar form of its models: not importing them" >&2
    elif [ "$compression" != none ]; then
        echo "load.sh: the kubelet uses containerd, but load.sh imports modelcar images from an uncompressed bundle only: not importing the models" >&2
    else
        car=1
        echo "load.sh: the kubelet uses containerd: importing the models as modelcar images (--models-dir DIR places the files)" >&2
    fi
fi
if [ -z "$car" ] && { [ "$image_count" -eq 0 ] || [ -n "$models_only" ]; }; then
    echo "load.sh: error: this bundle's models need --models-dir DIR (load.sh places into a plain directory) or --models image (containerd); nothing was placed" >&2
    exit 2
fi

if [ "$runtime" = auto ]; then
    skipped=""
    for candidate in docker containerd podman; do
        why=$(why_not "$candidate")
        if [ -z "$why" ]; then runtime=$candidate; break; fi
        skipped="$skipped${skipped:+, }$candidate: $why"
    done
    if [ "$runtime" = auto ]; then
        echo "load.sh: error: no container runtime to load into ($skipped); nothing was loaded" >&2
        echo "load.sh: start Docker, or set CONTAINERD_ADDRESS to containerd's socket, or install Podman (--runtime picks one)" >&2
        exit 5
    fi
else
    why=$(why_not "$runtime")
    because=""
    if [ -n "$follows" ] && [ "$runtime" = containerd ]; then because="the kubelet's, from $kube_source"
    elif [ -n "$follows" ]; then because="the kubelet's, through cri-dockerd at $kube_endpoint, from $kube_source"; fi
    if [ -n "$why" ] && [ -n "$follows" ]; then
        at=""; [ "$runtime" != containerd ] || at=" at $address"
        echo "load.sh: error: the kubelet's runtime does not answer: $runtime$at ($because): $why; nothing was loaded" >&2
        echo "load.sh: start it, or choose another runtime with --runtime (Pods will not find the images there)" >&2
        exit 5
    fi
    if [ -n "$why" ]; then
        echo "load.sh: error: cannot load into $runtime (--runtime or IMGTOOL_RUNTIME): $why; nothing was loaded" >&2
        exit 5
    fi
    skipped=$because
fi
case "$(uname -m)" in
    x86_64|amd64) arch=amd64; platform=linux/amd64 ;;
    aarch64|arm64|armv8*) arch=arm64; platform=linux/arm64 ;;
    armv7*|armhf) arch=arm; platform=linux/arm/v7 ;;
    i?86) arch=386; platform=linux/386 ;;
    loongarch64) arch=loong64; platform=linux/loong64 ;;
    *) arch=$(uname -m); platform=linux/$arch ;;
esac
case "$runtime" in
    docker) loader="docker load"; lacks="Docker"; where="docker" ;;
    containerd) loader="ctr images import"; lacks="containerd (namespace $namespace)"
        where="containerd at $address, namespace $namespace, platform $platform" ;;
    podman) loader="podman load"; lacks="Podman"; where="podman" ;;
esac
echo "load.sh: runtime: $where${skipped:+ ($skipped)}" >&2
if [ -n "$car" ] && [ "$runtime" != containerd ]; then
    echo "load.sh: error: load.sh imports modelcar images into containerd only, and this load goes to $runtime; nothing was loaded" >&2
    echo "load.sh: import them with $instead --models image, or place the files with --models-dir DIR" >&2
    exit 2
fi
if [ -n "$car" ] && { [ "$image_count" -eq 0 ] || [ -n "$models_only" ]; }; then  # the models alone, imported
    models_then_done
    exit 0
fi
load_into() {
    case "$runtime" in
        docker) run docker load ;;
        containerd) run ctr images import --platform "$platform" - ;;
        podman) run podman load ;;
    esac
}

# Whether a list holds an item: `has_items multiarch_tags`; whether one of its items is WORD: `holds arches WORD`.
has_items() {
    matched=""
    "$1" match_any
    [ -n "$matched" ]
}
match_any() { matched=1; }
holds() {
    wanted=$2
    matched=""
    "$1" match_wanted
    [ -n "$matched" ]
}
match_wanted() {
    case "$1" in "$wanted") matched=1 ;; esac
}

# ctr imports only the host's platform, and fails after the whole upload when the bundle has none ("image might be
# filtered out"): say so before.
if [ "$runtime" = containerd ] && ! holds arches "$arch"; then
    printf "load.sh: error: this bundle holds no image for this host's platform %s (it holds %s), and containerd imports only the host's; nothing was loaded\n" "$platform" "$platforms" >&2
    echo "load.sh: fetch it again with --arch $arch" >&2
    exit 1
fi

# zstd-compressed layers: Docker reads them only from 23.0 on; an older one fails with
# "archive/tar: invalid tar header" (vllm-ascend FAQ 19) after the whole upload. containerd (1.5+)
# and Podman read them.
if [ -n "$zstd_refs" ] && [ "$runtime" = docker ]; then
    server=$(bounded docker version --format '{{.Server.Version}}' 2>/dev/null)
    case "${server%%.*}" in
        ''|*[!0-9]*) echo "load.sh: warning: cannot read Docker's server version; this bundle has zstd-compressed layers, which need Docker 23.0 or later" >&2 ;;
        *) if [ "${server%%.*}" -lt 23 ]; then
            printf "load.sh: error: this bundle has zstd-compressed layers (%s), which Docker %s cannot read (it needs 23.0 or later; older ones fail with 'invalid tar header', vllm-ascend FAQ 19); nothing was loaded\n" "$zstd_refs" "$server" >&2
            echo "load.sh: $zstd_remedy" >&2
            exit 5
        fi ;;
    esac
fi

# A delta bundle: some layer files are left out because the runtime should already hold them;
# any one image of each list provides them (containerd: their layers, unpacked).
lacking() {
    printf 'load.sh: error: this is a delta bundle and %s lacks %s; load that image (its bundle) first\n' "$lacks" "$1" >&2
    exit 1
}
has_one_of() {
    for base in "$@"; do
        case "$runtime" in
            podman) bounded podman image exists "$base" ;;
            *) bounded docker image inspect "$base" ;;
        esac >/dev/null 2>&1 && return 0
    done
    return 1
}
has_chain() {
    bounded ctr snapshots info "$1" >/dev/null 2>&1
}
needs_one_of() {  # $1: what provides the layers, in words; then the images that do
    what=$1
    shift
    has_one_of "$@" || lacking "$what"
}
needs_chain() {  # $1: what provides the layers, in words; $2: the chain ID of the deepest
    has_chain "$2" || lacking "$1"
}
# A snapshot keeps its parents: per image, the deepest left-out chain stands for all below it.
if [ "$runtime" = containerd ]; then
    base_chains needs_chain
else
    base_images needs_one_of
fi

# A tag held for several architectures: load.sh names the host's one after the load, by image ID. Docker's
# containerd image store knows images by manifest digest, and load.sh names the platform of such a tag by config
# digest (bundles before format version 3 even gave every platform the one name, and that store then failed to
# unpack the host's); ctr imports only the images index.json names, and such a tag is unnamed there (ctr would
# import nothing, and say nothing). Both are refused before a byte is sent, pointing at imgtool, which sends and
# names one platform.
if [ -n "$multiarch_refs" ]; then
    if [ "$runtime" = docker ] && \
            bounded docker info --format '{{json .DriverStatus}}' 2>/dev/null | grep -q io.containerd.snapshotter; then
        printf 'load.sh: error: this bundle holds %s for several architectures, and load.sh cannot load and name the right one in the containerd image store of this Docker (that store knows images by manifest digest, load.sh names them by config digest); nothing was loaded\n' "$multiarch_refs" >&2
        echo "load.sh: run instead, in this directory: $instead   (it loads this host's architecture only)" >&2
        exit 5
    fi
    if [ "$runtime" = containerd ]; then
        printf "load.sh: error: this bundle holds %s for several architectures, and load.sh cannot load and name the right one in containerd (ctr imports only the images the archive names, and these are unnamed there so that no platform takes another's name); nothing was loaded\n" "$multiarch_refs" >&2
        echo "load.sh: run instead, in this directory: $instead   (it loads this host's architecture only)" >&2
        exit 5
    fi
fi

# Room where the runtime keeps images, against what this load writes there, by the rules (and in the words) of
# imgtool load (imgtool/bundle/hostcheck.py): Docker's graphdriver store unpacks the whole archive under
# <root>/tmp before it registers the layers it lacks; the containerd store (containerd, Docker's containerd
# image store) keeps the compressed layers and unpacks them into snapshots; Podman loads from a copy of the
# archive in its staging dir ($TMPDIR, else /var/tmp) and copies the layers there twice more. A layer of an image
# the runtime holds (containerd: a snapshot of its chain) is not counted. Where the root cannot be measured from
# here, it says so and loads.
layers() {
    printf '%s\n' "$layer_table"
}
free_k() { df -kP "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'; }
mount_of() { df -kP "$1" 2>/dev/null | awk 'NR == 2 { print $6 }'; }
held=""; store=""; root=""; nocheck=""
case "$runtime" in
    containerd)
        title=containerd; store=containerd; advice=$(printf '%s' "$advice_containerd" | sed "s|@NAMESPACE@|$namespace|")
        root=$(bounded ctr plugins ls --detailed 2>/dev/null | awk '
            $1 == "ID:" { id = $2 } $1 == "root" && id == "content" && !found { found = 1; print $2 }')
        root=${root%/*}
        held=$(bounded ctr snapshots ls 2>/dev/null | awk 'NR > 1 { print $1 }') ;;
    docker)
        title=Docker; advice=$advice_docker
        case "${DOCKER_HOST:-} $DOCKER" in *tcp://*|*ssh://*|*http://*|*https://*) nocheck="the daemon is not on this host" ;; esac
        root=$(bounded docker info --format '{{.DockerRootDir}}' 2>/dev/null)
        if bounded docker info --format '{{json .DriverStatus}}' 2>/dev/null | grep -q io.containerd.snapshotter; then store=containerd; fi
        for id in $image_ids; do
            if bounded docker image inspect "$id" >/dev/null 2>&1; then held="$held$id
"; fi
        done ;;
    podman)
        title=Podman; advice=$advice_podman
        root=$(bounded podman info --format '{{.Store.GraphRoot}}' 2>/dev/null)
        while [ -n "$root" ] && [ ! -d "$root" ] && [ "${root%/*}" != "$root" ]; do root=${root%/*}; root=${root:-/}; done
        for id in $image_ids; do
            if bounded podman image exists "$id" >/dev/null 2>&1; then held="$held$id
"; fi
        done ;;
esac
stage=${TMPDIR:-/var/tmp}
if [ -z "$nocheck" ] && { [ -z "$root" ] || [ ! -d "$root" ]; }; then
    nocheck="${root:-its root} is not a directory here"
fi
free=""; stage_free=""; same_fs=1
if [ -z "$nocheck" ]; then
    free=$(free_k "$root")
    [ -n "$free" ] || nocheck="df cannot measure $root"
    if [ "$runtime" = podman ] && [ -d "$stage" ] && [ "$(mount_of "$stage")" != "$(mount_of "$root")" ]; then
        same_fs=""; stage_free=$(free_k "$stage")
    fi
fi
verdict=$(layers | KIND=$runtime STORE=$store TITLE=$title ROOT=${root:-its root} STAGE=$stage FREE_K=$free \
    STAGE_FREE_K=$stage_free SAME_FS=$same_fs HELD=$held awk -v tar="$tar_size" -v copies="$podman_copies" '
    function size(n,   v, i, u) {
        if (n < 1024) return sprintf("%d B", n)
        split("KiB MiB GiB", u, " "); v = n
        for (i = 1; i <= 3; i++) { v = v / 1024; if (v < 1024) return sprintf("%.1f %s", v, u[i]) }
        return sprintf("%.1f TiB", v / 1024)
    }
    BEGIN { n = split(ENVIRON["HELD"], h, "\n"); for (i = 1; i <= n; i++) if (h[i] != "") have[h[i]] = 1 }
    { mine = 0; k = split($4, ids, ","); for (i = 1; i <= k; i++) if (ids[i] in have) mine = 1
      if (($1 in have) || mine) { held++; next }
      kept += $2; unpacked += $3 }
    END {
        title = ENVIRON["TITLE"]; root = ENVIRON["ROOT"]; staged = 0
        podman = "the copy of the archive Podman loads from and the two Podman makes of its layers"
        if (ENVIRON["STORE"] == "containerd") {
            how = size(kept) " of compressed layers kept in the content store + "
            how = how size(unpacked) " unpacked into snapshots"
            staged = kept
        } else if (ENVIRON["KIND"] == "podman") {
            if (ENVIRON["SAME_FS"] != "") staged = copies * tar
            how = (staged ? size(staged) " in " ENVIRON["STAGE"] " for " podman " + " : "") size(unpacked) " unpacked"
        } else {
            staged = tar
            how = size(staged) " for the archive " title " unpacks into " root "/tmp before it registers the layers + "
            how = how size(unpacked) " unpacked"
        }
        if (held == 1) how = how "; 1 layer " title " holds already is not unpacked again"
        if (held > 1) how = how "; " held " layers " title " holds already are not unpacked again"
        need = staged + unpacked
        how = "the bundle needs about " size(need) " (" how ")"
        free = ENVIRON["FREE_K"] * 1024; stage_free = ENVIRON["STAGE_FREE_K"] * 1024
        if (ENVIRON["FREE_K"] == "") { print "nocheck"; print how }
        else if (ENVIRON["STAGE_FREE_K"] != "" && stage_free < copies * tar) {
            print "stagefail"
            print "not enough space for " title "\047s copy of the archive in " ENVIRON["STAGE"] ": it needs " \
                size(copies * tar) " (" podman "), " size(stage_free) " is free"
        } else if (free < need) { print "fail"; print "not enough space for " title " under " root ": " how ", " size(free) " is free" }
        else { print "ok"; print how }
    }')
nl='
'
status=${verdict%%"$nl"*}
verdict=${verdict#*"$nl"}
case "$status" in
    nocheck) echo "load.sh: warning: cannot check free space for $title (${nocheck:-df cannot measure ${root:-its root}}); $verdict" >&2 ;;
    fail|stagefail)
        [ "$status" = fail ] || advice=$staging_advice
        if [ -n "$force" ]; then
            echo "load.sh: warning: $verdict (--force: trying anyway)" >&2
        else
            echo "load.sh: error: $verdict; nothing was loaded" >&2
            echo "load.sh: $advice; or pass --force to try anyway" >&2
            exit 1
        fi ;;
esac

if [ "$runtime" = containerd ]; then  # what was there before: a failed import removes only what it recorded
    images_before=$(bounded ctr images ls -q 2>/dev/null)
    blobs_before=$(bounded ctr content ls -q 2>/dev/null)
fi

cat_part() { cat -- "$1"; }
unpack() {
    case "$compression" in
        gzip) gzip -dc ;;
        zstd) zstd -dc ;;
    esac
}
images_only() {  # the images' members, then the tar's end blocks: no model byte reaches the runtime
    if [ "$model_count" -eq 0 ]; then cat; return; fi
    head -c "$images_end"
    dd if=/dev/zero bs=1024 count=1 2>/dev/null
}
echo "load.sh: loading $image_count image(s) into $runtime ..." >&2
if [ "$compression" = none ]; then
    parts cat_part | images_only | load_into
else
    parts cat_part | unpack | images_only | load_into
fi
status=$?
if [ "$status" -ne 0 ]; then
    echo "load.sh: error: $loader failed (exit $status)" >&2
    [ "$runtime" != containerd ] || forget
    exit "$status"
fi

# Pinned: the CRI plugin (containerd 1.7+) reports images labelled $pinned_label as pinned, and the
# kubelet's image GC leaves them (an air-gapped node cannot pull them back); --no-pin leaves them as they are.
if [ "$runtime" = containerd ] && [ -z "$no_pin" ]; then
    rows=$(bounded ctr images ls 2>/dev/null | awk -v ids="$manifests" '
        BEGIN { n = split(ids, a, " "); for (i = 1; i <= n; i++) mine[a[i]] = 1 }
        NR > 1 && ($3 in mine) { print $1 }')
    set -f
    for name in $rows; do  # every name of the image (the CRI's sha256:<config> one too), as imgtool pins
        if ! said=$(bounded ctr images label "$name" "$pinned_label" 2>&1 >/dev/null); then
            set +f
            echo "load.sh: error: cannot pin $name (ctr images label: $said); the image is loaded, not pinned" >&2
            exit 5
        fi
    done
    set +f
    pinned=$(printf '%s\n' "$rows" | grep -v -e '^sha256:' -e @ | tr '\n' ' ' | sed 's/ *$//; s/ /, /g')
    [ -z "$pinned" ] || echo "load.sh: pinned: $pinned ($pinned_label: the kubelet's image GC keeps them on containerd 1.7+)" >&2
fi

# This bundle holds some tags for several architectures; the load left them unnamed.
# Name the one matching this Docker or Podman (the others stay as unnamed images: docker image prune,
# podman image prune).
tag_image() {
    case "$runtime" in
        podman) run podman tag "$1" "$2" ;;
        *) run docker tag "$1" "$2" ;;
    esac
}
tag_if_this_arch() {  # $1: an architecture, $2: an image ID, $3: its tag
    case "$1" in "$arch") tagged=1; tag_image "$2" "$3" || exit 5 ;; esac
}
if has_items multiarch_tags; then
    if [ "$runtime" = podman ]; then
        arch=$(bounded podman info --format '{{.Host.Arch}}' 2>/dev/null)
    else
        arch=$(bounded docker version --format '{{.Server.Arch}}' 2>/dev/null)
    fi
    tagged=""
    multiarch_tags tag_if_this_arch
    [ -n "$tagged" ] || echo "load.sh: warning: this bundle has no image for the $runtime architecture $arch; nothing was named" >&2
fi
models_then_done
