"""Model hubs on loopback (test support, not product): a Hugging Face-compatible and a ModelScope-compatible
endpoint serving seeded models (tests/support/models.py), with faults switched on per test.

    with Hub([small_model(1)], flavour="hf") as hub:          # HF_ENDPOINT=hub.url
        hub.faults.redirect = True                           # LFS downloads go to the storage bridge
        ...
        [r.path for r in hub.requests]                       # every request, hub and bridge

Each speaks the protocol the real client speaks (tests/test_hub.py runs huggingface_hub and modelscope
against it; docs/testing.md lists the requests):
- Hugging Face: GET /api/models/{repo}[/revision/{rev}][?blobs=true] (sha, siblings with size, blobId,
  lfs{sha256,size,pointerSize}); GET /api/models/{repo}/tree/{rev}[/{dir}]?recursive=true (entries with oid,
  size, lfs{oid,size,pointerSize}; pages of `page_size` joined by a Link rel="next" header with a cursor);
  HEAD/GET /{repo}/resolve/{rev}/{path}: X-Repo-Commit, ETag (git blob sha1; the sha256 for an LFS file),
  X-Linked-Etag and X-Linked-Size (LFS), Content-Length, Accept-Ranges, Range -> 206. Errors carry
  X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) as the Hub's do.
- ModelScope: GET /api/v1/models/{id}/revisions (RevisionMap{Branches,Tags}), GET /api/v1/models/{id}/repo/files
  ?Revision=&Recursive= (Data.Files[{Name,Path,Type,Size,Sha256,Revision,IsLFS}]), GET /api/v1/models/{id}/repo
  ?Revision=&FilePath= (Range -> 206), GET /api/v1/models/{id}; everything wrapped {Code, Data, Message, Success}.

The storage bridge is a second server on another loopback address and port (127.0.0.2: another host): with `faults.redirect` the hub
answers an LFS file's resolve/download with a 302 there, as the Hub sends LFS and Xet files to its CDN.
Like a presigned-URL store, the bridge refuses a request that carries an Authorization header (400).
"""

import base64
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.support.models import HubModel, ModelFile, Revision, seeded_bytes

SLICE = 256 * 1024


class _Server(ThreadingHTTPServer):
    # A listen backlog of 128, not socketserver's 5: a client opening 16 connections at once (imgtool's ranged
    # download) had the SYNs past the fifth dropped and sent again after the kernel's 1 s, which a CDN never does
    # (docs/benchmarks.md "Two sources, measured").
    request_queue_size = 128


@dataclass
class Failure:
    """The next `times` requests that `match` (method, path) answer `status` (with Retry-After when given)."""

    times: int
    status: int
    retry_after: Optional[int] = None
    match: Optional[Callable[[str, str], bool]] = None
    used: int = 0


@dataclass
class Faults:
    """Switches, all off by default; a test sets them before or while the client runs."""

    redirect: bool = False          # LFS files: resolve/download answer 302 to the bridge (another origin)
    honour_range: bool = True       # False: a Range request gets 200 and the whole file (hub and bridge)
    failures: List[Failure] = field(default_factory=list)   # 429/5xx for the first N matching requests
    lie_sha256: Dict[str, str] = field(default_factory=dict)  # path -> the digest the metadata claims instead
    extra_files: Dict[str, bytes] = field(default_factory=dict)  # hostile names: listed and served as given
    grow: Dict[str, int] = field(default_factory=dict)      # path -> bytes more at download than the listing says
    drip: int = 0                   # file bodies at this many bytes per second (0: at full speed)
    token: Optional[str] = None     # gated: every hub request needs "Authorization: Bearer TOKEN" (401 without)
    commit_ids: bool = True         # ModelScope: False: /revisions gives each branch and tag without its CommitId

    def fail(self, times: int, status: int = 503, retry_after: Optional[int] = None,
             match: Optional[Callable[[str, str], bool]] = None) -> Failure:
        f = Failure(times, status, retry_after, match)
        self.failures.append(f)
        return f


@dataclass
class HubRequest:
    server: str                 # "hub" or "bridge"
    method: str
    path: str                   # as sent, query included
    headers: Dict[str, str]     # names lower-cased
    status: int = 0
    sent: int = 0               # body bytes sent

    @property
    def range(self) -> Optional[str]:
        return self.headers.get("range")

    @property
    def route(self) -> str:
        """The path without its query, unquoted."""
        return unquote(urlsplit(self.path).path)

    @property
    def query(self) -> Dict[str, str]:
        return {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query, keep_blank_values=True).items()}


class _Body:
    """What a download serves for one file: its bytes (grown, or a hostile extra) and what they are said to be."""

    def __init__(self, f: ModelFile, extra: int, lie: Optional[str]):
        self.file, self.extra = f, extra
        self.size = f.size + extra
        self.sha256 = lie or f.sha256
        self.etag = self.sha256 if f.lfs else (hashlib.sha1(lie.encode()).hexdigest() if lie else f.blob_id)

    def chunks(self, start: int, end: int) -> Iterator[bytes]:
        if start < self.file.size:
            yield from self.file.chunks(start, min(end, self.file.size))
        if end > self.file.size:  # the growth: seeded bytes past the listed end
            grown = b"".join(seeded_bytes(b"grown:" + self.file.path.encode(), self.extra))
            yield grown[max(0, start - self.file.size):end - self.file.size]


class Hub:
    """One hub (flavour "hf" or "modelscope") and its storage bridge, on loopback ports of their own."""

    def __init__(self, models: Iterable[HubModel], flavour: str = "hf", page_size: int = 1000):
        assert flavour in ("hf", "modelscope")
        self.flavour = flavour
        self.models: Dict[str, HubModel] = {m.repo_id: m for m in models}
        self.page_size = page_size
        self.faults = Faults()
        self.requests: List[HubRequest] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self._servers: List[ThreadingHTTPServer] = []
        self._threads: List[threading.Thread] = []
        self.url = self.bridge_url = ""

    # --- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> "Hub":
        # The bridge on another loopback address too: another host, not only another port, so that a cookie
        # (which ignores ports: ModelScope's m_session_id) stays with the hub as it does with the real hubs' CDNs.
        for name, host in (("hub", "127.0.0.1"), ("bridge", "127.0.0.2")):
            server = _Server((host, 0), _handler(self, name))
            server.daemon_threads = True
            url = f"http://{host}:{server.server_address[1]}"
            if name == "hub":
                self.url = url
            else:
                self.bridge_url = url
            t = threading.Thread(target=server.serve_forever, args=(0.05,), name=f"hub-{name}", daemon=True)
            t.start()
            self._servers.append(server)
            self._threads.append(t)
        return self

    def close(self) -> None:
        self.closing.set()  # ends a drip mid-body
        for s in self._servers:
            s.shutdown()
            s.server_close()
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> "Hub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- what the tests look at ------------------------------------------------------------------------------
    def requests_to(self, server: str = "hub") -> List[HubRequest]:
        with self.lock:
            return [r for r in self.requests if r.server == server]

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()

    # --- the model -------------------------------------------------------------------------------------------
    def listed(self, rev: Revision) -> Dict[str, ModelFile]:
        """The files a listing shows: the revision's and the hostile extras."""
        from tests.support.models import memory_file

        files = dict(rev.files)
        for p, b in self.faults.extra_files.items():
            files[p] = memory_file(p, b)
        return files

    def body(self, rev: Revision, path: str) -> Optional[_Body]:
        f = self.listed(rev).get(path)
        if f is None:
            return None
        return _Body(f, self.faults.grow.get(path, 0), self.faults.lie_sha256.get(path))

    def claimed_sha256(self, f: ModelFile) -> str:
        return self.faults.lie_sha256.get(f.path, f.sha256)

    def claimed_blob_id(self, f: ModelFile) -> str:
        lie = self.faults.lie_sha256.get(f.path)
        return hashlib.sha1(lie.encode()).hexdigest() if lie and not f.lfs else f.blob_id


class _Reply(Exception):
    """A complete answer: status, headers, body (raised from deep in a route)."""

    def __init__(self, status: int, headers: Optional[Dict[str, str]] = None, body: bytes = b""):
        super().__init__(status)
        self.status, self.headers, self.body = status, headers or {}, body


class _Done(Exception):
    """The answer has been streamed (ends a route like a reply already sent)."""


def _json_reply(status: int, obj, headers: Optional[Dict[str, str]] = None) -> _Reply:
    return _Reply(status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(obj).encode())


def _parse_range(value: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """A single `bytes=a-b`, `bytes=a-` or `bytes=-n` -> [start, end); None when absent or not one range;
    raises a 416 reply when it starts past the end."""
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    a, _, b = value[len("bytes="):].strip().partition("-")
    try:
        if a == "":
            n = int(b)
            return (max(0, size - n), size)
        start = int(a)
        end = min(size, int(b) + 1) if b else size
    except ValueError:
        return None
    if start >= size or end <= start:
        raise _Reply(416, {"Content-Range": f"bytes */{size}"})
    return (start, end)


def _handler(hub: Hub, server: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: the request log is hub.requests
            pass

        def do_HEAD(self) -> None:
            self._serve()

        def do_GET(self) -> None:
            self._serve()

        # --- dispatch ----------------------------------------------------------------------------------------
        def _serve(self) -> None:
            rec = HubRequest(server, self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            with hub.lock:
                hub.requests.append(rec)
            self.rec = rec
            try:
                self._failure()
                if server == "bridge":
                    self._bridge()
                elif hub.flavour == "hf":
                    self._hf()
                else:
                    self._modelscope()
                raise _Reply(404, {}, b"no such route")
            except _Reply as r:
                self._send(r.status, r.headers, r.body)
            except _Done:
                pass
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _failure(self) -> None:
            with hub.lock:
                for f in hub.faults.failures:
                    if f.used < f.times and (f.match is None or f.match(self.command, self.rec.route)):
                        f.used += 1
                        headers = {"Retry-After": str(f.retry_after)} if f.retry_after is not None else {}
                        raise _json_reply(f.status, {"error": f"injected {f.status}"}, headers)

        def _gate(self) -> None:
            token = hub.faults.token
            if token is None:
                return
            auth = self.headers.get("Authorization", "")
            if auth == f"Bearer {token}":
                return
            if hub.flavour == "hf":
                raise _json_reply(401, {"error": "Access to this model is restricted."},
                                  {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to this model is restricted."})
            raise _json_reply(401, {"Code": 10010205001, "Message": "Unauthorized", "Success": False})

        def _send(self, status: int, headers: Dict[str, str], body: bytes) -> None:
            self.send_response(status)
            headers = dict(headers)
            headers.setdefault("Content-Length", str(len(body)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.rec.status = status
            if self.command != "HEAD" and body:
                self.wfile.write(body)
                self.rec.sent += len(body)

        def _stream(self, status: int, headers: Dict[str, str], chunks: Iterator[bytes]) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.rec.status = status
            if self.command == "HEAD":
                raise _Done()
            rate = hub.faults.drip
            for c in chunks:
                step = max(1, rate // 20) if rate else SLICE
                for i in range(0, len(c), step):
                    if hub.closing.is_set():
                        self.close_connection = True
                        raise _Done()
                    piece = c[i:i + step]
                    if rate:  # the wait before the bytes: the last byte comes len/rate after the headers
                        time.sleep(len(piece) / rate)
                    self.wfile.write(piece)
                    self.rec.sent += len(piece)
            raise _Done()

        def _file(self, body: _Body, headers: Dict[str, str]) -> None:
            """Serve a file's bytes: Range honoured (206) unless switched off, HEAD without a body."""
            rng = _parse_range(self.headers.get("Range"), body.size) if hub.faults.honour_range else None
            headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", **headers}
            if rng is None:
                headers["Content-Length"] = str(body.size)
                self._stream(200, headers, body.chunks(0, body.size))
            start, end = rng
            headers["Content-Length"] = str(end - start)
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{body.size}"
            self._stream(206, headers, body.chunks(start, end))

        def _model(self, repo_id: str) -> HubModel:
            m = hub.models.get(repo_id)
            if m is None:
                if hub.flavour == "hf":
                    raise _json_reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                raise _json_reply(404, {"Code": 10010205001, "Message": f"model {repo_id} not found", "Success": False})
            return m

        def _revision(self, m: HubModel, rev: str) -> Revision:
            r = m.resolve(rev)
            if r is None:
                if hub.flavour == "hf":
                    raise _json_reply(404, {"error": f"Invalid rev id: {rev}"}, {"X-Error-Code": "RevisionNotFound"})
                raise _json_reply(404, {"Code": 10010205001, "Message": f"revision {rev} not found", "Success": False})
            return r

        def _redirect(self, repo_id: str, rev: Revision, path: str, headers: Dict[str, str]) -> None:
            location = f"{hub.bridge_url}/{repo_id}/{rev.commit}/{quote(path)}?X-Amz-Signature=" + \
                hashlib.sha256(f"{repo_id}{rev.commit}{path}".encode()).hexdigest()[:32]
            raise _Reply(302, {"Location": location, **headers})

        # --- Hugging Face --------------------------------------------------------------------------------------
        def _hf(self) -> None:
            url = urlsplit(self.path)
            raw = url.path.split("/")[1:]
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if raw[:2] == ["api", "models"] and len(raw) >= 4:
                self._gate()
                m = self._model(f"{unquote(raw[2])}/{unquote(raw[3])}")
                rest = raw[4:]
                if not rest:
                    self._hf_info(m, m.head, q)
                if len(rest) == 2 and rest[0] == "revision":
                    self._hf_info(m, self._revision(m, unquote(rest[1])), q)
                if len(rest) >= 2 and rest[0] == "tree":
                    self._hf_tree(m, self._revision(m, unquote(rest[1])), "/".join(unquote(p) for p in rest[2:]), q)
            if len(raw) >= 5 and raw[2] == "resolve":
                self._gate()
                m = self._model(f"{unquote(raw[0])}/{unquote(raw[1])}")
                rev = self._revision(m, unquote(raw[3]))
                path = "/".join(unquote(p) for p in raw[4:])
                body = hub.body(rev, path)
                if body is None:
                    raise _json_reply(404, {"error": "Entry not found"},
                                      {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": rev.commit})
                headers = {"X-Repo-Commit": rev.commit, "ETag": f'"{body.etag}"'}
                if body.file.lfs:
                    headers.update({"X-Linked-Etag": f'"{body.sha256}"', "X-Linked-Size": str(body.size)})
                    if hub.faults.redirect:
                        self._redirect(m.repo_id, rev, path, headers)
                self._file(body, headers)

        def _hf_info(self, m: HubModel, rev: Revision, q: Dict[str, str]) -> None:
            blobs = q.get("blobs", "").lower() == "true"
            siblings = []
            for p, f in sorted(hub.listed(rev).items()):
                s: Dict[str, object] = {"rfilename": p}
                if blobs:
                    s.update({"size": f.size, "blobId": hub.claimed_blob_id(f)})
                    if f.lfs:
                        s["lfs"] = {"sha256": hub.claimed_sha256(f), "size": f.size, "pointerSize": len(f.pointer)}
                siblings.append(s)
            raise _json_reply(200, {
                "_id": hashlib.sha1(m.repo_id.encode()).hexdigest()[:24], "id": m.repo_id, "modelId": m.repo_id,
                "author": m.repo_id.split("/")[0], "sha": rev.commit, "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z", "private": False,
                "gated": "manual" if hub.faults.token else False, "disabled": False, "downloads": 0, "likes": 0,
                "library_name": "transformers", "tags": ["transformers", "safetensors"], "pipeline_tag": "text-generation",
                "siblings": siblings, "usedStorage": sum(f.size for f in rev.files.values()),
            })

        def _hf_tree(self, m: HubModel, rev: Revision, under: str, q: Dict[str, str]) -> None:
            recursive = q.get("recursive", "").lower() == "true"
            entries: Dict[str, dict] = {}
            prefix = under.rstrip("/") + "/" if under else ""
            for p, f in sorted(hub.listed(rev).items()):
                if not p.startswith(prefix):
                    continue
                rel = p[len(prefix):]
                parts = rel.split("/")
                for i in range(1, len(parts)):  # the directories on the way, as the Hub lists them
                    d = prefix + "/".join(parts[:i])
                    if recursive or i == 1:
                        entries.setdefault(d, {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(),
                                               "size": 0, "path": d})
                if len(parts) > 1 and not recursive:
                    continue
                e: Dict[str, object] = {"type": "file", "oid": hub.claimed_blob_id(f), "size": f.size, "path": p}
                if f.lfs:
                    e["lfs"] = {"oid": hub.claimed_sha256(f), "size": f.size, "pointerSize": len(f.pointer)}
                entries[p] = e
            if under and not entries:
                raise _json_reply(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            listing = [entries[k] for k in sorted(entries)]
            start = int(base64.urlsafe_b64decode(q["cursor"]).decode()) if "cursor" in q else 0
            page = listing[start:start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(listing):
                cursor = base64.urlsafe_b64encode(str(start + hub.page_size).encode()).decode()
                host = self.headers.get("Host", "")
                base = f"http://{host}{urlsplit(self.path).path}"
                headers["Link"] = f'<{base}?recursive={str(recursive).lower()}&expand=false&cursor={cursor}>; rel="next"'
            raise _json_reply(200, page, headers)

        # --- ModelScope ----------------------------------------------------------------------------------------
        def _ms_ok(self, data) -> _Reply:
            return _json_reply(200, {"Code": 200, "Data": data, "Message": "success",
                                     "RequestId": hashlib.sha1(self.path.encode()).hexdigest(), "Success": True})

        def _modelscope(self) -> None:
            url = urlsplit(self.path)
            raw = url.path.split("/")[1:]
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if raw[:3] != ["api", "v1", "models"] or len(raw) < 5:
                return
            self._gate()
            m = self._model(f"{unquote(raw[3])}/{unquote(raw[4])}")
            rest = raw[5:]
            if not rest:
                raise self._ms_ok({"Id": abs(hash(m.repo_id)) % 100000, "Name": m.repo_id.split("/")[1],
                                   "Path": m.repo_id.split("/")[0], "ChineseName": "", "Private": False,
                                   "Revision": "master"})
            if rest == ["revisions"]:
                def entries(kind: str) -> List[dict]:
                    names = [r for r in m.refs if (r in ("main", "master")) == (kind == "branch")]
                    return [{"Revision": r, "CreatedAt": 1767225600, "Description": "",
                             **({"CommitId": m.refs[r]} if hub.faults.commit_ids else {})} for r in sorted(names)]
                raise self._ms_ok({"RevisionMap": {"Branches": entries("branch"), "Tags": entries("tag")}})
            rev = self._revision(m, q.get("Revision") or "master")
            if rest == ["repo", "files"]:
                recursive = q.get("Recursive", "").lower() == "true"
                root = (q.get("Root") or "").strip("/")
                prefix = root + "/" if root else ""
                files, dirs = [], set()
                for p, f in sorted(hub.listed(rev).items()):
                    if not p.startswith(prefix):
                        continue
                    parts = p[len(prefix):].split("/")
                    for i in range(1, len(parts)):
                        dirs.add(prefix + "/".join(parts[:i]))
                    if len(parts) > 1 and not recursive:
                        continue
                    files.append({"Name": parts[-1], "Path": p, "Type": "blob", "Size": f.size,
                                  "Sha256": hub.claimed_sha256(f), "Revision": rev.commit, "IsLFS": f.lfs,
                                  "Mode": "33188", "CommitId": rev.commit})
                tree = [{"Name": d.split("/")[-1], "Path": d, "Type": "tree", "Size": 0, "Sha256": "",
                         "Revision": rev.commit, "IsLFS": False, "Mode": "16384"}
                        for d in sorted(dirs) if recursive or "/" not in d[len(prefix):]]
                raise self._ms_ok({"Files": tree + files, "LatestCommitter": {"Id": rev.commit}})
            if rest == ["repo"] and "FilePath" in q:
                path = q["FilePath"]
                body = hub.body(rev, path)
                if body is None:
                    raise _json_reply(404, {"Code": 10010205001, "Message": f"file {path} not found", "Success": False})
                headers = {"X-Repo-Commit": rev.commit}
                if body.file.lfs and hub.faults.redirect:
                    self._redirect(m.repo_id, rev, path, headers)
                self._file(body, headers)

        # --- the storage bridge --------------------------------------------------------------------------------
        def _bridge(self) -> None:
            if "authorization" in self.rec.headers:
                raise _Reply(400, {"Content-Type": "application/xml"},
                             b"<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed</Message></Error>")
            raw = urlsplit(self.path).path.split("/")[1:]
            if len(raw) < 4:
                return
            m = self._model(f"{unquote(raw[0])}/{unquote(raw[1])}")
            rev = self._revision(m, unquote(raw[2]))
            body = hub.body(rev, "/".join(unquote(p) for p in raw[3:]))
            if body is None:
                raise _Reply(404, {}, b"NoSuchKey")
            self._file(body, {"ETag": f'"{body.sha256}"'})

    return Handler

