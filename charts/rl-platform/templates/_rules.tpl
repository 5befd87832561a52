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
    - alert: RayServeHighErrorRate
      expr: |-
        rl_platform:serve_errors:rate5m / rl_platform:serve_requests:rate5m > {{ $r.serveErrorRatio }}
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
        sum by ({{ $by }}, policy) (rate({{ $m.policyRequests }}{status!~"{{ $r.policyOkStatusRegex }}"}[5m]))
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
    - alert: RayHeadDown
      expr: up{ray_io_node_type="head"} == 0
      for: 5m
      labels:
        severity: critical
      annotations:
        summary: The metrics endpoint of a Ray head is down.
        description: '{{ "{{ $labels.namespace }}/{{ $labels.pod }}" }} has not answered scrapes for 5 minutes.'
{{- end -}}
