# SPDX-License-Identifier: GPL-2.0
"""A host CPU of its own for the e2e guest's first vCPU, while a phase needs it.

Under TCG a guest has no steal clock: when the host preempts a vCPU thread in the middle of a
tracker step, the guest charges that time to the tracker as CPU. At the module's 1% budget one
50 ms preemption takes 5 s of waiting to repay, and two of them leave a phase without a window
(budget-progress failed so, beside the DAMON agent's e2e guest on this 2-core machine). The
module behaves as designed there; the phase measures it only if its vCPU is not preempted by the
test's own load. So for the phase, guest-init binds the tracker thread to vCPU 0, and this puts
QEMU's "CPU 0/TCG" thread alone on one host CPU and everything else of the suite (the rest of
this QEMU, this monitor, and the sessions named in VTISM_E2E_BESIDE: the suites run beside it)
on the others; release() gives every thread the CPUs it had.

Only the suite's own processes are moved: this QEMU's threads, this process, and the processes
whose session id e2e-suites.sh exported (the ones it started with setsid).
"""
import os

VCPU0 = "CPU 0/TCG"  # QEMU's name for the thread (-name ...,debug-threads=on)


def tids(pid):
    try:
        return [int(t) for t in os.listdir("/proc/%d/task" % pid)]
    except OSError:
        return []


def _comm(pid, tid):
    try:
        with open("/proc/%d/task/%d/comm" % (pid, tid)) as f:
            return f.read().strip()
    except OSError:
        return None


def _session(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses
            return int(f.read().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def run_delay_us(pid, tid):
    """How long the thread has waited on the host's run queues (schedstat), in us."""
    try:
        with open("/proc/%d/task/%d/schedstat" % (pid, tid)) as f:
            return int(f.read().split()[1]) // 1000
    except (OSError, ValueError, IndexError):
        return None


class CorePin:
    def __init__(self, qemu_pid, beside=None):
        self.qemu_pid = qemu_pid
        env = os.environ.get("VTISM_E2E_BESIDE", "") if beside is None else beside
        self.beside = {int(s) for s in env.split() if s.isdigit()}
        self.cpus = sorted(os.sched_getaffinity(0))
        self.saved = {}  # tid -> the CPUs it had
        self.core = None  # the host CPU the vCPU has to itself, while pinned
        self.vcpu0 = None
        self.why_not = None

    def vcpu0_tid(self):
        for tid in tids(self.qemu_pid):
            if _comm(self.qemu_pid, tid) == VCPU0:
                return tid
        return None

    def _set(self, tid, cpus, first):
        try:
            if tid not in self.saved:
                # one born while pinned (not there at the first sweep) inherited the pin: it gets
                # every CPU back
                self.saved[tid] = os.sched_getaffinity(tid) if first else set(self.cpus)
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass  # gone: nothing to move or give back

    def _beside_pids(self):
        if not self.beside:
            return []
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit() and _session(int(d)) in self.beside:
                out.append(int(d))
        return out

    def pin(self):
        """Puts the vCPU on a CPU of its own; returns that CPU, or None (why_not says why)."""
        vcpu = self.vcpu0_tid()
        if len(self.cpus) < 2:
            self.why_not = "this process may run on %d CPU only" % len(self.cpus)
        elif vcpu is None:
            self.why_not = "QEMU has no thread named %r (one thread for all vCPUs?)" % VCPU0
        if self.why_not:
            return None
        self.core = self.cpus[-1]
        self.vcpu0 = vcpu
        self.sweep(first=True)
        return self.core

    def sweep(self, first=False):
        """Moves what the suite started since the last sweep (the builds beside fork) off the
        vCPU's CPU; called again while pinned."""
        if self.core is None:
            return
        rest = set(self.cpus) - {self.core}
        self._set(self.vcpu0, {self.core}, first)
        for tid in tids(self.qemu_pid):
            if tid != self.vcpu0:
                self._set(tid, rest, first)
        for tid in tids(os.getpid()):
            self._set(tid, rest, first)
        for pid in self._beside_pids():
            for tid in tids(pid):
                self._set(tid, rest, first)

    def release(self):
        """Every moved thread gets back the CPUs it had; one born since the last sweep, all of
        this process's."""
        if self.core is None:
            return
        self.core = None
        for pid in self._beside_pids() + [self.qemu_pid]:
            for tid in tids(pid):
                self.saved.setdefault(tid, set(self.cpus))
        for tid, cpus in self.saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass
        self.saved = {}
