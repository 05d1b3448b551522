// SPDX-License-Identifier: GPL-2.0
/*
 * vtism_guest rate estimates and publication.
 *
 * Every observation window, whatever its length, moves a rate (vtism_rate.c): a region's rate
 * (some page of it used, per second) from its coarse windows, a frame's own rate from its fine
 * windows. The window loops aim at seeing a share of regions / frames young per window that
 * matches what the host's fast-memory quota holds. A round publishes every frame's rate as a
 * channel v1.1 level, hottest first: never above its region's rate nor below that rate shared
 * among the region's frames, and, until the frame's first burst, at that share.
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

/* The region goes first into the next fine burst (vt_burst_select_changed) */
static void vt_flag_changed(struct vt_tracker *tr, struct vt_region *r)
{
	if (!(r->flags & VT_R_CHANGED)) {
		r->flags |= VT_R_CHANGED;
		tr->changed_pending++;
	}
}

/* Change detection's alarm (vt_change_step) on a region: its rate moves by the factor */
static void vt_region_alarm(struct vt_tracker *tr, struct vt_region *r, int change)
{
	if (!change)
		return;
	r->crate = vt_code_moved(r->crate, (s64)change * (VT_CHANGE_OCTAVES * VT_RC_PER_OCTAVE << 10),
				 vt_dither(tr));
	tr->change_regions += change > 0;	/* risen: vt_round_early_when() */
	vt_flag_changed(tr, r);
	tr->c.changes++;
}

/* Room for the idle regions of a coarse window of `regions` (vt_coarse_window_done) */
void vt_coarse_window_open(struct vt_tracker *tr, unsigned int regions)
{
	tr->deferred_n = 0;
	tr->win_expect = 0;
	tr->win_young = 0;
	if (regions <= tr->deferred_cap)
		return;
	kvfree(tr->deferred);
	tr->deferred_cap = regions + regions / 8;
	tr->deferred = kvmalloc_array(tr->deferred_cap, sizeof(*tr->deferred),
				      GFP_KERNEL | __GFP_NOWARN);
	if (!tr->deferred)
		tr->deferred_cap = 0;	/* idle windows step at once, stalled or not */
}

/*
 * The coarse window read: its idle regions' change steps, unless it stalled
 * (vt_window_stalled). They come after the window's rate updates, a step of a rate that one
 * idle window moved by its decay (a few codes in 64 an octave).
 */
void vt_coarse_window_done(struct vt_tracker *tr)
{
	u64 i;

	if (vt_window_stalled(tr->win_expect, tr->win_young)) {
		tr->c.coarse_stalls++;
		tr->deferred_n = 0;
		return;
	}
	for (i = 0; i < tr->deferred_n; i++) {
		struct vt_region *r = tr->deferred[i];

		vt_region_alarm(tr, r, vt_change_step(r->crate, tr->change_lw, false, vt_dither(tr),
						      &r->cdown, &r->cup));
	}
	tr->deferred_n = 0;
}

/*
 * A short coarse window's change step (vt_change_step): young at once, idle once the window
 * is known not to have stalled (vt_coarse_window_done). Returns the alarm, if any.
 */
static int vt_region_change(struct vt_tracker *tr, struct vt_region *r, u64 w_us, bool young)
{
	if (w_us != tr->change_w) {
		tr->change_w = w_us;
		tr->change_lw = vt_change_lw(w_us);
	}
	tr->win_expect += vt_young_chance(r->crate, tr->change_lw);
	tr->win_young += young;
	if (!young && r->crate && tr->deferred_n < tr->deferred_cap) {
		tr->deferred[tr->deferred_n++] = r;
		return 0;
	}
	return vt_change_step(r->crate, tr->change_lw, young, vt_dither(tr), &r->cdown, &r->cup);
}

/*
 * One coarse window of w_us averaged into the region's rate; long_w: the one since the last
 * read. A fast region's rate weighs its short windows only (vt_fast_code). A short window
 * also feeds change detection (vt_region_change): on an alarm the rate moves by its factor.
 */
static void vt_region_window(struct vt_tracker *tr, struct vt_region *r, u64 w_us, bool young,
			     bool long_w)
{
	bool fast = r->crate >= vt_coarse_fast_code(tr);
	u64 t = fast ? r->cs_us : r->ct_us;
	int change = 0;

	if (!long_w)
		change = vt_region_change(tr, r, w_us, young);
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
	vt_region_alarm(tr, r, change);
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
	unsigned int rise_code;			/* below it, young in all m: risen (vt_rise_code) */
	unsigned int fall_code;			/* from it, idle in all m: fallen (vt_fall_code) */
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

/*
 * The mean length of a burst's short windows in the workload's time: the wall time from the
 * first pass to the last, less what this thread ran meanwhile (its passes, a publication, a
 * coarse pass) over the CPUs it took it from. On one vCPU the workload cannot run while the
 * thread does; where a pass takes as long as a window (TCG inside TCG: a region's pass ~50 ms,
 * a publication ~200 ms, windows ~130 ms) a hot frame was otherwise seen idle through windows
 * it could not run in, and the fall rule took it for cold. At most three quarters is taken off.
 */
static u64 vt_burst_window_us(const struct vt_burst *b)
{
	u64 wall = b->t_pass_ns[b->m] - b->t_pass_ns[0];
	u64 lost = div_u64(b->cpu_pass_ns[b->m] - b->cpu_pass_ns[0], max(num_online_cpus(), 1U));

	return max_t(u64, div_u64(wall - min(lost, wall / 4 * 3), b->m * NSEC_PER_USEC), 1);
}

static void vt_burst_windows_init(struct vt_burst_windows *bw, const struct vt_burst *b,
				  const struct vt_region *r, const struct vt_tracker *tr)
{
	unsigned int j;
	u64 t;

	bw->m = b->m;
	bw->w_us = vt_burst_window_us(b);
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
	bw->rise_code = vt_rise_code(bw->w_us, bw->m);
	bw->fall_code = vt_fall_code(bw->w_us, bw->m);
}

/* What a burst's windows say about a frame's rate: nothing improbable, risen or fallen */
enum vt_shift { VT_STEADY, VT_RISEN, VT_FALLEN };

/* frames of a burst that started over, by direction */
struct vt_shifts {
	unsigned int rises, falls;
};

/*
 * Young in every short window, or idle in every one, which its rate says happens in under 1 burst
 * in 100: the rate changed, and the frame starts over from the burst.
 */
static enum vt_shift vt_frame_shift(const struct vt_burst_windows *bw, unsigned int code, u8 y)
{
	u8 all = (u8)(BIT(bw->m) - 1);

	if (code < bw->rise_code && (y & all) == all)
		return VT_RISEN;
	if (code >= bw->fall_code && !(y & all))
		return VT_FALLEN;
	return VT_STEADY;
}

/*
 * A frame's rate through the burst's windows; y: bit j-1 = window j, VT_BY_LONG. A frame whose
 * rate changed starts over (counted in sh): a risen one from the short windows, as on its first
 * burst, a fallen one from the long window too (the page used in it or not, where that counts).
 */
static unsigned int vt_frame_rate(const struct vt_burst_windows *bw, unsigned int code, u8 y,
				  bool first, bool long_valid, u32 dither, struct vt_shifts *sh)
{
	enum vt_shift shift = first ? VT_STEADY : vt_frame_shift(bw, code, y);
	bool fast, restart = first || shift != VT_STEADY;
	unsigned int j;
	u64 hz, t;

	sh->rises += shift == VT_RISEN;
	sh->falls += shift == VT_FALLEN;
	fast = !restart && code >= bw->fast_code;
	y &= (u8)(BIT(bw->m) - 1) | VT_BY_LONG;
	if (!restart && !y)
		return vt_code_moved(code, fast ? bw->idle_fast : bw->idle, dither);
	hz = restart ? 0 : vt_hz_of_code(code);
	t = restart ? 0 : fast ? bw->s0 : bw->t[0];
	/* a bit left set by do-not-disturb says nothing about the long window, nor does a young
	 * one to a fast rate */
	if ((!restart || shift == VT_FALLEN) && bw->has_long && long_valid &&
	    !(fast && (y & VT_BY_LONG))) {
		hz = vt_rate_add(hz, t, bw->long_us, y & VT_BY_LONG, VT_FINE_DIV);
		t = restart ? vt_exposure(0, bw->long_us, VT_FINE_DIV) : fast ? bw->s1 : bw->t[1];
	}
	for (j = 0; j < bw->m; j++) {
		hz = vt_rate_add(hz, t, bw->w_us, y & BIT(j), VT_FINE_DIV);
		t = vt_exposure(t, bw->w_us, VT_FINE_DIV);
	}
	return vt_code_of_hz(hz, dither);
}

/* A measured frame word: new rate, HMM-V's do-not-disturb level up or down */
static u64 vt_frame_land(const struct vt_burst_windows *bw, u64 f, u8 y, bool first,
			 u32 dither, unsigned int *young_w, struct vt_shifts *sh)
{
	unsigned int k = hweight8(y & (BIT(bw->m) - 1));
	unsigned int dnd = FIELD_GET(VT_F_DND, f), max = min(READ_ONCE(vt_dnd_max_level), 7u);
	unsigned int rate = vt_frame_rate(bw, FIELD_GET(VT_F_RATE, f), y, first,
					  !(f & VT_F_UNCLEARED), dither, sh);
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
 * A region where a quarter of its frames or more started over (their rate rose or fell) is where
 * a hot set arrived or left, and hot sets are mostly contiguous (an array's hot part, a moving
 * window, a heap's young end: what DAMON's regions assume). So its neighbours are burst next,
 * ahead of the sweep, and theirs in turn while they changed too, unless measured in the last
 * VT_NEIGHBOUR_GAP_MS. Otherwise the regions a moved hot set spans are found one per sweep as
 * the cursor passes them, and where the coarse windows cannot point at them (every region busy
 * in windows tens of ms long, docs/testbed.md) that takes minutes on a slow guest.
 */
#define VT_NEIGHBOUR_GAP_MS 10000
#define VT_NEIGHBOUR_MIN_FRAMES 64	/* a sparse region's few frames are no evidence */

static void vt_flag_neighbours(struct vt_tracker *tr, const struct vt_burst_region *br,
			       u32 now_ms, unsigned int present, unsigned int shifted)
{
	int d;

	if (present < VT_NEIGHBOUR_MIN_FRAMES || shifted * 4 < present)
		return;
	for (d = -1; d <= 1; d += 2) {
		struct vt_region *n;

		if (d < 0 && !br->idx)
			continue;
		n = vt_region_get(&tr->table, br->vm, br->idx + d, false);
		if (!n || (n->flags & (VT_R_CHANGED | VT_R_BURST)))
			continue;
		if ((n->flags & VT_R_MEASURED) && now_ms - n->last_burst_ms < VT_NEIGHBOUR_GAP_MS)
			continue;
		vt_flag_changed(tr, n);
		tr->c.neighbours_flagged++;
	}
}

/*
 * The last pass of a burst saw obs[] (frame words of the present PTEs): average its windows
 * into the frames' rates, move their do-not-disturb levels.
 */
void vt_burst_land_region(struct vt_tracker *tr, struct vt_burst *b, struct vt_burst_region *br,
			  struct vt_region *r, const u64 *obs)
{
	unsigned int m = b->m, i, present = 0, young_w = 0, seen_w = 0;
	struct vt_shifts sh = { 0, 0 };
	bool uncleared = false, measured = r->flags & VT_R_MEASURED;
	struct vt_burst_windows bw;

	vt_burst_windows_init(&bw, b, r, tr);
	if (r->flags & VT_R_THP) {
		u64 u = r->unit;

		if (u & VT_F_PRESENT) {
			/* one unit: no do-not-disturb (its one bit is the coarse windows' too) */
			unsigned int rate = vt_frame_rate(&bw, FIELD_GET(VT_F_RATE, u), br->young[0],
							  !(r->flags & VT_R_MEASURED), true,
							  vt_dither(tr), &sh);

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
			/* frames read before the first burst (vt_coarse_frames) have no rate yet */
			bool first = !(f & VT_F_PRESENT) || !measured;

			if (!(o & VT_F_PRESENT)) {
				frames[i] = 0;
				continue;
			}
			present++;
			/* a frame read before the first burst keeps the Dirty it showed, and its
			 * type while its pfn stays (VT_OBS_SAME) */
			if (first)
				f &= VT_F_TYPE | VT_F_WRITE;
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
				f = vt_frame_land(&bw, f, y, first, vt_dither(tr), &young_w,
						  &sh);
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
	if (measured)	/* counted only once measured (vt_pub_pass) */
		tr->tracked_frames -= min_t(u64, r->present, tr->tracked_frames);
	r->present = present;
	r->crate_then = r->crate;
	r->last_burst_ms = (u32)div_u64(b->t_pass_ns[m], NSEC_PER_MSEC);
	r->flags |= VT_R_MEASURED;
	tr->sweep_young += young_w;
	tr->sweep_seen += seen_w;
	tr->c.rate_rises += sh.rises;
	tr->c.rate_falls += sh.falls;
	vt_flag_neighbours(tr, br, r->last_burst_ms, present, sh.rises + sh.falls);
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
	/*
	 * The first pass keeps each measured frame's level here, VT_REGION_FRAMES per region in
	 * the order both passes visit them; the second reads it instead of computing it again,
	 * and reads a frame's word only to write its entry. NULL: both passes compute levels.
	 */
	u8 *levels;
	u64 nlevels, k;
	unsigned int low;	/* second pass: levels below are past the budget, not written */
	struct vt_publish_result *res;
};

static void vt_pub_count(struct vt_pub *p, unsigned int level, bool huge)
{
	if (!level)
		return;
	p->hist[level]++;
	p->res->candidates++;
	if (level >= 96)
		p->res->hot_frames += huge ? VTISM_CH_HUGE_FRAMES : 1;
}

static void vt_pub_write(struct vt_pub *p, u64 f, unsigned int level, bool huge, bool young)
{
	if (!level)
		return;
	if (p->off[level] < p->budget)
		WRITE_ONCE(p->entries[p->off[level]],
			   vtism_entry_make(FIELD_GET(VT_F_PFN, f), level, !!(f & VT_F_WRITE),
					    FIELD_GET(VT_F_TYPE, f), huge, young));
	p->off[level]++;
}

static void vt_pub_one(struct vt_pub *p, u64 f, s64 code, bool huge, bool young)
{
	unsigned int level = code > 0 ? vt_level_of_code(code) : 0;

	if (p->write)
		vt_pub_write(p, f, level, huge, young);
	else
		vt_pub_count(p, level, huge);
}

/*
 * A measured region's frames (r->frames): each at vt_published_code(), its region's rate
 * `follow`ed, bounded by it and at least `share`. With the level scratch, the first pass
 * computes and keeps the levels and the second reads them back.
 */
static void vt_pub_frames(struct vt_pub *p, const struct vt_region *r, s64 follow,
			  unsigned int wc_fast, s64 share, bool young, u64 *dnd)
{
	u8 *lv = p->levels && p->k + VT_REGION_FRAMES <= p->nlevels ? p->levels + p->k : NULL;
	unsigned int i;

	if (lv)
		p->k += VT_REGION_FRAMES;
	if (lv && p->write) {
		for (i = 0; i < VT_REGION_FRAMES; i++)
			if (lv[i] >= p->low)
				vt_pub_write(p, r->frames[i], lv[i], false, young);
		return;
	}
	for (i = 0; i < VT_REGION_FRAMES; i++) {
		u64 f = r->frames[i];
		s64 code;
		unsigned int level;

		if (!(f & VT_F_PRESENT)) {
			if (lv)
				lv[i] = 0;
			continue;
		}
		if (!p->write && FIELD_GET(VT_F_SKIP, f))
			(*dnd)++;
		code = vt_published_code(FIELD_GET(VT_F_RATE, f), follow, r->crate, wc_fast, share);
		level = code > 0 ? vt_level_of_code(code) : 0;
		if (lv)
			lv[i] = level;
		if (p->write)
			vt_pub_write(p, f, level, false, young);
		else
			vt_pub_count(p, level, false);
	}
}

/*
 * A region before its first fine burst: its frames at its coarse rate shared among them
 * (vt_share_code), a THP's unit as a measured one's, with the process's spread.
 */
static void vt_pub_unmeasured(struct vt_pub *p, const struct vt_mm *vm, const struct vt_region *r,
			      bool young)
{
	unsigned int i, share;

	if (r->flags & VT_R_THP) {
		share = vt_share_code(r->crate, VT_REGION_FRAMES);
		if ((r->unit & VT_F_PRESENT) && share)
			vt_pub_one(p, r->unit, (s64)share + vm->spread, true, young);
		return;
	}
	share = vt_share_code(r->crate, r->present);
	if (!r->frames || !share)
		return;
	for (i = 0; i < VT_REGION_FRAMES; i++)
		if (r->frames[i] & VT_F_PRESENT)
			vt_pub_one(p, r->frames[i], share, false, young);
}

static void vt_pub_pass(struct vt_tracker *tr, struct vt_pub *p)
{
	struct vt_table *t = &tr->table;
	struct vt_mm *vm = NULL;
	u64 tracked = 0, dnd = 0;
	/* a region's rate bounds its frames' from above below this (vt_published_code) */
	unsigned int wc_fast = vt_fast_code(div_u64(tr->wc_ns, NSEC_PER_USEC));

	while ((vm = vt_mm_next(t, vm))) {
		unsigned long idx = 0;

		for (; vt_region_next(t, vm, &idx); idx++) {
			struct vt_region *r = vt_region_get(t, vm, idx, false);
			bool young = r->flags & VT_R_YOUNG;
			s64 follow, share;

			if ((s16)(tr->cperiod - r->cstamp) > VT_STALE_PERIODS)
				continue;
			if (!(r->flags & VT_R_MEASURED)) {
				vt_pub_unmeasured(p, vm, r, young);
				continue;
			}
			tracked += r->present;
			follow = vt_follow(tr, r);
			if (follow == VT_REGION_IDLE)
				continue;
			if (r->flags & VT_R_THP) {
				u64 u = r->unit;
				unsigned int rate = FIELD_GET(VT_F_RATE, u);

				share = vt_share_code(r->crate, VT_REGION_FRAMES);
				if (u & VT_F_PRESENT)
					vt_pub_one(p, u, vt_published_code(rate, vm->spread - VT_SPREAD_MAX +
									   follow, r->crate, wc_fast,
									   share ? share + vm->spread : 0),
						   true, young);
				continue;
			}
			if (!r->frames)
				continue;
			/* its frames together are at least the region: each at least its share */
			share = vt_share_code(r->crate, r->present);
			vt_pub_frames(p, r, follow, wc_fast, share, young, &dnd);
		}
	}
	if (!p->write) {
		tr->tracked_frames = tracked;
		tr->dnd_frames = dnd;
		p->res->tracked_bytes = tracked << PAGE_SHIFT;
	}
}


/*
 * The level scratch for every region with frame words, grown as they grow (by an eighth beyond
 * what is needed, so that it is not grown every round); NULL when memory is short, and
 * publication computes levels in both passes.
 */
static u8 *vt_pub_levels(struct vt_tracker *tr, u64 *n)
{
	u64 need = tr->table.frame_arrays * VT_REGION_FRAMES;

	if (need > tr->pub_levels_n) {
		kvfree(tr->pub_levels);
		tr->pub_levels_n = need + need / 8;
		tr->pub_levels = kvmalloc(tr->pub_levels_n, GFP_KERNEL | __GFP_NOWARN);
		if (!tr->pub_levels)
			tr->pub_levels_n = 0;
	}
	*n = tr->pub_levels_n;
	return tr->pub_levels;
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
	p.levels = vt_pub_levels(tr, &p.nlevels);
	vt_pub_pass(tr, &p);
	p.low = 1;
	for (l = 255; l > 0; l--) {
		p.off[l] = pos;
		if (pos < budget)
			p.low = l;
		pos += p.hist[l];
	}
	res->written = min(res->candidates, budget);

	seq = vtism_ch_begin_round(h);
	p.write = true;
	p.k = 0;
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
