"""rl_metrics.KeptGauge on a real Ray: a gauge set once stays on Ray's metrics port, where Ray's own Gauge set the
same way leaves it after two report intervals (Ray's metrics agent's gauge TTL). The report interval is 1 s here
(Ray's floor), so Ray's gauge is gone within seconds and the test is short."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests

from trainer_helpers import RayHead, short_tmp

pytestmark = [pytest.mark.slow, pytest.mark.monitoring]

ROOT = Path(__file__).resolve().parents[2]
# An actor sets both gauges once, and a counter once (Ray keeps counters: the control that the port is read right).
DRIVER = textwrap.dedent("""
    import sys, time
    import ray
    from ray.util import metrics as m
    from rl_metrics import KeptGauge

    @ray.remote(num_cpus=0)
    class Emitter:
        def __init__(self):
            self.kept = KeptGauge("rlp_test_kept_gauge", "set once, kept", tag_keys=("k",))
            self.plain = m.Gauge("rlp_test_plain_gauge", "set once, Ray's own", tag_keys=("k",))
            self.count = m.Counter("rlp_test_counter", "incremented once", tag_keys=("k",))
            self.kept.set(7, {"k": "x"})
            self.plain.set(7, {"k": "x"})
            self.count.inc(1, {"k": "x"})

        def ready(self):
            return True

    ray.init(address=sys.argv[1])
    e = Emitter.remote()
    ray.get(e.ready.remote())
    print("set", flush=True)
    time.sleep(3600)
""")


def _series(port: int) -> set[str]:
    body = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {n for n in ("rlp_test_kept_gauge", "rlp_test_plain_gauge", "rlp_test_counter")
            if re.search(rf"^ray_{n}(_total)?{{[^}}]*k=\"x\"", body, re.M)}


def test_a_gauge_set_once_stays_exported_where_rays_own_is_dropped():
    env = {**os.environ, "RAY_metrics_report_interval_ms": "1000", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH")
                                                         else []))}
    env.pop("RAY_ADDRESS", None)
    work = Path(short_tmp("rlkg"))
    head = RayHead(str(work / "ray"), env)
    driver = None
    try:
        head.wait_metrics("ray_", 120)
        log = work / "driver.log"
        with open(log, "w") as out:
            driver = subprocess.Popen([sys.executable, "-c", DRIVER, head.address], cwd=ROOT, env=env, stdout=out,
                                      stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while "set\n" not in log.read_text():
            assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.25)
        # All three reach the port, then Ray's own gauge goes (TTL 2 s: two 1 s report intervals).
        deadline = time.monotonic() + 60
        seen: set[str] = set()
        while seen != {"rlp_test_kept_gauge", "rlp_test_plain_gauge", "rlp_test_counter"}:
            assert time.monotonic() < deadline, f"not all exported within 60 s: {seen}"
            seen |= _series(head.metrics_port)
            time.sleep(0.25)
        timeline = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15:
            timeline.append((round(time.monotonic() - t0, 1), sorted(_series(head.metrics_port))))
            time.sleep(0.5)
        late = [names for t, names in timeline if t >= 10]
        assert late and all("rlp_test_counter" in names for names in late), timeline  # the port is read right
        assert all("rlp_test_plain_gauge" not in names for names in late), (
            "Ray now keeps a gauge set once: rl_metrics.KeptGauge may no longer be needed", timeline)
        missing = [(t, names) for t, names in timeline if "rlp_test_kept_gauge" not in names]
        assert not missing, f"the kept gauge left Ray's metrics port: {missing}"
    finally:
        if driver is not None:
            driver.kill()
            driver.wait(timeout=30)
        head.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
