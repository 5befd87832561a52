"""Settings for a Ray started inside this process (`make train`, `make serve`): token auth, loopback only.

Ray has no authentication by default and its GCS, raylet, worker and agent ports accept anyone who can reach
them (arbitrary code execution: ShadowRay, CVE-2023-48022). For an embedded, single-node Ray we:
- turn on Ray's token authentication (`RAY_AUTH_MODE=token`, Ray >= 2.52): every gRPC and dashboard/agent
  HTTP request must carry the token. The token is made per run, 256 random bits, and handed to Ray's processes
  only through their environment (never written to disk); set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH to choose
  one (e.g. to attach `ray` CLI tools);
- make the node's address 127.0.0.1 (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, the single-machine mode Ray uses
  on macOS/Windows), so GCS, raylet, workers, agents and the metrics exporter listen on loopback only.
Both must be in the environment before `import ray`: Ray reads them at import / process start.
`RLP_RAY_LOOPBACK=0` keeps the token but lets Ray use the machine's address: for a container, whose network
namespace is the fence and whose published ports (the API, metrics :8080) must reach Ray's listeners
(docker/serve.sh sets it).
Connecting to an existing cluster (KubeRay) changes nothing here: the pod's RAY_AUTH_MODE / RAY_AUTH_TOKEN
(set by the chart) apply.
"""

from __future__ import annotations

import os
import secrets
import sys
from typing import Any, MutableMapping

# Ray's own names for the modes (RAY_AUTH_MODE); "disabled" is Ray's default and the documented opt-out.
AUTH_MODES = ("token", "disabled")
INSECURE_WARNING = (
    "Ray token authentication is disabled: any process that can reach this machine's Ray ports can run code as "
    "you. Use only on a machine nobody else can reach."
)


def configure(auth: str = "token", environ: MutableMapping[str, str] = os.environ) -> str:
    """Prepare `environ` for an embedded Ray; returns a short description of what was set."""
    if auth not in AUTH_MODES:
        raise ValueError(f"Ray auth mode must be one of {', '.join(AUTH_MODES)}, got {auth!r}")
    loopback = environ.get("RLP_RAY_LOOPBACK", "1") != "0"
    if loopback:
        environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    environ["RAY_AUTH_MODE"] = auth
    if auth == "token" and not environ.get("RAY_AUTH_TOKEN") and not environ.get("RAY_AUTH_TOKEN_PATH"):
        environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and environ is os.environ and loopback:
        # Ray was imported before us (a library caller): its node-IP choice reads this at ray.init time.
        constants.ENABLE_RAY_CLUSTER = False
    return f"Ray auth {auth}, listening on {'127.0.0.1' if loopback else 'this machine address (RLP_RAY_LOOPBACK=0)'}"


# Ray's message when the local node it starts does not come up in time (ray/_private/node.py: a fixed 30 s for the
# raylet to register with the GCS, not configurable), and the one line every entry point shows instead.
STARTUP_TIMEOUT = "timed out during startup"
DID_NOT_START = "a local Ray did not start"


def start_failure(e: BaseException) -> str | None:
    """The one-line error for Ray's own start-up timeout (it raises a bare Exception), or None for anything else."""
    if type(e) is not Exception or STARTUP_TIMEOUT not in str(e):
        return None
    return (f"{DID_NOT_START}: Ray's raylet did not register with its GCS within Ray's fixed 30 s "
            "(an overloaded machine: rerun when CPUs are free)")


def init_local(**kwargs: Any) -> Any:
    """`ray.init(**kwargs)` for a Ray this process starts itself, with one more try after Ray's start-up timeout.

    Ray gives its raylet a fixed 30 s to register with the GCS; on a machine whose CPUs are saturated for a while
    (a node packed with pods, a test run) that can fail once and work a minute later. Before the second try the
    half-started Ray of the first (its GCS, raylet and agents: this process's children) is stopped, so the two never
    run side by side; a second timeout propagates (start_failure names it).
    """
    import ray

    try:
        return ray.init(**kwargs)
    except Exception as e:
        if start_failure(e) is None:
            raise
    print(f"{DID_NOT_START} within Ray's fixed 30 s (an overloaded machine): stopping what it started and trying "
          "once more", file=sys.stderr, flush=True)
    stop_started_ray()
    return ray.init(**kwargs)


def stop_started_ray(timeout_s: float = 10.0) -> list[int]:
    """Kill the Ray processes this process started (its children running Ray's binaries and scripts, and its
    workers and agents, which Ray renames `ray::...`); their pids."""
    import psutil
    import ray

    try:
        ray.shutdown()
    except Exception:  # nothing was connected: the failed init left no worker to disconnect
        pass
    ray_dir = os.path.dirname(ray.__file__) + os.sep
    procs = []
    for p in psutil.Process().children(recursive=True):
        try:
            if any(ray_dir in arg or arg.startswith("ray::") for arg in p.cmdline()):
                procs.append(p)
        except psutil.Error:  # gone already
            continue
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=timeout_s)
    return [p.pid for p in procs]
