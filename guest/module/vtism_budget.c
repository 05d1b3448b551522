// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * vtism_guest's CPU budget: credit accrues with time at cpu_budget_bp, at most a bank of it is
 * saved, and it pays for all of the thread's CPU. The caller passes the times in (in the module
 * ktime_get_ns() and the thread's sum_exec_runtime, in the simulator its clocks), so that
 * `vtism sim` spends the budget with this code as the module does.
 *
 * Built into the module and, with VT_RATE_USERSPACE, into the simulator (crates/sim): hence
 * dual-licensed.
 */
#ifndef VT_RATE_USERSPACE
#include <linux/kernel.h>
#include <linux/math64.h>
#endif
#include "vtism_guest.h"

/* Credit the thread can bank: bank_ms of its budget */
static s64 vt_budget_cap(const struct vt_budget *b)
{
	return (s64)(b->bp * b->bank_ms * (1000000 / 10000));
}

/*
 * Credit the thread may hold: the bank less the largest debt seen lately (at most half the
 * bank). Work is paid before it is known what it costs: a pass checks the clock every region,
 * a round publishes on time, and sum_exec_runtime of the running thread lags by up to a tick.
 * The debt these leave is repaid from credit that can never exceed the bank less that debt, so
 * a debt of up to half the bank does not carry the thread over its budget plus one bank
 * (cpu-budget failed by 1.4 ms of debt at 1%). A larger one (a host preemption inside a step,
 * charged as CPU where the guest has no steal time) is repaid by waiting: no pass starts
 * without credit.
 */
s64 vt_budget_bank(const struct vt_budget *b)
{
	s64 cap = vt_budget_cap(b);

	return cap - min_t(s64, b->overdraw_ns, cap / 2);
}

void vt_budget_start(struct vt_budget *b, u64 bp, u64 bank_ms, u64 now, u64 cpu)
{
	b->bp = clamp_t(u64, bp, 1, 10000);
	b->bank_ms = clamp_t(u64, bank_ms, 1, 60000);
	b->credit_ns = vt_budget_cap(b);
	b->last_now = now;
	b->last_cpu = cpu;
	b->wake_ns = 0;
	b->overdraw_ns = 0;
	b->slept = false;
}

/* Time `now` and the thread's CPU `cpu` since the last call: the budget accrues and pays. */
void vt_budget_account(struct vt_budget *b, u64 bp, u64 bank_ms, u64 now, u64 cpu)
{
	u64 spent = cpu - b->last_cpu;

	b->bp = clamp_t(u64, bp, 1, 10000);
	b->bank_ms = clamp_t(u64, bank_ms, 1, 60000);
	b->credit_ns += div_u64((now - b->last_now) * b->bp, 10000);
	b->credit_ns -= spent;
	if (b->slept)
		b->wake_ns = (7 * b->wake_ns + spent) / 8;
	b->slept = false;
	if (b->credit_ns < 0)
		b->overdraw_ns = max_t(u64, b->overdraw_ns, -b->credit_ns);
	b->credit_ns = min_t(s64, b->credit_ns, vt_budget_bank(b));
	b->last_now = now;
	b->last_cpu = cpu;
}

/*
 * When there will be `need` ns of credit: now if there is. Otherwise a wait that also pays for
 * four wake-ups beyond it: waiting for exactly what is missing, each wake-up would cost what
 * the wait earned and the thread would spend its whole budget waking up to find it short.
 */
u64 vt_budget_when(const struct vt_budget *b, s64 need)
{
	s64 missing = need - b->credit_ns;

	if (missing <= 0)
		return b->last_now;
	missing += 4 * b->wake_ns;
	return b->last_now + div_u64((u64)missing * 10000, b->bp);
}

/* A round: the largest debt seen lately halves in about 11 rounds. */
void vt_budget_round(struct vt_budget *b)
{
	b->overdraw_ns -= b->overdraw_ns / 16;
}

/* CPU spent beyond the budget and not yet repaid, at the last account */
u64 vt_budget_debt(const struct vt_budget *b)
{
	return b->credit_ns < 0 ? (u64)-b->credit_ns : 0;
}
