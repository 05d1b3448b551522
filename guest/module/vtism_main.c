// SPDX-License-Identifier: GPL-2.0
/*
 * vtism_guest: publish the guest's hot frames to the host through the vtism hint channel, an
 * ivshmem-plain PCI device (1af4:1110) whose BAR2 is a file the host daemon maps.
 *
 * This file: module parameters, statistics in /sys/kernel/vtism_guest/, the PCI driver and
 * the scanner thread (scan, age, publish, sleep for the adaptive interval).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/debugfs.h>
#include <linux/freezer.h>
#include <linux/io.h>
#include <linux/kernel.h>
#include <linux/kobject.h>
#include <linux/kthread.h>
#include <linux/ktime.h>
#include <linux/module.h>
#include <linux/overflow.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/sched.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/sysfs.h>

#include "vtism_guest.h"

/* The scanner thread, for waking it when an interval parameter changes. */
static DEFINE_SPINLOCK(vt_task_lock);
static struct task_struct *vt_task;

static void vt_kick(void)
{
	spin_lock(&vt_task_lock);
	if (vt_task)
		wake_up_process(vt_task);
	spin_unlock(&vt_task_lock);
}

/* A new interval takes effect in the current sleep, not only after it. */
static int vt_param_set_interval(const char *val, const struct kernel_param *kp)
{
	int err = param_set_uint(val, kp);

	if (!err)
		vt_kick();
	return err;
}

static const struct kernel_param_ops vt_interval_ops = {
	.set = vt_param_set_interval,
	.get = param_get_uint,
};

unsigned int vt_interval_k = 8;
module_param_cb(interval_k, &vt_interval_ops, &vt_interval_k, 0644);
MODULE_PARM_DESC(interval_k, "K in T = (K*Ts + Kb)*Ts + Tbase, Ts = last scan time in ms (8)");

unsigned int vt_interval_kb = 50;
module_param_cb(interval_kb, &vt_interval_ops, &vt_interval_kb, 0644);
MODULE_PARM_DESC(interval_kb, "Kb in the interval formula (50)");

unsigned int vt_interval_base_ms = 2500;
module_param_cb(interval_base_ms, &vt_interval_ops, &vt_interval_base_ms, 0644);
MODULE_PARM_DESC(interval_base_ms, "Tbase in the interval formula, ms (2500)");

/*
 * Capped by default: the formula is quadratic in the scan time (a 1 s scan would mean 2.2 h),
 * and a hot set that is only looked at every few hours is no hint at all.
 */
unsigned int vt_interval_max_ms = 300000;
module_param_cb(interval_max_ms, &vt_interval_ops, &vt_interval_max_ms, 0644);
MODULE_PARM_DESC(interval_max_ms, "cap on the interval, ms; 0 = none (300000); the host's floor wins");

unsigned int vt_history_rounds = 8;
module_param_named(history_rounds, vt_history_rounds, uint, 0644);
MODULE_PARM_DESC(history_rounds, "rounds of per-frame history, 1-16 (8)");

unsigned int vt_hot_threshold = 2;
module_param_named(hot_threshold, vt_hot_threshold, uint, 0644);
MODULE_PARM_DESC(hot_threshold, "publish frames young in at least this many rounds of the window (2)");

unsigned long vt_max_entries;
module_param_named(max_entries, vt_max_entries, ulong, 0644);
MODULE_PARM_DESC(max_entries, "publish at most this many entries per round; 0 = channel capacity");

bool vt_prune = true;
module_param_named(prune, vt_prune, bool, 0644);
MODULE_PARM_DESC(prune, "skip PUD/PMD subtrees whose Accessed bit is clear (Y)");

bool vt_tlb_flush = true;
module_param_named(tlb_flush, vt_tlb_flush, bool, 0644);
MODULE_PARM_DESC(tlb_flush, "flush all TLBs after each round so the next one sees new accesses (Y)");

static bool vt_claim_any;
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

static struct vt_stat_attr vt_stat_attrs[] = {
	VT_STAT(rounds, vt_stats.rounds),
	VT_STAT(last_scan_us, vt_stats.last_scan_us),
	VT_STAT(total_scan_us, vt_stats.total_scan_us),
	VT_STAT(last_interval_ms, vt_stats.last_interval_ms),
	VT_STAT(last_entries, vt_stats.last_entries),
	VT_STAT(entries_written, vt_stats.entries_written),
	VT_STAT(last_hot_frames, vt_stats.last_hot_frames),
	VT_STAT(overflow_rounds, vt_stats.overflow_rounds),
	VT_STAT(tracked_frames, vt_stats.tracked_frames),
	VT_STAT(track_alloc_fail, vt_stats.track_alloc_fail),
	VT_STAT(feedback_entry_budget, vt_stats.fb_entry_budget),
	VT_STAT(feedback_min_interval_ms, vt_stats.fb_min_interval_ms),
	VT_STAT(feedback_ack_round, vt_stats.fb_ack_round),
	VT_STAT(feedback_read_retries, vt_stats.fb_read_retries),
	VT_STAT(tlb_flushes, vt_stats.tlb_flushes),
	VT_STAT(stopped_mid_scan, vt_stats.stopped_mid_scan),
	VT_STAT(capacity, vt_capacity),
	VT_STAT(mms_scanned, vt_stats.total.mms),
	VT_STAT(mm_released, vt_stats.total.mm_released),
	VT_STAT(lock_drops, vt_stats.total.lock_drops),
	VT_STAT(ptes_visited, vt_stats.total.ptes_visited),
	VT_STAT(ptes_present, vt_stats.total.ptes_present),
	VT_STAT(ptes_young, vt_stats.total.ptes_young),
	VT_STAT(pmd_tables, vt_stats.total.pmd_tables),
	VT_STAT(pmd_skipped, vt_stats.total.pmd_skipped),
	VT_STAT(pud_tables, vt_stats.total.pud_tables),
	VT_STAT(pud_skipped, vt_stats.total.pud_skipped),
	VT_STAT(thp_present, vt_stats.total.thp_present),
	VT_STAT(thp_young, vt_stats.total.thp_young),
	VT_STAT(pte_retries, vt_stats.total.pte_retries),
	VT_STAT(last_mms, vt_stats.last.mms),
	VT_STAT(last_ptes_visited, vt_stats.last.ptes_visited),
	VT_STAT(last_ptes_present, vt_stats.last.ptes_present),
	VT_STAT(last_ptes_young, vt_stats.last.ptes_young),
	VT_STAT(last_pmd_tables, vt_stats.last.pmd_tables),
	VT_STAT(last_pmd_skipped, vt_stats.last.pmd_skipped),
	VT_STAT(last_pud_tables, vt_stats.last.pud_tables),
	VT_STAT(last_pud_skipped, vt_stats.last.pud_skipped),
	VT_STAT(last_thp_present, vt_stats.last.thp_present),
	VT_STAT(last_thp_young, vt_stats.last.thp_young),
	VT_STAT(last_tracked_bytes, vt_stats.last.tracked_bytes),
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

static void vt_stats_add(struct vt_round_stats *sum, const struct vt_round_stats *r)
{
	const u64 *src = (const u64 *)r;
	u64 *dst = (u64 *)sum;
	unsigned int i;

	for (i = 0; i < sizeof(*r) / sizeof(u64); i++)
		WRITE_ONCE(dst[i], dst[i] + src[i]);
}

/* ---- the scanner thread ---- */

u64 vt_interval_ms(u64 scan_us, u32 min_interval_ms)
{
	u64 k = READ_ONCE(vt_interval_k), kb = READ_ONCE(vt_interval_kb);
	u64 cap = READ_ONCE(vt_interval_max_ms);
	u64 a, b, t;

	/* T = (K*Ts + Kb)*Ts + Tbase with Ts = scan_us / 1000 ms, saturating */
	if (check_mul_overflow(k * scan_us, scan_us, &a) ||
	    check_mul_overflow(kb, scan_us, &b))
		t = U64_MAX;
	else
		t = div_u64(div_u64(a, 1000) + b, 1000) + READ_ONCE(vt_interval_base_ms);
	if (cap && t > cap)
		t = cap;
	t = max_t(u64, t, min_interval_ms);	/* the host's floor wins over our cap */
	return min_t(u64, t, U32_MAX);
}

static void vt_read_feedback(struct vt_dev *d)
{
	struct vtism_ch_feedback fb;
	int i;

	for (i = 0; i < 4; i++) {
		if (vtism_ch_read_feedback(d->h, &fb) == 0) {
			d->fb = fb;
			WRITE_ONCE(vt_stats.fb_entry_budget, fb.entry_budget);
			WRITE_ONCE(vt_stats.fb_min_interval_ms, fb.min_interval_ms);
			WRITE_ONCE(vt_stats.fb_ack_round, fb.ack_round);
			return;
		}
		WRITE_ONCE(vt_stats.fb_read_retries, vt_stats.fb_read_retries + 1);
		cpu_relax();
	}
	/* the host keeps writing: keep its previous advice */
}

/*
 * Wait for the next scan: interval_ms(last scan) after the end of the last scan. Recomputed on
 * every wake-up, so a parameter change (vt_kick()) or a higher floor from the host, read again
 * here, applies to the wait in progress. Returns early on kthread_stop().
 */
static void vt_wait_next(struct vt_dev *d, unsigned long end, u64 scan_us)
{
	for (;;) {
		unsigned long deadline;
		long left;

		/* state first: a vt_kick() from here on is not lost */
		set_current_state(TASK_INTERRUPTIBLE);
		vt_read_feedback(d);
		deadline = end + msecs_to_jiffies(vt_interval_ms(scan_us, d->fb.min_interval_ms));
		left = (long)(deadline - jiffies);
		if (kthread_should_stop() || left <= 0)
			break;
		/* poll the host's floor at least every 5 s */
		schedule_timeout(min_t(long, left, 5 * HZ));
		__set_current_state(TASK_RUNNING);
		try_to_freeze();
	}
	__set_current_state(TASK_RUNNING);
}

static void vt_round(struct vt_dev *d, struct vt_track *track, struct vt_round_stats *rs,
		     u64 scan_us)
{
	struct vtism_ch_round_meta meta = { 0 };
	struct vt_publish_result res;
	u64 budget = d->capacity, interval;

	vt_read_feedback(d);
	if (READ_ONCE(vt_max_entries))
		budget = min_t(u64, budget, READ_ONCE(vt_max_entries));
	if (d->fb.entry_budget)
		budget = min(budget, d->fb.entry_budget);
	interval = vt_interval_ms(scan_us, d->fb.min_interval_ms);

	meta.scan_interval_ms = interval;
	meta.scan_duration_us = min_t(u64, scan_us, U32_MAX);
	meta.tracked_bytes = rs->tracked_bytes;
	meta.publish_time_ns = ktime_get_ns();
	vt_track_end_round(track, d->h, budget, &meta, &res);

	mutex_lock(&vt_stats_lock);
	vt_stats_add(&vt_stats.total, rs);
	vt_stats.last = *rs;
	WRITE_ONCE(vt_stats.last_scan_us, scan_us);
	WRITE_ONCE(vt_stats.total_scan_us, vt_stats.total_scan_us + scan_us);
	WRITE_ONCE(vt_stats.last_interval_ms, interval);
	WRITE_ONCE(vt_stats.last_entries, res.written);
	WRITE_ONCE(vt_stats.entries_written, vt_stats.entries_written + res.written);
	WRITE_ONCE(vt_stats.last_hot_frames, res.hot_frames);
	if (res.candidates > res.written)
		WRITE_ONCE(vt_stats.overflow_rounds, vt_stats.overflow_rounds + 1);
	WRITE_ONCE(vt_stats.tracked_frames, track->nr_active);
	/* last: user space polls this to know a round is complete */
	WRITE_ONCE(vt_stats.rounds, vt_stats.rounds + 1);
	mutex_unlock(&vt_stats_lock);
}

static int vt_thread(void *arg)
{
	struct vt_dev *d = arg;
	struct vt_scan_buf *buf = vt_scan_alloc();
	struct vt_track track;

	set_freezable();
	vt_track_init(&track);
	if (!buf) {
		pr_err("out of memory, not scanning\n");
		goto wait;
	}
	while (!kthread_should_stop()) {
		struct vt_round_stats rs = { 0 };
		u64 t0, scan_us;

		try_to_freeze();
		t0 = ktime_get_ns();
		if (!vt_scan_all(buf, &track, &rs)) {
			WRITE_ONCE(vt_stats.stopped_mid_scan, vt_stats.stopped_mid_scan + 1);
			pr_info("stopped in the middle of a scan\n");
			break;
		}
		if (READ_ONCE(vt_tlb_flush)) {
			vt_flush_tlbs();
			WRITE_ONCE(vt_stats.tlb_flushes, vt_stats.tlb_flushes + 1);
		}
		scan_us = div_u64(ktime_get_ns() - t0, NSEC_PER_USEC);
		vt_round(d, &track, &rs, scan_us);

		vt_wait_next(d, jiffies, scan_us);
	}
wait:
	vt_scan_free(buf);
	vt_track_destroy(&track);
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
MODULE_DESCRIPTION("vtism guest tracker: page-table Accessed-bit scan published to the host");
MODULE_AUTHOR("vtism");
