{{/*
Shared naming, labels and the per-operator building blocks (Deployment, ServiceAccount,
metrics Service, leader-election Role). Each operator's own file decides its RBAC rules; nothing
here grants a permission beyond the operator's own Lease.
*/}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of one operator's objects: <fullname>-<component>. Args: (dict "root" $ "component" "revert") */}}
{{- define "sluice.componentName" -}}
{{- printf "%s-%s" (include "sluice.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. Args: (dict "root" $ "component" "revert"), component optional. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: sluice
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select one operator's pods. Args as sluice.labels. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "sluice.image" -}}
{{- $img := .Values.image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{/* The Lease each operator holds for leader election, in the release namespace. */}}
{{- define "sluice.leaseName" -}}
{{- include "sluice.componentName" . }}
{{- end }}

{{/*
ServiceAccount of one operator.
Args: (dict "root" $ "component" "revert")
*/}}
{{- define "sluice.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "sluice.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
automountServiceAccountToken: true
{{- end }}

{{/*
Leader election (sluice-runtime's leader module: get, create, patch): create any Lease in the release
namespace (create cannot be limited by name), but read and renew only the operator's own.
Args: (dict "root" $ "component" "revert")
*/}}
{{- define "sluice.leaseRbac" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ include "sluice.componentName" . }}-leader-election
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["create"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: [{{ include "sluice.leaseName" . | quote }}]
    verbs: ["get", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ include "sluice.componentName" . }}-leader-election
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ include "sluice.componentName" . }}-leader-election
subjects:
  - kind: ServiceAccount
    name: {{ include "sluice.componentName" . }}
    namespace: {{ .root.Release.Namespace }}
{{- end }}

{{/*
A binding of one operator's ServiceAccount to a Role or ClusterRole.
Args: (dict "root" $ "component" "revert" "kind" "RoleBinding"|"ClusterRoleBinding"
            "roleKind" "Role"|"ClusterRole" "name" "<role and binding name>" "namespace" "<ns, RoleBinding only>")
*/}}
{{- define "sluice.binding" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}
metadata:
  name: {{ .name }}
  {{- if eq .kind "RoleBinding" }}
  namespace: {{ .namespace }}
  {{- end }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ .roleKind }}
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ include "sluice.componentName" . }}
    namespace: {{ .root.Release.Namespace }}
{{- end }}

{{/*
The metrics Service of one operator.
Args: (dict "root" $ "component" "revert")
*/}}
{{- define "sluice.metricsService" -}}
{{- if .root.Values.metrics.service.enabled }}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "sluice.componentName" . }}-metrics
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "sluice.selectorLabels" . | nindent 4 }}
  ports:
    - name: metrics
      port: {{ .root.Values.metrics.port }}
      targetPort: metrics
      protocol: TCP
{{- end }}
{{- end }}

{{/*
The Deployment of one operator: `replicas` pods with leader election, hardened pod and container
security, probes on the metrics port.
Args: (dict "root" $ "component" "revert" "values" .Values.revert "args" (list "--namespace=argocd"))
*/}}
{{- define "sluice.deployment" -}}
{{- $root := .root }}
{{- $v := .values }}
{{- $port := $root.Values.metrics.port }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "sluice.componentName" . }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
  annotations:
    # Under Argo CD: after the CRDs and RBAC of wave 0 are applied and healthy.
    argocd.argoproj.io/sync-wave: {{ $root.Values.argocd.syncWave.operators | quote }}
spec:
  replicas: {{ $v.replicas }}
  revisionHistoryLimit: 3
  selector:
    matchLabels:
      {{- include "sluice.selectorLabels" . | nindent 6 }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 0
  template:
    metadata:
      labels:
        {{- include "sluice.labels" . | nindent 8 }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "sluice.componentName" . }}
      automountServiceAccountToken: true
      enableServiceLinks: false
      terminationGracePeriodSeconds: 30
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        fsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: {{ .component }}
          image: {{ include "sluice.image" $root | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["/usr/local/bin/sluice-{{ .component }}"]
          args:
            - --lease-name={{ include "sluice.leaseName" . }}
            - --lease-namespace={{ $root.Release.Namespace }}
            - --lease-duration-seconds={{ $root.Values.leaderElection.leaseDurationSeconds }}
            - --lease-renew-seconds={{ $root.Values.leaderElection.renewSeconds }}
            - --lease-retry-seconds={{ $root.Values.leaderElection.retrySeconds }}
            - --metrics-addr=0.0.0.0:{{ $port }}
            - --log-format={{ $root.Values.logFormat }}
            - --log-level={{ $root.Values.logLevel }}
            {{- range .args }}
            - {{ . | quote }}
            {{- end }}
            {{- if .metricsSource }}
            {{- range (include "sluice.metricsSourceArgs" $root | splitList "\n") }}
            {{- if . }}
            - {{ . | quote }}
            {{- end }}
            {{- end }}
            {{- end }}
            {{- with $root.Values.notifications.secretName }}
            - --notifications-secret={{ . }}
            {{- end }}
            {{- with $root.Values.notifications.cluster }}
            - {{ printf "--notifications-cluster=%s" . | quote }}
            {{- end }}
            {{- range $v.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
          ports:
            - name: metrics
              containerPort: {{ $port }}
              protocol: TCP
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            initialDelaySeconds: 5
            periodSeconds: 10
            timeoutSeconds: 2
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            periodSeconds: 5
            timeoutSeconds: 2
            failureThreshold: 2
          {{- with $v.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            allowPrivilegeEscalation: false
            privileged: false
            readOnlyRootFilesystem: true
            runAsNonRoot: true
            capabilities:
              drop: ["ALL"]
            seccompProfile:
              type: RuntimeDefault
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if and .metricsSource (include "sluice.metricsSourceFiles" $root) }}
            - name: metrics-source
              mountPath: {{ include "sluice.metricsSourceDir" $root }}
              readOnly: true
            {{- end }}
            {{- with .volumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
        {{- if and .metricsSource (include "sluice.metricsSourceFiles" $root) }}
        # The metrics source's credentials and CA as files; kubelet updates them in place when a
        # Secret changes or the token rotates, and the operators read them for every query.
        - name: metrics-source
          projected:
            defaultMode: 0440
            sources:
              {{- include "sluice.metricsSourceFiles" $root | trim | nindent 14 }}
        {{- end }}
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $v.affinity }}
      affinity:
        {{- toYaml $v.affinity | nindent 8 }}
      {{- else }}
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              {{- include "sluice.selectorLabels" . | nindent 14 }}
      {{- end }}
{{- end }}

{{/*
Keeps the standby alive through voluntary disruptions (node drains) when there is one.
Args: (dict "root" $ "component" "revert" "values" .Values.revert)
*/}}
{{- define "sluice.podDisruptionBudget" -}}
{{- if gt (int .values.replicas) 1 }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "sluice.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      {{- include "sluice.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}

{{/* Where the metrics source's files are mounted in the gate-running operators' pods. */}}
{{- define "sluice.metricsSourceDir" -}}
/etc/sluice/metrics-source
{{- end }}

{{/*
The projected volume sources of the metrics source (values metricsSource): the bearer token
(a Secret key, or the pod's own service account token for an audience), the basic auth password,
the CA. Empty when none is set. Args: $ (the root context).
*/}}
{{- define "sluice.metricsSourceFiles" -}}
{{- $m := .Values.metricsSource }}
{{- with $m.bearerToken.secretName }}
- secret:
    name: {{ . }}
    items:
      - key: {{ $m.bearerToken.key }}
        path: token
{{- end }}
{{- with $m.serviceAccountToken.audience }}
- serviceAccountToken:
    audience: {{ . | quote }}
    expirationSeconds: {{ $m.serviceAccountToken.expirationSeconds }}
    path: token
{{- end }}
{{- with $m.basicAuth.passwordSecretName }}
- secret:
    name: {{ . }}
    items:
      - key: {{ $m.basicAuth.passwordKey }}
        path: password
{{- end }}
{{- with $m.ca.secretName }}
- secret:
    name: {{ . }}
    items:
      - key: {{ $m.ca.key }}
        path: ca.crt
{{- end }}
{{- with $m.ca.configMapName }}
- configMap:
    name: {{ . }}
    items:
      - key: {{ $m.ca.key }}
        path: ca.crt
{{- end }}
{{- end }}

{{/* The metrics source flags (values metricsSource), one a line. Args: $ (the root context). */}}
{{- define "sluice.metricsSourceArgs" -}}
{{- $m := .Values.metricsSource }}
{{- $dir := include "sluice.metricsSourceDir" . }}
{{- if gt (int $m.timeoutSeconds) 0 }}
{{ printf "--prometheus-timeout-seconds=%d" (int $m.timeoutSeconds) }}
{{- end }}
{{- if or $m.bearerToken.secretName $m.serviceAccountToken.audience }}
{{ printf "--prometheus-bearer-token-file=%s/token" $dir }}
{{- end }}
{{- with $m.basicAuth.username }}
{{ printf "--prometheus-username=%s" . }}
{{ printf "--prometheus-password-file=%s/password" $dir }}
{{- end }}
{{- range $name, $value := $m.headers }}
{{ printf "--prometheus-header=%s=%s" $name $value }}
{{- end }}
{{- if or $m.ca.secretName $m.ca.configMapName }}
{{ printf "--prometheus-ca-file=%s/ca.crt" $dir }}
{{- end }}
{{- end }}

{{/* The annotation rollout-weights puts on an HTTPRoute it owns (sluice-api ROUTE_OWNER_ANNOTATION). */}}
{{- define "sluice.routeOwnerAnnotation" -}}
sluice.dev/owned-by-rollout
{{- end }}

{{/* The namespace of revert's destination-cluster identity Secrets (default: the release namespace). */}}
{{- define "sluice.revertIdentityNamespace" -}}
{{- .Values.revert.clusterIdentities.namespace | default .Release.Namespace }}
{{- end }}

{{/* revert's target identity on a workload cluster: its ServiceAccount, ClusterRole and binding name. */}}
{{- define "sluice.revertTargetName" -}}
{{- include "sluice.componentName" (dict "root" . "component" "revert-target") }}
{{- end }}

{{/*
The resources of the mesh kinds a bundle may hold (sluice-api DEFAULT_ALLOWED_KINDS), by API
group, as YAML: what revert's target identity may apply and prune.
*/}}
{{- define "sluice.revertTargetResources" -}}
gateway.networking.k8s.io: [httproutes, grpcroutes]
networking.istio.io: [virtualservices, destinationrules, serviceentries, sidecars, envoyfilters]
security.istio.io: [authorizationpolicies, peerauthentications, requestauthentications]
telemetry.istio.io: [telemetries]
{{- end }}

{{/*
CEL: every field of `fields` under `path` (of object and oldObject) is present in both or in
neither, and equal where present. Args: (dict "path" "spec" "fields" (list "replicas" ...)); an
empty path means the object's top level.
*/}}
{{- define "sluice.admission.same" -}}
{{- $path := .path -}}
{{- $terms := list -}}
{{- range $f := .fields -}}
{{- $p := ternary $f (printf "%s.%s" $path $f) (eq $path "") -}}
{{- $terms = append $terms (printf "(has(object.%s) == has(oldObject.%s) && (!has(object.%s) || object.%s == oldObject.%s))" $p $p $p $p $p) -}}
{{- end -}}
{{- join " && " $terms -}}
{{- end }}

{{/*
CEL: the maps `new` and `old` (expressions) hold the same entries except for `key`, which may be
added, changed or removed. Args: (dict "new" "variables.x" "old" "variables.y" "key" "k").
*/}}
{{- define "sluice.admission.mapExcept" -}}
{{- printf "%s.all(k, k == '%s' || (k in %s && %s[k] == %s[k])) && %s.all(k, k == '%s' || k in %s)" .new .key .old .old .new .old .key .new -}}
{{- end }}
