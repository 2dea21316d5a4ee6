{{/* The release's full name, a DNS label. */}}
{{- define "scalerl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "scalerl.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "scalerl.labels" -}}
{{ include "scalerl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "scalerl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "scalerl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* The operator's image (the fit and initializer Jobs run in it too): by digest where
`image.digest` names one (it wins over the tag), else by tag. */}}
{{- define "scalerl.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The label kube-prometheus-stack selects monitors and rules by. */}}
{{- define "scalerl.monitoringLabels" -}}
{{ include "scalerl.labels" . }}
release: {{ .Values.monitoring.release | quote }}
{{- end -}}

{{/* imagePullSecrets' names, comma-separated, for the operator to give run pods. */}}
{{- define "scalerl.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{- /* Whether to render a Prometheus Operator object: `enabled` true or false, or "auto" (the
default): only where the cluster serves monitoring.coreos.com/v1, so `helm install` works on a
cluster without the Prometheus Operator. For `helm template`, pass
`--api-versions monitoring.coreos.com/v1` or set true. Called with (list enabled $). */}}
{{- define "scalerl.monitoring" -}}
{{- $enabled := index . 0 -}}
{{- $root := index . 1 -}}
{{- if eq (toString $enabled) "auto" -}}
{{- $root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}
{{- else -}}
{{- $enabled -}}
{{- end -}}
{{- end -}}

{{- /* A dashboard's JSON whose alert panels follow the release's alert values: every range
window in their queries becomes the alert's window, every threshold step its threshold (the
red line). Called with (list json alerts); panels are known by title. */}}
{{- define "scalerl.dashboard" -}}
{{- $dashboard := index . 0 | fromJson -}}
{{- $alerts := index . 1 -}}
{{- $follow := dict
  "Truncation rate" (list $alerts.truncation.window $alerts.truncation.threshold)
  "Stale prompt groups" (list $alerts.staleGroups.window $alerts.staleGroups.share) -}}
{{- range $panel := $dashboard.panels -}}
{{- if hasKey $follow $panel.title -}}
{{- $window := index (get $follow $panel.title) 0 -}}
{{- $threshold := index (get $follow $panel.title) 1 -}}
{{- range $target := $panel.targets -}}
{{- $_ := set $target "expr" (regexReplaceAll "\\[[0-9a-z]+\\]" $target.expr (printf "[%s]" $window)) -}}
{{- end -}}
{{- range $step := $panel.fieldConfig.defaults.thresholds.steps -}}
{{- if not (kindIs "invalid" $step.value) -}}
{{- $_ := set $step "value" $threshold -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toPrettyJson $dashboard -}}
{{- end -}}

{{- /* The API server as pods reach it, as JSON {"cidrs": [...], "ports": [...]}: the
`networkPolicy.apiServer` values where set; else, at `helm install` and `helm upgrade`, the
cluster's own answer (the `kubernetes` Service's address on its port, and its EndpointSlice's
addresses and ports: a network plugin may match a connection before or after the Service's
translation); else (`helm template`, or a user who may not read them) any address on 443 and
6443. The operator gets the same for the run pods that call the API server. */}}
{{- define "scalerl.apiServer" -}}
{{- $cidrs := list -}}
{{- $ports := list -}}
{{- $service := lookup "v1" "Service" "default" "kubernetes" -}}
{{- if $service -}}
{{- range $service.spec.clusterIPs | default (list $service.spec.clusterIP) -}}
{{- $cidrs = append $cidrs (printf "%s/%s" . (ternary "128" "32" (contains ":" .))) -}}
{{- end -}}
{{- range $service.spec.ports -}}
{{- $ports = append $ports (int .port) -}}
{{- end -}}
{{- end -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" -}}
{{- if $slice -}}
{{- range $slice.endpoints -}}
{{- range .addresses -}}
{{- $cidrs = append $cidrs (printf "%s/%s" . (ternary "128" "32" (contains ":" .))) -}}
{{- end -}}
{{- end -}}
{{- range $slice.ports -}}
{{- $ports = append $ports (int .port) -}}
{{- end -}}
{{- end -}}
{{- $cidrs = .Values.networkPolicy.apiServer.cidrs | default $cidrs | default (list "0.0.0.0/0" "::/0") -}}
{{- $ports = .Values.networkPolicy.apiServer.ports | default $ports | default (list 443 6443) -}}
{{- dict "cidrs" ($cidrs | uniq) "ports" ($ports | uniq) | toJson -}}
{{- end -}}
