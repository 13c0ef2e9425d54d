# The scenario functions of run.sh (sourced by it, one scenario per subshell under its budget).
# Needs lib.sh sourced first and SLUICE_PLUGIN set to the kubectl-sluice binary.
PLUGIN="${SLUICE_PLUGIN:?set SLUICE_PLUGIN to the kubectl-sluice binary}"
# The chart's object names: <release> if it contains "sluice", else <release>-sluice.
case "$RELEASE" in *sluice*) FULL="$RELEASE" ;; *) FULL="$RELEASE-sluice" ;; esac
SHOP=sluice-e2e-shop
OPERATORS=(rollout-weights wave-gate revert upgrade-revisions)

prom_query() { # prom_query PROMQL -> JSON of the instant query, through the API server proxy
  local q
  q="$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$1")"
  k get --raw "/api/v1/namespaces/sluice-e2e-monitoring/services/prometheus:http/proxy/api/v1/query?query=$q"
}

one_leader_scraped() { # one_leader_scraped OPERATOR
  local n
  n="$(prom_query "count(sluice_leader{job=\"$1\"} == 1)" | python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')"
  [ "$n" = "1" ]
}

lease_held() { [ -n "$(k -n "$NS" get lease "$FULL-$1" -o jsonpath='{.spec.holderIdentity}')" ]; }

scenario_operators_ready() {
  local op
  for op in "${OPERATORS[@]}"; do
    k -n "$NS" rollout status "deploy/$FULL-$op" --timeout 60s
    wait_for 30 "a holder of Lease $NS/$FULL-$op" lease_held "$op"
    wait_for 60 "Prometheus scraping sluice_leader == 1 from one $op pod" one_leader_scraped "$op"
  done
}

can_i() { # can_i SUBJECT SCOPE GROUP RESOURCE VERB NAME -> kubectl auth can-i's answer
  local subject="$1" scope="$2" group="$3" res="$4" verb="$5" name="$6" args=()
  local resource="${res%%/*}" sub=""
  [ "$res" = "$resource" ] || sub="${res#*/}"
  [ "$group" = "core" ] || resource="$resource.$group"
  args=("$verb" "$resource")
  [ "$name" = "*" ] || args=("$verb" "$resource/$name")
  [ -z "$sub" ] || args+=(--subresource "$sub")
  case "$scope" in cluster) args+=(--all-namespaces) ;; ns/*) args+=(-n "${scope#ns/}") ;; esac
  k auth can-i "${args[@]}" --as "system:serviceaccount:${subject%%/*}:${subject#*/}" 2>/dev/null || true
}

scenario_rbac_table() {
  local subject scope group res verb name answer bad=0 checked=0
  while read -r subject scope group res verb name; do
    subject="${subject//t-sluice-/$FULL-}"; subject="${subject/#sluice-system\//$NS/}"
    scope="${scope/#ns\/sluice-system/ns/$NS}"; name="${name//t-sluice-/$FULL-}"
    answer="$(can_i "$subject" "$scope" "$group" "$res" "$verb" "$name")"
    checked=$((checked + 1))
    [ "$answer" = "yes" ] || { echo "not granted: $subject $scope $group $res $verb $name"; bad=1; }
  done < <(grep -v '^#' "$REPO/charts/sluice/ci/rbac-table.txt")
  # Grants nobody may have: writing Deployments, reading every Secret, writing another's kind.
  local op
  for op in "${OPERATORS[@]}"; do
    for probe in "cluster apps deployments create *" "ns/argocd core secrets list *" "ns/argocd core secrets get argocd-secret"; do
      read -r scope group res verb name <<<"$probe"
      answer="$(can_i "$NS/$FULL-$op" "$scope" "$group" "$res" "$verb" "$name")"
      [ "$answer" = "no" ] || { echo "$op may $verb $res ($scope): it must not"; bad=1; }
    done
  done
  [ "$(can_i "$NS/$FULL-wave-gate" cluster gateway.networking.k8s.io httproutes patch '*')" = "no" ] \
    || { echo "wave-gate may patch httproutes"; bad=1; }
  echo "checked $checked grants"
  return "$bad"
}

route() { # route NAME WEIGHT: an HTTPRoute owned by a Rollout
  cat <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: $1
  namespace: $SHOP
  annotations:
    sluice.dev/owned-by-rollout: $1
spec:
  parentRefs: [{name: mesh-gateway}]
  rules:
    - backendRefs:
        - {name: $1-v1, port: 80, weight: $((100 - $2))}
        - {name: $1-v2, port: 80, weight: $2}
YAML
}

scenario_owned_route_policy() {
  k create namespace "$SHOP" --dry-run=client -o yaml | k apply -f - >/dev/null
  route owned 10 | k apply -f - >/dev/null
  local out
  if out="$(route owned 50 | k apply -f - 2>&1)"; then
    echo "a change to an owned route's rules by the cluster admin was allowed: $out"; return 1
  fi
  grep -q "belong to Rollout owned" <<<"$out" || { echo "denied, but not by the policy: $out"; return 1; }
  route owned 10 | k apply -f - >/dev/null || { echo "a no-op apply of the owned route was denied"; return 1; }
  route owned 50 | k apply -f - --as "system:serviceaccount:$NS:$FULL-rollout-weights" >/dev/null \
    || { echo "rollout-weights may not change the rules of an owned route"; return 1; }
  k -n "$SHOP" delete httproute owned --wait=false >/dev/null
}

reconciled() {
  local g o
  g="$(k -n "$SHOP" get rollout.sluice.dev e2e -o jsonpath='{.metadata.generation}')"
  o="$(k -n "$SHOP" get rollout.sluice.dev e2e -o jsonpath='{.status.observedGeneration}')"
  [ -n "$o" ] && [ "$o" = "$g" ]
}

scenario_plugin() {
  k create namespace "$SHOP" --dry-run=client -o yaml | k apply -f - >/dev/null
  k apply -f - >/dev/null <<YAML
apiVersion: sluice.dev/v1alpha1
kind: Rollout
metadata: {name: e2e, namespace: $SHOP}
spec:
  routeRef: {name: e2e}
  stableService: {name: e2e-v1}
  canaryService: {name: e2e-v2}
  canaryWorkload: {name: e2e-v2}
  steps:
    - setWeight: {weight: 5}
    - pause: {untilPromoted: true}
YAML
  wait_for 60 "rollout-weights to write the Rollout's status" reconciled
  "$PLUGIN" status rollout/e2e -n "$SHOP" --context "$CONTEXT" | tee /dev/stderr | grep -q "Rollout $SHOP/e2e" \
    || { echo "kubectl sluice status printed no tree"; return 1; }
  "$PLUGIN" get rollouts -A --context "$CONTEXT" | grep -q "^$SHOP *e2e" || { echo "kubectl sluice get lacks the Rollout"; return 1; }
  if [ "$(k -n "$SHOP" get rollout.sluice.dev e2e -o jsonpath='{.status.phase}')" != "Paused" ]; then
    "$PLUGIN" pause e2e -n "$SHOP" --context "$CONTEXT"
    [ "$(k -n "$SHOP" get rollout.sluice.dev e2e -o jsonpath='{.spec.paused}')" = "true" ] \
      || { echo "kubectl sluice pause did not set spec.paused"; return 1; }
  fi
  k -n "$SHOP" delete rollout.sluice.dev e2e --timeout 60s >/dev/null
}

