#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Host side of the vtism_guest e2e test.

Starts the guest (the QEMU command after "--"), follows its serial log, reads the hint channel
file while the guest runs exactly as the host daemon would (seqlock copy, then validation per
docs/channel.md), answers through the feedback block, and at the end checks what the guest
published against the workload's ground truth.

usage: chanmon.py --channel FILE --serial LOG --label 6.1 [--timeout S] -- qemu-system-x86_64 ...

Prints one "PASS <label>/<check>: ..." or "FAIL <label>/<check>: ..." line per check, and
"INFO <label>/...: ..." lines with what the tracker reported (channel v1.1), and exits non-zero if
any check failed. Standard library only.
"""
import argparse
import mmap
import os
import re
import signal
import struct
import subprocess
import sys
import time

MAGIC = 0x3148434D53495456
HDR = 4096
OVERFLOW = 1
KNOWN_MINORS = (0, 1)  # this reader's versions: v1.0 and v1.1
HOST_VERSION = 1 << 16 | 1
# Reserved guest-header bytes (offset, end) by writer minor version; flags apart
RESERVED = {0: ((0x30, 0x40), (0x64, 0x68), (0x80, 0x800)),
            1: ((0x30, 0x40), (0x8C, 0x90), (0x98, 0x800))}
LEVEL_1HZ = 96  # v1.1 count: rate level, 2^(count/16 - 6) accesses per second
RES_ENTRY = ~((1 << 53) - 1) & 0xFFFFFFFFFFFFFFFF
TYPES = {"anon": 1, "file": 2, "shmem": 3}

# steady-state window of the scenario: params are fixed, rounds are fully checked
ANALYSED_PHASES = ("steady", "noprune", "thr1", "feedback")
FEEDBACK_BUDGET = 64
FEEDBACK_MIN_MS = 2500


class Reject(Exception):
    """A rejected round: args are the reject label of docs/channel.md and a detail."""


class Channel:
    """A reader of the channel file per docs/channel.md (copy, then validate the copy)."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        self.size = os.fstat(self.fd).st_size
        self.mm = mmap.mmap(self.fd, self.size)

    def u64(self, off):
        return struct.unpack_from("<Q", self.mm, off)[0]

    def snapshot(self):
        return snapshot(self.mm, self.size)

    def write_feedback(self, budget, min_ms, ack=0):
        s = self.u64(0x800)
        s = s + 1 if s % 2 == 0 else s
        struct.pack_into("<Q", self.mm, 0x800, s)  # odd: writing
        struct.pack_into("<QQI", self.mm, 0x808, ack, budget, min_ms)
        struct.pack_into("<I", self.mm, 0x830, HOST_VERSION)
        struct.pack_into("<Q", self.mm, 0x800, s + 1)


def snapshot(mem, size):
    """Copy one round out of `mem` (the mapped channel, `size` bytes) under the seqlock: (header
    bytes, entry bytes), or None while the guest writes (seq odd or changed). Only a region too
    small to hold the header is returned short: validate() rejects it first."""
    if size < HDR:
        return bytes(mem[0:size]), b""
    s1 = struct.unpack_from("<Q", mem, 0x40)[0]
    if s1 & 1:
        return None
    hdr = bytes(mem[0:HDR])
    eo = struct.unpack_from("<I", hdr, 0x18)[0]
    cap, count = struct.unpack_from("<Q", hdr, 0x20)[0], struct.unpack_from("<Q", hdr, 0x50)[0]
    # bounded by the mapping whatever the header says; validate() judges the header
    n = min(count, cap, max(0, (size - eo) // 8)) if eo >= HDR and eo % 8 == 0 else 0
    ent = bytes(mem[eo:eo + 8 * n])
    if struct.unpack_from("<Q", mem, 0x40)[0] != s1:
        return None
    return hdr, ent


def parse_header(hdr):
    f = {}
    (f["magic"], f["vmaj"], f["vmin"], f["header_size"], f["region_size"], f["entries_offset"],
     f["entry_size"], f["capacity"], f["tracker"], f["page_shift"]) = struct.unpack_from(
        "<QHHIQIIQII", hdr, 0)
    (f["seq"], f["round"], f["count"], f["flags"], f["interval_ms"], f["scan_us"], f["window_us"],
     f["tracked_bytes"], f["hot_frames"], f["publish_ns"]) = struct.unpack_from(
        "<QQQIIIIQQQ", hdr, 0x40)
    # v1.1 (zero, reserved, from a v1.0 writer)
    (f["windows"], f["tracker_cpu_us"], f["coarse_window_us"], f["res_pub"],
     f["tracked_frames"]) = struct.unpack_from("<IIIIQ", hdr, 0x80)
    return f


def rate_hz(level):
    """Accesses per second a v1.1 count stands for."""
    return 2.0 ** ((level - LEVEL_1HZ) / 16.0)


def ram_runs(ram):
    """RAM ranges [start, end) with adjacent ones joined: a 2 MiB unit may span two."""
    runs = []
    for lo, hi in sorted(ram):
        if runs and runs[-1][1] == lo:
            runs[-1][1] = hi
        else:
            runs.append([lo, hi])
    return runs


def validate(hdr, ent, mapped, ram):
    """docs/channel.md "Validation", in its order, on a snapshot(). Returns (header fields,
    entries); raises Reject(label, detail)."""
    if mapped < HDR:
        raise Reject("region_too_small", "%d bytes mapped" % mapped)
    f = parse_header(hdr)
    if f["magic"] != MAGIC:
        raise Reject("bad_magic", "%#x" % f["magic"])
    if f["vmaj"] != 1:
        raise Reject("unsupported_version", "%d.%d" % (f["vmaj"], f["vmin"]))
    if (f["header_size"] != 4096 or f["entry_size"] != 8 or f["page_shift"] != 12
            or f["entries_offset"] < f["header_size"] or f["entries_offset"] % 8):
        raise Reject("bad_layout", "")
    if f["region_size"] > mapped:
        raise Reject("region_too_small", "region_size %d" % f["region_size"])
    if f["entries_offset"] + f["capacity"] * 8 > f["region_size"]:
        raise Reject("capacity_beyond_region", "%d" % f["capacity"])
    if f["count"] > f["capacity"]:
        raise Reject("count_beyond_capacity", "%d" % f["count"])
    # what a v1.2+ writer puts in space reserved to this reader is ignored
    if f["vmin"] in RESERVED and (any(any(hdr[a:b]) for a, b in RESERVED[f["vmin"]])
                                  or f["flags"] & ~OVERFLOW):
        raise Reject("reserved_header_bits", "v1.%d writer" % f["vmin"])
    es = struct.unpack("<%dQ" % (len(ent) // 8), ent)
    runs = ram_runs(ram)
    for i, e in enumerate(es):
        if e & RES_ENTRY:
            raise Reject("reserved_entry_bits", "entry %d" % i)
        gfn, huge = e & ((1 << 40) - 1), (e >> 51) & 1
        last = gfn + (511 if huge else 0)
        if not any(lo <= gfn and last < hi for lo, hi in runs):
            raise Reject("gfn_out_of_range", "entry %d: %#x" % (i, gfn))
        if huge and gfn % 512:
            raise Reject("misaligned_huge", "entry %d: %#x" % (i, gfn))
    return f, es


def decode(e):
    return dict(gfn=e & ((1 << 40) - 1), count=(e >> 40) & 0xFF, write=(e >> 48) & 1,
                type=(e >> 49) & 3, huge=(e >> 51) & 1, young=(e >> 52) & 1)


def interval_ms(scan_us, k, kb, base, cap, floor):
    """Module's formula: T = (K*Ts + Kb)*Ts + Tbase, Ts = scan_us/1000 ms, integer division."""
    t = ((k * scan_us * scan_us) // 1000 + kb * scan_us) // 1000 + base
    if cap and t > cap:
        t = cap
    return min(max(t, floor), 0xFFFFFFFF)


class Truth:
    def __init__(self):
        self.kind = {}  # gfn -> (class, type, write)
        self.thp_heads = []

    def add(self, cls, typ, write, first, n):
        for g in range(first, first + n):
            self.kind[g] = (cls, typ, write)
        if cls == "thp":
            self.thp_heads.append(first)

    def hot(self):
        return {g for g, k in self.kind.items() if k[0] in ("hot", "thp")}

    def cold(self):
        return {g for g, k in self.kind.items() if k[0] == "cold"}


# A TCG guest reaches its init (VTBOOT) in seconds, a minute beside the other suites; one that has
# not in this long hung in early boot, before anything of ours ran (seen once on 6.1 with -smp 2:
# an empty serial log for 600 s). The suite boots it again (BOOT_HUNG).
BOOT_LIMIT_S = 240
BOOT_HUNG = 3


def exit_if_boot_hung(m):
    """After `run`: a guest that hung in early boot is no result; BOOT_HUNG tells the suite."""
    if m.boot_hung:
        size = os.path.getsize(m.a.serial) if os.path.exists(m.a.serial) else 0
        print("HUNG %s: no VTBOOT within %d s: the guest never reached its init (serial log %d "
              "bytes)" % (m.a.label, BOOT_LIMIT_S, size))
        sys.exit(BOOT_HUNG)


def end_on_sigterm():
    """A SIGTERM (the suite stopped from outside) ends the monitor through its finally clauses:
    its guest is ended, and a host CPU it pinned (corepin) given back."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


class Monitor:
    def __init__(self, a):
        self.a = a
        self.ch = None
        self.lines = []
        self.phases = []  # (name, round)
        self.results = []  # (name, ok, detail) from the guest
        self.stats = {}  # phase -> {name: value}
        self.truth = Truth()
        self.ram = []
        self.snaps = []  # dict(f, entries or None, t, phase_seen)
        self.rejects = []
        self.torn = 0
        self.done = False
        self.booted = False
        self.boot_hung = False
        self.buf = b""
        self.phase_seen = None
        self.keep_entries = True
        self.checks = []
        self.info = []  # (name, detail): reported, never failed
        # phase -> the channel's round just after the host wrote its answer to that phase line
        # (round_now()): the round after it may have read the feedback block before the write,
        # the one after that cannot have
        self.fb_written = {}

    def check(self, name, ok, detail):
        self.checks.append((name, bool(ok), detail))

    def round_now(self):
        """The round the channel holds now (a consistent copy; None if the guest keeps writing).
        Read after a write to the feedback block it bounds which rounds were published knowing
        it: the guest reads the block once per round before publishing, so round X + 2 and later
        read it, whenever the host's serial poll saw the phase line that asked for it."""
        for _ in range(500):
            snap = self.ch.snapshot()
            if snap is not None:
                return parse_header(snap[0])["round"]
            time.sleep(0.002)
        return None

    # ---- while the guest runs ----
    def on_line(self, line):
        self.lines.append(line)
        m = re.match(r"VTPHASE (\S+) round=(\d+)", line)
        if m:
            name, r = m.group(1), int(m.group(2))
            self.phases.append((name, r))
            self.phase_seen = name
            if name == "feedback-request":
                self.ch.write_feedback(FEEDBACK_BUDGET, FEEDBACK_MIN_MS)
                self.fb_written[name] = self.round_now()
            elif name == "feedback-end":
                self.ch.write_feedback(0, 0)
                self.fb_written[name] = self.round_now()
            elif name == "fast":
                self.keep_entries = False  # fast rounds from here: validate, don't keep
            return
        m = re.match(r"VTGT (hot|cold|thp) (\w+) (\d) (\d+) (\d+)$", line)
        if m:
            self.truth.add(m.group(1), m.group(2), int(m.group(3)), int(m.group(4)),
                           int(m.group(5)))
            return
        m = re.match(r"VTRAM ([0-9a-f]+)-([0-9a-f]+) : System RAM", line)
        if m:
            self.ram.append((int(m.group(1), 16) >> 12, (int(m.group(2), 16) + 1) >> 12))
            return
        m = re.match(r"VTRESULT (\S+) (ok|fail) ?(.*)", line)
        if m:
            self.results.append((m.group(1), m.group(2) == "ok", m.group(3)))
            return
        m = re.match(r"VTSTAT (\S+) (\S+) (\S+)", line)
        if m:
            self.stats.setdefault(m.group(1), {})[m.group(2)] = m.group(3)
            return
        if line.startswith("VTBOOT"):
            self.booted = True
        if line.startswith("VTDONE"):
            self.done = True

    def poll_serial(self, f):
        data = f.read()
        if not data:
            return
        self.buf += data
        *full, self.buf = self.buf.split(b"\n")
        for raw in full:
            self.on_line(raw.decode("utf-8", "replace").rstrip("\r"))

    def poll_channel(self):
        snap = self.ch.snapshot()
        if snap is None:
            self.torn += 1
            return
        hdr, ent = snap
        f = parse_header(hdr)
        if f["magic"] == 0 and f["round"] == 0:
            return  # not initialised yet
        if self.snaps and self.snaps[-1]["f"]["round"] == f["round"] and \
                self.snaps[-1]["f"]["publish_ns"] == f["publish_ns"]:
            return
        if not self.ram:
            return  # RAM map not known yet (printed before the module loads)
        try:
            f, es = validate(hdr, ent, self.ch.size, self.ram)
        except Reject as e:
            self.rejects.append((f["round"], "%s (%s)" % e.args))
            return
        self.snaps.append(dict(f=f, entries=es if self.keep_entries else None,
                               t=time.monotonic(), phase_seen=self.phase_seen))

    def run(self, cmd):
        self.ch = Channel(self.a.channel)
        open(self.a.serial, "wb").close()
        qemu = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        self.qemu_pid = qemu.pid
        started = time.monotonic()
        deadline = started + self.a.timeout
        timed_out = False
        try:
            with open(self.a.serial, "rb") as f:
                while qemu.poll() is None:
                    self.poll_serial(f)
                    self.poll_channel()
                    now = time.monotonic()
                    if not self.booted and now - started > BOOT_LIMIT_S:
                        self.boot_hung = True
                        break
                    if now > deadline:
                        timed_out = True
                        break
                    time.sleep(0.02)
                self.poll_serial(f)
        finally:
            # On a timeout, and when the monitor itself is stopped: the guest is ours, end it.
            if qemu.poll() is None:
                qemu.send_signal(signal.SIGTERM)
                try:
                    qemu.wait(10)
                except subprocess.TimeoutExpired:
                    qemu.kill()
                    qemu.wait()
        if self.boot_hung:
            return
        self.check("guest-finished", self.done and not timed_out,
                   "timed out after %ds" % self.a.timeout if timed_out else
                   "VTDONE seen, qemu exit %s" % qemu.returncode if self.done else
                   "guest stopped before VTDONE (qemu exit %s)" % qemu.returncode)

    # ---- after the guest stopped ----
    def phase_round(self, name):
        for n, r in self.phases:
            if n == name:
                return r
        return None

    def window(self, start, end):
        a, b = self.phase_round(start), self.phase_round(end)
        if a is None or b is None:
            return []
        return [s for s in self.snaps if s["entries"] is not None and a < s["f"]["round"] <= b]

    def frames(self, es):
        r = set()
        for e in es:
            d = decode(e)
            if d["huge"]:
                r.update(range(d["gfn"], d["gfn"] + 512))
            else:
                r.add(d["gfn"])
        return r

    def pr(self, snaps):
        hot, cold = self.truth.hot(), self.truth.cold()
        out = []
        dump = os.environ.get("VTISM_E2E_DUMP")
        for s in snaps:
            rep = self.frames(s["entries"])
            if dump:  # diagnostics: the cold frames each round reported
                with open(dump, "a") as f:
                    f.write("%d %s\n" % (s["f"]["round"], sorted(rep & cold)))
            tp = len(rep & hot)
            fp = len(rep & cold)
            prec = tp / (tp + fp) if tp + fp else 0.0
            rec = tp / len(hot) if hot else 0.0
            out.append((s["f"]["round"], prec, rec, fp, len(rep - hot - cold)))
        return out

    def analyse(self):
        ch, t = self.ch, self.truth
        guest_ok = {n: ok for n, ok, _ in self.results}
        for n, ok, d in self.results:
            self.check("guest:" + n, ok, d)
        self.check("ground-truth", t.hot() and t.cold() and len(t.thp_heads) >= 1 and
                   not any(l.startswith("VTGT thp-bad") for l in self.lines),
                   "%d hot frames (%d THP units), %d cold frames" % (
                       len(t.hot()), len(t.thp_heads), len(t.cold())))
        moved = [l for l in self.lines if l.startswith("VTGT end")]
        self.check("frames-stable", moved and "moved=0 thp_bad=0 " in moved[0] + " ",
                   moved[0] if moved else "workload did not report its end")

        # every round read is a valid round of the tracker, in one channel version throughout
        params = self.stats.get("steady", {})
        ident = [s["f"] for s in self.snaps]
        minors = sorted({f["vmin"] for f in ident})
        want_minors = KNOWN_MINORS if self.a.channel_minor is None else (self.a.channel_minor,)
        bad_ident = [f["round"] for f in ident if not (
            f["vmin"] in want_minors and f["tracker"] == (2 if self.a.tracker == "damon" else 1) and
            f["region_size"] == ch.size and f["capacity"] == (ch.size - HDR) // 8)]
        self.check("channel-valid", self.snaps and not self.rejects and not bad_ident and
                   len(minors) == 1,
                   "%d rounds read (channel v1.%s), %d rejected %s, %d bad identity, %d torn/odd "
                   "reads" % (len(self.snaps), "/".join(map(str, minors)), len(self.rejects),
                              self.rejects[:3], len(bad_ident), self.torn))
        self.tracker_report()

        # rounds: +1 steps (we may miss some), restart from 1 only across a module reload
        back, unload_a = [], self.phase_round("churn-end")
        restarts = 0
        for p, q in zip(self.snaps, self.snaps[1:]):
            r0, r1 = p["f"]["round"], q["f"]["round"]
            if r1 <= r0:
                if p["phase_seen"] in ("churn-end", "reload") or \
                        q["phase_seen"] in ("churn-end", "reload"):
                    restarts += 1
                else:
                    back.append((r0, r1, q["phase_seen"]))
            elif q["f"]["publish_ns"] <= p["f"]["publish_ns"]:
                back.append((r0, r1, "time"))
        order_bad = 0
        ovf_bad = []
        for s in self.snaps:
            if s["entries"] is None:
                continue
            cnts = [decode(e)["count"] for e in s["entries"]]
            if any(a < b for a, b in zip(cnts, cnts[1:])):
                order_bad += 1
            f = s["f"]
            # v1.0: every entry is hot; v1.1: hot_frames counts frames at 1 Hz or more
            cover = sum(512 if decode(e)["huge"] else 1 for e in s["entries"]
                        if f["vmin"] == 0 or decode(e)["count"] >= LEVEL_1HZ)
            if f["flags"] & OVERFLOW:
                # v1.0: more hot frames than published; v1.1: dropped entries may be cooler
                if (f["vmin"] == 0 and f["hot_frames"] <= cover and f["count"] > 0) or \
                        f["hot_frames"] < cover:
                    ovf_bad.append(f["round"])
            elif f["hot_frames"] != cover:
                ovf_bad.append(f["round"])
        self.check("rounds-consistent",
                   self.snaps and not back and not order_bad and not ovf_bad and
                   (self.a.tracker == "damon" or (restarts >= 1 and unload_a is not None)),
                   "%d rounds, round %d..%d, %d restarts across reloads, %d out of order %s, "
                   "%d not hottest-first, %d hot_frames/OVERFLOW mismatches %s" % (
                       len(self.snaps), self.snaps[0]["f"]["round"] if self.snaps else 0,
                       max((s["f"]["round"] for s in self.snaps), default=0), restarts,
                       len(back), back[:3], order_bad, len(ovf_bad), ovf_bad[:3]))

        # adaptive interval: exact formula, with the host's floor during the feedback phase
        try:
            k, kb, base, cap = (int(params["param_interval_" + n])
                                for n in ("k", "kb", "base_ms", "max_ms"))
        except KeyError:
            k = None
        if k is not None:
            a, b = self.phase_round("steady"), self.phase_round("fast")
            fa, fb = self.phase_round("feedback-request"), self.phase_round("feedback-end")
            fin, fout = self.phase_round("feedback"), fb
            bad, n = [], 0
            for s in self.snaps:
                f = s["f"]
                r = f["round"]
                if a is None or b is None or not (a < r <= b) or s["entries"] is None:
                    continue  # only the first load's rounds before the parameters change
                n += 1
                plain = interval_ms(f["scan_us"], k, kb, base, cap, 0)
                floored = interval_ms(f["scan_us"], k, kb, base, cap, FEEDBACK_MIN_MS)
                if fin is not None and fin < r <= fout:
                    want = (floored,)
                elif fa is not None and fa <= r <= fout + 2:
                    want = (plain, floored)  # the host's write and the guest's read race
                else:
                    want = (plain,)
                if f["interval_ms"] not in want:
                    bad.append((r, f["scan_us"], f["interval_ms"], want))
            self.check("adaptive-interval", n > 0 and not bad,
                       "%d rounds match T=(%d*Ts+%d)*Ts+%d capped at %d ms (floor %d ms with "
                       "feedback); mismatches %s" % (n, k, kb, base, cap, FEEDBACK_MIN_MS, bad[:3]))
        else:
            self.check("adaptive-interval", False, "module parameters not reported")

        # precision / recall of the hot set
        steady = self.window("steady", "steady-end")
        res = self.pr(steady)
        if res:
            pmin, rmin = min(x[1] for x in res), min(x[2] for x in res)
            self.pr_steady = (pmin, rmin, len(res))
            self.check("precision-recall", pmin >= 0.9 and rmin >= 0.9,
                       "%d rounds: precision min %.3f, recall min %.3f (last round: P %.3f R %.3f, "
                       "%d cold reported, %d other frames)" % (
                           len(res), pmin, rmin, res[-1][1], res[-1][2], res[-1][3], res[-1][4]))
        else:
            self.check("precision-recall", False, "no rounds in the steady window")
        if self.a.tracker == "module":  # pruning and the threshold control are the module's
            nop = self.pr(self.window("noprune", "noprune-end"))
            st = self.stats

            def per_round(a, b, name):
                try:
                    dr = int(st[b]["rounds"]) - int(st[a]["rounds"])
                    return (int(st[b][name]) - int(st[a][name])) / dr if dr > 0 else -1
                except KeyError:
                    return -1
            vis_p = per_round("steady-start", "steady", "ptes_visited")
            vis_n = per_round("noprune-start", "noprune", "ptes_visited")
            sk_p = per_round("steady-start", "steady", "pmd_skipped")
            sk_n = per_round("noprune-start", "noprune", "pmd_skipped")
            tab_p = per_round("steady-start", "steady", "pmd_tables")
            pud_p = per_round("steady-start", "steady", "pud_skipped")
            pud_n = per_round("noprune-start", "noprune", "pud_skipped")
            self.check("prune-equivalent",
                       nop and min(x[1] for x in nop) >= 0.9 and min(x[2] for x in nop) >= 0.9 and
                       sk_p > 0 and sk_n == 0 and pud_p > 0 and pud_n == 0 and 0 < vis_p < vis_n,
                       "full walk: P/R min %.3f/%.3f over %d rounds; per round, pruned vs full: "
                       "PMD subtrees skipped %.1f of %.1f vs %.1f, PUD subtrees skipped %.1f vs %.1f, "
                       "PTEs visited %.0f vs %.0f" % (
                           min((x[1] for x in nop), default=0), min((x[2] for x in nop), default=0),
                           len(nop), sk_p, tab_p, sk_n, pud_p, pud_n, vis_p, vis_n))
            thr1 = self.pr(self.window("thr1", "thr1-end"))
            self.check("history-needed",
                       thr1 and max(x[3] for x in thr1) > len(t.cold()) // 4 and
                       min(x[1] for x in thr1) < 0.9,
                       "with hot_threshold=1 (one round's A bits) up to %d cold frames are reported, "
                       "precision down to %.3f" % (max((x[3] for x in thr1), default=0),
                                                   min((x[1] for x in thr1), default=1)))

        # page types, writes, THP units (steady rounds)
        tbad, wbad, seen = 0, 0, 0
        thp_bad = []
        for s in steady:
            huge_heads = set()
            for e in s["entries"]:
                d = decode(e)
                if d["huge"]:
                    huge_heads.add(d["gfn"])
                k_ = t.kind.get(d["gfn"])
                if not k_ or k_[0] == "cold":
                    continue
                seen += 1
                if d["type"] != TYPES[k_[1]]:
                    tbad += 1
                if d["write"] != (k_[2] if self.a.tracker == "module" else 0):
                    wbad += 1
                if (k_[0] == "thp") != bool(d["huge"]):
                    thp_bad.append(d["gfn"])
            for h in t.thp_heads:
                if h not in huge_heads:
                    thp_bad.append(h)
        self.check("page-types", seen and not tbad,
                   "%d hot entries checked (anon/file/shmem/THP), %d wrong type" % (seen, tbad))
        self.check("write-bit", seen and not wbad,
                   ("%d hot entries checked: written anon/shmem/THP have it, so do anon pages "
                    "written once and then only read (Dirty never cleared), read-only file pages "
                    "not; %d wrong" if self.a.tracker == "module" else
                    "%d hot entries checked: the DAMON agent never sets it (writes are unknown "
                    "to DAMON); %d set") % (seen, wbad))
        self.check("thp-units", steady and t.thp_heads and not thp_bad,
                   "%d THP units reported as 2 MiB entries in %d rounds; mismatches %s" % (
                       len(t.thp_heads), len(steady), thp_bad[:3]))

        # feedback: budget and floor
        fbw = self.window("feedback", "feedback-end")
        bad = []
        hotmax = 0
        for s in fbw:
            f, es = s["f"], s["entries"]
            cnts = [decode(e)["count"] for e in es]
            hotmax = max(cnts + [hotmax])
            if not (f["count"] == FEEDBACK_BUDGET and f["flags"] & OVERFLOW and
                    f["hot_frames"] > FEEDBACK_BUDGET and
                    all(c == max(cnts) for c in cnts) and f["interval_ms"] >= FEEDBACK_MIN_MS):
                bad.append((f["round"], f["count"], f["flags"], f["interval_ms"]))
        gaps = [(q["f"]["publish_ns"] - p["f"]["publish_ns"]) / 1e6
                for p, q in zip(fbw, fbw[1:]) if q["f"]["round"] == p["f"]["round"] + 1]
        after = [s for s in self.snaps if s["entries"] is not None and
                 self.phase_round("feedback-end") is not None and
                 s["f"]["round"] > self.phase_round("feedback-end") + 2]
        self.check("feedback-budget", fbw and not bad and after and
                   after[0]["f"]["count"] > FEEDBACK_BUDGET,
                   "%d rounds with entry_budget=%d: count=%d, OVERFLOW, all of the hottest "
                   "count; bad %s; after reset count=%s" % (
                       len(fbw), FEEDBACK_BUDGET, FEEDBACK_BUDGET, bad[:3],
                       after[0]["f"]["count"] if after else None))
        self.check("feedback-min-interval", gaps and min(gaps) >= FEEDBACK_MIN_MS,
                   "consecutive rounds %s ms apart with min_interval_ms=%d" % (
                       [round(g) for g in gaps], FEEDBACK_MIN_MS))

    def tracker_report(self):
        """INFO lines: what a v1.1 tracker reported with its rounds (informational fields)."""
        v11 = [s for s in self.snaps if s["f"]["vmin"] >= 1]
        if not v11:
            self.info.append(("tracker-report", "no v1.1 rounds (a v1.0 tracker: counts are "
                              "rounds seen)"))
            return
        fs = [s["f"] for s in v11]

        def span(key):
            vals = sorted(f[key] for f in fs)
            return "%d/%d/%d" % (vals[0], vals[len(vals) // 2], vals[-1])
        # CPU over the rounds seen in one session (rounds +1 apart, no reload in between)
        cpu_us = wall_ns = 0
        for p, q in zip(fs, fs[1:]):
            if q["round"] == p["round"] + 1 and q["publish_ns"] > p["publish_ns"]:
                cpu_us += q["tracker_cpu_us"]
                wall_ns += q["publish_ns"] - p["publish_ns"]
        levels = [decode(e)["count"] for s in v11 if s["entries"] for e in s["entries"][:1]]
        self.info.append((
            "tracker-report",
            "%d v1.1 rounds; min/median/max: window_us %s, coarse_window_us %s, windows per "
            "round %s, tracker_cpu_us %s; tracker CPU %.1f ms over %.1f s of consecutive rounds "
            "(%.3f%% of a vCPU); tracked_frames %d at the end; hottest entry level %s (%.1f Hz)" % (
                len(fs), span("window_us"), span("coarse_window_us"), span("windows"),
                span("tracker_cpu_us"), cpu_us / 1e3, wall_ns / 1e9,
                100.0 * cpu_us * 1e3 / wall_ns if wall_ns else 0.0, fs[-1]["tracked_frames"],
                max(levels) if levels else "-", rate_hz(max(levels)) if levels else 0.0)))

    def report(self):
        for name, detail in self.info:
            print("INFO %s/%s: %s" % (self.a.label, name, detail))
        failed = 0
        for name, ok, detail in self.checks:
            print("%s %s/%s: %s" % ("PASS" if ok else "FAIL", self.a.label, name, detail))
            failed += not ok
        return failed


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
    ap.add_argument("--tracker", choices=("module", "damon"), default="module",
                    help="damon: the `vtism guest` scenario (damon-init.sh): tracker 2, no write "
                    "bit, no module-only checks (pruning, reloads, threshold control)")
    ap.add_argument("--channel-minor", type=int, default=None,
                    help="the channel minor version the tracker must write (default: any this "
                    "reader knows, %s, the same in every round)" % (KNOWN_MINORS,))
    a = ap.parse_args(argv[:i])
    end_on_sigterm()
    m = Monitor(a)
    m.run(argv[i + 1:])
    exit_if_boot_hung(m)
    m.analyse()
    sys.exit(1 if m.report() else 0)


if __name__ == "__main__":
    main()
