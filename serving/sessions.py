"""Per-session frame stacks for frame-stacked policies (Pong): the server side of RLlib's frame-stacking connector."""

from __future__ import annotations

import time
from collections import OrderedDict, deque

import numpy as np


class FrameStacks:
    """Per-session frame stacks for frame-stacked policies (Pong), bounded by count and idle time.

    Mirrors RLlib's FrameStackingEnvToModule: the stack of a new episode is zero-filled, then each frame is
    appended along the last axis, oldest first. State is replica-local (see README: sessions need one replica
    or session affinity; stateless clients send the stacked observation instead).
    """

    def __init__(self, num_frames: int, frame_shape: tuple[int, ...], max_sessions: int, ttl_s: float):
        self.num_frames = num_frames
        self.frame_shape = frame_shape
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._stacks: OrderedDict[str, tuple[deque, float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._stacks)

    def push(self, session_id: str, frame: np.ndarray, reset: bool) -> tuple[np.ndarray, bool, int]:
        """-> (stacked observation, whether the session started now, frames received in this episode)."""
        now = time.monotonic()
        self._expire(now)
        entry = self._stacks.pop(session_id, None)
        new = entry is None or reset
        if new:
            stack: deque = deque([np.zeros(self.frame_shape, np.float32)] * self.num_frames, maxlen=self.num_frames)
            count = 0
        else:
            stack, _, count = entry
        stack.append(frame)
        count += 1
        self._stacks[session_id] = (stack, now, count)
        while len(self._stacks) > self.max_sessions:
            self._stacks.popitem(last=False)
        return np.concatenate(list(stack), axis=-1), new, count

    def take(self, session_id: str) -> tuple | None:
        """Remove and return a session's stack (to hand it to another version's FrameStacks with `put`)."""
        return self._stacks.pop(session_id, None)

    def put(self, session_id: str, entry: tuple | None) -> None:
        if entry is None:
            return
        self._stacks[session_id] = entry
        self._stacks.move_to_end(session_id)
        while len(self._stacks) > self.max_sessions:
            self._stacks.popitem(last=False)

    def absorb(self, other: "FrameStacks", override: bool) -> None:
        """Take over `other`'s sessions (a promoted or removed version's); `override`: theirs win on a clash."""
        for sid, entry in list(other._stacks.items()):
            if override or sid not in self._stacks:
                self._stacks[sid] = entry
        other._stacks.clear()
        ordered = sorted(self._stacks.items(), key=lambda kv: kv[1][1])  # least recently used first
        self._stacks = OrderedDict(ordered[-self.max_sessions:])

    def end(self, session_id: str) -> bool:
        return self._stacks.pop(session_id, None) is not None

    def _expire(self, now: float) -> None:
        while self._stacks:
            sid, (_, seen, _) = next(iter(self._stacks.items()))
            if now - seen <= self.ttl_s:
                break
            del self._stacks[sid]
