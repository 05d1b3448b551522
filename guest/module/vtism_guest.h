/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vtism_guest: internal interfaces between the PCI/thread glue (vtism_main.c), the page-table
 * scanner (vtism_scan.c) and the per-frame history and publication (vtism_track.c).
 */
#ifndef VTISM_GUEST_H
#define VTISM_GUEST_H

#include <linux/types.h>
#include <linux/xarray.h>
#include <linux/mm_types.h>
#include <linux/pgtable.h>

#include "vtism_channel.h"

#ifndef CONFIG_X86_64
#error "vtism_guest reads x86-64 page-table bits directly"
#endif

#define VT_NAME "vtism_guest"
#define VT_HIST_MAX 16	/* history window limit: 16 bits of per-frame state */

/* Tunables (module parameters, may change at run time; read once per round). */
extern unsigned int vt_interval_k;
extern unsigned int vt_interval_kb;
extern unsigned int vt_interval_base_ms;
extern unsigned int vt_interval_max_ms;
extern unsigned int vt_history_rounds;
extern unsigned int vt_hot_threshold;
extern unsigned long vt_max_entries;
extern bool vt_prune;
extern bool vt_tlb_flush;

/* Counters of one round (also summed into the totals). */
struct vt_round_stats {
	u64 mms;		/* address spaces scanned */
	u64 mm_released;	/* the scanner held the last user of an mm: its process exited */
	u64 lock_drops;		/* mmap lock dropped and retaken mid-mm */
	u64 ptes_visited;	/* PTE slots examined */
	u64 ptes_present;
	u64 ptes_young;
	u64 pmd_tables;		/* PMD entries pointing to a PTE table, examined */
	u64 pmd_skipped;	/* ...whose Accessed bit was clear: PTE table not visited */
	u64 pud_tables;
	u64 pud_skipped;
	u64 thp_present;	/* PMD-mapped THPs examined */
	u64 thp_young;
	u64 tracked_bytes;	/* present user memory visited */
	u64 pte_retries;	/* PMD changed under us before the PTE lock was taken */
};

/* Everything visible in /sys/kernel/vtism_guest/. */
struct vt_stats {
	u64 rounds;
	u64 last_scan_us;
	u64 total_scan_us;
	u64 last_interval_ms;
	u64 last_entries;
	u64 entries_written;
	u64 last_hot_frames;
	u64 overflow_rounds;
	u64 tracked_frames;	/* frames with a non-empty history */
	u64 track_alloc_fail;	/* frames not tracked for lack of memory */
	u64 fb_entry_budget;	/* last host feedback seen */
	u64 fb_min_interval_ms;
	u64 fb_ack_round;
	u64 fb_read_retries;	/* host was writing its feedback when we read it */
	u64 tlb_flushes;
	u64 stopped_mid_scan;
	struct vt_round_stats last;	/* of the last completed round */
	struct vt_round_stats total;
};

extern struct vt_stats vt_stats;

/* What the scanner reports for one young mapping. */
struct vt_obs {
	unsigned long pfn;
	u8 type;	/* VTISM_PAGE_* */
	u8 write;	/* Dirty bit was set (read, never cleared) */
	u8 huge;	/* PMD-mapped THP: pfn is the 512-aligned head */
};

/* Per-frame history, keyed by pfn (vtism_track.c). */
struct vt_track {
	struct xarray chunks;		/* pfn >> VT_CHUNK_SHIFT -> u32[VT_CHUNK_FRAMES] */
	unsigned long chunk_idx;	/* one-entry lookup cache */
	u32 *chunk;
	unsigned long *active;		/* pfns with a non-empty history or young this round */
	unsigned long nr_active;
	unsigned long cap_active;
};

int vt_track_init(struct vt_track *t);
void vt_track_destroy(struct vt_track *t);
void vt_track_observe(struct vt_track *t, const struct vt_obs *o);

struct vt_publish_result {
	u64 candidates;		/* hot entries before truncation */
	u64 hot_frames;		/* 4 KiB frames they cover */
	u64 written;
};

/* Age the history by one round and publish the hottest entries into the channel. */
void vt_track_end_round(struct vt_track *t, struct vtism_ch_header *h, u64 budget,
			struct vtism_ch_round_meta *meta, struct vt_publish_result *res);

/* Scanner (vtism_scan.c). Returns false if it stopped early because the thread must exit. */
struct vt_scan_buf;
struct vt_scan_buf *vt_scan_alloc(void);
void vt_scan_free(struct vt_scan_buf *b);
bool vt_scan_all(struct vt_scan_buf *b, struct vt_track *t, struct vt_round_stats *rs);
void vt_flush_tlbs(void);

/* The adaptive interval, in ms, for a scan that took scan_us. */
u64 vt_interval_ms(u64 scan_us, u32 min_interval_ms);

#endif /* VTISM_GUEST_H */
