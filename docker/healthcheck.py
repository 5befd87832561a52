"""Docker HEALTHCHECK for rl-platform containers (stdlib only; run as `python3 -I rlp-healthcheck`).

RLP_HEALTHCHECK: auto (default) probes serving containers only (the entrypoint writes /tmp/.rlp-role),
                 http probes always, off never.
RLP_HEALTH_URL:  what is probed (default http://127.0.0.1:8000/healthz, the Serve app's liveness route).
Exit 0 = healthy, 1 = unhealthy (Docker's contract).
"""
import os
import sys
import urllib.request

mode = os.environ.get("RLP_HEALTHCHECK", "auto")
url = os.environ.get("RLP_HEALTH_URL", "http://127.0.0.1:8000/healthz")

if mode == "off":
    sys.exit(0)
if mode == "auto":
    try:
        with open("/tmp/.rlp-role") as f:
            role = f.read().strip()
    except OSError:
        role = "serve"  # unknown: probe rather than report a server healthy that never was checked
    if role != "serve":
        print("not a serving container: nothing to probe")
        sys.exit(0)
try:
    with urllib.request.urlopen(url, timeout=4) as r:
        ok = 200 <= r.status < 300
        print(f"{url}: {r.status}")
except Exception as e:  # noqa: BLE001 - any failure is "unhealthy"
    print(f"{url}: {e}")
    ok = False
sys.exit(0 if ok else 1)
