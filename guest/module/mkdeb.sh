#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Builds vtism-guest-dkms_<version>_all.deb, a DKMS source package of the vtism_guest module
# (see docs/guest.md, "DKMS packaging"): the sources go to /usr/src/vtism_guest-<version>/;
# installing the package registers, builds and installs the module for the guest's kernels
# with DKMS's own /usr/lib/dkms/common.postinst (what Debian's dh_dkms-generated packages run);
# removing it removes the module from DKMS first.
#
# Why not `dkms mkdeb`: the dkms of Debian 12 (3.0.10) no longer has mkdeb/mkbmdeb (its actions
# are add, remove, build, install, uninstall, match, autoinstall, mktarball, ldtarball, status).
# This needs only dpkg-deb; nothing is installed on the machine that builds the package.
#
# usage: guest/module/mkdeb.sh [OUTDIR]        (default <repo>/build/deb)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../build/deb}
name=vtism_guest
pkg=vtism-guest-dkms
version=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"$/\1/p' "$here/dkms.conf")
[ -n "$version" ] || { echo "mkdeb: no PACKAGE_VERSION in dkms.conf" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
src=$root/usr/src/$name-$version
mkdir -p "$src" "$root/DEBIAN" "$root/usr/share/doc/$pkg"
# the sources Kbuild names (not the objects or *.mod.c of an in-tree build), and the headers
srcs=$(sed -n 's/^vtism_guest-y *:= *//p' "$here/Kbuild" | sed 's/\.o\b/.c/g')
[ -n "$srcs" ] || { echo "mkdeb: no sources in Kbuild" >&2; exit 1; }
for f in Kbuild Makefile dkms.conf $srcs vtism_guest.h vtism_channel.h; do
	install -m 0644 "$here/$f" "$src/$f"
done
cat >"$root/usr/share/doc/$pkg/copyright" <<EOF
vtism_guest kernel module, DKMS source package.
License: GPL-2.0 (see SPDX-License-Identifier in each source file and
/usr/share/common-licenses/GPL-2).
EOF

size=$(du -sk "$root/usr" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: $pkg
Version: $version
Architecture: all
Section: kernel
Priority: optional
Maintainer: vtism developers <vtism@localhost>
Depends: dkms (>= 2.1.0.0)
Recommends: linux-headers-amd64 | linux-headers-generic
Installed-Size: $size
Description: vtism guest tracker kernel module (DKMS)
 vtism_guest.ko runs inside a VM, finds its hot pages by page-table Accessed-bit
 scanning and publishes them to the host's vtism daemon through an ivshmem
 channel. DKMS builds it for every installed kernel that has its headers.
EOF
cat >"$root/DEBIAN/postinst" <<EOF
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
	/usr/lib/dkms/common.postinst $name $version "" "" "\$2"
fi
EOF
cat >"$root/DEBIAN/prerm" <<EOF
#!/bin/sh
set -e
case "\$1" in
remove | upgrade | deconfigure)
	if [ -n "\$(dkms status -m $name -v $version 2>/dev/null)" ]; then
		dkms remove -m $name -v $version --all
	fi
	;;
esac
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm"

mkdir -p "$out"
deb=$out/${pkg}_${version}_all.deb
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"
