"""Ray's own start-up failure on an overloaded machine (its raylet does not register within Ray's fixed 30 s; Ray
raises a bare Exception) reaches the user of every entry point that starts a local Ray (trainer, policy server,
rl-eval) as one error naming it (embedded_ray.start_failure), not a traceback; any other unexpected exception still
propagates. Ray's failure is injected: an overloaded host cannot be made on demand."""

import os

import pytest
import ray

import embedded_ray
from rl_eval.cli import start_ray
from rl_eval.episodes import EvalError
from serving import launch
from trainer.config import ResourcesConf
from trainer.errors import TrainerError
from trainer.resources import init_ray

# Ray 2.58's message (ray/_private/node.py), verbatim.
RAY_MESSAGE = ("The current node timed out during startup. This could happen because some of the raylet failed to "
               "startup or the GCS has become overloaded.")


@pytest.fixture
def ray_init_raises(monkeypatch):
    """ray.init replaced by one that raises the given message; the process environment restored afterwards (the
    server's start sets ingress and Ray variables before it calls ray.init)."""
    saved = dict(os.environ)
    monkeypatch.setattr(embedded_ray, "configure", lambda *a, **k: "")

    def arm(message: str) -> None:
        def init(**_):
            raise Exception(message)

        monkeypatch.setattr(ray, "init", init)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)

    yield arm
    os.environ.clear()
    os.environ.update(saved)


def start_server() -> None:
    launch.start(launch.load_config(), host="127.0.0.1", port=1, ready_timeout_s=1)


ENTRY_POINTS = {
    "trainer": (lambda: init_ray(ResourcesConf()), TrainerError),
    "server": (start_server, launch.LaunchError),
    "rl-eval": (lambda: start_ray(None, None), EvalError),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_raylet_that_does_not_register_in_time_is_one_clear_error(ray_init_raises, entry):
    call, error = ENTRY_POINTS[entry]
    ray_init_raises(RAY_MESSAGE)
    with pytest.raises(error) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(embedded_ray.DID_NOT_START) and "30 s" in msg and "overloaded" in msg and "\n" not in msg


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_another_unexpected_exception_is_not_relabelled(ray_init_raises, entry):
    call, error = ENTRY_POINTS[entry]
    ray_init_raises("something else")
    with pytest.raises(Exception, match="something else") as e:
        call()
    assert not isinstance(e.value, error)
