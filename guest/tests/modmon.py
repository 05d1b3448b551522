#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host side of the vtism_guest (kernel module) e2e test.

chanmon.py reads the channel exactly as the host daemon would (seqlock copy, then validation per
docs/channel.md); this monitor drives the module's scenario (guest-init.sh) with it, answers
through the feedback block (entry budget, floor, and the fast-memory quota the module's window
loops follow), and checks what the module published: channel v1.1 rate levels against the
workload's ground truth (hot set, warm background, idle frames).

usage: modmon.py --channel FILE --serial LOG --label 6.1 [--timeout S] -- qemu-system-x86_64 ...

Prints "INFO <label>/<name>: ..." lines with measurements, then one "PASS <label>/<check>: ..." or
"FAIL <label>/<check>: ..." line per check; exits non-zero if any check failed.
"""
import argparse
import re
import statistics
import struct
import sys
import time

import chanmon
import corepin
from chanmon import LEVEL_1HZ, decode, rate_hz

FEEDBACK_BUDGET = chanmon.FEEDBACK_BUDGET
FEEDBACK_MIN_MS = chanmon.FEEDBACK_MIN_MS
# the quota the host writes in the quota-wide phase, in hot-set sizes
WIDE_QUOTA = 8


class ModuleMonitor(chanmon.Monitor):
    def __init__(self, a):
        super().__init__(a)
        self.idle = set()
        self.notes = []
        self.quota_written = {}
        self.host_wait = {}
        self.vcpu_wait = {}  # phase -> vCPU 0's run delay, while it had a CPU of its own
        self.pin = None
        self.pin_note = None
        self.swept = 0.0

    # ---- while the guest runs ----
    def host_run_delay_us(self):
        """How long QEMU's threads have waited on the host's run queues (schedstat), in us:
        time the guest's clock runs while its vCPUs do not, which TCG (no steal time) charges to
        whatever the guest was running."""
        waits = [corepin.run_delay_us(self.qemu_pid, t) for t in corepin.tids(self.qemu_pid)]
        return None if not waits or None in waits else sum(waits)

    def pin_vcpu(self):
        """budget1: vCPU 0 (the tracker's, guest-init binds it) on a host CPU of its own."""
        self.pin = corepin.CorePin(self.qemu_pid)
        core = self.pin.pin()
        self.pin_note = ("vCPU 0 alone on host CPU %d, the rest of the suite on the others" % core
                         if core is not None else "vCPU 0 not pinned: %s" % self.pin.why_not)
        self.swept = time.monotonic()

    def unpin_vcpu(self):
        if self.pin is not None:
            self.pin.release()
            self.pin = None

    def poll_channel(self):
        super().poll_channel()
        if self.pin is not None and time.monotonic() - self.swept > 1.0:
            self.pin.sweep()
            self.swept = time.monotonic()

    def run(self, cmd):
        try:
            super().run(cmd)
        finally:
            self.unpin_vcpu()

    def write_quota(self, quota):
        """The host's fast_quota_bytes (0x820), under the feedback seqlock."""
        mm = self.ch.mm
        s = struct.unpack_from("<Q", mm, 0x800)[0]
        s = s + 1 if s % 2 == 0 else s
        struct.pack_into("<Q", mm, 0x800, s)
        struct.pack_into("<Q", mm, 0x820, quota)
        struct.pack_into("<Q", mm, 0x800, s + 1)

    def hot_bytes(self):
        return len(self.truth.hot()) * 4096

    def on_line(self, line):
        m = re.match(r"VTSTAT (\S+) ", line)
        if m and m.group(1) not in self.host_wait:
            self.host_wait[m.group(1)] = self.host_run_delay_us()
            if self.pin is not None and self.pin.vcpu0 is not None:
                self.vcpu_wait[m.group(1)] = corepin.run_delay_us(self.qemu_pid, self.pin.vcpu0)
        if line.startswith("VTPHASE budget1 "):
            self.pin_vcpu()
        elif line.startswith("VTPHASE budget1-end "):
            self.unpin_vcpu()
        m = re.match(r"VTGT idle (\d+) (\d+)$", line)
        if m:
            first, n = int(m.group(1)), int(m.group(2))
            self.idle.update(range(first, first + n))
            return
        m = re.match(r"VTPHASE quota-(\S+) round=", line)
        if m:
            quota = {"hot": self.hot_bytes(), "wide": WIDE_QUOTA * self.hot_bytes(),
                     "none": 0}[m.group(1)]
            self.write_quota(quota)
            self.quota_written[m.group(1)] = quota
        super().on_line(line)

    # ---- after the guest stopped ----
    def warm(self):
        return self.truth.cold() - self.idle

    def levels(self, snap):
        """Level per 4 KiB frame of the round (a THP entry's level for each of its frames)."""
        lv = {}
        for e in snap["entries"]:
            d = decode(e)
            for g in (range(d["gfn"], d["gfn"] + 512) if d["huge"] else (d["gfn"],)):
                lv[g] = max(lv.get(g, 0), d["count"])
        return lv

    def top_n(self, snaps):
        """Per round, of the workload's frames ranked by level, the top N (N = the hot set's
        size, ties at the boundary included): (round, precision, recall, warm in it, idle in it,
        hot frames at 1 Hz or more)."""
        hot, warm, idle = self.truth.hot(), self.warm(), self.idle
        work = hot | warm | idle
        out = []
        for s in snaps:
            lv = self.levels(s)
            ranked = sorted((lv.get(g, 0) for g in work), reverse=True)
            cut = ranked[len(hot) - 1] if len(ranked) >= len(hot) else 0
            sel = {g for g in work if lv.get(g, 0) >= max(cut, 1)}
            tp = len(sel & hot)
            out.append((s["f"]["round"], tp / len(sel) if sel else 0.0, tp / len(hot),
                        len(sel & warm), len(sel & idle),
                        sum(1 for g in hot if lv.get(g, 0) >= LEVEL_1HZ)))
        return out

    def class_levels(self, snaps):
        """Median level per class over the rounds (a frame not published is level 0)."""
        cls = {"hot": self.truth.hot(), "warm": self.warm(), "idle": self.idle}
        acc = {k: [] for k in cls}
        for s in snaps:
            lv = self.levels(s)
            for k, frames in cls.items():
                acc[k].extend(lv.get(g, 0) for g in frames)
        return {k: (statistics.median(v) if v else 0) for k, v in acc.items()}

    def stat(self, phase, name):
        try:
            return int(self.stats[phase][name])
        except (KeyError, ValueError):
            return None

    def delta(self, a, b, name):
        x, y = self.stat(a, name), self.stat(b, name)
        return None if x is None or y is None else y - x

    def analyse(self):
        t = self.truth
        for n, ok, d in self.results:
            self.check("guest:" + n, ok, d)
        self.check("ground-truth", t.hot() and self.warm() and self.idle and
                   len(t.thp_heads) >= 1 and
                   not any(l.startswith("VTGT thp-bad") for l in self.lines),
                   "%d hot frames (%d THP units), %d warm frames (touched every 2 s), %d idle" % (
                       len(t.hot()), len(t.thp_heads), len(self.warm()), len(self.idle)))
        end = [l for l in self.lines if l.startswith("VTGT end")]
        self.check("frames-stable", end and "moved=0 thp_bad=0 " in end[0] + " ",
                   end[0] if end else "workload did not report its end")
        self.check_channel()
        self.tracker_report()
        self.check_rounds()
        steady = self.window("steady", "steady-end")
        self.check_hot_set(steady)
        self.check_quota()
        self.check_budget()
        self.check_sweeps()
        self.check_prune()
        self.check_tlb(steady)
        self.check_entries(steady)
        self.check_feedback()

    def check_channel(self):
        ch = self.ch
        bad = [s["f"]["round"] for s in self.snaps if not (
            s["f"]["vmin"] == 1 and s["f"]["tracker"] == 1 and
            s["f"]["region_size"] == ch.size and s["f"]["capacity"] == (ch.size - 4096) // 8)]
        self.check("channel-valid", self.snaps and not self.rejects and not bad,
                   "%d rounds read, all channel v1.1 from the module; %d rejected %s, %d with "
                   "another identity, %d torn/odd reads" % (
                       len(self.snaps), len(self.rejects), self.rejects[:3], len(bad), self.torn))

    def check_rounds(self):
        back, restarts, order_bad, hot_bad = [], 0, 0, []
        for p, q in zip(self.snaps, self.snaps[1:]):
            r0, r1 = p["f"]["round"], q["f"]["round"]
            if r1 <= r0:
                if {p["phase_seen"], q["phase_seen"]} & {"churn-end", "reload"}:
                    restarts += 1
                else:
                    back.append((r0, r1, q["phase_seen"]))
            elif q["f"]["publish_ns"] <= p["f"]["publish_ns"]:
                back.append((r0, r1, "time"))
        for s in self.snaps:
            if s["entries"] is None:
                continue
            cnts = [decode(e)["count"] for e in s["entries"]]
            if any(a < b for a, b in zip(cnts, cnts[1:])) or 0 in cnts:
                order_bad += 1
            f = s["f"]
            at1hz = sum(512 if decode(e)["huge"] else 1 for e in s["entries"]
                        if decode(e)["count"] >= LEVEL_1HZ)
            if (f["hot_frames"] < at1hz) if f["flags"] & chanmon.OVERFLOW else \
                    (f["hot_frames"] != at1hz):
                hot_bad.append(f["round"])
        self.check("rounds-consistent",
                   self.snaps and not back and not order_bad and not hot_bad and restarts >= 1,
                   "%d rounds, %d restarts across reloads, %d out of order %s, %d not hottest "
                   "first (or with level 0), %d where hot_frames is not the frames at >= 1 Hz %s"
                   % (len(self.snaps), restarts, len(back), back[:3], order_bad, len(hot_bad),
                      hot_bad[:3]))
        # the round period: scan_interval_ms is the period in effect, rounds at least round_ms
        # apart; the period is round_ms unless a publication took more than a quarter of the
        # budget's share of it (then 4 x publication / budget)
        round_ms = self.stat("steady", "param_round_ms")
        bp = self.stat("steady", "param_cpu_budget_bp")
        pub_max = self.stat("steady", "max_publish_us")
        st = [s for s in self.window("steady", "steady-end")]
        gaps = [(q["f"]["publish_ns"] - p["f"]["publish_ns"]) / 1e6
                for p, q in zip(st, st[1:]) if q["f"]["round"] == p["f"]["round"] + 1]
        ivs = [s["f"]["interval_ms"] for s in st]
        stretch = max(round_ms, pub_max * 40 // bp + 1) if round_ms and bp and \
            pub_max is not None else None
        odd = sorted({i for i in ivs if i != round_ms and not (stretch and i <= stretch)})
        self.check("round-interval", stretch and gaps and not odd and
                   statistics.median(ivs) == round_ms and min(gaps) >= 0.95 * round_ms,
                   "steady rounds publish scan_interval_ms %s (round_ms=%s, median %s; the "
                   "longest publication, %s us, allows up to %s ms), %s ms apart "
                   "(min/median/max); unexplained %s" % (
                       sorted(set(ivs)), round_ms, statistics.median(ivs) if ivs else "-",
                       pub_max, stretch, "%.0f/%.0f/%.0f" % (
                           min(gaps), statistics.median(gaps), max(gaps)) if gaps else "-", odd))

    def check_hot_set(self, steady):
        res = self.top_n(steady)
        if not res:
            self.check("precision-recall", False, "no rounds in the steady window")
            return
        pmin, rmin = min(x[1] for x in res), min(x[2] for x in res)
        last = res[-1]
        self.check("precision-recall", pmin >= 0.9 and rmin >= 0.9,
                   "%d steady rounds, the workload's frames ranked by level, top N = %d (the hot "
                   "set): precision min %.3f, recall min %.3f; last round %.3f/%.3f with %d warm "
                   "and %d idle frames in the top N, %d of the hot frames at >= 1 Hz" % (
                       len(res), len(self.truth.hot()), pmin, rmin, last[1], last[2], last[3],
                       last[4], last[5]))
        med = self.class_levels(steady)
        self.check("rate-order", med["hot"] > med["warm"] > med["idle"],
                   "median level over the steady rounds: hot %s (%.2f Hz), warm %s (%.3f Hz, "
                   "touched every 2 s: 0.5 Hz), idle %s" % (
                       med["hot"], rate_hz(med["hot"]), med["warm"], rate_hz(med["warm"]),
                       med["idle"]))

    def check_quota(self):
        """The window loops follow fast_quota_bytes: the goal is quota / tracked frames (clamped
        to 1%..50%), and windows widen when the quota grows (more frames should look hot)."""
        hot, wide = self.stats.get("steady", {}), self.stats.get("quota-wide", {})
        try:
            tracked = int(hot["tracked_frames"])
            g_hot, g_wide = int(hot["access_goal_ppm"]), int(wide["access_goal_ppm"])
            q_hot, q_wide = int(hot["feedback_fast_quota_bytes"]), int(
                wide["feedback_fast_quota_bytes"])
            wf = (int(hot["fine_window_us"]), int(wide["fine_window_us"]))
            wc = (int(hot["coarse_window_us"]), int(wide["coarse_window_us"]))
            tracked_w = int(wide["tracked_frames"])
        except (KeyError, ValueError):
            self.check("quota-follow", False, "statistics of the quota phases missing")
            return

        def want(q, n):
            return min(max(q // 4096 * 10**6 // max(n, 1), 10000), 500000)
        ok_goal = abs(g_hot - want(q_hot, tracked)) <= want(q_hot, tracked) // 10 + 1 and \
            abs(g_wide - want(q_wide, tracked_w)) <= want(q_wide, tracked_w) // 10 + 1
        self.check("quota-follow",
                   q_hot == self.quota_written.get("hot") and
                   q_wide == self.quota_written.get("wide") and ok_goal and g_wide > g_hot and
                   wf[1] > wf[0] and wc[1] >= wc[0],
                   "fast_quota_bytes %d (the hot set) then %d: goal %.1f%% then %.1f%% of %d/%d "
                   "tracked frames young per window; fine window %.1f -> %.1f ms, coarse window "
                   "%.2f -> %.2f ms" % (q_hot, q_wide, g_hot / 1e4, g_wide / 1e4, tracked,
                                        tracked_w, wf[0] / 1e3, wf[1] / 1e3, wc[0] / 1e3,
                                        wc[1] / 1e3))

    def check_budget(self):
        """Tracker CPU / elapsed within cpu_budget_bp plus the 1 s of budget it may bank, over
        phases that end at a round where the tracker owed nothing (guest-init's stats_repaid).
        A step is paid before its cost is known, and under TCG a host preemption inside one is
        charged to it as CPU, so credit can fall below zero; the debt is repaid by sleeping
        before more work. Its CPU, its clock and its debt are reported for the same moment."""
        rows = []
        for a, b in (("steady-start", "steady"), ("quota-wide-start", "quota-wide"),
                     ("noprune-start", "noprune"), ("budget1-start", "budget1")):
            cpu, el = self.delta(a, b, "cpu_us"), self.delta(a, b, "elapsed_us")
            bp, debt = self.stat(b, "param_cpu_budget_bp"), self.stat(b, "debt_us")
            if cpu is None or not el or bp is None or debt is None:
                continue
            hw = self.host_wait.get(a), self.host_wait.get(b)
            rows.append((a, cpu, el, bp, debt == 0 and cpu <= bp / 1e4 * (el + 1e6), debt,
                         self.stat(b, "overdraw_us"),
                         None if None in hw else hw[1] - hw[0]))
        waits = self.delta("budget1-start", "budget1", "budget_waits")
        bursts = self.delta("budget1-start", "budget1", "bursts")
        cw = self.delta("budget1-start", "budget1", "coarse_windows")
        el1 = self.delta("budget1-start", "budget1", "elapsed_us")
        cpu1 = self.delta("budget1-start", "budget1", "cpu_us")
        # A budget spent on waking up to find it short observes nothing (the livelock this
        # guards against opened 1-2 coarse windows in 11 s and no burst); coarse windows leave a
        # quarter of the budget to fine bursts, however costly they are under TCG.
        hw = self.host_wait.get("budget1-start"), self.host_wait.get("budget1")
        vw = self.vcpu_wait.get("budget1-start"), self.vcpu_wait.get("budget1")
        self.check("budget-progress", cw is not None and cw >= 3 and bursts,
                   "cpu_budget_bp=100 (the default, 1%%) under TCG: %s coarse windows and %s "
                   "fine bursts in %.1f s (%.1f ms of CPU, largest debt lately %s us), %s budget "
                   "waits; QEMU's threads waited %s ms on the host's run queues, vCPU 0 %s ms "
                   "(%s)" % (
                       cw, bursts, (el1 or 0) / 1e6, (cpu1 or 0) / 1e3,
                       self.stat("budget1", "overdraw_us"), waits,
                       "?" if None in hw else (hw[1] - hw[0]) // 1000,
                       "?" if None in vw else (vw[1] - vw[0]) // 1000, self.pin_note))
        # A bank less the coarse reserve (at most half of it) that pays for less than one
        # region's burst: a burst that waited for all of it never came (the testbed's slow
        # nested guest made one sweep in 377 s).
        tb = self.delta("bank-tiny-start", "bank-tiny", "bursts")
        tel = self.delta("bank-tiny-start", "bank-tiny", "elapsed_us")
        region = self.stat("bank-tiny", "region_burst_us")
        tbp = self.stat("bank-tiny", "param_cpu_budget_bp")
        tms = self.stat("bank-tiny", "param_credit_bank_ms")
        bank = tbp * tms / 10 if None not in (tbp, tms) else None
        self.check("bank-progress",
                   None not in (tb, region, bank) and region > bank / 2 and tb >= 3,
                   "credit_bank_ms=%s at cpu_budget_bp=%s: a bank of %s us, one region's burst "
                   "%s us; %s fine bursts in %.1f s" % (tms, tbp, bank, region, tb,
                                                        (tel or 0) / 1e6))
        self.check("cpu-budget", len(rows) == 4 and all(r[4] for r in rows),
                   "; ".join("%s: %.1f ms of CPU in %.1f s = %.2f%% of a vCPU (budget %.2f%%, "
                             "debt at its end %s us, largest lately %s us; QEMU's threads "
                             "waited %s ms on the host's run queues)" % (
                                 a.replace("-start", ""), cpu / 1e3, el / 1e6, 100.0 * cpu / el,
                                 bp / 100, debt, od, "?" if hw is None else hw // 1000)
                             for a, cpu, el, bp, _, debt, od, hw in rows) or "no statistics")
        w = self.delta("steady-start", "steady", "fine_windows")
        c = self.delta("steady-start", "steady", "coarse_windows")
        cpu = self.delta("steady-start", "steady", "cpu_us")
        reg = self.delta("steady-start", "steady", "regions_visited")
        ptes = self.delta("steady-start", "steady", "ptes_visited")
        el = self.delta("steady-start", "steady", "elapsed_us")
        if None not in (w, c, cpu, reg, ptes, el) and el > 0:
            self.notes.append(("windows", "steady: %d coarse windows (%.1f/s, %d region visits), "
                              "%d fine windows (%.1f/s, %d PTEs visited), %.0f us of CPU per "
                              "window on average (all work included)" % (
                                  c, c / el * 1e6, reg, w, w / el * 1e6, ptes,
                                  cpu / max(w + c, 1))))

    def check_sweeps(self):
        """The seed's adaptive interval bounds the fine sweep: start-to-start >= the bound."""
        bad, seen = [], 0
        for ph, st in self.stats.items():
            try:
                gap, bound = int(st["last_sweep_gap_ms"]), int(st["last_sweep_bound_ms"])
                cpu = int(st["last_sweep_cpu_us"])
                k, kb, base, cap = (int(st["param_interval_" + n])
                                    for n in ("k", "kb", "base_ms", "max_ms"))
            except (KeyError, ValueError):
                continue
            if not gap:
                continue
            seen += 1
            formula = ((k * cpu * cpu) // 1000 + kb * cpu) // 1000 + base
            formula = min(formula, cap) if cap else formula
            if gap + 1 < bound or bound != formula:
                bad.append((ph, gap, bound, formula))
        self.check("sweep-interval", seen and not bad,
                   "%d snapshots: the gap between fine sweeps is at least T = (K*Ts+Kb)*Ts+Tbase "
                   "for the last sweep's CPU Ts; violations %s" % (seen, bad[:3]))

    def check_prune(self):
        nop = self.top_n(self.window("noprune", "noprune-end"))

        def per_round(a, b, name):
            d, r = self.delta(a, b, name), self.delta(a, b, "rounds")
            return d / r if d is not None and r else -1
        vis_p = per_round("steady-start", "steady", "ptes_visited")
        vis_n = per_round("noprune-start", "noprune", "ptes_visited")
        sk_p = per_round("steady-start", "steady", "pmd_skipped")
        sk_n = per_round("noprune-start", "noprune", "pmd_skipped")
        pud_p = per_round("steady-start", "steady", "pud_skipped")
        pud_n = per_round("noprune-start", "noprune", "pud_skipped")
        self.check("prune-equivalent",
                   nop and min(x[1] for x in nop) >= 0.9 and min(x[2] for x in nop) >= 0.9 and
                   sk_p > 0 and sk_n == 0 and pud_p > 0 and pud_n == 0 and 0 < vis_p < vis_n,
                   "prune=0: P/R min %.3f/%.3f over %d rounds; per round, pruned vs full: PTE "
                   "tables skipped %.1f vs %.1f, PUD subtrees skipped %.1f vs %.1f, PTEs visited "
                   "%.0f vs %.0f" % (min((x[1] for x in nop), default=0),
                                     min((x[2] for x in nop), default=0), len(nop), sk_p, sk_n,
                                     pud_p, pud_n, vis_p, vis_n))

    def check_tlb(self, steady):
        """The bias of clearing without a TLB flush: measured, reported; the default flushes."""
        notlb = self.window("notlb", "notlb-end")
        a, b = self.top_n(steady), self.top_n(notlb)
        ma, mb = self.class_levels(steady), self.class_levels(notlb)
        if a and b:
            self.notes.append(("tlb-bias", "with the flush (steady) vs tlb_flush=0, %d/%d rounds: "
                              "recall of the hot set min %.3f vs %.3f, precision min %.3f vs "
                              "%.3f; median level hot %s vs %s (%.1f vs %.1f Hz), warm %s vs %s, "
                              "hot frames at >= 1 Hz %d vs %d of %d" % (
                                  len(a), len(b), min(x[2] for x in a), min(x[2] for x in b),
                                  min(x[1] for x in a), min(x[1] for x in b), ma["hot"],
                                  mb["hot"], rate_hz(ma["hot"]), rate_hz(mb["hot"]), ma["warm"],
                                  mb["warm"], a[-1][5], b[-1][5], len(self.truth.hot()))))
        fl = self.delta("notlb-start", "notlb", "tlb_flushes")
        self.check("tlb-bias-measured", len(a) >= 3 and len(b) >= 3 and fl == 0,
                   "%d rounds with the flush, %d with tlb_flush=0 (%s flushes in that phase); "
                   "the figures are in INFO tlb-bias" % (len(a), len(b), fl))

    def check_entries(self, steady):
        t = self.truth
        tbad = wbad = seen = 0
        thp_bad = []
        for s in steady:
            heads = set()
            for e in s["entries"]:
                d = decode(e)
                if d["huge"]:
                    heads.add(d["gfn"])
                k = t.kind.get(d["gfn"])
                if not k or k[0] == "cold":
                    continue
                seen += 1
                tbad += d["type"] != chanmon.TYPES[k[1]]
                wbad += d["write"] != k[2]
                if (k[0] == "thp") != bool(d["huge"]):
                    thp_bad.append(d["gfn"])
            thp_bad += [h for h in t.thp_heads if h not in heads]
        self.check("page-types", seen and not tbad,
                   "%d hot entries checked (anon/file/shmem/THP), %d wrong type" % (seen, tbad))
        self.check("write-bit", seen and not wbad,
                   "%d hot entries checked: written anon/shmem/THP have it, so do anon pages "
                   "written once and then only read (Dirty never cleared), read-only file pages "
                   "not; %d wrong" % (seen, wbad))
        self.check("thp-units", steady and t.thp_heads and not thp_bad,
                   "%d THP units reported as 2 MiB entries in %d rounds; mismatches %s" % (
                       len(t.thp_heads), len(steady), thp_bad[:3]))

    def check_feedback(self):
        fbw = self.window("feedback", "feedback-end")
        cold = self.truth.cold()
        bad = []
        for s in fbw:
            f, es = s["f"], s["entries"]
            cnts = [decode(e)["count"] for e in es]
            coldin = [e for e in es if decode(e)["gfn"] in cold]
            if not (f["count"] == FEEDBACK_BUDGET and f["flags"] & chanmon.OVERFLOW and
                    all(a >= b for a, b in zip(cnts, cnts[1:])) and not coldin and
                    f["interval_ms"] >= FEEDBACK_MIN_MS):
                bad.append((f["round"], f["count"], f["flags"], f["interval_ms"], len(coldin)))
        gaps = [(q["f"]["publish_ns"] - p["f"]["publish_ns"]) / 1e6
                for p, q in zip(fbw, fbw[1:]) if q["f"]["round"] == p["f"]["round"] + 1]
        # The first round without the budget: the host clears it when its serial poll reads
        # feedback-end, which a loaded machine may delay by rounds; a round after the one that
        # followed the channel's round at that write (chanmon.round_now) was published knowing it
        end = self.phase_round("feedback-end")
        xe = self.fb_written.get("feedback-end")
        first = None if end is None else end + 2 if xe is None else max(end + 2, xe + 1)
        after = [s for s in self.snaps if s["entries"] is not None and first is not None and
                 s["f"]["round"] > first]
        self.check("feedback-budget", fbw and not bad and after and
                   after[0]["f"]["count"] > FEEDBACK_BUDGET,
                   "%d rounds with entry_budget=%d: that many entries, OVERFLOW, hottest first, "
                   "none of them warm or idle; bad %s; after reset count=%s" % (
                       len(fbw), FEEDBACK_BUDGET, bad[:3],
                       after[0]["f"]["count"] if after else None))
        self.check("feedback-min-interval", gaps and min(gaps) >= FEEDBACK_MIN_MS,
                   "consecutive rounds %s ms apart with min_interval_ms=%d" % (
                       [round(g) for g in gaps], FEEDBACK_MIN_MS))

    def report(self):
        for name, detail in self.notes:
            print("INFO %s/%s: %s" % (self.a.label, name, detail))
        return super().report()


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    i = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--channel", required=True)
    ap.add_argument("--serial", required=True)
    ap.add_argument("--label", default="guest")
    ap.add_argument("--timeout", type=int, default=600)
    a = ap.parse_args(argv[:i])
    a.tracker = "module"
    a.channel_minor = 1
    chanmon.end_on_sigterm()
    m = ModuleMonitor(a)
    m.run(argv[i + 1:])
    chanmon.exit_if_boot_hung(m)
    m.analyse()
    sys.exit(1 if m.report() else 0)


if __name__ == "__main__":
    main()
