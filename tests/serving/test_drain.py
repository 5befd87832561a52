"""SIGTERM to `python -m serving` drains: act requests the replica is in the middle of when the signal comes still
get their 200 and a valid action, then the process exits 0.

The in-flight requests are slow uploads, as from a client on a slow link: headers and the first bytes of the body go
out before the signal, the rest at 0.5, 1.5, 2.5 and 3.5 s after it. The replica's own `/healthz` `acting` count says
when all four are inside the replica (no sleep stands in for that). A stopping replica waits for its ongoing
requests up to `graceful_shutdown_timeout_s` (5 s in serve_config.yaml) after Serve's direct-ingress draining period
(2 s, serving.launch): a server that stopped at once, or a config with no grace, fails every one of them.
"""

from __future__ import annotations

import http.client
import json
import signal
import time

import pytest
import requests

from conftest import ServerProcess

pytestmark = [pytest.mark.serve, pytest.mark.slow]

FINISH_AFTER_S = (0.5, 1.5, 2.5, 3.5)  # when each held request's body completes, counted from the signal


def test_sigterm_lets_in_flight_requests_finish(serving_workdir, cartpole_checkpoint):
    wd = serving_workdir / "drain"
    wd.mkdir()
    srv = ServerProcess(wd, {"default": cartpole_checkpoint})
    n = len(FINISH_AFTER_S)
    bodies = [json.dumps({"observation": [0.01 * i] * 4}).encode() for i in range(n)]
    conns, answers = [], []
    try:
        for body in bodies:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            c.putrequest("POST", "/v1/policies/default/act")
            c.putheader("Content-Type", "application/json")
            c.putheader("Content-Length", str(len(body)))
            c.endheaders()
            c.send(body[:5])
            conns.append(c)
        deadline = time.monotonic() + 30
        acting = 0
        while acting < n:
            acting = requests.get(f"{srv.base}/healthz", timeout=5).json()["acting"]
            assert time.monotonic() < deadline, f"only {acting} of {n} act requests reached the replica"
            time.sleep(0.02)
        t_signal = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        for c, body, at in zip(conns, bodies, FINISH_AFTER_S):
            time.sleep(max(0.0, t_signal + at - time.monotonic()))  # the client's pace, not a readiness wait
            try:
                c.send(body[5:])
                r = c.getresponse()
                answers.append((r.status, json.loads(r.read() or b"null"), round(time.monotonic() - t_signal, 2)))
            except (OSError, http.client.HTTPException) as e:
                answers.append((type(e).__name__, str(e), round(time.monotonic() - t_signal, 2)))
        code = srv.proc.wait(timeout=90)
    finally:
        for c in conns:
            c.close()
        if srv.proc.poll() is None:
            srv.stop()
    assert [a[0] for a in answers] == [200] * n, (answers, srv.log_tail())
    assert all(a[1]["action"] in (0, 1) for a in answers), answers
    assert code == 0, srv.log_tail()
    print(f"\n{n} in-flight requests answered at {[a[2] for a in answers]} s after SIGTERM; exit {code}")
