#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Turn the VTB lines of bench-init.sh's serial log (stdin) into the tables of
docs/performance.md, "Guest tracker". Everything is computed from the log."""
import re
import statistics
import sys
from collections import defaultdict

snaps = defaultdict(dict)
tput = defaultdict(list)
info = []
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("VTB "):
        continue
    f = line.split()
    if f[1] == "snap" and len(f) >= 5:
        try:
            snaps[f[2]][f[3]] = int(f[4])
        except ValueError:
            pass
    elif f[1] == "tput":
        m = re.search(r"ops_per_s=(\d+)", line)
        if m:
            tput[f[2]].append(float(m.group(1)))
    elif f[1] == "info":
        info.append(" ".join(f[2:]))

mb = 512
for i in info:
    m = re.search(r"\bmb=(\d+)", i)
    if m:
        mb = int(m.group(1))
        break
gib = mb / 1024.0

print("guest: " + "; ".join(i for i in info if i.startswith(("kernel", "thp", "dmesg"))))
print()


def delta(label):
    a, b = snaps.get(label + "-a"), snaps.get(label + "-b")
    if not a or not b:
        return None
    return {k: b[k] - a[k] for k in b if k in a}


print(f"Pruning, {mb} MiB workload region, fixed 1 s interval; per round, per GiB of the region")
print()
print("| shape | prune | rounds | PTEs visited /GiB | PMD skipped /GiB | PUD skipped | "
      "PTEs young /GiB | scan ms /GiB |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
summary = []
for shape in ("dense", "mid", "sparse"):
    res = {}
    for pr in ("1", "0"):
        tot = defaultdict(int)
        # the bench alternates prune 1,0,1,0: both windows of a mode are summed
        for lab in (f"{shape}-p{pr}-{j}" for j in range(1, 5)):
            dl = delta(lab)
            if dl is None:
                continue
            for k, v in dl.items():
                tot[k] += v
        r = tot["rounds"]
        if r <= 0:
            continue
        res[pr] = {k: v / r for k, v in tot.items()}
        x = res[pr]
        print(f"| {shape} | {'on' if pr == '1' else 'off'} | {r} | "
              f"{x['ptes_visited'] / gib:,.0f} | {x['pmd_skipped'] / gib:,.0f} | "
              f"{x['pud_skipped']:.1f} | {x['ptes_young'] / gib:,.0f} | "
              f"{x['total_scan_us'] / 1000 / gib:.1f} |")
    if "1" in res and "0" in res and res["0"]["ptes_visited"] > 0:
        pte = 100 * (1 - res["1"]["ptes_visited"] / res["0"]["ptes_visited"])
        t = 100 * (1 - res["1"]["total_scan_us"] / res["0"]["total_scan_us"])
        summary.append((shape, pte, t))
print()
print("| shape | PTEs visited: reduction with pruning | scan time: reduction with pruning |")
print("| --- | --- | --- |")
for shape, pte, t in summary:
    print(f"| {shape} | {pte:.1f}% | {t:.1f}% |")
print()

print("Throughput of the GUPS-like workload (256 MiB, random 8-byte updates), ops/s")
print()
print("| config | runs (ops/s) | median | ratio to none (medians) | slowdown | rounds/run | mean interval ms | scan duty |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
base = statistics.median(tput["none"]) if tput.get("none") else None
for cfg in ("none", "adaptive", "fixed2500", "fixed100"):
    v = tput.get(cfg)
    if not v:
        continue
    m = statistics.median(v)
    rr, iv, duty = "-", "-", "-"
    if cfg != "none":
        rs, ivs, du = [], [], []
        for i in range(1, len(v) + 1):
            a, b = snaps.get(f"{cfg}{i}-a"), snaps.get(f"{cfg}{i}-b")
            if a and b:
                rs.append(b["rounds"] - a["rounds"])
                ivs.append(b["last_interval_ms"])
                du.append((b["total_scan_us"] - a["total_scan_us"]) / 1e6)
        if rs:
            rr = f"{statistics.mean(rs):.1f}"
            iv = f"{statistics.mean(ivs):.0f}"
            secs = 20.0
            for i in info:
                mm = re.search(r"\bsecs=(\d+)", i)
                if mm:
                    secs = float(mm.group(1))
                    break
            duty = f"{100 * statistics.mean(du) / secs:.1f}%"
    ratio = f"{m / base:.3f}" if base else "-"
    if base and cfg != "none":
        pr = [x / y for x, y in zip(v, tput["none"])]
        ratio += f" (paired {statistics.median(pr):.3f}, range {min(pr):.2f}-{max(pr):.2f})"
    slow = f"{100 * (1 - m / base):.1f}%" if base else "-"
    print(f"| {cfg} | {', '.join(f'{x:,.0f}' for x in v)} | {m:,.0f} | {ratio} | {slow} | "
          f"{rr} | {iv} | {duty} |")
