#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Build the e2e test guest's initramfs: busybox, /init, the module and the workload.

Writes the cpio "newc" format directly (gzip-compressed), so /dev/console can be a device
node without root's mknod, and the image is reproducible (fixed mtimes, sorted entries).

usage: mkinitramfs.py --init guest-init.sh --module vtism_guest.ko \
           --workload vtism-workload [--busybox /bin/busybox] -o initramfs.cpio.gz
"""
import argparse
import gzip
import os
import stat
import sys


def newc_entry(name, mode, data=b"", rdev=(0, 0), ino=[1]):
    ino[0] += 1
    fields = [ino[0], mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
    hdr = b"070701" + b"".join(b"%08X" % f for f in fields)
    out = hdr + name.encode() + b"\0"
    out += b"\0" * (-len(out) % 4)
    out += data
    out += b"\0" * (-len(out) % 4)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--module", help="vtism_guest.ko (omitted: no module in the image)")
    ap.add_argument("--add", action="append", default=[], metavar="SRC=DEST",
                    help="also add file SRC as DEST (parent directories are created)")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--busybox", default="/bin/busybox")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()

    def read(p):
        with open(p, "rb") as f:
            return f.read()

    bb = read(a.busybox)
    if bb[:4] != b"\x7fELF" or b"/ld-linux" in bb[:8192]:
        sys.exit("mkinitramfs: %s must be a static busybox (apt-get install busybox-static)" % a.busybox)
    d = stat.S_IFDIR | 0o755
    x = stat.S_IFREG | 0o755
    r = stat.S_IFREG | 0o644
    entries = [
        ("bin", d, b""),
        ("dev", d, b""),
        ("proc", d, b""),
        ("sys", d, b""),
        ("tmp", d, b""),
        ("mnt", d, b""),
        ("sbin", d, b""),
        ("bin/busybox", x, bb),
        ("bin/sh", stat.S_IFLNK | 0o777, b"busybox"),
        ("bin/vtism-workload", x, read(a.workload)),
        ("init", x, read(a.init)),
    ]
    if a.module:
        entries.append(("vtism_guest.ko", r, read(a.module)))
    have = {e[0] for e in entries}
    for spec in a.add:
        src, dest = spec.split("=", 1)
        dest = dest.lstrip("/")
        parts = dest.split("/")
        for i in range(1, len(parts)):
            p = "/".join(parts[:i])
            if p not in have:
                entries.append((p, d, b""))
                have.add(p)
        entries.append((dest, x if os.access(src, os.X_OK) else r, read(src)))
        have.add(dest)
    blob = b""
    for name, mode, data in entries:
        blob += newc_entry(name, mode, data)
    blob += newc_entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1))
    blob += newc_entry("dev/null", stat.S_IFCHR | 0o666, rdev=(1, 3))
    blob += newc_entry("TRAILER!!!", 0)
    tmp = a.output + ".tmp"
    with gzip.GzipFile(tmp, "wb", compresslevel=6, mtime=0) as f:
        f.write(blob)
    os.replace(tmp, a.output)


if __name__ == "__main__":
    main()
