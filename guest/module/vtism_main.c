// SPDX-License-Identifier: GPL-2.0
/*
 * vtism_guest: publish the guest's page access rates to the host through the vtism hint
 * channel, an ivshmem-plain PCI device (1af4:1110) whose BAR2 is a file the host daemon maps.
 *
 * This file: module parameters, statistics in /sys/kernel/vtism_guest/, the PCI driver, and the
 * tracker thread's schedule: coarse windows every coarse_period_ms, fine bursts with what the
 * CPU budget leaves, a round every round_ms (docs/guest.md, "How tracking works").
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpumask.h>
#include <linux/debugfs.h>
#include <linux/freezer.h>
#include <linux/hrtimer.h>
#include <linux/io.h>
#include <linux/kernel.h>
#include <linux/kobject.h>
#include <linux/kthread.h>
#include <linux/ktime.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/pci.h>
#include <linux/random.h>
#include <linux/sched.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/sysfs.h>

#include "vtism_guest.h"

/* The tracker thread, for waking it when a parameter changes. */
static DEFINE_SPINLOCK(vt_task_lock);
static struct task_struct *vt_task;

static void vt_kick(void)
{
	spin_lock(&vt_task_lock);
	if (vt_task)
		wake_up_process(vt_task);
	spin_unlock(&vt_task_lock);
}

/* ---- parameters ---- */

unsigned int vt_cpu_budget_bp = 100;
static unsigned int vt_credit_bank_ms = 1000;
unsigned int vt_coarse_period_ms = 200;
unsigned int vt_coarse_chunk = 2048;
unsigned int vt_coarse_window_min_us = 50;
unsigned int vt_coarse_window_max_us = 100000;
unsigned int vt_fine_window_min_us = 1000;
unsigned int vt_fine_window_max_us = 10000000;
unsigned int vt_burst = 4;
unsigned int vt_dnd_max_level = 7;
unsigned int vt_round_ms = 1000;
unsigned int vt_pass_max_us = 1000;
unsigned int vt_access_goal_bp;
unsigned int vt_interval_k = 8;
unsigned int vt_interval_kb = 50;
unsigned int vt_interval_base_ms = 2500;
unsigned int vt_interval_max_ms = 300000;
unsigned long vt_max_entries;
bool vt_prune = true;
bool vt_tlb_flush = true;
static bool vt_claim_any;

struct vt_range {
	const unsigned int *var;
	unsigned int min, max;
};

/* What each parameter accepts; a value outside is refused with EINVAL and a kernel message. */
static const struct vt_range vt_ranges[] = {
	{ &vt_cpu_budget_bp, 1, 10000 },
	{ &vt_credit_bank_ms, 1, 60000 },
	{ &vt_coarse_period_ms, 1, 60000 },
	{ &vt_coarse_chunk, 1, 1u << 20 },
	{ &vt_coarse_window_min_us, 10, 10000000 },
	{ &vt_coarse_window_max_us, 10, 10000000 },
	{ &vt_fine_window_min_us, 10, 100000000 },
	{ &vt_fine_window_max_us, 10, 100000000 },
	{ &vt_burst, 1, VT_BURST_MAX_WINDOWS },
	{ &vt_dnd_max_level, 0, 7 },
	{ &vt_round_ms, 10, 3600000 },
	{ &vt_pass_max_us, 10, 1000000 },
	{ &vt_access_goal_bp, 0, 10000 },
	{ &vt_interval_k, 0, 1000000 },
	{ &vt_interval_kb, 0, 1000000 },
	{ &vt_interval_base_ms, 0, 86400000 },
	{ &vt_interval_max_ms, 0, 86400000 },
};

static int vt_param_set_uint(const char *val, const struct kernel_param *kp)
{
	unsigned int v, i;
	int err = kstrtouint(val, 0, &v);

	if (err)
		return err;
	for (i = 0; i < ARRAY_SIZE(vt_ranges); i++) {
		if (vt_ranges[i].var != kp->arg)
			continue;
		if (v < vt_ranges[i].min || v > vt_ranges[i].max) {
			pr_err("%s=%u refused: it takes %u to %u\n", kp->name, v,
			       vt_ranges[i].min, vt_ranges[i].max);
			return -EINVAL;
		}
	}
	*(unsigned int *)kp->arg = v;
	vt_kick();	/* a new value applies to the wait in progress too */
	return 0;
}

static const struct kernel_param_ops vt_uint_ops = {
	.set = vt_param_set_uint,
	.get = param_get_uint,
};

#define VT_PARAM(name, var, desc) \
	module_param_cb(name, &vt_uint_ops, &var, 0644); \
	MODULE_PARM_DESC(name, desc)

VT_PARAM(cpu_budget_bp, vt_cpu_budget_bp,
	 "CPU time the tracker may use, in basis points of one vCPU (100 = 1%)");
VT_PARAM(credit_bank_ms, vt_credit_bank_ms,
	 "the budget of at most this much time may be saved up while idle, ms (1000)");
VT_PARAM(coarse_period_ms, vt_coarse_period_ms, "time between coarse windows over all regions, ms (200)");
VT_PARAM(coarse_chunk, vt_coarse_chunk, "regions per coarse window, at most (2048)");
VT_PARAM(coarse_window_min_us, vt_coarse_window_min_us, "shortest coarse window W_c, us (50)");
VT_PARAM(coarse_window_max_us, vt_coarse_window_max_us, "longest coarse window W_c, us (100000)");
VT_PARAM(fine_window_min_us, vt_fine_window_min_us, "shortest fine window W_f, us (1000)");
VT_PARAM(fine_window_max_us, vt_fine_window_max_us, "longest fine window W_f, us (10000000)");
VT_PARAM(burst, vt_burst, "fine windows per burst, 1-6 (4)");
VT_PARAM(dnd_max_level, vt_dnd_max_level, "highest do-not-disturb level, 0 = off (7)");
VT_PARAM(round_ms, vt_round_ms, "time between published rounds, ms, at least (1000)");
VT_PARAM(pass_max_us, vt_pass_max_us, "a pass yields the CPU after this much work, us (1000)");
VT_PARAM(access_goal_bp, vt_access_goal_bp,
	 "share of frames to see young per window, bp; 0 = from the host's fast_quota_bytes (0)");
VT_PARAM(interval_k, vt_interval_k,
	 "K in T = (K*Ts + Kb)*Ts + Tbase between fine sweeps, Ts = last sweep's CPU in ms (8)");
VT_PARAM(interval_kb, vt_interval_kb, "Kb in the sweep interval formula (50)");
VT_PARAM(interval_base_ms, vt_interval_base_ms, "Tbase in the sweep interval formula, ms (2500)");
VT_PARAM(interval_max_ms, vt_interval_max_ms, "cap on the sweep interval, ms; 0 = none (300000)");

module_param_named(max_entries, vt_max_entries, ulong, 0644);
MODULE_PARM_DESC(max_entries, "publish at most this many entries per round; 0 = channel capacity");
module_param_named(prune, vt_prune, bool, 0644);
MODULE_PARM_DESC(prune, "skip PUD subtrees and PTE tables whose upper entry was not used (Y)");
module_param_named(tlb_flush, vt_tlb_flush, bool, 0644);
MODULE_PARM_DESC(tlb_flush, "flush all TLBs after each clearing pass so windows see every access (Y)");
module_param_named(claim_any, vt_claim_any, bool, 0444);
MODULE_PARM_DESC(claim_any, "use an ivshmem region that holds something other than a vtism channel (N)");

struct vt_stats vt_stats;

struct vt_dev {
	struct pci_dev *pdev;
	struct vtism_ch_header *h;
	u64 region_size;
	u64 capacity;
	struct task_struct *thread;
	struct vtism_ch_feedback fb;	/* last consistent host feedback */
};

static unsigned long vt_busy;	/* bit 0: a device is bound (one channel per guest) */
static u64 vt_capacity;

/* ---- statistics ---- */

/*
 * One value per file in /sys/kernel/vtism_guest/, and all of them in one consistent snapshot
 * in debugfs vtism_guest/stats (the thread updates them under vt_stats_lock once per round).
 */
static DEFINE_MUTEX(vt_stats_lock);

struct vt_stat_attr {
	struct kobj_attribute attr;
	const u64 *val;
};

static ssize_t vt_stat_show(struct kobject *kobj, struct kobj_attribute *a, char *buf)
{
	const struct vt_stat_attr *s = container_of(a, struct vt_stat_attr, attr);

	return sysfs_emit(buf, "%llu\n", (unsigned long long)READ_ONCE(*s->val));
}

#define VT_STAT(_name, _field) \
	{ .attr = __ATTR(_name, 0444, vt_stat_show, NULL), .val = &(_field) }
#define VT_COUNTER(_name) \
	VT_STAT(_name, vt_stats.total._name), VT_STAT(last_##_name, vt_stats.last._name)

static struct vt_stat_attr vt_stat_attrs[] = {
	VT_STAT(rounds, vt_stats.rounds),
	VT_STAT(elapsed_us, vt_stats.elapsed_us),
	VT_STAT(cpu_us, vt_stats.cpu_us),
	VT_STAT(last_round_cpu_us, vt_stats.last_round_cpu_us),
	VT_STAT(last_publish_us, vt_stats.last_publish_us),
	VT_STAT(max_publish_us, vt_stats.max_publish_us),
	VT_STAT(round_ms, vt_stats.round_ms),
	VT_STAT(coarse_window_us, vt_stats.coarse_window_us),
	VT_STAT(coarse_window_eff_us, vt_stats.coarse_window_eff_us),
	VT_STAT(fine_window_us, vt_stats.fine_window_us),
	VT_STAT(access_goal_ppm, vt_stats.access_goal_ppm),
	VT_STAT(regions, vt_stats.regions),
	VT_STAT(thp_regions, vt_stats.thp_regions),
	VT_STAT(tracked_frames, vt_stats.tracked_frames),
	VT_STAT(dnd_frames, vt_stats.dnd_frames),
	VT_STAT(table_bytes, vt_stats.table_bytes),
	VT_STAT(last_entries, vt_stats.last_entries),
	VT_STAT(entries_written, vt_stats.entries_written),
	VT_STAT(last_hot_frames, vt_stats.last_hot_frames),
	VT_STAT(overflow_rounds, vt_stats.overflow_rounds),
	VT_STAT(early_rounds, vt_stats.early_rounds),
	VT_STAT(last_sweep_cpu_us, vt_stats.last_sweep_cpu_us),
	VT_STAT(last_sweep_gap_ms, vt_stats.last_sweep_gap_ms),
	VT_STAT(last_sweep_bound_ms, vt_stats.last_sweep_bound_ms),
	VT_STAT(region_burst_us, vt_stats.region_burst_us),
	VT_STAT(overdraw_us, vt_stats.overdraw_us),
	VT_STAT(debt_us, vt_stats.debt_us),
	VT_STAT(track_alloc_fail, vt_stats.track_alloc_fail),
	VT_STAT(feedback_entry_budget, vt_stats.fb_entry_budget),
	VT_STAT(feedback_min_interval_ms, vt_stats.fb_min_interval_ms),
	VT_STAT(feedback_ack_round, vt_stats.fb_ack_round),
	VT_STAT(feedback_fast_quota_bytes, vt_stats.fb_fast_quota_bytes),
	VT_STAT(feedback_read_retries, vt_stats.fb_read_retries),
	VT_STAT(stopped_mid_scan, vt_stats.stopped_mid_scan),
	VT_STAT(capacity, vt_capacity),
	VT_COUNTER(coarse_windows),
	VT_COUNTER(fine_windows),
	VT_COUNTER(coarse_passes),
	VT_COUNTER(fine_passes),
	VT_COUNTER(pass_yields),
	VT_COUNTER(regions_visited),
	VT_COUNTER(coarse_young),
	VT_COUNTER(ptes_visited),
	VT_COUNTER(ptes_cleared),
	VT_COUNTER(ptes_dnd),
	VT_COUNTER(pmd_skipped),
	VT_COUNTER(pud_skipped),
	VT_COUNTER(thp_young),
	VT_COUNTER(mms),
	VT_COUNTER(mm_released),
	VT_COUNTER(lock_drops),
	VT_COUNTER(pte_retries),
	VT_COUNTER(tlb_flushes),
	VT_COUNTER(budget_waits),
	VT_COUNTER(sweeps),
	VT_COUNTER(bursts),
	VT_COUNTER(frames_read),
	VT_COUNTER(changes),
	VT_COUNTER(coarse_stalls),
	VT_COUNTER(rate_rises),
	VT_COUNTER(rate_falls),
	VT_COUNTER(changed_bursted),
	VT_COUNTER(neighbours_flagged),
};

static struct attribute *vt_attrs[ARRAY_SIZE(vt_stat_attrs) + 1];

static const struct attribute_group vt_attr_group = {
	.attrs = vt_attrs,
};

static int vt_stats_show(struct seq_file *m, void *unused)
{
	unsigned int i;

	mutex_lock(&vt_stats_lock);
	for (i = 0; i < ARRAY_SIZE(vt_stat_attrs); i++)
		seq_printf(m, "%s %llu\n", vt_stat_attrs[i].attr.attr.name,
			   (unsigned long long)*vt_stat_attrs[i].val);
	mutex_unlock(&vt_stats_lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vt_stats);

static struct dentry *vt_debugfs;
static struct kobject *vt_kobj;

static void vt_counters_add(struct vt_counters *sum, const struct vt_counters *r)
{
	const u64 *src = (const u64 *)r;
	u64 *dst = (u64 *)sum;
	unsigned int i;

	for (i = 0; i < sizeof(*r) / sizeof(u64); i++)
		WRITE_ONCE(dst[i], dst[i] + src[i]);
}

/* ---- the tracker thread ---- */

/* The seed's adaptive interval, ms, for a sweep that took ts_us of CPU: (K*Ts + Kb)*Ts + Tbase */
static u64 vt_interval_ms(u64 ts_us)
{
	u64 k = READ_ONCE(vt_interval_k), kb = READ_ONCE(vt_interval_kb);
	u64 cap = READ_ONCE(vt_interval_max_ms);
	u64 a, b, t;

	if (check_mul_overflow(k * ts_us, ts_us, &a) || check_mul_overflow(kb, ts_us, &b))
		t = U64_MAX;
	else
		t = div_u64(div_u64(a, 1000) + b, 1000) + READ_ONCE(vt_interval_base_ms);
	if (cap && t > cap)
		t = cap;
	return t;
}

static void vt_read_feedback(struct vt_dev *d)
{
	struct vtism_ch_feedback fb;
	int i;

	for (i = 0; i < 4; i++) {
		if (vtism_ch_read_feedback(d->h, &fb) == 0) {
			d->fb = fb;
			return;
		}
		WRITE_ONCE(vt_stats.fb_read_retries, vt_stats.fb_read_retries + 1);
		cpu_relax();
	}
	/* the host keeps writing: keep its previous advice */
}

enum vt_coarse_state { VT_C_IDLE, VT_C_CLEARING, VT_C_OPEN, VT_C_READING };
enum vt_fine_state { VT_F_IDLE, VT_F_PASS, VT_F_WAIT };

/* The thread's schedule. Times are ktime_get_ns(), CPU is the thread's sum_exec_runtime. */
struct vt_loop {
	struct vt_dev *d;
	struct vt_tracker tr;
	struct vt_burst *b;
	struct vt_coarse c;
	enum vt_coarse_state cstate;
	enum vt_fine_state fstate;
	u64 now, cpu;
	u64 c_next;		/* next coarse window may start */
	u64 c_read_due;
	u64 c_period_start;
	u64 c_period_ns;	/* pass time of the coarse period in progress */
	u64 c_cost_ns;		/* ...of the last complete one: reserved for coarse windows */
	u64 f_due;
	u64 round_next;
	u64 round_last;		/* publish time of the last round */
	u64 round_cpu;		/* CPU at the last round */
	u64 round_windows;	/* windows at the last round */
	u64 round_ms;		/* period in effect */
	u64 last_publish_ns;
	struct vt_budget bud;	/* credit and debt (vtism_budget.c) */
	u64 start, cpu0;
};

static u64 vt_cpu_ns(void)
{
	return current->se.sum_exec_runtime;
}

static u64 vt_budget_bp(void)
{
	return clamp_t(u64, READ_ONCE(vt_cpu_budget_bp), 1, 10000);
}

/* The budget accrues with time, at most the bank of it saved, and pays for all the thread's CPU. */
static void vt_account(struct vt_loop *l)
{
	l->now = ktime_get_ns();
	l->cpu = vt_cpu_ns();
	vt_budget_account(&l->bud, vt_budget_bp(), READ_ONCE(vt_credit_bank_ms), l->now, l->cpu);
}

static s64 vt_bank(struct vt_loop *l)
{
	return vt_budget_bank(&l->bud);
}

static u64 vt_when_credit(struct vt_loop *l, s64 need)
{
	return vt_budget_when(&l->bud, need);
}

static void vt_flush(struct vt_loop *l)
{
	if (!READ_ONCE(vt_tlb_flush))
		return;
	vt_flush_tlbs();
	l->tr.c.tlb_flushes++;
}

/* ---- coarse windows ---- */

static void vt_coarse_start(struct vt_loop *l)
{
	struct vt_tracker *tr = &l->tr;
	struct vt_coarse *c = &l->c;

	if (!c->end.vm) {	/* a new period: all address spaces again */
		vt_discover(tr);
		if (!(tr->cperiod & 7))	/* it walks every region: not every period */
			vt_table_reap(&tr->table, tr->gen, tr->cperiod, false);
		tr->cperiod++;
		l->c_period_start = l->now;
		l->c_cost_ns = l->c_period_ns;
		l->c_period_ns = 0;
		c->start.vm = vt_mm_next(&tr->table, NULL);
		c->start.addr = 0;
	} else {
		c->start = c->end;
	}
	c->pos = c->start;
	c->read = false;
	c->regions = 0;
	c->pud_base = c->pmd_base = 1;	/* every pass decides its upper entries anew */
	c->t_clear_ns = ktime_get_ns();	/* after discovery: the window starts with the pass */
	c->cpu_clear_ns = vt_cpu_ns();
	l->cstate = VT_C_CLEARING;
}

/*
 * The time the chunk's window gave its workload: from its clearing pass to its reading, less,
 * on a guest with one vCPU, the tracker's own CPU time in it (its passes, bursts and rounds run
 * while the window is open), in which nothing else ran. Counted whole, such a window was idle
 * for every region while the rates said it was long: hot regions alarmed down together, by two
 * octaves, and warm data took their place in the testbed (docs/testbed.md, 2026-11-30).
 */
static u64 vt_window_eff_ns(const struct vt_loop *l, const struct vt_coarse *c)
{
	u64 wall = l->now - c->t_clear_ns;

	if (num_online_cpus() == 1)
		wall -= min(wall, l->cpu - c->cpu_clear_ns);
	return wall;
}

static enum vt_pass_result vt_coarse_step(struct vt_loop *l)
{
	struct vt_tracker *tr = &l->tr;
	struct vt_coarse *c = &l->c;
	enum vt_pass_result res;
	u64 t0 = l->now;

	if (l->cstate == VT_C_OPEN) {
		vt_coarse_window_open(tr, c->regions);
		c->read = true;
		c->pos = c->start;
		c->regions = 0;
		c->young = 0;
		c->pud_base = c->pmd_base = 1;
		tr->wc_eff_us = div_u64(vt_window_eff_ns(l, c), NSEC_PER_USEC);
		l->cstate = VT_C_READING;
	}
	res = vt_coarse_pass(tr, c);
	l->c_period_ns += ktime_get_ns() - t0;
	if (res != VT_PASS_DONE)
		return res;
	tr->c.coarse_passes++;
	if (l->cstate == VT_C_CLEARING) {
		vt_flush(l);
		l->cstate = VT_C_OPEN;
		l->c_read_due = ktime_get_ns() + tr->wc_ns;
		return res;
	}
	tr->c.coarse_windows++;
	vt_coarse_window_done(tr);
	vt_coarse_adapt(tr, c->regions, c->young);
	l->cstate = VT_C_IDLE;
	if (c->end.vm)
		l->c_next = l->now;	/* the next chunk of this period */
	else	/* coarse windows use at most 3/4 of the budget: bursts are never starved */
		l->c_next = max(l->c_period_start +
				max((u64)READ_ONCE(vt_coarse_period_ms) * NSEC_PER_MSEC,
				    div_u64(l->c_period_ns * 4 * 10000, 3 * vt_budget_bp())),
				l->now);
	return res;
}

/* ---- fine bursts ---- */

static void vt_burst_start(struct vt_loop *l)
{
	struct vt_burst *b = l->b;

	b->m = clamp_t(unsigned int, READ_ONCE(vt_burst), 1, VT_BURST_MAX_WINDOWS);
	b->pass = 0;
	b->next = 0;
	b->cpu_ns = 0;
	l->fstate = VT_F_PASS;
}

static void vt_cursor_move(struct vt_tracker *tr, struct vt_mm *vm, unsigned long idx)
{
	if (tr->cur_vm != vm) {
		if (tr->cur_vm)
			tr->cur_vm->busy--;
		if (vm)
			vm->busy++;
	}
	tr->cur_vm = vm;
	tr->cur_idx = idx;
}

static void vt_burst_add(struct vt_burst *b, struct vt_mm *vm, unsigned long idx,
			 struct vt_region *r)
{
	struct vt_burst_region *br = &b->r[b->n++];

	r->flags |= VT_R_BURST;
	r->flags &= ~VT_R_CHANGED;
	vm->busy++;
	br->vm = vm;
	br->idx = idx;
	memset(br->young, 0, sizeof(br->young));
}

/* Room in the burst for one more region the budget pays for (the first always) */
static bool vt_burst_room(struct vt_tracker *tr, struct vt_burst *b, s64 afford)
{
	return b->n < VT_BURST_REGIONS &&
	       (!b->n || (s64)((b->n + 1) * tr->region_burst_ns) <= afford);
}

/*
 * Regions whose rate change detection found changed, ahead of the cursor: when a hot set
 * moves, the regions it went to and those it left are measured within a burst or two of being
 * seen, not when the sweep gets there (two minutes in the testbed's slow guest; the regions it
 * left kept their frames' old rates until then, and the quota). Whole-table scan, only while
 * some are flagged.
 */
static void vt_burst_select_changed(struct vt_tracker *tr, struct vt_burst *b, s64 afford)
{
	struct vt_table *t = &tr->table;
	struct vt_mm *vm;
	u64 left = 0;

	for (vm = vt_mm_next(t, NULL); vm; vm = vt_mm_next(t, vm)) {
		unsigned long idx = 0;

		for (; !vm->gone && vt_region_next(t, vm, &idx); idx++) {
			struct vt_region *r = vt_region_get(t, vm, idx, false);

			if (!(r->flags & VT_R_CHANGED))
				continue;
			if (!(r->flags & VT_R_BURST) && vt_burst_room(tr, b, afford)) {
				vt_burst_add(b, vm, idx, r);
				tr->c.changed_bursted++;
			} else {
				left++;
			}
		}
	}
	tr->changed_pending = left;
}

/*
 * The regions the burst observes: those found changed, then from the cursor on, as many as the
 * budget pays for. Between sweeps (the seed's interval), changed ones only. While a sweep is
 * under way every other burst starts at the cursor instead, the changed ones after it if the
 * budget pays for more: where alarms come faster than bursts (a guest whose every region is
 * busy, its coarse windows saturated and its vCPU's speed varying), changed regions took every
 * burst, the sweep stopped for minutes, W_f was never adapted again and regions nothing flagged,
 * a hot set's old ones among them, kept their frames' rates (docs/testbed.md).
 */
static void vt_burst_select(struct vt_loop *l, s64 afford)
{
	struct vt_tracker *tr = &l->tr;
	struct vt_table *t = &tr->table;
	struct vt_burst *b = l->b;
	struct vt_mm *vm = tr->cur_vm;
	unsigned long idx = tr->cur_idx;
	bool sweeping = vm || l->now >= tr->next_sweep_ns;
	bool cursor_first = false;

	if (sweeping) {
		tr->cursor_turn = !tr->cursor_turn;
		cursor_first = tr->cursor_turn;
	}
	b->n = 0;
	b->wraps = false;
	if (tr->changed_pending && !cursor_first)
		vt_burst_select_changed(tr, b, afford);
	if (!sweeping || !vt_burst_room(tr, b, afford)) {
		vt_burst_start(l);
		return;
	}
	if (!vm) {	/* a new sweep */
		vm = vt_mm_next(t, NULL);
		idx = 0;
		if (tr->sweep_start_ns) {
			/* the gap the last sweep's interval bounded, with that bound (vt_round) */
			tr->sweep_gap_ms = div_u64(l->now - tr->sweep_start_ns, NSEC_PER_MSEC);
			tr->gap_cpu_us = tr->sweep_bound_cpu_us;
			tr->gap_bound_ms = tr->sweep_bound_ms;
		}
		tr->sweep_start_ns = l->now;
		tr->sweep_cpu_ns = 0;
	}
	while (b->n < VT_BURST_REGIONS) {
		struct vt_region *r;

		if (!vm) {
			b->wraps = true;
			break;
		}
		if (vm->gone || !vt_region_next(t, vm, &idx)) {
			vm = vt_mm_next(t, vm);
			idx = 0;
			continue;
		}
		if (!vt_burst_room(tr, b, afford))
			break;
		r = vt_region_get(t, vm, idx, false);
		if (!(r->flags & VT_R_BURST))	/* not already in as changed */
			vt_burst_add(b, vm, idx, r);
		idx++;
	}
	vt_cursor_move(tr, vm, idx);
	if (tr->changed_pending && cursor_first && vt_burst_room(tr, b, afford))
		vt_burst_select_changed(tr, b, afford);
	vt_burst_start(l);
}

static void vt_burst_end(struct vt_loop *l)
{
	struct vt_tracker *tr = &l->tr;
	struct vt_burst *b = l->b;
	unsigned int i;

	for (i = 0; i < b->n; i++) {
		struct vt_region *r = vt_region_get(&tr->table, b->r[i].vm, b->r[i].idx, false);

		if (r)
			r->flags &= ~VT_R_BURST;
		b->r[i].vm->busy--;
	}
	if (b->n) {
		u64 per = div_u64(b->cpu_ns, b->n);

		tr->region_burst_ns = (3 * tr->region_burst_ns + per) / 4;
		tr->c.bursts++;
	}
	tr->sweep_cpu_ns += b->cpu_ns;
	l->fstate = VT_F_IDLE;
	if (!b->wraps)
		return;
	/* the sweep is complete: adapt W_f, and the next one waits for the seed's interval */
	vt_sweep_end(tr, l->now);
	vt_cursor_move(tr, NULL, 0);
	tr->sweep_bound_cpu_us = div_u64(tr->sweep_cpu_ns, NSEC_PER_USEC);
	tr->sweep_bound_ms = vt_interval_ms(tr->sweep_bound_cpu_us);
	tr->next_sweep_ns = tr->sweep_start_ns + tr->sweep_bound_ms * NSEC_PER_MSEC;
}

static enum vt_pass_result vt_fine_step(struct vt_loop *l)
{
	struct vt_tracker *tr = &l->tr;
	struct vt_burst *b = l->b;
	enum vt_pass_result res;
	u64 t0 = l->now;

	if (b->next == 0) {
		b->t_pass_ns[b->pass] = l->now;
		b->cpu_pass_ns[b->pass] = l->cpu;
	}
	l->fstate = VT_F_PASS;
	res = vt_fine_pass(tr, b);
	b->cpu_ns += ktime_get_ns() - t0;
	if (res != VT_PASS_DONE)
		return res;
	tr->c.fine_passes++;
	if (b->pass > 1)
		tr->c.fine_windows++;
	if (b->pass > b->m) {
		vt_burst_end(l);
		return res;
	}
	vt_flush(l);
	l->fstate = VT_F_WAIT;
	l->f_due = ktime_get_ns() + tr->wf_ns;
	return res;
}

/*
 * Credit a burst leaves for the next coarse window: what the last coarse period took, but at
 * most half of what can be banked, or a large guest's bursts would never find enough.
 */
static s64 vt_coarse_reserve(struct vt_loop *l)
{
	return min_t(u64, l->c_cost_ns, vt_bank(l) / 2);
}

/*
 * Can a burst start: a sweep under way or its interval passed, and budget beyond coarse's for
 * a region's burst. Never more than three quarters of the bank: where one region's burst costs
 * more (a slow or contended vCPU), waiting for it would stop fine windows for good, and a full
 * bank is rare while coarse windows spend; its passes stop where the credit runs out and go on
 * as it comes back.
 */
static u64 vt_burst_when(struct vt_loop *l)
{
	struct vt_tracker *tr = &l->tr;
	u64 t = l->now;

	if (!tr->table.regions)
		return U64_MAX;
	if (!tr->cur_vm && !tr->changed_pending)
		t = max(t, tr->next_sweep_ns);
	return max(t, vt_when_credit(l, min_t(s64, vt_coarse_reserve(l) + tr->region_burst_ns,
					      vt_bank(l) / 4 * 3)));
}

/* ---- rounds ---- */

/*
 * When a round may come before its period: once change detection has found the rates of
 * enough regions risen since the last round (a quarter of the regions the host's quota holds,
 * at least one), so that a hot set that appeared is published within a second or two of being
 * seen rather than a period later (a period is seconds on a large guest: publication gets a
 * quarter of the budget). Rates that fell need nothing soon: the host demotes for room. Still
 * round_ms (and the host's min_interval_ms) after the last round, and only with credit beyond
 * the next coarse windows': those find the change, and the budget pays for this round as for
 * any other; the next one waits its period from it. U64_MAX: not yet.
 */
static u64 vt_round_early_when(struct vt_loop *l)
{
	struct vt_tracker *tr = &l->tr;
	u64 q = l->d->fb.fast_quota_bytes >> PMD_SHIFT;

	if (!q)
		q = tr->tracked_frames >> (PMD_SHIFT - PAGE_SHIFT);
	if (!tr->change_regions || tr->change_regions < max_t(u64, q / 4, 1))
		return U64_MAX;
	return max(l->round_last + max_t(u64, READ_ONCE(vt_round_ms), l->d->fb.min_interval_ms) *
				   NSEC_PER_MSEC,
		   vt_when_credit(l, vt_coarse_reserve(l) + 1));
}

static void vt_round(struct vt_loop *l)
{
	struct vt_dev *d = l->d;
	struct vt_tracker *tr = &l->tr;
	struct vt_publish_result res;
	struct vt_round_info ri;
	u64 budget = d->capacity, windows, t0, pub_ns, bp = vt_budget_bp(), period;

	vt_read_feedback(d);
	vt_update_goal(tr, d->fb.fast_quota_bytes);
	if (READ_ONCE(vt_max_entries))
		budget = min_t(u64, budget, READ_ONCE(vt_max_entries));
	if (d->fb.entry_budget)
		budget = min(budget, d->fb.entry_budget);
	windows = tr->c.coarse_windows + tr->c.fine_windows;
	ri.round_ms = min_t(u64, l->round_ms, U32_MAX);
	ri.cpu_us = min_t(u64, div_u64(l->cpu - l->round_cpu, NSEC_PER_USEC), U32_MAX);
	ri.windows = min_t(u64, windows, U32_MAX);

	if (l->now < l->round_next)
		WRITE_ONCE(vt_stats.early_rounds, vt_stats.early_rounds + 1);
	tr->change_regions = 0;
	t0 = ktime_get_ns();
	vt_publish(tr, d->h, budget, &ri, &res);
	pub_ns = ktime_get_ns() - t0;
	l->round_last = res.publish_ns;

	/* rounds no more often than publishing within a quarter of the budget allows */
	period = max_t(u64, READ_ONCE(vt_round_ms), div64_u64(pub_ns * 4 * 10000, bp * NSEC_PER_MSEC));
	period = max_t(u64, period, d->fb.min_interval_ms);
	l->round_ms = period;
	/* from this round's publish_time_ns: the host sees rounds at least the period apart */
	l->round_next = res.publish_ns + period * NSEC_PER_MSEC;
	l->round_cpu = l->cpu;
	WRITE_ONCE(vt_stats.overdraw_us, div_u64(l->bud.overdraw_ns, NSEC_PER_USEC));
	vt_budget_round(&l->bud);

	mutex_lock(&vt_stats_lock);
	vt_counters_add(&vt_stats.total, &tr->c);
	vt_stats.last = tr->c;
	memset(&tr->c, 0, sizeof(tr->c));
	WRITE_ONCE(vt_stats.elapsed_us, div_u64(l->now - l->start, NSEC_PER_USEC));
	WRITE_ONCE(vt_stats.cpu_us, div_u64(l->cpu - l->cpu0, NSEC_PER_USEC));
	/* with cpu_us and elapsed_us, of the same moment (vt_account) */
	WRITE_ONCE(vt_stats.debt_us, div_u64(vt_budget_debt(&l->bud), NSEC_PER_USEC));
	WRITE_ONCE(vt_stats.last_round_cpu_us, ri.cpu_us);
	WRITE_ONCE(vt_stats.last_publish_us, div_u64(pub_ns, NSEC_PER_USEC));
	WRITE_ONCE(vt_stats.max_publish_us,
		   max(vt_stats.max_publish_us, div_u64(pub_ns, NSEC_PER_USEC)));
	WRITE_ONCE(vt_stats.round_ms, period);
	WRITE_ONCE(vt_stats.coarse_window_us, div_u64(tr->wc_ns, NSEC_PER_USEC));
	WRITE_ONCE(vt_stats.coarse_window_eff_us, tr->wc_eff_us);
	WRITE_ONCE(vt_stats.fine_window_us, div_u64(tr->wf_ns, NSEC_PER_USEC));
	WRITE_ONCE(vt_stats.access_goal_ppm, tr->goal_ppm);
	WRITE_ONCE(vt_stats.regions, tr->table.regions);
	WRITE_ONCE(vt_stats.thp_regions, tr->table.thp_regions);
	WRITE_ONCE(vt_stats.tracked_frames, tr->tracked_frames);
	WRITE_ONCE(vt_stats.dnd_frames, tr->dnd_frames);
	WRITE_ONCE(vt_stats.table_bytes, vt_table_bytes(&tr->table));
	WRITE_ONCE(vt_stats.track_alloc_fail, tr->table.alloc_fail);
	WRITE_ONCE(vt_stats.last_entries, res.written);
	WRITE_ONCE(vt_stats.entries_written, vt_stats.entries_written + res.written);
	WRITE_ONCE(vt_stats.last_hot_frames, res.hot_frames);
	if (res.candidates > res.written)
		WRITE_ONCE(vt_stats.overflow_rounds, vt_stats.overflow_rounds + 1);
	WRITE_ONCE(vt_stats.last_sweep_cpu_us, tr->gap_cpu_us);
	WRITE_ONCE(vt_stats.last_sweep_bound_ms, tr->gap_bound_ms);
	WRITE_ONCE(vt_stats.last_sweep_gap_ms, tr->sweep_gap_ms);
	WRITE_ONCE(vt_stats.region_burst_us, div_u64(tr->region_burst_ns, NSEC_PER_USEC));
	WRITE_ONCE(vt_stats.fb_entry_budget, d->fb.entry_budget);
	WRITE_ONCE(vt_stats.fb_min_interval_ms, d->fb.min_interval_ms);
	WRITE_ONCE(vt_stats.fb_ack_round, d->fb.ack_round);
	WRITE_ONCE(vt_stats.fb_fast_quota_bytes, d->fb.fast_quota_bytes);
	/* last: user space polls this to know a round is complete */
	WRITE_ONCE(vt_stats.rounds, vt_stats.rounds + 1);
	mutex_unlock(&vt_stats_lock);
}

/* ---- the loop ---- */

static void vt_sleep_until(u64 due)
{
	ktime_t t = ns_to_ktime(due);
	u64 now = ktime_get_ns();
	u64 slack = due > now ? clamp_t(u64, (due - now) / 32, 10 * NSEC_PER_USEC, NSEC_PER_MSEC) : 0;

	/* state first: a vt_kick() or kthread_stop() from here on is not lost */
	set_current_state(TASK_INTERRUPTIBLE);
	if (!kthread_should_stop() && due > now)
		schedule_hrtimeout_range(&t, slack, HRTIMER_MODE_ABS);
	__set_current_state(TASK_RUNNING);
	try_to_freeze();
}

/*
 * One step: the most urgent thing due. Windows that are open are read first (they must
 * close), passes in progress go on, then the round, then new coarse windows (the budget pays
 * them first), then new fine bursts with what is left. Returns false when told to stop.
 */
static bool vt_step(struct vt_loop *l)
{
	struct vt_tracker *tr = &l->tr;
	enum vt_pass_result res = VT_PASS_DONE;
	u64 due, when;
	bool paid, coarse_due, fine_due;

	vt_account(l);
	if (kthread_should_stop())
		return false;
	tr->now_ns = l->now;
	/*
	 * A pass also stops where its credit runs out: started with a little credit, a whole
	 * pass_max_us slice would overdraw the budget by up to a slice (cpu-budget failed by 1.3 ms).
	 */
	tr->deadline_ns = l->now + min_t(u64, (u64)READ_ONCE(vt_pass_max_us) * NSEC_PER_USEC,
					 max_t(s64, l->bud.credit_ns, 0));
	/* Xen PV has no hardware non-leaf Accessed bits: pruning would skip everything */
	tr->prune = READ_ONCE(vt_prune) && tr->nonleaf_young;

	/*
	 * Passes (and the reads that close open windows) also wait for credit: a window that
	 * waits is merely longer, and is measured as such.
	 */
	paid = l->bud.credit_ns > 0;
	coarse_due = (l->cstate == VT_C_OPEN && l->now >= l->c_read_due) ||
		     l->cstate == VT_C_READING || l->cstate == VT_C_CLEARING;
	fine_due = l->fstate == VT_F_PASS || (l->fstate == VT_F_WAIT && l->now >= l->f_due);
	if (paid && coarse_due) {
		res = vt_coarse_step(l);
	} else if (paid && fine_due) {
		res = vt_fine_step(l);
	} else if (l->now >= l->round_next || vt_round_early_when(l) <= l->now) {
		vt_round(l);
	} else if (l->cstate == VT_C_IDLE && l->now >= l->c_next && l->bud.credit_ns > 0) {
		vt_coarse_start(l);
		res = vt_coarse_step(l);
	} else if (l->fstate == VT_F_IDLE && (when = vt_burst_when(l)) <= l->now) {
		vt_burst_select(l, l->bud.credit_ns - vt_coarse_reserve(l));
		if (l->b->n)
			res = vt_fine_step(l);
		else
			vt_burst_end(l);	/* nothing left in this sweep */
	} else {
		due = min(l->round_next, vt_round_early_when(l));
		if (l->cstate == VT_C_OPEN && !coarse_due)
			due = min(due, l->c_read_due);
		if (l->cstate == VT_C_IDLE) {
			when = max(l->c_next, vt_when_credit(l, 1));
			if (when > l->c_next && l->c_next <= l->now)
				tr->c.budget_waits++;
			due = min(due, when);
		}
		if (l->fstate == VT_F_WAIT && !fine_due)
			due = min(due, l->f_due);
		if (l->fstate == VT_F_IDLE)
			due = min(due, vt_burst_when(l));
		if (coarse_due || fine_due) {
			due = min(due, vt_when_credit(l, 1));
			tr->c.budget_waits++;
		}
		vt_sleep_until(due);
		l->bud.slept = true;
		return true;
	}
	if (res == VT_PASS_STOP)
		return false;
	if (res == VT_PASS_YIELD)
		cond_resched();
	return true;
}

static int vt_thread(void *arg)
{
	struct vt_loop *l = kzalloc(sizeof(*l), GFP_KERNEL);
	struct vt_tracker *tr;

	set_freezable();
	if (!l)
		goto wait;
	tr = &l->tr;
	l->d = arg;
	l->b = kvzalloc(sizeof(*l->b), GFP_KERNEL);
	tr->obs = kvcalloc(VT_REGION_FRAMES, sizeof(u64), GFP_KERNEL);
	if (!l->b || !tr->obs) {
		pr_err("out of memory, not tracking\n");
		goto out;
	}
	vt_table_init(&tr->table);
	tr->nonleaf_young = arch_has_hw_nonleaf_pmd_young();
	if (!tr->nonleaf_young)
		pr_warn("no hardware Accessed bits in PMD entries: coarse windows see nothing\n");
	tr->wc_ns = clamp_t(u64, 1000, READ_ONCE(vt_coarse_window_min_us),
			    READ_ONCE(vt_coarse_window_max_us)) * NSEC_PER_USEC;
	tr->wf_ns = clamp_t(u64, 100000, READ_ONCE(vt_fine_window_min_us),
			    READ_ONCE(vt_fine_window_max_us)) * NSEC_PER_USEC;
	tr->goal_ppm = 40000;
	tr->region_burst_ns = 20 * NSEC_PER_USEC;
	tr->rng = get_random_u32() | 1;
	l->start = ktime_get_ns();
	l->cpu0 = l->round_cpu = vt_cpu_ns();
	vt_budget_start(&l->bud, vt_budget_bp(), READ_ONCE(vt_credit_bank_ms), l->start, l->cpu0);
	l->round_ms = READ_ONCE(vt_round_ms);
	l->round_next = l->start + l->round_ms * NSEC_PER_MSEC;
	l->round_last = l->start;
	l->c_next = l->start;

	while (vt_step(l))
		;
	if (l->cstate != VT_C_IDLE || l->fstate != VT_F_IDLE) {
		WRITE_ONCE(vt_stats.stopped_mid_scan, vt_stats.stopped_mid_scan + 1);
		pr_info("stopped in the middle of a %s\n",
			l->cstate == VT_C_CLEARING || l->cstate == VT_C_READING ||
			l->fstate == VT_F_PASS ? "pass" : "window");
	}
	vt_table_destroy(&tr->table);
out:
	kvfree(tr->tasks);
	kvfree(tr->obs);
	kvfree(tr->pub_levels);
	kvfree(tr->deferred);
	kvfree(l->b);
	kfree(l);
wait:
	/* kthread_stop() needs the task until it is called: never return before. */
	for (;;) {
		set_current_state(TASK_INTERRUPTIBLE);
		if (kthread_should_stop())
			break;
		schedule();
	}
	__set_current_state(TASK_RUNNING);
	return 0;
}

/* ---- PCI ---- */

/* Never overwrite a region that someone else uses: blank, or already a vtism channel. */
static bool vt_region_claimable(struct vtism_ch_header *h)
{
	const u64 *w = (const u64 *)h;
	unsigned int i;

	if (READ_ONCE(h->magic) == VTISM_CH_MAGIC)
		return true;
	for (i = 0; i < 0x800 / 8; i++)
		if (READ_ONCE(w[i]))
			return false;
	return true;
}

static int vt_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	resource_size_t start, len;
	struct vt_dev *d;
	int err;

	if (test_and_set_bit(0, &vt_busy)) {
		dev_info(&pdev->dev, "already publishing through another device\n");
		return -ENODEV;	/* not an error: one channel per guest */
	}
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d) {
		err = -ENOMEM;
		goto err_busy;
	}
	d->pdev = pdev;
	err = pci_enable_device_mem(pdev);
	if (err)
		goto err_free;
	err = pci_request_region(pdev, 2, VT_NAME);
	if (err)
		goto err_disable;
	start = pci_resource_start(pdev, 2);
	len = pci_resource_len(pdev, 2);
	if (len < 2 * VTISM_CH_HEADER_SIZE) {
		dev_err(&pdev->dev, "BAR2 too small (%pa)\n", &len);
		err = -ENODEV;
		goto err_release;
	}
	/*
	 * BAR2 is ordinary host RAM (the host's file), not a register window: map it write-back.
	 * The channel's seqlock orders its stores with smp_wmb(), a compiler barrier on x86,
	 * which is only correct for WB memory; write-combining stores may pass each other and
	 * would need wmb()/sfence. Under KVM the host maps the same pages WB, so both sides are
	 * cache coherent.
	 */
	d->h = memremap(start, len, MEMREMAP_WB);
	if (!d->h) {
		err = -ENOMEM;
		goto err_release;
	}
	if (!vt_region_claimable(d->h) && !vt_claim_any) {
		dev_err(&pdev->dev, "BAR2 holds something that is not a vtism channel; not touching it (claim_any=1 overrides)\n");
		err = -EBUSY;
		goto err_unmap;
	}
	d->region_size = len;
	/* keep the host's feedback across a module reload */
	d->capacity = vtism_ch_init(d->h, len, VTISM_TRACKER_MODULE, 1);
	WRITE_ONCE(vt_capacity, d->capacity);
	pci_set_drvdata(pdev, d);

	d->thread = kthread_run(vt_thread, d, "vtism_scan");
	if (IS_ERR(d->thread)) {
		err = PTR_ERR(d->thread);
		goto err_unmap;
	}
	spin_lock(&vt_task_lock);
	vt_task = d->thread;
	spin_unlock(&vt_task_lock);
	dev_info(&pdev->dev, "channel of %llu bytes, %llu entries\n", d->region_size,
		 d->capacity);
	return 0;

err_unmap:
	memunmap(d->h);
err_release:
	pci_release_region(pdev, 2);
err_disable:
	pci_disable_device(pdev);
err_free:
	kfree(d);
err_busy:
	clear_bit(0, &vt_busy);
	return err;
}

static void vt_remove(struct pci_dev *pdev)
{
	struct vt_dev *d = pci_get_drvdata(pdev);

	spin_lock(&vt_task_lock);
	vt_task = NULL;
	spin_unlock(&vt_task_lock);
	/* The thread only stops outside a publication, so seq is left even. */
	kthread_stop(d->thread);
	memunmap(d->h);
	pci_release_region(pdev, 2);
	pci_disable_device(pdev);
	kfree(d);
	clear_bit(0, &vt_busy);
}

static const struct pci_device_id vt_ids[] = {
	{ PCI_DEVICE(0x1af4, 0x1110) },	/* ivshmem-plain / ivshmem-doorbell */
	{ 0 }
};
MODULE_DEVICE_TABLE(pci, vt_ids);

static struct pci_driver vt_driver = {
	.name = VT_NAME,
	.id_table = vt_ids,
	.probe = vt_probe,
	.remove = vt_remove,
};

static int __init vt_init(void)
{
	unsigned int i;
	int err;

	for (i = 0; i < ARRAY_SIZE(vt_stat_attrs); i++)
		vt_attrs[i] = &vt_stat_attrs[i].attr.attr;
	vt_kobj = kobject_create_and_add(VT_NAME, kernel_kobj);
	if (!vt_kobj)
		return -ENOMEM;
	err = sysfs_create_group(vt_kobj, &vt_attr_group);
	if (err)
		goto err_kobj;
	vt_debugfs = debugfs_create_dir(VT_NAME, NULL);
	debugfs_create_file("stats", 0444, vt_debugfs, NULL, &vt_stats_fops);
	err = pci_register_driver(&vt_driver);
	if (err)
		goto err_debugfs;
	return 0;

err_debugfs:
	debugfs_remove_recursive(vt_debugfs);
err_kobj:
	kobject_put(vt_kobj);
	return err;
}

static void __exit vt_exit(void)
{
	pci_unregister_driver(&vt_driver);
	debugfs_remove_recursive(vt_debugfs);
	kobject_put(vt_kobj);
}

module_init(vt_init);
module_exit(vt_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vtism guest tracker: access rates from page-table Accessed-bit windows, published to the host");
MODULE_AUTHOR("vtism");
