#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host side of the DAMON agent's e2e test (run-damon-e2e.sh, damon-init.sh).

Starts the guest (the QEMU command after "--"), follows its serial log and reads the channel
file as the host daemon would (chanmon.py's seqlock copy), validates every round as a channel
v1.1 round of the DAMON tracker, plays the host's feedback (fast_quota_bytes, an entry budget,
a floor on the round period), and at the end checks what the agent published against the
workload's ground truth (warm_workload.c).

usage: damonmon.py --channel FILE --serial LOG --label damon-6.12 [--timeout S]
                   [--quota1 MIB] [--quota2 MIB] [--budget-bp BP] -- qemu-system-x86_64 ...

Prints one "PASS <label>/<check>: ..." or "FAIL <label>/<check>: ..." line per check and exits
non-zero if any check failed. Standard library only.
"""
import argparse
import math
import os
import re
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chanmon  # noqa: E402  (the channel reader and the run loop)

HDR = chanmon.HDR
TYPES = chanmon.TYPES
RES_ENTRY = chanmon.RES_ENTRY
OVERFLOW = chanmon.OVERFLOW
MiB = 1 << 20
FEEDBACK_BUDGET = 64
FEEDBACK_MIN_MS = 2500
LEVEL_1HZ = 96


def level_of_rate(hz):
    """vtism_proto::count::level_of_rate."""
    if not hz > 0:
        return 0
    return int(min(255, max(0, round(math.log2(hz) * 16 + LEVEL_1HZ))))


class Truth(chanmon.Truth):
    def warm(self):
        return {g for g, k in self.kind.items() if k[0] == "warm"}

    def known(self):
        return set(self.kind)


class Feedback:
    """The host's feedback block (docs/channel.md), written as a seqlock."""

    def __init__(self, ch):
        self.ch, self.budget, self.min_ms, self.quota = ch, 0, 0, 0

    def write(self):
        mm = self.ch.mm
        s = self.ch.u64(0x800)
        s = s + 1 if s % 2 == 0 else s
        struct.pack_into("<Q", mm, 0x800, s)
        struct.pack_into("<QQI", mm, 0x808, 0, self.budget, self.min_ms)
        struct.pack_into("<Q", mm, 0x820, self.quota)
        struct.pack_into("<I", mm, 0x830, 1 << 16 | 1)
        struct.pack_into("<Q", mm, 0x800, s + 1)


class Monitor(chanmon.Monitor):
    def __init__(self, a):
        super().__init__(a)
        self.truth = Truth()
        self.fb = None
        self.warm_rate = None
        self.floor_ms = FEEDBACK_MIN_MS

    def on_line(self, line):
        m = re.match(r"VTPHASE (\S+) round=(\d+)", line)
        if m:
            self.lines.append(line)
            name, r = m.group(1), int(m.group(2))
            self.phases.append((name, r))
            self.phase_seen = name
            if self.fb is None:
                self.fb = Feedback(self.ch)
            if name == "quota-1":
                self.fb.quota = self.a.quota1 * MiB
            elif name == "quota-2":
                self.fb.quota = self.a.quota2 * MiB
            elif name == "feedback-request":
                # a floor above the rounds' own period, or it would prove nothing
                last = max((s["f"]["interval_ms"] for s in self.snaps[-3:]), default=0)
                self.floor_ms = max(FEEDBACK_MIN_MS, int(last * 1.5))
                self.fb.budget, self.fb.min_ms = FEEDBACK_BUDGET, self.floor_ms
            elif name == "feedback-end":
                self.fb.budget, self.fb.min_ms = 0, 0
            self.fb.write()
            self.fb_written[name] = self.round_now()
            return
        m = re.match(r"VTGT (hot|warm|cold|thp) (\w+) (\d) (\d+) (\d+)$", line)
        if m:
            self.lines.append(line)
            self.truth.add(m.group(1), m.group(2), int(m.group(3)), int(m.group(4)),
                           int(m.group(5)))
            return
        m = re.match(r"VTGT rate ([0-9.]+)", line)
        if m:
            self.warm_rate = float(m.group(1))
        super().on_line(line)

    def poll_channel(self):
        snap = self.ch.snapshot()
        if snap is None:
            self.torn += 1
            return
        hdr, ent = snap
        f = chanmon.parse_header(hdr)
        if f["magic"] == 0 and f["round"] == 0:
            return
        if self.snaps and self.snaps[-1]["f"]["round"] == f["round"] and \
                self.snaps[-1]["f"]["publish_ns"] == f["publish_ns"]:
            return
        if not self.ram:
            return
        try:
            f, es = chanmon.validate(hdr, ent, self.ch.size, self.ram)
        except chanmon.Reject as e:
            self.rejects.append((f["round"], "%s (%s)" % e.args))
            return
        self.snaps.append(dict(f=f, entries=es, t=time.monotonic(), phase_seen=self.phase_seen))

    # ---- after the guest stopped ----
    def window(self, start, end):
        a, b = self.phase_round(start), self.phase_round(end)
        if a is None or b is None:
            return []
        return [s for s in self.snaps if a < s["f"]["round"] <= b]

    def levels(self, s):
        """frame -> level of a round (2 MiB entries: each of their frames)."""
        out = {}
        for e in s["entries"]:
            d = chanmon.decode(e)
            for g in range(d["gfn"], d["gfn"] + (512 if d["huge"] else 1)):
                out[g] = d["count"]
        return out

    def pr(self, s):
        """(precision, recall) at level >= 96 (1 Hz, the engine's hot_set_min_rate_hz), and
        the share of the hot set among the workload's top-N frames in the published order."""
        hot, known = self.truth.hot(), self.truth.known()
        lv = self.levels(s)
        above = {g for g, l in lv.items() if l >= LEVEL_1HZ and g in known}
        tp = len(above & hot)
        prec = tp / len(above) if above else 0.0
        rec = tp / len(hot) if hot else 0.0
        order = []
        for e in s["entries"]:
            d = chanmon.decode(e)
            order.extend(g for g in range(d["gfn"], d["gfn"] + (512 if d["huge"] else 1))
                         if g in known)
        top = order[:len(hot)]
        ranked = len(set(top) & hot) / len(hot) if hot else 0.0
        return prec, rec, ranked, len(above - hot)

    def stat(self, phase, name):
        try:
            return int(self.stats[phase][name])
        except (KeyError, ValueError):
            return None

    def analyse(self):
        t = self.truth
        for n, ok, d in self.results:
            self.check("guest:" + n, ok, d)
        self.check("ground-truth", t.hot() and t.warm() and t.cold() and len(t.thp_heads) >= 1
                   and not any(l.startswith("VTGT thp-bad") for l in self.lines),
                   "%d hot frames (%d THP units), %d warm, %d idle; warm pages updated %s times "
                   "a second" % (len(t.hot()), len(t.thp_heads), len(t.warm()), len(t.cold()),
                                 self.warm_rate))
        end = [l for l in self.lines if l.startswith("VTGT end")]
        self.check("frames-stable", end and " moved=0 thp_bad=0 " in " " + end[0][9:] + " ",
                   end[0] if end else "workload did not report its end")

        fs = [s["f"] for s in self.snaps]
        bad_ident = [f["round"] for f in fs if not (
            f["vmin"] == 1 and f["tracker"] == 2 and f["region_size"] == self.ch.size and
            f["capacity"] == (self.ch.size - HDR) // 8)]
        self.check("channel-valid", self.snaps and not self.rejects and not bad_ident,
                   "%d rounds read as v1.1, %d rejected %s, %d bad identity %s, %d torn reads" % (
                       len(self.snaps), len(self.rejects), self.rejects[:3], len(bad_ident),
                       bad_ident[:3], self.torn))

        back, order_bad, hot_bad = [], 0, []
        for p, q in zip(self.snaps, self.snaps[1:]):
            if q["f"]["round"] <= p["f"]["round"] or q["f"]["publish_ns"] <= p["f"]["publish_ns"]:
                back.append((p["f"]["round"], q["f"]["round"]))
        for s in self.snaps:
            cnts = [chanmon.decode(e)["count"] for e in s["entries"]]
            if any(a < b for a, b in zip(cnts, cnts[1:])) or 0 in cnts:
                order_bad += 1
            hot = sum(512 if chanmon.decode(e)["huge"] else 1 for e in s["entries"]
                      if chanmon.decode(e)["count"] >= LEVEL_1HZ)
            f = s["f"]
            if (f["hot_frames"] != hot and not f["flags"] & OVERFLOW) or \
                    (f["flags"] & OVERFLOW and f["hot_frames"] < hot):
                hot_bad.append((f["round"], f["hot_frames"], hot))
        self.check("rounds-consistent", self.snaps and not back and not order_bad and not hot_bad,
                   "%d rounds, round %d..%d, %d out of order %s, %d not hottest first or with "
                   "level 0, %d hot_frames mismatches %s" % (
                       len(self.snaps), fs[0]["round"] if fs else 0,
                       fs[-1]["round"] if fs else 0, len(back), back[:3], order_bad,
                       len(hot_bad), hot_bad[:3]))

        # precision and recall on the warm background, steady rounds under the first quota
        steady = self.window("steady", "steady-end")
        res = [self.pr(s) for s in steady]
        if res:
            pmin, rmin = min(x[0] for x in res), min(x[1] for x in res)
            tmin = min(x[2] for x in res)
            self.check("precision-recall", pmin >= 0.9 and rmin >= 0.9 and tmin >= 0.9,
                       "%d rounds; at level >= 96 (1 Hz): precision min %.3f, recall min %.3f "
                       "(last round %.3f/%.3f, %d warm or idle frames at 1 Hz or more); hot set "
                       "in the top %d of the workload's frames: min %.3f; precision per round %s" % (
                           len(res), pmin, rmin, res[-1][0], res[-1][1], res[-1][3],
                           len(t.hot()), tmin, ["%.3f" % x[0] for x in res]))
        else:
            self.check("precision-recall", False, "no rounds in the steady window")

        # rates: hot over warm over idle, and the warm pages' rate near what the workload did
        if steady:
            lv = self.levels(steady[-1])
            med = {c: statistics.median([lv.get(g, 0) for g in frames]) if frames else 0
                   for c, frames in (("hot", t.hot()), ("warm", t.warm()), ("idle", t.cold()))}
            want = level_of_rate(self.warm_rate) if self.warm_rate else None
            ok = med["hot"] > med["warm"] > med["idle"] and want is not None and \
                abs(med["warm"] - want) <= 16
            self.check("rates-ordered", ok,
                       "median level hot %s > warm %s > idle %s; warm pages' rate %.3f Hz is "
                       "level %s (median within 16 levels, a factor 2)" % (
                           med["hot"], med["warm"], med["idle"], self.warm_rate or 0, want))
        else:
            self.check("rates-ordered", False, "no steady rounds")

        # the intervals loop: toward the quota's share of access events, and following it. The
        # channel reports the interval the agent samples with: the stats snapshot is written
        # after round n's step of the loop, so round n + 1 is published with its interval
        st = self.stats
        g1, a1 = self.stat("steady", "goal_ppm"), self.stat("steady", "access_ppm")
        s1, s2 = self.stat("steady", "sample_us"), self.stat("quota-2", "sample_us")
        g2 = self.stat("quota-2", "goal_ppm")
        n1 = self.stat("steady", "rounds")
        win = [s["f"]["window_us"] for s in self.snaps
               if n1 is not None and s["f"]["round"] == n1 + 1]
        want1 = self.a.quota1 * MiB * 1e6 / sum(b - a for a, b in self.ram) / 4096
        ok = None not in (g1, a1, s1, s2, g2) and win and \
            abs(g1 - want1) <= 0.02 * want1 and win[-1] == s1 and s2 > s1 * 1.3 and g2 > g1
        shares = []
        for ph in ("steady", "quota-2"):
            if st.get(ph, {}).get("limit") == "0" and self.stat(ph, "goal_ppm"):
                shares.append(self.stat(ph, "access_ppm") / self.stat(ph, "goal_ppm"))
        self.check("intervals-loop", ok,
                   "quota %d MiB: goal %s ppm (want %.0f), access %s ppm, sampling %s us "
                   "(window_us of the next round %s); quota %d MiB: goal %s ppm, sampling %s us; access/goal at "
                   "the goal-held ends %s" % (
                       self.a.quota1, g1, want1, a1, s1, win[-1] if win else None,
                       self.a.quota2, g2, s2, ["%.2f" % x for x in shares]))

        # CPU: the kdamond's and the agent's over the steady window, against the budget
        try:
            d = {n: self.stat("steady", n) - self.stat("steady-start", n)
                 for n in ("kdamond_cpu_us", "agent_cpu_us", "elapsed_us", "windows")}
            share = (d["kdamond_cpu_us"] + d["agent_cpu_us"]) / d["elapsed_us"]
            self.check("cpu-budget", share <= self.a.budget_bp / 1e4 * 1.1,
                       "%.2f%% of one CPU over %.0f s (kdamond %.0f ms, agent %.0f ms, %d "
                       "windows); budget %.2f%%" % (
                           100 * share, d["elapsed_us"] / 1e6, d["kdamond_cpu_us"] / 1e3,
                           d["agent_cpu_us"] / 1e3, d["windows"], self.a.budget_bp / 100))
        except (TypeError, ZeroDivisionError):
            self.check("cpu-budget", False, "no statistics for the steady window")

        # page types, no write bit, THPs as 2 MiB entries (steady rounds)
        tbad, wbad, seen, thp_bad = 0, 0, 0, []
        for s in steady:
            heads = set()
            for e in s["entries"]:
                d = chanmon.decode(e)
                if d["huge"]:
                    heads.add(d["gfn"])
                k = t.kind.get(d["gfn"])
                if not k or k[0] not in ("hot", "thp"):
                    continue
                seen += 1
                tbad += d["type"] != TYPES[k[1]]
                wbad += d["write"] != 0
                if (k[0] == "thp") != bool(d["huge"]):
                    thp_bad.append(d["gfn"])
            thp_bad += [h for h in t.thp_heads if h not in heads]
        self.check("page-types", seen and not tbad,
                   "%d hot entries checked (anon/file/shmem/THP), %d wrong type" % (seen, tbad))
        self.check("write-bit", seen and not wbad,
                   "%d hot entries: the DAMON agent never sets it; %d set" % (seen, wbad))
        self.check("thp-units", steady and t.thp_heads and not thp_bad,
                   "%d THP units as 2 MiB entries in %d rounds; mismatches %s" % (
                       len(t.thp_heads), len(steady), thp_bad[:3]))

        # feedback: budget and floor
        fbw = self.window("feedback", "feedback-end")
        bad = [(s["f"]["round"], s["f"]["count"], s["f"]["flags"], s["f"]["interval_ms"])
               for s in fbw if not (s["f"]["count"] == FEEDBACK_BUDGET and
                                    s["f"]["flags"] & OVERFLOW and
                                    s["f"]["hot_frames"] >= FEEDBACK_BUDGET and
                                    s["f"]["interval_ms"] >= self.floor_ms)]
        gaps = [(q["f"]["publish_ns"] - p["f"]["publish_ns"]) / 1e6
                for p, q in zip(fbw, fbw[1:]) if q["f"]["round"] == p["f"]["round"] + 1]
        # the first round after the one in flight when the host cleared the budget: the host
        # writes when its serial poll reads feedback-end, which a loaded machine may delay by
        # rounds, so the one in flight is the one after the channel's round at the write
        fe = self.phase_round("feedback-end")
        xe = self.fb_written.get("feedback-end")
        first = None if fe is None else fe + 1 if xe is None else max(fe + 1, xe + 1)
        after = [s for s in self.snaps if first is not None and s["f"]["round"] > first]
        self.check("feedback-budget", fbw and not bad and after and
                   after[0]["f"]["count"] > FEEDBACK_BUDGET,
                   "%d rounds with entry_budget=%d: count=%d, OVERFLOW, the hottest; bad %s; "
                   "after reset count=%s" % (len(fbw), FEEDBACK_BUDGET, FEEDBACK_BUDGET, bad[:3],
                                             after[0]["f"]["count"] if after else None))
        self.check("feedback-min-interval", gaps and min(gaps) >= self.floor_ms * 0.95,
                   "rounds %s ms apart with min_interval_ms=%d" % (
                       [round(g) for g in gaps], self.floor_ms))


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    i = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--channel", required=True)
    ap.add_argument("--serial", required=True)
    ap.add_argument("--label", default="damon")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--quota1", type=int, default=12, help="first fast_quota_bytes, MiB")
    ap.add_argument("--quota2", type=int, default=16, help="second fast_quota_bytes, MiB")
    ap.add_argument("--budget-bp", type=int, default=100,
                    help="the agent's --cpu-budget-bp, for the cpu-budget check")
    a = ap.parse_args(argv[:i])
    chanmon.end_on_sigterm()
    m = Monitor(a)
    m.run(argv[i + 1:])
    chanmon.exit_if_boot_hung(m)
    m.analyse()
    m.tracker_report()
    sys.exit(1 if m.report() else 0)


if __name__ == "__main__":
    main()
