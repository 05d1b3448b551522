#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Checks chanmon.py's channel reader (the guest e2e's host side) against the shared vectors in
tests/vectors/channel/, as crates/proto and tests/c/channel_vectors.c are checked: every region
must get the verdict vectors.json gives (the round's fields and entries, nothing new, or the
reject label and entry). Standard library only.

usage: chanmon_vectors.py [vectors-dir]
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chanmon  # noqa: E402

TYPES = ("unknown", "anon", "file", "shmem")
REPORT = ("window_us", "windows", "tracker_cpu_us", "coarse_window_us", "tracked_frames")


def verdict(v, data):
    """What chanmon makes of a vector's region, shaped like vectors.json's "expect"."""
    snap = chanmon.snapshot(data, len(data))
    if snap is None:
        return {"result": "error", "code": 7, "label": "write_in_progress", "entry_index": None}
    hdr, ent = snap
    try:
        f, es = chanmon.validate(hdr, ent, len(data), [tuple(r) for r in v["ram_map"]])
    except chanmon.Reject as e:
        label, detail = e.args
        index = int(detail.split()[1].rstrip(":")) if detail.startswith("entry ") else None
        return {"result": "error", "label": label, "entry_index": index}
    if f["round"] == 0:
        return {"result": "none"}
    got = {
        "result": "ok", "seq": f["seq"], "round": f["round"], "version_minor": f["vmin"],
        "counts": "rounds_seen" if f["vmin"] == 0 else "rate_level", "tracker": f["tracker"],
        "flags": f["flags"], "overflow": bool(f["flags"] & chanmon.OVERFLOW),
        "scan_interval_ms": f["interval_ms"], "scan_duration_us": f["scan_us"],
        "tracked_bytes": f["tracked_bytes"], "hot_frames": f["hot_frames"],
        "publish_time_ns": f["publish_ns"],
        "tracker_report": {k: f[k] for k in REPORT} if f["vmin"] >= 1 else None,
        "entries": [],
    }
    for e in es:
        d = chanmon.decode(e)
        got["entries"].append({"gfn": d["gfn"], "count": d["count"], "write": bool(d["write"]),
                               "type": TYPES[d["type"]], "huge": bool(d["huge"]),
                               "young": bool(d["young"])})
    return got


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    vdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "../../tests/vectors/channel")
    with open(os.path.join(vdir, "vectors.json")) as fh:
        doc = json.load(fh)
    failed = 0
    for v in doc["vectors"]:
        with open(os.path.join(vdir, v["file"]), "rb") as fh:
            data = fh.read()
        want = dict(v["expect"])
        want.pop("code", None)  # chanmon names rejects by label
        got = verdict(v, data)
        if got.get("label") == "write_in_progress":
            got.pop("code")
        if got != want:
            failed += 1
            print("FAIL %s:\n  expected %s\n  got      %s" % (v["name"], want, got))
    print("chanmon.py reader: %d vectors, %d failed" % (len(doc["vectors"]), failed))
    # The level scale chanmon prints rates with.
    bad = [c for c in doc["rate_levels"] if c["rate"] and c["shift"] <= 40 and
           abs(chanmon.rate_hz(c["level"]) / (c["rate"] / 2.0 ** c["shift"]) - 1) > 0.022
           and 0 < c["level"] < 255]
    if bad:
        failed += 1
        print("FAIL rate_hz: %d rate levels off by more than half a level, e.g. %s" % (
            len(bad), bad[:2]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
