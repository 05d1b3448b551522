#!/usr/bin/env bash
# Builds the host e2e's tracker-less guest (tests/host-e2e/hotloop.S) as a 32-bit multiboot ELF
# with binutils (build-essential): its vCPU touches guest-physical [HOT_START, HOT_END).
#   mkpayload.sh OUT.elf HOT_START HOT_END
set -euo pipefail
out=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -m32 -c -nostdlib -DHOT_START="$2" -DHOT_END="$3" -o "$work/hotloop.o" "$here/hotloop.S"
ld -m elf_i386 -Ttext 0x100000 -e _start -o "$out" "$work/hotloop.o"
