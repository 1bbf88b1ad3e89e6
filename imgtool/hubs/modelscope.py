"""ModelScope (and what speaks its API: a `$MODELSCOPE_ENDPOINT`/`$MODELSCOPE_DOMAIN`) as a source of model
snapshots.

The requests are modelscope 1.40's (docs/testing.md, "The model hubs on loopback"), every answer wrapped
`{Code, Data, Message, Success}`: `GET /api/v1/models/{id}/revisions` -> `Data.RevisionMap.{Branches,Tags}
[{Revision, CommitId}]` (the commit a branch or tag names, where the hub gives one: modelscope's client reads only
`Revision`); `GET /api/v1/models/{id}/repo/files?Revision=&Recursive=true` -> `Data.Files[{Path, Type, Size,
Sha256, IsLFS}]` (every file's sha256; not paged: read whole, at most 32 MiB); `GET /api/v1/models/{id}/repo
?Revision=&FilePath=` -> the bytes (Range honoured, an LFS file maybe by a redirect to storage).
"""

from typing import List
from urllib.parse import quote, urlencode

from ..errors import ManifestError, NotFoundError, RegistryError
from ..model import json_object
from ..registry_answers import Answer
from ..weights import MAX_FILES, ModelFile, ModelRef, is_commit
from .base import Hub, MissingOnHub, is_hex40, not_a_listing, sha256_of
from .http import hub_error_text

MAX_LISTING_BYTES = 32 * 1024 * 1024  # the whole listing in one answer (~250 bytes a file)
LOGIN_HINT = "the model is gated or private: set MODELSCOPE_API_TOKEN to an access token of modelscope.cn"


class ModelScope(Hub):
    """A ModelScope endpoint."""

    kind = "modelscope"
    token_hint = "set MODELSCOPE_API_TOKEN"

    def _api(self, repo: str) -> str:
        return f"{self.http.base_url}/api/v1/models/{repo}"

    def _data(self, answer: Answer, ref: ModelRef, what: str, limit: int) -> dict:
        """The `Data` of a 200 answer that says `Success`; the error it is otherwise."""
        if answer.status_code == 404:
            raise NotFoundError(f"{self.host}: {what}: not found ({hub_error_text(answer)})")
        if answer.status_code != 200:
            raise self.http.refused(answer, what)
        doc = json_object(answer.body, limit, lambda why: not_a_listing(self.host, ref, why))
        data = doc.get("Data")
        if doc.get("Success") is False or not isinstance(data, dict):
            raise RegistryError(f"{self.host}: {what}: {str(doc.get('Message') or 'no Data in the answer')[:200]}")
        return data

    def commit(self, ref: ModelRef, timeout=None) -> str:
        rev = ref.default_revision
        if is_commit(rev):
            return rev
        what = f"{ref} revision {rev}"
        answer = self.http.get(f"{self._api(ref.repo)}/revisions", limit=MAX_LISTING_BYTES,
                               what=f"{self.host}: {ref} revisions", timeout=timeout)
        if answer.status_code == 404:  # the model's revisions are not there: the model is not
            raise MissingOnHub(self.host, ref, f"no such model ({hub_error_text(answer)})")
        data = self._data(answer, ref, what, MAX_LISTING_BYTES)
        found = data.get("RevisionMap")
        if not isinstance(found, dict):
            raise not_a_listing(self.host, ref, "no RevisionMap in its answer for the revisions")
        for kind in ("Branches", "Tags"):
            for entry in found.get(kind) or []:
                if isinstance(entry, dict) and entry.get("Revision") == rev:
                    commit = entry.get("CommitId")
                    return str(commit) if is_hex40(commit) else rev  # no commit given: the revision is the name
        raise MissingOnHub(self.host, ref, "no such revision (not among the model's branches and tags)")

    def listing(self, ref: ModelRef, commit: str) -> List[ModelFile]:
        query = urlencode({"Revision": commit, "Recursive": "true"})
        what = f"{ref} file list"
        answer = self.http.get(f"{self._api(ref.repo)}/repo/files?{query}", limit=MAX_LISTING_BYTES,
                               what=f"{self.host}: {what}")
        entries = self._data(answer, ref, what, MAX_LISTING_BYTES).get("Files")
        if not isinstance(entries, list):
            raise not_a_listing(self.host, ref, "no Files in its answer")
        if len(entries) > 2 * MAX_FILES:
            raise not_a_listing(self.host, ref, f"more than {2 * MAX_FILES} entries")
        files: List[ModelFile] = []
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("Path"), str):
                raise not_a_listing(self.host, ref, f"an entry without a Path: {str(e)[:120]}")
            path, kind = e["Path"], e.get("Type")
            if kind == "tree":
                continue
            if kind != "blob":
                raise ManifestError(f"{self.host}: {ref}: the hub lists {path!r} as a {str(kind)[:20]!r}, not a file "
                                    "or a directory: not a file imgtool places")
            size = e.get("Size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise not_a_listing(self.host, ref, f"{path!r} has no size")
            try:
                sha256 = sha256_of(e.get("Sha256"))
            except ValueError as why:
                raise not_a_listing(self.host, ref, f"{path!r}: {why}") from None
            files.append(ModelFile(path, size, sha256, lfs=e.get("IsLFS") is True))
        return files

    def file_url(self, ref: ModelRef, commit: str, path: str) -> str:
        return f"{self._api(ref.repo)}/repo?Revision={quote(commit, safe='')}&FilePath={quote(path, safe='')}"
