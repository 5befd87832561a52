"""Load for the rollout tests: client threads that play whole CartPole episodes through the policy API.

Each client resets a real gymnasium CartPole (episodes capped at `max_steps`), sends every observation to
`POST /v1/policies/NAME/act` with its episode's session id, steps the env with the answered action, and posts
the episode's return as feedback (`done: true`) when it ends. Every request's outcome is kept: the tests
assert that none failed and that no session was answered by two versions. Bounded: clients stop on `stop()`
or at their deadline, and each request has a timeout.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import requests


@dataclass
class Episode:
    session_id: str
    versions: set[str] = field(default_factory=set)
    checkpoints: set[str] = field(default_factory=set)
    ret: float = 0.0
    steps: int = 0


class EpisodeClients:
    def __init__(self, base: str, policy: str, clients: int = 6, max_steps: int = 100, deadline_s: float = 600):
        self.url = f"{base}/v1/policies/{policy}"
        self.clients, self.max_steps = clients, max_steps
        self.deadline = time.monotonic() + deadline_s
        self.episodes: list[Episode] = []
        self.failures: list[str] = []
        self.requests = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> "EpisodeClients":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "a client thread did not stop"

    def __enter__(self) -> "EpisodeClients":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self.deadline

    def _post(self, s: requests.Session, path: str, body: dict) -> dict | None:
        try:
            r = s.post(self.url + path, json=body, timeout=30)
        except requests.RequestException as e:
            with self._lock:
                self.failures.append(f"{path}: {type(e).__name__}: {e}")
            return None
        with self._lock:
            self.requests += 1
            if r.status_code != 200:
                self.failures.append(f"{path}: HTTP {r.status_code}: {r.text[:300]}")
                return None
        return r.json()

    def _run(self, client: int) -> None:
        import gymnasium as gym

        env = gym.make("CartPole-v1", max_episode_steps=self.max_steps)
        s = requests.Session()
        seed = client * 100_000
        try:
            while self._running():
                ep = Episode(f"c{client}-{uuid.uuid4().hex[:12]}")
                obs, _ = env.reset(seed=seed)
                seed += 1
                done = False
                while not done and self._running():
                    out = self._post(s, "/act", {"observation": obs.tolist(), "session_id": ep.session_id})
                    if out is None:
                        break
                    ep.versions.add(out["version"])
                    ep.checkpoints.add(out["checkpoint_id"])
                    obs, reward, term, trunc, _ = env.step(out["action"])
                    ep.ret += float(reward)
                    ep.steps += 1
                    done = term or trunc
                if not done:
                    # Interrupted mid-episode (stop or a failed request): tell the server the session is over.
                    s.delete(f"{self.url}/sessions/{ep.session_id}", timeout=30)
                    continue
                if self._post(s, "/feedback", {"session_id": ep.session_id, "reward": ep.ret, "done": True}) is None:
                    continue
                with self._lock:
                    self.episodes.append(ep)
        finally:
            env.close()

    # ---------------------------------------------------------------- what the tests assert on

    def mixed_sessions(self) -> list[Episode]:
        with self._lock:
            # By checkpoint: on a promotion the candidate's loaded module becomes the champion, so a session that
            # spans it keeps its checkpoint while its role label changes from "candidate" to "champion".
            return [e for e in self.episodes if len(e.checkpoints) != 1]

    def returns_by_checkpoint(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        with self._lock:
            for e in self.episodes:
                if len(e.checkpoints) == 1:
                    out.setdefault(next(iter(e.checkpoints)), []).append(e.ret)
        return out

    def episodes_by_version(self) -> Counter:
        with self._lock:
            return Counter(next(iter(e.versions)) for e in self.episodes if len(e.versions) == 1)
