"""Hydra config groups for the trainer (installed next to the trainer package so `python -m trainer` finds them)."""
