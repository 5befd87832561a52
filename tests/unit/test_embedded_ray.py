"""embedded_ray.configure: the environment an embedded Ray starts with (token auth, loopback node address)."""

import pytest

import embedded_ray


def test_token_mode_makes_a_fresh_256_bit_token_per_run():
    a, b = {}, {}
    embedded_ray.configure("token", a)
    embedded_ray.configure("token", b)
    assert a["RAY_AUTH_MODE"] == "token" and a["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert len(a["RAY_AUTH_TOKEN"]) == 64 and a["RAY_AUTH_TOKEN"] != b["RAY_AUTH_TOKEN"]


@pytest.mark.parametrize("given", [{"RAY_AUTH_TOKEN": "mine"}, {"RAY_AUTH_TOKEN_PATH": "/some/file"}])
def test_a_token_the_user_chose_is_kept(given):
    env = dict(given)
    embedded_ray.configure("token", env)
    assert env.get("RAY_AUTH_TOKEN") == given.get("RAY_AUTH_TOKEN")


def test_disabled_turns_the_token_off_but_keeps_loopback():
    env = {"RAY_AUTH_MODE": "token"}
    embedded_ray.configure("disabled", env)
    assert env["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN" not in env
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="token, disabled"):
        embedded_ray.configure("none", {})


def test_a_container_keeps_the_token_but_not_the_loopback_address():
    """docker/serve.sh: RLP_RAY_LOOPBACK=0 so the published metrics port reaches Ray's exporter; auth stays on."""
    env = {"RLP_RAY_LOOPBACK": "0"}
    said = embedded_ray.configure("token", env)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env and env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"]
    assert "RLP_RAY_LOOPBACK=0" in said
