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

{{/*
A KubeRay object name, checked as KubeRay 1.6 checks it (ray-operator controllers/ray/utils/validation.go) only after
the API server has accepted the object: a DNS-1035 label of at most 53 characters for a RayCluster (its longest
service suffix, "-serve-svc", must still fit 63) and 47 for a RayJob or RayService (KubeRay appends "-" and 5 random
characters to name their RayCluster). A name over the limit fails the render: truncating it would silently give two
jobs that differ only at the end the same name. Call with (list KIND NAME "what to change").
*/}}
{{- define "rl-platform.kuberayName" -}}
{{- $kind := index . 0 -}}{{- $name := index . 1 -}}{{- $knobs := index . 2 -}}
{{- $max := get (dict "RayCluster" 53 "RayJob" 47 "RayService" 47) $kind | int -}}
{{- if gt (len $name) $max -}}
{{- fail (printf "%s name %q has %d characters; KubeRay accepts at most %d: shorten %s" $kind $name (len $name) $max $knobs) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "%s name %q is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter), which KubeRay requires: change %s" $kind $name $knobs) -}}
{{- end -}}
{{- $name -}}
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

{{- define "rl-platform.pvName" -}}
{{- printf "%s-%s" .Release.Namespace (include "rl-platform.pvcName" .) -}}
{{- end -}}

{{/*
The Ray resources string for `ray start --resources`, JSON in single quotes: '{"rollout_pool": 2}'. Three readers:
KubeRay trims the outer quotes and JSON-parses it (to add --num-gpus from the nvidia.com/gpu limit: escaped inner
quotes, "{\"learner_pool\": 1}", fail that parse and the GPU is never advertised), then the shell of the ray start
command removes the single quotes, and Ray's autoscaler drops the first and last character.
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
{{- printf "'%s'" (toJson $res | replace ":" ": ") -}}
{{- end -}}
{{- end -}}

{{/* A Kubernetes quantity ("4Gi", "4000M", 4294967296) in whole MiB, rounded down. */}}
{{- define "rl-platform.mebibytes" -}}
{{- if kindIs "string" . -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- $per := get (dict "" 1.0 "m" 0.001 "k" 1e3 "Ki" 1024.0 "M" 1e6 "Mi" 1048576.0 "G" 1e9 "Gi" 1073741824.0 "T" 1e12 "Ti" 1099511627776.0) (trimPrefix $num .) -}}
{{- divf (mulf (float64 $num) $per) 1048576 | floor | int -}}
{{- else -}}
{{- divf (float64 .) 1048576 | floor | int -}}
{{- end -}}
{{- end -}}

{{/*
Memory of one Ray node, as JSON {"objectStoreMiB", "shmMiB", "memoryMiB"}; call with (list WHERE OBJECT_STORE_MIB
MEMORY_LIMIT), where an unset object store takes Ray's own default of 30% of the memory.
- /dev/shm is 1.1 x the object store: Ray puts the store there only while /dev/shm has at least the store's size free
  (else it falls back to slow /tmp, or refuses to start), other processes (torch, Ray's own files) use /dev/shm too,
  and 1.1 x is what Ray's own warning asks of `docker run --shm-size`.
- Ray's `memory` resource (what tasks and actors may reserve) is the container's memory limit minus that /dev/shm: the
  pages of a memory-backed emptyDir count against the limit. KubeRay would pass the whole limit (double counting the
  object store), so the chart sets it; without a limit Ray works it out itself.
*/}}
{{- define "rl-platform.memoryPlan" -}}
{{- $where := index . 0 -}}{{- $objectStore := index . 1 -}}{{- $limit := index . 2 -}}
{{- $limitMiB := 0 -}}
{{- if $limit }}{{ $limitMiB = include "rl-platform.mebibytes" $limit | int }}{{ end -}}
{{- $os := 0 -}}
{{- if $objectStore -}}
{{- $os = int $objectStore -}}
{{- else if $limitMiB -}}
{{- $os = div (mul $limitMiB 3) 10 -}}
{{- else -}}
{{- fail (printf "%s.objectStoreMiB is not set and there is no memory limit to take Ray's default 30%% of: set it" $where) -}}
{{- end -}}
{{- if lt $os 75 -}}
{{- fail (printf "%s: the object store would be %d MiB (30%% of the memory); Ray needs at least 75 MiB: set %s.objectStoreMiB or give more memory" $where $os $where) -}}
{{- end -}}
{{- $shm := div (add (mul $os 11) 9) 10 -}}
{{- $memory := 0 -}}
{{- if $limitMiB -}}
{{- $memory = sub $limitMiB $shm -}}
{{- if lt $memory 100 -}}
{{- fail (printf "%s: a memory limit of %v leaves %d MiB for Ray's tasks and actors next to the %d MiB /dev/shm (objectStoreMiB %d + 10%%); Ray needs at least 100 MiB: raise the memory or lower %s.objectStoreMiB" $where $limit $memory $shm $os $where) -}}
{{- end -}}
{{- end -}}
{{- dict "objectStoreMiB" $os "shmMiB" $shm "memoryMiB" $memory | toJson -}}
{{- end -}}

{{- define "rl-platform.headMemory" -}}
{{- include "rl-platform.memoryPlan" (list "head" .Values.head.objectStoreMiB (dig "limits" "memory" "" .Values.head.resources)) -}}
{{- end -}}

{{/* Call with (list NAME GROUP). */}}
{{- define "rl-platform.groupMemory" -}}
{{- include "rl-platform.memoryPlan" (list (printf "workerGroups.%s" (index . 0)) (index . 1).objectStoreMiB (index . 1).memory) -}}
{{- end -}}

{{/*
Volumes every Ray pod mounts: /dev/shm for the object store (shmMiB of rl-platform.memoryPlan), /tmp (Ray's session dir /tmp/ray, HOME on a read-only
root filesystem), /tmp/ray as "ray-logs" (the name and path KubeRay shares with its autoscaler sidecar), and the
optional shared storage: always a claim, never a hostPath volume, which the restricted Pod Security Standard forbids.
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
  persistentVolumeClaim:
    claimName: {{ include "rl-platform.pvcName" $root }}
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
  {{- if $v.podPriority.enabled }}
  priorityClassName: {{ $v.podPriority.classes.head.name }}
  {{- end }}
  serviceAccountName: {{ include "rl-platform.serviceAccountName" $root }}
  # The autoscaler sidecar talks to the Kubernetes API; without it the head needs no token.
  automountServiceAccountToken: {{ $v.autoscaling.enabled }}
  {{- with $v.image.pullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- if ne $workload "serve" }}
  # Deleting, evicting or preempting the head: the preStop hook below stops the running jobs first (their drivers
  # get SIGTERM, checkpoint, exit), within this grace; only then does Kubernetes stop the container.
  terminationGracePeriodSeconds: {{ add $v.head.jobStopWaitSeconds 15 }}
  {{- end }}
  {{- if include "rl-platform.gcsFT" (list $root $workload) }}
  initContainers:
    {{- include "rl-platform.waitRedisContainer" $root | nindent 4 }}
  {{- end }}
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
      {{- /* The job supervisor (on the head) waits this long after SIGTERM before SIGKILL: the trainer's checkpoint. */}}
      {{- $env := list (dict "name" "RAY_JOB_STOP_WAIT_TIME_S" "value" (toString $v.head.jobStopWaitSeconds)) }}
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
      {{- with $v.storage.credentialsSecret }}
      envFrom:
        - secretRef:
            name: {{ . }}
      {{- end }}
      {{- if ne $workload "serve" }}
      {{- /* `ray start` (the container's first process) does not pass SIGTERM on to job drivers (trainer.prestop). */}}
      lifecycle:
        preStop:
          exec:
            command: ["python", "-m", "trainer.prestop", "--address", "http://127.0.0.1:{{ $v.ray.ports.dashboard }}",
                      "--timeout-s", "{{ add $v.head.jobStopWaitSeconds 5 }}"]
      {{- end }}
      securityContext:
        {{- toYaml $v.containerSecurityContext | nindent 8 }}
      volumeMounts:
        {{- include "rl-platform.volumeMounts" $root | nindent 8 }}
  volumes:
    {{- include "rl-platform.volumes" (list $root (include "rl-platform.headMemory" $root | fromJson).shmMiB) | nindent 4 }}
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
  {{- if $v.podPriority.enabled }}
  # podPriority: under pressure the scheduler preempts rollout workers first, then learners, heads last.
  priorityClassName: {{ (ternary $v.podPriority.classes.learner $v.podPriority.classes.rollout (eq $g.pool "learner")).name }}
  {{- end }}
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
          cpu: {{ $g.cpuRequest | default $g.cpus | quote }}
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
      {{- with $v.storage.credentialsSecret }}
      envFrom:
        - secretRef:
            name: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml $v.containerSecurityContext | nindent 8 }}
      volumeMounts:
        {{- include "rl-platform.volumeMounts" $root | nindent 8 }}
  volumes:
    {{- include "rl-platform.volumes" (list $root (include "rl-platform.groupMemory" (list $name $g) | fromJson).shmMiB) | nindent 4 }}
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
# Ray token auth: KubeRay injects RAY_AUTH_MODE/RAY_AUTH_TOKEN into every Ray container, the autoscaler and the
# RayJob submitter (values ray.auth).
authOptions:
  mode: {{ $v.ray.auth.mode }}
  {{- if and (eq $v.ray.auth.mode "token") $v.ray.auth.secretName }}
  secretName: {{ $v.ray.auth.secretName }}
  {{- end }}
{{- if include "rl-platform.gcsFT" (list $root $workload) }}
# GCS fault tolerance (values gcsFaultTolerance): the GCS keeps the cluster state in Redis, a new head reloads it.
gcsFaultToleranceOptions:
  {{- include "rl-platform.gcsFaultToleranceOptions" $root | nindent 2 }}
{{- end }}
enableInTreeAutoscaling: {{ $v.autoscaling.enabled }}
{{- if $v.autoscaling.enabled }}
autoscalerOptions:
  version: {{ $v.autoscaling.version }}
  upscalingMode: {{ $v.autoscaling.upscalingMode }}
  idleTimeoutSeconds: {{ $v.autoscaling.idleTimeoutSeconds }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  resources:
    {{- toYaml $v.autoscaling.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.containerSecurityContext | nindent 4 }}
{{- end }}
headGroupSpec:
  # Ray ports stay on a ClusterIP service (and behind the token unless ray.auth.mode is disabled).
  serviceType: ClusterIP
  {{- $mem := include "rl-platform.headMemory" $root | fromJson }}
  {{- $params := dict "dashboard-host" "0.0.0.0" "num-cpus" (toString $v.head.rayCpus) "metrics-export-port" (toString $v.ray.ports.metrics) "object-store-memory" (toString (mul (int $mem.objectStoreMiB) 1048576)) }}
  {{- if $mem.memoryMiB }}{{ $_ := set $params "memory" (toString (mul (int $mem.memoryMiB) 1048576)) }}{{ end }}
  rayStartParams:
    {{- mergeOverwrite $params $v.head.rayStartParams | toYaml | nindent 4 }}
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
    {{- if and $v.autoscaling.enabled (eq $v.autoscaling.version "v2") (not (kindIs "invalid" $g.idleTimeoutSeconds)) }}
    idleTimeoutSeconds: {{ $g.idleTimeoutSeconds }}
    {{- end }}
    {{- $mem := include "rl-platform.groupMemory" (list $name $g) | fromJson }}
    {{- $params := dict "num-cpus" (toString $g.cpus) "metrics-export-port" (toString $v.ray.ports.metrics) "object-store-memory" (toString (mul (int $mem.objectStoreMiB) 1048576)) "memory" (toString (mul (int $mem.memoryMiB) 1048576)) }}
    {{- with (include "rl-platform.rayResources" $g) }}{{ $_ := set $params "resources" . }}{{ end }}
    rayStartParams:
      {{- mergeOverwrite $params ($g.rayStartParams | default dict) | toYaml | nindent 6 }}
    template:
      {{- include "rl-platform.workerPodTemplate" (list $root $workload $name $g) | nindent 6 }}
{{- end }}
{{- end }}
{{- if not $any }} []{{ end }}
{{- end -}}

{{/*
GCS fault tolerance (values gcsFaultTolerance). "rl-platform.gcsFT" is "true" when the cluster of WORKLOAD (serve:
the RayService's, cluster: the chart's RayCluster; a RayJob's never) keeps its GCS state in Redis; call with
(list $ WORKLOAD). "rl-platform.redisInChart" is "true" when this release runs the in-chart Redis.
*/}}
{{- define "rl-platform.gcsFT" -}}
{{- $root := index . 0 -}}{{- $workload := index . 1 -}}
{{- $ft := $root.Values.gcsFaultTolerance -}}
{{- if or (and (eq $workload "serve") $ft.rayService) (and (eq $workload "cluster") $ft.rayCluster) -}}true{{- end -}}
{{- end -}}

{{- define "rl-platform.redisInChart" -}}
{{- $v := .Values -}}{{- $ft := $v.gcsFaultTolerance -}}
{{- if and (not $ft.redisAddress) (or $ft.redis.enabled (and $v.rayService.enabled $ft.rayService) (and $v.rayCluster.enabled $ft.rayCluster)) -}}true{{- end -}}
{{- end -}}

{{- define "rl-platform.redisName" -}}
{{- printf "%s-redis" (include "rl-platform.fullname" .) -}}
{{- end -}}

{{/* Where Ray finds Redis: the external address, else the in-chart Redis Service. */}}
{{- define "rl-platform.redisAddress" -}}
{{- $ft := .Values.gcsFaultTolerance -}}
{{- if $ft.redisAddress -}}
{{- $ft.redisAddress -}}
{{- else -}}
{{- printf "%s.%s.svc:%d" (include "rl-platform.redisName" .) .Release.Namespace (int $ft.redis.port) -}}
{{- end -}}
{{- end -}}

{{- define "rl-platform.redisSecretName" -}}
{{- $ft := .Values.gcsFaultTolerance -}}
{{- if $ft.passwordSecret.name -}}
{{- $ft.passwordSecret.name -}}
{{- else if $ft.redisAddress -}}
{{- fail "gcsFaultTolerance.redisAddress (an external Redis) needs gcsFaultTolerance.passwordSecret.name: the Secret holding its password" -}}
{{- else -}}
{{- include "rl-platform.redisName" . -}}
{{- end -}}
{{- end -}}

{{/* KubeRay gcsFaultToleranceOptions of a cluster spec (the password stays in its Secret). */}}
{{- define "rl-platform.gcsFaultToleranceOptions" -}}
redisAddress: {{ include "rl-platform.redisAddress" . | quote }}
redisPassword:
  valueFrom:
    secretKeyRef:
      name: {{ include "rl-platform.redisSecretName" . }}
      key: {{ .Values.gcsFaultTolerance.passwordSecret.key }}
{{- end -}}

{{/*
The head's `wait-redis` init container: Ray's GCS starts only once Redis answers and accepts the password. Ray's own
behaviour without it: the GCS retries Redis for a while, exits, and the head container restarts in a loop whose
reason is buried in gcs_server.out. Here the reason is the pod's state: Init while Redis is unreachable (a log line
every 10 s naming the address and the error), and a wrong password ends the container at once with Redis's answer
as its termination message (`kubectl describe pod`, status.initContainerStatuses[].lastState.terminated.message).
*/}}
{{- define "rl-platform.waitRedisContainer" -}}
{{- $v := .Values -}}{{- $ft := $v.gcsFaultTolerance -}}
- name: wait-redis
  image: {{ include "rl-platform.image" $v.image.cpu }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: ["python", "-I", "-c"]
  args:
    - |
      import os, socket, ssl, sys, time
      addr = os.environ["REDIS_ADDRESS"].split(",")[0]
      tls = addr.startswith("rediss://")
      host, _, port = addr.split("://", 1)[-1].rsplit("@", 1)[-1].rpartition(":")
      where = f"Redis at {host}:{port}"
      pw = os.environ["REDIS_PASSWORD"].encode()
      limit, t0, last = float(os.environ["WAIT_S"]), time.monotonic(), -10.0
      while True:
          try:
              s = socket.create_connection((host, int(port)), timeout=5)
              if tls:
                  s = ssl.create_default_context().wrap_socket(s, server_hostname=host)
              s.settimeout(5)
              s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
              answer, why = s.recv(512).decode(errors="replace").strip(), "it closed the connection"
              s.close()
          except (OSError, ValueError) as e:
              answer, why = "", f"{type(e).__name__}: {e}"
          if answer == "+OK":
              print(f"wait-redis: {where} accepted the password; starting Ray's GCS", flush=True)
              sys.exit(0)
          if answer:
              sys.exit(f"wait-redis: {where} refused the password of Secret {os.environ['REDIS_SECRET']}: {answer}")
          waited = time.monotonic() - t0
          if limit and waited > limit:
              sys.exit(f"wait-redis: {where} unreachable for {waited:.0f}s ({why}); gcsFaultTolerance.waitForRedisSeconds")
          if waited - last >= 10:
              print(f"wait-redis: waiting for {where} ({why}), {waited:.0f}s so far", flush=True)
              last = waited
          time.sleep(1)
  env:
    - name: REDIS_ADDRESS
      value: {{ include "rl-platform.redisAddress" . | quote }}
    - name: REDIS_SECRET
      value: {{ include "rl-platform.redisSecretName" . | quote }}
    - name: REDIS_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ include "rl-platform.redisSecretName" . }}
          key: {{ $ft.passwordSecret.key }}
    - name: WAIT_S
      value: {{ $ft.waitForRedisSeconds | quote }}
  resources:
    requests: {cpu: 10m, memory: 32Mi}
    limits: {cpu: 200m, memory: 128Mi}
  securityContext:
    {{- toYaml $v.containerSecurityContext | nindent 4 }}
  terminationMessagePolicy: FallbackToLogsOnError
{{- end -}}
