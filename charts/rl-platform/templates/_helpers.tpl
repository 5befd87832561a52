{{/* Names and labels. */}}
{{- define "rl-platform.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rl-platform.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels shared by every Ray pod of the release (RayCluster, RayJob and RayService clusters). */}}
{{- define "rl-platform.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rl-platform.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rl-platform.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "rl-platform.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rl-platform
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "rl-platform.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rl-platform.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rl-platform.image" -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}

{{- define "rl-platform.pvcName" -}}
{{- default (printf "%s-storage" (include "rl-platform.fullname" .)) .Values.storage.existingClaim -}}
{{- end -}}

{{/*
The Ray resources string for `ray start --resources`: KubeRay passes rayStartParams values to the shell, so the
JSON is wrapped in double quotes with its inner quotes escaped: "{\"rollout_pool\": 2}".
*/}}
{{- define "rl-platform.rayResources" -}}
{{- $g := . -}}
{{- $res := dict -}}
{{- if eq $g.pool "rollout" -}}
{{- $_ := set $res "rollout_pool" (int $g.cpus) -}}
{{- else if eq $g.pool "learner" -}}
{{- $_ := set $res "learner_pool" (int (ternary $g.gpus $g.cpus (gt (int $g.gpus) 0))) -}}
{{- end -}}
{{- if $res -}}
{{- printf "%q" (toJson $res | replace ":" ": ") -}}
{{- end -}}
{{- end -}}

{{/*
Volumes every Ray pod mounts: /dev/shm for the object store, /tmp (Ray's session dir /tmp/ray, HOME on a read-only
root filesystem), /tmp/ray as "ray-logs" (the name and path KubeRay shares with its autoscaler sidecar), and the
optional shared storage.
*/}}
{{- define "rl-platform.volumes" -}}
{{- $root := index . 0 -}}{{- $shmMiB := index . 1 -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ printf "%dMi" (int $shmMiB) }}
- name: tmp
  emptyDir: {}
- name: ray-logs
  emptyDir: {}
{{- if $root.Values.storage.enabled }}
- name: storage
{{- if $root.Values.storage.hostPath }}
  hostPath:
    path: {{ $root.Values.storage.hostPath }}
    type: DirectoryOrCreate
{{- else }}
  persistentVolumeClaim:
    claimName: {{ include "rl-platform.pvcName" $root }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "rl-platform.volumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
- name: ray-logs
  mountPath: /tmp/ray
{{- if .Values.storage.enabled }}
- name: storage
  mountPath: {{ .Values.storage.mountPath }}
{{- end }}
{{- end -}}

{{/*
KubeRay replaces the image entrypoint (which would move HOME off a read-only root), so with a read-only root
filesystem HOME points at the /tmp emptyDir, where Ray, torch, matplotlib and Hydra write their caches.
*/}}
{{- define "rl-platform.homeEnv" -}}
{{- if .Values.containerSecurityContext.readOnlyRootFilesystem }}
- name: HOME
  value: /tmp
{{- else }}
[]
{{- end }}
{{- end -}}

{{- define "rl-platform.containerPorts" -}}
{{- $p := .Values.ray.ports -}}
- name: metrics
  containerPort: {{ $p.metrics }}
  protocol: TCP
- name: serve
  containerPort: {{ $p.serve }}
  protocol: TCP
{{- end -}}

{{/* Pod labels: selector labels + which kind of Ray workload the pod belongs to (cluster, job or serve). */}}
{{- define "rl-platform.podLabels" -}}
{{- $root := index . 0 -}}{{- $workload := index . 1 -}}
{{ include "rl-platform.labels" $root }}
app.kubernetes.io/component: ray
rl-platform.io/workload: {{ $workload }}
{{- end -}}

{{- define "rl-platform.headPodTemplate" -}}
{{- $root := index . 0 -}}{{- $workload := index . 1 -}}
{{- $v := $root.Values -}}
metadata:
  labels:
    {{- include "rl-platform.podLabels" (list $root $workload) | nindent 4 }}
  {{- with $v.head.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "rl-platform.serviceAccountName" $root }}
  # The autoscaler sidecar talks to the Kubernetes API; without it the head needs no token.
  automountServiceAccountToken: {{ $v.autoscaling.enabled }}
  {{- with $v.image.pullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  containers:
    - name: ray-head
      image: {{ include "rl-platform.image" $v.image.cpu }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      ports:
        - name: gcs-server
          containerPort: {{ $v.ray.ports.gcs }}
          protocol: TCP
        - name: dashboard
          containerPort: {{ $v.ray.ports.dashboard }}
          protocol: TCP
        - name: client
          containerPort: {{ $v.ray.ports.client }}
          protocol: TCP
        {{- include "rl-platform.containerPorts" $root | nindent 8 }}
      resources:
        {{- toYaml $v.head.resources | nindent 8 }}
      {{- $env := list }}
      {{- if and $v.monitoring.enabled $v.monitoring.prometheusHost }}
      {{- $env = append $env (dict "name" "RAY_PROMETHEUS_HOST" "value" $v.monitoring.prometheusHost) }}
      {{- end }}
      {{- if and $v.monitoring.enabled $v.monitoring.grafanaHost }}
      {{- $env = append $env (dict "name" "RAY_GRAFANA_HOST" "value" $v.monitoring.grafanaHost) }}
      {{- end }}
      {{- if and $v.monitoring.enabled $v.monitoring.grafanaIframeHost }}
      {{- $env = append $env (dict "name" "RAY_GRAFANA_IFRAME_HOST" "value" $v.monitoring.grafanaIframeHost) }}
      {{- end }}
      {{- if eq $workload "serve" }}{{ $env = concat $env $v.rayService.env }}{{ end }}
      {{- $env = concat $env (include "rl-platform.homeEnv" $root | fromYamlArray) $v.head.env }}
      {{- with $env }}
      env:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $v.containerSecurityContext | nindent 8 }}
      volumeMounts:
        {{- include "rl-platform.volumeMounts" $root | nindent 8 }}
  volumes:
    {{- include "rl-platform.volumes" (list $root $v.head.objectStoreMiB) | nindent 4 }}
  {{- with $v.head.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.head.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.head.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "rl-platform.workerPodTemplate" -}}
{{- $root := index . 0 -}}{{- $workload := index . 1 -}}{{- $name := index . 2 -}}{{- $g := index . 3 -}}
{{- $v := $root.Values -}}
{{- $gpu := gt (int $g.gpus) 0 -}}
metadata:
  labels:
    {{- include "rl-platform.podLabels" (list $root $workload) | nindent 4 }}
    rl-platform.io/pool: {{ $g.pool }}
  {{- with $g.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "rl-platform.serviceAccountName" $root }}
  automountServiceAccountToken: false
  {{- with $v.image.pullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  containers:
    - name: ray-worker
      image: {{ include "rl-platform.image" (ternary $v.image.gpu $v.image.cpu $gpu) }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      ports:
        {{- include "rl-platform.containerPorts" $root | nindent 8 }}
      resources:
        requests:
          cpu: {{ $g.cpus | quote }}
          memory: {{ $g.memory | quote }}
          {{- if $gpu }}
          nvidia.com/gpu: {{ $g.gpus | quote }}
          {{- end }}
        limits:
          cpu: {{ $g.cpus | quote }}
          memory: {{ $g.memory | quote }}
          {{- if $gpu }}
          nvidia.com/gpu: {{ $g.gpus | quote }}
          {{- end }}
      {{- $env := concat (include "rl-platform.homeEnv" $root | fromYamlArray) ($g.env | default list) }}
      {{- if eq $workload "serve" }}{{ $env = concat $v.rayService.env $env }}{{ end }}
      {{- with $env }}
      env:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $v.containerSecurityContext | nindent 8 }}
      volumeMounts:
        {{- include "rl-platform.volumeMounts" $root | nindent 8 }}
  volumes:
    {{- include "rl-platform.volumes" (list $root $g.objectStoreMiB) | nindent 4 }}
  {{- with $g.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := $g.tolerations | default list }}
  {{- if $gpu }}
  {{- $tolerations = prepend $tolerations $v.gpuToleration }}
  {{- end }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/*
The RayCluster spec shared by the RayCluster, the RayJob's own cluster and the RayService's cluster.
Call with (list $ "<workload>").
*/}}
{{- define "rl-platform.rayClusterSpec" -}}
{{- $root := index . 0 -}}{{- $workload := index . 1 -}}
{{- $v := $root.Values -}}
rayVersion: {{ $v.ray.version | quote }}
enableInTreeAutoscaling: {{ $v.autoscaling.enabled }}
{{- if $v.autoscaling.enabled }}
autoscalerOptions:
  upscalingMode: {{ $v.autoscaling.upscalingMode }}
  idleTimeoutSeconds: {{ $v.autoscaling.idleTimeoutSeconds }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  resources:
    {{- toYaml $v.autoscaling.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.containerSecurityContext | nindent 4 }}
{{- end }}
headGroupSpec:
  # Ray ports stay on a ClusterIP service: the dashboard and job API have no authentication.
  serviceType: ClusterIP
  rayStartParams:
    dashboard-host: "0.0.0.0"
    num-cpus: {{ $v.head.rayCpus | quote }}
    metrics-export-port: {{ $v.ray.ports.metrics | quote }}
    object-store-memory: {{ mul (int $v.head.objectStoreMiB) 1048576 | quote }}
    {{- with $v.head.rayStartParams }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  template:
    {{- include "rl-platform.headPodTemplate" (list $root $workload) | nindent 4 }}
workerGroupSpecs:
{{- $any := false }}
{{- range $name, $g := $v.workerGroups }}
{{- if ne $g.enabled false }}
{{- $any = true }}
{{- if gt (int $g.minReplicas) (int $g.maxReplicas) }}
{{- fail (printf "workerGroups.%s: minReplicas (%d) is greater than maxReplicas (%d)" $name (int $g.minReplicas) (int $g.maxReplicas)) }}
{{- end }}
{{- if or (lt (int $g.replicas) (int $g.minReplicas)) (gt (int $g.replicas) (int $g.maxReplicas)) }}
{{- fail (printf "workerGroups.%s: replicas (%d) must lie between minReplicas (%d) and maxReplicas (%d)" $name (int $g.replicas) (int $g.minReplicas) (int $g.maxReplicas)) }}
{{- end }}
  - groupName: {{ $name }}
    replicas: {{ $g.replicas }}
    minReplicas: {{ $g.minReplicas }}
    maxReplicas: {{ $g.maxReplicas }}
    rayStartParams:
      num-cpus: {{ $g.cpus | quote }}
      metrics-export-port: {{ $v.ray.ports.metrics | quote }}
      object-store-memory: {{ mul (int $g.objectStoreMiB) 1048576 | quote }}
      {{- with (include "rl-platform.rayResources" $g) }}
      resources: {{ . | squote }}
      {{- end }}
      {{- with $g.rayStartParams }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    template:
      {{- include "rl-platform.workerPodTemplate" (list $root $workload $name $g) | nindent 6 }}
{{- end }}
{{- end }}
{{- if not $any }} []{{ end }}
{{- end -}}
