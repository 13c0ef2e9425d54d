#!/usr/bin/env python3
"""Checks a rendered sluice chart (`helm template` output) for what schemas cannot see.

    chart_assert.py RENDERED.yaml --enabled rollout-weights,wave-gate \
        --release-namespace sluice-system --argocd-namespace argocd [--rbac-table FILE [--write]]

Owns: the hardening every operator Deployment must carry, the wiring between Deployment,
ServiceAccount, bindings and Lease, and the table of every permission each operator is granted
(`--rbac-table`: fails on any difference; `--write` rewrites the table after a deliberate
change). Never talks to a cluster.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import yaml

OPERATORS = ("rollout-weights", "wave-gate", "revert", "upgrade-revisions")
# Kinds each operator owns; no operator may write another's kind (wave-gate only creates
# BundlePins, checked separately).
OWN_KIND = {
    "rollout-weights": "rollouts",
    "wave-gate": "wavegates",
    "revert": "bundlepins",
    "upgrade-revisions": "revisionupgrades",
}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
RUNS_GATES = {"rollout-weights", "wave-gate", "upgrade-revisions"}
# Built-in resources a RoleBinding cannot grant (they have no namespace).
CLUSTER_SCOPED_BUILTINS = {
    "namespaces", "nodes", "persistentvolumes", "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations", "validatingadmissionpolicies", "validatingadmissionpolicybindings",
    "customresourcedefinitions", "clusterroles", "clusterrolebindings", "priorityclasses", "storageclasses",
}


class Failures:
    def __init__(self) -> None:
        self.items: list[str] = []

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.items.append(message)


def load(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def component(obj: dict) -> str | None:
    return obj.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")


def check_deployment(dep: dict, docs: list[dict], f: Failures) -> None:
    name = dep["metadata"]["name"]
    where = f"Deployment {name}"
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    f.check(spec.get("replicas", 1) >= 2, f"{where}: replicas {spec.get('replicas')} < 2 (leader election needs a standby)")
    psc = pod.get("securityContext", {})
    f.check(psc.get("runAsNonRoot") is True, f"{where}: pod securityContext.runAsNonRoot is not true")
    f.check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: pod seccompProfile is not RuntimeDefault")
    selector = spec["selector"]["matchLabels"]
    f.check(
        any(d["kind"] == "PodDisruptionBudget" and d["spec"]["selector"].get("matchLabels") == selector for d in docs),
        f"{where}: no PodDisruptionBudget keeps its standby through node drains",
    )
    sa = pod.get("serviceAccountName")
    f.check(
        any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == sa for d in docs),
        f"{where}: serviceAccountName {sa!r} is not rendered",
    )
    containers = pod.get("containers", [])
    f.check(len(containers) == 1, f"{where}: expected one container, found {len(containers)}")
    for c in containers:
        cw = f"{where} container {c.get('name')}"
        sc = c.get("securityContext", {})
        f.check(sc.get("readOnlyRootFilesystem") is True, f"{cw}: readOnlyRootFilesystem is not true")
        f.check(sc.get("allowPrivilegeEscalation") is False, f"{cw}: allowPrivilegeEscalation is not false")
        f.check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{cw}: capabilities.drop is not [ALL]")
        f.check(sc.get("runAsNonRoot") is True, f"{cw}: runAsNonRoot is not true")
        f.check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{cw}: seccompProfile is not RuntimeDefault")
        ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
        f.check("metrics" in ports, f"{cw}: no port named 'metrics'")
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = c.get(probe, {}).get("httpGet", {})
            f.check(get.get("path") == path and get.get("port") == "metrics",
                    f"{cw}: {probe} must be GET {path} on port 'metrics', is {get}")
        res = c.get("resources", {})
        f.check(bool(res.get("requests")) and "memory" in res.get("limits", {}),
                f"{cw}: resources need requests and a memory limit, are {res}")
        args = c.get("args", [])
        metrics_addr = [a for a in args if a.startswith("--metrics-addr=")]
        f.check(
            len(metrics_addr) == 1 and metrics_addr[0].endswith(f":{ports.get('metrics')}"),
            f"{cw}: --metrics-addr {metrics_addr} does not match the metrics port {ports.get('metrics')}",
        )
        lease = [a.split("=", 1)[1] for a in args if a.startswith("--lease-name=")]
        f.check(len(lease) == 1, f"{cw}: exactly one --lease-name flag expected, found {lease}")
        if lease:
            f.check(
                any(
                    d["kind"] == "Role"
                    and any(lease[0] in r.get("resourceNames", []) and "leases" in r.get("resources", [])
                            for r in d.get("rules", []))
                    for d in docs
                ),
                f"{cw}: no Role lets it renew its Lease {lease[0]!r}",
            )


def grants(docs: list[dict]) -> dict[str, set[str]]:
    """Every (scope, apiGroup, resource, verb, names) each ServiceAccount is granted."""
    roles = {}
    for d in docs:
        if d["kind"] == "ClusterRole":
            roles[("ClusterRole", None, d["metadata"]["name"])] = d.get("rules", [])
        elif d["kind"] == "Role":
            roles[("Role", d["metadata"]["namespace"], d["metadata"]["name"])] = d.get("rules", [])
    out: dict[str, set[str]] = defaultdict(set)
    for d in docs:
        if d["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = d["roleRef"]
        ns = d["metadata"].get("namespace")
        key = (ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])
        rules = roles.get(key)
        if rules is None:
            out["<dangling>"].add(f"{d['kind']} {d['metadata']['name']} -> {ref['kind']} {ref['name']}")
            continue
        scope = "cluster" if d["kind"] == "ClusterRoleBinding" else f"ns/{ns}"
        for s in d.get("subjects", []):
            who = f"{s.get('namespace')}/{s['name']}" if s["kind"] == "ServiceAccount" else f"{s['kind']}/{s['name']}"
            for r in rules:
                names = ",".join(r.get("resourceNames", [])) or "*"
                for g in r.get("apiGroups", []):
                    for res in r.get("resources", []):
                        for v in r.get("verbs", []):
                            out[who].add(f"{scope} {g or 'core'} {res} {v} {names}")
    return out


def check_rbac(docs: list[dict], enabled: list[str], release_ns: str, argocd_ns: str, identity_ns: str,
               f: Failures) -> dict[str, set[str]]:
    g = grants(docs)
    f.check("<dangling>" not in g, f"bindings reference roles that are not rendered: {sorted(g.get('<dangling>', []))}")
    sa_of = {}
    for d in docs:
        if d["kind"] == "ServiceAccount":
            sa_of[component(d)] = f"{d['metadata']['namespace']}/{d['metadata']['name']}"
    for op in enabled:
        sa = sa_of.get(op)
        f.check(sa is not None, f"{op}: no ServiceAccount rendered")
        if sa is None:
            continue
        mine = g.get(sa, set())
        where = f"{op} ({sa})"
        for line in mine:
            scope, group, res, verb, names = line.split(" ")
            f.check("*" not in (group, res, verb), f"{where}: wildcard grant {line}")
            if group == "sluice.dev" and verb in WRITE_VERBS:
                base = res.split("/")[0]
                allowed = (
                    base == OWN_KIND[op]
                    # wave-gate creates a halt's pins and deletes them once revert released them.
                    or (op == "wave-gate" and res == "bundlepins" and verb in ("create", "delete"))
                    # rollout-weights is the one writer of every GateTemplate's Ready condition.
                    or (op == "rollout-weights" and res == "gatetemplates/status" and verb == "patch")
                )
                f.check(allowed, f"{where}: may write another operator's kind: {line}")
            if res == "secrets":
                f.check(op == "revert", f"{where}: must not read Secrets: {line}")
                # revert finds its destination-cluster identities by listing the Secrets of
                # their own namespace (list only); in the Argo CD namespace, where Argo CD's
                # cluster credentials live, it may only get the named cosign public-key Secrets.
                identities = scope == f"ns/{identity_ns}" and verb == "list" and identity_ns != argocd_ns
                f.check(identities or (names != "*" and verb == "get"),
                        f"{where}: Secrets only listed in the identity namespace ({identity_ns}), "
                        f"else only get by name: {line}")
            if res == "pods/eviction":
                f.check(op == "upgrade-revisions", f"{where}: must not evict pods: {line}")
            if res in ("httproutes", "grpcroutes") and verb in WRITE_VERBS:
                f.check(op == "rollout-weights", f"{where}: must not write routes: {line}")
            if op in ("wave-gate", "revert") and not res.startswith("gatetemplates") and res != "leases" \
                    and not (op == "revert" and res == "secrets" and scope == f"ns/{identity_ns}"):
                f.check(scope == f"ns/{argocd_ns}", f"{where}: must be limited to the Argo CD namespace: {line}")
            if res == "leases":
                f.check(scope == f"ns/{release_ns}", f"{where}: Leases only in the release namespace: {line}")
        has_gt = any(" gatetemplates get " in line for line in mine)
        f.check(has_gt == (op in RUNS_GATES),
                f"{where}: gatetemplates read is {'granted' if has_gt else 'missing'}; it runs gates: {op in RUNS_GATES}")
    return g


def check_decision_configmap(docs: list[dict], enabled: list[str], argocd_ns: str, f: Failures) -> None:
    """The duck ConfigMap points Argo CD at a status list the WaveGate CRD really has."""
    cms = [d for d in docs if d["kind"] == "ConfigMap" and component(d) == "wave-gate"]
    if "wave-gate" not in enabled or not cms:
        return
    for cm in cms:
        where = f"ConfigMap {cm['metadata']['name']}"
        data = cm.get("data", {})
        f.check(cm["metadata"].get("namespace") == argocd_ns, f"{where}: must live in the Argo CD namespace {argocd_ns}")
        f.check(data.get("apiVersion") == "sluice.dev/v1alpha1" and data.get("kind") == "wavegates",
                f"{where}: must name sluice.dev/v1alpha1 wavegates (the plural), has {data}")
        crd = next((d for d in docs if d["kind"] == "CustomResourceDefinition"
                    and d["metadata"]["name"] == "wavegates.sluice.dev"), None)
        if crd is None:
            continue
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
        status = version["schema"]["openAPIV3Schema"].get("properties", {}).get("status", {}).get("properties", {})
        lst = status.get(data.get("statusListKey"), {})
        f.check(lst.get("type") == "array", f"{where}: statusListKey {data.get('statusListKey')!r} is not a list in the WaveGate status")
        item = lst.get("items", {})
        f.check(data.get("matchKey") in item.get("required", []),
                f"{where}: matchKey {data.get('matchKey')!r} is not a required key of the WaveGate's decisions")


# The writes each operator's grant allows beyond its purpose, and the resources its admission
# policy (templates/admission/operator-writes.yaml) must narrow: (group, resource).
NARROWED = {
    "upgrade-revisions": {("apps", "deployments"), ("apps", "statefulsets"), ("apps", "daemonsets"), ("", "namespaces")},
    "wave-gate": {("argoproj.io", "applicationsets")},
    "revert": {("argoproj.io", "applications")},
    "rollout-weights": {("gateway.networking.k8s.io", "httproutes"), ("gateway.networking.k8s.io", "grpcroutes")},
}


def check_owned_route_policy(docs: list[dict], enabled: list[str], annotation: str | None, f: Failures) -> None:
    """Every policy has a Deny binding and fails closed. The owned-route policy names the
    annotation sluice-api writes and exactly sluice's route writers; the field-manager policy
    exempts every sluice ServiceAccount; each enabled operator has a policy, matched to its own
    ServiceAccount only, on every resource its grant is wider than its purpose."""
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    bindings = {d["spec"]["policyName"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    sas = {component(d): f"system:serviceaccount:{d['metadata']['namespace']}:{d['metadata']['name']}"
           for d in docs if d["kind"] == "ServiceAccount"}
    narrowed: dict[str, set] = defaultdict(set)
    for p in policies:
        name = p["metadata"]["name"]
        where = f"ValidatingAdmissionPolicy {name}"
        b = bindings.get(name)
        f.check(b is not None and b["spec"].get("validationActions") == ["Deny"], f"{where}: needs a Deny binding")
        f.check(p["spec"].get("failurePolicy") == "Fail", f"{where}: failurePolicy must be Fail")
        text = yaml.safe_dump(p["spec"])
        if name.endswith("-owned-routes"):
            if annotation:
                f.check(f"'{annotation}'" in text, f"{where}: does not use the route owner annotation {annotation!r} from sluice-api")
            for op in ("rollout-weights", "revert"):
                if op in enabled:
                    f.check(f"'{sas.get(op)}'" in text, f"{where}: {op} ({sas.get(op)}) is not an allowed writer")
            for op in ("wave-gate", "upgrade-revisions"):
                if op in enabled:
                    f.check(f"'{sas.get(op)}'" not in text, f"{where}: {op} must not be an allowed route writer")
        elif name.endswith("-field-managers"):
            for op in set(enabled) & {"rollout-weights", "revert", "upgrade-revisions"}:
                f.check(f"'{sas.get(op)}'" in text, f"{where}: {op} ({sas.get(op)}) writes under its own sluice-* manager and must be exempt")
        else:
            op = component(p)
            conds = [c["expression"] for c in p["spec"].get("matchConditions", [])]
            f.check(op in enabled and conds[:1] == [f"request.userInfo.username == '{sas.get(op)}'"],
                    f"{where}: its first matchCondition must select {op}'s ServiceAccount alone, has {conds[:1]}")
            for rule in p["spec"]["matchConstraints"]["resourceRules"]:
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        narrowed[op].add((g, r))
            f.check(all(v.get("messageExpression") and v.get("reason") == "Forbidden" for v in p["spec"]["validations"]),
                    f"{where}: every validation needs a messageExpression and reason Forbidden")
    if any(d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith(("-rollout-weights-routes", "-revert-applications", "-wave-gate-applicationsets", "-upgrade-revisions-namespaces")) for d in docs):
        for op in enabled:
            missing = NARROWED[op] - narrowed.get(op, set())
            f.check(not missing, f"{op}: no admission policy narrows its grant on {sorted(missing)}")


def check_crd_names(docs: list[dict], g: dict[str, set[str]], f: Failures) -> None:
    """Every sluice.dev resource a rule names is a rendered CRD's plural (or its subresource)."""
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition" and d["spec"]["group"] == "sluice.dev"]
    if not crds:
        return  # nothing generated yet; chart-check reports the missing CRDs
    known = set()
    cluster_scoped = set(CLUSTER_SCOPED_BUILTINS)
    for d in crds:
        plural = d["spec"]["names"]["plural"]
        known.add(plural)
        if d["spec"].get("scope") == "Cluster":
            cluster_scoped.add(plural)
        for v in d["spec"].get("versions", []):
            if "status" in v.get("subresources", {}):
                known.add(f"{plural}/status")
        known.add(f"{plural}/finalizers")
    for who, lines in g.items():
        for line in lines:
            scope, group, res, _, _ = line.split(" ")
            f.check(not (scope.startswith("ns/") and res.split("/")[0] in cluster_scoped),
                    f"{who}: {res} is cluster-scoped, so a namespaced binding grants nothing: {line}")
            if group == "sluice.dev":
                f.check(res in known, f"{who}: rule names sluice.dev/{res}, which no rendered CRD defines (known: {sorted(known)})")


def check_expected_arg(deployments: dict, op: str, arg: str, f: Failures) -> None:
    """A value set in values.yaml reaches the operator's command line exactly once."""
    dep = deployments.get(op)
    if dep is None:
        f.items.append(f"--expect-arg {op}={arg}: no Deployment for {op} is rendered")
        return
    args = [a for c in dep["spec"]["template"]["spec"].get("containers", []) for a in c.get("args", [])]
    flag = arg.split("=", 1)[0] + "="
    f.check(args.count(arg) == 1 and sum(a.startswith(flag) for a in args) == 1,
            f"Deployment {dep['metadata']['name']}: expected the arg {arg!r} exactly once, args are {args}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rendered")
    p.add_argument("--enabled", required=True, help="comma-separated operators expected to be rendered")
    p.add_argument("--release-namespace", required=True)
    p.add_argument("--argocd-namespace", default="argocd")
    p.add_argument("--revert-identity-namespace",
                   help="namespace of revert's cluster identity Secrets (default: the release namespace)")
    p.add_argument("--route-owner-annotation", help="the annotation sluice-api puts on owned routes")
    p.add_argument("--rbac-table", help="file holding every expected grant, one per line")
    p.add_argument("--write", action="store_true", help="rewrite --rbac-table from the render")
    p.add_argument("--expect-arg", action="append", default=[], metavar="OPERATOR=ARG",
                   help="OPERATOR's container args must hold ARG exactly once (repeatable)")
    a = p.parse_args()

    enabled = [e for e in a.enabled.split(",") if e]
    unknown = set(enabled) - set(OPERATORS)
    if unknown:
        print(f"chart_assert: unknown operators {sorted(unknown)}; known: {OPERATORS}", file=sys.stderr)
        return 2
    docs = load(a.rendered)
    f = Failures()

    deployments = {component(d): d for d in docs if d["kind"] == "Deployment"}
    f.check(sorted(deployments) == sorted(enabled),
            f"Deployments rendered for {sorted(deployments)}, expected exactly {sorted(enabled)}")
    for op in set(OPERATORS) - set(enabled):
        leftovers = [f"{d['kind']}/{d['metadata']['name']}" for d in docs if component(d) == op]
        f.check(not leftovers, f"{op} is disabled but renders {leftovers}")
    for d in deployments.values():
        check_deployment(d, docs, f)
    g = check_rbac(docs, enabled, a.release_namespace, a.argocd_namespace,
                   a.revert_identity_namespace or a.release_namespace, f)
    check_crd_names(docs, g, f)
    check_decision_configmap(docs, enabled, a.argocd_namespace, f)
    check_owned_route_policy(docs, enabled, a.route_owner_annotation, f)
    for expected in a.expect_arg:
        op, _, arg = expected.partition("=")
        check_expected_arg(deployments, op, arg, f)

    if a.rbac_table:
        lines = sorted(f"{who} {line}" for who, items in g.items() for line in items)
        if a.write:
            with open(a.rbac_table, "w", encoding="utf-8") as out:
                out.write("# Every permission the chart grants with default values (release t, namespace "
                          f"{a.release_namespace}).\n# subject scope apiGroup resource verb resourceNames\n")
                out.write("\n".join(lines) + "\n")
            print(f"chart_assert: wrote {len(lines)} grants to {a.rbac_table}")
        else:
            with open(a.rbac_table, encoding="utf-8") as t:
                want = [l.rstrip("\n") for l in t if l.strip() and not l.startswith("#")]
            added = sorted(set(lines) - set(want))
            removed = sorted(set(want) - set(lines))
            for l in added:
                f.items.append(f"RBAC grant not in {a.rbac_table}: + {l}")
            for l in removed:
                f.items.append(f"RBAC grant in {a.rbac_table} but not rendered: - {l}")
            if added or removed:
                f.items.append("a deliberate RBAC change is recorded with: bash scripts/chart-check.sh --write-rbac-table")

    if f.items:
        for m in f.items:
            print(f"FAIL {a.rendered}: {m}", file=sys.stderr)
        return 1
    print(f"ok: {a.rendered}: {len(deployments)} operator(s) {sorted(deployments)}, "
          f"{sum(len(v) for v in g.values())} grants checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
