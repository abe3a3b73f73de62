"""A Hub-compatible HTTP server for tests: serves files of in-memory repos the way the
Hugging Face Hub does (`/{repo}/resolve/{revision}/{file}` with commit and ETag
headers, `/api/models/{repo}[/revision/{rev}]`), so that the real huggingface_hub
client downloads from it when HF_ENDPOINT points here."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Repo:
    def __init__(self, files: dict[str, str]):
        self.files = files  # repo path -> local file
        self.commit = hashlib.sha1(json.dumps(sorted(files)).encode()).hexdigest()
        self.etags = {}
        for name, path in files.items():
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            self.etags[name] = h.hexdigest()


class HubServer:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.gated: set[str] = set()  # repos that answer as the Hub does a gated repo to a client without access
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _resolve(self, head: bool):
                m = re.match(r"^/(?:models/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$", self.path.split("?")[0])
                if not m or m["repo"] not in hub.repos or m["file"] not in hub.repos[m["repo"]].files:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.end_headers()
                    return
                repo = hub.repos[m["repo"]]
                path = repo.files[m["file"]]
                size = os.path.getsize(path)
                start, end = 0, size - 1
                rng = self.headers.get("Range")
                if rng and not head:
                    a, _, b = rng.replace("bytes=", "").partition("-")
                    start, end = int(a or 0), int(b) if b else size - 1
                self.send_response(206 if rng and not head else 200)
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("ETag", f'"{repo.etags[m["file"]]}"')
                self.send_header("Content-Length", str(end - start + 1 if not head else size))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if not head:
                    with open(path, "rb") as f:
                        f.seek(start)
                        left = end - start + 1
                        while left > 0:
                            chunk = f.read(min(left, 1 << 20))
                            self.wfile.write(chunk)
                            left -= len(chunk)

            def _api(self):
                m = re.match(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<kind>revision|tree)/(?P<rev>[^/?]+))?", self.path)
                if not m or m["repo"] not in hub.repos:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RepoNotFound")
                    self.end_headers()
                    return
                repo = hub.repos[m["repo"]]
                if m["kind"] == "tree":  # list_repo_files
                    body = json.dumps([{"type": "file", "path": n, "size": os.path.getsize(p), "oid": repo.etags[n]}
                                       for n, p in repo.files.items()]).encode()
                else:  # model_info
                    body = json.dumps({"id": m["repo"], "modelId": m["repo"], "sha": repo.commit, "private": False,
                                       "siblings": [{"rfilename": n, "size": os.path.getsize(p)} for n, p in repo.files.items()],
                                       "tags": ["gguf"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _refuse_gated(self) -> bool:
                m = re.match(r"^/(?:api/models/|models/)?(?P<repo>[^/]+/[^/?]+)", self.path)
                if not m or m["repo"] not in hub.gated:
                    return False
                self.send_response(401)
                self.send_header("X-Error-Code", "GatedRepo")
                self.send_header("X-Error-Message", f"Access to model {m['repo']} is restricted.")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True

            def do_HEAD(self):
                hub.requests.append(f"HEAD {self.path}")
                if not self._refuse_gated():
                    self._resolve(head=True)

            def do_GET(self):
                hub.requests.append(f"GET {self.path}")
                if self._refuse_gated():
                    return
                if self.path.startswith("/api/"):
                    self._api()
                else:
                    self._resolve(head=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def add_repo(self, repo_id: str, files: dict[str, str]) -> None:
        self.repos[repo_id] = Repo(files)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
