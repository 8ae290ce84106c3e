{{/* Names and labels. Components: orchestrator, planner, evidence-registry, artifact-builder, stage-worker. */}}

{{- define "fornax.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Leaves room for the longest component suffix ("-evidence-registry") and a pod ordinal. */}}
{{- define "fornax.fullname" -}}
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

{{/* Usage: include "fornax.componentName" (dict "root" $ "component" "planner") */}}
{{- define "fornax.componentName" -}}
{{- printf "%s-%s" (include "fornax.fullname" .root) .component -}}
{{- end -}}

{{- define "fornax.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fornax.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fornax.labels" -}}
{{ include "fornax.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: fornax
{{- end -}}

{{/* Chart-wide labels for objects that belong to no single component. */}}
{{- define "fornax.commonLabels" -}}
app.kubernetes.io/name: {{ include "fornax.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fornax
{{- end -}}

{{- define "fornax.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fornax.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Usage: include "fornax.image" (dict "root" $ "values" .Values.planner) */}}
{{- define "fornax.image" -}}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag -}}
{{- if .root.Values.image.registry -}}
{{- printf "%s/%s:%s" .root.Values.image.registry .values.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* host:port of a component's gRPC Service. */}}
{{- define "fornax.grpcAddr" -}}
{{- printf "%s:%d" (include "fornax.componentName" .) (int .root.Values.ports.grpc) -}}
{{- end -}}

{{/* Stage-worker pools in stage order, as a YAML list: each pool is one StatefulSet behind its
own headless Service. With no `stageWorker.pools`, one unnamed pool of `stageWorker.stages`
replicas keeps the chart's original names. A pool's own keys win over `stageWorker`'s. A pool's
`slots` are the pods it may ever run (autoscaling.maxReplicas when an HPA scales it, else
replicas): each slot has its stage identity (stage-<offset+i>), so stage indexes of the next
pool start after them. */}}
{{- define "fornax.stagePools" -}}
{{- $v := .Values.stageWorker -}}
{{- $defaults := dict "backend" $v.backend "device" $v.device "maxActivations" $v.maxActivations "resources" $v.resources "nodeSelector" $v.nodeSelector "tolerations" $v.tolerations "affinity" $v.affinity "podAnnotations" $v.podAnnotations "autoscaling" $v.autoscaling -}}
{{- $given := $v.pools | default (list (dict "name" "" "replicas" $v.stages)) -}}
{{- $pools := list -}}
{{- $offset := 0 -}}
{{- range $given -}}
{{- $pool := merge (deepCopy .) (deepCopy $defaults) -}}
{{- $component := ternary "stage-worker" (printf "stage-worker-%s" .name) (eq .name "") -}}
{{- $slots := ternary (int $pool.autoscaling.maxReplicas) (int .replicas) $pool.autoscaling.enabled -}}
{{- if and $pool.autoscaling.enabled (lt $slots (int .replicas)) -}}
{{- fail (printf "stage-worker pool %q: autoscaling.maxReplicas (%d) is below its replicas (%d)" .name $slots (int .replicas)) -}}
{{- end -}}
{{- if and (ne $pool.backend "max") (ne $pool.maxActivations "int8") (or (hasKey . "maxActivations") (not $v.pools)) -}}
{{- fail (printf "MAX_ACTIVATIONS_BACKEND: stage-worker pool %q: maxActivations %s sets a max stage's block-format activations; this pool runs %s" .name $pool.maxActivations $pool.backend) -}}
{{- end -}}
{{- $_ := set $pool "component" $component -}}
{{- $_ := set $pool "offset" $offset -}}
{{- $_ := set $pool "slots" $slots -}}
{{- $pools = append $pools $pool -}}
{{- $offset = add $offset $slots -}}
{{- end -}}
{{- toYaml $pools -}}
{{- end -}}

{{/* Comma-separated headless Services of the stage-worker pools (`<service>:<grpc port>`, stage
order): the orchestrator resolves each to its pool's workers (FORNAX_STAGE_POOLS). */}}
{{- define "fornax.stagePoolServices" -}}
{{- $services := list -}}
{{- range (include "fornax.stagePools" . | fromYamlArray) -}}
{{- $services = append $services (printf "%s:%d" (include "fornax.componentName" (dict "root" $ "component" .component)) (int $.Values.ports.grpc)) -}}
{{- end -}}
{{- join "," $services -}}
{{- end -}}

{{/* "true" when some stage-worker pool is scaled by a HorizontalPodAutoscaler. */}}
{{- define "fornax.anyPoolAutoscaled" -}}
{{- range (include "fornax.stagePools" . | fromYamlArray) -}}
{{- if .autoscaling.enabled -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* Comma-separated gRPC addresses of the stage workers, in stage order: every pool's pods by
their stable DNS names, then the external workers (outside Kubernetes) in the order listed. */}}
{{- define "fornax.stageWorkerAddrs" -}}
{{- $addrs := list -}}
{{- range (include "fornax.stagePools" . | fromYamlArray) -}}
{{- $sts := include "fornax.componentName" (dict "root" $ "component" .component) -}}
{{- range $i := until (int .replicas) -}}
{{- $addrs = append $addrs (printf "%s-%d.%s:%d" $sts $i $sts (int $.Values.ports.grpc)) -}}
{{- end -}}
{{- end -}}
{{- range .Values.stageWorker.external -}}
{{- $addrs = append $addrs .grpcAddress -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end -}}

{{/* Pod-level fields shared by every workload. Usage: include "fornax.podSpecCommon" (dict "root" $ "values" .Values.planner) */}}
{{- define "fornax.podSpecCommon" -}}
serviceAccountName: {{ include "fornax.serviceAccountName" .root }}
automountServiceAccountToken: false
terminationGracePeriodSeconds: {{ add (int .root.Values.gracePeriodSeconds) 5 }}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ .root.Values.security.runAsUser }}
  runAsGroup: {{ .root.Values.security.runAsGroup }}
  fsGroup: {{ .root.Values.security.fsGroup }}
  seccompProfile:
    type: RuntimeDefault
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "fornax.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.security.runAsUser }}
runAsGroup: {{ .Values.security.runAsGroup }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Environment every service reads (service configuration contract). */}}
{{- define "fornax.commonEnv" -}}
- name: FORNAX_HOST
  value: "0.0.0.0"
- name: FORNAX_GRPC_PORT
  value: {{ .Values.ports.grpc | quote }}
- name: FORNAX_METRICS_PORT
  value: {{ .Values.ports.metrics | quote }}
- name: FORNAX_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: FORNAX_GRACE_PERIOD_S
  value: {{ .Values.gracePeriodSeconds | quote }}
{{- if .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
{{- end }}
{{- end -}}

{{- define "fornax.containerPorts" -}}
- name: grpc
  containerPort: {{ .Values.ports.grpc }}
  protocol: TCP
- name: metrics
  containerPort: {{ .Values.ports.metrics }}
  protocol: TCP
- name: health
  containerPort: {{ .Values.ports.health }}
  protocol: TCP
{{- end -}}

{{/* Native gRPC probes against grpc.health.v1.Health on the plaintext health-only port: the
kubelet holds no client certificate, and the mTLS port refuses callers without one. */}}
{{- define "fornax.probes" -}}
livenessProbe:
  grpc:
    port: {{ .Values.ports.health }}
  periodSeconds: {{ .Values.probes.periodSeconds }}
  timeoutSeconds: {{ .Values.probes.timeoutSeconds }}
  failureThreshold: {{ .Values.probes.failureThreshold }}
readinessProbe:
  grpc:
    port: {{ .Values.ports.health }}
  periodSeconds: {{ .Values.probes.periodSeconds }}
  timeoutSeconds: {{ .Values.probes.timeoutSeconds }}
  failureThreshold: {{ .Values.probes.failureThreshold }}
{{- end -}}

{{/* Secret holding one identity's kubernetes.io/tls material (ca.crt, tls.crt, tls.key).
Usage: include "fornax.tlsSecretName" (dict "root" $ "identity" "planner") */}}
{{- define "fornax.tlsSecretName" -}}
{{- printf "%s-%s-tls" (default (include "fornax.fullname" .root) .root.Values.tls.secretPrefix) .identity -}}
{{- end -}}

{{/* Trust and audit environment, after the component's own (a stage's paths use
$(FORNAX_STAGE_INDEX)). Usage: include "fornax.securityEnv" (dict "root" $ "stage" false "stateDir" "/var/lib/fornax/state") */}}
{{- define "fornax.securityEnv" -}}
{{- $tls := .root.Values.tls -}}
- name: FORNAX_HEALTH_PORT
  value: {{ .root.Values.ports.health | quote }}
{{- if .stateDir }}
- name: FORNAX_STATE_DIR
  value: {{ .stateDir | quote }}
{{- end }}
{{- if $tls.enabled }}
{{- $perPod := and .stage (include "fornax.stageCsi" .root) }}
{{- $dir := ternary (printf "%s/stage-$(FORNAX_STAGE_INDEX)" $tls.mountPath) $tls.mountPath (and .stage (not $perPod)) }}
- name: FORNAX_TLS_CA
  value: {{ printf "%s/ca.crt" $dir | quote }}
- name: FORNAX_TLS_CERT
  value: {{ printf "%s/tls.crt" $dir | quote }}
- name: FORNAX_TLS_KEY
  value: {{ printf "%s/tls.key" $dir | quote }}
{{- else }}
- name: FORNAX_INSECURE
  value: "1"
{{- end }}
{{- end -}}

{{/* Writable scratch, the state dir (audit log) unless it lives on a claim, and the identity's
TLS Secret. Stage workers get every stage's Secret, each under stage-<i>/, and pick theirs by
index: pods of one StatefulSet cannot mount different Secrets.
Usage: include "fornax.baseVolumeMounts" (dict "root" $ "stateVolume" true) */}}
{{- define "fornax.baseVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .stateVolume }}
- name: state
  mountPath: /var/lib/fornax/state
{{- end }}
{{- if .root.Values.tls.enabled }}
- name: tls
  mountPath: {{ .root.Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Usage: include "fornax.baseVolumes" (dict "root" $ "identity" "planner" "stateVolume" true "stages" 0).
A stage pool passes "stages" (its replicas) and "stageOffset": pod <i> finds the Secret of
stage <offset+i> under stage-<i>/, since its FORNAX_STAGE_INDEX is its pod index. */}}
{{- define "fornax.baseVolumes" -}}
{{- $root := .root -}}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- if .stateVolume }}
- name: state
  emptyDir:
    sizeLimit: 1Gi
{{- end }}
{{- if $root.Values.tls.enabled }}
- name: tls
{{- if and .stages (include "fornax.stageCsi" $root) }}
{{- $cm := $root.Values.tls.certManager }}
{{- $ns := $root.Release.Namespace }}
  # One certificate per pod from cert-manager's csi-driver: the key never leaves the node.
  csi:
    driver: csi.cert-manager.io
    readOnly: true
    volumeAttributes:
      csi.cert-manager.io/issuer-name: {{ required "tls.certManager.issuerRef.name is required when tls.certManager.enabled" $cm.issuerRef.name | quote }}
      csi.cert-manager.io/issuer-kind: {{ $cm.issuerRef.kind | quote }}
      csi.cert-manager.io/issuer-group: {{ $cm.issuerRef.group | quote }}
      csi.cert-manager.io/uri-sans: "spiffe://fornax/stage/${POD_NAME}"
      csi.cert-manager.io/dns-names: {{ printf "${POD_NAME}.%s,${POD_NAME}.%s.%s.svc,localhost" .statefulSet .statefulSet $ns | quote }}
      csi.cert-manager.io/ip-sans: "127.0.0.1"
      csi.cert-manager.io/organizations: "fornax"
      csi.cert-manager.io/organizationalunits: "stage"
      csi.cert-manager.io/key-usages: "digital signature,client auth,server auth"
      csi.cert-manager.io/duration: {{ $cm.duration | quote }}
      csi.cert-manager.io/renew-before: {{ $cm.renewBefore | quote }}
      csi.cert-manager.io/ca-file: "ca.crt"
      csi.cert-manager.io/certificate-file: "tls.crt"
      csi.cert-manager.io/privatekey-file: "tls.key"
{{- else if .stages }}
  projected:
    defaultMode: 0440
    sources:
      {{- $offset := int (.stageOffset | default 0) }}
      {{- range $i := until (int .stages) }}
      - secret:
          name: {{ include "fornax.tlsSecretName" (dict "root" $root "identity" (printf "stage-%d" (add $offset $i))) }}
          items:
            {{- range $key := list "ca.crt" "tls.crt" "tls.key" }}
            - key: {{ $key }}
              path: {{ printf "stage-%d/%s" $i $key }}
            {{- end }}
      {{- end }}
{{- else }}
  secret:
    secretName: {{ include "fornax.tlsSecretName" (dict "root" $root "identity" .identity) }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end -}}

{{/* "true" when each stage-worker pod gets its own certificate from cert-manager's csi-driver. */}}
{{- define "fornax.stageCsi" -}}
{{- $tls := .Values.tls -}}
{{- if and $tls.certManager.csi.enabled (not (and $tls.enabled $tls.certManager.enabled)) -}}
{{- fail "tls.certManager.csi.enabled needs tls.enabled and tls.certManager.enabled (an Issuer to sign the pods' certificates)" -}}
{{- end -}}
{{- if and $tls.enabled $tls.certManager.enabled $tls.certManager.csi.enabled -}}true{{- end -}}
{{- end -}}

{{- define "fornax.checkpointVolumeMount" -}}
{{- if .Values.checkpoints.existingClaim -}}
- name: checkpoints
  mountPath: {{ .Values.checkpoints.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "fornax.checkpointVolume" -}}
{{- if .Values.checkpoints.existingClaim -}}
- name: checkpoints
  persistentVolumeClaim:
    claimName: {{ .Values.checkpoints.existingClaim }}
    readOnly: true
{{- end }}
{{- end -}}

{{/* ClusterIP Service exposing gRPC and metrics of one component. Usage:
include "fornax.service" (dict "root" $ "component" "planner" "type" "ClusterIP" "http" false) */}}
{{- define "fornax.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "fornax.componentName" . }}
  labels:
    {{- include "fornax.labels" . | nindent 4 }}
spec:
  type: {{ .type | default "ClusterIP" }}
  selector:
    {{- include "fornax.selectorLabels" . | nindent 4 }}
  ports:
    - name: grpc
      port: {{ .root.Values.ports.grpc }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    - name: metrics
      port: {{ .root.Values.ports.metrics }}
      targetPort: metrics
      protocol: TCP
    - name: health
      port: {{ .root.Values.ports.health }}
      targetPort: health
      protocol: TCP
      appProtocol: grpc
    {{- if .http }}
    - name: http
      port: {{ .root.Values.ports.http }}
      targetPort: http
      protocol: TCP
    {{- end }}
{{- end -}}

{{/* PVC for a component's state, unless an existing claim is named. */}}
{{- define "fornax.pvc" -}}
{{- $p := .persistence -}}
{{- if not $p.existingClaim }}
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {{ include "fornax.componentName" . }}
  labels:
    {{- include "fornax.labels" . | nindent 4 }}
  annotations:
    helm.sh/resource-policy: keep
spec:
  accessModes:
    - {{ $p.accessMode }}
  {{- if $p.storageClassName }}
  storageClassName: {{ $p.storageClassName | quote }}
  {{- end }}
  resources:
    requests:
      storage: {{ $p.size }}
{{- end }}
{{- end -}}

{{- define "fornax.claimName" -}}
{{- default (include "fornax.componentName" .) .persistence.existingClaim -}}
{{- end -}}

{{/* Deployment of one stateless-shell service. Keys: root, component, values, replicas,
env / mounts / volumes (rendered YAML lists, may be empty), http (bool), recreate (bool: the
pod holds a ReadWriteOnce claim, so the old pod must go before the new one starts), stateDir
(where the audit log lives when it is on one of the pod's claims; empty = an emptyDir), ownState
(the template mounts and names its own state dir). */}}
{{- define "fornax.deployment" -}}
{{- $c := dict "root" .root "component" .component -}}
{{- $root := .root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "fornax.componentName" $c }}
  labels:
    {{- include "fornax.labels" $c | nindent 4 }}
spec:
  replicas: {{ .replicas }}
  {{- if .recreate }}
  strategy:
    type: Recreate
  {{- end }}
  selector:
    matchLabels:
      {{- include "fornax.selectorLabels" $c | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "fornax.labels" $c | nindent 8 }}
      {{- with .values.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      {{- include "fornax.podSpecCommon" (dict "root" $root "values" .values) | nindent 6 }}
      containers:
        - name: {{ .component }}
          image: {{ include "fornax.image" (dict "root" $root "values" .values) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          env:
            {{- include "fornax.commonEnv" $root | nindent 12 }}
            {{- with .env }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- include "fornax.securityEnv" (dict "root" $root "stage" false "stateDir" (ternary "" (.stateDir | default "/var/lib/fornax/state") (.ownState | default false))) | nindent 12 }}
          ports:
            {{- include "fornax.containerPorts" $root | nindent 12 }}
            {{- if .http }}
            - name: http
              containerPort: {{ $root.Values.ports.http }}
              protocol: TCP
            {{- end }}
          {{- include "fornax.probes" $root | nindent 10 }}
          resources:
            {{- toYaml .values.resources | nindent 12 }}
          securityContext:
            {{- include "fornax.containerSecurityContext" $root | nindent 12 }}
          volumeMounts:
            {{- include "fornax.baseVolumeMounts" (dict "root" $root "stateVolume" (not (or .stateDir .ownState))) | nindent 12 }}
            {{- with .mounts }}
            {{- . | nindent 12 }}
            {{- end }}
      volumes:
        {{- include "fornax.baseVolumes" (dict "root" $root "identity" .component "stateVolume" (not (or .stateDir .ownState)) "stages" 0) | nindent 8 }}
        {{- with .volumes }}
        {{- . | nindent 8 }}
        {{- end }}
{{- end -}}
