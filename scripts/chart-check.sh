#!/usr/bin/env bash
# Checks the Helm chart charts/sluice offline (run by scripts/test.sh):
#
#   bash scripts/chart-check.sh                     # all checks
#   bash scripts/chart-check.sh --write-rbac-table  # record a deliberate RBAC change (both tables)
#
# 1. the chart's crds/ equals the generated crds/ at the repo root;
# 2. `helm lint --strict`;
# 3. `helm template` with default values and with every operator disabled but one, each render
#    validated by `kubernetes-validate --strict` against the oldest Kubernetes the chart supports
#    and the newest the validator knows, then checked by scripts/chart_assert.py (hardening,
#    wiring, least-privilege RBAC; the default render against charts/sluice/ci/rbac-table.txt, the
#    workload-cluster render (ci/workload-values.yaml) against ci/rbac-table-workload.txt);
# 4. values.schema.json and the chart's own checks reject bad values with a clear message;
# 5. with monitoring on: the PrometheusRule passes `promtool check rules` and the cases of
#    charts/sluice/ci/alerts-test.yaml (`promtool test rules`; skipped without promtool).
# Needs helm v4 and kubernetes-validate (bash scripts/install-tools.sh).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
export PATH="$ROOT/.tools/bin:$PATH"
CHART=charts/sluice
RELEASE=t
NAMESPACE=sluice-system
ARGOCD_NAMESPACE=argocd
RBAC_TABLE="$CHART/ci/rbac-table.txt"
RBAC_TABLE_WORKLOAD="$CHART/ci/rbac-table-workload.txt"
WORKLOAD_VALUES="$CHART/ci/workload-values.yaml"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the validator knows.
KUBE_VERSIONS=(1.33.0 1.37.0)
OPERATORS=(rollout-weights wave-gate revert upgrade-revisions)
declare -A VALUES_KEY=([rollout-weights]=rolloutWeights [wave-gate]=waveGate [revert]=revert [upgrade-revisions]=upgradeRevisions)

PY="$ROOT/.tools/venv/bin/python"
# The owned-route annotation as sluice-api declares it; the admission policy must use the same.
ROUTE_OWNER_ANNOTATION="$(sed -n 's/^pub const ROUTE_OWNER_ANNOTATION: &str = "\(.*\)";$/\1/p' \
  crates/sluice-api/src/v1alpha1/rollout.rs 2>/dev/null)"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

passed=0
failed=0
skipped=0
pass() { passed=$((passed + 1)); printf 'ok   %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s\n' "$1"; [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/     /'; }
# A check whose prerequisite is missing: a failure in strict mode (CI=true or
# SLUICE_REQUIRE_ALL=1, which scripts/test.sh sets), a counted skip otherwise.
skip_or_fail() {
  case "${SLUICE_REQUIRE_ALL:-}${CI:-}" in
    *1*|*true*) fail "$1" "missing prerequisite: $2" ;;
    *) skipped=$((skipped + 1)); printf 'skip %s: %s\n' "$1" "$2" ;;
  esac
}

# Runs a command as one check; its output is shown only when it fails.
check() {
  local name="$1"; shift
  local log="$OUT/log"
  if "$@" >"$log" 2>&1; then pass "$name"; else fail "$name" "$(cat "$log")"; fi
}

require_tools() {
  local missing=()
  command -v helm >/dev/null 2>&1 || missing+=(helm)
  command -v kubernetes-validate >/dev/null 2>&1 || missing+=(kubernetes-validate)
  [ -x "$PY" ] || missing+=("$PY")
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "chart-check: missing ${missing[*]}: run 'bash scripts/install-tools.sh' first" >&2
    exit 1
  fi
  case "$(helm version --short)" in
    v4.*) ;;
    *) echo "chart-check: helm $(helm version --short) found, v4 needed: run 'bash scripts/install-tools.sh'" >&2; exit 1 ;;
  esac
}

render() { # render NAME [helm template flags...]
  local name="$1"; shift
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --include-crds "$@" >"$OUT/$name.yaml"
}

validate() { # validate NAME
  local v rc=0
  for v in "${KUBE_VERSIONS[@]}"; do
    kubernetes-validate --strict --quiet -k "$v" "$OUT/$1.yaml" || rc=1
  done
  return "$rc"
}

only_flags() { # only_flags OPERATOR -> --set flags disabling every other operator
  local op
  for op in "${OPERATORS[@]}"; do
    [ "$op" = "$1" ] || printf -- '--set\n%s.enabled=false\n' "${VALUES_KEY[$op]}"
  done
}

# expect_rejected NAME PATTERN [helm template flags...]: rendering must fail with PATTERN in the error.
expect_rejected() {
  local name="$1" pattern="$2"; shift 2
  local err="$OUT/rejected.err"
  if helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" "$@" >/dev/null 2>"$err"; then
    fail "$name" "helm template $* succeeded; it must be rejected"
  elif grep -qF -- "$pattern" "$err"; then
    pass "$name"
  else
    fail "$name" "rejected, but the error lacks '$pattern':
$(cat "$err")"
  fi
}

# revert's default unpacked-size limit is sluice-bundle's MAX_UNPACKED_BYTES, and the value
# reaches the flag.
bundle_limit_matches_crate() {
  local src=crates/sluice-bundle/src/archive.rs expr bytes
  expr="$(sed -n 's/^pub const MAX_UNPACKED_BYTES: u64 = \([0-9 *]*\);$/\1/p' "$src")"
  [ -n "$expr" ] || { echo "no 'pub const MAX_UNPACKED_BYTES: u64 = ...;' in $src"; return 1; }
  bytes=$((expr))
  grep -qx "  maxBundleUnpackedBytes: $bytes" "$CHART/values.yaml" \
    || { echo "values.yaml revert.maxBundleUnpackedBytes is not $bytes (MAX_UNPACKED_BYTES in $src)"; return 1; }
  grep -q -- "- \"--max-bundle-unpacked-bytes=$bytes\"" "$OUT/default.yaml" \
    || { echo "the default render does not pass --max-bundle-unpacked-bytes=$bytes to revert"; return 1; }
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --set revert.maxBundleUnpackedBytes=268435456 \
    >"$OUT/bundle-limit.yaml" || return 1
  grep -q -- "- \"--max-bundle-unpacked-bytes=268435456\"" "$OUT/bundle-limit.yaml" \
    || { echo "revert.maxBundleUnpackedBytes=268435456 does not reach --max-bundle-unpacked-bytes"; return 1; }
}

# The wave-gate duck ConfigMap says what sluice-api's DUCK_* constants say.
duck_configmap_matches_api() {
  local src=crates/sluice-api/src/v1alpha1/wave_gate.rs const value
  for const in DUCK_RESOURCE:kind DUCK_STATUS_LIST_KEY:statusListKey DUCK_MATCH_KEY:matchKey; do
    value="$(sed -n "s/^pub const ${const%%:*}: &str = \"\(.*\)\";$/\1/p" "$src")"
    [ -n "$value" ] || { echo "no 'pub const ${const%%:*}' in $src"; return 1; }
    grep -qx "  ${const##*:}: $value" "$OUT/default.yaml" \
      || { echo "the duck ConfigMap lacks '${const##*:}: $value' (${const%%:*} in $src)"; return 1; }
  done
}

# The PrometheusRule as rendered: its rule groups pass `promtool check rules` and the cases of
# charts/sluice/ci/alerts-test.yaml pass `promtool test rules`.
alert_rules() {
  local dir="$OUT/alerts"
  mkdir -p "$dir"
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --set monitoring.prometheusRule.enabled=true \
    --show-only templates/monitoring/prometheusrule.yaml >"$dir/rendered.yaml" || return 1
  "$PY" -c 'import sys, yaml; yaml.safe_dump(yaml.safe_load(open(sys.argv[1]))["spec"], open(sys.argv[2], "w"), sort_keys=False)' \
    "$dir/rendered.yaml" "$dir/rules.yaml" || return 1
  cp "$CHART/ci/alerts-test.yaml" "$dir/" || return 1
  promtool check rules "$dir/rules.yaml" && promtool test rules "$dir/alerts-test.yaml"
}

# The container image's inputs (no container engine in CI): every binary a rendered Deployment
# runs is built and installed by the Dockerfile from a workspace package, the image's user is the
# chart's runAsUser, and .dockerignore keeps what the build copies.
image_inputs() {
  local bin pkg rc=0
  for bin in $(sed -n 's|.*command: \["/usr/local/bin/\([a-z-]*\)"\]|\1|p' "$OUT/default.yaml" | sort -u) kubectl-sluice; do
    grep -q -- "-p $bin\b" Dockerfile || { echo "Dockerfile does not build package $bin (cargo build -p $bin)"; rc=1; }
    grep -q "for bin in .*\b$bin\b" Dockerfile || { echo "Dockerfile does not install $bin into /usr/local/bin"; rc=1; }
  done
  for pkg in $(grep -o -- '-p [a-z-]*' Dockerfile | cut -d' ' -f2 | sort -u); do
    grep -qx "name = \"$pkg\"" crates/*/Cargo.toml operators/*/Cargo.toml \
      || { echo "Dockerfile builds -p $pkg, which no workspace package is named"; rc=1; }
  done
  local uid
  uid="$(sed -n 's/^ *runAsUser: \([0-9]*\)$/\1/p' "$OUT/default.yaml" | sort -u)"
  grep -qx "USER $uid:$uid" Dockerfile || { echo "Dockerfile USER is not the chart's runAsUser ($uid)"; rc=1; }
  for path in Cargo.toml Cargo.lock crates/ operators/ testing/ e2e/suite/; do
    grep -qx "!$path" .dockerignore || { echo ".dockerignore excludes $path, which the Dockerfile copies"; rc=1; }
  done
  # cargo loads every workspace member's manifest, so the build context must hold each of them.
  local member
  for member in $(sed -n '/^members = \[/,/^\]/s/^ *"\([^"]*\)",\{0,1\}$/\1/p' Cargo.toml); do
    case "$member" in crates/*|operators/*) continue ;; esac
    grep -q -e "^COPY $member " -e "^COPY ${member%%/*} " Dockerfile || { echo "Dockerfile does not copy workspace member $member (cargo cannot load the workspace without it)"; rc=1; }
  done
  return "$rc"
}

# The rendered argocd-cm snippet holds each sluice kind's Lua health check exactly as
# charts/sluice/argocd/health/<Kind>.lua (the file testing/sluice-chart-tests runs) and the
# HTTPRoute ignoreDifferences naming sluice-api's field managers.
argocd_customizations() {
  "$PY" - "$OUT/default.yaml" "$CHART/argocd/health" <<'PYEOF'
import os, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-argocd-cm")]
if len(cms) != 1:
    sys.exit(f"expected one ConfigMap *-argocd-cm, found {len(cms)}")
data = cms[0]["data"]
for kind in ("Rollout", "WaveGate", "BundlePin", "RevisionUpgrade", "GateTemplate"):
    key = f"resource.customizations.health.sluice.dev_{kind}"
    want = open(os.path.join(sys.argv[2], f"{kind}.lua")).read()
    if data.get(key, "").rstrip("\n") != want.rstrip("\n"):
        sys.exit(f"{key} differs from argocd/health/{kind}.lua")
ign = yaml.safe_load(data["resource.customizations.ignoreDifferences.gateway.networking.k8s.io_HTTPRoute"])
if sorted(ign["managedFieldsManagers"]) != ["sluice-revert", "sluice-rollout-weights"]:
    sys.exit(f"HTTPRoute ignoreDifferences names {ign['managedFieldsManagers']}")
PYEOF
  local m
  for m in $(sed -n 's/^pub const FIELD_MANAGER: &str = "\(.*\)";$/\1/p' crates/sluice-api/src/v1alpha1/rollout.rs crates/sluice-api/src/v1alpha1/bundle_pin.rs); do
    grep -q -- "- $m\$" "$CHART/values.yaml" || { echo "values.yaml argocd.resourceCustomizations.routeFieldManagers lacks sluice-api's FIELD_MANAGER $m"; return 1; }
  done
}

# Every dashboard query is PromQL promtool parses, once Grafana's variables are substituted; the
# dashboard ConfigMaps carry the files verbatim.
dashboard_queries() {
  local dir="$OUT/dashboards"
  mkdir -p "$dir"
  "$PY" - "$CHART/dashboards" "$dir/rules.yaml" "$OUT/monitoring.yaml" <<'PYEOF' || return 1
import json, os, sys, yaml
src, out, rendered = sys.argv[1:4]
subs = {"$__rate_interval": "2m", "$__range": "6h", "$__interval": "1m", "$stable": "stable", "$canary": "canary"}
rules, cms = [], {}
for d in yaml.safe_load_all(open(rendered)):
    if d and d["kind"] == "ConfigMap" and "-dashboard-" in d["metadata"]["name"]:
        cms.update(d["data"])
for name in sorted(os.listdir(src)):
    text = open(os.path.join(src, name)).read()
    if cms.get(f"sluice-{name}", "").rstrip("\n") != text.rstrip("\n"):
        sys.exit(f"the dashboard ConfigMaps lack dashboards/{name} verbatim")
    dash = json.loads(text)
    for p in dash["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"]
            for k, v in subs.items():
                expr = expr.replace(k, v)
            rules.append({"record": f"dashboard:{dash['uid'].replace('-', '_')}:{p['id']}_{t['refId']}", "expr": expr})
if len(cms) != len(os.listdir(src)):
    sys.exit(f"{len(cms)} dashboard ConfigMap entries for {len(os.listdir(src))} dashboards")
yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}, open(out, "w"))
PYEOF
  promtool check rules "$dir/rules.yaml"
}

# revert.allowedKinds: the schema accepts exactly sluice-api's DEFAULT_ALLOWED_KINDS (all revert's
# destination identity may write), and a value reaches revert's --allowed-kinds.
revert_allowed_kinds() {
  local kinds
  kinds="$(sed -n '/^pub const DEFAULT_ALLOWED_KINDS/,/^];/p' crates/sluice-api/src/v1alpha1/bundle_pin.rs \
    | sed -n 's/^ *("\([^"]*\)", "\([^"]*\)"),$/\2.\1/p' | sort)"
  [ -n "$kinds" ] || { echo "no DEFAULT_ALLOWED_KINDS in crates/sluice-api/src/v1alpha1/bundle_pin.rs"; return 1; }
  local schema
  schema="$("$PY" -c 'import json,sys; print("\n".join(sorted(json.load(open(sys.argv[1]))["properties"]["revert"]["properties"]["allowedKinds"]["items"]["enum"])))' "$CHART/values.schema.json")" || return 1
  [ "$kinds" = "$schema" ] || { echo "values.schema.json revert.allowedKinds enum differs from DEFAULT_ALLOWED_KINDS:"; diff <(echo "$kinds") <(echo "$schema"); return 1; }
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" \
    --set 'revert.allowedKinds={HTTPRoute.gateway.networking.k8s.io,DestinationRule.networking.istio.io}' \
    | grep -- '"--allowed-kinds=HTTPRoute.gateway.networking.k8s.io,DestinationRule.networking.istio.io"' >/dev/null \
    || { echo "revert.allowedKinds does not reach revert's --allowed-kinds"; return 1; }
}

# network_policies RENDER: one NetworkPolicy per operator Deployment, selecting exactly its pods;
# ingress only to the metrics port the container serves on; egress only to the API server
# addresses, DNS, the metrics view (not revert) and revert's own peers (revert only).
network_policies() {
  "$PY" - "$OUT/$1.yaml" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
comp = lambda d: d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
deps = {comp(d): d for d in docs if d["kind"] == "Deployment"}
pols = {comp(d): d for d in docs if d["kind"] == "NetworkPolicy"}
fail = []
if sorted(pols) != sorted(deps):
    fail.append(f"NetworkPolicies for {sorted(pols)}, Deployments for {sorted(deps)}")
for op, p in pols.items():
    d = deps.get(op)
    if d is None:
        continue
    where = f"NetworkPolicy {p['metadata']['name']}"
    if p["spec"]["podSelector"]["matchLabels"] != d["spec"]["selector"]["matchLabels"]:
        fail.append(f"{where}: selects {p['spec']['podSelector']} not the Deployment's pods")
    if sorted(p["spec"]["policyTypes"]) != ["Egress", "Ingress"]:
        fail.append(f"{where}: policyTypes {p['spec']['policyTypes']}")
    c = d["spec"]["template"]["spec"]["containers"][0]
    served = [x["containerPort"] for x in c.get("ports", [])]
    ports = [pt["port"] for r in p["spec"]["ingress"] for pt in r.get("ports", [])]
    if len(served) != 1 or ports != served or any("ports" not in r for r in p["spec"]["ingress"]):
        fail.append(f"{where}: ingress ports {ports}, the pod serves {served}: ingress must be the metrics port only")
    if any("from" not in r for r in p["spec"]["ingress"]):
        fail.append(f"{where}: ingress from anywhere although metricsFrom is set")
    egress = p["spec"]["egress"]
    cidrs = sorted(t["ipBlock"]["cidr"] for r in egress for t in r.get("to", []) if "ipBlock" in t)
    want = ["10.0.0.10/32", "10.0.0.11/32"] + (["192.0.2.0/24"] if op == "revert" else [])
    if cidrs != sorted(want):
        fail.append(f"{where}: egress to {cidrs}, expected {sorted(want)}")
    if any("to" not in r or "ports" not in r for r in egress):
        fail.append(f"{where}: an egress rule without to or ports opens everything")
    prom = any(pt.get("port") == 9090 for r in egress for pt in r.get("ports", []))
    if prom == (op == "revert"):
        fail.append(f"{where}: metrics-view egress {'present' if prom else 'missing'}")
if fail:
    sys.exit("\n".join(fail))
PYEOF
}

# revert reads AppProjects by name when revert.appProjects lists them, and only those.
revert_app_projects() {
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --set 'revert.appProjects={default,shop}' \
    --show-only templates/revert/rbac.yaml >"$OUT/app-projects.yaml" || return 1
  "$PY" - "$OUT/app-projects.yaml" <<'PYEOF'
import sys, yaml
role = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Role")
rules = [r for r in role["rules"] if "appprojects" in r["resources"]]
if len(rules) != 1 or rules[0].get("resourceNames") != ["default", "shop"] or rules[0]["verbs"] != ["get"]:
    sys.exit(f"revert's AppProject rule is {rules}, expected get of resourceNames [default, shop]")
PYEOF
}

# revert.registry: the credentials Secret and CA ConfigMap reach revert's flags, and revert may
# `get` exactly those two objects in the release namespace (no list, no watch, no other name).
revert_registry() {
  helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" \
    --set revert.registry.credentialsSecret=regcred --set revert.registry.caConfigMap=registry-ca \
    >"$OUT/registry.yaml" || return 1
  "$PY" - "$OUT/registry.yaml" "$NAMESPACE" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ns = sys.argv[2]
role = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("revert-registry")]
if len(role) != 1 or role[0]["metadata"]["namespace"] != ns:
    sys.exit(f"expected one revert registry Role in {ns}, got {role}")
rules = sorted((r["resources"], r.get("resourceNames"), r["verbs"]) for r in role[0]["rules"])
want = [(["configmaps"], ["registry-ca"], ["get"]), (["secrets"], ["regcred"], ["get"])]
if rules != want:
    sys.exit(f"revert registry Role rules {rules}, expected {want}")
deploy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("revert"))
args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
for flag in ("--registry-credentials-secret=regcred", "--registry-ca-configmap=registry-ca"):
    if flag not in args:
        sys.exit(f"{flag} missing from revert's args {args}")
PYEOF
  if helm template "$RELEASE" "$CHART" --namespace "$NAMESPACE" \
    --show-only templates/revert/registry-access.yaml >/dev/null 2>&1; then
    echo "the registry Role is rendered without revert.registry values"; return 1
  fi
}

# Workload-cluster mode renders only what a workload cluster runs: no Argo CD piece, no
# wave-gate or revert operator, revert's target identity limited to sluice-api's
# DEFAULT_ALLOWED_KINDS, and that identity allowed to change owned routes.
# workload_mode [RENDER [ENVOYFILTERS(true|false) [NAMESPACES(comma-separated)]]]: EnvoyFilter only
# when opted in; a RoleBinding per listed namespace instead of the ClusterRoleBinding; never a
# legacy token Secret unless asked for.
workload_mode() {
  local render="${1:-workload}" envoy="${2:-false}" bind_ns="${3:-}"
  local kinds
  kinds="$(sed -n '/^pub const DEFAULT_ALLOWED_KINDS/,/^];/p' crates/sluice-api/src/v1alpha1/bundle_pin.rs \
    | sed -n 's/^ *("\([^"]*\)", "\([^"]*\)"),$/\1 \2/p')"
  [ -n "$kinds" ] || { echo "no DEFAULT_ALLOWED_KINDS in crates/sluice-api/src/v1alpha1/bundle_pin.rs"; return 1; }
  "$PY" - "$OUT/$render.yaml" "$ARGOCD_NAMESPACE" "$kinds" "$envoy" "$bind_ns" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
argocd_ns, kinds = sys.argv[2], [l.split() for l in sys.argv[3].splitlines() if l.strip()]
envoy, bind_ns = sys.argv[4] == "true", [n for n in sys.argv[5].split(",") if n]
fail = []
for d in docs:
    if d["metadata"].get("namespace") == argocd_ns:
        fail.append(f"{d['kind']}/{d['metadata']['name']} in the Argo CD namespace")
    comp = d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
    if comp in ("wave-gate", "revert", "argocd"):
        fail.append(f"{d['kind']}/{d['metadata']['name']} ({comp}) belongs to the management cluster")
roles = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-revert-target")]
if len(roles) != 1:
    sys.exit(f"expected revert's target ClusterRole, found {len(roles)}")
granted = {(g, r) for rule in roles[0]["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
def plural(kind):
    k = kind.lower()
    return k[:-1] + "ies" if k.endswith("y") else k + "s"
want = {(g, plural(k)) for g, k in kinds if envoy or k != "EnvoyFilter"}
if granted != want:
    fail.append(f"revert's target identity grants {sorted(granted - want)} beyond and lacks {sorted(want - granted)} of DEFAULT_ALLOWED_KINDS (EnvoyFilter {'opted in' if envoy else 'off'})")
name = roles[0]["metadata"]["name"]
crbs = [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == name]
rbs = sorted(d["metadata"]["namespace"] for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == name)
if bind_ns and (crbs or rbs != sorted(bind_ns)):
    fail.append(f"revertTarget.namespaces={bind_ns}: expected RoleBindings there and no ClusterRoleBinding, found RoleBindings in {rbs} and {len(crbs)} ClusterRoleBinding(s)")
if not bind_ns and (len(crbs) != 1 or rbs):
    fail.append(f"revert's target identity: expected one ClusterRoleBinding, found {len(crbs)} and RoleBindings in {rbs}")
if any(d["kind"] == "Secret" and d.get("type") == "kubernetes.io/service-account-token" for d in docs):
    fail.append("a legacy service-account token Secret is rendered without revertTarget.tokenSecret")
for rule in roles[0]["rules"]:
    if set(rule["verbs"]) - {"get", "list", "watch", "create", "patch", "delete"}:
        fail.append(f"revert's target identity has verbs {rule['verbs']}")
sa = next((d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-revert-target")), None)
vap = next((d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-owned-routes")), None)
if sa is None or vap is None:
    fail.append("workload mode renders revert's target ServiceAccount and the owned-route policy")
else:
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    if f"'{user}'" not in yaml.safe_dump(vap["spec"]):
        fail.append(f"the owned-route policy does not let revert's target identity {user} change owned routes")
if fail:
    sys.exit("\n".join(fail))
PYEOF
}

crds_match() {
  [ -d "$CHART/crds" ] || { echo "$CHART/crds is missing: run crdgen (it writes crds/ and $CHART/crds/)"; return 1; }
  diff -r crds "$CHART/crds" || { echo "run crdgen: $CHART/crds/ must equal crds/"; return 1; }
}

main() {
  require_tools
  if [ "${1:-}" = "--write-rbac-table" ]; then
    render default || exit 1
    "$PY" scripts/chart_assert.py "$OUT/default.yaml" --enabled "$(IFS=,; echo "${OPERATORS[*]}")" \
      --release-namespace "$NAMESPACE" --argocd-namespace "$ARGOCD_NAMESPACE" --rbac-table "$RBAC_TABLE" --write || exit 1
    render workload -f "$WORKLOAD_VALUES" || exit 1
    "$PY" scripts/chart_assert.py "$OUT/workload.yaml" --enabled rollout-weights,upgrade-revisions \
      --release-namespace "$NAMESPACE" --argocd-namespace "$ARGOCD_NAMESPACE" --rbac-table "$RBAC_TABLE_WORKLOAD" --write
    exit $?
  fi
  echo "chart-check: $(helm version --short), kubernetes-validate $(kubernetes-validate --version), Kubernetes ${KUBE_VERSIONS[*]}"

  if compgen -G 'crds/*.yaml' >/dev/null; then
    check "chart crds/ equals generated crds/" crds_match
  else
    skip_or_fail "chart crds/ equals generated crds/" "crds/ holds no generated CRD: cargo run -p sluice-api --bin crdgen"
  fi
  if [ -n "$ROUTE_OWNER_ANNOTATION" ]; then
    pass "sluice-api declares ROUTE_OWNER_ANNOTATION ($ROUTE_OWNER_ANNOTATION)"
  else
    fail "sluice-api declares ROUTE_OWNER_ANNOTATION" "no 'pub const ROUTE_OWNER_ANNOTATION' in crates/sluice-api/src/v1alpha1/rollout.rs: point scripts/chart-check.sh at where it moved"
  fi
  check "helm lint --strict" helm lint --strict "$CHART" --namespace "$NAMESPACE"

  # Default values: every operator, compared against the RBAC table.
  if render default 2>"$OUT/render.err"; then
    pass "helm template (default values)"
    check "kubernetes-validate --strict (default values)" validate default
    check "duck ConfigMap matches sluice-api's DUCK_* constants" duck_configmap_matches_api
    check "revert's unpacked-size limit: default is sluice-bundle's MAX_UNPACKED_BYTES, the value reaches the flag" \
      bundle_limit_matches_crate
    check "Dockerfile builds every binary the chart runs, as its user" image_inputs
    check "Argo CD resource customizations ship every health check verbatim" argocd_customizations
    check "manifests and RBAC table (default values)" "$PY" scripts/chart_assert.py "$OUT/default.yaml" \
      --enabled "$(IFS=,; echo "${OPERATORS[*]}")" --release-namespace "$NAMESPACE" \
      --argocd-namespace "$ARGOCD_NAMESPACE" --rbac-table "$RBAC_TABLE" --route-owner-annotation "$ROUTE_OWNER_ANNOTATION"
  else
    fail "helm template (default values)" "$(cat "$OUT/render.err")"
  fi

  # Every operator disabled but one.
  local op flags
  for op in "${OPERATORS[@]}"; do
    mapfile -t flags < <(only_flags "$op")
    if render "only-$op" "${flags[@]}" 2>"$OUT/render.err"; then
      pass "helm template (only $op)"
      check "kubernetes-validate --strict (only $op)" validate "only-$op"
      check "manifests and RBAC (only $op)" "$PY" scripts/chart_assert.py "$OUT/only-$op.yaml" \
        --enabled "$op" --release-namespace "$NAMESPACE" --argocd-namespace "$ARGOCD_NAMESPACE" \
        --route-owner-annotation "$ROUTE_OWNER_ANNOTATION"
      check "helm lint --strict (only $op)" helm lint --strict "$CHART" --namespace "$NAMESPACE" "${flags[@]}"
    else
      fail "helm template (only $op)" "$(cat "$OUT/render.err")"
    fi
  done

  # Workload-cluster mode, against its own RBAC table.
  if render workload -f "$WORKLOAD_VALUES" 2>"$OUT/render.err"; then
    pass "helm template (mode: workload)"
    check "kubernetes-validate --strict (mode: workload)" validate workload
    check "manifests and RBAC table (mode: workload)" "$PY" scripts/chart_assert.py "$OUT/workload.yaml" \
      --enabled rollout-weights,upgrade-revisions --release-namespace "$NAMESPACE" \
      --argocd-namespace "$ARGOCD_NAMESPACE" --rbac-table "$RBAC_TABLE_WORKLOAD" --route-owner-annotation "$ROUTE_OWNER_ANNOTATION"
    check "workload mode: only workload pieces, revert's target identity limited to DEFAULT_ALLOWED_KINDS but EnvoyFilter, cluster-wide, no legacy token" workload_mode
    check "revert.allowedKinds: DEFAULT_ALLOWED_KINDS at most, rendered as --allowed-kinds" revert_allowed_kinds
    check "helm lint --strict (mode: workload)" helm lint --strict "$CHART" --namespace "$NAMESPACE" -f "$WORKLOAD_VALUES"
  else
    fail "helm template (mode: workload)" "$(cat "$OUT/render.err")"
  fi
  if render workload-narrow -f "$WORKLOAD_VALUES" --set revertTarget.envoyFilters=true \
    --set 'revertTarget.namespaces={shop,payments}' 2>"$OUT/render.err"; then
    pass "helm template (mode: workload, revert's target identity in two namespaces, EnvoyFilter opted in)"
    check "kubernetes-validate --strict (revert's target identity per namespace)" validate workload-narrow
    check "revert's target identity: RoleBindings in the listed namespaces only, EnvoyFilter when opted in" \
      workload_mode workload-narrow true shop,payments
  else
    fail "helm template (revert's target identity per namespace)" "$(cat "$OUT/render.err")"
  fi
  check "revert.appProjects narrows revert's AppProject read to those names" revert_app_projects
  check "revert.registry: flags reach revert, get of exactly the named Secret and ConfigMap" revert_registry
  expect_rejected "schema rejects a bad revert.registry.credentialsSecret" "at '/revert/registry/credentialsSecret'" \
    --set revert.registry.credentialsSecret=Not_A_Name
  expect_rejected "schema rejects a bad revertTarget namespace" "at '/revertTarget/namespaces/0'" \
    -f "$WORKLOAD_VALUES" --set 'revertTarget.namespaces={Not_A_Namespace}'
  expect_rejected "chart refuses workload mode with wave-gate or revert enabled" \
    "mode: workload installs only what a workload cluster runs" --set mode=workload

  # Non-default values that change the shape of the render.
  if render variant --set rolloutWeights.watchNamespace=team-a --set-json 'revert.publicKeySecrets=[]' \
    --set metrics.service.enabled=false --set argocd.namespace=gitops --set image.digest="sha256:$(printf '%064d' 0)" \
    --set image.requireDigest=true --set-json 'upgradeRevisions.affinity={"nodeAffinity":{}}' \
    --set 'ownedRoutePolicy.extraAllowedUsers[0]=system:serviceaccount:mesh:sluice-revert-target' 2>"$OUT/render.err"; then
    pass "helm template (namespaced rollout-weights, no key Secrets, other Argo CD namespace)"
    check "kubernetes-validate --strict (variant values)" validate variant
    check "manifests and RBAC (variant values)" "$PY" scripts/chart_assert.py "$OUT/variant.yaml" \
      --enabled "$(IFS=,; echo "${OPERATORS[*]}")" --release-namespace "$NAMESPACE" --argocd-namespace gitops \
      --route-owner-annotation "$ROUTE_OWNER_ANNOTATION"
  else
    fail "helm template (variant values)" "$(cat "$OUT/render.err")"
  fi

  # The metrics source each gate-running operator reads, set in values, reaches its command line;
  # upgrade-revisions takes rollout-weights' URL and cluster (the same cluster's view) by default.
  # Its credentials, tenant header, CA and timeout reach all three, as files of a projected volume.
  if render metrics-source --set rolloutWeights.prometheusUrl=http://thanos-query.monitoring:10902 \
    --set rolloutWeights.cluster=east-1 --set waveGate.prometheusUrl=https://thanos-global.monitoring:9091/prefix \
    --set metricsSource.timeoutSeconds=20 --set metricsSource.bearerToken.secretName=thanos-token \
    --set metricsSource.headers.X-Scope-OrgID=tenant-a --set metricsSource.ca.secretName=thanos-ca \
    2>"$OUT/render.err"; then
    pass "helm template (metrics source values)"
    check "kubernetes-validate --strict (metrics source values)" validate metrics-source
    ms_args=()
    for op in rollout-weights wave-gate upgrade-revisions; do
      ms_args+=(--expect-arg "$op=--prometheus-timeout-seconds=20"
        --expect-arg "$op=--prometheus-bearer-token-file=/etc/sluice/metrics-source/token"
        --expect-arg "$op=--prometheus-header=X-Scope-OrgID=tenant-a"
        --expect-arg "$op=--prometheus-ca-file=/etc/sluice/metrics-source/ca.crt")
    done
    check "metrics source values reach the container args" "$PY" scripts/chart_assert.py "$OUT/metrics-source.yaml" \
      --enabled "$(IFS=,; echo "${OPERATORS[*]}")" --release-namespace "$NAMESPACE" \
      --argocd-namespace "$ARGOCD_NAMESPACE" --route-owner-annotation "$ROUTE_OWNER_ANNOTATION" \
      --expect-arg rollout-weights=--prometheus-url=http://thanos-query.monitoring:10902 \
      --expect-arg rollout-weights=--cluster=east-1 \
      --expect-arg wave-gate=--prometheus-url=https://thanos-global.monitoring:9091/prefix \
      --expect-arg upgrade-revisions=--prometheus-url=http://thanos-query.monitoring:10902 \
      --expect-arg upgrade-revisions=--cluster=east-1 "${ms_args[@]}"
    check "metrics source files are mounted in the three gate-running operators, not in revert" \
      "$PY" - "$OUT/metrics-source.yaml" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"]
for d in docs:
    op = d["metadata"]["labels"]["app.kubernetes.io/component"]
    spec = d["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0].get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    if op == "revert":
        assert "metrics-source" not in vols, f"{op} mounts the metrics source"
        continue
    assert mounts["metrics-source"]["mountPath"] == "/etc/sluice/metrics-source", op
    assert mounts["metrics-source"].get("readOnly") is True, op
    sources = vols["metrics-source"]["projected"]["sources"]
    want = [{"secret": {"name": "thanos-token", "items": [{"key": "token", "path": "token"}]}},
            {"secret": {"name": "thanos-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]
    assert sources == want, f"{op}: {sources}"
PYEOF
  else
    fail "helm template (metrics source values)" "$(cat "$OUT/render.err")"
  fi
  # revert's identity Secrets in a namespace of their own: its list grant and its flag follow.
  if render identities --set revert.clusterIdentities.namespace=sluice-revert-clusters 2>"$OUT/render.err"; then
    pass "helm template (revert identities in their own namespace)"
    check "revert lists Secrets only in its identity namespace, which its flag names" "$PY" scripts/chart_assert.py \
      "$OUT/identities.yaml" --enabled "$(IFS=,; echo "${OPERATORS[*]}")" --release-namespace "$NAMESPACE" \
      --argocd-namespace "$ARGOCD_NAMESPACE" --route-owner-annotation "$ROUTE_OWNER_ANNOTATION" \
      --revert-identity-namespace sluice-revert-clusters --expect-arg revert=--cluster-namespace=sluice-revert-clusters
  else
    fail "helm template (revert identities in their own namespace)" "$(cat "$OUT/render.err")"
  fi
  # ...and are absent by default (the binaries' own defaults apply).
  if grep -qE -- '--(prometheus-url|cluster)=' "$OUT/default.yaml"; then
    fail "default values pass no --prometheus-url or --cluster" "$(grep -nE -- '--(prometheus-url|cluster)=' "$OUT/default.yaml")"
  else
    pass "default values pass no --prometheus-url or --cluster"
  fi

  # NetworkPolicies: none by default; when enabled one per operator, ingress only to the metrics
  # port, egress only to the API server, DNS, the metrics view (gates) and revert's own peers.
  if grep -q '^kind: NetworkPolicy$' "$OUT/default.yaml"; then
    fail "default values render no NetworkPolicy" "$(grep -n -A3 '^kind: NetworkPolicy$' "$OUT/default.yaml")"
  else
    pass "default values render no NetworkPolicy"
  fi
  if render netpol --set networkPolicy.enabled=true \
    --set-json 'networkPolicy.apiServer=[{"cidr":"10.0.0.10/32","port":6443},{"cidr":"10.0.0.11/32","port":6443}]' \
    --set-json 'networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]' \
    --set-json 'networkPolicy.metricsSource=[{"to":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}],"ports":[{"protocol":"TCP","port":9090}]}]' \
    --set-json 'networkPolicy.revertEgress=[{"to":[{"ipBlock":{"cidr":"192.0.2.0/24"}}],"ports":[{"protocol":"TCP","port":443}]}]' \
    2>"$OUT/render.err"; then
    pass "helm template (NetworkPolicies enabled)"
    check "kubernetes-validate --strict (NetworkPolicies enabled)" validate netpol
    check "NetworkPolicies: metrics port in, API server, DNS, metrics view and revert's peers out" network_policies netpol
  else
    fail "helm template (NetworkPolicies enabled)" "$(cat "$OUT/render.err")"
  fi
  expect_rejected "chart refuses NetworkPolicies without the API server's addresses" \
    "networkPolicy.enabled needs networkPolicy.apiServer" --set networkPolicy.enabled=true

  # Monitoring: ServiceMonitor, PrometheusRule and dashboards rendered and validated; alert rules
  # unit-tested with promtool when it is installed.
  if render monitoring --set monitoring.serviceMonitor.enabled=true --set monitoring.prometheusRule.enabled=true \
    --set monitoring.dashboards.enabled=true 2>"$OUT/render.err"; then
    pass "helm template (monitoring enabled)"
    check "kubernetes-validate --strict (monitoring enabled)" validate monitoring
    check "manifests and RBAC (monitoring enabled)" "$PY" scripts/chart_assert.py "$OUT/monitoring.yaml" \
      --enabled "$(IFS=,; echo "${OPERATORS[*]}")" --release-namespace "$NAMESPACE" \
      --argocd-namespace "$ARGOCD_NAMESPACE" --route-owner-annotation "$ROUTE_OWNER_ANNOTATION"
  else
    fail "helm template (monitoring enabled)" "$(cat "$OUT/render.err")"
  fi
  if command -v promtool >/dev/null 2>&1; then
    check "promtool check rules + test rules (ci/alerts-test.yaml)" alert_rules
    check "dashboard queries parse as PromQL (promtool)" dashboard_queries
  else
    skip_or_fail "promtool test rules" "promtool is not installed: bash scripts/install-tools.sh (Debian package prometheus)"
  fi

  # Bad values are refused before anything renders.
  expect_rejected "schema rejects rolloutWeights.replicas=-1" "at '/rolloutWeights/replicas': minimum" \
    --set rolloutWeights.replicas=-1
  expect_rejected "schema rejects an unknown key" "additional properties 'replica' not allowed" \
    --set waveGate.replica=2
  expect_rejected "schema rejects image.pullPolicy=Sometimes" "at '/image/pullPolicy'" \
    --set image.pullPolicy=Sometimes
  expect_rejected "schema rejects a privileged metrics port" "at '/metrics/port': minimum" \
    --set metrics.port=80
  expect_rejected "schema rejects a bad Secret name" "at '/revert/publicKeySecrets/0'" \
    --set 'revert.publicKeySecrets[0]=Not_A_Name'
  expect_rejected "schema rejects an allowed kind revert's destination identity may not write" \
    "at '/revert/allowedKinds/0': value must be one of" \
    --set 'revert.allowedKinds={ClusterRole.rbac.authorization.k8s.io}'
  expect_rejected "schema rejects an unpacked-size limit of 0" \
    "at '/revert/maxBundleUnpackedBytes': minimum: got 0, want 1" --set revert.maxBundleUnpackedBytes=0
  expect_rejected "schema rejects an unpacked-size limit over 1 GiB" \
    "at '/revert/maxBundleUnpackedBytes': maximum" --set revert.maxBundleUnpackedBytes=2147483648
  expect_rejected "chart refuses an image by tag when image.requireDigest is set" \
    "image.requireDigest is set but image.digest is empty: pin the operators' image by digest" \
    --set image.requireDigest=true --set image.tag=1.0.0
  expect_rejected "chart refuses Kubernetes older than 1.33" "chart requires kubeVersion: >=1.33.0-0" \
    --kube-version 1.32.0
  expect_rejected "chart refuses a ServiceMonitor without metrics Services" \
    "monitoring.serviceMonitor.enabled needs metrics.service.enabled" \
    --set monitoring.serviceMonitor.enabled=true --set metrics.service.enabled=false
  expect_rejected "schema rejects a metrics source that is not an http(s) URL" \
    "at '/rolloutWeights/prometheusUrl'" --set rolloutWeights.prometheusUrl=thanos-query:9090
  expect_rejected "schema rejects a cluster label value with a space" "at '/rolloutWeights/cluster'" \
    --set 'rolloutWeights.cluster=east 1'
  expect_rejected "schema rejects upgrade-revisions' metrics source that is not an http(s) URL" \
    "at '/upgradeRevisions/prometheusUrl'" --set upgradeRevisions.prometheusUrl=thanos-query:9090
  expect_rejected "chart refuses metrics source basic auth without its password Secret" \
    "metricsSource.basicAuth needs both username and passwordSecretName" --set metricsSource.basicAuth.username=u
  expect_rejected "chart refuses a metrics source bearer token together with basic auth" \
    "set either basicAuth or a bearer token" --set metricsSource.basicAuth.username=u \
    --set metricsSource.basicAuth.passwordSecretName=p --set metricsSource.bearerToken.secretName=t
  expect_rejected "chart refuses an Authorization header among the metrics source headers" \
    "metricsSource.headers must not set Authorization" --set metricsSource.headers.authorization=x
  expect_rejected "schema rejects a metrics source header value with a line break" \
    "at '/metricsSource/headers/X-Scope-OrgID'" --set-json 'metricsSource.headers={"X-Scope-OrgID":"a\nb"}'
  expect_rejected "chart refuses revert's identity Secrets in the Argo CD namespace" \
    "revert.clusterIdentities.namespace must not be argocd.namespace (argocd)" \
    --set revert.clusterIdentities.namespace=argocd
  expect_rejected "schema rejects a bad alert duration" "at '/monitoring/prometheusRule/alerts/rolloutStuckFor'" \
    --set monitoring.prometheusRule.alerts.rolloutStuckFor=soon
  expect_rejected "chart rejects renewSeconds >= leaseDurationSeconds" \
    "leaderElection.renewSeconds (15) must be less than leaderElection.leaseDurationSeconds (15)" \
    --set leaderElection.renewSeconds=15
  expect_rejected "chart rejects retrySeconds >= the renew deadline" \
    "leaderElection.retrySeconds (10) must be less than leaseDurationSeconds - renewSeconds (10)" \
    --set leaderElection.retrySeconds=10

  echo
  printf 'chart: %d passed, %d failed, %d skipped\n' "$passed" "$failed" "$skipped"
  [ "$failed" -eq 0 ]
}

main "$@"
