// SPDX-License-Identifier: GPL-2.0
/*
 * vtism_guest region table: per address space, the 2 MiB regions (one PMD entry each) the
 * coarse passes have found mapped, with their rates, and for regions mapped by a PTE table the
 * frame words of their last fine burst.
 *
 * An address space is held by mmgrab() (mm_count) from the moment it is found until it is
 * reaped, so its mm_struct is never freed and reused for another process while the table is
 * keyed by it; its pages are only ever walked under mmget_not_zero() (mm_users). Regions live
 * in chunks of 64 found through an xarray on the region index >> 6, so memory follows the
 * address space that is mapped, not its size: 56 bytes per region (plus the chunk's slack) and
 * 8 bytes per 4 KiB frame of a region with frame words (4 KiB per region, the size of the PTE
 * table itself).
 *
 * Only the tracker thread touches any of this: no locking.
 */
#include <linux/hash.h>
#include <linux/kernel.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/xarray.h>

#include "vtism_guest.h"

static_assert(sizeof(struct vt_region) <= 56);

void vt_table_init(struct vt_table *t)
{
	memset(t, 0, sizeof(*t));
	INIT_LIST_HEAD(&t->mms);
	hash_init(t->hash);
}

static void vt_chunk_free(struct vt_table *t, struct vt_chunk *c)
{
	unsigned int i;

	for (i = 0; i < VT_CHUNK_REGIONS; i++) {
		struct vt_region *r = &c->r[i];

		if (!(r->flags & VT_R_USED))
			continue;
		if (r->frames)
			t->frame_arrays--;
		if (r->flags & VT_R_THP)
			t->thp_regions--;
		kfree(r->frames);
		t->regions--;
	}
	kfree(c);
	t->chunks--;
}

/* Forget an address space: its regions, frame words, and our hold on its mm_struct. */
void vt_mm_release(struct vt_table *t, struct vt_mm *vm)
{
	unsigned long idx;
	struct vt_chunk *c;

	xa_for_each(&vm->chunks, idx, c)
		vt_chunk_free(t, c);
	xa_destroy(&vm->chunks);
	if (t->cache_vm == vm)
		t->cache_vm = NULL;
	list_del(&vm->node);
	hash_del(&vm->hnode);
	t->nr_mms--;
	mmdrop(vm->mm);
	kfree(vm);
}

void vt_table_destroy(struct vt_table *t)
{
	struct vt_mm *vm, *n;

	list_for_each_entry_safe(vm, n, &t->mms, node)
		vt_mm_release(t, vm);
}

/* The entry of an address space a live task uses (the caller holds mm_users). */
struct vt_mm *vt_mm_find_or_add(struct vt_table *t, struct mm_struct *mm, u32 gen)
{
	struct vt_mm *vm;

	hash_for_each_possible(t->hash, vm, hnode, (unsigned long)mm) {
		if (vm->mm == mm) {
			vm->seen = gen;
			return vm;
		}
	}
	vm = kzalloc(sizeof(*vm), GFP_KERNEL);
	if (!vm) {
		t->alloc_fail++;
		return NULL;
	}
	mmgrab(mm);
	vm->mm = mm;
	vm->seen = gen;
	vm->spread = 9 * VT_RC_PER_OCTAVE / 2;	/* until measured: the geometric middle */
	xa_init(&vm->chunks);
	list_add_tail(&vm->node, &t->mms);
	hash_add(t->hash, &vm->hnode, (unsigned long)mm);
	t->nr_mms++;
	return vm;
}

struct vt_mm *vt_mm_next(struct vt_table *t, struct vt_mm *vm)
{
	if (!vm)
		return list_first_entry_or_null(&t->mms, struct vt_mm, node);
	if (list_is_last(&vm->node, &t->mms))
		return NULL;
	return list_next_entry(vm, node);
}

static struct vt_chunk *vt_chunk_get(struct vt_table *t, struct vt_mm *vm, unsigned long ci,
				     bool create)
{
	struct vt_chunk *c;

	if (t->cache_vm == vm && t->cache_idx == ci && t->cache_chunk)
		return t->cache_chunk;
	c = xa_load(&vm->chunks, ci);
	if (!c) {
		if (!create)
			return NULL;
		c = kzalloc(sizeof(*c), GFP_KERNEL);
		if (!c) {
			t->alloc_fail++;
			return NULL;
		}
		if (xa_is_err(xa_store(&vm->chunks, ci, c, GFP_KERNEL))) {
			kfree(c);
			t->alloc_fail++;
			return NULL;
		}
		t->chunks++;
	}
	t->cache_vm = vm;
	t->cache_idx = ci;
	t->cache_chunk = c;
	return c;
}

struct vt_region *vt_region_get(struct vt_table *t, struct vt_mm *vm, unsigned long idx,
				bool create)
{
	struct vt_chunk *c = vt_chunk_get(t, vm, idx >> VT_CHUNK_SHIFT, create);
	struct vt_region *r;

	if (!c)
		return NULL;
	r = &c->r[idx & (VT_CHUNK_REGIONS - 1)];
	if (!(r->flags & VT_R_USED)) {
		if (!create)
			return NULL;
		memset(r, 0, sizeof(*r));
		r->flags = VT_R_USED;
		c->nr++;
		vm->nr_regions++;
		t->regions++;
	}
	return r;
}

void vt_region_free(struct vt_table *t, struct vt_mm *vm, unsigned long idx)
{
	unsigned long ci = idx >> VT_CHUNK_SHIFT;
	struct vt_chunk *c = vt_chunk_get(t, vm, ci, false);
	struct vt_region *r;

	if (!c)
		return;
	r = &c->r[idx & (VT_CHUNK_REGIONS - 1)];
	if (!(r->flags & VT_R_USED))
		return;
	if (r->frames)
		t->frame_arrays--;
	if (r->flags & VT_R_THP)
		t->thp_regions--;
	kfree(r->frames);
	memset(r, 0, sizeof(*r));
	vm->nr_regions--;
	t->regions--;
	if (--c->nr)
		return;
	xa_erase(&vm->chunks, ci);
	if (t->cache_chunk == c)
		t->cache_vm = NULL;
	kfree(c);
	t->chunks--;
}

/* The region's frame words, allocated on first use (NULL if memory is short). */
u64 *vt_region_frames(struct vt_table *t, struct vt_region *r)
{
	if (r->frames)
		return r->frames;
	r->frames = kcalloc(VT_REGION_FRAMES, sizeof(u64), GFP_KERNEL);
	if (r->frames)
		t->frame_arrays++;
	else
		t->alloc_fail++;
	return r->frames;
}

bool vt_region_next(struct vt_table *t, struct vt_mm *vm, unsigned long *idx)
{
	unsigned long ci = *idx >> VT_CHUNK_SHIFT;
	unsigned int i = *idx & (VT_CHUNK_REGIONS - 1);
	struct vt_chunk *c;

	for (;;) {
		c = xa_find(&vm->chunks, &ci, ULONG_MAX, XA_PRESENT);
		if (!c)
			return false;
		for (; i < VT_CHUNK_REGIONS; i++) {
			if ((c->r[i].flags & VT_R_USED)) {
				*idx = (ci << VT_CHUNK_SHIFT) | i;
				return true;
			}
		}
		if (ci == ULONG_MAX)
			return false;
		ci++;
		i = 0;
	}
}

/*
 * Drop what is gone: address spaces whose processes are gone (never while a coarse window may
 * still refer to them, nor while a burst does), and regions no coarse pass has found mapped for
 * three coarse periods (unmapped; never a region of the burst in flight).
 */
void vt_table_reap(struct vt_table *t, u32 gen, u16 cstamp, bool coarse_open)
{
	struct vt_mm *vm, *n;

	list_for_each_entry_safe(vm, n, &t->mms, node) {
		unsigned long idx = 0;

		if (!vm->busy && !coarse_open && (vm->gone || (s32)(gen - vm->seen) > 2)) {
			vt_mm_release(t, vm);
			continue;
		}
		while (vt_region_next(t, vm, &idx)) {
			struct vt_region *r = vt_region_get(t, vm, idx, false);

			if (!(r->flags & VT_R_BURST) && !(r->flags & VT_R_OPEN) &&
			    (s16)(cstamp - r->cstamp) > 3)
				vt_region_free(t, vm, idx);
			idx++;
		}
	}
}

u64 vt_table_bytes(const struct vt_table *t)
{
	return t->nr_mms * sizeof(struct vt_mm) + t->chunks * sizeof(struct vt_chunk) +
	       t->frame_arrays * VT_REGION_FRAMES * sizeof(u64);
}
