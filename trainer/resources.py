"""resources/ config group -> Ray connection and RLlib placement (rollout pool vs learner pool)."""

from __future__ import annotations

import os
import socket
from typing import Any

import embedded_ray
from trainer.config import ResourcesConf
from trainer.errors import TrainerError


def set_torch_threads(n: int) -> None:
    """Cap intra-op threads in this process: on 2 cores torch's default oversubscription costs ~5x."""
    os.environ["OMP_NUM_THREADS"] = str(n)  # inherited by Ray workers started from here
    import torch

    torch.set_num_threads(n)


def prepare_embedded_ray(res: ResourcesConf, log) -> None:
    """Token auth + loopback-only ports for an embedded Ray (embedded_ray); must run before `import ray`."""
    if res.address:
        return
    import embedded_ray

    embedded_ray.configure(res.auth)
    if res.auth == "disabled":
        log("warning: " + embedded_ray.INSECURE_WARNING)


def ray_init_kwargs(res: ResourcesConf) -> dict[str, Any]:
    if res.address:
        return {"address": res.address, "log_to_driver": True, "logging_level": "WARNING"}
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "num_gpus": 0,
        "log_to_driver": True,
        "logging_level": "WARNING",
        # Workers are started on demand: prestarted idle workers would compete with the driver for 2 cores.
        "_system_config": {"enable_worker_prestart": False},
        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(res.torch_threads)}},
    }
    if res.num_cpus is not None:
        kwargs["num_cpus"] = res.num_cpus
    if res.ray_tmp_dir:
        kwargs["_temp_dir"] = os.path.abspath(res.ray_tmp_dir)
    return kwargs


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast with one line: Ray's own client retries an unreachable GCS for minutes."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise TrainerError(f"resources.address {address!r} is not 'auto', 'host:port' or 'ray://host:port'")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise TrainerError(f"cannot reach Ray at {address!r}: {e.strerror or e}") from None
    if "://" not in address:
        check_token(address, timeout_s)


def _client_token() -> str | None:
    """The token this process would present (Ray's order: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)."""
    if os.environ.get("RAY_AUTH_MODE") != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def check_token(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when the cluster's GCS refuses us for lack of its token: Ray's client would retry for minutes.

    One read-only gRPC call (GetClusterId) with the token this process would send; anything but UNAUTHENTICATED
    is left to ray.init to report.
    """
    import grpc

    token = _client_token()
    meta = [("authorization", f"Bearer {token}")] if token else None
    try:
        with grpc.insecure_channel(address) as ch:
            ch.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")(b"", timeout=timeout_s, metadata=meta)
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAUTHENTICATED:
            return
        if token is None:
            raise TrainerError(
                f"Ray at {address!r} requires token authentication: export RAY_AUTH_MODE=token and RAY_AUTH_TOKEN="
                "<the cluster's token> (KubeRay: kubectl get secret <raycluster> -o jsonpath='{.data.auth_token}' "
                "| base64 -d)"
            ) from None
        raise TrainerError(f"Ray at {address!r} rejected this process's token (RAY_AUTH_TOKEN / "
                           "RAY_AUTH_TOKEN_PATH / ~/.ray/auth_token): not the cluster's") from None


def init_ray(res: ResourcesConf) -> None:
    import ray

    if ray.is_initialized():
        return
    if res.address:
        check_reachable(res.address)
    kwargs = ray_init_kwargs(res)
    try:
        if res.address:
            ray.init(**kwargs)
        else:
            embedded_ray.init_local(**kwargs)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
        where = res.address or "a local Ray"
        raise TrainerError(f"cannot connect to Ray at {where!r}: {_reasons(e)}") from e
    except Exception as e:  # Ray raises a bare Exception when its own raylet does not register within 30 s
        msg = embedded_ray.start_failure(e)
        if msg is None:
            raise
        raise TrainerError(msg) from e


def _reasons(e: BaseException) -> str:
    """The first line of `e` and of each exception it was raised from: Ray's "Failed to connect to Ray cluster at
    ..." says where, its cause says why (a timeout, no matching node)."""
    parts: list[str] = []
    for _ in range(3):
        if e is None:
            break
        text = str(e).strip()
        line = text.splitlines()[0] if text else type(e).__name__
        if line not in parts:
            parts.append(line)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return ": ".join(parts)


def placement(res: ResourcesConf) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments for AlgorithmConfig.env_runners() and .learners().

    Isolation works through Ray custom resources: an env runner asks for 1 unit of `rollout_resource`, a learner
    for 1 unit of `learner_resource`; only the nodes of the matching pool advertise them, so Ray can place each
    actor nowhere else. GPUs are requested only when configured (faking GPUs on a CPU host crashes RLlib).
    """
    env_runners: dict[str, Any] = {
        "num_env_runners": res.num_env_runners,
        "num_cpus_per_env_runner": res.num_cpus_per_env_runner,
    }
    if res.rollout_resource:
        env_runners["custom_resources_per_env_runner"] = {res.rollout_resource: 1}
    learners: dict[str, Any] = {
        "num_learners": res.num_learners,
        "num_cpus_per_learner": res.num_cpus_per_learner,
        "num_gpus_per_learner": res.num_gpus_per_learner,
    }
    if res.learner_resource and res.num_learners > 0:
        learners["custom_resources_per_learner"] = {res.learner_resource: 1}
    return env_runners, learners
