#!/usr/bin/env bash
# Runs the scenarios that need only the Kubernetes API and metrics against the kind cluster of
# up.sh. Each scenario has a time budget; the run prints one line per scenario and exits non-zero
# if any failed.
#
#   bash e2e/kind/run.sh [SCENARIO...]     # default: all, in this order:
#
#   operators-ready      every operator Deployment available, one Lease holder each, and
#                        Prometheus scraping `sluice_leader == 1` from exactly one pod per operator
#   rbac-table           every grant of charts/sluice/ci/rbac-table.txt is allowed by the real
#                        API server (`kubectl auth can-i --as`), and grants outside it are refused
#   owned-route-policy   the ValidatingAdmissionPolicy denies a change to an owned route's rules,
#                        lets a no-op apply through, and lets rollout-weights change them
#   plugin               a Rollout is reconciled (status for its generation), `kubectl sluice
#                        status` prints its tree and `kubectl sluice pause` sets spec.paused
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need kubectl
PLUGIN="${SLUICE_PLUGIN:-}"
if [ -z "$PLUGIN" ]; then
  if command -v kubectl-sluice >/dev/null 2>&1; then PLUGIN="$(command -v kubectl-sluice)"; else
    need cargo
    cargo build -q -p kubectl-sluice --manifest-path "$REPO/Cargo.toml"
    PLUGIN="${CARGO_TARGET_DIR:-$REPO/target}/debug/kubectl-sluice"
  fi
fi
export SLUICE_PLUGIN="$PLUGIN"

declare -A BUDGET=([operators-ready]=240 [rbac-table]=300 [owned-route-policy]=60 [plugin]=180)
SCENARIOS=("$@")
[ "${#SCENARIOS[@]}" -gt 0 ] || SCENARIOS=(operators-ready rbac-table owned-route-policy plugin)
failed=0
for s in "${SCENARIOS[@]}"; do
  [ -n "${BUDGET[$s]:-}" ] || { echo "unknown scenario $s (known: ${!BUDGET[*]})" >&2; exit 2; }
  say "scenario $s (budget ${BUDGET[$s]}s)"
  start=$SECONDS
  # Each scenario runs in its own shell; `timeout` stops it when its budget is spent.
  if timeout --kill-after=10 "${BUDGET[$s]}" \
    bash -c 'source "$1/lib.sh"; source "$1/scenarios.sh"; "scenario_${2//-/_}"' _ "$E2E_DIR" "$s"; then
    echo "ok   $s ($((SECONDS - start))s)"
  else
    echo "FAIL $s ($((SECONDS - start))s)"; failed=1
  fi
done
exit "$failed"
