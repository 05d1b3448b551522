#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Fetch the two Debian 12 guest kernels vtism_guest is built and tested against:
# the 6.1 LTS (bookworm's default) and the 6.12 backport kernel.
#
# For each series it downloads (apt-get download) and extracts (dpkg -x) into a cache directory,
# never installing anything: linux-image-<ver>-unsigned (vmlinuz and modules), and the kbuild
# tree the module builds against: linux-headers-<ver>, its -common package and linux-kbuild-*.
# They are extracted into one root per series, so the headers' relative symlinks (scripts, tools
# -> ../../lib/linux-kbuild-*) resolve inside it; the two absolute references Debian's packages
# carry are rewritten to the extracted tree: the `include /usr/src/linux-headers-*-common/Makefile`
# of the arch headers' Makefile, and lib/modules/<ver>/{build,source}. Building needs the tools
# the headers packages depend on (gcc-12, pahole for 6.12's BTF; scripts/install-deps.sh test).
# Idempotent: a series already in the cache is reused as is.
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
# Output: <cache>/<series>/env, a shell fragment with KVER, KDIR (the extracted
# usr/src/linux-headers-<ver>), VMLINUZ, MODDIR (the extracted lib/modules/<ver>).
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
		case $KDIR in "$(dirname "$envf")"/*) ;; *) exit 1 ;; esac
		[ -f "$KDIR/Makefile" ] && [ -f "$VMLINUZ" ] && [ -d "$MODDIR/kernel" ] &&
			[ -f "$(sed -n 's/^include //p' "$KDIR/Makefile")" ]
	)
}

# Points the extracted headers at their own tree instead of /usr/src and /usr/lib.
relocate_headers() {
	local root=$1 ver=$2 mk common
	mk=$root/usr/src/linux-headers-$ver/Makefile
	common=$(sed -n 's|^include /usr/src/\(linux-headers-[^/]*\)/Makefile$|\1|p' "$mk")
	[ -n "$common" ] && [ -f "$root/usr/src/$common/Makefile" ] || {
		log "$mk: unexpected content: $(head -c 200 "$mk")"
		return 1
	}
	echo "include $root/usr/src/$common/Makefile" >"$mk"
	ln -sfn ../../../usr/src/linux-headers-"$ver" "$root/lib/modules/$ver/build"
	ln -sfn ../../../usr/src/"$common" "$root/lib/modules/$ver/source"
	[ -f "$root/usr/src/linux-headers-$ver/scripts/Makefile.build" ] || {
		log "linux-headers-$ver: scripts do not resolve to the extracted linux-kbuild"
		return 1
	}
}

fetch_series() {
	local s=$1 dir=$cache/$1 envf=$cache/$1/env ver pin img tmp deb
	local -a pkgs
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

	# The unsigned image has the same vmlinuz and modules as the signed one, minus signatures.
	img=linux-image-$ver-unsigned
	apt-cache show "$img" >/dev/null 2>&1 || img=linux-image-$ver
	pkgs=("$img" linux-headers-"$ver")
	# The headers' own dependencies name their -common and linux-kbuild packages.
	pkgs+=($(apt-cache depends linux-headers-"$ver" |
		sed -n 's/^ *|\?Depends: \(linux-\(headers-.*-common\|kbuild-.*\)\)$/\1/p'))
	[ ${#pkgs[@]} -ge 4 ] || {
		log "linux-headers-$ver: no -common or linux-kbuild dependency found (${pkgs[*]})"
		return 1
	}
	tmp=$(mktemp -d "$cache/.dl.XXXXXX")
	chown _apt "$tmp" 2>/dev/null || true # apt downloads as _apt when run as root
	log "apt-get download ${pkgs[*]}"
	(cd "$tmp" && apt-get download -qq "${pkgs[@]}" >&2) || {
		apt_update_once
		(cd "$tmp" && apt-get download -qq "${pkgs[@]}" >&2)
	}
	rm -rf "$dir"
	mkdir -p "$dir"
	for deb in "$tmp"/*.deb; do
		dpkg -x "$deb" "$dir/root"
	done
	rm -rf "$tmp"
	[ -f "$dir/root/boot/vmlinuz-$ver" ] || {
		log "$img has no /boot/vmlinuz-$ver"
		return 1
	}
	relocate_headers "$dir/root" "$ver"
	cat >"$envf" <<EOF
KVER=$ver
KDIR=$dir/root/usr/src/linux-headers-$ver
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
