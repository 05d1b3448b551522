#!/usr/bin/env bash
# `make deb`: the two Debian packages, into build/deb/:
#   vtismd_<version>_amd64.deb          the host daemon (cargo-deb; crates/vtism/Cargo.toml has
#                                       its contents), with man pages and shell completions that
#                                       `vtism package-assets` generates from the CLI definitions
#   vtism-guest-dkms_<version>_all.deb  the guest module's DKMS source package (guest/module/mkdeb.sh)
# Needs cargo-deb (scripts/install-deps.sh deb installs it). Prints the two paths.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
out=$repo/build/deb
log() { echo "build-debs: $*" >&2; }

cargo deb --version >/dev/null 2>&1 || {
	log "cargo-deb is missing: scripts/install-deps.sh deb"
	exit 1
}
nice -n 5 cargo build --release -q -p vtism
target=${CARGO_TARGET_DIR:-$repo/target}
assets=$target/release/package-assets
rm -rf "$assets"
"$target/release/vtism" package-assets --out "$assets"
gzip -9n "$assets"/man/*.1
mkdir -p "$out"
rm -f "$out"/vtismd_*.deb
# Stripped: the release profile keeps line tables for profiling, 40 MB an operator does not need.
deb=$(cargo deb -p vtism --no-build --strip --output "$out" 2>&1 | tail -1)
[ -f "$deb" ] || {
	log "cargo deb did not produce a package: $deb"
	exit 1
}
log "$(dpkg-deb -f "$deb" Package Version Depends | tr '\n' ' ')"
echo "$deb"
guest/module/mkdeb.sh "$out"
