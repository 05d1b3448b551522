#!/usr/bin/env bash
# Install what vtism needs to build and test, idempotently: Debian packages that are missing,
# and a check that the Rust toolchain is new enough. Safe to run again and again.
#
# Nothing else is installed on the machine: the guest kernels, their headers and kbuild trees are
# downloaded and extracted under build/ (scripts/guest-kernels.sh), and the packaging test's Debian
# system is a root filesystem under build/ (tests/packaging/mkrootfs.sh).
#
# Usage: scripts/install-deps.sh [base|test|demo|deb]   (default: base)
#   base  compilers for the workspace and the C vector test
#   test  base + what `make test` needs (including deb)
#   demo  base + what `make demo` needs
#   deb   base + cargo-deb, for `make deb`
set -euo pipefail

profile=${1:-base}
case $profile in base | test | demo | deb) ;; *)
	echo "usage: $0 [base|test|demo|deb]" >&2
	exit 2
	;;
esac

base=(build-essential pkg-config)
extra=()
case $profile in
# QEMU and busybox for the emulated hosts and guests, cpio for their initramfs, libc6-dev for
# static test programs, file/kmod/python3 for the guest e2e harness, pahole for the BTF that
# 6.12's kbuild adds to modules (what Debian's linux-kbuild-6.12 depends on), mmdebstrap for the
# packaging test's root filesystem, zstd to unpack the nested guests' kernel for PVH boot
# (testbed/pvh-vmlinux.py). Kernel images and headers come from
# scripts/guest-kernels.sh (extracted under build/, never installed), which the tests call.
test) extra=(qemu-system-x86 busybox-static cpio file kmod libc6-dev python3 pahole mmdebstrap zstd) ;;
# The testbed: the same emulated host and nested guest as the tests; xz-utils unpacks the QEMU
# source the bake-off takes its plugin header from.
demo) extra=(qemu-system-x86 busybox-static cpio file kmod libc6-dev python3 pahole xz-utils zstd) ;;
esac
want=("${base[@]}" "${extra[@]}")

missing=()
for p in "${want[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		sudo=sudo
	else
		sudo=
	fi
	echo "install-deps: installing ${missing[*]}"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Rust: the workspace needs a recent stable toolchain (see rust-version in Cargo.toml).
need_rust=1.80
if ! command -v cargo >/dev/null 2>&1; then
	echo "install-deps: cargo not found. Install Rust >= $need_rust with rustup (https://rustup.rs)," >&2
	echo "  or on Debian >= 13: apt-get install rustup && rustup default stable" >&2
	exit 1
fi
have=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$need_rust" "$have" | sort -V | head -1)" != "$need_rust" ]; then
	echo "install-deps: rustc $have is older than $need_rust; run 'rustup update stable'" >&2
	exit 1
fi

# cargo-deb builds the vtismd package (`make deb`, and the packaging test in `make test`).
cargo_deb=3.8.0
if [ "$profile" = deb ] || [ "$profile" = test ]; then
	if [ "$(cargo deb --version 2>/dev/null | awk '{print $2}')" != "$cargo_deb" ]; then
		echo "install-deps: cargo install cargo-deb $cargo_deb"
		nice -n 5 cargo install --quiet --locked --version "$cargo_deb" cargo-deb
	fi
fi
echo "install-deps: $profile ready (rustc $have)"
