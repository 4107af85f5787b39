{{/* Names. */}}
{{- define "llm-placement.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "llm-placement.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llm-placement.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "llm-placement.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "llm-placement.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "llm-placement.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "llm-placement.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-placement.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* True (non-empty) in the secondary-scheduler mode. */}}
{{- define "llm-placement.schedulerMode" -}}
{{- if eq .Values.mode "scheduler" -}}true{{- end -}}
{{- end -}}

{{/*
Where the extender listens. Loopback in scheduler mode: kube-scheduler is in the same pod, and the
bind endpoint (which creates Bindings with this pod's credentials) stays off the pod network.
All interfaces in default-scheduler mode, where the cluster's scheduler reaches it through a Service.
*/}}
{{- define "llm-placement.extenderHost" -}}
{{- if include "llm-placement.schedulerMode" . -}}127.0.0.1{{- else -}}0.0.0.0{{- end -}}
{{- end -}}

{{- define "llm-placement.extenderImage" -}}
{{- printf "%s:%s" .Values.extender.image.repository (default .Chart.AppVersion .Values.extender.image.tag) -}}
{{- end -}}

{{- define "llm-placement.leaseName" -}}
{{- default .Values.scheduler.name .Values.scheduler.leaderElection.resourceName -}}
{{- end -}}

{{/* The scheduler config file of the chart, parsed once; fail loudly if it is not what we expect. */}}
{{- define "llm-placement.baseSchedulerConfig" -}}
{{- $cfg := .Files.Get "files/scheduler-config.yaml" | fromYaml -}}
{{- if hasKey $cfg "Error" -}}
{{- fail (printf "files/scheduler-config.yaml is not valid YAML: %s" $cfg.Error) -}}
{{- end -}}
{{- if ne (len $cfg.extenders) 1 -}}
{{- fail "files/scheduler-config.yaml must define exactly one extender" -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The URL path the extender serves the verbs under, taken from the config file's urlPrefix. */}}
{{- define "llm-placement.urlPath" -}}
{{- $cfg := include "llm-placement.baseSchedulerConfig" . | fromYaml -}}
{{- $url := urlParse (index $cfg.extenders 0).urlPrefix -}}
{{- $url.path | default "/" -}}
{{- end -}}

{{/*
The extenders[0] entry with the values' overrides. Argument: dict "ctx" $ "url" <urlPrefix>.
*/}}
{{- define "llm-placement.extenderEntry" -}}
{{- $cfg := include "llm-placement.baseSchedulerConfig" .ctx | fromYaml -}}
{{- $ext := index $cfg.extenders 0 -}}
{{- $_ := set $ext "urlPrefix" .url -}}
{{- $_ := set $ext "weight" (int .ctx.Values.scheduler.extender.weight) -}}
{{- toYaml $ext -}}
{{- end -}}

{{/* The KubeSchedulerConfiguration the chart's kube-scheduler runs with. */}}
{{- define "llm-placement.schedulerConfig" -}}
{{- $cfg := include "llm-placement.baseSchedulerConfig" . | fromYaml -}}
{{- $url := printf "http://127.0.0.1:%d%s" (int .Values.extender.port) (include "llm-placement.urlPath" .) -}}
{{- $ext := include "llm-placement.extenderEntry" (dict "ctx" . "url" $url) | fromYaml -}}
{{- $_ := set $cfg "extenders" (list $ext) -}}
{{- $profile := index $cfg.profiles 0 -}}
{{- $_ := set $profile "schedulerName" .Values.scheduler.name -}}
{{- $_ := set $cfg "profiles" (list $profile) -}}
{{- $le := $cfg.leaderElection | default dict -}}
{{- $_ := set $le "leaderElect" .Values.scheduler.leaderElection.enabled -}}
{{- $_ := set $le "resourceName" (include "llm-placement.leaseName" .) -}}
{{- $_ := set $le "resourceNamespace" .Release.Namespace -}}
{{- $_ := set $cfg "leaderElection" $le -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* URL the cluster's default scheduler uses to reach the extender Service. */}}
{{- define "llm-placement.serviceURL" -}}
{{- $host := .Values.defaultScheduler.service.clusterIP | default (printf "%s.%s.svc" (include "llm-placement.fullname" .) .Release.Namespace) -}}
{{- printf "http://%s:%d%s" $host (int .Values.extender.port) (include "llm-placement.urlPath" .) -}}
{{- end -}}

{{/* The extenders stanza for the default-scheduler mode, with managedResources. */}}
{{- define "llm-placement.defaultSchedulerExtender" -}}
{{- $ext := include "llm-placement.extenderEntry" (dict "ctx" . "url" (include "llm-placement.serviceURL" .)) | fromYaml -}}
{{- $_ := set $ext "managedResources" .Values.defaultScheduler.managedResources -}}
{{- toYaml $ext -}}
{{- end -}}

{{/* The extender's settings file (app/config.py keys). */}}
{{- define "llm-placement.extenderSettings" -}}
{{- $managed := dict
  "host" (include "llm-placement.extenderHost" .)
  "port" (int .Values.extender.port)
  "metrics_host" "0.0.0.0"
  "metrics_port" (int .Values.extender.metricsPort)
  "url_prefix" (include "llm-placement.urlPath" .)
  "scheduler_name" (ternary .Values.scheduler.name "default-scheduler" (eq .Values.mode "scheduler"))
  "log_level" .Values.extender.logLevel
-}}
{{- if .Values.extender.profiles }}
{{- if .Values.extender.settings.profiles_file }}
{{- fail "set extender.profiles or extender.settings.profiles_file, not both: the chart points profiles_file at the ConfigMap it renders from extender.profiles" }}
{{- end }}
{{- $_ := set $managed "profiles_file" (include "llm-placement.profilesPath" .) }}
{{- end }}
{{- toYaml (merge $managed (deepCopy .Values.extender.settings)) -}}
{{- end -}}

{{/* Where the extender reads the profiles ConfigMap: its own directory, not nested in the config
volume (a mount point inside a read-only configMap volume cannot be created). */}}
{{- define "llm-placement.profilesDir" -}}
/etc/llm-placement-profiles
{{- end -}}

{{- define "llm-placement.profilesPath" -}}
{{ include "llm-placement.profilesDir" . }}/profiles.yaml
{{- end -}}

{{/* The profiles file the ConfigMap holds: the same format as a profiles_file (app/core/profiles.py). */}}
{{- define "llm-placement.profilesFile" -}}
{{- toYaml (dict "profiles" .Values.extender.profiles) -}}
{{- end -}}

{{/* Probe handler for the extender: exec to loopback in scheduler mode, httpGet otherwise. */}}
{{- define "llm-placement.extenderProbe" -}}
{{- if include "llm-placement.schedulerMode" .ctx -}}
exec:
  command:
    - python
    - -c
    - {{ printf "import urllib.request; urllib.request.urlopen('http://127.0.0.1:%d%s', timeout=%d)" (int .ctx.Values.extender.port) .path (int .probe.timeoutSeconds) | quote }}
{{- else -}}
httpGet:
  path: {{ .path }}
  port: http
{{- end }}
periodSeconds: {{ .probe.periodSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
{{- end -}}
