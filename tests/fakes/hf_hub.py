"""A loopback stand-in for the Hugging Face Hub, enough for the real huggingface_hub client to
create a repo, upload a file (preupload, LFS batch + basic PUT, commit) and download it
(HEAD/GET ``resolve``).

It speaks the plain-HTTP LFS protocol, not Xet: the client picks Xet by itself whenever hf_xet is
installed, so a client talking to this fake needs ``HF_HUB_DISABLE_XET=1`` (``hub.env`` has it; in
process, ``huggingface_hub.constants.HF_HUB_DISABLE_XET = True``). A Xet token request gets a 501
saying so, rather than a silent hang.

Every request is recorded (method, path with query, headers) so a test can check where the token
travelled. Write calls need ``Authorization: Bearer <hub.token>``; reads of a private repo do too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

# The Hub sends these to LFS: the patterns of its default .gitattributes, and anything from 10 MB.
_LFS_SUFFIXES = (".tar", ".gz", ".tgz", ".zip", ".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".onnx", ".npy")
_LFS_MIN_SIZE = 10 * 1024 * 1024
_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}


@dataclass
class Recorded:
    method: str
    path: str  # with the query string
    headers: dict[str, str]  # names lower-cased


@dataclass
class _File:
    lfs: bool
    size: int
    oid: str  # sha256 for LFS files, the git blob sha1 for regular ones
    blob: Path


@dataclass
class _Repo:
    private: bool
    files: dict[str, _File] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, root: Path, token: str | None = None):
        self.root = Path(root) / "fake-hf-hub"
        self.token = token or "hf_" + secrets.token_hex(16)
        self.requests: list[Recorded] = []
        self.repos: dict[tuple[str, str], _Repo] = {}
        self._lock = threading.Lock()
        self._signatures: dict[str, str] = {}  # presigned upload secret -> sha256 it may carry
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "FakeHub":
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll: shutdown() (each test's end) waits for the loop's next wake, 0.5 s by default.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to talk to this hub."""
        return {"HF_ENDPOINT": self.url, "HF_TOKEN": self.token, "HF_HUB_DISABLE_XET": "1"}

    def patch_client(self, monkeypatch) -> None:
        """Point this process's huggingface_hub at the fake: it reads HF_ENDPOINT and HF_HUB_DISABLE_XET
        once, at import, so an earlier import would otherwise still aim at huggingface.co."""
        for k, v in self.env.items():
            monkeypatch.setenv(k, v)
        import huggingface_hub.constants as constants

        monkeypatch.setattr(constants, "ENDPOINT", self.url)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)

    def file_bytes(self, repo_type: str, repo_id: str, path: str) -> bytes:
        return self.repos[(repo_type, repo_id)].files[path].blob.read_bytes()

    # -- storage -----------------------------------------------------------------------------

    def _blob(self, oid: str) -> Path:
        return self.root / "blobs" / oid


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    # -- plumbing ----------------------------------------------------------------------------

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        headers = {"Content-Type": "application/json", **(headers or {})}
        headers.setdefault("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, status: int, message: str, code: str | None = None, head: bool = False) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, b"" if head else json.dumps({"error": message}).encode(), headers, head=head)

    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def _record(self) -> None:
        with self.hub._lock:
            self.hub.requests.append(Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))

    def _repo(self, repo_type: str, repo_id: str, head: bool = False) -> _Repo | None:
        """The repo, or None after answering as the Hub does (a private repo is 'not found' without auth)."""
        repo = self.hub.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not self._authorized()):
            self._error(401 if repo else 404, "Repository not found", "RepoNotFound", head=head)
            return None
        return repo

    # -- routing -----------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def do_PUT(self) -> None:
        self._route()

    def _route(self) -> None:
        self._record()
        body = self._body() if self.command in ("POST", "PUT") else b""
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        query = urlsplit(self.path).query
        try:
            self._dispatch(parts, query, body)
        except (ValueError, KeyError) as e:
            self._error(400, f"bad request: {e}")

    def _dispatch(self, parts: list[str], query: str, body: bytes) -> None:
        m = self.command
        if m == "PUT" and parts[0] == "_lfs-upload":
            return self._lfs_put(parts[1], query, body)
        if parts == ["api", "agent-harnesses"] and m == "GET":  # the client's agent detection, on import
            return self._json(200, {"standardEnvVars": [], "harnesses": {}})
        if parts[:2] == ["api", "repos"] and parts[2:] == ["create"] and m == "POST":
            return self._create_repo(json.loads(body))
        if parts[0] == "api" and len(parts) >= 6 and parts[1] in _TYPES:
            repo_type, repo_id, action = _TYPES[parts[1]], f"{parts[2]}/{parts[3]}", parts[4]
            # parts[5:] is the revision: the fake keeps one, main
            if action == "preupload" and m == "POST":
                return self._preupload(repo_type, repo_id, json.loads(body))
            if action == "commit" and m == "POST":
                return self._commit(repo_type, repo_id, body)
            if action == "revision" and m == "GET":
                return self._repo_info(repo_type, repo_id)
            if action in ("xet-write-token", "xet-read-token"):
                return self._error(501, "this fake hub speaks plain-HTTP LFS only: set HF_HUB_DISABLE_XET=1")
        # LFS endpoints: /{datasets/}ORG/REPO.git/info/lfs/objects/{batch,verify}
        prefix, rest = (_TYPES[parts[0]], parts[1:]) if parts[0] in _TYPES else ("model", parts)
        if len(rest) == 6 and rest[1].endswith(".git") and rest[2:5] == ["info", "lfs", "objects"] and m == "POST":
            repo_id = f"{rest[0]}/{rest[1][:-4]}"
            if rest[5] == "batch":
                return self._lfs_batch(prefix, repo_id, json.loads(body))
            if rest[5] == "verify":
                return self._lfs_verify(json.loads(body))
        # Downloads: /{datasets/}ORG/REPO/resolve/REVISION/PATH
        if len(rest) >= 5 and rest[2] == "resolve" and m in ("GET", "HEAD"):
            return self._resolve(prefix, f"{rest[0]}/{rest[1]}", "/".join(rest[4:]))
        self._error(404, f"no such endpoint in the fake hub: {m} {urlsplit(self.path).path}")

    # -- endpoints ---------------------------------------------------------------------------

    def _create_repo(self, payload: dict) -> None:
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header")
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self.hub.url}/{prefix}{repo_id}"
        with self.hub._lock:
            if (repo_type, repo_id) in self.hub.repos:
                # The Hub's 409 still carries the url: create_repo(exist_ok=True) reads it.
                message = f"You already created this {repo_type} repo"
                return self._json(409, {"error": message, "url": url}, {"X-Error-Message": message})
            self.hub.repos[(repo_type, repo_id)] = _Repo(private=payload.get("visibility") == "private")
        self._json(200, {"url": url, "name": repo_id, "id": secrets.token_hex(12)})

    def _preupload(self, repo_type: str, repo_id: str, payload: dict) -> None:
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header")
        repo = self._repo(repo_type, repo_id)
        if repo is None:
            return
        files = []
        for f in payload["files"]:
            lfs = f["path"].lower().endswith(_LFS_SUFFIXES) or f["size"] >= _LFS_MIN_SIZE
            existing = repo.files.get(f["path"])
            entry = {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
            if existing is not None:
                entry["oid"] = existing.oid
            files.append(entry)
        self._json(200, {"files": files, "commitOid": repo.commits[-1] if repo.commits else "0" * 40})

    def _lfs_batch(self, repo_type: str, repo_id: str, payload: dict) -> None:
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header")
        if self._repo(repo_type, repo_id) is None:
            return
        objects = []
        for obj in payload["objects"]:
            answer = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if not self.hub._blob(obj["oid"]).exists():
                # Like S3's presigned URLs: a per-upload secret in the query, never the user's token.
                sig = secrets.token_hex(16)
                self.hub._signatures[sig] = obj["oid"]
                prefix = "" if repo_type == "model" else f"{repo_type}s/"
                answer["actions"] = {
                    "upload": {"href": f"{self.hub.url}/_lfs-upload/{obj['oid']}?X-Amz-Signature={sig}"},
                    "verify": {"href": f"{self.hub.url}/{prefix}{repo_id}.git/info/lfs/objects/verify"},
                }
            objects.append(answer)
        self._json(200, {"transfer": "basic", "objects": objects}, {"Content-Type": "application/vnd.git-lfs+json"})

    def _lfs_put(self, oid: str, query: str, body: bytes) -> None:
        sig = query.partition("X-Amz-Signature=")[2]
        if self.hub._signatures.pop(sig, None) != oid:
            return self._error(403, "SignatureDoesNotMatch")
        if hashlib.sha256(body).hexdigest() != oid:
            return self._error(400, "uploaded content does not match its sha256")
        self.hub._blob(oid).write_bytes(body)
        self._send(200, headers={"ETag": f'"{hashlib.md5(body).hexdigest()}"'})

    def _lfs_verify(self, payload: dict) -> None:
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header")
        blob = self.hub._blob(payload["oid"])
        if not blob.exists() or blob.stat().st_size != payload["size"]:
            return self._error(404, "object not uploaded")
        self._json(200, {"success": True})

    def _commit(self, repo_type: str, repo_id: str, body: bytes) -> None:
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header")
        repo = self._repo(repo_type, repo_id)
        if repo is None:
            return
        changes: dict[str, _File] = {}
        for line in body.splitlines():
            item = json.loads(line)
            value = item["value"]
            if item["key"] == "file":
                data = base64.b64decode(value["content"])
                oid = _git_sha1(data)
                blob = self.hub._blob(oid)
                blob.write_bytes(data)
                changes[value["path"]] = _File(lfs=False, size=len(data), oid=oid, blob=blob)
            elif item["key"] == "lfsFile":
                blob = self.hub._blob(value["oid"])
                if not blob.exists():
                    return self._error(422, f"LFS object {value['oid']} of {value['path']} was never uploaded")
                changes[value["path"]] = _File(lfs=True, size=blob.stat().st_size, oid=value["oid"], blob=blob)
            elif item["key"] != "header":
                return self._error(400, f"the fake hub does not do {item['key']!r} operations")
        with self.hub._lock:
            parent = repo.commits[-1] if repo.commits else ""
            tree = json.dumps(sorted((p, f.oid) for p, f in changes.items()))
            sha = hashlib.sha1((parent + tree).encode()).hexdigest()
            repo.files.update(changes)
            repo.commits.append(sha)
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self.hub.url}/{prefix}{repo_id}/commit/{sha}"
        self._json(200, {"success": True, "commitOid": sha, "commitUrl": url})

    def _repo_info(self, repo_type: str, repo_id: str) -> None:
        repo = self._repo(repo_type, repo_id)
        if repo is None:
            return
        self._json(
            200,
            {
                "id": repo_id,
                "private": repo.private,
                "sha": repo.commits[-1] if repo.commits else None,
                "siblings": [{"rfilename": p} for p in sorted(repo.files)],
            },
        )

    def _resolve(self, repo_type: str, repo_id: str, path: str) -> None:
        head = self.command == "HEAD"
        repo = self._repo(repo_type, repo_id, head=head)
        if repo is None:
            return
        f = repo.files.get(path)
        if f is None:
            return self._error(404, "Entry not found", "EntryNotFound", head=head)
        data = f.blob.read_bytes()
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{f.oid}"',
            "X-Repo-Commit": repo.commits[-1],
            "Accept-Ranges": "bytes",
        }
        if f.lfs:
            headers |= {"X-Linked-Etag": f'"{f.oid}"', "X-Linked-Size": str(f.size)}
        status, rng = 200, self.headers.get("Range", "")
        if rng.startswith("bytes=") and rng[6:].endswith("-"):
            start = int(rng[6:-1])
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            data, status = data[start:], 206
        self._send(status, data, headers, head=head)
