# Shared helpers of the kind end-to-end scripts (sourced, not run).
# shellcheck disable=SC2034  # the settings below are read by the scripts that source this file
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$E2E_DIR/../.." && pwd)"
CLUSTER="${SLUICE_KIND_CLUSTER:-sluice-e2e}"
CONTEXT="kind-$CLUSTER"
RELEASE="${SLUICE_RELEASE:-sluice}"
NS="${SLUICE_NAMESPACE:-sluice-system}"
IMAGE="${SLUICE_IMAGE:-sluice:e2e}"
UPSTREAM="${SLUICE_UPSTREAM:-$REPO/.tools/crds}"
export PATH="$REPO/.tools/bin:$PATH"

k() { kubectl --context "$CONTEXT" "$@"; }

say() { printf '\n== %s\n' "$*"; }

need() { # need TOOL...: exit with the reason when one is missing
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || { echo "kind e2e: '$t' is not installed; it is needed here" >&2; exit 2; }
  done
}

# wait_for SECONDS DESCRIPTION COMMAND...: retries COMMAND every second until it succeeds or the
# budget is spent (then fails with DESCRIPTION).
wait_for() {
  local budget="$1" what="$2"; shift 2
  local deadline=$((SECONDS + budget))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "timed out after ${budget}s waiting for: $what" >&2
      "$@" || true
      return 1
    fi
    sleep 1
  done
}
