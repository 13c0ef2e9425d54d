#!/usr/bin/env bash
# Fills the krew manifest template of kubectl-sluice (crates/kubectl-sluice/krew/sluice.yaml.in)
# for a release: the version, and for every platform the archive's URI and sha256.
#
#   bash scripts/krew-manifest.sh VERSION BASE_URL DIST_DIR [HOMEPAGE] > sluice.yaml
#
# VERSION   the release, `v` + semver (e.g. v0.2.0);
# BASE_URL  where the release archives are downloadable (https://...), without a trailing /;
# DIST_DIR  the directory holding the archives kubectl-sluice_<VERSION>_<os>_<arch>.tar.gz
#           (each with the executable `kubectl-sluice` at its root), one per
#           platform of PLATFORMS below; a missing archive is an error.
# HOMEPAGE  the project's page (default: BASE_URL).
#
# Build each archive with `cargo build --release -p kubectl-sluice --target <triple>`; the
# sha256 is computed here from the archive itself, so the manifest always matches the bytes
# published at BASE_URL.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TEMPLATE="$ROOT/crates/kubectl-sluice/krew/sluice.yaml.in"
# os/arch pairs krew selects on (its selector labels are Go's GOOS/GOARCH).
PLATFORMS=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64)

die() { printf 'krew-manifest: error: %s\n' "$*" >&2; exit 1; }

[ "$#" -ge 3 ] || die "usage: $0 VERSION BASE_URL DIST_DIR [HOMEPAGE]"
version="$1"
base="${2%/}"
dist="$3"
homepage="${4:-$base}"
[[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] \
  || die "VERSION $version is not v<major>.<minor>.<patch>: krew needs a v-prefixed semantic version"
[[ "$base" == https://* ]] || die "BASE_URL $base is not https://: krew downloads archives over https"
[ -d "$dist" ] || die "DIST_DIR $dist is not a directory"

platforms=""
for p in "${PLATFORMS[@]}"; do
  os="${p%/*}"
  arch="${p#*/}"
  archive="kubectl-sluice_${version}_${os}_${arch}.tar.gz"
  [ -f "$dist/$archive" ] || die "$dist/$archive is missing: build and pack the $os/$arch release first"
  tar -tzf "$dist/$archive" | grep -qx 'kubectl-sluice' \
    || die "$archive has no kubectl-sluice at its root"
  sha="$(sha256sum "$dist/$archive" | cut -d' ' -f1)"
  platforms+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $base/$archive
    sha256: $sha
    bin: kubectl-sluice
    files:
      - from: kubectl-sluice
        to: .
"
done

while IFS= read -r line; do
  case "$line" in
    "@PLATFORMS@") printf '%s' "$platforms" ;;
    *)
      line="${line//@VERSION@/$version}"
      printf '%s\n' "${line//@HOMEPAGE@/$homepage}"
      ;;
  esac
done <"$TEMPLATE"
