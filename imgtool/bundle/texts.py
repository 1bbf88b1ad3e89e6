"""README.txt, the file of a bundle meant for people, and the words it shares with load.sh (bundle/loadsh.py)."""

from typing import List

from .. import __version__
from ..model import FAT32_MAX, format_size
from ..text import for_terminal
from .format import BUNDLE_JSON, LOAD_SH, SHA256SUMS, SIGNATURE, TOOL_PYZ, BundleIndex
from .hostcheck import zstd_layer_refs

def has_tool(index: BundleIndex) -> bool:
    """Whether the bundle carries imgtool.pyz (fetch without --no-tool)."""
    return any(f.name == TOOL_PYZ for f in index.files)


def ways(index: BundleIndex, lang: str, indent: str = "") -> str:
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


def multiarch_refs(index: BundleIndex) -> List[str]:
    """The tags this bundle holds for several architectures."""
    seen: dict = {}
    for im in index.images:
        seen.setdefault(im.ref, []).append(im)
    return [ref for ref, ims in seen.items() if len(ims) > 1]


def _image_lines(index: BundleIndex) -> List[str]:
    """README.txt's list of images, one line each (values as `text.for_terminal` shows them: it is read with cat)."""
    refs = [for_terminal(im.ref) for im in index.images]
    models = [for_terminal(m.ref) for m in index.models]
    width = max((len(ref) for ref in refs + models), default=0)
    return [f"    {ref.ljust(width)}  {for_terminal(im.platform)}  {format_size(im.size)}  ID {im.image_id}"
            for ref, im in zip(refs, index.images)] + \
        [f"    {ref.ljust(width)}  commit {for_terminal(m.commit)}  {len(m.files)} files  {format_size(m.size)}"
         for ref, m in zip(models, index.models)]


def _runtimes_en(index: BundleIndex, unpack: str) -> str:
    """README.txt: load.sh on a Kubernetes node (containerd) and on Podman, and iSula by hand (untested)."""
    arch = for_terminal(index.images[0].platform.architecture) if len({im.platform.architecture for im in index.images}) == 1 \
        else "<this host's: amd64, arm64>"
    multi = ("\n  A tag held for several architectures (as here) cannot be named by load.sh in containerd:\n"
             "  load it with imgtool load (or the pyz), which imports and names this host's platform.") \
        if multiarch_refs(index) else ""
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
             "  请用 imgtool load（或 pyz）导入，它只导入并命名本机架构的镜像。") if multiarch_refs(index) else ""
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
{ways(index, "en", "  ")}
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
{ways(index, "zh", "  ")}
  或手动：cat <按顺序列出的分卷>{unpack} | docker load
{_runtimes_zh(index, unpack)}

如果 Docker 报 "invalid tar header"（vllm-ascend FAQ 第 19 条，常见于麒麟系统），说明它遇到了
zstd 压缩的镜像层：Docker 23.0 起才能读取（麒麟 V10 自带 18.09）。{zstd_zh}
架构不对的镜像可以正常导入，只在 `docker run` 时报 "exec format error"：请在联网机器上用
`--arch arm64`（鲲鹏主机）重新获取。
`imgtool doctor 目录` 可检查离线主机上的 Docker、磁盘空间和架构。
"""
    return text.encode()
