"""trainer.resources.init_ray: Ray's own start-up failure on an overloaded machine (its raylet does not register
within Ray's fixed 30 s; Ray raises a bare Exception) reaches the user as one `error:` line, not a traceback; any
other unexpected exception still propagates. Ray's failure is injected: an overloaded host cannot be made on demand."""

import pytest
import ray

from trainer.config import ResourcesConf
from trainer.errors import TrainerError
from trainer.resources import RAY_DID_NOT_START, init_ray

# Ray 2.58's message (ray/_private/node.py), verbatim.
RAY_MESSAGE = ("The current node timed out during startup. This could happen because some of the raylet failed to "
               "startup or the GCS has become overloaded.")


def test_a_raylet_that_does_not_register_in_time_is_one_clear_error(monkeypatch):
    def init(**_):
        raise Exception(RAY_MESSAGE)

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(TrainerError) as e:
        init_ray(ResourcesConf())
    assert str(e.value).startswith(RAY_DID_NOT_START) and "30 s" in str(e.value) and "overloaded" in str(e.value)


def test_another_unexpected_exception_is_not_relabelled(monkeypatch):
    def init(**_):
        raise Exception("something else")

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(Exception, match="something else") as e:
        init_ray(ResourcesConf())
    assert not isinstance(e.value, TrainerError)
