{{/*
Prometheus rule groups. Metric names come from .Values.monitoring.metrics (the one place to adjust them), thresholds
from .Values.monitoring.rules. `tests/chart` runs `promtool check rules` and `promtool test rules` on the rendering.
*/}}
{{- define "rl-platform.ruleGroups" -}}
{{- $m := .Values.monitoring.metrics -}}
{{- $r := .Values.monitoring.rules -}}
{{- $by := "namespace, ray_io_cluster" -}}
- name: rl-platform.serve
  rules:
    - record: rl_platform:serve_requests:rate5m
      expr: sum by ({{ $by }}) (rate({{ $m.serveRequests }}[5m]))
    - record: rl_platform:serve_errors:rate5m
      expr: sum by ({{ $by }}) (rate({{ $m.serveErrors }}[5m]))
    - record: rl_platform:serve_latency_ms:p99_5m
      expr: histogram_quantile(0.99, sum by ({{ $by }}, le) (rate({{ $m.serveLatencyBucket }}[5m])))
    # `or ... * 0`: Ray exports the error counter only after a first error; the ratio is 0, not missing, before.
    - alert: RayServeHighErrorRate
      expr: |-
        (rl_platform:serve_errors:rate5m or rl_platform:serve_requests:rate5m * 0) / rl_platform:serve_requests:rate5m > {{ $r.serveErrorRatio }}
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: Ray Serve answers more than {{ mulf $r.serveErrorRatio 100 | printf "%g" }}% of HTTP requests with errors.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }}: error ratio {{ "{{ $value | humanizePercentage }}" }} over 5m.'
    - alert: RayServeHighLatency
      expr: rl_platform:serve_latency_ms:p99_5m > {{ $r.serveLatencyP99Ms }}
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: Ray Serve p99 latency is above {{ $r.serveLatencyP99Ms }} ms.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }}: p99 {{ "{{ $value | humanize }}" }} ms over 5m.'
    - alert: RLPolicyErrors
      expr: |-
        (sum by ({{ $by }}, policy) (rate({{ $m.policyRequests }}{status!~"{{ $r.policyOkStatusRegex }}"}[5m]))
          or sum by ({{ $by }}, policy) (rate({{ $m.policyRequests }}[5m])) * 0)
          / sum by ({{ $by }}, policy) (rate({{ $m.policyRequests }}[5m])) > {{ $r.policyErrorRatio }}
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: A served RL policy fails more than {{ mulf $r.policyErrorRatio 100 | printf "%g" }}% of its requests.
        description: 'Policy {{ "{{ $labels.policy }}" }} in {{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }}: {{ "{{ $value | humanizePercentage }}" }} errors.'
    {{- /*
    Canary (a policy's candidate version) against its champion, per policy: the `version` label is the role
    ("champion" | "candidate"), so the two sides are joined on the policy and the labels our PodMonitors add.
    */}}
    {{- $pv := printf "%s, policy, version" $by }}
    {{- $on := printf "on(%s, policy)" $by }}
    {{- $w := $r.canaryReturnWindow }}
    - record: rl_platform:policy_version_requests:rate5m
      expr: sum by ({{ $pv }}) (rate({{ $m.policyVersionRequests }}[5m]))
    - record: rl_platform:policy_version_errors:rate5m
      expr: sum by ({{ $pv }}) (rate({{ $m.policyVersionRequests }}{result="error"}[5m]))
    - record: rl_platform:policy_version_latency_ms:p99_5m
      expr: histogram_quantile(0.99, sum by ({{ $pv }}, le) (rate({{ $m.policyVersionLatencyBucket }}[5m])))
    # Episodes that ended on each version within the canary window, and their returns' mean and variance. The return
    # gauges are running totals per replica, so delta() over the window is the window's sum (rewards may be negative).
    - record: rl_platform:policy_version_episodes:canary_window
      expr: sum by ({{ $pv }}) (increase({{ $m.policyEpisodes }}[{{ $w }}]))
    - record: rl_platform:policy_version_return_mean:canary_window
      expr: sum by ({{ $pv }}) (delta({{ $m.policyEpisodeReturnSum }}[{{ $w }}])) / rl_platform:policy_version_episodes:canary_window
    - record: rl_platform:policy_version_return_var:canary_window
      expr: |-
        clamp_min(sum by ({{ $pv }}) (delta({{ $m.policyEpisodeReturnSqSum }}[{{ $w }}])) / rl_platform:policy_version_episodes:canary_window
          - rl_platform:policy_version_return_mean:canary_window ^ 2, 0)
    # One-sided test (as rl-rollout judges a step): z = (champion mean - candidate mean - margin) / standard error of
    # the difference. Only once both versions ended canaryMinEpisodes episodes in the window, and not while either
    # version changed checkpoint within it (its return gauge restarted from 0 then; the window would mix two models).
    - alert: RLPolicyCanaryWorseReturn
      expr: |-
        (
          (
            rl_platform:policy_version_return_mean:canary_window{version="champion"}
              - {{ $on }} rl_platform:policy_version_return_mean:canary_window{version="candidate"}
              - {{ $r.canaryReturnMargin }}
          )
          / {{ $on }} sqrt(
            rl_platform:policy_version_return_var:canary_window{version="champion"} / rl_platform:policy_version_episodes:canary_window{version="champion"}
              + {{ $on }} rl_platform:policy_version_return_var:canary_window{version="candidate"} / rl_platform:policy_version_episodes:canary_window{version="candidate"}
          )
          and {{ $on }} (min by ({{ $by }}, policy) (rl_platform:policy_version_episodes:canary_window{version=~"champion|candidate"}) >= {{ $r.canaryMinEpisodes }})
          unless {{ $on }} (count by ({{ $pv }}) (max by ({{ $pv }}, checkpoint_id) (max_over_time({{ $m.policyVersionInfo }}[{{ $w }}])) == 1) > 1)
        ) > {{ $r.canaryReturnZ }}
      for: {{ $r.canaryFor }}
      labels:
        severity: warning
      annotations:
        summary: A policy's canary earns a lower episode return than its champion.
        description: 'Policy {{ "{{ $labels.policy }}" }} in {{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }}: the candidate''s mean episode return over {{ $w }} is below the champion''s by more than {{ $r.canaryReturnMargin }} (z = {{ "{{ $value | humanize }}" }} > {{ $r.canaryReturnZ }}, at least {{ $r.canaryMinEpisodes }} episodes each); roll it back.'
    # `or ... * 0`: the error series exist only after a first error; the ratio is 0, not missing, before.
    - alert: RLPolicyCanaryErrorRatioHigh
      expr: |-
        (
          (rl_platform:policy_version_errors:rate5m{version="candidate"} or rl_platform:policy_version_requests:rate5m{version="candidate"} * 0)
            / rl_platform:policy_version_requests:rate5m{version="candidate"}
          unless {{ $on }}
          (
            (rl_platform:policy_version_errors:rate5m{version="champion"} or rl_platform:policy_version_requests:rate5m{version="champion"} * 0)
              / rl_platform:policy_version_requests:rate5m{version="champion"} > {{ $r.canaryErrorRatio }}
          )
        ) > {{ $r.canaryErrorRatio }}
      for: {{ $r.canaryFor }}
      labels:
        severity: warning
      annotations:
        summary: A policy's canary fails more than {{ mulf $r.canaryErrorRatio 100 | printf "%g" }}% of its requests while its champion does not.
        description: 'Policy {{ "{{ $labels.policy }}" }} in {{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }}: the candidate fails {{ "{{ $value | humanizePercentage }}" }} of its requests over 5m (the champion answered them); roll it back.'
    - alert: RLPolicyCanaryLatencyHigh
      expr: |-
        (
          rl_platform:policy_version_latency_ms:p99_5m{version="candidate"}
          unless {{ $on }} (rl_platform:policy_version_latency_ms:p99_5m{version="champion"} > {{ $r.canaryLatencyP99Ms }})
        ) > {{ $r.canaryLatencyP99Ms }}
      for: {{ $r.canaryFor }}
      labels:
        severity: warning
      annotations:
        summary: A policy's canary answers slower than {{ $r.canaryLatencyP99Ms }} ms at p99 while its champion does not.
        description: 'Policy {{ "{{ $labels.policy }}" }} in {{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }}: candidate p99 {{ "{{ $value | humanize }}" }} ms over 5m; roll it back.'
- name: rl-platform.training
  rules:
    - record: rl_platform:env_steps_sampled:rate5m
      expr: sum by ({{ $by }}) (rate({{ $m.envStepsSampled }}[5m]))
    - alert: RLRolloutStalled
      expr: rl_platform:env_steps_sampled:rate5m == 0
      for: {{ $r.rolloutStalledMinutes }}m
      labels:
        severity: warning
      annotations:
        summary: RLlib env runners sampled no environment steps for {{ $r.rolloutStalledMinutes }} minutes.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }}: rollout workers are stuck or gone.'
    - alert: RLTrainingStalled
      expr: |-
        time() - max by ({{ $by }}, trial) ({{ $m.trainLastIteration }}) > {{ mul $r.trainingStalledMinutes 60 }}
      labels:
        severity: warning
      annotations:
        summary: No training iteration finished for {{ $r.trainingStalledMinutes }} minutes.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }} trial {{ "{{ $labels.trial }}" }}: last iteration {{ "{{ $value | humanizeDuration }}" }} ago; the trainer is hung.'
    - alert: RLEnvRunnerRestarts
      expr: |-
        max by ({{ $by }}, trial) (delta({{ $m.trainEnvRunnerRestarts }}[15m])) > 0
      labels:
        severity: warning
      annotations:
        summary: RLlib restarted env runners in the last 15 minutes.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }} trial {{ "{{ $labels.trial }}" }}: env runners restarted (crashing envs or lost nodes).'
    - alert: RLEnvRunnersNotReady
      expr: |-
        max by ({{ $by }}, trial) ({{ $m.trainEnvRunnersExpected }}) - max by ({{ $by }}, trial) ({{ $m.trainEnvRunnersHealthy }}) > 0
      for: 5m
      labels:
        severity: warning
      annotations:
        summary: Fewer env runners are healthy than configured.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }} trial {{ "{{ $labels.trial }}" }}: {{ "{{ $value }}" }} env runners missing for 5 minutes (rollout pool short of CPUs, or crashing).'
    - alert: RLLearnersNotReady
      expr: |-
        max by ({{ $by }}, trial) ({{ $m.trainLearnersExpected }}) - max by ({{ $by }}, trial) ({{ $m.trainLearnersHealthy }}) > 0
      for: 5m
      labels:
        severity: critical
      annotations:
        summary: Fewer learners are healthy than configured.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }} trial {{ "{{ $labels.trial }}" }}: {{ "{{ $value }}" }} learners missing for 5 minutes; training cannot update.'
- name: rl-platform.nodes
  rules:
    - record: rl_platform:node_cpu_utilization:avg
      expr: avg by ({{ $by }}, rl_platform_io_pool) ({{ $m.nodeCpuUtilization }})
    - alert: RayNodeMemoryHigh
      expr: |-
        max by ({{ $by }}, pod) ({{ $m.nodeMemUsed }}) / max by ({{ $by }}, pod) ({{ $m.nodeMemTotal }}) > {{ $r.nodeMemoryRatio }}
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: A Ray node uses more than {{ mulf $r.nodeMemoryRatio 100 | printf "%g" }}% of its memory.
        description: '{{ "{{ $labels.pod }}" }} uses {{ "{{ $value | humanizePercentage }}" }} of its memory; the OOM killer is next.'
    - alert: RayObjectStoreNearFull
      expr: |-
        sum by ({{ $by }}, pod) ({{ $m.objectStoreUsed }})
          / (sum by ({{ $by }}, pod) ({{ $m.objectStoreUsed }}) + sum by ({{ $by }}, pod) ({{ $m.objectStoreAvailable }}))
          > {{ $r.objectStoreRatio }}
      for: 10m
      labels:
        severity: warning
      annotations:
        summary: A Ray node's object store is more than {{ mulf $r.objectStoreRatio 100 | printf "%g" }}% full.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.pod }}" }}: object store {{ "{{ $value | humanizePercentage }}" }} full; Ray spills objects to disk.'
    - alert: RayWorkerDown
      expr: up{ray_io_node_type="worker"} == 0
      for: 5m
      labels:
        severity: warning
      annotations:
        summary: The metrics endpoint of a Ray worker node is down.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.pod }}" }} has not answered scrapes for 5 minutes (node not ready or gone).'
    - alert: RayHeadDown
      expr: up{ray_io_node_type="head"} == 0
      for: 5m
      labels:
        severity: critical
      annotations:
        summary: The metrics endpoint of a Ray head is down.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.pod }}" }} has not answered scrapes for 5 minutes.'
    - alert: RayHeadRestarted
      # A new start time of the head's Ray (metrics process) within the window: a new head pod or a restarted Ray.
      # The subquery runs at Prometheus' evaluation interval (`[W:]`): a coarser fixed step can hold no point yet.
      expr: |-
        changes(max by ({{ $by }}) ({{ $m.processStartTime }}{ray_io_node_type="head"})[{{ $r.headRestartWindow }}:]) > 0
      labels:
        severity: warning
      annotations:
        summary: A Ray head restarted.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.ray_io_cluster }}" }}: the head restarted {{ "{{ $value }}" }} time(s) in the last {{ $r.headRestartWindow }}. With gcsFaultTolerance the cluster state came back from Redis and Serve kept answering; without it the cluster started empty (jobs and actors lost, Serve redeployed).'
{{- end -}}
