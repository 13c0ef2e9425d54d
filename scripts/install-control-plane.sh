#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tier-3 tests run on (DESIGN.md, "Test strategy"):
# kube-apiserver, kube-controller-manager and kubectl from the Go module k8s.io/kubernetes, and
# etcd from go.etcd.io/etcd/server/v3, at the pins below.
#
#   bash scripts/install-control-plane.sh
#
# Needs Go (the version k8s.io/kubernetes's go.mod names, or a newer one) and the Go module proxy
# configured in `go env`; nothing else. The binaries are cached outside the clone, keyed by the
# pins, in
#   ${SLUICE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}/control-plane-<k8s>-etcd-<etcd>/bin
# and linked into <repo>/.tools/bin (gitignored), so a fresh clone on the same machine builds
# nothing: a second run only checks the cache and relinks.
#
# Why not `go install k8s.io/kubernetes/cmd/kube-apiserver@v1.37.2`: k8s.io/kubernetes's go.mod
# replaces every k8s.io/* staging module by a directory of its own tree, and `go install pkg@v`
# refuses a main module with replace directives. So the script generates a wrapper module in a
# temporary directory that requires k8s.io/kubernetes and replaces each staging module by its
# published twin (k8s.io/api => k8s.io/api v0.37.2, ...), the list generated from the release's own
# go.mod; the wrapper copies the release's `go` and `godebug` lines so the binaries behave as the
# released ones. The version ldflags are those of hack/lib/version.sh, so /version reports v1.37.2
# (not v0.0.0-master, which the chart's kubeVersion check would refuse). etcd gets a wrapper module
# of its own (server/v3's go.mod has replace directives too, for its sibling modules).
#
# Pins: etcd is the version build/dependencies.yaml of that Kubernetes release names ("etcd");
# bump both together and check it there.
#
# Cold build on 2 cores shared with other work (empty Go build cache; etcd, kube-apiserver,
# kube-controller-manager, kubectl): 928 s, 15.5 minutes, measured with `time` (real 15m29s, user
# 14m05s); most modules were downloaded during it. A warm run (binaries cached): under a second.
#
# Thanos (github.com/thanos-io/thanos, cmd/thanos: sidecar, query) is built the same way into a
# cache directory of its own, thanos-<version>: its go.mod's replace directives all name published
# modules at versions, so the wrapper copies them verbatim; it is built with the release's tags
# (THANOS_TAGS). It needs Go 1.26.10 (GOTOOLCHAIN, as
# above). Cold (empty Go build cache, its modules not yet downloaded, 2 cores shared with a cargo
# build): 512 s, 8.5 minutes (user 357 s). SLUICE_SKIP_THANOS=1 builds the control plane alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="$ROOT/.tools/bin"

K8S_VERSION="v1.37.2"
# The chart's kubeVersion floor (charts/sluice/Chart.yaml: >=1.33.0-0): a kube-apiserver of that
# minor is built too, so the CRD and admission-policy tests run on it as well
# (SLUICE_KUBE_APISERVER; suite `floor` of scripts/test.sh). Cold: 435 s of CPU (920 s wall on 2
# cores shared with two other builds); linked as .tools/bin/kube-apiserver-<version>.
# SLUICE_SKIP_FLOOR=1 skips it.
K8S_FLOOR_VERSION="v1.33.13"
ETCD_VERSION="v3.7.0"   # build/dependencies.yaml of Kubernetes v1.37.2: etcd 3.7.0
THANOS_VERSION="v0.42.5"
# cosign (github.com/sigstore/cosign/v3, cmd/cosign): the interop tests of sluice-bundle sign with
# the real CLI (key-based, the sigstore bundle format as referrer and the legacy .sig tag). Cold
# (its modules not yet downloaded, the Go build cache holding the control plane's builds, 2 cores
# shared with cargo builds): 351 s (the whole script run: real 5m50s, user 4m45s).
# SLUICE_SKIP_COSIGN=1 skips it.
COSIGN_VERSION="v3.1.3"
# The build tags of Thanos's release build (.promu.yml, build.tags.all). slicelabels is not
# optional: Thanos converts Prometheus label sets to its protobuf labels without copying, which
# holds only for the slice implementation; without the tag the sidecar panics on its first
# Store API answer (`makeslice: len out of range`). The script checks the module's .promu.yml.
THANOS_TAGS="netgo,slicelabels"
K8S_COMPONENTS=(kube-apiserver kube-controller-manager kubectl)
BINARIES=("${K8S_COMPONENTS[@]}" etcd)

CACHE_ROOT="${SLUICE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}"
CACHE_DIR="$CACHE_ROOT/control-plane-$K8S_VERSION-etcd-$ETCD_VERSION"
STAMP="$CACHE_DIR/bin/.complete"
THANOS_CACHE_DIR="$CACHE_ROOT/thanos-$THANOS_VERSION-${THANOS_TAGS//,/-}"
COSIGN_CACHE_DIR="$CACHE_ROOT/cosign-$COSIGN_VERSION"

log() { printf 'install-control-plane: %s\n' "$*"; }
die() { printf 'install-control-plane: error: %s\n' "$*" >&2; exit 1; }

link_binaries() {
  mkdir -p "$BIN_DIR"
  local b
  for b in "${BINARIES[@]}"; do
    ln -sfn "$CACHE_DIR/bin/$b" "$BIN_DIR/$b"
  done
  log "linked ${BINARIES[*]} into $BIN_DIR"
}

cached() {
  [ -f "$STAMP" ] || return 1
  local b
  for b in "${BINARIES[@]}"; do
    [ -x "$CACHE_DIR/bin/$b" ] || return 1
  done
}

module_dir() {
  # go mod download -json prints "Dir": "/path"; no jq needed.
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

# Prints the `go` line and every `godebug` line or block of a go.mod.
go_and_godebug_lines() {
  awk '
    /^go [0-9]/ { print; next }
    /^godebug \(/ { inblock = 1; print; next }
    inblock { print; if ($0 ~ /^\)/) inblock = 0; next }
    /^godebug / { print }
  ' "$1"
}

# Prints `path => path vX` for every k8s.io module the release's go.mod replaces by a directory
# of its own tree (the staging modules), at the staging version matching the release.
staging_replacements() {
  local gomod="$1" staging_version="$2"
  awk -v v="$staging_version" '
    $1 ~ /^k8s\.io\// && $2 == "=>" && $3 ~ /^\.\/staging\// { printf "\t%s => %s %s\n", $1, $1, v }
  ' "$gomod"
}

# 1.37.2 -> 1 37 ; Go's version comparison for the toolchain check.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }

build_kubernetes() {
  local work="$1" src staging_version go_line commit build_date ldflags
  log "downloading k8s.io/kubernetes@$K8S_VERSION"
  src="$(module_dir "k8s.io/kubernetes@$K8S_VERSION")"
  [ -n "$src" ] && [ -f "$src/go.mod" ] || die "go mod download k8s.io/kubernetes@$K8S_VERSION gave no module directory"

  staging_version="v0.${K8S_VERSION#v1.}"
  go_line="$(awk '/^go [0-9]/ { print $2; exit }' "$src/go.mod")"
  select_toolchain "$go_line"

  mkdir -p "$work/k8s"
  {
    echo "module sluice.invalid/control-plane"
    echo
    go_and_godebug_lines "$src/go.mod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    staging_replacements "$src/go.mod" "$staging_version"
    echo ")"
    echo
    echo "tool ("
    local c
    for c in "${K8S_COMPONENTS[@]}"; do echo "	k8s.io/kubernetes/cmd/$c"; done
    echo ")"
  } >"$work/k8s/go.mod"
  local n
  n="$(grep -c ' => ' "$work/k8s/go.mod" || true)"
  [ "$n" -gt 0 ] || die "no staging replace directives found in $src/go.mod"
  log "wrapper module: $n staging modules replaced by their $staging_version releases"

  (cd "$work/k8s" && go mod tidy) || die "go mod tidy of the Kubernetes wrapper module failed (see above)"

  # hack/lib/version.sh's ldflags, for both version packages.
  commit="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]*\)".*/\1/p' | head -n 1)"
  build_date="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"Time": "\(.*\)",\{0,1\}$/\1/p' | head -n 1)"
  local minor="${K8S_VERSION#v1.}"
  minor="${minor%%.*}"
  ldflags="-s -w"
  local pkg
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=${build_date:-1970-01-01T00:00:00Z}"
    [ -n "$commit" ] && ldflags+=" -X $pkg.gitCommit=$commit"
  done

  for c in "${K8S_COMPONENTS[@]}"; do
    log "building $c $K8S_VERSION"
    (cd "$work/k8s" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$work/out/$c" "k8s.io/kubernetes/cmd/$c") \
      || die "go build of $c failed (see above)"
  done
}

build_etcd() {
  local work="$1" src
  log "downloading go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  src="$(module_dir "go.etcd.io/etcd/server/v3@$ETCD_VERSION")"
  [ -n "$src" ] && [ -f "$src/main.go" ] || die "go mod download go.etcd.io/etcd/server/v3@$ETCD_VERSION gave no main package"
  select_toolchain "$(awk '/^go [0-9]/ { print $2; exit }' "$src/go.mod")"
  mkdir -p "$work/etcd"
  {
    echo "module sluice.invalid/etcd"
    echo
    go_and_godebug_lines "$src/go.mod"
    echo
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo
    echo "tool go.etcd.io/etcd/server/v3"
  } >"$work/etcd/go.mod"
  (cd "$work/etcd" && go mod tidy) || die "go mod tidy of the etcd wrapper module failed (see above)"
  log "building etcd $ETCD_VERSION"
  (cd "$work/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/out/etcd" go.etcd.io/etcd/server/v3) \
    || die "go build of etcd failed (see above)"
}

# Uses the local Go unless a module needs a newer one; then names the toolchain that module
# needs (Go fetches it through the configured module proxy).
select_toolchain() {
  local need="$1" have
  have="$(go env GOVERSION)"
  have="${have#go}"
  if version_ge "$have" "$need"; then
    return
  fi
  log "local Go $have is older than the $need a module needs: GOTOOLCHAIN=go$need"
  export GOTOOLCHAIN="go$need"
}

build_thanos() {
  local work="$1" src replaces
  log "downloading github.com/thanos-io/thanos@$THANOS_VERSION"
  # The module's go.mod may need a newer Go than the local one: read it from the download cache
  # (the .mod file comes before the zip) and pick the toolchain first.
  local gomod
  gomod="$(go mod download -json "github.com/thanos-io/thanos@$THANOS_VERSION" 2>/dev/null | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [ -n "$gomod" ] && [ -f "$gomod" ] || die "go mod download github.com/thanos-io/thanos@$THANOS_VERSION gave no go.mod"
  select_toolchain "$(awk '/^go [0-9]/ { print $2; exit }' "$gomod")"
  src="$(module_dir "github.com/thanos-io/thanos@$THANOS_VERSION")"
  [ -n "$src" ] && [ -f "$src/go.mod" ] || die "go mod download github.com/thanos-io/thanos@$THANOS_VERSION gave no module directory"
  # Its replace directives, verbatim: each must name a published module at a version (a
  # directory of its own tree could not be fetched).
  replaces="$(awk '/^replace \(/ { inblock = 1; next } inblock && /^\)/ { inblock = 0; next } inblock && / => / { print } /^replace [^(]/ { sub(/^replace /, ""); print }' "$src/go.mod")"
  if printf '%s\n' "$replaces" | grep -Eq '=> *\.{1,2}/'; then
    die "github.com/thanos-io/thanos@$THANOS_VERSION replaces a module by a directory of its own tree; a wrapper module cannot reproduce that"
  fi
  local tags
  tags="$(awk '/^  tags:/ { t = 1; next } t && /^    all:/ { a = 1; next } a && /^      - / { printf "%s%s", sep, $2; sep = "," ; next } a { exit }' "$src/.promu.yml" 2>/dev/null)"
  [ "$tags" = "$THANOS_TAGS" ] \
    || die "github.com/thanos-io/thanos@$THANOS_VERSION builds with tags '$tags' (.promu.yml), this script with '$THANOS_TAGS': update THANOS_TAGS"
  mkdir -p "$work/thanos"
  {
    echo "module sluice.invalid/thanos"
    echo
    go_and_godebug_lines "$src/go.mod"
    echo
    echo "require github.com/thanos-io/thanos $THANOS_VERSION"
    echo
    echo "replace ("
    printf '%s\n' "$replaces"
    echo ")"
    echo
    echo "tool github.com/thanos-io/thanos/cmd/thanos"
  } >"$work/thanos/go.mod"
  log "thanos wrapper module: $(printf '%s\n' "$replaces" | grep -c ' => ') replace directives copied"
  (cd "$work/thanos" && go mod tidy) || die "go mod tidy of the Thanos wrapper module failed (see above)"
  local v="${THANOS_VERSION#v}" pkg=github.com/prometheus/common/version
  log "building thanos $THANOS_VERSION"
  (cd "$work/thanos" && CGO_ENABLED=0 go build -trimpath -tags "$THANOS_TAGS" \
    -ldflags "-s -w -X $pkg.Version=$v -X $pkg.Branch=release-$v -X $pkg.BuildUser=install-control-plane" \
    -o "$work/out-thanos/thanos" github.com/thanos-io/thanos/cmd/thanos) \
    || die "go build of thanos failed (see above)"
}

install_thanos() {
  if [ -x "$THANOS_CACHE_DIR/bin/thanos" ] && [ -f "$THANOS_CACHE_DIR/bin/.complete" ]; then
    log "cached: $THANOS_CACHE_DIR (thanos $THANOS_VERSION, tags $THANOS_TAGS); nothing to build"
  else
    local work started=$SECONDS
    work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-thanos.XXXXXX")"
    # shellcheck disable=SC2064 # expanded now: $work is local here
    trap "rm -rf '$work'" EXIT
    mkdir -p "$work/out-thanos"
    build_thanos "$work"
    mkdir -p "$THANOS_CACHE_DIR"
    rm -rf "$THANOS_CACHE_DIR/bin.new"
    mv "$work/out-thanos" "$THANOS_CACHE_DIR/bin.new"
    printf 'thanos %s tags %s\n' "$THANOS_VERSION" "$THANOS_TAGS" >"$THANOS_CACHE_DIR/bin.new/.complete"
    rm -rf "$THANOS_CACHE_DIR/bin"
    mv "$THANOS_CACHE_DIR/bin.new" "$THANOS_CACHE_DIR/bin"
    log "built thanos in $((SECONDS - started)) s into $THANOS_CACHE_DIR/bin"
  fi
  mkdir -p "$BIN_DIR"
  ln -sfn "$THANOS_CACHE_DIR/bin/thanos" "$BIN_DIR/thanos"
  log "linked thanos into $BIN_DIR"
}

# cosign's go.mod has no replace directives, so `go install module/cmd@version` builds it as
# released; the version ldflags are those of its Makefile, so `cosign version` names the pin.
install_cosign() {
  if [ -x "$COSIGN_CACHE_DIR/bin/cosign" ] && [ -f "$COSIGN_CACHE_DIR/bin/.complete" ]; then
    log "cached: $COSIGN_CACHE_DIR (cosign $COSIGN_VERSION); nothing to build"
  else
    command -v go >/dev/null 2>&1 \
      || die "go not found: cosign is built from its Go module; install Go 1.26 or newer and put it on PATH"
    local started=$SECONDS gomod pkg=sigs.k8s.io/release-utils/version
    log "downloading github.com/sigstore/cosign/v3@$COSIGN_VERSION"
    gomod="$(go mod download -json "github.com/sigstore/cosign/v3@$COSIGN_VERSION" 2>/dev/null | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [ -n "$gomod" ] && [ -f "$gomod" ] || die "go mod download github.com/sigstore/cosign/v3@$COSIGN_VERSION gave no go.mod"
    select_toolchain "$(awk '/^go [0-9]/ { print $2; exit }' "$gomod")"
    if grep -q '^replace' "$gomod"; then
      die "github.com/sigstore/cosign/v3@$COSIGN_VERSION has replace directives; go install cannot build it"
    fi
    rm -rf "$COSIGN_CACHE_DIR/bin.new"
    mkdir -p "$COSIGN_CACHE_DIR/bin.new"
    log "building cosign $COSIGN_VERSION"
    CGO_ENABLED=0 GOBIN="$COSIGN_CACHE_DIR/bin.new" go install -trimpath \
      -ldflags "-s -w -X $pkg.gitVersion=$COSIGN_VERSION -X $pkg.gitTreeState=clean" \
      "github.com/sigstore/cosign/v3/cmd/cosign@$COSIGN_VERSION" \
      || die "go install of cosign failed (see above)"
    printf 'cosign %s\n' "$COSIGN_VERSION" >"$COSIGN_CACHE_DIR/bin.new/.complete"
    rm -rf "$COSIGN_CACHE_DIR/bin"
    mv "$COSIGN_CACHE_DIR/bin.new" "$COSIGN_CACHE_DIR/bin"
    log "built cosign in $((SECONDS - started)) s into $COSIGN_CACHE_DIR/bin"
  fi
  mkdir -p "$BIN_DIR"
  ln -sfn "$COSIGN_CACHE_DIR/bin/cosign" "$BIN_DIR/cosign"
  log "linked cosign into $BIN_DIR"
}

install_floor_apiserver() {
  local dir="$CACHE_ROOT/kube-apiserver-$K8S_FLOOR_VERSION"
  if [ -x "$dir/bin/kube-apiserver" ] && [ -f "$dir/bin/.complete" ]; then
    log "cached: $dir (kube-apiserver $K8S_FLOOR_VERSION); nothing to build"
  else
    local work started=$SECONDS
    work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-floor.XXXXXX")"
    # shellcheck disable=SC2064 # expanded now: $work is local here
    trap "rm -rf '$work'" EXIT
    mkdir -p "$work/out"
    K8S_VERSION="$K8S_FLOOR_VERSION"
    K8S_COMPONENTS=(kube-apiserver)
    build_kubernetes "$work"
    mkdir -p "$dir"
    rm -rf "$dir/bin.new"
    mv "$work/out" "$dir/bin.new"
    printf 'kube-apiserver %s\n' "$K8S_FLOOR_VERSION" >"$dir/bin.new/.complete"
    rm -rf "$dir/bin"
    mv "$dir/bin.new" "$dir/bin"
    log "built kube-apiserver $K8S_FLOOR_VERSION in $((SECONDS - started)) s into $dir/bin"
  fi
  mkdir -p "$BIN_DIR"
  ln -sfn "$dir/bin/kube-apiserver" "$BIN_DIR/kube-apiserver-$K8S_FLOOR_VERSION"
  log "linked kube-apiserver-$K8S_FLOOR_VERSION into $BIN_DIR"
}

main() {
  # Each in a subshell: its toolchain choice, version globals and EXIT trap stay its own.
  if [ "${SLUICE_SKIP_FLOOR:-0}" != 1 ]; then
    (install_floor_apiserver) || exit 1
  fi
  if [ "${SLUICE_SKIP_COSIGN:-0}" != 1 ]; then
    (install_cosign) || exit 1
  fi
  if [ "${SLUICE_SKIP_THANOS:-0}" != 1 ]; then
    (install_thanos) || exit 1
  fi
  if cached; then
    log "cached: $CACHE_DIR (kubernetes $K8S_VERSION, etcd $ETCD_VERSION); nothing to build"
    link_binaries
    return
  fi
  command -v go >/dev/null 2>&1 \
    || die "go not found: the control plane is built from Go modules; install Go 1.26 or newer (e.g. apt-get install golang-1.26, or the tarball from the Go project) and put it on PATH"

  local work
  work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-control-plane.XXXXXX")"
  # shellcheck disable=SC2064 # expanded now: $work is local to main
  trap "rm -rf '$work'" EXIT
  mkdir -p "$work/out"
  local started=$SECONDS
  build_etcd "$work"
  build_kubernetes "$work"

  mkdir -p "$CACHE_DIR"
  rm -rf "$CACHE_DIR/bin.new"
  mv "$work/out" "$CACHE_DIR/bin.new"
  printf 'kubernetes %s\netcd %s\n' "$K8S_VERSION" "$ETCD_VERSION" >"$CACHE_DIR/bin.new/.complete"
  rm -rf "$CACHE_DIR/bin"
  mv "$CACHE_DIR/bin.new" "$CACHE_DIR/bin"
  log "built ${BINARIES[*]} in $((SECONDS - started)) s into $CACHE_DIR/bin"
  link_binaries
  "$BIN_DIR/kube-apiserver" --version
  "$BIN_DIR/etcd" --version | head -n 1
}

main "$@"
