// SPDX-License-Identifier: GPL-2.0
/*
 * vtism_guest page-table passes.
 *
 * A coarse pass test-and-clears the Accessed bit of every PMD entry (one per 2 MiB region) of
 * the address spaces of one chunk; a fine pass test-and-clears the Accessed bits of the PTEs of
 * the regions of one burst and reads (never clears) their Dirty bits. The MMU sets the Accessed
 * bit of every paging-structure entry a walk goes through, so a PUD entry whose bit is clear
 * had nothing below it used since it was cleared (coarse passes skip its subtree), and a PMD
 * entry whose bit is clear had none of its PTEs used (fine passes skip its table). Coarse and
 * fine passes share the PMD bits: whichever pass finds one set tells the other through the
 * region's VT_R_SEEN_* flags.
 *
 * None of walk_page_range(), ptep_test_and_clear_young() or pte_offset_map_lock() (6.5+) is
 * exported, so this file has its own walk, atomic bit clears (what x86's
 * ptep_test_and_clear_young() does) and PTE-table locking (what __pte_offset_map_lock() does).
 * Walks stay inside VMAs found under the mmap read lock: a munmap that downgraded its lock frees
 * page tables only of VMAs it already detached. See docs/guest.md for the rules.
 */
#include <linux/bitfield.h>
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/huge_mm.h>
#include <linux/kthread.h>
#include <linux/mmap_lock.h>
#include <linux/page_idle.h>
#include <linux/rcupdate.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/smp.h>
#include <uapi/linux/magic.h>
#include <asm/tlbflush.h>

#include "vtism_guest.h"

static_assert(HPAGE_PMD_NR == VTISM_CH_HUGE_FRAMES);
static_assert(PTRS_PER_PTE == 512);

/* Look at the clock, the mmap lock and kthread_stop() after this many PMD entries. */
#define VT_CHECK_EVERY 32

enum vt_walk_result { VT_W_DONE, VT_W_YIELD, VT_W_DROP, VT_W_FULL, VT_W_STOP };

/* One pass over one address space. */
struct vt_walk {
	struct vt_tracker *tr;
	struct vt_mm *vm;
	struct mm_struct *mm;
	struct vt_coarse *c;
	unsigned int checks;
	unsigned long resume;			/* where to go on after a yield or lock drop */
};

static inline bool vt_pud_is_table(pud_t v)
{
	return (pud_flags(v) & (_PAGE_PRESENT | _PAGE_PSE)) == _PAGE_PRESENT && !pud_bad(v);
}

static inline bool vt_pmd_is_table(pmd_t v)
{
	return (pmd_flags(v) & (_PAGE_PRESENT | _PAGE_PSE)) == _PAGE_PRESENT && !pmd_bad(v);
}

static inline bool vt_pmd_is_thp(pmd_t v)
{
	return (pmd_flags(v) & (_PAGE_PRESENT | _PAGE_PSE | _PAGE_DEVMAP)) ==
	       (_PAGE_PRESENT | _PAGE_PSE);
}

/* Same table behind both values? The MMU may set A (and D) in between: ignore those. */
static inline bool vt_pmd_same_table(pmd_t a, pmd_t b)
{
	return ((pmd_val(a) ^ pmd_val(b)) & ~(pmdval_t)(_PAGE_ACCESSED | _PAGE_DIRTY)) == 0;
}

/*
 * Test and clear the Accessed bit of a present PMD entry (a PTE table or a huge page) without
 * its lock: the compare-and-exchange only succeeds on the very value checked present, so a swap
 * or migration entry's bits are never touched, the Dirty bit the MMU may set meanwhile is never
 * lost, and an entry the kernel rewrites under its lock simply wins.
 */
static bool vt_pmd_young_clear(pmd_t *pmdp)
{
	pmdval_t old = READ_ONCE(pmdp->pmd);

	for (;;) {
		pmd_t v = __pmd(old);

		if (!(vt_pmd_is_table(v) || vt_pmd_is_thp(v)) || !(pmd_flags(v) & _PAGE_ACCESSED))
			return false;
		if (try_cmpxchg(&pmdp->pmd, &old, old & ~(pmdval_t)_PAGE_ACCESSED))
			return true;
	}
}

static bool vt_pud_young_clear(pud_t *pudp)
{
	pudval_t old = READ_ONCE(pudp->pud);

	for (;;) {
		pud_t v = __pud(old);

		if (!vt_pud_is_table(v) || !(pud_flags(v) & _PAGE_ACCESSED))
			return false;
		if (try_cmpxchg(&pudp->pud, &old, old & ~(pudval_t)_PAGE_ACCESSED))
			return true;
	}
}

static u8 vt_folio_type(struct folio *folio)
{
	struct address_space *mapping;
	struct inode *host;

	if (folio_test_anon(folio))
		return VTISM_PAGE_ANON;
	mapping = READ_ONCE(folio->mapping);
	if (!mapping || ((unsigned long)mapping & PAGE_MAPPING_FLAGS))
		return VTISM_PAGE_UNKNOWN;
	/* shmem_mapping() is not exported on 6.1; every shmem mount has tmpfs' magic. */
	host = mapping->host;
	if (host && host->i_sb && host->i_sb->s_magic == TMPFS_MAGIC)
		return VTISM_PAGE_SHMEM;
	return VTISM_PAGE_FILE;
}

/*
 * Reclaim (folio_referenced()) and idle page tracking read the bit we took: leave the folio
 * PG_young/!PG_idle, as DAMON does, so the guest still sees the page as referenced. Kernels
 * without the flag (Debian's 6.1) lose this; see docs/guest.md. Called under the page-table
 * lock, which keeps the folio mapped.
 */
static void vt_keep_referenced(unsigned long pfn)
{
#ifdef CONFIG_PAGE_IDLE_FLAG
	struct folio *folio;

	if (!pfn_valid(pfn))
		return;
	folio = page_folio(pfn_to_page(pfn));
	if (!folio_test_young(folio))
		folio_set_young(folio);
	if (folio_test_idle(folio))
		folio_clear_idle(folio);
#endif
}

static u64 vt_type_of(unsigned long pfn)
{
	if (!pfn_valid(pfn))
		return FIELD_PREP(VT_F_TYPE, VTISM_PAGE_UNKNOWN);
	return FIELD_PREP(VT_F_TYPE, vt_folio_type(page_folio(pfn_to_page(pfn))));
}

/* Should the pass stop here: its time is up, a writer waits, or we are being unloaded? */
static enum vt_walk_result vt_check(struct vt_walk *w)
{
	if (++w->checks < VT_CHECK_EVERY)
		return VT_W_DONE;
	w->checks = 0;
	if (kthread_should_stop())
		return VT_W_STOP;
	if (mmap_lock_is_contended(w->mm))
		return VT_W_DROP;
	if (ktime_get_ns() >= w->tr->deadline_ns)
		return VT_W_YIELD;
	return VT_W_DONE;
}

/* ---- PTE tables ---- */

/*
 * The PTE of addr in the table pmd points to, with the table's lock held (*ptl), or NULL when
 * pmd maps no table any more. Since 6.5 khugepaged can free a PTE table without the mmap lock
 * (RCU-deferred), so the caller holds rcu_read_lock() and the PMD is checked again once its
 * lock is held, as __pte_offset_map_lock() does. On 6.1 tables only go away under the mmap
 * write lock and this is merely redundant.
 */
static pte_t *vt_pte_lock(struct vt_walk *w, pmd_t *pmd, unsigned long addr, spinlock_t **ptl)
{
	int tries = 0;

	for (;;) {
		pmd_t pmdval = READ_ONCE(*pmd);

		if (!vt_pmd_is_table(pmdval))
			return NULL;
		*ptl = pte_lockptr(w->mm, &pmdval);
		spin_lock(*ptl);
		if (vt_pmd_same_table(pmdval, READ_ONCE(*pmd)))
			return pte_offset_kernel(&pmdval, addr);
		spin_unlock(*ptl);
		w->tr->c.pte_retries++;
		if (++tries == 3)
			return NULL;
	}
}

/* zero page, PFN maps and device memory: not frames the host should place */
static inline bool vt_pte_is_frame(pte_t v)
{
	return (pte_flags(v) & _PAGE_PRESENT) && !pte_special(v) && !pte_devmap(v);
}

/* ---- coarse passes ---- */

/* A THP region's unit word, read once under the PMD lock (its type needs the folio). */
static void vt_thp_unit(struct vt_walk *w, struct vt_region *r, pmd_t *pmd)
{
	spinlock_t *ptl = pmd_lock(w->mm, pmd);
	pmd_t v = READ_ONCE(*pmd);

	if (vt_pmd_is_thp(v)) {
		unsigned long pfn = pmd_pfn(v);
		u64 u = r->unit;

		if (!(u & VT_F_PRESENT) || FIELD_GET(VT_F_PFN, u) != pfn)
			u = VT_F_PRESENT | FIELD_PREP(VT_F_PFN, pfn) | vt_type_of(pfn);
		if (pmd_dirty(v))
			u |= VT_F_WRITE;	/* read, never cleared: the THP stays whole and dirty */
		r->unit = u;
	}
	spin_unlock(ptl);
}

/* A region now mapped the other way (collapsed into a THP, or split): start it afresh. */
static void vt_region_kind(struct vt_table *t, struct vt_region *r, bool thp)
{
	if (!!(r->flags & VT_R_THP) == thp)
		return;
	if (r->frames) {
		kfree(r->frames);
		r->frames = NULL;
		t->frame_arrays--;
	}
	r->unit = 0;
	r->flags &= ~VT_R_MEASURED;
	if (thp) {
		r->flags |= VT_R_THP;
		t->thp_regions++;
	} else {
		r->flags &= ~VT_R_THP;
		t->thp_regions--;
	}
}

/*
 * The frames of a region seen young before its first fine burst, read once with rate 0 (the
 * PTEs are read, never written): publication shares the region's coarse rate among them
 * (vt_share_code) until the sweep reaches the region and measures their own. One table read,
 * paid from the coarse pass's time like every entry it visits.
 */
static void vt_coarse_frames(struct vt_walk *w, struct vt_region *r, pmd_t *pmd,
			     unsigned long base)
{
	u64 *frames = vt_region_frames(&w->tr->table, r);
	unsigned int i, present = 0;
	spinlock_t *ptl;
	pte_t *pte;

	if (!frames)
		return;
	rcu_read_lock();
	pte = vt_pte_lock(w, pmd, base, &ptl);
	if (pte) {
		for (i = 0; i < VT_REGION_FRAMES; i++, pte++) {
			pte_t v = ptep_get(pte);
			unsigned long pfn = pte_pfn(v);

			frames[i] = 0;
			if (!vt_pte_is_frame(v))
				continue;
			frames[i] = VT_F_PRESENT | FIELD_PREP(VT_F_PFN, pfn) | vt_type_of(pfn) |
				    (pte_dirty(v) ? VT_F_WRITE : 0);
			present++;
		}
		spin_unlock(ptl);
	}
	rcu_read_unlock();
	r->present = present;
	w->tr->c.frames_read++;
}

/* One region of a coarse pass; y = its PMD entry was used. */
static void vt_coarse_region(struct vt_walk *w, struct vt_region *r, bool y)
{
	struct vt_coarse *c = w->c;

	r->cstamp = w->tr->cperiod;
	w->tr->c.regions_visited++;
	if (!c->read) {
		vt_coarse_observe(w->tr, r, y, false);
		r->flags |= VT_R_OPEN;
		c->regions++;
	} else if (r->flags & VT_R_OPEN) {
		vt_coarse_observe(w->tr, r, y, true);
		r->flags &= ~VT_R_OPEN;
		c->regions++;
		c->young += y;
	}
}

/* Regions of [addr, end) under a PUD entry nobody used: none of them was used either. */
static void vt_coarse_idle(struct vt_walk *w, unsigned long addr, unsigned long end)
{
	struct vt_table *t = &w->tr->table;
	unsigned long idx = vt_region_idx(addr), last = vt_region_idx(end - 1);

	while (vt_region_next(t, w->vm, &idx) && idx <= last) {
		struct vt_region *r = vt_region_get(t, w->vm, idx, false);

		if ((idx << PMD_SHIFT) != w->c->pmd_base) {	/* not seen through an earlier VMA */
			w->c->pmd_base = idx << PMD_SHIFT;
			r->flags &= ~VT_R_SEEN_COARSE;
			vt_coarse_region(w, r, false);
		}
		idx++;
	}
}

static enum vt_walk_result vt_coarse_pmds(struct vt_walk *w, pud_t *pud, unsigned long addr,
					  unsigned long end)
{
	struct vt_table *t = &w->tr->table;
	pmd_t *pmd = pmd_offset(pud, addr);
	unsigned long next;

	do {
		unsigned long base = addr & PMD_MASK;
		enum vt_walk_result res;
		struct vt_region *r;
		pmd_t v;
		bool thp, a, y;

		next = pmd_addr_end(addr, end);
		res = vt_check(w);
		if (res != VT_W_DONE) {
			w->resume = addr;
			return res;
		}
		if (base == w->c->pmd_base)	/* the part of an earlier VMA in this PMD saw it */
			continue;
		w->c->pmd_base = base;
		v = READ_ONCE(*pmd);
		thp = vt_pmd_is_thp(v);
		if (!thp && !vt_pmd_is_table(v))
			continue;
		r = vt_region_get(t, w->vm, vt_region_idx(addr), true);
		if (!r)
			continue;
		vt_region_kind(t, r, thp);
		a = vt_pmd_young_clear(pmd);
		if (a)
			r->flags |= VT_R_SEEN_FINE;
		y = a || (r->flags & VT_R_SEEN_COARSE);
		r->flags &= ~VT_R_SEEN_COARSE;
		if (thp && !(r->unit & VT_F_PRESENT))
			vt_thp_unit(w, r, pmd);
		vt_coarse_region(w, r, y);
		/* used and not measured yet: its frames, so that it is published from now on */
		if (y && w->c->read && !thp && !(r->flags & VT_R_MEASURED) && !r->frames)
			vt_coarse_frames(w, r, pmd, base);
	} while (pmd++, addr = next, addr != end);
	return VT_W_DONE;
}

static enum vt_walk_result vt_coarse_puds(struct vt_walk *w, p4d_t *p4d, unsigned long addr,
					  unsigned long end)
{
	struct vt_coarse *c = w->c;
	pud_t *pud = pud_offset(p4d, addr);
	unsigned long next;

	do {
		unsigned long base = addr & PUD_MASK;
		enum vt_walk_result res;

		next = pud_addr_end(addr, end);
		if (base != c->pud_base) {
			/* a chunk ends at a PUD boundary, so its two passes see the same PUDs */
			if (!c->read && c->regions >= max(READ_ONCE(vt_coarse_chunk), 1u)) {
				w->resume = addr;
				return VT_W_FULL;
			}
			c->pud_base = base;
			c->pud_walk = vt_pud_is_table(READ_ONCE(*pud));
			/* 1 GiB leaves are hugetlb or DAX: their VMAs are skipped, never seen here */
			if (c->pud_walk && w->tr->prune && !vt_pud_young_clear(pud)) {
				c->pud_walk = false;
				w->tr->c.pud_skipped++;
			}
		}
		if (!c->pud_walk) {
			if (vt_pud_is_table(READ_ONCE(*pud)))
				vt_coarse_idle(w, addr, next);
			continue;
		}
		res = vt_coarse_pmds(w, pud, addr, next);
		if (res != VT_W_DONE)
			return res;
	} while (pud++, addr = next, addr != end);
	return VT_W_DONE;
}

/*
 * PGD and P4D Accessed bits are neither cleared nor trusted: with PTI user space runs on a
 * copy of the PGD page, and with 5-level paging pgd_bad() would call a clear A bit bad.
 */
static enum vt_walk_result vt_coarse_range(struct vt_walk *w, unsigned long addr,
					   unsigned long end)
{
	pgd_t *pgd = pgd_offset(w->mm, addr);
	unsigned long next, pnext;

	do {
		p4d_t *p4d;
		unsigned long a;

		next = pgd_addr_end(addr, end);
		if (pgd_none(*pgd) || pgd_bad(*pgd))
			continue;
		p4d = p4d_offset(pgd, addr);
		a = addr;
		do {
			enum vt_walk_result res;

			pnext = p4d_addr_end(a, next);
			if (p4d_none(*p4d) || p4d_bad(*p4d))
				continue;
			res = vt_coarse_puds(w, p4d, a, pnext);
			if (res != VT_W_DONE)
				return res;
		} while (p4d++, a = pnext, a != next);
	} while (pgd++, addr = next, addr != end);
	return VT_W_DONE;
}

static bool vt_vma_skipped(struct vm_area_struct *vma)
{
	/* hugetlb: own locking and shared PMDs; PFN/IO maps: no frames to place */
	return vma->vm_flags & (VM_HUGETLB | VM_PFNMAP | VM_IO);
}

/* Pin an address space for a pass: false if its last user is gone. */
static bool vt_mm_enter(struct vt_walk *w, struct vt_mm *vm)
{
	w->vm = vm;
	w->mm = vm->mm;
	if (vm->gone || !mmget_not_zero(vm->mm)) {
		vm->gone = true;
		return false;
	}
	w->tr->c.mms++;
	mmap_read_lock(w->mm);
	return true;
}

static void vt_mm_leave(struct vt_walk *w)
{
	mmap_read_unlock(w->mm);
	/* Racy, only a statistic: is ours the last user, i.e. did the process exit? */
	if (atomic_read(&w->mm->mm_users) == 1)
		w->tr->c.mm_released++;
	mmput(w->mm);
}

/* The coarse pass over one address space from c->pos.addr up to end. */
static enum vt_walk_result vt_coarse_mm(struct vt_walk *w, unsigned long end)
{
	struct vt_coarse *c = w->c;
	unsigned long addr = c->pos.addr;
	enum vt_walk_result res = VT_W_DONE;

	if (!c->pos.addr) {	/* a new address space: no upper entry decided yet */
		c->pud_base = 1;	/* never an aligned address */
		c->pmd_base = 1;
	}
	if (!vt_mm_enter(w, c->pos.vm))
		return VT_W_DONE;
	for (;;) {
		struct vm_area_struct *vma = find_vma(w->mm, addr);
		unsigned long start, stop;

		if (!vma || vma->vm_start >= end)
			break;
		start = max(addr, vma->vm_start);
		stop = min(vma->vm_end, end);
		if (vt_vma_skipped(vma)) {
			addr = vma->vm_end;
			continue;
		}
		res = vt_coarse_range(w, start, stop);
		if (res == VT_W_DONE) {
			addr = stop;
			if (addr >= end)
				break;
			continue;
		}
		addr = w->resume;
		if (res != VT_W_DROP)
			break;
		/* let the writer in; the VMA may be gone when we come back */
		mmap_read_unlock(w->mm);
		w->tr->c.lock_drops++;
		cond_resched();
		if (kthread_should_stop()) {
			res = VT_W_STOP;
			mmput(w->mm);
			c->pos.addr = addr;
			return res;
		}
		mmap_read_lock(w->mm);
		res = VT_W_DONE;
	}
	vt_mm_leave(w);
	c->pos.addr = addr;
	return res;
}

/*
 * One coarse pass (clearing or reading) over the chunk: from c->pos on, address space after
 * address space. The clearing pass ends the chunk at a PUD boundary once it has coarse_chunk
 * regions (c->end); the reading pass goes as far. Resumable after VT_PASS_YIELD.
 */
enum vt_pass_result vt_coarse_pass(struct vt_tracker *tr, struct vt_coarse *c)
{
	struct vt_walk w = { .tr = tr, .c = c };

	while (c->pos.vm) {
		bool last = c->read && c->end.vm == c->pos.vm;
		enum vt_walk_result res = vt_coarse_mm(&w, last ? c->end.addr : ULONG_MAX);

		switch (res) {
		case VT_W_STOP:
			return VT_PASS_STOP;
		case VT_W_YIELD:
			tr->c.pass_yields++;
			return VT_PASS_YIELD;
		case VT_W_FULL:
			c->end = c->pos;
			return VT_PASS_DONE;
		default:
			break;
		}
		if (last)
			break;
		c->pos.vm = vt_mm_next(&tr->table, c->pos.vm);
		c->pos.addr = 0;
	}
	if (!c->read)
		c->end.vm = NULL;	/* the chunk runs to the end of the table */
	return VT_PASS_DONE;
}

/* ---- fine passes ---- */

/* The PTEs of [addr, end) of one region's table. Returns PTEs visited. */
static unsigned int vt_fine_ptes(struct vt_walk *w, struct vt_burst *b, struct vt_burst_region *br,
				 struct vt_region *r, pmd_t *pmd, unsigned long addr,
				 unsigned long end, u64 *obs)
{
	struct vt_counters *cn = &w->tr->c;
	bool last = b->pass == b->m;
	unsigned int i = (addr >> PAGE_SHIFT) & (PTRS_PER_PTE - 1), n = 0;
	const u64 *frames = r->frames;
	spinlock_t *ptl;
	pte_t *pte;

	rcu_read_lock();
	pte = vt_pte_lock(w, pmd, addr, &ptl);
	if (!pte)
		goto out;
	for (; addr < end; pte++, addr += PAGE_SIZE, i++) {
		pte_t v = ptep_get(pte);
		unsigned long pfn;
		bool young;

		n++;
		if (!vt_pte_is_frame(v))
			continue;
		if (b->pass == 0 && frames && (frames[i] & VT_F_PRESENT) &&
		    FIELD_GET(VT_F_SKIP, frames[i]))
			br->young[i] = VT_BY_DND;	/* known hot: left alone this burst */
		if (br->young[i] & VT_BY_DND) {
			cn->ptes_dnd++;
		} else {
			young = (pte_flags(v) & _PAGE_ACCESSED) &&
				test_and_clear_bit(_PAGE_BIT_ACCESSED, (unsigned long *)&pte->pte);
			if (young) {
				cn->ptes_cleared++;
				vt_keep_referenced(pte_pfn(v));
				br->young[i] |= b->pass ? BIT(b->pass - 1) : VT_BY_LONG;
			}
		}
		if (!last)
			continue;
		/* Dirty is read from the value, never written */
		pfn = pte_pfn(v);
		obs[i] = VT_F_PRESENT | FIELD_PREP(VT_F_PFN, pfn) | (pte_dirty(v) ? VT_F_WRITE : 0);
		if (frames && (frames[i] & VT_F_PRESENT) && FIELD_GET(VT_F_PFN, frames[i]) == pfn)
			obs[i] |= VT_OBS_SAME;
		else
			obs[i] |= vt_type_of(pfn);
	}
	spin_unlock(ptl);
out:
	rcu_read_unlock();
	return n;
}

/* A THP region in a fine pass: its PMD Accessed bit is its one window bit. */
static void vt_fine_thp(struct vt_walk *w, struct vt_burst *b, struct vt_burst_region *br,
			struct vt_region *r, pmd_t *pmd)
{
	bool y = vt_pmd_young_clear(pmd);

	if (y) {
		r->flags |= VT_R_SEEN_COARSE;
		w->tr->c.thp_young++;
	}
	y = y || (r->flags & VT_R_SEEN_FINE);
	r->flags &= ~VT_R_SEEN_FINE;
	if (y)
		br->young[0] |= b->pass ? BIT(b->pass - 1) : VT_BY_LONG;
	if (b->pass == b->m)
		vt_thp_unit(w, r, pmd);
}

static pmd_t *vt_pmd_of(struct mm_struct *mm, unsigned long addr)
{
	pgd_t *pgd = pgd_offset(mm, addr);
	p4d_t *p4d;
	pud_t *pud;

	if (pgd_none(*pgd) || pgd_bad(*pgd))
		return NULL;
	p4d = p4d_offset(pgd, addr);
	if (p4d_none(*p4d) || p4d_bad(*p4d))
		return NULL;
	pud = pud_offset(p4d, addr);
	if (!vt_pud_is_table(READ_ONCE(*pud)))
		return NULL;
	return pmd_offset(pud, addr);
}

/*
 * One region of a fine pass, VMA by VMA inside it. A pass reads the PTE table only if the PMD
 * entry was used since the previous fine pass (the last pass of a burst always reads it, to
 * see which frames are mapped now).
 */
static void vt_fine_region(struct vt_walk *w, struct vt_burst *b, struct vt_burst_region *br,
			   struct vt_region *r, u64 *obs)
{
	unsigned long addr = br->idx << PMD_SHIFT, end = addr + PMD_SIZE;
	bool last = b->pass == b->m, decided = false, read = true;

	if (last)
		memset(obs, 0, VT_REGION_FRAMES * sizeof(*obs));
	while (addr < end) {
		struct vm_area_struct *vma = find_vma(w->mm, addr);
		unsigned long s, e;
		pmd_t *pmd;
		pmd_t v;

		if (!vma || vma->vm_start >= end)
			break;
		s = max(addr, vma->vm_start);
		e = min(end, vma->vm_end);
		addr = e;
		if (vt_vma_skipped(vma))
			continue;
		pmd = vt_pmd_of(w->mm, s);
		if (!pmd)
			continue;
		v = READ_ONCE(*pmd);
		if (vt_pmd_is_thp(v)) {
			if (r->flags & VT_R_THP)
				vt_fine_thp(w, b, br, r, pmd);
			break;
		}
		if (!vt_pmd_is_table(v) || (r->flags & VT_R_THP))
			continue;
		if (!decided) {
			bool a = vt_pmd_young_clear(pmd);

			if (a)
				r->flags |= VT_R_SEEN_COARSE;
			/*
			 * The clearing pass must also clear what do-not-disturb left set, and
			 * the last pass sees which frames are mapped now.
			 */
			read = a || (r->flags & VT_R_SEEN_FINE) || !w->tr->prune || last ||
			       (b->pass == 0 && (r->flags & VT_R_UNCLEARED));
			r->flags &= ~VT_R_SEEN_FINE;
			decided = true;
			if (!read)
				w->tr->c.pmd_skipped++;
		}
		if (read)
			w->tr->c.ptes_visited += vt_fine_ptes(w, b, br, r, pmd, s, e, obs);
	}
}

/*
 * One fine pass over the burst's regions (pass 0 clears, 1..m read), address space after
 * address space; the last pass lands each region's windows. Resumable after VT_PASS_YIELD.
 */
enum vt_pass_result vt_fine_pass(struct vt_tracker *tr, struct vt_burst *b)
{
	struct vt_walk w = { .tr = tr };
	struct vt_table *t = &tr->table;
	struct vt_mm *in = NULL;
	enum vt_pass_result res = VT_PASS_DONE;

	while (b->next < b->n) {
		struct vt_burst_region *br = &b->r[b->next];
		struct vt_region *r;

		if (br->vm != in) {
			if (in)
				vt_mm_leave(&w);
			in = vt_mm_enter(&w, br->vm) ? br->vm : NULL;
		}
		r = in ? vt_region_get(t, in, br->idx, false) : NULL;
		if (r && b->pass == 0 && !(r->flags & VT_R_THP) && !vt_region_frames(t, r))
			r = NULL;
		if (r)
			vt_fine_region(&w, b, br, r, tr->obs);
		if (r && b->pass == b->m)
			vt_burst_land_region(tr, b, br, r, tr->obs);
		b->next++;
		if (!in || b->next == b->n)
			continue;
		if (kthread_should_stop()) {
			res = VT_PASS_STOP;
			break;
		}
		if (mmap_lock_is_contended(w.mm)) {
			mmap_read_unlock(w.mm);
			tr->c.lock_drops++;
			cond_resched();
			mmap_read_lock(w.mm);
		}
		if (ktime_get_ns() >= tr->deadline_ns) {
			tr->c.pass_yields++;
			res = VT_PASS_YIELD;
			break;
		}
	}
	if (in)
		vt_mm_leave(&w);
	if (res == VT_PASS_DONE) {
		b->next = 0;
		b->pass++;
	}
	return res;
}

/* ---- address spaces ---- */

/*
 * Find the address spaces of user processes: under RCU take a task reference on one thread
 * with an mm per process (the leader may have exited while other threads run), then, outside
 * RCU, get_task_mm() (which fails once the process has exited) and enter the mm in the table.
 */
void vt_discover(struct vt_tracker *tr)
{
	struct task_struct *p, *t;
	unsigned int n = 0, i;

	rcu_read_lock();
	for_each_process(p)
		n++;
	rcu_read_unlock();
	n += 64;
	if (n > tr->tasks_cap) {
		kvfree(tr->tasks);
		tr->tasks = kvmalloc_array(n, sizeof(*tr->tasks), GFP_KERNEL);
		tr->tasks_cap = tr->tasks ? n : 0;
	}
	n = 0;
	rcu_read_lock();
	for_each_process(p) {
		if (n == tr->tasks_cap)
			break;	/* forked since we counted: next time */
		if (p->flags & PF_KTHREAD)
			continue;
		for_each_thread(p, t) {
			if (READ_ONCE(t->mm)) {
				get_task_struct(t);
				tr->tasks[n++] = t;
				break;
			}
		}
	}
	rcu_read_unlock();
	tr->gen++;
	for (i = 0; i < n; i++) {
		struct mm_struct *mm = get_task_mm(tr->tasks[i]);

		put_task_struct(tr->tasks[i]);
		if (!mm)
			continue;
		vt_mm_find_or_add(&tr->table, mm, tr->gen);
		mmput(mm);
	}
}

/*
 * flush_tlb_mm_range() is not exported on 6.1 (nor 6.12). After clearing Accessed bits every
 * CPU must drop its cached translations, including the paging-structure caches: otherwise an
 * access through a cached translation sets no Accessed bit, and a cached PMD lets an access set
 * only the PTE's bit, after which the next fine pass would skip the table. __flush_tlb_all()
 * (exported) flushes everything on one CPU, all PCIDs included; run it on every CPU once per
 * pass rather than once per mm.
 */
static void vt_flush_local(void *unused)
{
	__flush_tlb_all();
}

void vt_flush_tlbs(void)
{
	on_each_cpu(vt_flush_local, NULL, 1);
}
