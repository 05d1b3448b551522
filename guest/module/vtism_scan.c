// SPDX-License-Identifier: GPL-2.0
/*
 * vtism_guest page-table scanner.
 *
 * Walks every user address space, test-and-clears the Accessed bit of each present PTE and
 * PMD-mapped THP, and reads (never clears) the Dirty bit. A PUD or PMD entry that points to a
 * lower table has its own Accessed bit, set by the MMU whenever a walk goes through it: if it
 * is clear, nothing below was touched since we last cleared it, and the subtree is skipped.
 *
 * None of walk_page_range(), ptep_test_and_clear_young() or pte_offset_map_lock() (6.5+) is
 * exported, so this file has its own walk, atomic bit clears (what x86's
 * ptep_test_and_clear_young() does) and PTE-table locking (what __pte_offset_map_lock() does).
 * See docs/guest.md for the locking rules.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/page_idle.h>
#include <linux/huge_mm.h>
#include <linux/kthread.h>
#include <linux/rcupdate.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/smp.h>
#include <uapi/linux/magic.h>
#include <asm/tlbflush.h>

#include "vtism_guest.h"

/* Look at the mmap lock, the scheduler and kthread_stop() after this much work (PTE slots). */
#define VT_WORK_BATCH 4096

static_assert(HPAGE_PMD_NR == VTISM_CH_HUGE_FRAMES);
static_assert(PTRS_PER_PTE == 512);

struct vt_scan_buf {
	struct task_struct **tasks;
	unsigned int tasks_cap;

	/* current address space */
	struct mm_struct *mm;
	struct vt_track *track;
	struct vt_round_stats *rs;
	bool prune;
	/*
	 * An upper entry can cover several VMAs: its Accessed bit is tested once per round, the
	 * first time the walk reaches it, and the decision is reused for the next VMAs below it.
	 */
	unsigned long pud_base, pmd_base;
	bool pud_walk, pmd_walk;
	unsigned long resume;
	unsigned int work;

	/* young mappings of one PTE table, applied to the history after the PTE lock is dropped */
	unsigned int nobs;
	struct vt_obs obs[PTRS_PER_PTE];
};

struct vt_scan_buf *vt_scan_alloc(void)
{
	return kvzalloc(sizeof(struct vt_scan_buf), GFP_KERNEL);
}

void vt_scan_free(struct vt_scan_buf *b)
{
	if (b)
		kvfree(b->tasks);
	kvfree(b);
}

/* Only entries the MMU can use: present (not PROT_NONE/NUMA-hinting, not swap or migration). */
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
 * Record a mapping whose Accessed bit we just cleared. Called with the page-table lock held,
 * so the folio stays mapped and its mapping stable.
 */
static void vt_obs_add(struct vt_scan_buf *b, unsigned long pfn, bool dirty, bool huge)
{
	struct folio *folio;
	struct vt_obs *o;

	if (!pfn_valid(pfn) || b->nobs >= ARRAY_SIZE(b->obs))
		return;
	folio = page_folio(pfn_to_page(pfn));
#ifdef CONFIG_PAGE_IDLE_FLAG
	/*
	 * Reclaim (folio_referenced()) and idle page tracking read the bit we took: leave them
	 * PG_young/!PG_idle, as DAMON does, so the guest still sees the page as referenced.
	 * Kernels without the flag (Debian's 6.1) lose this; see docs/guest.md.
	 */
	if (!folio_test_young(folio))
		folio_set_young(folio);
	if (folio_test_idle(folio))
		folio_clear_idle(folio);
#endif
	o = &b->obs[b->nobs++];
	o->pfn = pfn;
	o->write = dirty;
	o->huge = huge;
	o->type = vt_folio_type(folio);
}

/* Outside the PTE lock: the history may allocate memory. */
static void vt_obs_flush(struct vt_scan_buf *b)
{
	unsigned int i;

	for (i = 0; i < b->nobs; i++)
		vt_track_observe(b->track, &b->obs[i]);
	b->nobs = 0;
}

static void vt_walk_thp(struct vt_scan_buf *b, pmd_t *pmd)
{
	struct vt_round_stats *rs = b->rs;
	spinlock_t *ptl = pmd_lock(b->mm, pmd);
	pmd_t v = READ_ONCE(*pmd);

	if (vt_pmd_is_thp(v)) {
		rs->thp_present++;
		rs->tracked_bytes += HPAGE_PMD_SIZE;
		if ((pmd_flags(v) & _PAGE_ACCESSED) &&
		    test_and_clear_bit(_PAGE_BIT_ACCESSED, (unsigned long *)&pmd->pmd)) {
			rs->thp_young++;
			/* Dirty is read from the value, never cleared: the THP stays whole. */
			vt_obs_add(b, pmd_pfn(v), pmd_dirty(v), true);
		}
	}
	spin_unlock(ptl);
	vt_obs_flush(b);
}

static void vt_walk_ptes(struct vt_scan_buf *b, pmd_t *pmd, unsigned long addr, unsigned long end)
{
	struct vt_round_stats *rs = b->rs;
	spinlock_t *ptl;
	pte_t *pte;
	pmd_t pmdval;
	int tries = 0;

	/*
	 * Since 6.5 khugepaged can free a PTE table without the mmap lock (RCU-deferred), so map
	 * it under RCU and recheck the PMD once its lock is held, like __pte_offset_map_lock().
	 * On 6.1 tables only go away under the mmap write lock and this is merely redundant.
	 */
	rcu_read_lock();
again:
	pmdval = READ_ONCE(*pmd);
	if (!vt_pmd_is_table(pmdval))
		goto out;
	pte = pte_offset_kernel(&pmdval, addr);
	ptl = pte_lockptr(b->mm, &pmdval);
	spin_lock(ptl);
	if (!vt_pmd_same_table(pmdval, READ_ONCE(*pmd))) {
		spin_unlock(ptl);
		rs->pte_retries++;
		if (++tries < 3)
			goto again;
		goto out;
	}
	for (; addr < end; pte++, addr += PAGE_SIZE) {
		pte_t v = ptep_get(pte);

		rs->ptes_visited++;
		if (!(pte_flags(v) & _PAGE_PRESENT))
			continue;
		rs->ptes_present++;
		rs->tracked_bytes += PAGE_SIZE;
		/* zero page, PFN maps and device memory: not frames the host should place */
		if (!(pte_flags(v) & _PAGE_ACCESSED) || pte_special(v) || pte_devmap(v))
			continue;
		if (!test_and_clear_bit(_PAGE_BIT_ACCESSED, (unsigned long *)&pte->pte))
			continue;
		rs->ptes_young++;
		vt_obs_add(b, pte_pfn(v), pte_dirty(v), false);
	}
	spin_unlock(ptl);
out:
	rcu_read_unlock();
	vt_obs_flush(b);
}

/*
 * Test and clear the Accessed bit of a non-leaf PMD, once per round. The entry is only
 * populated or cleared under the PMD lock, which we take so the bit is never cleared in an
 * entry that just changed meaning.
 */
static bool vt_pmd_pass(struct vt_scan_buf *b, pmd_t *pmd, unsigned long addr)
{
	unsigned long base = addr & PMD_MASK;
	spinlock_t *ptl;
	bool walk;

	if (base == b->pmd_base)
		return b->pmd_walk;
	b->pmd_base = base;
	b->rs->pmd_tables++;
	if (!b->prune) {
		b->pmd_walk = true;
		return true;
	}
	ptl = pmd_lock(b->mm, pmd);
	walk = vt_pmd_is_table(READ_ONCE(*pmd)) &&
	       test_and_clear_bit(_PAGE_BIT_ACCESSED, (unsigned long *)&pmd->pmd);
	spin_unlock(ptl);
	if (!walk)
		b->rs->pmd_skipped++;
	b->pmd_walk = walk;
	return walk;
}

static bool vt_pud_pass(struct vt_scan_buf *b, pud_t *pud, unsigned long addr)
{
	unsigned long base = addr & PUD_MASK;
	spinlock_t *ptl;
	bool walk;

	if (base == b->pud_base)
		return b->pud_walk;
	b->pud_base = base;
	b->rs->pud_tables++;
	if (!b->prune) {
		b->pud_walk = true;
		return true;
	}
	ptl = pud_lock(b->mm, pud);
	walk = vt_pud_is_table(READ_ONCE(*pud)) &&
	       test_and_clear_bit(_PAGE_BIT_ACCESSED, (unsigned long *)&pud->pud);
	spin_unlock(ptl);
	if (!walk)
		b->rs->pud_skipped++;
	b->pud_walk = walk;
	return walk;
}

/* Should the walk stop here to let an mmap writer in, or because we are being unloaded? */
static bool vt_yield_point(struct vt_scan_buf *b)
{
	if (b->work < VT_WORK_BATCH)
		return false;
	b->work = 0;
	cond_resched();
	return mmap_lock_is_contended(b->mm) || kthread_should_stop();
}

static bool vt_walk_pmds(struct vt_scan_buf *b, pud_t *pud, unsigned long addr, unsigned long end)
{
	pmd_t *pmd = pmd_offset(pud, addr);
	unsigned long next;

	do {
		pmd_t v;

		next = pmd_addr_end(addr, end);
		if (vt_yield_point(b)) {
			b->resume = addr;
			return true;
		}
		b->work += 8;
		v = READ_ONCE(*pmd);
		if (vt_pmd_is_thp(v)) {
			vt_walk_thp(b, pmd);
			continue;
		}
		if (!vt_pmd_is_table(v) || !vt_pmd_pass(b, pmd, addr))
			continue;
		vt_walk_ptes(b, pmd, addr, next);
		b->work += (next - addr) >> PAGE_SHIFT;
	} while (pmd++, addr = next, addr != end);
	return false;
}

static bool vt_walk_puds(struct vt_scan_buf *b, p4d_t *p4d, unsigned long addr, unsigned long end)
{
	pud_t *pud = pud_offset(p4d, addr);
	unsigned long next;

	do {
		next = pud_addr_end(addr, end);
		/* 1 GiB leaves are hugetlb or DAX: their VMAs are skipped, never seen here */
		if (!vt_pud_is_table(READ_ONCE(*pud)) || !vt_pud_pass(b, pud, addr))
			continue;
		if (vt_walk_pmds(b, pud, addr, next))
			return true;
	} while (pud++, addr = next, addr != end);
	return false;
}

/*
 * PGD and P4D Accessed bits are neither cleared nor trusted: with PTI user space runs on a
 * copy of the PGD page, and with 5-level paging pgd_bad() would call a clear A bit bad.
 */
static bool vt_walk_range(struct vt_scan_buf *b, unsigned long addr, unsigned long end)
{
	pgd_t *pgd = pgd_offset(b->mm, addr);
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
			pnext = p4d_addr_end(a, next);
			if (p4d_none(*p4d) || p4d_bad(*p4d))
				continue;
			if (vt_walk_puds(b, p4d, a, pnext))
				return true;
		} while (p4d++, a = pnext, a != next);
	} while (pgd++, addr = next, addr != end);
	return false;
}

/*
 * Scan one address space. The caller holds a user reference (get_task_mm()), so the page
 * tables stay allocated even if the process exits meanwhile: exit_mmap() then runs in our
 * mmput(). Returns false if told to stop.
 */
static bool vt_scan_mm(struct vt_scan_buf *b)
{
	struct mm_struct *mm = b->mm;
	unsigned long addr = 0;

	b->pud_base = 1;	/* never an aligned address */
	b->pmd_base = 1;
	mmap_read_lock(mm);
	for (;;) {
		struct vm_area_struct *vma = find_vma(mm, addr);
		unsigned long start;

		if (!vma)
			break;
		start = max(addr, vma->vm_start);
		addr = vma->vm_end;
		/* hugetlb: own locking and shared PMDs; PFN/IO maps: no frames to place */
		if (vma->vm_flags & (VM_HUGETLB | VM_PFNMAP | VM_IO))
			continue;
		if (!vt_walk_range(b, start, vma->vm_end))
			continue;
		/* Let the writer in; the VMA may be gone when we come back. */
		addr = b->resume;
		mmap_read_unlock(mm);
		b->rs->lock_drops++;
		if (kthread_should_stop())
			return false;
		cond_resched();
		mmap_read_lock(mm);
	}
	mmap_read_unlock(mm);
	return true;
}

/*
 * Take a reference on one thread with an mm per user process, under RCU, so the scan can
 * sleep afterwards. The leader may have exited while other threads still run.
 */
static unsigned int vt_collect_tasks(struct vt_scan_buf *b)
{
	struct task_struct *p, *t;
	unsigned int n = 0;

	rcu_read_lock();
	for_each_process(p)
		n++;
	rcu_read_unlock();
	n += 64;
	if (n > b->tasks_cap) {
		kvfree(b->tasks);
		b->tasks = kvmalloc_array(n, sizeof(*b->tasks), GFP_KERNEL);
		b->tasks_cap = b->tasks ? n : 0;
	}

	n = 0;
	rcu_read_lock();
	for_each_process(p) {
		if (n == b->tasks_cap)
			break;	/* forked since we counted: next round */
		if (p->flags & PF_KTHREAD)
			continue;
		for_each_thread(p, t) {
			if (READ_ONCE(t->mm)) {
				get_task_struct(t);
				b->tasks[n++] = t;
				break;
			}
		}
	}
	rcu_read_unlock();
	return n;
}

bool vt_scan_all(struct vt_scan_buf *b, struct vt_track *track, struct vt_round_stats *rs)
{
	unsigned int i, n = vt_collect_tasks(b);
	bool go = true;

	b->track = track;
	b->rs = rs;
	b->work = 0;
	/* Xen PV has no hardware non-leaf Accessed bits: pruning would skip everything. */
	b->prune = READ_ONCE(vt_prune) && arch_has_hw_nonleaf_pmd_young();

	for (i = 0; i < n; i++) {
		struct task_struct *t = b->tasks[i];
		struct mm_struct *mm = go ? get_task_mm(t) : NULL;

		put_task_struct(t);
		if (!mm)
			continue;
		b->mm = mm;
		rs->mms++;
		if (!vt_scan_mm(b))
			go = false;	/* keep looping to drop the task references */
		/* Racy, only a statistic: is ours the last user, i.e. did the process exit? */
		if (atomic_read(&mm->mm_users) == 1)
			rs->mm_released++;
		mmput(mm);
		b->mm = NULL;
	}
	return go;
}

/*
 * flush_tlb_mm_range() is not exported on 6.1 (nor 6.12). After clearing Accessed bits every
 * CPU must drop its cached translations, including the paging-structure caches: otherwise a
 * cached PMD lets an access set only the PTE's A bit, and the next round would prune the
 * subtree. __flush_tlb_all() (exported) flushes everything on one CPU, all PCIDs included;
 * run it on every CPU, once per round rather than once per mm.
 */
static void vt_flush_local(void *unused)
{
	__flush_tlb_all();
}

void vt_flush_tlbs(void)
{
	on_each_cpu(vt_flush_local, NULL, 1);
}
