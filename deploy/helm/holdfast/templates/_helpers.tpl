{{/* The label kustomize adds to every object (deploy/kubernetes/kustomization.yaml). */}}
{{- define "holdfast.partOf" -}}
app.kubernetes.io/part-of: holdfast
{{- end }}

{{/* The control plane's in-cluster host name, which its serving certificate carries. */}}
{{- define "holdfast.controlPlaneHost" -}}
holdfast-control-plane.{{ .Release.Namespace }}.svc
{{- end }}
