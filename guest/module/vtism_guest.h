/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * vtism_guest: internal interfaces between the thread and its schedule (vtism_main.c), the
 * page-table passes (vtism_scan.c), the region table (vtism_regions.c), the rate estimates and
 * publication (vtism_track.c), the fixed-point rate arithmetic (vtism_rate.c) and the CPU
 * budget (vtism_budget.c).
 * docs/guest.md describes the tracker these implement.
 */
#ifndef VTISM_GUEST_H
#define VTISM_GUEST_H

/*
 * With VT_RATE_USERSPACE only the rate and budget sections below are declared, for the
 * user-space builds of vtism_rate.c and vtism_budget.c (vtism_rate_user.h provides the types
 * and helpers).
 */
#ifndef VT_RATE_USERSPACE
#include <linux/bits.h>
#include <linux/hashtable.h>
#include <linux/list.h>
#include <linux/mm_types.h>
#include <linux/pgtable.h>
#include <linux/types.h>
#include <linux/xarray.h>

#include "vtism_channel.h"

#ifndef CONFIG_X86_64
#error "vtism_guest reads x86-64 page-table bits directly"
#endif

#define VT_NAME "vtism_guest"
#endif /* VT_RATE_USERSPACE */

/* ---- rates (vtism_rate.c) ---- */

/* A rate code: 64 per doubling of the access rate, VT_RC_1HZ = 1 Hz, 0 = none, at most 64 kHz
 * (level 255 is 980 Hz; Hz in Q32 stay below 2^48). */
#define VT_RC_PER_OCTAVE 64
#define VT_RC_1HZ 2048
#define VT_RC_MAX (VT_RC_1HZ + 16 * VT_RC_PER_OCTAVE)

s64 vt_log2_q16(u64 x);
u64 vt_exp2_q32(s64 y);
u64 vt_hz_of_code(unsigned int code);
unsigned int vt_code_of_hz(u64 hz, u32 dither);
u64 vt_share_of_x(u64 x);
u64 vt_exposure(u64 t_us, u64 w_us, u32 div);
u64 vt_rate_add(u64 hz, u64 t_us, u64 w_us, bool young, u32 div);
#define VT_FAST_OCTAVES 2	/* fast: x = rate w >= 2^2 (vt_fast_code) */
unsigned int vt_fast_code(u64 w_us);
unsigned int vt_rise_code(u64 w_us, unsigned int m);
unsigned int vt_fall_code(u64 w_us, unsigned int m);
s64 vt_idle_codes(u64 t_us, u64 w_us, u32 div);
unsigned int vt_code_moved(unsigned int code, s64 d, u32 dither);
unsigned int vt_level_of_code(s64 code);
unsigned int vt_share_code(unsigned int region_code, unsigned int present);
s64 vt_published_code(unsigned int code, s64 follow, unsigned int region_code,
		      unsigned int wc_fast_code, s64 share);
#define VT_CHANGE_OCTAVES 2	/* the change vt_change_step() detects: a factor of 4 */
s64 vt_change_lw(u64 w_us);
u64 vt_young_chance(unsigned int code, s64 lw);
#define VT_STALL_MIN 4	/* regions expected young: fewer cannot tell a stall */
bool vt_window_stalled(u64 expected, u64 young);
int vt_change_step(unsigned int code, s64 lw, bool young, u32 dither, u16 *down, u16 *up);

/* ---- the CPU budget (vtism_budget.c); times in ns, passed in ---- */

struct vt_budget {
	u64 bp;			/* cpu_budget_bp in effect, 1..10000 */
	u64 bank_ms;		/* credit_bank_ms in effect, 1..60000 */
	s64 credit_ns;		/* CPU the budget still allows */
	u64 last_now, last_cpu;	/* at the last account */
	u64 wake_ns;		/* CPU of one idle wake-up (sleep, wake, look around), averaged */
	u64 overdraw_ns;	/* largest debt seen lately: kept out of the bank */
	bool slept;		/* the step before the last account only slept */
};

void vt_budget_start(struct vt_budget *b, u64 bp, u64 bank_ms, u64 now, u64 cpu);
void vt_budget_account(struct vt_budget *b, u64 bp, u64 bank_ms, u64 now, u64 cpu);
s64 vt_budget_bank(const struct vt_budget *b);
u64 vt_budget_when(const struct vt_budget *b, s64 need);
void vt_budget_round(struct vt_budget *b);
u64 vt_budget_debt(const struct vt_budget *b);

#ifndef VT_RATE_USERSPACE

/* ---- tunables (module parameters, may change at run time) ---- */

extern unsigned int vt_cpu_budget_bp;
extern unsigned int vt_coarse_period_ms;
extern unsigned int vt_coarse_chunk;
extern unsigned int vt_coarse_window_min_us;
extern unsigned int vt_coarse_window_max_us;
extern unsigned int vt_fine_window_min_us;
extern unsigned int vt_fine_window_max_us;
extern unsigned int vt_burst;
extern unsigned int vt_dnd_max_level;
extern unsigned int vt_round_ms;
extern unsigned int vt_pass_max_us;
extern unsigned int vt_access_goal_bp;
extern unsigned int vt_interval_k;
extern unsigned int vt_interval_kb;
extern unsigned int vt_interval_base_ms;
extern unsigned int vt_interval_max_ms;
extern unsigned long vt_max_entries;
extern bool vt_prune;
extern bool vt_tlb_flush;

#define VT_BURST_MAX_WINDOWS 6	/* fine windows per burst: young bits 0-5 of a frame's scratch */

/* ---- the region table (vtism_regions.c) ---- */

/*
 * A frame word: one 4 KiB page of a region, as its last fine burst saw it. The rate is the
 * frame's own estimate from its fine windows; DND is HMM-V's do-not-disturb level and SKIP the
 * bursts it still sits out.
 */
#define VT_F_PFN	GENMASK_ULL(39, 0)
#define VT_F_RATE	GENMASK_ULL(51, 40)
#define VT_F_DND	GENMASK_ULL(54, 52)
#define VT_F_SKIP	GENMASK_ULL(58, 55)
#define VT_F_WRITE	BIT_ULL(59)	/* Dirty seen once (read, never cleared): sticky */
#define VT_F_TYPE	GENMASK_ULL(61, 60)
#define VT_F_PRESENT	BIT_ULL(62)
#define VT_F_UNCLEARED	BIT_ULL(63)	/* sat out the last burst: its Accessed bit was left set */

#define VT_REGION_FRAMES PTRS_PER_PTE	/* a region is what one PMD entry maps: 2 MiB */

/* region flags */
#define VT_R_THP		BIT(0)	/* mapped by a huge PMD: one unit, frames == NULL */
#define VT_R_YOUNG		BIT(1)	/* young in its last short coarse window */
#define VT_R_OPEN		BIT(2)	/* a coarse window is open on it (cleared, not read yet) */
#define VT_R_SEEN_COARSE	BIT(3)	/* a fine pass found its PMD Accessed bit set */
#define VT_R_SEEN_FINE		BIT(4)	/* a coarse pass found its PMD Accessed bit set */
#define VT_R_MEASURED		BIT(5)	/* has had a fine burst: crate_then is meaningful */
#define VT_R_BURST		BIT(6)	/* in the fine burst in flight: not freed */
#define VT_R_READ		BIT(7)	/* has had a coarse read: last_read_ms is meaningful */
#define VT_R_USED		BIT(8)	/* the slot holds a region */
#define VT_R_UNCLEARED		BIT(9)	/* frames sat out its last burst with their bits set */
#define VT_R_CHANGED		BIT(10)	/* change detection found its rate changed: burst it first */

struct vt_region {
	u64 *frames;		/* PTE-table region: VT_REGION_FRAMES words, NULL until it is first
				 * seen young or bursts; rates 0 before its first burst */
	u64 unit;		/* THP region: its frame word (pfn = the 512-aligned head) */
	u32 last_read_ms;	/* end of its last coarse window */
	u32 last_burst_ms;	/* end of its last fine burst */
	u32 ct_us;		/* decayed time of its coarse windows (the rate's exposure) */
	u32 cs_us;		/* the same of its short coarse windows only (vt_fast_code) */
	u32 ft_us;		/* the same for its frames' fine windows, long and short */
	u32 fs_us;		/* and of the short fine windows only */
	u16 crate;		/* region rate code: some page of it used, per second */
	u16 crate_then;		/* crate when its frames were last measured */
	u16 present;		/* present 4 KiB frames at its last burst (512 for a THP), or
				 * at the PTE read before its first (vt_coarse_frames) */
	u16 cstamp;		/* coarse period that last saw it mapped */
	u16 flags;
	u16 cdown, cup;		/* change detection on crate (vt_change_step) */
};

#define VT_CHUNK_SHIFT 6	/* 64 regions (128 MiB of address space) per table chunk */
#define VT_CHUNK_REGIONS (1u << VT_CHUNK_SHIFT)

struct vt_chunk {
	struct vt_region r[VT_CHUNK_REGIONS];
	unsigned int nr;	/* regions in use */
};

/* One address space the tracker follows. */
struct vt_mm {
	struct mm_struct *mm;	/* mmgrab()bed: never reused for another mm while we hold it */
	struct list_head node;	/* vt_table.mms, in discovery order */
	struct hlist_node hnode;
	struct xarray chunks;	/* region index >> VT_CHUNK_SHIFT -> struct vt_chunk */
	unsigned long nr_regions;
	unsigned int busy;	/* windows or bursts in flight that refer to it */
	u32 seen;		/* discovery generation that last found a process using it */
	s32 spread;		/* frames one access of a region touches, log2 in rate codes */
	bool gone;		/* its address space is gone (mm_users reached 0) */
};

struct vt_table {
	struct list_head mms;
	DECLARE_HASHTABLE(hash, 8);
	unsigned long nr_mms;
	u64 regions;		/* in use, all address spaces */
	u64 thp_regions;
	u64 frame_arrays;	/* regions with frame words */
	unsigned long chunks;
	u64 alloc_fail;
	/* chunk lookup cache */
	struct vt_mm *cache_vm;
	unsigned long cache_idx;
	struct vt_chunk *cache_chunk;
};

void vt_table_init(struct vt_table *t);
void vt_table_destroy(struct vt_table *t);
struct vt_mm *vt_mm_find_or_add(struct vt_table *t, struct mm_struct *mm, u32 gen);
void vt_mm_release(struct vt_table *t, struct vt_mm *vm);
struct vt_region *vt_region_get(struct vt_table *t, struct vt_mm *vm, unsigned long idx,
				bool create);
void vt_region_free(struct vt_table *t, struct vt_mm *vm, unsigned long idx);
u64 *vt_region_frames(struct vt_table *t, struct vt_region *r);
/* Next region in use at or after idx in vm; false at the end of vm. */
bool vt_region_next(struct vt_table *t, struct vt_mm *vm, unsigned long *idx);
struct vt_mm *vt_mm_next(struct vt_table *t, struct vt_mm *vm);
void vt_table_reap(struct vt_table *t, u32 gen, u16 cstamp, bool coarse_open);
u64 vt_table_bytes(const struct vt_table *t);

static inline unsigned long vt_region_idx(unsigned long addr)
{
	return addr >> PMD_SHIFT;
}

/* ---- statistics ---- */

/* Counters, summed by the thread; published per round and in total. */
struct vt_counters {
	u64 coarse_windows;
	u64 fine_windows;
	u64 coarse_passes;
	u64 fine_passes;
	u64 pass_yields;	/* passes that stopped after pass_max_us and resumed */
	u64 regions_visited;	/* region visits by coarse passes */
	u64 coarse_young;	/* regions young in a short coarse window */
	u64 ptes_visited;	/* PTE slots examined by fine passes */
	u64 ptes_cleared;	/* Accessed bits found set and cleared */
	u64 ptes_dnd;		/* present PTEs left alone (do-not-disturb) */
	u64 pmd_skipped;	/* fine passes: PTE tables not read, their PMD unused (pruning) */
	u64 pud_skipped;	/* coarse passes: PUD subtrees not walked, their PUD unused */
	u64 thp_young;
	u64 mms;		/* address spaces entered by passes */
	u64 mm_released;	/* ...whose last user was the scanner (the process exited meanwhile) */
	u64 lock_drops;		/* mmap lock dropped for a waiting writer */
	u64 pte_retries;	/* PMD changed before its PTE lock was taken */
	u64 tlb_flushes;
	u64 budget_waits;	/* times a window waited for CPU budget */
	u64 sweeps;		/* full fine sweeps */
	u64 bursts;
	u64 frames_read;	/* coarse passes: PTE tables read for a region not yet measured */
	u64 changes;		/* change detection's alarms (vt_change_step) */
	u64 coarse_stalls;	/* coarse windows stalled (vt_window_stalled) */
	u64 rate_rises;		/* frames that started over from a burst: rate risen (vt_rise_code) */
	u64 rate_falls;		/* ...rate fallen (vt_fall_code) */
	u64 changed_bursted;	/* regions burst ahead of the sweep: change detection alarmed */
	u64 neighbours_flagged;	/* ...flagged because a neighbour's frames changed (vt_track.c) */
};

struct vt_stats {
	u64 rounds;
	u64 elapsed_us;		/* since the thread started */
	u64 cpu_us;		/* the thread's CPU time */
	u64 last_round_cpu_us;	/* in the last round (published as tracker_cpu_us) */
	u64 last_publish_us;	/* CPU of the last publication */
	u64 max_publish_us;	/* and of the longest since load */
	u64 round_ms;		/* the round period in effect */
	u64 coarse_window_us;	/* W_c */
	u64 coarse_window_eff_us; /* the last coarse window: clearing pass start to read */
	u64 fine_window_us;	/* W_f */
	u64 access_goal_ppm;	/* share of frames the windows aim to see young */
	u64 regions;
	u64 thp_regions;
	u64 tracked_frames;
	u64 dnd_frames;		/* frames sitting out bursts right now */
	u64 table_bytes;	/* memory of the region table and frame words */
	u64 last_entries;
	u64 entries_written;
	u64 last_hot_frames;
	u64 overflow_rounds;
	u64 early_rounds;	/* published before their period: rates changed (vt_round_early_when) */
	/* the last sweep followed by another: its CPU, the interval T that made, and the gap */
	u64 last_sweep_cpu_us;
	u64 last_sweep_bound_ms;
	u64 last_sweep_gap_ms;	/* from its start to the start of the next sweep */
	u64 region_burst_us;	/* the estimate of one region's burst CPU that sizes bursts */
	u64 overdraw_us;	/* largest debt seen lately, kept out of the bank (vt_bank) */
	u64 debt_us;		/* CPU spent beyond the budget and not yet repaid, at the last round */
	u64 track_alloc_fail;
	u64 fb_entry_budget;	/* last host feedback seen */
	u64 fb_min_interval_ms;
	u64 fb_ack_round;
	u64 fb_fast_quota_bytes;
	u64 fb_read_retries;
	u64 stopped_mid_scan;
	struct vt_counters last;	/* in the last round */
	struct vt_counters total;
};

extern struct vt_stats vt_stats;

/* ---- page-table passes (vtism_scan.c) ---- */

enum vt_pass_result { VT_PASS_DONE, VT_PASS_YIELD, VT_PASS_STOP };

/* Where a coarse pass is: an address space and an address in it. */
struct vt_pos {
	struct vt_mm *vm;	/* NULL: past the last address space */
	unsigned long addr;
};

struct vt_coarse {
	bool read;		/* the read pass (else the clearing pass) */
	struct vt_pos pos;	/* next to visit */
	struct vt_pos start;	/* of the chunk */
	struct vt_pos end;	/* of the chunk, set by its clearing pass */
	unsigned int regions;	/* visited in this chunk (read pass: with a window open) */
	unsigned int young;	/* young in the read pass */
	u64 t_clear_ns;		/* clearing pass started */
	u64 cpu_clear_ns;	/* the tracker's CPU time then */
	/* upper entries already decided in this pass: kept across yields */
	unsigned long pud_base, pmd_base;
	bool pud_walk;
};

/* One region of the fine burst in flight, with its frames' young bits. */
struct vt_burst_region {
	struct vt_mm *vm;
	unsigned long idx;
	u8 young[VT_REGION_FRAMES];	/* bit i: window i; VT_BY_LONG, VT_BY_DND, VT_BY_SEEN */
};
#define VT_BY_LONG	BIT(7)	/* young in the long window since the last burst */
#define VT_BY_DND	BIT(6)	/* sits out this burst */
/* obs[]: VT_F_PRESENT, VT_F_PFN, VT_F_WRITE (Dirty now), VT_F_TYPE unless VT_OBS_SAME */

#define VT_BURST_REGIONS 64

struct vt_burst {
	unsigned int n;		/* regions */
	unsigned int m;		/* windows */
	unsigned int pass;	/* next pass: 0 clears, 1..m read */
	unsigned int next;	/* next region of the pass in progress */
	u64 t_pass_ns[VT_BURST_MAX_WINDOWS + 1];
	u64 cpu_pass_ns[VT_BURST_MAX_WINDOWS + 1];	/* the thread's CPU time then */
	u64 cpu_ns;		/* spent on its passes so far */
	bool wraps;		/* its last region ends the sweep */
	struct vt_burst_region r[VT_BURST_REGIONS];
};

struct vt_tracker;
void vt_discover(struct vt_tracker *tr);
enum vt_pass_result vt_coarse_pass(struct vt_tracker *tr, struct vt_coarse *c);
enum vt_pass_result vt_fine_pass(struct vt_tracker *tr, struct vt_burst *b);
void vt_flush_tlbs(void);

/* ---- rates and publication (vtism_track.c) ---- */

struct vt_tracker {
	struct vt_table table;
	struct vt_counters c;	/* this round */
	u32 gen;		/* discovery generation */
	u16 cperiod;		/* coarse periods started (wrapping) */
	u64 now_ns;		/* time at the start of the pass in progress */
	u64 deadline_ns;	/* a pass yields when its CPU reaches this */
	bool prune;
	bool nonleaf_young;	/* the MMU sets Accessed bits in PMD/PUD entries (not Xen PV) */
	u64 wc_ns;		/* coarse window W_c */
	u64 wc_eff_us;		/* the window the chunk being read really had (vt_coarse_step) */
	u64 wf_ns;		/* fine window W_f */
	u64 goal_ppm;		/* share of regions / frames to see young per window */
	u64 tracked_frames;
	u64 dnd_frames;
	/* fine sweep: a cursor over the region table */
	struct vt_mm *cur_vm;
	unsigned long cur_idx;
	u64 sweep_young;	/* frame-windows young in the sweep in progress */
	u64 sweep_seen;		/* frame-windows observed */
	u64 sweep_cpu_ns;
	u64 sweep_start_ns;
	u64 next_sweep_ns;
	u64 sweep_gap_ms;	/* between the starts of the last two sweeps */
	u64 sweep_bound_cpu_us;	/* CPU of the last complete sweep... */
	u64 sweep_bound_ms;	/* ...and the seed's interval it sets before the next one */
	u64 gap_cpu_us, gap_bound_ms;	/* those that bounded sweep_gap_ms */
	u8 sweep;		/* sweep counter (wrapping), for the regions' stamps */
	u64 region_burst_ns;	/* CPU per region per burst, averaged: sizes bursts */
	u32 rng;		/* xorshift state: dithers the rounding of rate codes */
	u64 cfast_period_ms;	/* the coarse period cfast_code is for... */
	unsigned int cfast_code;	/* ...and the rate fast for it (vt_fast_code) */
	u64 idle_t, idle_w;	/* last idle coarse window's exposure and length... */
	s64 idle_d;		/* ...and what it did to a rate: regions of a chunk share it */
	u64 change_regions;	/* regions change detection found risen since the last round */
	/* the coarse window being read: its idle regions' change steps wait for its end */
	struct vt_region **deferred;
	u64 deferred_n, deferred_cap;
	u64 win_expect;		/* regions expected young (vt_young_chance), Q32... */
	u64 win_young;		/* ...and those seen young */
	u64 changed_pending;	/* regions flagged VT_R_CHANGED, at most (vt_burst_select) */
	bool cursor_turn;	/* this burst of a sweep starts at the cursor (vt_burst_select) */
	u64 change_w;		/* last short coarse window's length... */
	s64 change_lw;		/* ...its vt_change_lw() */
	/* scratch of the passes */
	u64 *obs;		/* frame words seen by the last pass of a burst, per region */
	u64 pub_hist[256];	/* publication's counting sort */
	u64 pub_off[256];
	u8 *pub_levels;		/* its first pass's levels for the second (vt_pub_levels) */
	u64 pub_levels_n;
	struct task_struct **tasks;
	unsigned int tasks_cap;
};

static inline u32 vt_dither(struct vt_tracker *tr)
{
	u32 x = tr->rng;

	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	tr->rng = x;
	return x;
}

void vt_coarse_observe(struct vt_tracker *tr, struct vt_region *r, bool young, bool read);
void vt_coarse_window_open(struct vt_tracker *tr, unsigned int regions);
void vt_coarse_window_done(struct vt_tracker *tr);
void vt_coarse_adapt(struct vt_tracker *tr, unsigned int regions, unsigned int young);
void vt_burst_land_region(struct vt_tracker *tr, struct vt_burst *b, struct vt_burst_region *br,
			  struct vt_region *r, const u64 *obs);
void vt_sweep_end(struct vt_tracker *tr, u64 now_ns);
void vt_update_goal(struct vt_tracker *tr, u64 fast_quota_bytes);

struct vt_publish_result {
	u64 candidates;		/* entries with a level above 0, before truncation */
	u64 written;
	u64 hot_frames;		/* 4 KiB frames at 1 Hz or more */
	u64 tracked_bytes;
	u64 publish_ns;		/* the round's publish_time_ns */
};

struct vt_round_info {
	u32 round_ms;
	u32 cpu_us;
	u32 windows;
};

void vt_publish(struct vt_tracker *tr, struct vtism_ch_header *h, u64 budget,
		const struct vt_round_info *ri, struct vt_publish_result *res);

#define VT_OBS_SAME	BIT_ULL(63)	/* pfn unchanged: type not looked up again */

#endif /* VT_RATE_USERSPACE */
#endif /* VTISM_GUEST_H */
