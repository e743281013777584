#!/usr/bin/env bash
# Static checks of everything under deploy/ plus the Dockerfile and compose file, with
# the real tools (CI installs them; see .ci/run). Exits non-zero on the first failure.
# The end-to-end check against a running Prometheus is tests/process/observability.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== hadolint Dockerfile"
hadolint Dockerfile
echo "== shellcheck"
shellcheck scripts/*.sh .ci/run
echo "== yamllint"
yamllint -s docker-compose.yml deploy .yamllint.yaml
echo "== docker-compose config (GPU default and CPU profile)"
docker-compose -f docker-compose.yml config -q
services="$(docker-compose -f docker-compose.yml --profile cpu config --services | sort | tr '\n' ' ')"
[ "$services" = "gpu-ops gpu-ops-cpu grafana keys objects postgres prometheus replica-a replica-b " ] || { echo "unexpected services: $services" >&2; exit 1; }
scaled="$(docker-compose -f docker-compose.yml --profile scale config)"
for want in "GPU_OPS_DATABASE_URL: postgres://gpu_ops:gpu_ops@postgres:5432/gpu_ops" \
            "GPU_OPS_ARTIFACT_STORE: s3://gpu-ops/datasets" "AWS_ENDPOINT_URL: http://objects:8333" \
            "8081" "8082" "condition: service_healthy"; do
  grep -q -- "$want" <<<"$scaled" || { echo "the scale profile lacks: $want" >&2; exit 1; }
done
# Protected by default: every gpu-ops service reads the key file the `keys` service makes.
everything="$(docker-compose -f docker-compose.yml --profile cpu --profile scale config)"
keyed="$(grep -c 'GPU_OPS_API_KEYS_FILE: /keys/api-keys' <<<"$everything" || true)"
[ "$keyed" = 4 ] || { echo "$keyed of 4 gpu-ops services read the API key file" >&2; exit 1; }
limited="$(grep -c "GPU_OPS_TENANT_REQUESTS_PER_SECOND: '50'" <<<"$everything" || true)"
[ "$limited" = 4 ] || { echo "$limited of 4 gpu-ops services limit each tenant's requests" >&2; exit 1; }
! grep -q 'GPU_OPS_ALLOW_UNAUTHENTICATED' <<<"$everything" \
  || { echo "the compose file must not serve unauthenticated" >&2; exit 1; }
echo "== kustomize render (base and GPU overlay)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
kubectl kustomize deploy/kubernetes/base > "$tmp/base.yaml"
kubectl kustomize deploy/kubernetes/overlays/gpu > "$tmp/gpu.yaml"
for kind in ConfigMap Deployment Service PodDisruptionBudget ServiceMonitor ScaledObject; do
  grep -q "^kind: $kind$" "$tmp/base.yaml" || { echo "base lacks a $kind" >&2; exit 1; }
done
grep -q 'nvidia.com/gpu: 1' "$tmp/gpu.yaml" || { echo "GPU overlay requests no GPU" >&2; exit 1; }
! grep -q 'nvidia.com/gpu' "$tmp/base.yaml" || { echo "base must not require a GPU" >&2; exit 1; }
grep -A5 'name: GPU_OPS_DATABASE_URL' "$tmp/base.yaml" | grep -q 'optional: true' \
  || { echo "base must take --database-url from an optional Secret" >&2; exit 1; }
grep -A2 'name: gpu-ops-object-store' "$tmp/base.yaml" | grep -q 'optional: true' \
  || { echo "base must take the object store's settings from an optional Secret" >&2; exit 1; }
grep -A1 'name: GPU_OPS_API_KEYS_FILE' "$tmp/base.yaml" | grep -q 'value: /keys/api-keys' \
  || { echo "base must serve with an API key file" >&2; exit 1; }
for limit in GPU_OPS_TENANT_REQUESTS_PER_SECOND GPU_OPS_TENANT_BURST GPU_OPS_TENANT_MAX_CONCURRENT_REQUESTS; do
  grep -q "name: $limit" "$tmp/base.yaml" || { echo "base must set $limit" >&2; exit 1; }
done
if ! grep -q 'secretName: gpu-ops-api-keys' "$tmp/base.yaml" \
   || grep -A2 'secretName: gpu-ops-api-keys' "$tmp/base.yaml" | grep -q 'optional: true'; then
  echo "base must mount the API keys Secret, not optionally" >&2
  exit 1
fi
yamllint -s -d '{extends: relaxed, rules: {line-length: disable}}' "$tmp/base.yaml" "$tmp/gpu.yaml"
echo "== promtool"
promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/rules/*.yml
promtool test rules deploy/prometheus/tests/*.yml
echo "== Grafana dashboard JSON"
python3 -m json.tool deploy/grafana/dashboards/gpu-ops.json > /dev/null
echo "deploy checks passed"
