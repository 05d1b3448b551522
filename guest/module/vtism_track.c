// SPDX-License-Identifier: GPL-2.0
/*
 * vtism_guest rate estimates and publication.
 *
 * Every observation window, whatever its length, moves a rate (vtism_rate.c): a region's rate
 * (some page of it used, per second) from its coarse windows, a frame's own rate from its fine
 * windows. The window loops aim at seeing a share of regions / frames young per window that
 * matches what the host's fast-memory quota holds. A round publishes every frame's rate as a
 * channel v1.1 level, hottest first.
 *
 * Only the tracker thread touches any of this: no locking.
 */
#include <linux/bitfield.h>
#include <linux/bitops.h>
#include <linux/kernel.h>
#include <linux/math64.h>
#include <linux/mm.h>

#include "vtism_guest.h"

/*
 * Weight of one window in a rate: what came before counts (div-1)/div less per window. A coarse
 * period has two windows (the one since the last read, and W_c): 1/48 each is 1/24 per period,
 * a memory of 24 periods of 200 ms, HMM-V's 8 windows of 600 ms. Fine windows 1/8 (a burst of
 * 4 windows moves a rate by 1 - (7/8)^4 of the way).
 */
#define VT_COARSE_DIV 48
#define VT_FINE_DIV 8
/*
 * A THP has one Accessed bit for 512 frames: its accesses per 4 KiB frame lie between its rate
 * / 512 (each access touches one frame) and its rate (each touches all frames). How many frames
 * one access of a region touches is measured where it can be: in the process's PTE-mapped
 * regions, as the sum of their frames' rates over the region's rate (vt_mm.spread, log2 in
 * codes, 0 to 9 doublings); a process without such regions gets the geometric middle, rate /
 * sqrt(512), off by at most 22.6x either way.
 */
#define VT_SPREAD_MAX (9 * VT_RC_PER_OCTAVE)
/* regions whose spread is measured: enough frames mapped to tell */
#define VT_SPREAD_MIN_FRAMES 256
/* A frame's rate follows its region's down at once, up by at most 2 doublings (4x) */
#define VT_FOLLOW_UP_MAX (2 * VT_RC_PER_OCTAVE)
#define VT_REGION_IDLE S64_MIN
/* Regions no coarse pass saw mapped for this many coarse periods are not published */
#define VT_STALE_PERIODS 3
/* HMM-V's do-not-disturb time unit: level x is left alone for 0.6 s * 2^(x-1) */
#define VT_DND_UNIT_MS 600

/* The rate fast for a coarse period (vt_fast_code): its young long windows say nothing */
static unsigned int vt_coarse_fast_code(struct vt_tracker *tr)
{
	u64 p = READ_ONCE(vt_coarse_period_ms);

	if (p != tr->cfast_period_ms) {
		tr->cfast_period_ms = p;
		tr->cfast_code = vt_fast_code(p * USEC_PER_MSEC);
	}
	return tr->cfast_code;
}

/*
 * One coarse window of w_us averaged into the region's rate; long_w: the one since the last
 * read. A fast region's rate weighs its short windows only (vt_fast_code).
 */
static void vt_region_window(struct vt_tracker *tr, struct vt_region *r, u64 w_us, bool young,
			     bool long_w)
{
	bool fast = r->crate >= vt_coarse_fast_code(tr);
	u64 t = fast ? r->cs_us : r->ct_us;

	if (young && !(fast && long_w))
		r->crate = vt_code_of_hz(vt_rate_add(vt_hz_of_code(r->crate), t, w_us, true,
						     VT_COARSE_DIV), vt_dither(tr));
	else if (!young && r->crate) {
		if (t != tr->idle_t || w_us != tr->idle_w) {
			tr->idle_t = t;
			tr->idle_w = w_us;
			tr->idle_d = vt_idle_codes(t, w_us, VT_COARSE_DIV);
		}
		r->crate = vt_code_moved(r->crate, tr->idle_d, vt_dither(tr));
	}
	r->ct_us = min_t(u64, vt_exposure(r->ct_us, w_us, VT_COARSE_DIV), U32_MAX);
	if (!long_w)
		r->cs_us = min_t(u64, vt_exposure(r->cs_us, w_us, VT_COARSE_DIV), U32_MAX);
}

void vt_coarse_observe(struct vt_tracker *tr, struct vt_region *r, bool young, bool read)
{
	u32 now_ms = (u32)div_u64(tr->now_ns, NSEC_PER_MSEC);

	if (!read) {
		/* the clearing pass reads what happened since the last read: a long window */
		if (r->flags & VT_R_READ) {
			u32 l = now_ms - r->last_read_ms;

			if (l)
				vt_region_window(tr, r, (u64)l * USEC_PER_MSEC, young, true);
		}
		return;
	}
	vt_region_window(tr, r, max_t(u64, tr->wc_eff_us, 1), young, false);
	r->last_read_ms = now_ms;
	r->flags |= VT_R_READ;
	if (young) {
		r->flags |= VT_R_YOUNG;
		tr->c.coarse_young++;
	} else {
		r->flags &= ~VT_R_YOUNG;
	}
}

/* DAMON's interval auto-tuning step toward goal young of n: at most halve or double. */
static u64 vt_adapt(u64 w, u64 n, u64 young, u64 goal_ppm, u64 lo, u64 hi)
{
	u64 goal_q16, f;

	if (!n)
		return w;
	goal_q16 = div_u64(n * goal_ppm << 16, 1000000);
	if (!young)
		f = 512;
	else	/* sqrt of goal / young in Q16 is the step in Q8 */
		f = clamp_t(u64, int_sqrt(div64_u64(goal_q16, young)), 128, 512);
	return clamp_t(u64, (w * f) >> 8, lo, hi);
}

void vt_coarse_adapt(struct vt_tracker *tr, unsigned int regions, unsigned int young)
{
	tr->wc_ns = vt_adapt(tr->wc_ns, regions, young, tr->goal_ppm,
			     (u64)READ_ONCE(vt_coarse_window_min_us) * NSEC_PER_USEC,
			     (u64)READ_ONCE(vt_coarse_window_max_us) * NSEC_PER_USEC);
}

void vt_update_goal(struct vt_tracker *tr, u64 fast_quota_bytes)
{
	u64 bp = READ_ONCE(vt_access_goal_bp);

	if (bp)
		tr->goal_ppm = min_t(u64, bp, 10000) * 100;
	else if (fast_quota_bytes && tr->tracked_frames)
		tr->goal_ppm = clamp_t(u64, div64_u64((fast_quota_bytes >> PAGE_SHIFT) * 1000000,
						      tr->tracked_frames), 10000, 500000);
	else
		tr->goal_ppm = 40000;	/* DAMON's recommended access_bp goal: 4% */
}

/*
 * The windows of one region's burst: the long one since its last burst (if it had one), then
 * m of w_us. The region's exposure through them, and what they do to a rate that saw nothing;
 * the same for a rate fast for the long window (vt_fast_code), whose prior is the short
 * windows' exposure.
 */
struct vt_burst_windows {
	unsigned int m;
	bool has_long;
	u64 long_us, w_us;
	u64 t[VT_BURST_MAX_WINDOWS + 2];	/* exposure before window i (0: the long one) */
	s64 idle;				/* codes a rate moves by through all of them, unseen */
	unsigned int fast_code;
	u64 s0, s1, s_end;	/* a fast rate's exposure: before and after the long window, short only */
	s64 idle_fast;
	u64 interval_ms;			/* between the region's bursts: do-not-disturb times */
};

/* codes an unseen rate moves by through the m short windows from exposure t; *t: after them */
static s64 vt_short_idle(u64 *t, u64 w_us, unsigned int m, s64 idle)
{
	unsigned int j;
	s64 d;

	for (j = 0; j < m; j++) {
		d = vt_idle_codes(*t, w_us, VT_FINE_DIV);
		idle = (d == S64_MIN || idle == S64_MIN) ? S64_MIN : idle + d;
		*t = vt_exposure(*t, w_us, VT_FINE_DIV);
	}
	return idle;
}

static void vt_burst_windows_init(struct vt_burst_windows *bw, const struct vt_burst *b,
				  const struct vt_region *r, const struct vt_tracker *tr)
{
	unsigned int j;
	u64 t;

	bw->m = b->m;
	bw->w_us = max_t(u64, div_u64(b->t_pass_ns[b->m] - b->t_pass_ns[0], b->m * NSEC_PER_USEC), 1);
	bw->has_long = r->flags & VT_R_MEASURED;
	bw->long_us = bw->has_long ? (u64)(u32)((u32)div_u64(b->t_pass_ns[0], NSEC_PER_MSEC) -
						r->last_burst_ms) * USEC_PER_MSEC : 0;
	bw->interval_ms = bw->has_long ? div_u64(bw->long_us, USEC_PER_MSEC) : tr->sweep_gap_ms;
	bw->t[0] = r->ft_us;
	bw->t[1] = bw->has_long ? vt_exposure(r->ft_us, bw->long_us, VT_FINE_DIV) : r->ft_us;
	bw->idle = bw->has_long ? vt_idle_codes(r->ft_us, bw->long_us, VT_FINE_DIV) : 0;
	t = bw->t[1];
	bw->idle = vt_short_idle(&t, bw->w_us, bw->m, bw->idle);
	for (j = 1; j < bw->m; j++)
		bw->t[j + 1] = vt_exposure(bw->t[j], bw->w_us, VT_FINE_DIV);
	bw->t[bw->m + 1] = t;
	bw->fast_code = bw->has_long ? vt_fast_code(bw->long_us) : VT_RC_MAX + 1;
	bw->s0 = r->fs_us;
	bw->s1 = bw->has_long ? vt_exposure(r->fs_us, bw->long_us, VT_FINE_DIV) : r->fs_us;
	t = bw->s1;
	bw->idle_fast = vt_short_idle(&t, bw->w_us, bw->m,
				      bw->has_long ? vt_idle_codes(r->fs_us, bw->long_us, VT_FINE_DIV) : 0);
	for (t = r->fs_us, j = 0; j < bw->m; j++)
		t = vt_exposure(t, bw->w_us, VT_FINE_DIV);
	bw->s_end = t;
}

/* A frame's rate through the burst's windows; y: bit j-1 = window j, VT_BY_LONG */
static unsigned int vt_frame_rate(const struct vt_burst_windows *bw, unsigned int code, u8 y,
				  bool first, bool long_valid, u32 dither)
{
	bool fast = !first && code >= bw->fast_code;
	unsigned int j;
	u64 hz, t;

	y &= (u8)(BIT(bw->m) - 1) | VT_BY_LONG;
	if (!first && !y)
		return vt_code_moved(code, fast ? bw->idle_fast : bw->idle, dither);
	hz = first ? 0 : vt_hz_of_code(code);
	t = first ? 0 : fast ? bw->s0 : bw->t[0];
	/* a bit left set by do-not-disturb says nothing about the long window, nor does a young
	 * one to a fast rate */
	if (!first && bw->has_long && long_valid && !(fast && (y & VT_BY_LONG))) {
		hz = vt_rate_add(hz, t, bw->long_us, y & VT_BY_LONG, VT_FINE_DIV);
		t = fast ? bw->s1 : bw->t[1];
	}
	for (j = 0; j < bw->m; j++) {
		hz = vt_rate_add(hz, t, bw->w_us, y & BIT(j), VT_FINE_DIV);
		t = vt_exposure(t, bw->w_us, VT_FINE_DIV);
	}
	return vt_code_of_hz(hz, dither);
}

/* A measured frame word: new rate, HMM-V's do-not-disturb level up or down */
static u64 vt_frame_land(const struct vt_burst_windows *bw, u64 f, u8 y, bool first,
			 u32 dither, unsigned int *young_w)
{
	unsigned int k = hweight8(y & (BIT(bw->m) - 1));
	unsigned int dnd = FIELD_GET(VT_F_DND, f), max = min(READ_ONCE(vt_dnd_max_level), 7u);
	unsigned int rate = vt_frame_rate(bw, FIELD_GET(VT_F_RATE, f), y, first,
					  !(f & VT_F_UNCLEARED), dither);
	u64 skip = 0;

	/* up when young in at least half the windows, down otherwise */
	if (max && 2 * k >= bw->m) {
		dnd = min(dnd + 1, max);
		if (bw->interval_ms)
			skip = min_t(u64, div64_u64((u64)VT_DND_UNIT_MS << (dnd - 1),
						    bw->interval_ms), 15);
	} else if (dnd) {
		dnd--;
	}
	*young_w += k;
	f &= ~(VT_F_RATE | VT_F_DND | VT_F_SKIP | VT_F_UNCLEARED);
	return f | FIELD_PREP(VT_F_RATE, rate) | FIELD_PREP(VT_F_DND, dnd) |
	       FIELD_PREP(VT_F_SKIP, skip);
}

/* How many frames one access of the region touched: the process's prior for its THPs. */
static void vt_spread_learn(struct vt_mm *vm, const struct vt_region *r, u64 sum_hz,
			    unsigned int present)
{
	s64 spread;

	if (present < VT_SPREAD_MIN_FRAMES || !r->crate || !sum_hz)
		return;
	spread = clamp_t(s64, (s64)vt_code_of_hz(sum_hz, 512) - r->crate, 0, VT_SPREAD_MAX);
	vm->spread += (spread - vm->spread) / 8;
}

/*
 * The last pass of a burst saw obs[] (frame words of the present PTEs): average its windows
 * into the frames' rates, move their do-not-disturb levels.
 */
void vt_burst_land_region(struct vt_tracker *tr, struct vt_burst *b, struct vt_burst_region *br,
			  struct vt_region *r, const u64 *obs)
{
	unsigned int m = b->m, i, present = 0, young_w = 0, seen_w = 0;
	struct vt_burst_windows bw;
	bool uncleared = false;

	vt_burst_windows_init(&bw, b, r, tr);
	if (r->flags & VT_R_THP) {
		u64 u = r->unit;

		if (u & VT_F_PRESENT) {
			/* one unit: no do-not-disturb (its one bit is the coarse windows' too) */
			unsigned int rate = vt_frame_rate(&bw, FIELD_GET(VT_F_RATE, u), br->young[0],
							  !(r->flags & VT_R_MEASURED), true,
							  vt_dither(tr));

			r->unit = (u & ~VT_F_RATE) | FIELD_PREP(VT_F_RATE, rate);
			present = VT_REGION_FRAMES;
			young_w = hweight8(br->young[0] & (BIT(m) - 1)) * VT_REGION_FRAMES;
			seen_w = m * VT_REGION_FRAMES;
		}
	} else if (r->frames) {
		u64 *frames = r->frames, sum_hz = 0;

		for (i = 0; i < VT_REGION_FRAMES; i++) {
			u64 o = obs[i], f = frames[i];
			u8 y = br->young[i];
			bool first = !(f & VT_F_PRESENT);

			if (!(o & VT_F_PRESENT)) {
				frames[i] = 0;
				continue;
			}
			present++;
			if (first)
				f = 0;
			/* the frame may have moved (pfn): its rate is the virtual page's */
			f = (f & ~(VT_F_PFN | VT_F_PRESENT)) |
			    (o & (VT_F_PFN | VT_F_PRESENT | VT_F_WRITE));
			if (!(o & VT_OBS_SAME))
				f = (f & ~VT_F_TYPE) | (o & VT_F_TYPE);
			if (y & VT_BY_DND) {
				/* sat this burst out: counts as young in every window */
				f = (f & ~VT_F_SKIP) |
				    FIELD_PREP(VT_F_SKIP, FIELD_GET(VT_F_SKIP, f) - 1) | VT_F_UNCLEARED;
				uncleared = true;
				young_w += m;
			} else {
				f = vt_frame_land(&bw, f, y, first, vt_dither(tr), &young_w);
			}
			seen_w += m;
			frames[i] = f;
			sum_hz += vt_hz_of_code(FIELD_GET(VT_F_RATE, f));
		}
		vt_spread_learn(br->vm, r, sum_hz, present);
	}
	if (uncleared)
		r->flags |= VT_R_UNCLEARED;
	else
		r->flags &= ~VT_R_UNCLEARED;
	r->ft_us = min_t(u64, bw.t[m + 1], U32_MAX);
	r->fs_us = min_t(u64, bw.s_end, U32_MAX);
	tr->tracked_frames += present;
	tr->tracked_frames -= min_t(u64, r->present, tr->tracked_frames);
	r->present = present;
	r->crate_then = r->crate;
	r->last_burst_ms = (u32)div_u64(b->t_pass_ns[m], NSEC_PER_MSEC);
	r->flags |= VT_R_MEASURED;
	tr->sweep_young += young_w;
	tr->sweep_seen += seen_w;
}

/* End of a full sweep: the fine window moves toward the goal share of young frames. */
void vt_sweep_end(struct vt_tracker *tr, u64 now_ns)
{
	tr->wf_ns = vt_adapt(tr->wf_ns, tr->sweep_seen, tr->sweep_young, tr->goal_ppm,
			     (u64)READ_ONCE(vt_fine_window_min_us) * NSEC_PER_USEC,
			     (u64)READ_ONCE(vt_fine_window_max_us) * NSEC_PER_USEC);
	tr->sweep_young = 0;
	tr->sweep_seen = 0;
	tr->sweep++;
	tr->c.sweeps++;
}

/*
 * How far a region's frames follow it since they were measured, in rate codes; or
 * VT_REGION_IDLE when the region has not been used for so long that its rate is nil.
 */
static s64 vt_follow(const struct vt_tracker *tr, const struct vt_region *r)
{
	s64 d;

	if (!tr->nonleaf_young)
		return 0;	/* no PMD Accessed bits: coarse rates say nothing */
	if (!r->crate)
		return VT_REGION_IDLE;
	if (!r->crate_then)
		return VT_FOLLOW_UP_MAX;
	d = (s64)r->crate - r->crate_then;
	return min_t(s64, d, VT_FOLLOW_UP_MAX);
}

struct vt_pub {
	u64 *hist;		/* entries per level */
	u64 *off;		/* next slot per level */
	u64 budget;
	u64 *entries;
	bool write;		/* second pass: write the entries */
	struct vt_publish_result *res;
};

static void vt_pub_one(struct vt_pub *p, u64 f, s64 code, bool huge, bool young)
{
	unsigned int level = code > 0 ? vt_level_of_code(code) : 0;
	u64 frames = huge ? VTISM_CH_HUGE_FRAMES : 1;

	if (!level)
		return;
	if (!p->write) {
		p->hist[level]++;
		p->res->candidates++;
		if (level >= 96)
			p->res->hot_frames += frames;
		return;
	}
	if (p->off[level] < p->budget)
		WRITE_ONCE(p->entries[p->off[level]],
			   vtism_entry_make(FIELD_GET(VT_F_PFN, f), level, !!(f & VT_F_WRITE),
					    FIELD_GET(VT_F_TYPE, f), huge, young));
	p->off[level]++;
}

static void vt_pub_pass(struct vt_tracker *tr, struct vt_pub *p)
{
	struct vt_table *t = &tr->table;
	struct vt_mm *vm = NULL;
	u64 tracked = 0, dnd = 0;

	while ((vm = vt_mm_next(t, vm))) {
		unsigned long idx = 0;

		for (; vt_region_next(t, vm, &idx); idx++) {
			struct vt_region *r = vt_region_get(t, vm, idx, false);
			bool young = r->flags & VT_R_YOUNG;
			s64 follow;
			unsigned int i;

			if ((s16)(tr->cperiod - r->cstamp) > VT_STALE_PERIODS ||
			    !(r->flags & VT_R_MEASURED))
				continue;
			tracked += r->present;
			follow = vt_follow(tr, r);
			if (follow == VT_REGION_IDLE)
				continue;
			if (r->flags & VT_R_THP) {
				u64 u = r->unit;
				unsigned int rate = FIELD_GET(VT_F_RATE, u);

				if ((u & VT_F_PRESENT) && rate)
					vt_pub_one(p, u, (s64)rate + vm->spread - VT_SPREAD_MAX + follow,
						   true, young);
				continue;
			}
			if (!r->frames)
				continue;
			for (i = 0; i < VT_REGION_FRAMES; i++) {
				u64 f = r->frames[i];
				unsigned int rate = FIELD_GET(VT_F_RATE, f);

				if (!(f & VT_F_PRESENT))
					continue;
				if (FIELD_GET(VT_F_SKIP, f))
					dnd++;
				if (rate)
					vt_pub_one(p, f, (s64)rate + follow, false, young);
			}
		}
	}
	if (!p->write) {
		tr->tracked_frames = tracked;
		tr->dnd_frames = dnd;
		p->res->tracked_bytes = tracked << PAGE_SHIFT;
	}
}


/*
 * Publish every frame's rate level, hottest first: a counting sort straight into the channel
 * (one pass counts per level, the second writes each entry in its level's slots), at most
 * budget entries, OVERFLOW when there were more.
 */
void vt_publish(struct vt_tracker *tr, struct vtism_ch_header *h, u64 budget,
		const struct vt_round_info *ri, struct vt_publish_result *res)
{
	struct vtism_ch_round_meta meta = { 0 };
	struct vt_pub p = { .hist = tr->pub_hist, .off = tr->pub_off, .budget = budget,
			    .entries = vtism_ch_entries(h), .res = res };
	u64 pos = 0, seq;
	int l;

	memset(res, 0, sizeof(*res));
	memset(tr->pub_hist, 0, sizeof(tr->pub_hist));
	vt_pub_pass(tr, &p);
	for (l = 255; l > 0; l--) {
		p.off[l] = pos;
		pos += p.hist[l];
	}
	res->written = min(res->candidates, budget);

	seq = vtism_ch_begin_round(h);
	p.write = true;
	if (res->written)
		vt_pub_pass(tr, &p);
	meta.count = res->written;
	meta.flags = res->candidates > res->written ? VTISM_CH_FLAG_OVERFLOW : 0;
	meta.scan_interval_ms = ri->round_ms;
	meta.scan_duration_us = ri->cpu_us;
	meta.tracked_bytes = res->tracked_bytes;
	meta.hot_frames = res->hot_frames;
	meta.publish_time_ns = ktime_get_ns();
	res->publish_ns = meta.publish_time_ns;
	meta.window_us = min_t(u64, div_u64(tr->wf_ns, NSEC_PER_USEC), U32_MAX);
	meta.coarse_window_us = div_u64(tr->wc_ns, NSEC_PER_USEC);
	meta.windows = ri->windows;
	meta.tracker_cpu_us = ri->cpu_us;
	meta.tracked_frames = tr->tracked_frames;
	vtism_ch_end_round(h, seq, &meta);
}
