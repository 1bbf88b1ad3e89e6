"""The two files of a bundle meant for people and plain shells: load.sh and README.txt."""

from typing import Dict, List, Sequence

from .. import __version__
from ..delta import describe_requirements, requirements
from ..model import FAT32_MAX, format_size
from ..sshsig import NAMESPACE
from ..text import for_terminal, sh_quote
from . import loadsh
from .format import BUNDLE_JSON, LOAD_SH, SHA256SUMS, SIGNATURE, TOOL_PYZ, BundleImage, BundleIndex
from .hostcheck import zstd_layer_refs

_DECOMPRESS = {"none": None, "gzip": "gzip -dc", "zstd": "zstd -dc"}
#: what to do about zstd layers on Docker before 23.0 (load.sh, load, doctor)
ZSTD_REMEDY = ("upgrade Docker to 23.0 or later, or fetch the image again with imgtool fetch --layers compat "
               "(the default), which rewrites zstd layers as gzip: this bundle kept the registry's zstd bytes")


def load_sh(index: BundleIndex) -> bytes:
    """A POSIX sh loader for hosts without Python: check SHA256SUMS, then cat parts | docker load (or
    ctr images import, or podman load).

    Every value of bundle.json reaches the script through `text.sh_quote` (or is an int), and only where the
    script needs it: a value is data to sh, never code (docs/security.md)."""
    parts = " ".join(sh_quote(p.name) for p in index.parts)
    sizes = "\n".join(f"check_size {sh_quote(p.name)} {int(p.size)}" for p in index.parts)
    decompress = _DECOMPRESS[index.archive.compression]
    tool = decompress.split()[0] if decompress else ""
    need_tool = "" if not decompress else f"""
if ! command -v {tool} >/dev/null 2>&1; then
    echo "load.sh: error: {tool} is not installed; the archive is {index.archive.compression}-compressed" >&2
    echo "load.sh: install {tool}, or use: imgtool load \\"$here\\"" >&2
    exit 1
fi
"""
    pipe = f"cat -- {parts} | {decompress} | load_into" if decompress else f"cat -- {parts} | load_into"
    text = f"""#!/bin/sh
# Load this imgtool bundle into Docker, containerd or Podman on a host without Python or imgtool.
# Written by imgtool {__version__}. README.txt and bundle.json list the images.
set -u

usage() {{
    cat <<'EOF'
usage: sh load.sh [--runtime docker|containerd|podman] [--no-pin] [--force] [--help]

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

{_ways(index, "en")}

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
可用 DOCKER、CTR、PODMAN 变量改变调用方式，例如 DOCKER="sudo docker" sh load.sh
签名的镜像包：有 allowed_signers 策略时（与 imgtool 相同的查找顺序：$IMGTOOL_SIGNERS、
~/.config/imgtool/allowed_signers、/etc/imgtool/allowed_signers），先用 `ssh-keygen -Y verify` 校验
bundle.json.sig，并按已签名的 bundle.json 校验每个文件；未签名、签名无效或签名密钥不在文件中时拒绝导入
（退出码 3）；没有策略时，已有的签名也必须有效。
本脚本只能防范损坏：能改动镜像包的人也能改动 load.sh（和 imgtool.pyz）。要防范被改动的镜像包，
请用主机上安装好的 imgtool 导入（见 README.txt “谁来校验镜像包”）：imgtool load .

{_ways(index, "zh")}
EOF
}}

runtime=${{IMGTOOL_RUNTIME:-auto}}
no_pin=""
force=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --no-pin) no_pin=1; shift ;;
        --force) force=1; shift ;;
        --runtime=*) runtime=${{1#--runtime=}}; shift ;;
        --runtime)
            if [ $# -lt 2 ]; then echo "load.sh: error: --runtime needs a value: docker, containerd or podman" >&2; exit 2; fi
            runtime=$2; shift 2 ;;
        *) echo "load.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
case "$runtime" in
    auto|docker|containerd|podman) ;;
    *) echo "load.sh: error: unknown runtime '$runtime' (--runtime or IMGTOOL_RUNTIME): docker, containerd, podman or auto" >&2
       exit 2 ;;
esac

here=$(dirname "$0")
# The allowed_signers policy, found as imgtool finds it: $IMGTOOL_SIGNERS, then the user's
# ~/.config/imgtool/allowed_signers, then the site's /etc/imgtool/allowed_signers.
signers=${{IMGTOOL_SIGNERS:-}}
if [ -n "$signers" ]; then
    case "$signers" in /*) ;; *) signers="$(pwd)/$signers" ;; esac
    if [ ! -f "$signers" ]; then
        echo "load.sh: error: \\$IMGTOOL_SIGNERS $signers: no such file" >&2
        echo "load.sh: an OpenSSH allowed_signers file: one line per key, NAME KEYTYPE BASE64" >&2
        exit 2
    fi
else
    for f in "${{HOME:+$HOME/.config/imgtool/allowed_signers}}" /etc/imgtool/allowed_signers; do
        [ -n "$f" ] || continue
        if [ -f "$f" ]; then signers=$f; break; fi
        if [ -e "$f" ] || [ -L "$f" ]; then
            echo "load.sh: error: $f is not a regular file (an allowed_signers policy must be one)" >&2
            exit 2
        fi
    done
fi
cd "$here" || exit 1
DOCKER=${{DOCKER:-docker}}
CTR=${{CTR:-ctr}}
PODMAN=${{PODMAN:-podman}}
address=${{CONTAINERD_ADDRESS:-}}  # else the kubelet's, else /run/containerd/containerd.sock
namespace=${{CONTAINERD_NAMESPACE:-k8s.io}}

# Nothing is read that is not a regular file: a FIFO, or a link to /dev/zero, would be read forever.
not_regular() {{
    echo "load.sh: error: $1 is not a regular file; re-copy it from the source medium; nothing was loaded" >&2
    exit 3
}}
for f in {BUNDLE_JSON} {SHA256SUMS} {SIGNATURE}; do
    if [ -e "$f" ] || [ -L "$f" ]; then [ -f "$f" ] || not_regular "$f"; fi
done
check_size() {{
    if [ -e "$1" ] || [ -L "$1" ]; then
        [ -f "$1" ] || not_regular "$1"
        size=$(ls -lnL -- "$1" | awk '{{ print $5 }}')
        if [ "$size" != "$2" ]; then
            echo "load.sh: error: $1 is $size bytes, {BUNDLE_JSON} says $2; re-copy it from the source medium; nothing was loaded" >&2
            exit 3
        fi
    fi
}}
{sizes}
if [ -f {SHA256SUMS} ]; then
    while read -r sum name; do
        name=${{name#\\*}}
        if [ -e "$name" ] || [ -L "$name" ]; then [ -f "$name" ] || not_regular "$name"; fi
    done <{SHA256SUMS}
fi
{_signature_check()}{loadsh.sums_choice(index)}
if [ -z "$sums_file" ]; then
    :  # a signed bundle: every file was checked against the signed {BUNDLE_JSON}
elif command -v sha256sum >/dev/null 2>&1; then
    [ "$sums_file" = - ] || echo "load.sh: checking the files against {SHA256SUMS} ..." >&2
    bad=$(printf '%s\n' "${{sums:-}}" | sha256sum -c "$sums_file" 2>/dev/null | grep -v ': OK$')
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
{need_tool}{_RUNTIME_CHOICE}{_platform_check(index)}{_zstd_layers_check(index)}{_base_check(index)}{_multiarch_check(index)}{loadsh.space_check(index)}{loadsh.forget()}{loadsh.before_import()}
echo "load.sh: loading {len(index.images)} image(s) into $runtime ..." >&2
{pipe}
status=$?
if [ "$status" -ne 0 ]; then
    echo "load.sh: error: $loader failed (exit $status)" >&2
    [ "$runtime" != containerd ] || forget
    exit "$status"
fi
{loadsh.pin(index)}{_tag_multiarch(index)}echo "load.sh: done" >&2
"""
    return text.encode()


_SIGNATURE_CHECK = r"""
# Signed bundles: under an allowed_signers policy, bundle.json must carry a good signature by a key
# listed there; without one, a signature that is there must still be good (as imgtool checks it). A
# good signature makes every file answer to the signed bundle.json (SHA256SUMS is not signed).
refuse() {
    echo "load.sh: error: $1; nothing was loaded" >&2
    [ -z "${2:-}" ] || echo "load.sh: $2" >&2
    exit 3
}
signed=""
if [ -z "$signers" ] && [ -f @SIG@ ]; then
    if command -v ssh-keygen >/dev/null 2>&1; then
        if ! found=$(ssh-keygen -Y check-novalidate -n @NS@ -s @SIG@ <@JSON@ 2>/dev/null); then
            why=$(ssh-keygen -Y check-novalidate -n @NS@ -s @SIG@ <@JSON@ 2>&1 >/dev/null | tr -d '\r' | tail -n 1)
            refuse "bad signature: @SIG@ does not match @JSON@ or is not an imgtool bundle signature (ssh-keygen: $why)" \
                "copy @JSON@ and @SIG@ again from the source medium"
        fi
        echo "load.sh: @JSON@ is signed by $(printf '%s\n' "$found" | sed 's/.* with //') (good signature; no allowed_signers policy here, so who signed was not checked)" >&2
        signed=1
    else
        echo "load.sh: warning: @SIG@ was not checked: ssh-keygen not found (no allowed_signers policy here, so this is not a refusal)" >&2
    fi
fi
if [ -n "$signers" ]; then
    [ -r "$signers" ] || refuse "$signers cannot be read"
    command -v ssh-keygen >/dev/null 2>&1 || \
        refuse "cannot check @SIG@: ssh-keygen not found, and $signers requires a signature" \
            "install OpenSSH's client tools (openssh-client / openssh), which bring ssh-keygen"
    [ -f @SIG@ ] || refuse "not signed (no @SIG@), and $signers requires a signature by a key it lists" \
        "sign it where it was made: imgtool sign DIR --sign-key KEY"
    signer=""
    set -f
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line#"${line%%[! 	]*}"}
        case "$line" in ''|'#'*) continue ;; esac
        names=$(printf '%s\n' "${line%%[ 	]*}" | tr -d '"')
        old_ifs=$IFS
        IFS=,
        for name in $names; do
            case "$name" in ''|'!'*) continue ;; esac
            if ssh-keygen -Y verify -f "$signers" -I "$name" -n @NS@ -s @SIG@ <@JSON@ >/dev/null 2>&1; then
                signer=$name
                break
            fi
        done
        IFS=$old_ifs
        [ -z "$signer" ] || break
    done <"$signers"
    set +f
    if [ -z "$signer" ]; then
        if found=$(ssh-keygen -Y check-novalidate -n @NS@ -s @SIG@ <@JSON@ 2>/dev/null); then
            refuse "signed by a key not in $signers: $(printf '%s\n' "$found" | sed 's/.* with //')" \
                "if that key is your release engineer's, add its public key to $signers"
        fi
        why=$(ssh-keygen -Y check-novalidate -n @NS@ -s @SIG@ <@JSON@ 2>&1 >/dev/null | tr -d '\r' | tail -n 1)
        refuse "bad signature: @SIG@ does not match @JSON@ or is not an imgtool bundle signature (ssh-keygen: $why)" \
            "copy @JSON@ and @SIG@ again from the source medium"
    fi
    echo "load.sh: @JSON@ is signed by $signer ($signers)" >&2
    signed=1
fi
if [ -n "$signed" ]; then
    command -v sha256sum >/dev/null 2>&1 || refuse "sha256sum not found: cannot check the files against the signed @JSON@"
    sums=$(awk '/^  "(parts|files)": \[/ { s = 1; next } /^  []]/ { s = 0 }
        s && /"name": "/ { n = $2; gsub(/[",]/, "", n) }
        s && /"sha256": "/ { h = $2; gsub(/[",]/, "", h); print h "  " n }' @JSON@)
    bad=$(printf '%s\n' "$sums" | sha256sum -c - 2>/dev/null | grep -v ': OK$')
    if [ -n "$bad" ] || [ -z "$sums" ]; then
        echo "load.sh: error: these files do not match the signed @JSON@:" >&2
        printf '%s\n' "${bad:-    (no files listed)}" | sed 's/^/    /' >&2
        refuse "the bundle was changed after it was signed" "re-copy them from the source medium, then run load.sh again"
    fi
fi
"""


def _signature_check() -> str:
    return _SIGNATURE_CHECK.replace("@SIG@", SIGNATURE).replace("@JSON@", BUNDLE_JSON).replace("@NS@", NAMESPACE)


_RUNTIME_CHOICE_SH = r"""
# The runtime: Docker when its daemon answers, else containerd (a Kubernetes node) when ctr and its
# socket are there, else Podman; --runtime / IMGTOOL_RUNTIME names one. Every question asked of a
# runtime has a time limit (where coreutils' timeout is there); the load itself has none, as docker load.
bounded() {
    if command -v timeout >/dev/null 2>&1; then timeout 60 "$@"; else "$@"; fi
}
# containerd is asked first what imgtool asks it first, `ctr version`, within imgtool's 30 s (ctr itself gives up
# on a socket that accepts and never answers after 10 s, as under imgtool), in imgtool's words: a socket that does
# not answer is said once, not met again by every later question (each of which would wait 10 s more).
ctr_answers() {
    if command -v timeout >/dev/null 2>&1; then
        said=$(timeout 30 $CTR -a "$address" -n "$namespace" version 2>&1 >/dev/null)
    else
        said=$($CTR -a "$address" -n "$namespace" version 2>&1 >/dev/null)
    fi
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
            elif ! bounded $DOCKER version >/dev/null 2>&1; then echo "its daemon does not answer"; fi ;;
        containerd)
            if ! command -v "${CTR%% *}" >/dev/null 2>&1; then echo "no ctr command"
            elif [ ! -S "$address" ]; then echo "no socket at $address"
            else ctr_answers; fi ;;
        podman)
            command -v "${PODMAN%% *}" >/dev/null 2>&1 || echo "not installed" ;;
    esac
}
@KUBELET@
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
load_into() {
    case "$runtime" in
        docker) $DOCKER load ;;
        containerd) $CTR -a "$address" -n "$namespace" images import --platform "$platform" - ;;
        podman) $PODMAN load ;;
    esac
}
"""


_RUNTIME_CHOICE = _RUNTIME_CHOICE_SH.replace("@KUBELET@", loadsh.KUBELET)


def _platform_check(index: BundleIndex) -> str:
    """ctr imports only the host's platform, and fails after the whole upload when the bundle has none
    ("image might be filtered out"): say so before."""
    arches = sorted({im.platform.architecture for im in index.images})
    held = ", ".join(sorted({str(im.platform) for im in index.images}))
    return f"""
if [ "$runtime" = containerd ]; then
    held={sh_quote(held)}
    case "$arch" in
        {"|".join(sh_quote(a) for a in arches)}) ;;
        *) printf "load.sh: error: this bundle holds no image for this host's platform %s (it holds %s), and containerd imports only the host's; nothing was loaded\\n" "$platform" "$held" >&2
           echo "load.sh: fetch it again with --arch $arch" >&2
           exit 1 ;;
    esac
fi
"""


def has_tool(index: BundleIndex) -> bool:
    """Whether the bundle carries imgtool.pyz (fetch without --no-tool)."""
    return any(f.name == TOOL_PYZ for f in index.files)


def _ways(index: BundleIndex, lang: str, indent: str = "") -> str:
    """The three ways to load, run in the bundle directory (load.sh --help, README.txt)."""
    if lang == "zh":
        pyz = f"任何 python3 3.7+，无需安装（本目录中的 {TOOL_PYZ}）" if has_tool(index) else \
            "本镜像包未附带（打包时用了 --no-tool）；`imgtool self-bundle` 可单独生成"
        lines = ["三种导入方式（在本目录中执行）：",
                 "  imgtool load .               主机上安装好的 imgtool：能拒绝被改动的镜像包",
                 f"  python3 {TOOL_PYZ} load .   " + pyz + "：只防损坏",
                 "  sh load.sh                   只需 sh、sha256sum、cat 和 docker、ctr 或 podman：只防损坏",
                 "前两种边送入 Docker 边校验每个分卷和 blob，遇到第一处不符即中断上传，Docker 不保留任何内容。",
                 f"镜像包自带的 load.sh 和 {TOOL_PYZ} 可以和镜像包一起被改动：它们只能发现损坏，发现不了改动。"]
        if has_tool(index):
            lines.append(f"python3 3.7+ 上 {TOOL_PYZ} 还可 verify、run-flags、run，以及 push 到站内镜像仓库；fetch 需要 3.9+。")
    else:
        pyz = f"any python3 3.7+, nothing to install ({TOOL_PYZ} is in this directory)" if has_tool(index) else \
            "not in this bundle (made with --no-tool); `imgtool self-bundle` writes one"
        lines = ["Three ways to load it (run them in this directory):",
                 "  imgtool load .               the host's installed imgtool: refuses an edited bundle",
                 f"  python3 {TOOL_PYZ} load .   " + pyz + ": damage only",
                 "  sh load.sh                   needs only sh, sha256sum, cat and docker, ctr or podman: damage only",
                 "The first two check every part and blob while they stream them into Docker and cut the",
                 "upload at the first mismatch: Docker keeps nothing.",
                 f"The bundle's own load.sh and {TOOL_PYZ} can be edited along with the bundle: they find",
                 "damage, not an edit."]
        if has_tool(index):
            lines.append(f"On python3 3.7+ {TOOL_PYZ} also verifies, prints run flags, runs, and pushes to a site "
                         "registry; fetch needs 3.9+.")
    return "\n".join(indent + line for line in lines)


def _multiarch_refs(index: BundleIndex) -> List[str]:
    """The tags this bundle holds for several architectures."""
    seen: dict = {}
    for im in index.images:
        seen.setdefault(im.ref, []).append(im)
    return [ref for ref, ims in seen.items() if len(ims) > 1]


def _zstd_layers_check(index: BundleIndex) -> str:
    """Docker before 23.0 reads a zstd layer as a plain tar and fails with FAQ 19's `invalid tar header`
    after the upload: refuse before docker load, saying why and what to do (containerd 1.5+ and Podman
    read zstd layers)."""
    refs = zstd_layer_refs(index)
    if not refs:
        return ""
    return f"""
# zstd-compressed layers: Docker reads them only from 23.0 on; an older one fails with
# "archive/tar: invalid tar header" (vllm-ascend FAQ 19) after the whole upload. containerd (1.5+)
# and Podman read them.
if [ "$runtime" = docker ]; then
    server=$(bounded $DOCKER version --format '{{{{.Server.Version}}}}' 2>/dev/null)
    case "${{server%%.*}}" in
        ''|*[!0-9]*) echo "load.sh: warning: cannot read Docker's server version; this bundle has zstd-compressed layers, which need Docker 23.0 or later" >&2 ;;
        *) if [ "${{server%%.*}}" -lt 23 ]; then
            printf "load.sh: error: this bundle has zstd-compressed layers (%s), which Docker %s cannot read (it needs 23.0 or later; older ones fail with 'invalid tar header', vllm-ascend FAQ 19); nothing was loaded\\n" {sh_quote(", ".join(refs))} "$server" >&2
            echo "load.sh: {ZSTD_REMEDY}" >&2
            exit 5
        fi ;;
    esac
fi
"""


def _multiarch_check(index: BundleIndex) -> str:
    """Docker's containerd image store knows images by manifest digest, and load.sh names the platform of
    such a tag by config digest (bundles before format version 3 even gave every platform the one name,
    and that store then failed to unpack the host's); ctr imports only the images index.json names, and
    such a tag is unnamed there (ctr would import nothing, and say nothing). Refuse both before a byte is
    sent, and point at imgtool, which sends and names one platform."""
    refs = _multiarch_refs(index)
    if not refs:
        return ""
    how = f"python3 {TOOL_PYZ} load ." if has_tool(index) else "imgtool load ."
    return f"""
# A tag held for several architectures: load.sh names the host's one after the load, by image ID.
multiarch={sh_quote(", ".join(refs))}
if [ "$runtime" = docker ] && \\
        bounded $DOCKER info --format '{{{{json .DriverStatus}}}}' 2>/dev/null | grep -q io.containerd.snapshotter; then
    printf 'load.sh: error: this bundle holds %s for several architectures, and load.sh cannot load and name the right one in the containerd image store of this Docker (that store knows images by manifest digest, load.sh names them by config digest); nothing was loaded\\n' "$multiarch" >&2
    echo "load.sh: run instead, in this directory: {how}   (it loads this host's architecture only)" >&2
    exit 5
fi
if [ "$runtime" = containerd ]; then
    printf "load.sh: error: this bundle holds %s for several architectures, and load.sh cannot load and name the right one in containerd (ctr imports only the images the archive names, and these are unnamed there so that no platform takes another's name); nothing was loaded\\n" "$multiarch" >&2
    echo "load.sh: run instead, in this directory: {how}   (it loads this host's architecture only)" >&2
    exit 5
fi
"""


def _tag_multiarch(index: BundleIndex) -> str:
    """A tag held for several architectures has no RepoTags in manifest.json: name the runtime's one here
    (Docker with a graphdriver, Podman: both know the image by its config digest)."""
    by_ref: Dict[str, List[BundleImage]] = {}
    for im in index.images:
        by_ref.setdefault(im.ref, []).append(im)
    multi = {ref: ims for ref, ims in by_ref.items() if len(ims) > 1 and ims[0].repo_tag}
    if not multi:
        return ""
    lines = ["# This bundle holds some tags for several architectures; the load left them unnamed.",
             "# Name the one matching this Docker or Podman (the others stay as unnamed images: docker image prune,",
             "# podman image prune).",
             'if [ "$runtime" = podman ]; then',
             "    arch=$(bounded $PODMAN info --format '{{.Host.Arch}}' 2>/dev/null)",
             "    tag_image() { $PODMAN tag \"$1\" \"$2\"; }",
             "else",
             "    arch=$(bounded $DOCKER version --format '{{.Server.Arch}}' 2>/dev/null)",
             "    tag_image() { $DOCKER tag \"$1\" \"$2\"; }",
             "fi",
             'case "$arch" in']
    for arch in sorted({im.platform.architecture for ims in multi.values() for im in ims}):
        cmds = [f"tag_image {sh_quote(im.image_id)} {sh_quote(im.repo_tag)}" for ims in multi.values() for im in ims
                if im.platform.architecture == arch]
        lines.append(f"    {sh_quote(arch)}) {' && '.join(cmds)} || exit 5 ;;")
    lines.append('    *) echo "load.sh: warning: this bundle has no image for the $runtime architecture $arch; '
                 'nothing was named" >&2 ;;')
    lines.append("esac")
    return "\n".join(lines) + "\n"


def _base_check(index: BundleIndex) -> str:
    """For a delta bundle: refuse unless the runtime has the images its omitted layers come from (containerd:
    their unpacked layers, snapshots named by chain ID; ctr would record the image, then fail to unpack it)."""
    if not index.is_delta:
        return ""
    def what(names: Sequence[str]) -> str:
        return sh_quote(describe_requirements([tuple(names)]))

    checks = []
    for names in requirements(index.omitted_chains()):
        quoted = " ".join(sh_quote(n) for n in names)
        checks.append(f'    has_one_of {quoted} || lacking {what(names)}')
    # A snapshot keeps its parents: per image, the deepest left-out chain stands for all below it.
    chains = []
    for im in index.images:
        omitted = [x for x in im.layers if x.omitted and x.chain_id is not None]
        if omitted and (omitted[-1].chain_id, omitted[-1].provided_by) not in chains:
            chains.append((omitted[-1].chain_id, omitted[-1].provided_by))
    snapshots = "\n".join(f'    has_chain {sh_quote(chain)} || lacking {what(names)}' for chain, names in chains)
    body = "\n".join(checks)
    return f"""
# A delta bundle: some layer files are left out because the runtime should already hold them;
# any one image of each list provides them (containerd: their layers, unpacked).
lacking() {{
    printf 'load.sh: error: this is a delta bundle and %s lacks %s; load that image (its bundle) first\\n' "$lacks" "$1" >&2
    exit 1
}}
has_one_of() {{
    for base in "$@"; do
        case "$runtime" in
            podman) bounded $PODMAN image exists "$base" ;;
            *) bounded $DOCKER image inspect "$base" ;;
        esac >/dev/null 2>&1 && return 0
    done
    return 1
}}
has_chain() {{
    bounded $CTR -a "$address" -n "$namespace" snapshots info "$1" >/dev/null 2>&1
}}
if [ "$runtime" = containerd ]; then
{snapshots}
else
{body}
fi
"""


def _image_lines(index: BundleIndex) -> List[str]:
    """README.txt's list of images, one line each (values as `text.for_terminal` shows them: it is read with cat)."""
    refs = [for_terminal(im.ref) for im in index.images]
    width = max(len(ref) for ref in refs)
    return [f"    {ref.ljust(width)}  {for_terminal(im.platform)}  {format_size(im.size)}  ID {im.image_id}"
            for ref, im in zip(refs, index.images)]


def _runtimes_en(index: BundleIndex, unpack: str) -> str:
    """README.txt: load.sh on a Kubernetes node (containerd) and on Podman, and iSula by hand (untested)."""
    arch = for_terminal(index.images[0].platform.architecture) if len({im.platform.architecture for im in index.images}) == 1 \
        else "<this host's: amd64, arm64>"
    multi = ("\n  A tag held for several architectures (as here) cannot be named by load.sh in containerd:\n"
             "  load it with imgtool load (or the pyz), which imports and names this host's platform.") \
        if _multiarch_refs(index) else ""
    zstd = ("This bundle HAS zstd layers: fetch it again with --layers compat." if zstd_layer_refs(index)
            else "This bundle has no zstd layers.")
    return f"""
On a Kubernetes node (containerd)
  sh load.sh loads where the kubelet reads images, as the kubelet's configuration says (even
  where Docker is installed too), after the same checks:
    cat <parts in order>{unpack} | ctr -n k8s.io images import --platform linux/{arch} -
  into the namespace k8s.io at the kubelet's socket, unpacked for this host, named as listed above
  and pinned (io.cri-containerd.pinned=pinned: the kubelet's image GC keeps it; --no-pin: not).
  Without a kubelet it uses containerd when there is no Docker. The socket and namespace are
  CONTAINERD_ADDRESS (default: the kubelet's, else /run/containerd/containerd.sock) and
  CONTAINERD_NAMESPACE (default k8s.io), as for ctr itself. sh load.sh --runtime containerd (or
  IMGTOOL_RUNTIME=containerd) uses containerd even beside Docker; check with: crictl images, or
  ctr -n k8s.io images ls.{multi}

On Podman (RHEL family, openEuler)
  With neither Docker nor containerd's socket (or with --runtime podman) sh load.sh runs:
    cat <parts in order>{unpack} | podman load

iSula (openEuler's iSulad; not tested)
  load.sh does not speak to iSula. Check the files first (sha256sum -c {SHA256SUMS}), then write
  the archive out (/var/tmp, or any directory with room for it) and load it:
    cat <parts in order>{unpack} > /var/tmp/archive.tar && isula load -i /var/tmp/archive.tar
    rm /var/tmp/archive.tar
  iSulad cannot read zstd layers: only bundles fetched with --layers compat (the default) load.
  {zstd}"""


def _runtimes_zh(index: BundleIndex, unpack: str) -> str:
    arch = for_terminal(index.images[0].platform.architecture) if len({im.platform.architecture for im in index.images}) == 1 \
        else "<本机架构：amd64、arm64>"
    multi = ("\n  同一标签含多个架构的镜像（本镜像包即是）load.sh 无法在 containerd 中命名：\n"
             "  请用 imgtool load（或 pyz）导入，它只导入并命名本机架构的镜像。") if _multiarch_refs(index) else ""
    zstd = "本镜像包含 zstd 压缩层：请用 --layers compat 重新获取。" if zstd_layer_refs(index) else "本镜像包没有 zstd 压缩层。"
    return f"""
在 Kubernetes 节点上（containerd）
  sh load.sh 按 kubelet 的配置导入 kubelet 读取镜像的地方（即使同时装有 Docker），校验与上面相同：
    cat <按顺序列出的分卷>{unpack} | ctr -n k8s.io images import --platform linux/{arch} -
  导入到 kubelet 所用套接字的命名空间 k8s.io，按本机平台解压，名称即上面所列，并固定
  （io.cri-containerd.pinned=pinned：kubelet 的镜像回收不会删除它；--no-pin 则不固定）。没有 kubelet 时，
  只在没有 Docker 时导入 containerd。套接字和命名空间取自 CONTAINERD_ADDRESS（默认为 kubelet 的，
  否则 /run/containerd/containerd.sock）和 CONTAINERD_NAMESPACE（默认 k8s.io），与 ctr 相同。
  sh load.sh --runtime containerd（或 IMGTOOL_RUNTIME=containerd）在有 Docker 的主机上也导入 containerd；
  导入后可用 crictl images 或 ctr -n k8s.io images ls 查看。{multi}

在 Podman 上（RHEL 系、openEuler）
  既没有 Docker 也没有 containerd 套接字时（或指定 --runtime podman），sh load.sh 执行：
    cat <按顺序列出的分卷>{unpack} | podman load

iSula（openEuler 的 iSulad；未经测试）
  load.sh 不支持 iSula。请先校验文件（sha256sum -c {SHA256SUMS}），再把归档写出（/var/tmp 或其他空间足够的目录）并导入：
    cat <按顺序列出的分卷>{unpack} > /var/tmp/archive.tar && isula load -i /var/tmp/archive.tar
    rm /var/tmp/archive.tar
  iSulad 无法读取 zstd 压缩层：只能导入用 --layers compat（默认）获取的镜像包。
  {zstd}"""


def readme(index: BundleIndex) -> bytes:
    """README.txt for the person carrying the bundle, in English and Chinese."""
    images = "\n".join(_image_lines(index))
    arches = for_terminal(", ".join(sorted({im.platform.architecture for im in index.images})))
    created = for_terminal(index.created)
    n = len(index.parts)
    first, last = index.parts[0].name, index.parts[-1].name
    parts_en = f"{n} part(s): {first}" + (f" ... {last}" if n > 1 else "")
    parts_zh = f"{n} 个分卷：{first}" + (f" ... {last}" if n > 1 else "")
    total = format_size(index.archive.size)
    comp = index.archive.compression
    unpack = {"none": "", "gzip": " | gzip -dc", "zstd": " | zstd -dc"}[comp]
    size = format_size(next((f.size for f in index.files if f.name == TOOL_PYZ), 0))
    tool_en = (f"  {TOOL_PYZ}   imgtool itself ({size}): `python3 {TOOL_PYZ} load .` with any python3 3.7+\n"
               "                (verify, doctor, run-flags, run and push to a site registry too; fetch needs 3.9+)\n") \
        if has_tool(index) else ""
    verify_en = f"python3 {TOOL_PYZ} verify .   (or: " if has_tool(index) else ""
    verify_zh = f"python3 {TOOL_PYZ} verify .（或：" if has_tool(index) else ""
    tool_zh = (f"  {TOOL_PYZ}   imgtool 本身（{size}）：任何 python3 3.7+ 均可 `python3 {TOOL_PYZ} load .`\n"
               "                （verify、doctor、run-flags、run 以及 push 到站内仓库同样可用；fetch 需要 3.9+）\n") \
        if has_tool(index) else ""
    largest = max(p.size for p in index.parts)
    if largest <= FAT32_MAX:
        fat_en = (f"The largest part is {largest:,} bytes: it fits a USB stick formatted\n"
                  f"  FAT32 (files up to {FAT32_MAX:,} bytes).")
        fat_zh = f"最大的分卷为 {largest:,} 字节，可以放进 FAT32 格式的 U 盘（单个文件最大 {FAT32_MAX:,} 字节）。"
    else:
        fat_en = (f"The largest part is {largest:,} bytes, too big for FAT32 (files up to\n"
                  f"  {FAT32_MAX:,} bytes): use exFAT, NTFS, ext4 or UDF, or fetch with --chunk-size fat32.")
        fat_zh = (f"最大的分卷为 {largest:,} 字节，超过 FAT32 的单个文件上限（{FAT32_MAX:,} 字节）：\n"
                  "  请用 exFAT、NTFS、ext4 或 UDF 格式的介质，或用 --chunk-size fat32 重新获取。")
    zstd = [for_terminal(ref) for ref in zstd_layer_refs(index)]
    zstd_en = ("\nThis bundle HAS zstd layers (" + ", ".join(zstd) + "): load.sh refuses them on Docker before 23.0;\n"
               "upgrade Docker, or fetch it again with --layers compat (the default).") if zstd else \
        " This bundle has none: its layers are gzip or plain tar."
    zstd_zh = ("\n本镜像包含 zstd 压缩层（" + "、".join(zstd) + "）：Docker 低于 23.0 时 load.sh 会拒绝导入；\n"
               "请升级 Docker，或用 --layers compat（默认）重新获取。") if zstd else "本镜像包没有这种层（均为 gzip 或未压缩）。"
    text = f"""imgtool bundle
==============

Container images, packed by imgtool {__version__} at {created}:
{images}

Architecture: {arches}. The offline host must match: `uname -m` prints aarch64 for arm64,
x86_64 for amd64.

Files
  {parts_en} ({total} in all, compression: {comp}); concatenated in name order
  they are the archive {index.archive.name}.
  {BUNDLE_JSON}   what is in the bundle, with the size and sha256 of every part
  {SHA256SUMS}    checksums of every file (sha256sum -c format)
  {LOAD_SH}       loads the bundle on a host without imgtool or Python (Docker, containerd, Podman)
{tool_en}  README.txt    this file

Carry it
  Copy the whole directory. Parts may travel on different media; put them all back
  into one directory. {fat_en}

Who checks the bundle
  The bundle's own load.sh and {TOOL_PYZ} find damage (a bad copy, a short part), but
  whoever can edit the bundle on the way can edit them too. Against an edited bundle,
  check it with a copy of imgtool installed on this host from outside any bundle:
  1. Once per host, with the host's own tool: sha256sum {TOOL_PYZ}
     and compare with the imgtool.pyz sha256 published out of band (release notes;
     `imgtool fetch` printed it). Nothing inside a bundle can make this check for itself.
  2. Install that copy: sudo python3 {TOOL_PYZ} self-install
     (/usr/local/bin/imgtool; without root: --prefix ~/.local)
  3. Every bundle, with the installed copy: imgtool verify DIR --expect <bundle.json sha256>
     (or under an allowed_signers policy, below), then imgtool load DIR
  4. Update the installed copy only from a bundle it verified: imgtool self-update DIR

Check it on the offline host
  imgtool verify DIR --expect <sha256 of bundle.json printed by `imgtool fetch`>
  or, without imgtool:  cd DIR && {verify_en}sha256sum -c {SHA256SUMS}{")" if verify_en else ""}
  A damaged or missing part is named: copy that part again from the source medium.

Signed bundles
  {SIGNATURE}, when present, is an SSH signature over {BUNDLE_JSON} (imgtool sign). A host
  with an allowed_signers file (--signers FILE, $IMGTOOL_SIGNERS, ~/.config/imgtool/allowed_signers
  or /etc/imgtool/allowed_signers) loads only bundles signed by a key listed there; `sh load.sh`
  looks for the same files and checks them too (it needs ssh-keygen), against damage only.

Load it
{_ways(index, "en", "  ")}
  or by hand: cat <parts in order>{unpack} | docker load
{_runtimes_en(index, unpack)}

If Docker reports "invalid tar header" (vllm-ascend FAQ 19, seen on Kylin), it met a
zstd-compressed layer, which Docker reads only from 23.0 on (Kylin V10 ships 18.09).{zstd_en}
An image of another architecture loads fine and fails only at `docker run` with
"exec format error": fetch it again with `--arch arm64` (Kunpeng hosts).
`imgtool doctor DIR` checks Docker, free space and architecture on the offline host.


imgtool 离线镜像包
==================

本目录包含以下容器镜像（由 imgtool {__version__} 于 {created} 打包）：
{images}

架构：{arches}。离线主机须与之相同：`uname -m` 输出 aarch64 即 arm64，x86_64 即 amd64。

文件
  {parts_zh}（共 {total}，压缩方式：{comp}），按文件名顺序拼接即为归档 {index.archive.name}。
  {BUNDLE_JSON}   镜像包清单，含每个分卷的大小和 sha256
  {SHA256SUMS}    所有文件的校验和（sha256sum -c 格式）
  {LOAD_SH}       在没有 imgtool 或 Python 的主机上导入镜像（Docker、containerd、Podman）
{tool_zh}  README.txt    本说明

拷贝
  请拷贝整个目录。分卷可以分别用不同介质携带，到达后放回同一个目录。
  {fat_zh}

谁来校验镜像包
  镜像包自带的 load.sh 和 {TOOL_PYZ} 能发现损坏（拷坏、分卷不全），但能在途中改动镜像包的人也能改动它们。
  要防范被改动的镜像包，请用从镜像包之外安装到本机的 imgtool 校验：
  1. 每台主机一次，用主机自己的工具：sha256sum {TOOL_PYZ}
     与另行公布的 imgtool.pyz sha256 比对（发布说明；`imgtool fetch` 会打印）。镜像包里的任何东西都无法替你做这一步。
  2. 安装这份副本：sudo python3 {TOOL_PYZ} self-install
     （/usr/local/bin/imgtool；没有 root 时：--prefix ~/.local）
  3. 每个镜像包都用安装好的副本：imgtool verify 目录 --expect <bundle.json 的 sha256>
     （或在下述 allowed_signers 策略下），然后 imgtool load 目录
  4. 只从它自己校验通过的镜像包更新安装的副本：imgtool self-update 目录

在离线主机上校验
  imgtool verify 目录 --expect <imgtool fetch 输出的 bundle.json 的 sha256>
  没有 imgtool 时：cd 目录 && {verify_zh}sha256sum -c {SHA256SUMS}{"）" if verify_zh else ""}
  损坏或缺失的分卷会被指出：请从源介质重新拷贝该分卷。

签名的镜像包
  如有 {SIGNATURE}，它是对 {BUNDLE_JSON} 的 SSH 签名（imgtool sign）。配置了 allowed_signers 文件
  （--signers 文件、$IMGTOOL_SIGNERS、~/.config/imgtool/allowed_signers 或 /etc/imgtool/allowed_signers）
  的主机只导入由其中所列密钥签名的镜像包；`sh load.sh` 按同样顺序查找这些文件并同样校验
  （需要 ssh-keygen），但只能防范损坏。

导入
{_ways(index, "zh", "  ")}
  或手动：cat <按顺序列出的分卷>{unpack} | docker load
{_runtimes_zh(index, unpack)}

如果 Docker 报 "invalid tar header"（vllm-ascend FAQ 第 19 条，常见于麒麟系统），说明它遇到了
zstd 压缩的镜像层：Docker 23.0 起才能读取（麒麟 V10 自带 18.09）。{zstd_zh}
架构不对的镜像可以正常导入，只在 `docker run` 时报 "exec format error"：请在联网机器上用
`--arch arm64`（鲲鹏主机）重新获取。
`imgtool doctor 目录` 可检查离线主机上的 Docker、磁盘空间和架构。
"""
    return text.encode()
