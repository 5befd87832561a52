"""rl-submit: run a trainer experiment on Kubernetes as a KubeRay RayJob rendered from the rl-platform chart.

A Kubernetes client beside the trainer, not part of it: cli.py is the command (compose, render, fit, submit, watch),
shape.py what the rendered cluster can hold and whether the job's Ray resource request fits it.
"""
