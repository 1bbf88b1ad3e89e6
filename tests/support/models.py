"""Seeded test models, real in format: a model hub's files, the same bytes on every machine.

A model is what a hub holds for one repository: revisions (each a commit and its files) and refs
(branch and tag names to commits). Each file knows what the hubs say about it: its size, its sha256
(what Hugging Face's LFS metadata and ModelScope's `Sha256` carry) and its git blob id (what
Hugging Face's `blobId`/`oid` and a small file's `ETag` carry; for an LFS file the id of its pointer).

    m = small_model(seed=1)                 # config, tokenizer, README, 2 shards + index, in memory
    m = two_revisions(seed=1)               # tag v1 and main: only model-00002-of-00002 differs
    m = big_model(seed=1, directory=d, shards=5, shard_bytes=4 << 30)   # streamed to disk
    m = generated_model(seed=1, shards=5, shard_bytes=4 << 30)           # made as served: never on disk

Small shards are written by the real `safetensors` library (numpy tensors drawn from the seed); big
ones are written by hand, streaming (`write_safetensors`: 8-byte header length, JSON header, raw
tensor bytes), and are proved to be the real format by `safetensors.safe_open` in tests/test_hub.py.
The bytes come from SHAKE-256 of the seed (and $IMGTOOL_TEST_SEED), never from this machine; the
small shards also depend on the installed safetensors writing its header the same way.
"""

import hashlib
import io
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from tests.support.images import suite_seed

CHUNK = 1 << 20
# Files Hugging Face stores in Git LFS (.gitattributes below); the rest are plain git blobs.
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")
GITATTRIBUTES = (b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
                 b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
                 b"*.gguf filter=lfs diff=lfs merge=lfs -text\n")


def git_blob_id(size: int, chunks: Iterator[bytes]) -> str:
    """The git blob sha1 of content of `size` bytes: what git (and the Hub's blobId) names it by."""
    h = hashlib.sha1(b"blob %d\0" % size)
    for c in chunks:
        h.update(c)
    return h.hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The Git LFS pointer file git holds in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class ModelFile:
    """One file of a revision: its bytes in memory (`data`) or on disk (`source`), and what a hub says of it."""

    path: str
    size: int
    sha256: str
    lfs: bool
    data: Optional[bytes] = field(default=None, repr=False)
    source: Optional[Path] = None
    # or made on demand: generate(start, end) -> the bytes [start, end) in pieces (a benchmark's shards, never on disk)
    generate: Optional[Callable[[int, int], Iterator[bytes]]] = field(default=None, repr=False, compare=False)

    @property
    def blob_id(self) -> str:
        """The git blob id: of the content, or for an LFS file of its pointer (as the Hub reports it)."""
        if self.lfs:
            p = self.pointer
            return git_blob_id(len(p), iter([p]))
        return git_blob_id(self.size, self.chunks())

    @property
    def pointer(self) -> bytes:
        return lfs_pointer(self.sha256, self.size)

    def open(self) -> BinaryIO:
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.source is not None
        return open(self.source, "rb")

    def chunks(self, start: int = 0, end: Optional[int] = None, chunk: int = CHUNK) -> Iterator[bytes]:
        """The bytes [start, end) in pieces, never the whole of a big file at once."""
        end = self.size if end is None else end
        if self.generate is not None:
            yield from self.generate(start, end)
            return
        with self.open() as f:
            f.seek(start)
            left = end - start
            while left > 0:
                b = f.read(min(chunk, left))
                if not b:
                    return
                left -= len(b)
                yield b

    def read(self) -> bytes:
        return b"".join(self.chunks())


def memory_file(path: str, data: bytes, lfs: Optional[bool] = None) -> ModelFile:
    return ModelFile(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                     lfs=path.endswith(LFS_SUFFIXES) if lfs is None else lfs, data=data)


@dataclass
class Revision:
    commit: str
    files: Dict[str, ModelFile]


@dataclass
class HubModel:
    """A repository: revisions by commit, and refs (branch or tag -> commit). Both hubs' default branches
    (`main` on Hugging Face, `master` on ModelScope) name the newest revision."""

    repo_id: str
    revisions: Dict[str, Revision]
    refs: Dict[str, str]

    def resolve(self, revision: str) -> Optional[Revision]:
        """A ref or a full commit id -> its revision (None when unknown)."""
        commit = self.refs.get(revision, revision)
        return self.revisions.get(commit)

    @property
    def head(self) -> Revision:
        return self.revisions[self.refs["main"]]


def _label(seed, *parts) -> bytes:
    return ":".join(["imgtool-model", suite_seed(), str(seed), *map(str, parts)]).encode()


def seeded_bytes(label: bytes, size: int, chunk: int = CHUNK) -> Iterator[bytes]:
    """`size` bytes drawn from `label`, in pieces of `chunk` (SHAKE-256 of label and piece number)."""
    for i in range(0, size, chunk):
        n = min(chunk, size - i)
        yield hashlib.shake_256(label + b":%d" % (i // chunk)).digest(n)


def commit_id(seed, name: str) -> str:
    return hashlib.sha1(_label(seed, "commit", name)).hexdigest()


def _words(seed, n: int) -> List[str]:
    raw = hashlib.shake_256(_label(seed, "vocab")).digest(n * 4)
    syll = ("ka", "to", "ri", "en", "de", "sh", "ar", "on", "il", "um", "ex", "po", "la", "ne", "st", "co")
    words = []
    for i in range(n):
        a, b, c, d = raw[4 * i:4 * i + 4]
        words.append(syll[a % 16] + syll[b % 16] + (syll[c % 16] if d % 2 else "") + str(i))
    return words


def _tensor(seed, name: str, shape: Tuple[int, ...], variant: int = 0):
    """A float16 numpy tensor drawn from the seed: small values, as trained weights are."""
    import numpy as np

    n = 1
    for s in shape:
        n *= s
    raw = b"".join(seeded_bytes(_label(seed, "tensor", name, variant), 2 * n))
    u = np.frombuffer(raw, dtype="<u2").astype(np.float32)
    return ((u / 65535.0 - 0.5) * 0.08).astype("<f2").reshape(shape)


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _small_files(seed, repo_id: str, hidden: int, layers: int, vocab: int) -> Dict[str, bytes]:
    words = _words(seed, vocab - 3)
    vocab_map = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(("<unk>", "<s>", "</s>"))],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab_map, "unk_token": "<unk>"},
    }
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": hidden,
        "intermediate_size": hidden, "num_hidden_layers": layers, "num_attention_heads": max(1, hidden // 32),
        "num_key_value_heads": max(1, hidden // 32), "vocab_size": vocab, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
        "tie_word_embeddings": False, "transformers_version": "4.51.0",
    }
    return {
        ".gitattributes": GITATTRIBUTES,
        "README.md": (f"---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# {repo_id}\n\n"
                      f"A test model generated from seed {seed}: {layers} layers of width {hidden}, "
                      f"{vocab} tokens. Its weights are noise.\n").encode(),
        "config.json": _json(config),
        "generation_config.json": _json({"bos_token_id": 1, "eos_token_id": 2, "do_sample": True,
                                         "temperature": 0.7, "top_p": 0.8, "transformers_version": "4.51.0"}),
        "tokenizer.json": _json(tokenizer),
        "tokenizer_config.json": _json({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
                                        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    }


def _shard_names(shards: int) -> List[str]:
    return [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]


def _weights(seed, shards: int, shard_bytes: int, variants: Sequence[int]) -> Tuple[Dict[str, bytes], int, int]:
    """(shard files written by safetensors.numpy and the index, hidden, layers). Each shard holds one layer
    per ~shard_bytes (4 square float16 tensors), the first also the embedding, the last the norm and
    lm_head; `variants[i]` redraws shard i's values (a new revision of that shard, same names and shapes)."""
    from safetensors.numpy import save

    hidden = max(8, int((shard_bytes / 8) ** 0.5) // 8 * 8)
    vocab = 64
    names = _shard_names(shards)
    files: Dict[str, bytes] = {}
    weight_map: Dict[str, str] = {}
    total = 0
    for i, fname in enumerate(names):
        v = variants[i]
        tensors = {}
        if i == 0:
            tensors["model.embed_tokens.weight"] = _tensor(seed, "model.embed_tokens.weight", (vocab, hidden), v)
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.down_proj"):
            name = f"model.layers.{i}.{part}.weight"
            tensors[name] = _tensor(seed, name, (hidden, hidden), v)
        if i == shards - 1:
            tensors["model.norm.weight"] = _tensor(seed, "model.norm.weight", (hidden,), v)
            tensors["lm_head.weight"] = _tensor(seed, "lm_head.weight", (vocab, hidden), v)
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.nbytes
        files[fname] = save(tensors, metadata={"format": "pt"})
    files["model.safetensors.index.json"] = _json({"metadata": {"total_size": total},
                                                   "weight_map": dict(sorted(weight_map.items()))})
    return files, hidden, shards


def _revision(seed, repo_id: str, name: str, shards: int, shard_bytes: int, variants: Sequence[int]) -> Revision:
    weights, hidden, layers = _weights(seed, shards, shard_bytes, variants)
    files = {**_small_files(seed, repo_id, hidden, layers, 64), **weights}
    return Revision(commit=commit_id(seed, f"{repo_id}@{name}"),
                    files={p: memory_file(p, b) for p, b in sorted(files.items())})


def small_model(seed=0, repo_id: str = "imgtool-test/tiny-llm", shards: int = 2, shard_bytes: int = 32 << 10) -> HubModel:
    """One revision, in memory: config, generation config, tokenizer, README, .gitattributes, `shards`
    safetensors shards of about `shard_bytes` each, and model.safetensors.index.json."""
    assert 1 <= shards <= 99999
    rev = _revision(seed, repo_id, "r1", shards, shard_bytes, [0] * shards)
    return HubModel(repo_id=repo_id, revisions={rev.commit: rev}, refs={"main": rev.commit, "master": rev.commit})


def two_revisions(seed=0, repo_id: str = "imgtool-test/tiny-llm", shards: int = 2, shard_bytes: int = 32 << 10,
                  changed: int = -1) -> HubModel:
    """Two revisions of one model: tag `v1` the first, `main`/`master` the second, which differs only in
    shard `changed` (the last by default): same tensor names and shapes, new values."""
    changed %= shards
    v1 = _revision(seed, repo_id, "r1", shards, shard_bytes, [0] * shards)
    v2 = _revision(seed, repo_id, "r2", shards, shard_bytes, [1 if i == changed else 0 for i in range(shards)])
    return HubModel(repo_id=repo_id, revisions={v1.commit: v1, v2.commit: v2},
                    refs={"main": v2.commit, "master": v2.commit, "v1": v1.commit})


# --- big shards, streamed -------------------------------------------------------------------------------------

def write_safetensors(path: Path, tensors: Sequence[Tuple[str, str, Tuple[int, ...], Iterator[bytes]]],
                      metadata: Optional[Dict[str, str]] = None) -> Tuple[int, str]:
    """Write a safetensors file by hand, streaming: (name, dtype, shape, bytes) per tensor, in order.
    Returns (size, sha256). Memory stays at one piece of a tensor, whatever the file's size."""
    itemsize = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "I8": 1}
    header: Dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, _ in tensors:
        n = itemsize[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    digest = hashlib.sha256()
    size = 0
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        def put(b: bytes) -> None:
            nonlocal size
            f.write(b)
            digest.update(b)
            size += len(b)
        put(struct.pack("<Q", len(head)))
        put(head)
        for name, _, _, data in tensors:
            want = header[name]["data_offsets"]  # type: ignore[index]
            start = size
            for b in data:
                put(b)
            assert size - start == want[1] - want[0], f"{name}: {size - start} bytes, the header says {want[1] - want[0]}"
    os.replace(tmp, path)
    return size, digest.hexdigest()


def big_model(seed=0, directory: Path = Path("."), repo_id: str = "imgtool-test/big-llm", shards: int = 5,
              shard_bytes: int = 4 << 30, hidden: int = 4096, tensor_bytes: int = 256 << 20,
              changed_shard: Optional[int] = None) -> HubModel:
    """A model whose shards are written to `directory` (streamed, about `shard_bytes` each, BF16 tensors
    of [rows, hidden] up to `tensor_bytes`); the small files stay in memory. A shard already on disk
    with the right size is kept (a benchmark reruns without rewriting 20 GB). `changed_shard` adds a
    tag-v1 revision whose that shard differs (the delta benchmark)."""
    directory.mkdir(parents=True, exist_ok=True)
    row = 2 * hidden
    names = _shard_names(shards)

    def layout(i: int) -> List[Tuple[str, int]]:
        rows_left = max(1, shard_bytes // row)
        out = []
        j = 0
        while rows_left > 0:
            rows = min(rows_left, max(1, tensor_bytes // row))
            out.append((f"model.layers.{i}.part{j}.weight", rows))
            rows_left -= rows
            j += 1
        return out

    def shard(i: int, variant: int) -> ModelFile:
        fname = names[i]
        path = directory / (fname if variant == 0 else f"v{variant}-{fname}")
        plan = layout(i)
        tensors = [(name, "BF16", (rows, hidden), seeded_bytes(_label(seed, "big", name, variant), rows * row))
                   for name, rows in plan]
        # "<sha256> <size>", written once the shard is whole: a rerun trusts a shard only with it
        meta_path = path.with_name(path.name + ".sha256")
        meta = meta_path.read_text().split() if meta_path.exists() else []
        if len(meta) == 2 and path.exists() and path.stat().st_size == int(meta[1]):
            sha, size = meta[0], int(meta[1])
        else:
            meta_path.unlink(missing_ok=True)
            size, sha = write_safetensors(path, tensors, {"format": "pt"})
            meta_path.write_text(f"{sha} {size}\n")
        return ModelFile(path=fname, size=size, sha256=sha, lfs=True, source=path)

    def revision(name: str, variants: List[int]) -> Revision:
        files = {p: memory_file(p, b) for p, b in _small_files(seed, repo_id, hidden, shards, 64).items()}
        weight_map = {t: names[i] for i in range(shards) for t, _ in layout(i)}
        total = sum(rows * row for i in range(shards) for _, rows in layout(i))
        files["model.safetensors.index.json"] = memory_file("model.safetensors.index.json", _json(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}))
        for i in range(shards):
            files[names[i]] = shard(i, variants[i])
        return Revision(commit=commit_id(seed, f"{repo_id}@{name}"), files=dict(sorted(files.items())))

    head = revision("r2" if changed_shard is not None else "r1", [0] * shards)
    revisions = {head.commit: head}
    refs = {"main": head.commit, "master": head.commit}
    if changed_shard is not None:
        old = revision("r1", [1 if i == changed_shard % shards else 0 for i in range(shards)])
        revisions[old.commit] = old
        refs["v1"] = old.commit
    return HubModel(repo_id=repo_id, revisions=revisions, refs=refs)


# --- big shards, generated as they are served (benchmarks: never on disk) -------------------------------------

GENERATED_HEADER = 256  # the safetensors JSON header of a generated shard, padded to this many bytes


def _generated_shard(seed, name: str, size: int, sha_cache: Optional[Path], variant: int = 0) -> ModelFile:
    """A safetensors file of `size` bytes (one U8 tensor) whose bytes are made on demand: the header, then
    1 MiB blocks, each its index (8 bytes) and the rest of one seeded block, so every block differs and a range
    costs a copy, not a hash. Its sha256 is computed once (one pass over the bytes), kept in `sha_cache`."""
    n = size - 8 - GENERATED_HEADER
    assert n > 0, size
    head = json.dumps({"__metadata__": {"format": "pt"}, "weight": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}},
                      separators=(",", ":")).encode()
    prefix = struct.pack("<Q", GENERATED_HEADER) + head.ljust(GENERATED_HEADER)
    label = _label(seed, "generated", name, *([variant] if variant else []))
    base = hashlib.shake_256(label).digest(CHUNK)

    def generate(start: int, end: int) -> Iterator[bytes]:
        pos = start
        if pos < len(prefix):
            yield prefix[pos:min(end, len(prefix))]
            pos = len(prefix)
        while pos < end:
            k, off = divmod(pos - len(prefix), CHUNK)
            block = struct.pack(">Q", k) + base[8:]
            piece = block[off:min(CHUNK, off + end - pos)]
            yield piece
            pos += len(piece)

    key = hashlib.sha1(_label(seed, "generated", name, size, *([variant] if variant else []))).hexdigest()
    cached = sha_cache / f"{key}.sha256" if sha_cache else None
    if cached is not None and cached.exists():
        sha = cached.read_text().strip()
    else:
        h = hashlib.sha256()
        for piece in generate(0, size):
            h.update(piece)
        sha = h.hexdigest()
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(sha + "\n")
    return ModelFile(path=name, size=size, sha256=sha, lfs=True, generate=generate)


def generated_model(seed=0, repo_id: str = "imgtool-bench/big-llm", shards: int = 5, shard_bytes: int = 4 << 30,
                    sha_cache: Optional[Path] = None, changed_shard: Optional[int] = None) -> HubModel:
    """The small files (config, tokenizer, README, .gitattributes, the index) in memory and `shards` generated
    safetensors shards of `shard_bytes` each, made as they are served (`_generated_shard`): a 20 GB model on a disk
    that has no 20 GB to spare. Its revision is `main`; `changed_shard` adds a newer one, tag `v2`, whose that shard
    differs (the delta benchmark: a new revision changing 1 of 5 shards)."""
    names = _shard_names(shards)

    def revision(name: str, changed: Optional[int]) -> Revision:
        files = {p: memory_file(p, b) for p, b in _small_files(seed, repo_id, 4096, shards, 64).items()}
        files["model.safetensors.index.json"] = memory_file("model.safetensors.index.json", _json(
            {"metadata": {"total_size": shards * (shard_bytes - 8 - GENERATED_HEADER)},
             "weight_map": {f"model.layers.{i}.weight": names[i] for i in range(shards)}}))
        for i, fname in enumerate(names):
            files[fname] = _generated_shard(seed, fname, shard_bytes, sha_cache, variant=int(i == changed))
        return Revision(commit=commit_id(seed, f"{repo_id}@{name}"), files=dict(sorted(files.items())))

    rev = revision(f"generated-{shards}x{shard_bytes}", None)
    revisions = {rev.commit: rev}
    refs = {"main": rev.commit, "master": rev.commit}
    if changed_shard is not None:
        new = revision(f"generated-{shards}x{shard_bytes}-v2-{changed_shard}", changed_shard % shards)
        revisions[new.commit] = new
        refs["v2"] = new.commit
    return HubModel(repo_id=repo_id, revisions=revisions, refs=refs)
