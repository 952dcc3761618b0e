"""A loopback server that speaks the Hugging Face hub endpoints huggingface_hub uses, for tests only.

Serves model and dataset repositories held in memory at named revisions:
  HEAD/GET /{repo}/resolve/{rev}/{path}            (models)     with X-Repo-Commit, ETag / X-Linked-Etag
  HEAD/GET /datasets/{repo}/resolve/{rev}/{path}   (datasets)   (= sha256 for LFS files), sizes, byte ranges
  GET /api/{models|datasets}/{repo}/revision/{rev}               repository info with the file listing
  GET /api/{models|datasets}/{repo}/tree/{rev}[/{dir}]           tree listing with LFS sha256
It can be told to corrupt a file (bytes change, advertised hash does not), to cut a transfer short once
(truncate), or to resolve a revision name to another commit. Binds 127.0.0.1 only and stops with the test.
"""
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_MIN_BYTES = 1024  # files at least this large are served as LFS files (etag = sha256), as on the hub


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, repo_type, repo_id, commit, files, branch="main"):
        self.repo_type, self.repo_id = repo_type, repo_id
        self.commits = {commit: dict(files)}
        self.refs = {branch: commit}

    def resolve(self, rev):
        if rev in self.commits:
            return rev
        return self.refs.get(rev)


class HubState:
    def __init__(self):
        self.repos = {}
        self.corrupt = set()          # (repo_id, path): serve one flipped byte
        self.truncate_once = {}       # (repo_id, path) -> bytes to send before dropping the connection
        self.redirect_revision = {}   # (repo_id, rev) -> another commit the revision resolves to
        self.log = []                 # (method, path, range header) of every request, for assertions

    def add(self, repo):
        self.repos[(repo.repo_type, repo.repo_id)] = repo


def _file_meta(data):
    meta = {"size": len(data), "oid": git_blob_sha1(data)}
    if len(data) >= LFS_MIN_BYTES:
        meta["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "sha256": hashlib.sha256(data).hexdigest(),
                       "size": len(data), "pointerSize": 134}
    return meta


class HubHandler(BaseHTTPRequestHandler):
    """The request handler; `state` (a HubState) is set on the subclass make_handler creates."""
    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, code, body=b"", headers=None, head=False):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _error(self, code, error_code, message, head=False):
        body = json.dumps({"error": message}).encode()
        self._send(code, body, {"X-Error-Code": error_code, "X-Error-Message": message,
                                "Content-Type": "application/json"}, head=head)

    def _repo(self, repo_type, repo_id, rev, head=False):
        repo = self.state.repos.get((repo_type, repo_id))
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found", head)
            return None, None
        commit = self.state.redirect_revision.get((repo_id, rev)) or repo.resolve(rev)
        if commit is None or commit not in repo.commits:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return None, None
        return repo, commit

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _route(self, head):
        self.state.log.append((self.command, self.path, self.headers.get("Range")))
        path = self.path.split("?", 1)[0]
        m = re.match(r"^/(datasets/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$", path)
        if m:
            return self._resolve("dataset" if m.group(1) else "model", m["repo"], m["rev"], m["file"], head)
        m = re.match(r"^/api/(?P<kind>models|datasets)/(?P<repo>[^/]+/[^/]+)/(?P<what>revision|tree)/"
                     r"(?P<rev>[^/]+)(?:/(?P<dir>.*))?$", path)
        if m:
            return self._api(m["kind"][:-1], m["repo"], m["what"], m["rev"], m["dir"] or "", head)
        self._error(404, "EntryNotFound", f"no route for {path}", head)

    def _resolve(self, repo_type, repo_id, rev, file, head):
        repo, commit = self._repo(repo_type, repo_id, rev, head)
        if repo is None:
            return
        files = repo.commits[commit]
        if file not in files:
            return self._error(404, "EntryNotFound", f"{file} does not exist at {rev}", head)
        data = files[file]
        meta = _file_meta(data)
        if (repo_id, file) in self.state.corrupt:
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF
            data = bytes(data)
        headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if "lfs" in meta:
            headers.update({"ETag": f'"{meta["lfs"]["sha256"]}"', "X-Linked-Etag": f'"{meta["lfs"]["sha256"]}"',
                            "X-Linked-Size": str(len(data))})
        else:
            headers["ETag"] = f'"{meta["oid"]}"'
        start = 0
        rng = self.headers.get("Range")
        if rng and not head:
            m = re.match(r"bytes=(\d+)-(\d*)$", rng)
            start = int(m.group(1)) if m else 0
            end = int(m.group(2)) if m and m.group(2) else len(data) - 1
            body = data[start:end + 1]
            headers["Content-Range"] = f"bytes {start}-{start + len(body) - 1}/{len(data)}"
            code = 206
        else:
            body, code = data, 200
        headers["Content-Length"] = str(len(body))
        cut = self.state.truncate_once.pop((repo_id, file), None) if not head else None
        if cut is not None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(code, body, headers, head=head)

    def _api(self, repo_type, repo_id, what, rev, subdir, head):
        repo, commit = self._repo(repo_type, repo_id, rev, head)
        if repo is None:
            return
        files = repo.commits[commit]
        if what == "revision":
            info = {"id": repo_id, "sha": commit, "private": False,
                    "siblings": [{"rfilename": p, **_file_meta(d)} for p, d in sorted(files.items())]}
        else:
            prefix = subdir.rstrip("/") + "/" if subdir else ""
            info = [{"type": "file", "path": p, **_file_meta(d)} for p, d in sorted(files.items())
                    if p.startswith(prefix) and "/" not in p[len(prefix):]]
            dirs = sorted({p[len(prefix):].split("/")[0] for p in files
                           if p.startswith(prefix) and "/" in p[len(prefix):]})
            info += [{"type": "directory", "path": prefix + d, "oid": "0" * 40, "size": 0} for d in dirs]
        body = json.dumps(info).encode()
        self._send(200, body, {"Content-Type": "application/json", "X-Repo-Commit": commit}, head=head)


def make_handler(state):
    return type("Handler", (HubHandler,), {"state": state})


class HubServer:
    """Start with `with HubServer(state) as url:`; set HF_ENDPOINT=url for the code under test."""

    def __init__(self, state):
        self.state = state
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
