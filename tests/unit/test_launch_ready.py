"""`serving.launch.wait_ready` against real HTTP servers: the policy server's JSON answer is returned; a server that
answers /readyz with something else (CI once saw another process's Ray metrics port on the policy server's port)
is one LaunchError naming it, at once, not a JSONDecodeError traceback."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from serving import launch
from serving.launch import LaunchError


def _serve(body: bytes, ctype: str):
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize("body, ctype", [
    (b"# HELP ray_node_cpu_utilization Total CPU usage\n", "text/plain"),
    (b"", "text/plain"),
])
def test_a_foreign_answer_on_the_port_is_one_clear_error(body, ctype):
    srv = _serve(body, ctype)
    try:
        base = f"http://127.0.0.1:{srv.server_port}"
        t0 = time.monotonic()
        with pytest.raises(LaunchError, match=rf"{base}/readyz answered 200 without JSON .*another server holds "
                                              r"that port"):
            launch.wait_ready(base, 30)
        assert time.monotonic() - t0 < 10  # at once, not after the ready timeout
    finally:
        srv.shutdown()


def test_the_servers_own_answer_is_returned():
    want = {"status": "ready", "policies": {"cp": {"ready": True}}}
    srv = _serve(json.dumps(want).encode(), "application/json")
    try:
        assert launch.wait_ready(f"http://127.0.0.1:{srv.server_port}", 30) == want
    finally:
        srv.shutdown()
