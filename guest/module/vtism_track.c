// SPDX-License-Identifier: GPL-2.0
/*
 * vtism_guest per-frame history and publication.
 *
 * Every frame seen young keeps a 32-bit state word: a shift register of the last 16 rounds
 * (bit 0 = newest), the page type, write and huge flags. State words live in lazily allocated
 * chunks of 32768 frames (128 MiB of guest memory per 128 KiB chunk), found by an xarray on
 * pfn >> 15, so the memory used follows the guest memory that was ever hot, not its size.
 * A separate list holds the pfns whose history is not empty, so aging and publication cost
 * O(tracked frames), not O(guest memory).
 *
 * Only the scanner thread touches any of this: no locking.
 */
#include <linux/bitfield.h>
#include <linux/bitops.h>
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/xarray.h>

#include "vtism_guest.h"

#define VT_CHUNK_SHIFT 15
#define VT_CHUNK_FRAMES BIT(VT_CHUNK_SHIFT)

#define VT_ST_HIST	GENMASK(15, 0)
#define VT_ST_CUR	BIT(16)		/* young in the round being scanned */
#define VT_ST_LISTED	BIT(17)		/* pfn is on the active list */
#define VT_ST_WRITE	BIT(18)
#define VT_ST_HUGE	BIT(19)
#define VT_ST_TYPE	GENMASK(21, 20)
#define VT_ST_KEY	GENMASK(29, 24)	/* publication order, set by aging; 0 = not hot */

/* key = count * 2 + young: hotter first, and among equals the ones young right now */
#define VT_NKEYS (2 * VT_HIST_MAX + 2)

int vt_track_init(struct vt_track *t)
{
	memset(t, 0, sizeof(*t));
	xa_init(&t->chunks);
	return 0;
}

void vt_track_destroy(struct vt_track *t)
{
	unsigned long idx;
	u32 *c;

	xa_for_each(&t->chunks, idx, c)
		kvfree(c);
	xa_destroy(&t->chunks);
	kvfree(t->active);
	memset(t, 0, sizeof(*t));
}

static u32 *vt_state(struct vt_track *t, unsigned long pfn, bool create)
{
	unsigned long idx = pfn >> VT_CHUNK_SHIFT;
	u32 *c;

	if (t->chunk && t->chunk_idx == idx)
		return &t->chunk[pfn & (VT_CHUNK_FRAMES - 1)];
	c = xa_load(&t->chunks, idx);
	if (!c) {
		if (!create)
			return NULL;
		c = kvcalloc(VT_CHUNK_FRAMES, sizeof(u32), GFP_KERNEL);
		if (!c)
			return NULL;
		if (xa_is_err(xa_store(&t->chunks, idx, c, GFP_KERNEL))) {
			kvfree(c);
			return NULL;
		}
	}
	t->chunk = c;
	t->chunk_idx = idx;
	return &c[pfn & (VT_CHUNK_FRAMES - 1)];
}

static bool vt_active_push(struct vt_track *t, unsigned long pfn)
{
	if (t->nr_active == t->cap_active) {
		unsigned long cap = max(t->cap_active * 2, 4096UL);
		unsigned long *n = kvmalloc_array(cap, sizeof(*n), GFP_KERNEL);

		if (!n)
			return false;
		if (t->nr_active)
			memcpy(n, t->active, t->nr_active * sizeof(*n));
		kvfree(t->active);
		t->active = n;
		t->cap_active = cap;
	}
	t->active[t->nr_active++] = pfn;
	return true;
}

void vt_track_observe(struct vt_track *t, const struct vt_obs *o)
{
	u32 *sp = vt_state(t, o->pfn, true);
	u32 s;

	if (!sp) {
		vt_stats.track_alloc_fail++;
		return;
	}
	s = *sp;
	if (!(s & VT_ST_LISTED)) {
		if (!vt_active_push(t, o->pfn)) {
			vt_stats.track_alloc_fail++;
			return;
		}
		s |= VT_ST_LISTED;
	}
	/* The first sighting of a round replaces the attributes; later ones (other mms) add. */
	if (!(s & VT_ST_CUR))
		s &= ~(VT_ST_WRITE | VT_ST_HUGE | VT_ST_TYPE);
	s |= VT_ST_CUR;
	if (o->write)
		s |= VT_ST_WRITE;
	if (o->huge)
		s |= VT_ST_HUGE;
	if (!(s & VT_ST_TYPE))
		s |= FIELD_PREP(VT_ST_TYPE, o->type);
	*sp = s;
}

void vt_track_end_round(struct vt_track *t, struct vtism_ch_header *h, u64 budget,
			struct vtism_ch_round_meta *meta, struct vt_publish_result *res)
{
	unsigned int win = clamp_t(unsigned int, READ_ONCE(vt_history_rounds), 1, VT_HIST_MAX);
	unsigned int thr = clamp_t(unsigned int, READ_ONCE(vt_hot_threshold), 1, win);
	u32 wmask = (1u << win) - 1;
	u64 nkey[VT_NKEYS] = { 0 };
	u64 off[VT_NKEYS];
	u64 *entries = vtism_ch_entries(h);
	u64 cand = 0, hot_frames = 0, pos, seq;
	unsigned long i, j = 0;
	int k;

	/* Age: shift this round's young bit in, drop frames with nothing left in the window. */
	for (i = 0; i < t->nr_active; i++) {
		unsigned long pfn = t->active[i];
		u32 *sp = vt_state(t, pfn, false);
		u32 s, hist, cnt, key;

		if (WARN_ON_ONCE(!sp))
			continue;
		s = *sp;
		hist = (((s & VT_ST_HIST) << 1) | !!(s & VT_ST_CUR)) & VT_ST_HIST;
		if (!(hist & wmask)) {
			*sp = 0;
			continue;
		}
		cnt = hweight32(hist & wmask);
		key = cnt >= thr ? cnt * 2 + (hist & 1) : 0;
		s &= ~(VT_ST_HIST | VT_ST_CUR | VT_ST_KEY);
		*sp = s | hist | FIELD_PREP(VT_ST_KEY, key);
		t->active[j++] = pfn;
		if (key) {
			nkey[key]++;
			cand++;
			hot_frames += (s & VT_ST_HUGE) ? VTISM_CH_HUGE_FRAMES : 1;
		}
	}
	t->nr_active = j;

	/* Counting sort straight into the channel: first slot of each key, hottest key first. */
	pos = 0;
	for (k = VT_NKEYS - 1; k > 0; k--) {
		off[k] = pos;
		pos += nkey[k];
	}
	res->candidates = cand;
	res->hot_frames = hot_frames;
	res->written = min(cand, budget);

	seq = vtism_ch_begin_round(h);
	for (i = 0; i < t->nr_active && res->written; i++) {
		unsigned long pfn = t->active[i];
		u32 *sp = vt_state(t, pfn, false);
		u32 s = sp ? *sp : 0;
		unsigned int key = FIELD_GET(VT_ST_KEY, s);

		if (!key || off[key] >= budget) {
			if (key)
				off[key]++;
			continue;
		}
		WRITE_ONCE(entries[off[key]++],
			   vtism_entry_make(pfn, key / 2, !!(s & VT_ST_WRITE),
					    FIELD_GET(VT_ST_TYPE, s), !!(s & VT_ST_HUGE), key & 1));
	}
	meta->count = res->written;
	meta->flags = cand > res->written ? VTISM_CH_FLAG_OVERFLOW : 0;
	meta->hot_frames = hot_frames;
	vtism_ch_end_round(h, seq, meta);
}
