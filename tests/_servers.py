"""Small servers on 127.0.0.1 for tests of the services a search reaches: one that answers HTTP with a fixed status
per path (an MLflow tracking server's REST API, or a server that is not one), and a port nothing listens on."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MLFLOW_API = "/api/2.0/mlflow/experiments/search"


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def http_server(statuses: dict[str, int], default: int = 404, put: int | None = None) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering GET ``path`` with ``statuses[path]`` (else ``default``) and a JSON body,
    and every PUT with ``put`` (unsupported, 501, when None); yields its URL."""

    class Answer(BaseHTTPRequestHandler):
        def do_PUT(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"error_code": "INTERNAL_ERROR", "message": "could not reach the bucket"}'
            self.send_response(put or 501)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            status = statuses.get(self.path.split("?")[0], default)
            body = b'{"experiments": []}' if status == 200 else b'{"error_code": "NOT_FOUND"}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
