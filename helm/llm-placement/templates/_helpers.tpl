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
{{- $url := printf "%s://127.0.0.1:%d%s" (include "llm-placement.verbsScheme" .) (int .Values.extender.port) (include "llm-placement.urlPath" .) -}}
{{- $ext := include "llm-placement.extenderEntry" (dict "ctx" . "url" $url) | fromYaml -}}
{{- if .Values.extender.tls.enabled -}}
{{- $_ := set $ext "enableHTTPS" true -}}
{{- $_ := set $ext "tlsConfig" (include "llm-placement.schedulerTLSConfig" (dict "dir" (include "llm-placement.schedulerTLSDir" .) "serverName" "")  | fromYaml) -}}
{{- end -}}
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
{{- $host := .Values.defaultScheduler.service.clusterIP | default (include "llm-placement.serviceDNS" .) -}}
{{- printf "%s://%s:%d%s" (include "llm-placement.verbsScheme" .) $host (int .Values.extender.port) (include "llm-placement.urlPath" .) -}}
{{- end -}}

{{- define "llm-placement.serviceDNS" -}}
{{- printf "%s.%s.svc" (include "llm-placement.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The extenders stanza for the default-scheduler mode, with managedResources. */}}
{{- define "llm-placement.defaultSchedulerExtender" -}}
{{- $ext := include "llm-placement.extenderEntry" (dict "ctx" . "url" (include "llm-placement.serviceURL" .)) | fromYaml -}}
{{- $_ := set $ext "managedResources" .Values.defaultScheduler.managedResources -}}
{{- if .Values.extender.tls.enabled -}}
{{- $_ := set $ext "enableHTTPS" true -}}
{{- /* The Service's DNS name is in the serving certificate whether the URL names it or a ClusterIP. */ -}}
{{- $_ := set $ext "tlsConfig" (include "llm-placement.schedulerTLSConfig" (dict "dir" .Values.defaultScheduler.tls.clientCertDir "serverName" (include "llm-placement.serviceDNS" .)) | fromYaml) -}}
{{- end -}}
{{- toYaml $ext -}}
{{- end -}}

{{/* TLS of the verbs (docs/security.md). */}}
{{- define "llm-placement.verbsScheme" -}}
{{- if .Values.extender.tls.enabled -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* Where the chart's own kube-scheduler container mounts the client Secret. */}}
{{- define "llm-placement.schedulerTLSDir" -}}
/etc/kubernetes/llm-placement-tls
{{- end -}}

{{/* Where the extender container mounts the serving Secret. */}}
{{- define "llm-placement.extenderTLSDir" -}}
/etc/llm-placement-tls
{{- end -}}

{{/* kube-scheduler's tlsConfig for the extender (KubeSchedulerConfiguration v1 ExtenderTLSConfig).
Argument: dict "dir" <directory of tls.crt, tls.key, ca.crt> "serverName" <name or "">. */}}
{{- define "llm-placement.schedulerTLSConfig" -}}
certFile: {{ printf "%s/tls.crt" .dir }}
keyFile: {{ printf "%s/tls.key" .dir }}
caFile: {{ printf "%s/ca.crt" .dir }}
{{- if .serverName }}
serverName: {{ .serverName }}
{{- end }}
{{- end -}}

{{/* The two Secrets' data for source helm: those in the cluster when both exist (upgrades keep
them; delete both to rotate), else a new CA, serving and client certificate. */}}
{{- define "llm-placement.verbsTLSData" -}}
{{- $fullname := include "llm-placement.fullname" . -}}
{{- $serving := lookup "v1" "Secret" .Release.Namespace (printf "%s-verbs-serving" $fullname) -}}
{{- $client := lookup "v1" "Secret" .Release.Namespace (printf "%s-verbs-client" $fullname) -}}
{{- if and $serving $client (($serving).data) (($client).data) -}}
serving: {{- toYaml $serving.data | nindent 2 }}
client: {{- toYaml $client.data | nindent 2 }}
{{- else -}}
{{- $days := int .Values.extender.tls.validityDays -}}
{{- $ca := genCA (printf "%s-verbs-ca" $fullname) $days -}}
{{- $svc := include "llm-placement.serviceDNS" . -}}
{{- $ips := list "127.0.0.1" -}}
{{- with .Values.defaultScheduler.service.clusterIP }}{{ $ips = append $ips . }}{{ end -}}
{{- $dns := list "localhost" $fullname (printf "%s.%s" $fullname .Release.Namespace) $svc (printf "%s.cluster.local" $svc) -}}
{{- $s := genSignedCert $fullname $ips $dns $days $ca -}}
{{- $c := genSignedCert "kube-scheduler" nil nil $days $ca -}}
serving:
  tls.crt: {{ $s.Cert | b64enc }}
  tls.key: {{ $s.Key | b64enc }}
  ca.crt: {{ $ca.Cert | b64enc }}
client:
  tls.crt: {{ $c.Cert | b64enc }}
  tls.key: {{ $c.Key | b64enc }}
  ca.crt: {{ $ca.Cert | b64enc }}
{{- end -}}
{{- end -}}

{{/* The extender's settings file (app/config/settings.py keys). */}}
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
{{- if .Values.extender.tls.enabled }}
{{- $dir := include "llm-placement.extenderTLSDir" . }}
{{- $_ := set $managed "tls_cert_file" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $managed "tls_key_file" (printf "%s/tls.key" $dir) }}
{{- $_ := set $managed "tls_client_ca_file" (printf "%s/ca.crt" $dir) }}
{{- end }}
{{- if .Values.extender.profiles }}
{{- if .Values.extender.settings.profiles_file }}
{{- fail "set extender.profiles or extender.settings.profiles_file, not both: the chart points profiles_file at the ConfigMap it renders from extender.profiles" }}
{{- end }}
{{- $_ := set $managed "profiles_file" (include "llm-placement.profilesPath" .) }}
{{- end }}
{{- /* The file's version (app/config/settings.py API_VERSION and KIND; docs/configuration.md). */ -}}
apiVersion: config.llm-placement.io/v1
kind: ExtenderConfiguration
{{ toYaml (merge $managed (deepCopy .Values.extender.settings)) -}}
{{- end -}}

{{/* Where the extender reads the profiles ConfigMap: its own directory, not nested in the config
volume (a mount point inside a read-only configMap volume cannot be created). */}}
{{- define "llm-placement.profilesDir" -}}
/etc/llm-placement-profiles
{{- end -}}

{{- define "llm-placement.profilesPath" -}}
{{ include "llm-placement.profilesDir" . }}/profiles.yaml
{{- end -}}

{{/* The profiles file the ConfigMap holds: the same format as a profiles_file (app/serving/profiles.py). */}}
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
    {{- if .ctx.Values.extender.tls.enabled }}
    # The probe checks the extender answers, not who it is: the certificate is not verified here.
    - {{ printf "import ssl, urllib.request; urllib.request.urlopen('https://127.0.0.1:%d%s', timeout=%d, context=ssl._create_unverified_context())" (int .ctx.Values.extender.port) .path (int .probe.timeoutSeconds) | quote }}
    {{- else }}
    - {{ printf "import urllib.request; urllib.request.urlopen('http://127.0.0.1:%d%s', timeout=%d)" (int .ctx.Values.extender.port) .path (int .probe.timeoutSeconds) | quote }}
    {{- end }}
{{- else -}}
httpGet:
  path: {{ .path }}
  port: http
  {{- if .ctx.Values.extender.tls.enabled }}
  scheme: HTTPS
  {{- end }}
{{- end }}
periodSeconds: {{ .probe.periodSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
{{- end -}}

{{/* Flags of `llm-placement explain` run inside the extender container (NOTES). */}}
{{- define "llm-placement.explainFlags" -}}
{{- if .Values.extender.tls.enabled -}}
{{ printf " --url https://127.0.0.1:%d --ca-file %s/ca.crt" (int .Values.extender.port) (include "llm-placement.extenderTLSDir" .) }}
{{- else if ne (int .Values.extender.port) 8888 -}}
{{ printf " --url http://127.0.0.1:%d" (int .Values.extender.port) }}
{{- end -}}
{{- end -}}
