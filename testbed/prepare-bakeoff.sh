#!/usr/bin/env bash
# The bake-off's pieces, into build/testbed/bakeoff/ (idempotent; testbed/prepare.sh --bakeoff
# runs it after the testbed's own): the page-count TCG plugin (built against qemu-plugin.h from
# Debian's source of the installed QEMU), Debian's redis-server (downloaded and unpacked here,
# never installed on this machine), the key-value load, and the nested guest's initramfs with
# the module, GUPS, the vtism binary (for the DAMON agent) and redis.
# usage: prepare-bakeoff.sh VTISM_BIN MODULE_KO GUPS_BIN; prints KEY=VALUE lines on stdout.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$1 ko=$2 gups=$3
out=$repo/build/testbed/bakeoff
mkdir -p "$out"
log() { echo "bakeoff: $*" >&2; }

# apt with its own lists and cache under build/: source packages need deb-src lines, which this
# machine's sources do not have and which this script does not add to them.
aptdir=$out/apt
apt_private() {
	mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial"
	if [ ! -f "$aptdir/sources.list" ]; then
		cat >"$aptdir/sources.list" <<SRC
deb-src http://deb.debian.org/debian bookworm main
deb-src http://deb.debian.org/debian bookworm-updates main
deb-src http://deb.debian.org/debian-security bookworm-security main
SRC
	fi
	apt-get -o Dir::Etc::SourceList="$aptdir/sources.list" -o Dir::Etc::SourceParts=/nonexistent \
		-o Dir::State::Lists="$aptdir/lists" -o Dir::Cache="$aptdir/cache" "$@"
}

hdr=$out/qemu-plugin/qemu-plugin.h
if [ ! -f "$hdr" ]; then
	ver=$(dpkg-query -W -f='${source:Version}' qemu-system-x86)
	log "fetching Debian's QEMU source $ver for qemu-plugin.h (about 24 MB, apt-get source --download-only)"
	apt_private update -qq >&2
	src=$out/qemu-src
	rm -rf "$src" && mkdir -p "$src"
	(cd "$src" && apt_private source --download-only -qq "qemu=$ver" >&2)
	tar -xJf "$src"/qemu_*.orig.tar.xz -C "$src" --wildcards '*/include/qemu/qemu-plugin.h'
	# Debian's patches must leave the plugin API alone for the orig header to be the one built
	if tar -xJOf "$src"/qemu_*.debian.tar.xz | grep -q 'qemu-plugin\.h'; then
		log "a Debian patch touches qemu-plugin.h: unpack the source with dpkg-source instead"
		exit 1
	fi
	mkdir -p "$(dirname "$hdr")"
	cp "$src"/qemu-*/include/qemu/qemu-plugin.h "$hdr"
	rm -rf "$src"
fi
plugin=$out/libpagecount.so
if [ ! -f "$plugin" ] || [ "$repo/testbed/pagecount.c" -nt "$plugin" ]; then
	log "building the page-count TCG plugin"
	gcc -O2 -Wall -Wextra -shared -fPIC -I"$(dirname "$hdr")" -o "$plugin" "$repo/testbed/pagecount.c"
fi

kvload=$out/kvload
if [ ! -x "$kvload" ] || [ "$repo/testbed/kvload.c" -nt "$kvload" ]; then
	log "building the key-value load"
	gcc -O2 -Wall -Wextra -static -o "$kvload" "$repo/testbed/kvload.c" -lm 2>/dev/null
fi

# redis-server (in Debian's redis-tools) and the libraries this machine does not have.
rroot=$out/redis-root
if [ ! -x "$rroot/usr/bin/redis-check-rdb" ]; then
	log "downloading Debian's redis (apt-get download; unpacked under build/, not installed)"
	debs=$out/debs
	rm -rf "$debs" "$rroot" && mkdir -p "$debs" "$rroot"
	(cd "$debs" && apt-get download -qq redis-tools libjemalloc2 liblzf1 >&2)
	for d in "$debs"/*.deb; do dpkg -x "$d" "$rroot"; done
	rm -rf "$debs"
fi
redis=$rroot/usr/bin/redis-check-rdb
redis_ver=$(LD_LIBRARY_PATH=$rroot/usr/lib/x86_64-linux-gnu "$redis" --version 2>/dev/null | head -1 || true)

# The vtism binary for the DAMON agent, without its debug information (the initramfs is unpacked
# into the guest's RAM).
vtism=$out/vtism
if [ ! -x "$vtism" ] || [ "$bin" -nt "$vtism" ]; then
	strip -o "$vtism" "$bin"
fi

initrd=$out/guest-initramfs.cpio.gz
stamp=$out/guest-initramfs.inputs
inputs="$ko $gups $kvload $vtism $redis $repo/testbed/bakeoff-guest-init.sh"
if [ ! -f "$initrd" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$inputs" ] ||
	[ -n "$(find $inputs -newer "$initrd" 2>/dev/null)" ]; then
	log "building the bake-off guest's initramfs"
	adds=(--add "$vtism=/bin/vtism" --add "$kvload=/bin/kvload" --add "$redis=/bin/redis-server")
	for lib in $( (ldd "$vtism"; LD_LIBRARY_PATH=$rroot/usr/lib/x86_64-linux-gnu ldd "$redis") |
		grep -o '/[^ ]*' | sort -u); do
		case $lib in
		"$rroot"/*) adds+=(--add "$lib=${lib#"$rroot"}") ;;
		*) adds+=(--add "$lib=$lib") ;;
		esac
	done
	python3 "$repo/guest/tests/mkinitramfs.py" --init "$repo/testbed/bakeoff-guest-init.sh" \
		--module "$ko" --workload "$gups" "${adds[@]}" -o "$initrd"
	echo "$inputs" >"$stamp"
fi

echo "PLUGIN=$plugin"
echo "BAKEOFF_GUEST_INITRD=$initrd"
echo "REDIS_VERSION=$redis_ver"
