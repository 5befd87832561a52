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
{{- end -}}
