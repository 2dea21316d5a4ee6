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

{{- define "scalerl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
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
