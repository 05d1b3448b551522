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
slices = defaultdict(lambda: [0, 0.0])  # phase -> [ops, secs]
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
    elif f[1] == "slice" and len(f) >= 5:
        m = re.search(r"ops=(\d+) secs=([\d.]+)", line)
        if m:
            slices[f[2]][0] += int(m.group(1))
            slices[f[2]][1] += float(m.group(2))
    elif f[1] == "info":
        info.append(" ".join(f[2:]))

def info_num(name, default):
    """The first `name=<number>` of the info lines."""
    for i in info:
        m = re.search(r"\b" + name + r"=(\d+)", i)
        if m:
            return int(m.group(1))
    return default


mb = info_num("mb", 512)
gib = mb / 1024.0

print("guest: " + "; ".join(i for i in info if i.startswith(("kernel", "thp", "dmesg"))))
print()


def delta(label):
    a, b = snaps.get(label + "-a"), snaps.get(label + "-b")
    if not a or not b:
        return None
    return {k: b[k] - a[k] for k in b if k in a}


def pruning():
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


def throughput():
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
                secs = float(info_num("secs", 20))
                duty = f"{100 * statistics.mean(du) / secs:.1f}%"
        ratio = f"{m / base:.3f}" if base else "-"
        if base and cfg != "none":
            pr = [x / y for x, y in zip(v, tput["none"])]
            ratio += f" (paired {statistics.median(pr):.3f}, range {min(pr):.2f}-{max(pr):.2f})"
        slow = f"{100 * (1 - m / base):.1f}%" if base else "-"
        print(f"| {cfg} | {', '.join(f'{x:,.0f}' for x in v)} | {m:,.0f} | {ratio} | {slow} | "
              f"{rr} | {iv} | {duty} |")


if any(k.startswith(("dense", "mid", "sparse")) for k in snaps):
    pruning()
if tput:
    throughput()


def interleaved():
    """Part 3: ops/s per phase; each B phase against the mean of the A phases around it."""
    rate = {p: o / t for p, (o, t) in slices.items() if t > 0}
    pairs = []
    i = 1
    while f"B{i}" in rate:
        a = [rate[p] for p in (f"A{i}", f"A{i + 1}") if p in rate]
        if a:
            pairs.append((i, rate[f"B{i}"], statistics.mean(a), rate[f"B{i}"] / statistics.mean(a)))
        i += 1
    if not pairs:
        return
    print()
    print("Interleaved A/B in one workload process (A = module not loaded, B = module defaults),"
          " ops/s per phase")
    print()
    print("| pair | B ops/s | A ops/s (mean of the A phases around it) | B/A | rounds in B | scan ms in B |")
    print("| --- | --- | --- | --- | --- | --- |")
    duty = []
    for i, b, a, r in pairs:
        sa, sb = snaps.get(f"ab{i}-a"), snaps.get(f"ab{i}-b")
        rounds = scan = "-"
        if sa and sb:
            rounds = f"{sb['rounds'] - sa['rounds']}"
            ms = (sb["total_scan_us"] - sa["total_scan_us"]) / 1000
            scan = f"{ms:.0f}"
            if slices[f"B{i}"][1] > 0:
                duty.append(ms / 10 / slices[f"B{i}"][1])
        print(f"| {i} | {b:,.0f} | {a:,.0f} | {r:.4f} | {rounds} | {scan} |")
    rs = sorted(p[3] for p in pairs)
    n = len(rs)
    med = statistics.median(rs)
    q1, q3 = (statistics.quantiles(rs, n=4)[0], statistics.quantiles(rs, n=4)[2]) if n >= 2 else (rs[0], rs[0])
    mean = statistics.mean(rs)
    sd = statistics.stdev(rs) if n >= 2 else 0.0
    # two-sided 95% Student t quantiles for n-1 degrees of freedom (n <= 31), else 1.96
    tq = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14,
          2.13, 2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05,
          2.05, 2.04]
    t = tq[n - 2] if 2 <= n <= 31 else 1.96
    half = t * sd / n ** 0.5
    a_all = [rate[p] for p in rate if p.startswith("A")]
    a_spread = (max(a_all) / min(a_all) - 1) * 100 if a_all else 0
    print()
    print(f"B/A over {n} pairs: median {med:.4f} (interquartile {q1:.4f}-{q3:.4f}, range "
          f"{rs[0]:.4f}-{rs[-1]:.4f}); mean {mean:.4f} +- {half:.4f} (95% t interval, "
          f"sd {sd:.4f}); slowdown by the median {100 * (1 - med):.2f}%. A phases alone spread "
          f"{a_spread:.1f}% (max/min - 1).")
    if duty:
        print(f"Scanner duty in the B phases (scan time / phase time): median "
              f"{statistics.median(duty):.2f}%, range {min(duty):.2f}-{max(duty):.2f}%.")


interleaved()
