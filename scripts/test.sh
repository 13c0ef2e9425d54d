#!/usr/bin/env bash
# The test command of sluice:
#
#   bash scripts/test.sh
#
# Runs every suite (Rust unit, integration and doc tests of the whole workspace, then the Helm
# chart checks), keeps going after a failing suite so one run shows every failure, prints a
# summary, and exits non-zero if any suite failed. Benchmarks are never run here.
#
# Needs the tools of scripts/install-tools.sh (prometheus, docker-registry, helm,
# kubernetes-validate); .tools/bin is put on PATH.
#
# Environment:
#   SLUICE_TEST_ONLY     run only these suites (space-separated: cargo chart)
#   SLUICE_TEST_TIMEOUT  seconds the cargo suite may take before it is stopped (default 4200)
#   CARGO_TARGET_DIR     honoured as usual
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
export PATH="$ROOT/.tools/bin:$PATH"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

ONLY="${SLUICE_TEST_ONLY:-cargo chart}"
CARGO_TIMEOUT="${SLUICE_TEST_TIMEOUT:-4200}"

names=()
results=()
durations=()

run_suite() {
  local name="$1"; shift
  case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac
  printf '\n=== test.sh: suite %s: %s\n' "$name" "$*"
  local start rc=0
  start=$(date +%s)
  "$@" || rc=$?
  names+=("$name")
  durations+=("$(( $(date +%s) - start ))")
  if [ "$rc" -eq 0 ]; then
    results+=("passed")
  elif [ "$rc" -eq 124 ]; then
    results+=("FAILED (timed out)")
  else
    results+=("FAILED (exit $rc)")
  fi
}

run_suite cargo timeout --signal=TERM --kill-after=30 "$CARGO_TIMEOUT" \
  cargo test --workspace --locked --no-fail-fast
run_suite chart bash scripts/chart-check.sh

passed=0
failed=0
printf '\n=== test.sh: summary\n'
for i in "${!names[@]}"; do
  printf '  %-8s %-22s %5ss\n' "${names[$i]}" "${results[$i]}" "${durations[$i]}"
  if [ "${results[$i]}" = "passed" ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
if [ "${#names[@]}" -eq 0 ]; then
  echo "test.sh: SLUICE_TEST_ONLY='$ONLY' names no suite (known: cargo chart)" >&2
  exit 2
fi
printf 'suites: %d passed, %d failed\n' "$passed" "$failed"
[ "$failed" -eq 0 ]
