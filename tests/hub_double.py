"""A stand-in for the Hugging Face Hub, served from memory on 127.0.0.1.

The test machines cannot reach huggingface.co, so `geniex pull` is tested against this double by
pointing `HF_ENDPOINT` at it; the real `huggingface_hub` client does the requests. It speaks the
part of the Hub protocol that `HfApi.model_info`, `HfApi.list_repo_files` and `hf_hub_download`
use (as read from huggingface_hub 2.x):

* `GET /api/models/{repo_id}[/revision/{rev}]` -> `{"id", "sha", "siblings": [{"rfilename"}]}`;
  with `?blobs=true` (`files_metadata=True`) siblings also carry `size`, `blobId` and `lfs`.
* `GET /api/models/{repo_id}/tree/{rev}` -> `[{"type": "file", "path", "size", "oid", "lfs"}]`
  (flat, one page; note the LFS hash is `lfs.oid` here but `lfs.sha256` in siblings).
* `HEAD|GET /{repo_id}/resolve/{rev}/{filename}`: the client insists on `X-Repo-Commit` and an
  `ETag` (it prefers `X-Linked-Etag`/`X-Linked-Size`, which the Hub sends for LFS files), and
  resumes a dropped download with `Range: bytes=N-`, expecting `206` and `Content-Range`.
* Errors carry `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`): that header,
  not the status code, is what the client turns into its typed exceptions.

Faults for tests: `break_download` closes the connection after N bytes of a file (then fails or
recovers), `throttle` slows a file down, and `hold` stops a file's body at a chosen byte until the
test lets it go, so that a test interrupts a pull mid-way whatever the machine's speed.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec


class Request(msgspec.Struct, frozen=True):
    method: str
    path: str
    headers: dict[str, str]


class _Fault(msgspec.Struct):
    after: int
    then: Literal["error", "recover"]
    tripped: bool = False


class Hold(msgspec.Struct):
    at: int
    reached: threading.Event = msgspec.field(default_factory=threading.Event)
    released: threading.Event = msgspec.field(default_factory=threading.Event)


class HubDouble:
    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        self.requests: list[Request] = []
        self._faults: dict[tuple[str, str], _Fault] = {}
        self._throttles: dict[tuple[str, str], tuple[int, float]] = {}
        self._holds: dict[tuple[str, str], Hold] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for hold in self._holds.values():
            hold.released.set()
        self._server.shutdown()
        self._server.server_close()

    def break_download(
        self, repo_id: str, filename: str, after: int, *, then: Literal["error", "recover"] = "error"
    ) -> None:
        """Drop the connection after `after` bytes of the file; later requests for it answer 500
        (`then="error"`: the hub went away) or are served normally (`"recover"`: resumable)."""
        self._faults[(repo_id, filename)] = _Fault(after=after, then=then)

    def throttle(self, repo_id: str, filename: str, *, chunk: int, delay: float) -> None:
        """Serve the file `chunk` bytes at a time, sleeping `delay` seconds between chunks."""
        self._throttles[(repo_id, filename)] = (chunk, delay)

    def hold(self, repo_id: str, filename: str, at: int) -> Hold:
        """Send the first `at` bytes of the file's next download, then nothing more until
        `released` is set (`reached` is set once those bytes are written)."""
        hold = self._holds[(repo_id, filename)] = Hold(at)
        return hold

    def commit(self, repo_id: str) -> str:
        digest = hashlib.sha1(repo_id.encode())
        for name, data in sorted(self.repos[repo_id].items()):
            digest.update(name.encode() + hashlib.sha256(data).digest())
        return digest.hexdigest()

    def requested(self, method: str, path_part: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and path_part in r.path]


def _make_handler(hub: HubDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects; every answer has a Content-Length

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._dispatch(head=True)

        def do_GET(self) -> None:
            self._dispatch(head=False)

        def _dispatch(self, *, head: bool) -> None:
            hub.requests.append(Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.split("/")[1:]]
            query = parse_qs(url.query)
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                self._api(f"{parts[2]}/{parts[3]}", parts[4:], query)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head=head)
            else:
                self._error(404, None, "not found", head=head)

        # -------------------------------------------------------------- /api/models

        def _api(self, repo_id: str, rest: list[str], query: dict[str, list[str]]) -> None:
            if repo_id not in hub.repos:
                return self._error(404, "RepoNotFound", "Repository not found")
            files = hub.repos[repo_id]
            sha = hub.commit(repo_id)
            if (rest[:1] == ["revision"] and len(rest) == 2) or (rest[:1] == ["tree"] and len(rest) >= 2):
                if rest[1] not in ("main", sha):
                    return self._error(404, "RevisionNotFound", "Invalid rev id")
            elif rest:
                return self._error(404, None, "not found")
            if rest[:1] == ["tree"]:
                # Flat: every file at any depth, no folder entries and no pagination (`Link` header).
                tree = [
                    {"type": "file", "path": n, "size": len(d), "oid": _git_oid(d), "lfs": _lfs(d, key="oid")}
                    for n, d in sorted(files.items())
                ]
                return self._json(tree)
            with_blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = [
                {"rfilename": n, "size": len(d), "blobId": _git_oid(d), "lfs": _lfs(d)}
                if with_blobs
                else {"rfilename": n}
                for n, d in sorted(files.items())
            ]
            self._json({"id": repo_id, "modelId": repo_id, "sha": sha, "private": False, "siblings": siblings})

        # -------------------------------------------------------------- /resolve

        def _resolve(self, repo_id: str, revision: str, filename: str, *, head: bool) -> None:
            if repo_id not in hub.repos:
                return self._error(404, "RepoNotFound", "Repository not found", head=head)
            sha = hub.commit(repo_id)
            if revision not in ("main", sha):
                return self._error(404, "RevisionNotFound", "Invalid rev id", head=head, commit=sha)
            data = hub.repos[repo_id].get(filename)
            if data is None:
                return self._error(404, "EntryNotFound", "Entry not found", head=head, commit=sha)
            etag = hashlib.sha256(data).hexdigest()
            fault = hub._faults.get((repo_id, filename))
            if not head and fault is not None and fault.tripped and fault.then == "error":
                return self._error(500, None, "Internal Error", commit=sha)

            start, status = 0, 200
            if (rng := self.headers.get("Range")) is not None and rng.startswith("bytes="):
                first, _, last = rng[len("bytes=") :].partition("-")
                start = int(first or 0)
                end = int(last) + 1 if last else len(data)
                body, status = data[start:end], 206
            else:
                body = data
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{etag}"')
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("X-Repo-Commit", sha)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return

            cut = None
            if fault is not None and not fault.tripped:
                cut = max(fault.after - start, 0)
            chunk, delay = hub._throttles.get((repo_id, filename), (1 << 20, 0.0))
            hold = hub._holds.get((repo_id, filename))
            sent = 0
            try:
                while sent < len(body):
                    piece = body[sent : sent + chunk]
                    if hold is not None and not hold.reached.is_set() and start <= hold.at <= start + sent + len(piece):
                        self.wfile.write(body[sent : hold.at - start])
                        self.wfile.flush()
                        sent = hold.at - start
                        hold.reached.set()
                        hold.released.wait(120)
                        continue
                    if cut is not None and sent + len(piece) >= cut:
                        self.wfile.write(body[sent:cut])
                        self.wfile.flush()
                        assert fault is not None
                        fault.tripped = True
                        # Mid-body close: the client sees fewer bytes than Content-Length promised.
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    self.wfile.write(piece)
                    self.wfile.flush()
                    sent += len(piece)
                    if delay:
                        time.sleep(delay)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away (e.g. an interrupted pull)

        # -------------------------------------------------------------- helpers

        def _json(self, value: object) -> None:
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(
            self, status: int, code: str | None, message: str, *, head: bool = False, commit: str | None = None
        ) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "0" if head else str(len(body)))
            self.send_header("X-Error-Message", message)
            if code is not None:
                self.send_header("X-Error-Code", code)
            if commit is not None:
                self.send_header("X-Repo-Commit", commit)
            self.end_headers()
            if not head:
                self.wfile.write(body)

    return Handler


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs(data: bytes, key: str = "sha256") -> dict[str, object]:
    # The same LFS record names its hash "sha256" in model info siblings but "oid" in tree listings.
    return {"size": len(data), key: hashlib.sha256(data).hexdigest(), "pointerSize": 134}
