"""Greedy episodes of a checkpoint's policy: in this process, on Ray workers, or through the policy server's API.

In every mode the actions are the ones the server returns: `serving.policy.LoadedPolicy` (the same validation,
frame stacking per session and greedy rule the Serve replica runs) either here or behind HTTP. Episode i plays
with `env.reset(seed=seed0 + i)`, so two modes on the same seeds play the same episodes: equal per-episode returns
in-process and through the server are the end-to-end train/serve parity check.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np


class EvalError(Exception):
    """Bad input or an unreachable dependency: one line naming the problem (exit 2)."""


@dataclass(frozen=True)
class Episode:
    seed: int
    ret: float
    length: int
    truncated: bool  # cut at max_episode_steps (or the env's own time limit)


def make_env(env: str, env_config: dict[str, Any]):
    import rl_envs

    try:
        return rl_envs.make_env(env, env_config)
    except KeyError as e:
        raise EvalError(str(e.args[0])) from None


def _env_action(space: Any, action: Any) -> Any:
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return int(action)
    return np.asarray(action, dtype=space.dtype)


def play(act: Callable[[np.ndarray, str, bool], Any], env: Any, seeds: Sequence[int],
         max_episode_steps: int | None, end: Callable[[str], None] | None = None) -> list[Episode]:
    """`act(observation, session_id, first_step) -> action` for each seed's episode; `end(session_id)` after it."""
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        sid = f"rl-eval-{seed}-{uuid.uuid4().hex[:8]}"
        ret, n, first = 0.0, 0, True
        while True:
            obs, reward, terminated, truncated, _ = env.step(_env_action(env.action_space, act(obs, sid, first)))
            first = False
            ret += float(reward)
            n += 1
            cut = max_episode_steps is not None and n >= max_episode_steps
            if terminated or truncated or cut:
                out.append(Episode(int(seed), ret, n, bool(truncated or (cut and not terminated))))
                break
        if end is not None:
            end(sid)
    return out


# ------------------------------------------------------------------------------------------- in process


def load_policy(checkpoint: str, cache_dir: str | None = None):
    from serving.policy import LoadedPolicy

    return LoadedPolicy.load("rl-eval", checkpoint, cache_dir=cache_dir)


def local_actor(pol) -> Callable[[np.ndarray, str, bool], Any]:
    """Greedy actions of a loaded policy exactly as the server computes them for `act` requests."""

    def act(obs: np.ndarray, sid: str, first: bool) -> Any:
        if pol.sessions is not None:
            stacked, _, _ = pol.sessions.push(sid, pol.frame(obs), first)
            return pol.act(stacked[None])[0]
        return pol.act(pol.observation(obs)[None])[0]

    return act


def check_env_matches(pol, env: Any, env_name: str) -> None:
    """The env's observations must be what the policy's module takes (one frame of it when frames are stacked)."""
    want = pol.frame_shape if pol.frame_shape is not None else tuple(pol.observation_space.shape)
    got = tuple(env.observation_space.shape)
    if got != tuple(want) and not (pol.frame_shape is not None and got == tuple(want)[:-1]):
        raise EvalError(f"env {env_name!r} emits observations of shape {got}, the checkpoint's policy takes "
                        f"{tuple(want)}: a checkpoint for another env?")


def play_local(checkpoint: str, env_name: str, env_config: dict[str, Any], seeds: Sequence[int],
               max_episode_steps: int | None, torch_threads: int = 1) -> list[Episode]:
    """Load the policy here and play `seeds` (also the body of a Ray worker task)."""
    import logging

    import torch

    from rl_checkpoint import CheckpointError

    # RLlib's deprecation note for the inference-only twin the server builds too (serving.inference): noise here.
    logging.getLogger("ray._common.deprecation").setLevel(logging.ERROR)
    torch.set_num_threads(torch_threads)
    try:
        pol = load_policy(checkpoint)
    except CheckpointError as e:
        raise EvalError(str(e)) from None
    try:
        env = make_env(env_name, env_config)
        try:
            check_env_matches(pol, env, env_name)
            return play(local_actor(pol), env, seeds, max_episode_steps)
        finally:
            env.close()
    finally:
        pol.release()


def play_on_ray(checkpoint: str, env_name: str, env_config: dict[str, Any], seeds: Sequence[int],
                max_episode_steps: int | None, workers: int, resources: dict[str, float] | None = None) -> list[Episode]:
    """Split the seeds over `workers` Ray tasks (one CPU each, plus `resources`, e.g. the rollout pool's)."""
    import ray

    task = ray.remote(num_cpus=1, resources=resources or None, max_retries=1)(play_local)
    chunks = [list(c) for c in np.array_split(np.asarray(seeds, dtype=np.int64), max(1, workers)) if len(c)]
    refs = [task.remote(checkpoint, env_name, env_config, [int(s) for s in c], max_episode_steps) for c in chunks]
    try:
        parts = ray.get(refs)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else e
        if isinstance(cause, EvalError):
            raise cause from None
        raise EvalError(f"an evaluation worker failed: {type(cause).__name__}: {str(cause).splitlines()[0][:300]}") from None
    return [ep for part in parts for ep in part]


# ------------------------------------------------------------------------------------------- through the server


class ServerClient:
    """The policy server's HTTP API as an episode player sees it: `act` per step, a session per episode."""

    def __init__(self, url: str, policy: str, timeout_s: float = 10.0):
        import requests

        self.url = url.rstrip("/")
        self.policy = policy
        self.timeout_s = timeout_s
        self._requests = requests
        self.session = requests.Session()
        self.info = self._get(f"/v1/policies/{policy}")

    def _fail(self, what: str, e: Exception) -> EvalError:
        return EvalError(f"policy server {self.url} {what}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")

    def _get(self, path: str) -> dict[str, Any]:
        try:
            r = self.session.get(self.url + path, timeout=self.timeout_s)
        except self._requests.RequestException as e:
            raise self._fail("does not answer", e) from None
        if r.status_code == 404:
            raise EvalError(f"policy server {self.url} serves no policy {self.policy!r}: {_error_text(r)}")
        if r.status_code != 200:
            raise EvalError(f"policy server {self.url} answered {r.status_code} to GET {path}: {_error_text(r)}")
        try:
            return r.json()
        except ValueError:
            raise EvalError(f"{self.url}{path} did not answer JSON: is it the policy server?") from None

    def actor(self) -> Callable[[np.ndarray, str, bool], Any]:
        framestack = int(self.info.get("framestack") or 1)
        path = f"{self.url}/v1/policies/{self.policy}/act"
        session = self._requests.Session()

        def act(obs: np.ndarray, sid: str, first: bool) -> Any:
            arr = np.ascontiguousarray(obs)
            enc = {"b64": base64.b64encode(arr.tobytes()).decode(), "dtype": arr.dtype.name, "shape": list(arr.shape)}
            body = {"frame": enc, "session_id": sid, "reset": first} if framestack > 1 else {"observation": enc}
            try:
                r = session.post(path, json=body, timeout=self.timeout_s)
            except self._requests.RequestException as e:
                raise self._fail("does not answer", e) from None
            if r.status_code != 200:
                raise EvalError(f"policy server {self.url} answered {r.status_code} to act: {_error_text(r)}")
            return r.json()["action"]

        return act

    def end_session(self, sid: str) -> None:
        try:
            self.session.delete(f"{self.url}/v1/policies/{self.policy}/sessions/{sid}", timeout=self.timeout_s)
        except self._requests.RequestException:
            pass


def _error_text(r) -> str:
    try:
        err = r.json().get("error", {})
        return f"{err.get('code')}: {err.get('message')}"
    except (ValueError, AttributeError):
        return r.text[:200]


def play_through_server(client: ServerClient, env_name: str, env_config: dict[str, Any], seeds: Sequence[int],
                        max_episode_steps: int | None, workers: int) -> list[Episode]:
    """Client-side env loops, `workers` at a time (threads), each step one `act` request."""
    from concurrent.futures import ThreadPoolExecutor

    chunks = [list(c) for c in np.array_split(np.asarray(seeds, dtype=np.int64), max(1, workers)) if len(c)]

    def run(chunk: list[int]) -> list[Episode]:
        env = make_env(env_name, env_config)
        try:
            end = client.end_session if int(client.info.get("framestack") or 1) > 1 else None
            return play(client.actor(), env, [int(s) for s in chunk], max_episode_steps, end)
        finally:
            env.close()

    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        parts = list(pool.map(run, chunks))
    return [ep for part in parts for ep in part]
