{{/* Names and labels. */}}
{{- define "fluksio-worker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fluksio-worker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "fluksio-worker.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "fluksio-worker.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "fluksio-worker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fluksio-worker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fluksio-worker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fluksio-worker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Secret the token file comes from. */}}
{{- define "fluksio-worker.tokenSecret" -}}
{{- if and .Values.token.existingSecret .Values.token.value }}
{{- fail "set token.existingSecret or token.value, not both" }}
{{- else if .Values.token.existingSecret }}
{{- .Values.token.existingSecret }}
{{- else if .Values.token.value }}
{{- printf "%s-token" (include "fluksio-worker.fullname" .) }}
{{- else }}
{{- fail "a worker token is required: token.existingSecret (a Secret holding it under token.key) or token.value (the chart creates the Secret)" }}
{{- end }}
{{- end }}

{{/* Where things are in the pod. */}}
{{- define "fluksio-worker.binDir" -}}/fluksio/bin{{- end }}
{{- define "fluksio-worker.binary" -}}/fluksio/bin/fluksio-worker{{- end }}
{{- define "fluksio-worker.tokenDir" -}}/var/run/secrets/fluksio{{- end }}
{{- define "fluksio-worker.stateDir" -}}/fluksio/state{{- end }}

{{- define "fluksio-worker.oneShot" -}}
{{- if has .Values.mode (list "job" "scaledJob") }}true{{ end }}
{{- end }}

{{/* The drain's length, 0 without one. */}}
{{- define "fluksio-worker.drainSeconds" -}}
{{- if .Values.drain.enabled }}{{ int .Values.drain.timeoutSeconds }}{{ else }}0{{ end }}
{{- end }}

{{/* Long enough for the stop ladder: the drain, then SIGTERM to the calls
     and SIGKILL after the cancel grace, then the worker's own exit. */}}
{{- define "fluksio-worker.terminationGrace" -}}
{{- $need := add (include "fluksio-worker.drainSeconds" . | int) (int .Values.cancelGraceSeconds) 15 }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- $need }}
{{- else if lt (int .Values.terminationGracePeriodSeconds) (sub $need 15 | int) }}
{{- fail (printf "terminationGracePeriodSeconds %v is shorter than the drain (%s s) plus cancelGraceSeconds (%v s)" .Values.terminationGracePeriodSeconds (include "fluksio-worker.drainSeconds" .) .Values.cancelGraceSeconds) }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* The worker's arguments. The token is only ever --token-file. */}}
{{- define "fluksio-worker.args" -}}
- run
- --url
- {{ required "engine.url is required: the engine's worker endpoint, wss://ENGINE/api/v1/workers/attach" .Values.engine.url | quote }}
- --token-file
- {{ printf "%s/token" (include "fluksio-worker.tokenDir" .) | quote }}
- --listen
- {{ printf ":%d" (int .Values.metrics.port) | quote }}
- --state-dir
- {{ include "fluksio-worker.stateDir" . | quote }}
- --parallel
- {{ .Values.parallel | int | quote }}
- --gpus
- {{ .Values.gpus | int | quote }}
- --cancel-grace
- {{ printf "%ds" (int .Values.cancelGraceSeconds) | quote }}
- --log-format
- {{ .Values.logFormat | quote }}
{{- if not (kindIs "invalid" .Values.warm) }}
- --warm
- {{ .Values.warm | int | quote }}
{{- end }}
{{- with .Values.preload }}
- --preload
- {{ join "," . | quote }}
{{- end }}
{{- with .Values.callLimits.memoryMax }}
- --call-memory-max
- {{ . | quote }}
{{- end }}
{{- with .Values.callLimits.pidsMax }}
- --call-pids-max
- {{ . | int | quote }}
{{- end }}
{{- with .Values.callLimits.cpuMax }}
- --call-cpu-max
- {{ . | toString | quote }}
{{- end }}
{{- with .Values.minFreeDisk }}
- --min-free-disk
- {{ . | quote }}
{{- end }}
{{- with .Values.labels }}
- --labels
- {{ join "," . | quote }}
{{- end }}
{{- with .Values.python }}
- --python
- {{ . | quote }}
{{- end }}
{{- with .Values.name }}
- --name
- {{ . | quote }}
{{- end }}
{{- if include "fluksio-worker.oneShot" . }}
{{- if .Values.oneShot.maxCalls }}
- --max-calls
- {{ .Values.oneShot.maxCalls | int | quote }}
{{- end }}
{{- if .Values.oneShot.maxIdleSeconds }}
- --max-idle
- {{ printf "%ds" (int .Values.oneShot.maxIdleSeconds) | quote }}
{{- end }}
{{- end }}
{{- include "fluksio-worker.sandboxArgs" . }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* sandbox.mode: auto, on or off. YAML 1.1 reads an unquoted on and
     off as true and false: those are taken as meant. */}}
{{- define "fluksio-worker.sandboxMode" -}}
{{- $mode := .Values.sandbox.mode }}
{{- if kindIs "bool" $mode }}
{{- $mode = ternary "on" "off" $mode }}
{{- end }}
{{- if not (has $mode (list "auto" "on" "off")) }}
{{- fail (printf "sandbox.mode must be auto, on or off, not %q" (toString $mode)) }}
{{- end }}
{{- $mode }}
{{- end }}

{{/* The sandbox's arguments, after refusing what the worker would refuse
     at start (a pod that never starts) or what cannot mean anything. */}}
{{- define "fluksio-worker.sandboxArgs" -}}
{{- $sb := .Values.sandbox }}
{{- $mode := include "fluksio-worker.sandboxMode" . }}
{{- if and $sb.allowNamespaces (eq $mode "off") }}
{{- fail "sandbox.allowNamespaces unconfines the worker's seccomp and AppArmor profiles for a sandbox that sandbox.mode off turns off: set sandbox.allowNamespaces false, or sandbox.mode auto or on" }}
{{- end }}
- --sandbox
- {{ $mode | quote }}
{{- range $sb.binds }}
{{- $path := toString . }}
{{- $mode := "" }}
{{- if contains ":" $path }}
{{- $mode = regexReplaceAll "^[^:]*:" $path "" }}
{{- $path = regexReplaceAll ":.*$" $path "" }}
{{- end }}
{{- if or (not (isAbs $path)) (not (has $mode (list "" "rw" "ro"))) }}
{{- fail (printf "sandbox.binds: %q is not an absolute path, optionally followed by :rw (writable) or :ro: give /PATH or /PATH:rw" (toString .)) }}
{{- end }}
- --sandbox-bind
- {{ . | toString | quote }}
{{- end }}
{{- end }}

{{/* The worker container's securityContext: securityContext, with the
     seccomp and AppArmor profiles unconfined where sandbox.allowNamespaces
     says (a user namespace and mounts in it, which runtimes' default
     profiles refuse), unless a Localhost profile is set for the container
     or the pod (one of the owner's, which is kept). */}}
{{- define "fluksio-worker.securityContext" -}}
{{- $sc := deepCopy (default dict .Values.securityContext) }}
{{- if .Values.sandbox.allowNamespaces }}
{{- $pod := default dict .Values.podSecurityContext }}
{{- range $field := list "seccompProfile" "appArmorProfile" }}
{{- $own := get $sc $field }}
{{- $podOwn := get $pod $field }}
{{- $localhost := or (and (kindIs "map" $own) (eq (toString $own.type) "Localhost")) (and (not $own) (kindIs "map" $podOwn) (eq (toString $podOwn.type) "Localhost")) }}
{{- if not $localhost }}
{{- $_ := set $sc $field (dict "type" "Unconfined") }}
{{- end }}
{{- end }}
{{- end }}
{{- with $sc }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* The pod template every mode shares. */}}
{{- define "fluksio-worker.podTemplate" -}}
metadata:
  labels:
    {{- include "fluksio-worker.selectorLabels" . | nindent 4 }}
    app.kubernetes.io/component: worker
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if or .Values.metrics.annotations .Values.podAnnotations (not .Values.token.existingSecret) }}
  annotations:
    {{- if .Values.metrics.annotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ .Values.metrics.port | int | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- if not .Values.token.existingSecret }}
    # A changed token restarts the workers.
    checksum/token: {{ .Values.token.value | sha256sum | trunc 16 }}
    {{- end }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
spec:
  {{- if include "fluksio-worker.oneShot" . }}
  restartPolicy: Never
  {{- end }}
  {{- if and .Values.drain.enabled (eq .Values.drain.method "stopSignal") }}
  # A stop signal needs the pod's OS named.
  os:
    name: linux
  {{- end }}
  terminationGracePeriodSeconds: {{ include "fluksio-worker.terminationGrace" . }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  {{- with .Values.serviceAccountName }}
  serviceAccountName: {{ . }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if not (kindIs "invalid" .Values.hostUsers) }}
  {{- if not (kindIs "bool" .Values.hostUsers) }}
  {{- fail (printf "hostUsers must be true, false or null, not %q" (toString .Values.hostUsers)) }}
  {{- end }}
  hostUsers: {{ .Values.hostUsers }}
  {{- end }}
  {{- with .Values.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  initContainers:
    # The worker image holds only the binary; it copies itself out.
    - name: copy-worker
      {{- with .Values.workerImage }}
      image: {{ if .digest }}{{ printf "%s@%s" .repository .digest | quote }}{{ else }}{{ printf "%s:%s" .repository (default $.Chart.AppVersion .tag) | quote }}{{ end }}
      {{- end }}
      imagePullPolicy: {{ .Values.workerImage.pullPolicy }}
      command: ["/fluksio-worker", "copy", {{ include "fluksio-worker.binDir" . | quote }}]
      {{- with .Values.initSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      resources:
        requests: {cpu: 10m, memory: 32Mi}
        limits: {memory: 64Mi}
      volumeMounts:
        - name: fluksio-bin
          mountPath: {{ include "fluksio-worker.binDir" . }}
  containers:
    - name: worker
      image: {{ printf "%s:%s" (required "image.repository is required: your image, with the Python, CUDA and packages your nodes need; the worker binary is copied into it" .Values.image.repository) (toString .Values.image.tag) | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command: [{{ include "fluksio-worker.binary" . | quote }}]
      args:
        {{- include "fluksio-worker.args" . | nindent 8 }}
      {{- with .Values.env }}
      env:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        - name: metrics
          containerPort: {{ .Values.metrics.port | int }}
          protocol: TCP
      # /livez fails only when the worker itself is wedged (its main loop
      # stopped): a restart mends that, not an engine outage.
      startupProbe:
        httpGet:
          path: /livez
          port: metrics
        periodSeconds: {{ .Values.startupProbe.periodSeconds | int }}
        timeoutSeconds: {{ .Values.startupProbe.timeoutSeconds | int }}
        failureThreshold: {{ .Values.startupProbe.failureThreshold | int }}
      livenessProbe:
        httpGet:
          path: /livez
          port: metrics
        periodSeconds: {{ .Values.livenessProbe.periodSeconds | int }}
        timeoutSeconds: {{ .Values.livenessProbe.timeoutSeconds | int }}
        failureThreshold: {{ .Values.livenessProbe.failureThreshold | int }}
      # /healthz: attached to the engine, or within --health-grace of it.
      readinessProbe:
        httpGet:
          path: /healthz
          port: metrics
        periodSeconds: {{ .Values.readinessProbe.periodSeconds | int }}
        timeoutSeconds: {{ .Values.readinessProbe.timeoutSeconds | int }}
        failureThreshold: {{ .Values.readinessProbe.failureThreshold | int }}
      {{- if .Values.drain.enabled }}
      lifecycle:
        {{- if eq .Values.drain.method "stopSignal" }}
        # SIGQUIT drains: no new calls, running ones finish, exit 0.
        stopSignal: SIGQUIT
        {{- else if eq .Values.drain.method "preStop" }}
        preStop:
          exec:
            # SIGQUIT drains: no new calls, running ones finish, exit 0. The
            # hook waits for that, so Kubernetes' SIGTERM comes only after.
            command: ["/bin/sh", "-c", "kill -QUIT 1; while kill -0 1 2>/dev/null; do sleep 1; done"]
        {{- else }}
        {{- fail (printf "drain.method must be preStop or stopSignal, not %q" .Values.drain.method) }}
        {{- end }}
      {{- end }}
      {{- $limits := deepCopy (default dict .Values.resources.limits) }}
      {{- if gt (int .Values.gpus) 0 }}
      {{- $_ := set $limits "nvidia.com/gpu" (int .Values.gpus) }}
      {{- end }}
      {{- if or .Values.resources.requests $limits }}
      resources:
        {{- with .Values.resources.requests }}
        requests:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with $limits }}
        limits:
          {{- toYaml . | nindent 10 }}
        {{- end }}
      {{- end }}
      {{- with include "fluksio-worker.securityContext" . }}
      securityContext:
        {{- . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: fluksio-bin
          mountPath: {{ include "fluksio-worker.binDir" . }}
          readOnly: true
        - name: fluksio-token
          mountPath: {{ include "fluksio-worker.tokenDir" . }}
          readOnly: true
        - name: fluksio-state
          mountPath: {{ include "fluksio-worker.stateDir" . }}
        - name: tmp
          mountPath: /tmp
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumes:
    - name: fluksio-bin
      emptyDir:
        sizeLimit: 256Mi
    - name: fluksio-token
      secret:
        secretName: {{ include "fluksio-worker.tokenSecret" . }}
        defaultMode: 0440
        items:
          - key: {{ .Values.token.key }}
            path: token
    - name: fluksio-state
      emptyDir:
        sizeLimit: {{ .Values.stateSizeLimit }}
    - name: tmp
      emptyDir:
        sizeLimit: {{ .Values.tmpSizeLimit }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
