{{/* Names. */}}
{{- define "kvsteer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvsteer.fullname" -}}
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

{{- define "kvsteer.indexer.name" -}}{{ include "kvsteer.fullname" . | trunc 55 | trimSuffix "-" }}-indexer{{- end -}}
{{- define "kvsteer.envoy.name" -}}{{ include "kvsteer.fullname" . | trunc 57 | trimSuffix "-" }}-envoy{{- end -}}
{{- define "kvsteer.workers.name" -}}{{ include "kvsteer.fullname" . | trunc 55 | trimSuffix "-" }}-workers{{- end -}}
{{- define "kvsteer.wasm.configMapName" -}}{{ default (printf "%s-filter-wasm" (include "kvsteer.fullname" . | trunc 50 | trimSuffix "-")) .Values.wasm.configMap.name }}{{- end -}}

{{/* Namespaces. */}}
{{- define "kvsteer.workersNamespace" -}}{{ default .Release.Namespace .Values.discovery.namespace }}{{- end -}}
{{- define "kvsteer.istio.clientNamespace" -}}{{ default .Release.Namespace .Values.istio.clientNamespace }}{{- end -}}
{{- define "kvsteer.eg.gatewayNamespace" -}}{{ default .Release.Namespace .Values.envoyGateway.gateway.namespace }}{{- end -}}

{{/* Labels. */}}
{{- define "kvsteer.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "kvsteer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvsteer
{{- end -}}

{{- define "kvsteer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvsteer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The workers' Service selects the vLLM pods of every pool: the labels all
pools share (a single pool: its matchLabels). */}}
{{- define "kvsteer.workers.selector" -}}
{{- $common := dict -}}
{{- $first := (index .Values.models 0).pool.matchLabels -}}
{{- range $k, $v := $first -}}
{{- $shared := true -}}
{{- range $.Values.models -}}
{{- if ne (toString (get .pool.matchLabels $k)) (toString $v) -}}{{- $shared = false -}}{{- end -}}
{{- end -}}
{{- if $shared -}}{{- $_ := set $common $k $v -}}{{- end -}}
{{- end -}}
{{- if not $common -}}{{- fail "models[].pool.matchLabels share no label: the workers' Service needs one selector for all pools" -}}{{- end -}}
{{- toYaml $common -}}
{{- end -}}

{{/* A label selector string from a matchLabels map, keys sorted. */}}
{{- define "kvsteer.selectorString" -}}
{{- $parts := list -}}
{{- range $k := keys . | sortAlpha -}}{{- $parts = append $parts (printf "%s=%s" $k (toString (get $ $k))) -}}{{- end -}}
{{- join "," $parts -}}
{{- end -}}

{{/* The filter's PluginConfig JSON, for a given indexer cluster name. */}}
{{- define "kvsteer.filter.json" -}}
{{- $f := .root.Values.filter -}}
{{- $json := dict "indexer_cluster" .cluster "timeout_ms" $f.timeoutMs "paths" $f.paths "tenant_header" $f.tenantHeader "trust_tenant_header" $f.trustTenantHeader "max_body_bytes" $f.maxBodyBytes "destination_header" "x-gateway-destination-endpoint" "report" $f.report "pick_stream_max_age_ms" $f.pickStreamMaxAgeMs "pick_streams" $f.pickStreams -}}
{{- with .authority }}{{ $_ := set $json "indexer_authority" . }}{{ end -}}
{{- $json | toJson -}}
{{- end -}}

{{/* The override_host policy (header set by the filter, round-robin fallback), as YAML. */}}
{{- define "kvsteer.overrideHost" -}}
policies:
  - typed_extension_config:
      name: envoy.load_balancing_policies.override_host
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
        # Set by the kvsteer filter: "ip:port[,ip:port...]", best first.
        override_host_sources:
          - header: x-gateway-destination-endpoint
        fallback_policy:
          policies:
            - typed_extension_config:
                name: envoy.load_balancing_policies.round_robin
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin
{{- end -}}

{{/* The indexer cluster's policy: a report to the replica named by the filter, picks round robin. */}}
{{- define "kvsteer.indexerReplicaLb" -}}
policies:
  - typed_extension_config:
      name: envoy.load_balancing_policies.override_host
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
        # Set by the kvsteer filter on reports: the picking replica's ip:port.
        override_host_sources:
          - header: x-kvsteer-replica
        fallback_policy:
          policies:
            - typed_extension_config:
                name: envoy.load_balancing_policies.round_robin
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin
{{- end -}}

{{/* Health check and outlier detection of the worker cluster, as YAML. */}}
{{- define "kvsteer.upstreamHealth" -}}
{{- $u := .Values.upstream -}}
health_checks:
  - timeout: {{ $u.healthCheck.timeoutSeconds }}s
    interval: {{ $u.healthCheck.intervalSeconds }}s
    unhealthy_threshold: {{ $u.healthCheck.unhealthyThreshold }}
    healthy_threshold: {{ $u.healthCheck.healthyThreshold }}
    http_health_check:
      path: {{ $u.healthCheck.path }}
outlier_detection:
  consecutive_5xx: {{ $u.outlierDetection.consecutive5xx }}
  consecutive_gateway_failure: {{ $u.outlierDetection.consecutiveGatewayFailure }}
  enforcing_consecutive_gateway_failure: 100
  interval: {{ $u.outlierDetection.intervalSeconds }}s
  base_ejection_time: {{ $u.outlierDetection.baseEjectionTimeSeconds }}s
  max_ejection_percent: {{ $u.outlierDetection.maxEjectionPercent }}
{{- end -}}

{{/* Checks that hold whatever the gateway kind. */}}
{{- define "kvsteer.validate" -}}
{{- if not .Values.models -}}{{- fail "models: at least one model" -}}{{- end -}}
{{- if and (not .Values.discovery.enabled) (not .Values.workers) -}}{{- fail "discovery.enabled is false and workers is empty: the indexer would have no worker" -}}{{- end -}}
{{- if and (eq .Values.index.backend "memory") (gt (int .Values.indexer.replicas) 1) -}}{{- fail "indexer.replicas > 1 needs index.backend: redis (the memory index lives in one process)" -}}{{- end -}}
{{- if and (eq .Values.index.backend "redis") (not .Values.index.redis.url) (not .Values.index.redis.existingSecret.name) -}}{{- fail "index.backend: redis needs index.redis.url or index.redis.existingSecret.name" -}}{{- end -}}
{{- if and (eq .Values.gateway "envoyGateway") (ne .Values.wasm.source "image") -}}{{- fail "gateway: envoyGateway needs wasm.source: image (Envoy Gateway loads Wasm from an OCI image or an HTTP URL, not from a ConfigMap)" -}}{{- end -}}
{{- if and (eq .Values.gateway "istio") (ne .Values.wasm.source "configMap") -}}{{- fail "gateway: istio needs wasm.source: configMap (the EnvoyFilter loads a local file; a WasmPlugin, which pulls images, cannot set allow_on_headers_stop_iteration: see deploy/README.md)" -}}{{- end -}}
{{- if and (eq .Values.wasm.source "image") (not .Values.wasm.image.reference) -}}{{- fail "wasm.source: image needs wasm.image.reference" -}}{{- end -}}
{{- if and (eq .Values.wasm.source "configMap") (ne .Values.gateway "none") (ne .Values.gateway "envoyGateway") (not .Values.wasm.configMap.base64) (not .Values.wasm.configMap.name) -}}{{- fail "wasm.source: configMap needs the filter: --set-file wasm.configMap.base64=kvsteer_filter.wasm.b64, or wasm.configMap.name of an existing ConfigMap" -}}{{- end -}}
{{- if lt (int .Values.upstream.bufferLimitBytes) (int .Values.filter.maxBodyBytes) -}}{{- fail "upstream.bufferLimitBytes must be at least filter.maxBodyBytes, or Envoy answers 413 before the filter has the body" -}}{{- end -}}
{{- end -}}
