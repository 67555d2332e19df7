"""A pass-through HTTP proxy in front of the GCS emulator that fixes one incompatibility.

Beam's GCS file system renames its temporary output shards with the JSON API's *batch* endpoint.
google-cloud-storage sends batch parts without a ``Content-ID`` header, which real GCS accepts but
fake-gcs-server silently skips, answering with an empty multipart reply. The proxy numbers the parts
of each batch request and forwards every request and reply otherwise unchanged, so the pipeline talks
to the real emulator through Beam's real GCS code.
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def number_batch_parts(body: bytes, content_type: str) -> bytes:
    """Add ``Content-ID: <i>`` to each part of a multipart/mixed batch body that lacks one."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not match:
        return body
    delimiter = b"--" + match.group(1).encode()
    pieces = body.split(delimiter)
    for i in range(1, len(pieces)):
        if not pieces[i].startswith(b"--") and b"content-id:" not in pieces[i].lower().split(b"\n\n")[0]:
            newline = b"\r\n" if pieces[i].startswith(b"\r\n") else b"\n"
            pieces[i] = newline + b"Content-ID: <part-%d>" % i + pieces[i]
    return delimiter.join(pieces)


class _Handler(BaseHTTPRequestHandler):
    upstream = ""

    def _forward(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if body is not None and self.path.startswith("/batch/"):
            body = number_batch_parts(body, self.headers.get("Content-Type", ""))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        request = urllib.request.Request(self.upstream + self.path, data=body, headers=headers, method=self.command)
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                status, reply_headers, content = reply.status, reply.headers, reply.read()
        except urllib.error.HTTPError as error:
            status, reply_headers, content = error.code, error.headers, error.read()
        self.send_response(status)
        for key, value in reply_headers.items():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, *args):
        pass


class BatchFixingProxy:
    """``with BatchFixingProxy(emulator_endpoint) as endpoint:`` point clients at ``endpoint``."""

    def __init__(self, upstream: str):
        handler = type("Handler", (_Handler,), {"upstream": upstream.rstrip("/")})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
