{{/*
Labels of every object: the kustomize tree's part-of label plus Helm's usual ones. Pod selectors
use app.kubernetes.io/name only (as the kustomize tree does), so these never reach a selector.
*/}}
{{- define "jobset-inplace.labels" -}}
app.kubernetes.io/part-of: jobset-inplace
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The namespace of every namespaced object, and of every reference to one (the webhook
configurations' service, the policies' and FlowSchemas' service accounts, the certificate's
names): namespaceOverride, or the release's.
*/}}
{{- define "jobset-inplace.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end }}

{{/*
An image reference from {registry, repository, tag, digest}: registry/repository:tag@digest, the
tag defaulting to the chart's appVersion, the digest (sha256:...) pinning it when set.
*/}}
{{- define "jobset-inplace.imageRef" -}}
{{- $img := .image -}}
{{- $ref := $img.repository -}}
{{- if $img.registry }}{{ $ref = printf "%s/%s" $img.registry $img.repository }}{{ end -}}
{{- $ref = printf "%s:%s" $ref (default .appVersion $img.tag) -}}
{{- if $img.digest }}{{ $ref = printf "%s@%s" $ref $img.digest }}{{ end -}}
{{- $ref -}}
{{- end }}

{{- define "jobset-inplace.image" -}}
{{- include "jobset-inplace.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end }}

{{/* The injected agent's image: each field of agent.image, or where empty the same field of image. */}}
{{- define "jobset-inplace.agentImage" -}}
{{- $a := .Values.agent.image -}}
{{- $i := .Values.image -}}
{{- $agent := dict "registry" (default $i.registry $a.registry) "repository" (default $i.repository $a.repository) "tag" (default $i.tag $a.tag) "digest" (default $i.digest $a.digest) -}}
{{- include "jobset-inplace.imageRef" (dict "image" $agent "appVersion" .Chart.AppVersion) -}}
{{- end }}

{{/* The dialect's name as the binary spells it (`protocol`). */}}
{{- define "jobset-inplace.protocol" -}}
{{- if eq .Values.dialect "jobset-native" }}attempt{{ else }}epoch{{ end -}}
{{- end }}

{{/* The pod annotation the dialect's agents write (agent-policy.yaml). */}}
{{- define "jobset-inplace.epochAnnotation" -}}
{{- if eq .Values.dialect "jobset-native" }}jobset.sigs.k8s.io/in-place-restart-attempt{{ else }}jobset.sigs.k8s.io/epoch{{ end -}}
{{- end }}

{{/* Scheduling fields of a component's pod (webhook or reconciler), with its default affinity. */}}
{{- define "jobset-inplace.scheduling" -}}
{{- $c := .component -}}
{{- if $c.nodeSelector }}
nodeSelector:
  {{- toYaml $c.nodeSelector | nindent 2 }}
{{- end }}
{{- if $c.tolerations }}
tolerations:
  {{- toYaml $c.tolerations | nindent 2 }}
{{- end }}
{{- if $c.priorityClassName }}
priorityClassName: {{ $c.priorityClassName }}
{{- end }}
{{- with $c.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $c.affinity }}
affinity:
  {{- toYaml $c.affinity | nindent 2 }}
{{- else }}
# The replicas prefer different nodes, so a node going away leaves one (affinity: replaces this).
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            app.kubernetes.io/name: {{ .name }}
{{- end }}
{{- end }}

{{/* The webhooks' namespaceSelector (values: webhook.namespaceSelection, excludedNamespaces). */}}
{{- define "jobset-inplace.namespaceSelector" -}}
matchExpressions:
{{- if eq .Values.webhook.namespaceSelection "optIn" }}
- key: jobset-inplace.dev/enabled
  operator: In
  values: ["true"]
{{- end }}
- key: kubernetes.io/metadata.name
  operator: NotIn
  values: {{ concat .Values.webhook.excludedNamespaces (list (include "jobset-inplace.namespace" .)) | uniq | toJson }}
{{- end }}

{{/*
The pod's securityContext: the restricted profile's, with the component's podSecurityContext
merged over it (values: webhook/reconciler.podSecurityContext).
*/}}
{{- define "jobset-inplace.podSecurityContext" -}}
{{- $defaults := dict "runAsNonRoot" true "runAsUser" 65532 "runAsGroup" 65532 "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- toYaml (mergeOverwrite $defaults (deepCopy (default (dict) .))) -}}
{{- end }}

{{/*
The container's securityContext: the restricted profile's, with the component's securityContext
merged over it (values: webhook/reconciler.securityContext).
*/}}
{{- define "jobset-inplace.containerSecurityContext" -}}
{{- $defaults := dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "runAsNonRoot" true "runAsUser" 65532 "runAsGroup" 65532 "capabilities" (dict "drop" (list "ALL")) "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- toYaml (mergeOverwrite $defaults (deepCopy (default (dict) .))) -}}
{{- end }}

{{/*
Values this chart cannot honour, refused with the reason (rather than the schema's "additional
property"): the objects' names are fixed by the product (one install per cluster; the policies,
the webhook configurations and the injected agent name them).
*/}}
{{- define "jobset-inplace.refusals" -}}
{{- if .Values.fullnameOverride }}
{{- fail "fullnameOverride: jobset-inplace's object names are fixed (one install per cluster; its policies, webhook configurations and the injected agent's account name them); leave it empty" }}
{{- end }}
{{- if .Values.nameOverride }}
{{- fail "nameOverride: jobset-inplace's object names are fixed (one install per cluster; its policies, webhook configurations and the injected agent's account name them); leave it empty" }}
{{- end }}
{{- end }}
