#!/usr/bin/env python3
"""Tabulates scripts/sim-host-thp.sh's runs: per workload and policy, throughput against
all-fast over the run and in the steady state, migrated GiB, host folios split and collapsed
again, as the mean of the seeds found (each seed's values in brackets when there are two or
more). Every row is against all-fast on host folios (the same as all-fast with the host's pages
not modelled): a run on 4 KiB host pages with their TLB cost has an all-fast that pays it too,
so its ratios are rescaled by its all-fast's accesses over the folios' all-fast's (the steady
state by the same factor). Usage: sim-host-thp-table.py [DIR] (default /tmp/sim-host-thp)."""
import glob
import json
import os
import sys
from collections import defaultdict

d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/sim-host-thp"
SUFFIX = {
    "thp": "",
    "base": " (4 KiB host pages, TLB cost)",
    "not_modelled": " (4 KiB host pages, no TLB cost)",
}
ORDER = [
    "vtism",
    "vtism-no-split",
    "vtism (4 KiB host pages, no TLB cost)",
    "vtism (4 KiB host pages, TLB cost)",
    "memtis",
    "hmmv",
    "hemem",
    "tpp",
]
WORKLOADS = ["gups-hotset", "gups-hotset-move", "kv-zipf", "graph", "seq-window", "file-cache"]
runs = defaultdict(dict)  # (workload, label) -> seed -> values
loaded = []
for path in sorted(glob.glob(os.path.join(d, "*.json"))):
    with open(path) as f:
        line = f.readline()
    if line.strip():
        loaded.append(json.loads(line))


def pages_of(j):
    return j.get("host_pages") or ("thp" if j.get("host_thp") else "not_modelled")


# All-fast's accesses on host folios, by workload and seed.
reference = {}
for j in loaded:
    if pages_of(j) != "base" and "accesses" in j:
        reference[(j["workload"], j["seed"])] = j["accesses"][0]
for j in loaded:
    pages = pages_of(j)
    scale = 1.0
    if pages == "base":
        ref = reference.get((j["workload"], j["seed"]))
        if ref is None or "accesses" not in j:
            continue
        scale = j["accesses"][0] / ref
    k = next(i for i, r in enumerate(j["rows"]) if r["policy"] != "all-fast")
    row = j["rows"][k]
    label = row["policy"] + SUFFIX[pages]
    folios = {f["policy"]: f for f in j.get("host_folios") or []}.get(row["policy"], {})
    runs[(j["workload"], label)][j["seed"]] = (
        row["throughput"] * scale,
        row["steady"] * scale,
        row["migrated_bytes"] / 2**30,
        folios.get("splits", 0),
        folios.get("collapses", 0),
    )


def cell(vals, k, fmt):
    xs = [vals[s][k] for s in sorted(vals)]
    mean = sum(xs) / len(xs)
    if len(xs) == 1:
        return fmt.format(mean)
    return fmt.format(mean) + " (" + ", ".join(fmt.format(x) for x in xs) + ")"


print("| workload | policy | seeds | throughput vs all-fast | steady state | migrated (GiB) | folios split | collapsed again |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
for w in WORKLOADS:
    for label in ORDER:
        vals = runs.get((w, label))
        if not vals:
            continue
        seeds = ",".join(str(s) for s in sorted(vals))
        print(
            f"| {w} | {label} | {seeds} | {cell(vals, 0, '{:.3f}')} | {cell(vals, 1, '{:.3f}')} | "
            f"{cell(vals, 2, '{:.1f}')} | {cell(vals, 3, '{:.0f}')} | {cell(vals, 4, '{:.0f}')} |"
        )
