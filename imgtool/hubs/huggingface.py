"""Hugging Face (and what speaks its API: hf-mirror.com, a `$HF_ENDPOINT`) as a source of model snapshots.

The requests are huggingface_hub 2.4's (docs/testing.md, "The model hubs on loopback"):
`GET /api/models/{repo}/revision/{rev}` -> `sha` (the commit); `GET /api/models/{repo}/tree/{commit}?recursive=true
&expand=false`, page after page by `Link: <...>; rel="next"` -> entries `{type, path, size, oid, lfs{oid, size}}`
(an LFS file's sha256 is `lfs.oid`; a small git file has only its git blob id, `oid`, and is hashed when
downloaded); `GET /{repo}/resolve/{commit}/{path}` -> the bytes, an LFS file's by a redirect to the storage
bridge. Each page is read whole, at most 4 MiB; at most MAX_PAGES pages and weights.MAX_FILES files.
"""

import re
from typing import List, Optional
from urllib.parse import quote, urljoin

from ..errors import ManifestError, RegistryError
from ..model import json_object
from ..registry_answers import MAX_ANSWER_BYTES, Answer
from ..registry_auth import origin
from ..weights import MAX_FILES, ModelFile, ModelRef
from .base import Hub, MissingOnHub, is_hex40, json_value, not_a_listing, sha256_of

MAX_PAGES = 1000
MAX_INFO_BYTES = 32 * 1024 * 1024  # the revision's answer lists every file's name (without ?blobs=true)
LOGIN_HINT = ("the model is gated or private: accept its terms on huggingface.co and set HF_TOKEN (or log in with "
              "`hf auth login`, which writes $HF_HOME/token)")


class HuggingFace(Hub):
    """A Hugging Face endpoint."""

    kind = "hf"
    token_hint = "set HF_TOKEN (or log in with `hf auth login`)"

    def _api(self, repo: str) -> str:
        return f"{self.http.base_url}/api/models/{repo}"

    def commit(self, ref: ModelRef, timeout=None) -> str:
        rev = ref.default_revision
        what = f"{ref} revision {rev}"
        answer = self.http.get(f"{self._api(ref.repo)}/revision/{quote(rev, safe='')}", limit=MAX_INFO_BYTES,
                               what=f"{self.host}: {what}", timeout=timeout)
        if answer.status_code != 200:
            raise self._refused(answer, ref, what)
        doc = json_object(answer.body, MAX_INFO_BYTES, lambda why: not_a_listing(self.host, ref, why))
        sha = doc.get("sha")
        if not is_hex40(sha):
            raise not_a_listing(self.host, ref, f"no commit (\"sha\") in its answer for revision {rev}")
        return str(sha)

    def _refused(self, answer: Answer, ref: ModelRef, what: str) -> RegistryError:
        code = answer.headers.get("X-Error-Code", "")
        if answer.status_code == 404 and code in ("RepoNotFound", "RevisionNotFound", ""):
            kind = "no such revision" if code == "RevisionNotFound" else "no such model"
            return MissingOnHub(self.host, ref, f"{kind} (HTTP 404{' ' + code if code else ''})")
        if answer.status_code == 401 and code == "RepoNotFound":  # huggingface.co's answer without a token
            return MissingOnHub(self.host, ref, "no such model, or a private one (HTTP 401 RepoNotFound)")
        return self.http.refused(answer, what)

    def listing(self, ref: ModelRef, commit: str) -> List[ModelFile]:
        url: Optional[str] = f"{self._api(ref.repo)}/tree/{commit}?recursive=true&expand=false"
        seen = set()
        files: List[ModelFile] = []
        entries = pages = 0
        while url:
            pages += 1
            if pages > MAX_PAGES:
                raise not_a_listing(self.host, ref, f"more than {MAX_PAGES} pages; imgtool stops reading there")
            seen.add(url)
            what = f"{self.host}: {ref} file list"
            answer = self.http.get(url, limit=MAX_ANSWER_BYTES, what=what)
            if answer.status_code != 200:
                raise self._refused(answer, ref, f"{ref} file list")
            page = json_value(answer.body, lambda why: not_a_listing(self.host, ref, why))
            if not isinstance(page, list):
                raise not_a_listing(self.host, ref, "a page that is not a list")
            entries += len(page)
            if entries > 2 * MAX_FILES:
                raise not_a_listing(self.host, ref, f"more than {2 * MAX_FILES} entries; imgtool stops reading there")
            files += [f for f in (self._entry(ref, e) for e in page) if f is not None]
            url = self._next_page(answer, ref)
            if url in seen:
                break
        if len(files) > MAX_FILES:
            raise not_a_listing(self.host, ref, f"more than {MAX_FILES} files")
        return files

    def _entry(self, ref: ModelRef, e: object) -> Optional[ModelFile]:
        """A tree entry as a file (None for a directory); ManifestError for anything else (a link, a submodule)."""
        if not isinstance(e, dict) or not isinstance(e.get("path"), str):
            raise not_a_listing(self.host, ref, f"an entry without a path: {str(e)[:120]}")
        path, kind = e["path"], e.get("type")
        if kind == "directory":
            return None
        if kind != "file":
            raise ManifestError(f"{self.host}: {ref}: the hub lists {path!r} as a {str(kind)[:20]!r}, not a file or a "
                                "directory: not a file imgtool places")
        size, oid, lfs = e.get("size"), e.get("oid"), e.get("lfs")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not is_hex40(oid):
            raise not_a_listing(self.host, ref, f"{path!r} has no size or git blob id")
        sha256 = None
        if lfs is not None:
            try:
                if not isinstance(lfs, dict) or lfs.get("size", size) != size:
                    raise ValueError("its LFS size is not its size")
                sha256 = sha256_of(lfs.get("oid"))
                if sha256 is None:
                    raise ValueError("no LFS sha256")
            except ValueError as why:
                raise not_a_listing(self.host, ref, f"{path!r}: {why}") from None
        return ModelFile(path, size, sha256, git_oid=str(oid), lfs=lfs is not None)

    def _next_page(self, answer: Answer, ref: ModelRef) -> Optional[str]:
        """The URL a `Link: <...>; rel="next"` names, relative to the page that answered; None for the last page."""
        for part in (answer.headers.get("Link") or "").split(","):
            m = re.match(r'\s*<([^<>]*)>\s*;(.*)$', part)
            if m and re.search(r'rel\s*=\s*"?next"?', m.group(2)):
                url = urljoin(answer.url, m.group(1).strip())
                try:
                    origin(url)
                except ValueError:
                    raise not_a_listing(self.host, ref, f"a malformed Link header {part[:120]!r}") from None
                return url
        return None

    def file_url(self, ref: ModelRef, commit: str, path: str) -> str:
        return f"{self.http.base_url}/{ref.repo}/resolve/{commit}/{quote(path)}"
