#!/usr/bin/env bash
# Install what vtism needs to build and test, idempotently: Debian packages that are missing,
# and a check that the Rust toolchain is new enough. Safe to run again and again.
#
# Usage: scripts/install-deps.sh [base|test|demo]   (default: base)
#   base  compilers for the workspace and the C vector test
#   test  base + what `make test` needs
#   demo  base + what `make demo` needs
set -euo pipefail

profile=${1:-base}
case $profile in base | test | demo) ;; *)
	echo "usage: $0 [base|test|demo]" >&2
	exit 2
	;;
esac

base=(build-essential pkg-config)
extra=()
case $profile in
# QEMU and busybox for the emulated hosts and guests, cpio for their initramfs, libc6-dev for
# static test programs, file/kmod/python3 for the guest e2e harness. Kernel headers and images
# come from scripts/guest-kernels.sh, which the tests call.
test) extra=(qemu-system-x86 busybox-static cpio file kmod libc6-dev python3) ;;
# The testbed: the same emulated host and nested guest as the tests; xz-utils unpacks the QEMU
# source the bake-off takes its plugin header from.
demo) extra=(qemu-system-x86 busybox-static cpio file kmod libc6-dev python3 xz-utils) ;;
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
echo "install-deps: $profile ready (rustc $have)"
