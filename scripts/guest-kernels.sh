#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Fetch the two Debian 12 guest kernels vtism_guest is built and tested against:
# the 6.1 LTS (bookworm's default) and the 6.12 backport kernel.
#
# For each series it apt-get installs linux-headers-<ver> (the kbuild tree the module builds
# against) and downloads + extracts linux-image-<ver>-unsigned (vmlinuz and modules, never
# installed on this machine) into a cache directory. Idempotent: a series already in the cache
# whose headers are still installed is reused as is.
#
# Usage: scripts/guest-kernels.sh [--print] [6.1|6.12 ...]
#   default series: 6.1 6.12
#   --print   only print the cached environment (fails if something is missing)
# Env:
#   VTISM_KCACHE           cache dir (default: <repo>/build/guest-kernels)
#   VTISM_KVER_6_1         pin a version, e.g. 6.1.0-56-amd64
#   VTISM_KVER_6_12        pin a version, e.g. 6.12.117+deb12-amd64
#   VTISM_KERNELS_REFRESH  1 = ignore the cache and resolve the newest version again
#
# Output: <cache>/<series>/env, a shell fragment with KVER, KDIR, VMLINUZ, MODDIR
# (MODDIR is the extracted lib/modules/<ver>).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${VTISM_KCACHE:-$repo/build/guest-kernels}
print_only=0
series=()
for a in "$@"; do
	case $a in
	--print) print_only=1 ;;
	6.1 | 6.12) series+=("$a") ;;
	*)
		echo "usage: $0 [--print] [6.1|6.12 ...]" >&2
		exit 2
		;;
	esac
done
[ ${#series[@]} -gt 0 ] || series=(6.1 6.12)

log() { echo "guest-kernels: $*" >&2; }

apt_updated=0
apt_update_once() {
	if [ $apt_updated = 0 ]; then
		log "apt-get update"
		apt-get update -qq >&2
		apt_updated=1
	fi
}

# Newest header package version of a series, e.g. 6.1.0-56-amd64.
resolve_version() {
	local s=$1 pat names
	case $s in
	6.1) pat='^linux-headers-6\.1\.0-[0-9]+-amd64$' ;;
	6.12) pat='^linux-headers-6\.12\.[0-9]+\+deb12-amd64$' ;;
	esac
	names=$(apt-cache pkgnames linux-headers-"$s" 2>/dev/null | grep -E "$pat" || true)
	if [ -z "$names" ]; then
		apt_update_once
		names=$(apt-cache pkgnames linux-headers-"$s" | grep -E "$pat" || true)
	fi
	[ -n "$names" ] || {
		log "no linux-headers package for $s in apt"
		return 1
	}
	echo "$names" | sed 's/^linux-headers-//' | sort -V | tail -n1
}

cached_ok() {
	local envf=$1
	[ -f "$envf" ] || return 1
	(
		# shellcheck disable=SC1090
		. "$envf"
		[ -f "$KDIR/Makefile" ] && [ -f "$VMLINUZ" ] && [ -d "$MODDIR/kernel" ]
	)
}

fetch_series() {
	local s=$1 dir=$cache/$1 envf=$cache/$1/env ver pin img tmp
	if [ "${VTISM_KERNELS_REFRESH:-0}" != 1 ] && cached_ok "$envf"; then
		log "$s: cached ($(. "$envf" && echo "$KVER"))"
		return 0
	fi
	[ $print_only = 0 ] || {
		log "$s: not in $cache; run $0 $s"
		return 1
	}
	pin=VTISM_KVER_${s//./_}
	ver=${!pin:-}
	[ -n "$ver" ] || ver=$(resolve_version "$s")
	log "$s: $ver"

	if [ ! -f /usr/src/linux-headers-"$ver"/Makefile ]; then
		log "apt-get install linux-headers-$ver"
		if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			linux-headers-"$ver" >&2; then
			apt_update_once
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				linux-headers-"$ver" >&2
		fi
	fi

	# The unsigned image has the same vmlinuz and modules as the signed one, minus signatures.
	img=linux-image-$ver-unsigned
	apt-cache show "$img" >/dev/null 2>&1 || img=linux-image-$ver
	tmp=$(mktemp -d "$cache/.dl.XXXXXX")
	(cd "$tmp" && apt-get download -qq "$img" >&2) || {
		apt_update_once
		(cd "$tmp" && apt-get download -qq "$img" >&2)
	}
	rm -rf "$dir"
	mkdir -p "$dir"
	dpkg -x "$tmp"/*.deb "$dir/root"
	rm -rf "$tmp"
	[ -f "$dir/root/boot/vmlinuz-$ver" ] || {
		log "$img has no /boot/vmlinuz-$ver"
		return 1
	}
	cat >"$envf" <<EOF
KVER=$ver
KDIR=/usr/src/linux-headers-$ver
VMLINUZ=$dir/root/boot/vmlinuz-$ver
MODDIR=$dir/root/lib/modules/$ver
EOF
	cached_ok "$envf"
}

mkdir -p "$cache"
for s in "${series[@]}"; do
	fetch_series "$s"
done
for s in "${series[@]}"; do
	echo "# $s"
	cat "$cache/$s/env"
done
