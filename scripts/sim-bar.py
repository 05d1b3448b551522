#!/usr/bin/env python3
"""vtism against the bar in `vtism sim compare` output (Markdown tables, as table.txt holds).

Per workload: vtism's throughput against static (first touch) and against the best peer (every
policy but vtism's own variants, the oracle, all-fast and static), and vtism's tracking overhead.
The bar (issue 11): at least static, at least 0.97 of the best peer, overhead at most 2%.

Usage: sim-bar.py LABEL=TABLE.TXT [LABEL=TABLE.TXT ...]   prints one Markdown table, exit 1 if a row
misses the bar.
"""
import re
import sys

NOT_PEERS = {"vtism", "vtism-island", "vtism-pool", "oracle", "all-fast", "static"}


def workloads(text):
    """(workload, {policy: (throughput, tracking overhead %)}) per per-workload table."""
    for block in re.split(r"\n(?=\S+ on \S+ at fast:slow )", "\n" + text):
        m = re.match(r"\s*(\S+) on \S+ at fast:slow", block)
        if not m:
            continue
        rows = {}
        for line in block.splitlines():
            if line.startswith(("per VM", "suite:")):
                break  # the per-VM and the suite's summary tables follow
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 7 or cells[0] in ("policy", "vm") or cells[0].startswith("---"):
                continue
            try:
                rows[cells[0]] = (float(cells[1]), float(cells[6].rstrip("%")))
            except ValueError:
                continue
        if rows:
            yield m.group(1), rows


def main():
    ok = True
    print("| configuration | workload | vtism | static | best peer | vtism / best | tracking overhead | bar |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | --- |")
    for arg in sys.argv[1:]:
        label, path = arg.split("=", 1)
        for wl, rows in workloads(open(path).read()):
            if "vtism" not in rows:
                continue
            peers = {p: v[0] for p, v in rows.items() if p not in NOT_PEERS}
            best = max(peers, key=peers.get)
            v, ovh = rows["vtism"]
            st = rows.get("static", (0.0, 0.0))[0]
            ratio = v / peers[best]
            good = v >= st and ratio >= 0.97 and ovh <= 2.0
            ok &= good
            print(f"| {label} | {wl} | {v:.3f} | {st:.3f} | {best} {peers[best]:.3f} | "
                  f"{ratio:.3f} | {ovh:.2f}% | {'met' if good else '**missed**'} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
