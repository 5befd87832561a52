"""Environment and preprocessing definitions shared by the trainer and the policy server.

One obvious place for "what is an env called, how is it built, how are its observations preprocessed":
the trainer registers these with Ray Tune's registry; the server uses the same preprocessing so a served
policy sees exactly what it saw in training. Nothing here imports RLlib's training code at module import.
"""

from rl_envs.registry import ENVS, EnvSpec, get_spec, make_env, register_with_ray

__all__ = ["ENVS", "EnvSpec", "get_spec", "make_env", "register_with_ray"]
