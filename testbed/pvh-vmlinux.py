#!/usr/bin/env python3
"""Unpack the ELF kernel inside a bzImage, for QEMU's PVH direct boot of nested guests.

Under TCG inside TCG a Debian kernel spends well over a minute decompressing itself before it
prints a line; QEMU boots an uncompressed vmlinux with a PVH entry note (Debian's have
CONFIG_PVH=y) straight into the kernel (docs/testbed.md, "Boot time").

usage: pvh-vmlinux.py VMLINUZ OUT
Exit status 0 with OUT written, or 1 with the reason on stderr (the caller then boots VMLINUZ).
"""
import gzip
import io
import lzma
import os
import struct
import subprocess
import sys

XEN_ELFNOTE_PHYS32_ENTRY = 18


def payload(image):
    if image[0x202:0x206] != b"HdrS":
        raise ValueError("not a bzImage (no HdrS header)")
    setup_sects = image[0x1F1] or 4
    offset, length = struct.unpack_from("<II", image, 0x248)
    start = (setup_sects + 1) * 512 + offset
    return image[start : start + length]


def decompress(data):
    if data.startswith(b"\x28\xb5\x2f\xfd"):
        # Python's standard library has no zstd before 3.14: the zstd tool (apt: zstd). The
        # kernel's build appends the decompressed size, which zstd would take for a frame.
        return subprocess.run(["zstd", "-dc"], input=data[:-4], capture_output=True, check=True).stdout
    if data.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)
    if data.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=io.BytesIO(data)).read()
    raise ValueError(f"unknown compression (magic {data[:4].hex()})")


def has_pvh_entry(elf):
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        return False
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", elf, phoff + i * phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        at, end = p_offset, p_offset + p_filesz
        while at + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, at)
            name = elf[at + 12 : at + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            at += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-2])
    src, out = sys.argv[1:]
    try:
        with open(src, "rb") as f:
            elf = decompress(payload(f.read()))
    except (OSError, ValueError, subprocess.CalledProcessError, lzma.LZMAError) as e:
        print(f"pvh-vmlinux: {src}: {e}", file=sys.stderr)
        sys.exit(1)
    if not has_pvh_entry(elf):
        print(f"pvh-vmlinux: {src}: the kernel has no PVH entry note (CONFIG_PVH)", file=sys.stderr)
        sys.exit(1)
    with open(out + ".tmp", "wb") as f:
        f.write(elf)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
