{{/*
The release's name for converge's objects: the release name, or the
release name and the chart's when it does not hold the chart's already, at
most 63 bytes less the longest suffix ("-provisioner", 12).
*/}}
{{- define "converge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 51 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 51 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The DaemonSet's name, which its pods carry as app.kubernetes.io/name. */}}
{{- define "converge.nodeName" -}}
{{- printf "%s-node" (include "converge.fullname" .) -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "converge.labels" -}}
app.kubernetes.io/part-of: converge
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The labels that select the DaemonSet's pods. */}}
{{- define "converge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "converge.nodeName" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* csi-node's image. */}}
{{- define "converge.image" -}}
{{- printf "%s:%s" .Values.csiNode.image.repository (.Values.csiNode.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The plugin's directory under the kubelet's, where its socket is. */}}
{{- define "converge.pluginDir" -}}
{{- printf "%s/plugins/converge.csi.dev" .Values.csiNode.kubeletDir -}}
{{- end -}}
