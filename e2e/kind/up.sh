#!/usr/bin/env bash
# Creates a kind cluster and installs what the API-and-metrics scenarios need:
#   the Gateway API v1.6.1 and Argo CD v3.5.1 CRDs (from .tools/crds, fetched by scripts/install-tools.sh), a Prometheus that
#   scrapes the sluice operators (manifests/prometheus.yaml), the sluice image (built here with
#   docker from the repository's Dockerfile and loaded into kind) and the chart.
#
#   bash e2e/kind/up.sh            # SLUICE_KIND_CLUSTER, SLUICE_IMAGE, SLUICE_UPSTREAM to override
#
# Needs docker, kind, kubectl, helm. Never touches any other cluster: every kubectl call names
# the kind context.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need docker kind kubectl helm
if [ ! -d "$UPSTREAM/gateway-api-v1.6.1" ] || [ ! -d "$UPSTREAM/argo-cd-v3.5.1" ]; then
  echo "kind e2e: upstream CRDs not found under $UPSTREAM: run bash scripts/install-tools.sh (or set SLUICE_UPSTREAM)" >&2; exit 2
fi

say "kind cluster $CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --wait 120s
fi

say "Gateway API and Argo CD CRDs"
k apply --server-side -f "$UPSTREAM/gateway-api-v1.6.1/"
k apply --server-side -f "$UPSTREAM/argo-cd-v3.5.1/"
k wait --for condition=Established --timeout 60s \
  crd/httproutes.gateway.networking.k8s.io crd/applications.argoproj.io crd/applicationsets.argoproj.io
k create namespace argocd --dry-run=client -o yaml | k apply -f -

say "image $IMAGE"
docker build -t "$IMAGE" "$REPO"
kind load docker-image "$IMAGE" --name "$CLUSTER"

say "chart"
helm --kube-context "$CONTEXT" upgrade --install "$RELEASE" "$REPO/charts/sluice" \
  --namespace "$NS" --create-namespace --wait --timeout 180s \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never

say "Prometheus"
k apply -f "$E2E_DIR/manifests/prometheus.yaml"
k -n sluice-e2e-monitoring rollout status deploy/prometheus --timeout 120s

echo
echo "ready: kubectl --context $CONTEXT; run the scenarios with: bash e2e/kind/run.sh"
