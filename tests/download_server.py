"""A real HTTP server on 127.0.0.1 for download tests: files from memory, Range requests, and faults on demand.

Range support is written here (http.server has none): `Range: bytes=N-`
answers 206 with Content-Range. Faults: drop the connection after N bytes
(once), publish a wrong SHA-256, omit Content-Length (chunked), ignore Range.
Every request's path and Range header is recorded for the test to assert.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Served:
    data: bytes
    drop_after: int | None = None  # close the connection after this many body bytes, on the next request only
    publish_sha256: str | None = "right"  # "right", a hex string (wrong on purpose), or None
    chunked: bool = False  # no Content-Length: the client cannot know the size up front
    honour_range: bool = True
    delay_s: float = 0.0  # pause between 64 KiB pieces: a slow server, so a test can watch progress and cancel
    extra_headers: dict[str, str] = field(default_factory=dict)
    unframed: bool = False  # neither Content-Length nor chunked: the body ends when the connection closes
    content_length: int | None = None  # a Content-Length to state instead of the true one (a lie), and send that many
    range_start_shift: int = 0  # a 206 that starts this many bytes away from the asked offset (and says so)
    total_override: int | None = None  # a 206 answers as if the file had this size (a resume answered with another)
    redirect_to: str | None = None  # answer 302 with this Location (a loop, a file:// address)
    declared_length: int | None = None  # a Content-Length to state whatever is sent (a lie, too long or too short);
    # a body shorter than it ends by closing the connection, as a server whose file ran out would


class DownloadServer:
    def __init__(self) -> None:
        self.files: dict[str, Served] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet test output
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _serve(self, body: bool) -> None:
                server.requests.append((self.path, self.headers.get("Range")))
                served = server.files.get(self.path.split("?")[0])
                if served is None and self.path.startswith("/api/models/"):
                    # What the hub answers for a repository it does not have (or hides): 401 + RepoNotFound.
                    self.send_response(401)
                    self.send_header("X-Error-Code", "RepoNotFound")
                    self.send_header("X-Error-Message", "Repository not found")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if served is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "9")
                    self.end_headers()
                    if body:
                        self.wfile.write(b"not found")
                    return
                if served.redirect_to is not None:
                    self.send_response(302)
                    self.send_header("Location", served.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data, start = served.data, 0
                rng = self.headers.get("Range")
                if rng and served.honour_range:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    start = max(0, start + served.range_start_shift)
                    if served.total_override is not None:
                        data = data[: served.total_override]  # consistent with itself, not with the first answer
                    total = len(data)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{total}")
                else:
                    self.send_response(200)
                self.send_header("Accept-Ranges", "bytes")
                if served.publish_sha256 == "right":
                    digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
                    self.send_header("Repr-Digest", f"sha-256=:{digest}:")
                elif served.publish_sha256:
                    self.send_header("ETag", f'"{served.publish_sha256}"')
                for k, v in served.extra_headers.items():
                    self.send_header(k, v)
                chunk = data[start:]
                if served.content_length is not None and not rng:
                    chunk = chunk[: served.content_length]  # the lie's length, as a server that believes it
                if served.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                elif served.unframed:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                elif served.declared_length is not None and not (rng and served.honour_range):  # every 200
                    self.send_header("Content-Length", str(served.declared_length))
                    chunk = chunk[: served.declared_length]
                    if len(chunk) < served.declared_length:
                        self.close_connection = True
                else:
                    self.send_header("Content-Length", str(len(chunk)))
                self.end_headers()
                if not body:
                    return
                if served.unframed:
                    cut = served.drop_after if served.drop_after is not None else len(chunk)
                    served.drop_after = None
                    self.wfile.write(chunk[:cut])
                    self.wfile.flush()
                    self.connection.shutdown(2)  # the end of the body is the end of the connection
                    return
                if served.drop_after is not None:
                    cut, served.drop_after = served.drop_after, None
                    self.wfile.write(chunk[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the client sees the body end early
                    return
                if served.chunked:
                    for i in range(0, len(chunk), 65536):
                        piece = chunk[i : i + 65536]
                        self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                elif served.delay_s:
                    import time

                    for i in range(0, len(chunk), 65536):
                        self.wfile.write(chunk[i : i + 65536])
                        self.wfile.flush()
                        time.sleep(served.delay_s)
                else:
                    self.wfile.write(chunk)

        class QuietServer(ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # a client that hung up (a cancel, a full disk)
                pass

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def __enter__(self) -> "DownloadServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_hub_repo(server: DownloadServer, repo_id: str, files: dict[str, bytes], commit: str = "c" * 40,
                 wrong_sha256: set[str] = frozenset()) -> None:
    """Serve a model repository the way the Hugging Face hub does, for huggingface_hub pointed at `server`.

    `/api/models/<repo>` lists the files with sizes and, for weights, the
    SHA-256 the hub publishes (`lfs.sha256`; wrong on purpose for names in
    `wrong_sha256`); `/<repo>/resolve/<revision>/<file>` serves each file with
    the commit (X-Repo-Commit) and the SHA-256 as its ETag, as the hub does
    for large files.
    """
    import json

    siblings = []
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        entry = {"rfilename": name, "size": len(data)}
        if name.endswith((".gguf", ".safetensors")):
            published = hashlib.sha256(b"not " + data).hexdigest() if name in wrong_sha256 else sha
            entry["lfs"] = {"sha256": published, "size": len(data), "pointerSize": 134}
        siblings.append(entry)
        for revision in ("main", commit):
            server.files[f"/{repo_id}/resolve/{revision}/{name}"] = Served(
                data, publish_sha256=sha, extra_headers={"X-Repo-Commit": commit}
            )
    info = json.dumps({"id": repo_id, "modelId": repo_id, "sha": commit, "siblings": siblings}).encode()
    for path in (f"/api/models/{repo_id}", f"/api/models/{repo_id}/revision/main", f"/api/models/{repo_id}/revision/{commit}"):
        server.files[path] = Served(info, publish_sha256=None, extra_headers={"Content-Type": "application/json"})
