"""rl-rollout: progressive delivery of RL policies (canary / shadow traffic judged on live figures, automatic
promotion and rollback), a client of the policy server like rl-submit is of the cluster.

Modules, one concern each:
  figures     the per-version cumulative snapshot both sources produce, windows between snapshots, p99
  sources     the figures from the server's stats endpoint or from Prometheus; the server's policy info
  judge       the decision of one analysis interval (pure)
  state       the rollout state and its place in the Serve config (pure functions of config dicts)
  targets     where the config lives: a local Serve config file or a KubeRay RayService's serveConfigV2
  controller  the loop: write, confirm, judge, advance / hold / pause / rollback / promote
  cli         `rl-rollout start|resume|status|abort`
"""
