/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * vtism hint channel v1.0: layout, constants and writer helpers.
 *
 * The normative spec is docs/channel.md; the Rust crate vtism-proto implements the same format and
 * both are checked against tests/vectors/channel/. Usable from kernel code (no libc) and from user
 * space (C11 with GCC/Clang atomics).
 *
 * The writer (guest) publishes a round with a seqlock:
 *     vtism_ch_begin_round(h);          seq odd, barrier
 *     h->entries...[i] = vtism_entry_make(...);
 *     vtism_ch_end_round(h, &meta);     fields, barrier, seq even
 * The reader (host) never trusts any of this; see docs/channel.md "Validation".
 */
#ifndef VTISM_CHANNEL_H
#define VTISM_CHANNEL_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/compiler.h>
#include <asm/barrier.h>
typedef u8 vtism_u8;
typedef u16 vtism_u16;
typedef u32 vtism_u32;
typedef u64 vtism_u64;
#define VTISM_STORE(p, v) WRITE_ONCE(*(p), (v))
#define VTISM_LOAD(p) READ_ONCE(*(p))
#define VTISM_WMB() smp_wmb()
#define VTISM_RMB() smp_rmb()
#define VTISM_STATIC_ASSERT(c, m) _Static_assert(c, m)
#else
#include <stdint.h>
typedef uint8_t vtism_u8;
typedef uint16_t vtism_u16;
typedef uint32_t vtism_u32;
typedef uint64_t vtism_u64;
#define VTISM_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define VTISM_LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define VTISM_WMB() __atomic_thread_fence(__ATOMIC_RELEASE)
#define VTISM_RMB() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#define VTISM_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/* "VTISMCH1" read as a little-endian u64. */
#define VTISM_CH_MAGIC 0x3148434D53495456ULL
#define VTISM_CH_VERSION_MAJOR 1
#define VTISM_CH_VERSION_MINOR 0
#define VTISM_CH_HEADER_SIZE 4096u
#define VTISM_CH_ENTRIES_OFFSET 4096u
#define VTISM_CH_ENTRY_SIZE 8u
#define VTISM_CH_PAGE_SHIFT 12u
#define VTISM_CH_HUGE_FRAMES 512u

/* tracker kinds */
#define VTISM_TRACKER_UNKNOWN 0u
#define VTISM_TRACKER_MODULE 1u
#define VTISM_TRACKER_DAMON 2u
#define VTISM_TRACKER_HARNESS 3u

/* publication flags */
#define VTISM_CH_FLAG_OVERFLOW (1u << 0)
#define VTISM_CH_FLAGS_KNOWN VTISM_CH_FLAG_OVERFLOW

/* page types */
#define VTISM_PAGE_UNKNOWN 0u
#define VTISM_PAGE_ANON 1u
#define VTISM_PAGE_FILE 2u
#define VTISM_PAGE_SHMEM 3u

/* entry bit fields */
#define VTISM_ENTRY_GFN_BITS 40
#define VTISM_ENTRY_GFN_MASK ((1ULL << VTISM_ENTRY_GFN_BITS) - 1)
#define VTISM_ENTRY_COUNT_SHIFT 40
#define VTISM_ENTRY_COUNT_MASK 0xffULL
#define VTISM_ENTRY_WRITE (1ULL << 48)
#define VTISM_ENTRY_TYPE_SHIFT 49
#define VTISM_ENTRY_TYPE_MASK 0x3ULL
#define VTISM_ENTRY_HUGE (1ULL << 51)
#define VTISM_ENTRY_YOUNG (1ULL << 52)
#define VTISM_ENTRY_RESERVED_MASK (~((1ULL << 53) - 1))

/* reject codes, as in docs/channel.md */
enum vtism_ch_status {
	VTISM_CH_OK = 0,
	VTISM_CH_REGION_TOO_SMALL = 1,
	VTISM_CH_BAD_MAGIC = 2,
	VTISM_CH_UNSUPPORTED_VERSION = 3,
	VTISM_CH_BAD_LAYOUT = 4,
	VTISM_CH_CAPACITY_BEYOND_REGION = 5,
	VTISM_CH_COUNT_BEYOND_CAPACITY = 6,
	VTISM_CH_WRITE_IN_PROGRESS = 7,
	VTISM_CH_TORN_ROUND = 8,
	VTISM_CH_RESERVED_HEADER_BITS = 9,
	VTISM_CH_RESERVED_ENTRY_BITS = 10,
	VTISM_CH_GFN_OUT_OF_RANGE = 11,
	VTISM_CH_MISALIGNED_HUGE = 12,
};

struct vtism_ch_header {
	/* identity: guest, once */
	vtism_u64 magic;		/* 0x000 */
	vtism_u16 version_major;	/* 0x008 */
	vtism_u16 version_minor;	/* 0x00a */
	vtism_u32 header_size;		/* 0x00c */
	vtism_u64 region_size;		/* 0x010 */
	vtism_u32 entries_offset;	/* 0x018 */
	vtism_u32 entry_size;		/* 0x01c */
	vtism_u64 capacity;		/* 0x020 */
	vtism_u32 tracker;		/* 0x028 */
	vtism_u32 page_shift;		/* 0x02c */
	vtism_u64 reserved0[2];		/* 0x030 */
	/* publication: guest, every round */
	vtism_u64 seq;			/* 0x040 */
	vtism_u64 round;		/* 0x048 */
	vtism_u64 count;		/* 0x050 */
	vtism_u32 flags;		/* 0x058 */
	vtism_u32 scan_interval_ms;	/* 0x05c */
	vtism_u32 scan_duration_us;	/* 0x060 */
	vtism_u32 reserved1;		/* 0x064 */
	vtism_u64 tracked_bytes;	/* 0x068 */
	vtism_u64 hot_frames;		/* 0x070 */
	vtism_u64 publish_time_ns;	/* 0x078 */
	vtism_u8 reserved2[0x800 - 0x080];
	/* feedback: host */
	vtism_u64 host_seq;		/* 0x800 */
	vtism_u64 ack_round;		/* 0x808 */
	vtism_u64 entry_budget;		/* 0x810 */
	vtism_u32 min_interval_ms;	/* 0x818 */
	vtism_u32 last_status;		/* 0x81c */
	vtism_u64 fast_quota_bytes;	/* 0x820 */
	vtism_u64 rejected_rounds;	/* 0x828 */
	vtism_u32 host_version;		/* 0x830 */
	vtism_u8 reserved3[0x1000 - 0x834];
};

VTISM_STATIC_ASSERT(sizeof(struct vtism_ch_header) == VTISM_CH_HEADER_SIZE, "header is one page");
VTISM_STATIC_ASSERT(__builtin_offsetof(struct vtism_ch_header, seq) == 0x40, "seq offset");
VTISM_STATIC_ASSERT(__builtin_offsetof(struct vtism_ch_header, publish_time_ns) == 0x78, "pub end");
VTISM_STATIC_ASSERT(__builtin_offsetof(struct vtism_ch_header, host_seq) == 0x800, "host_seq");
VTISM_STATIC_ASSERT(__builtin_offsetof(struct vtism_ch_header, host_version) == 0x830, "host_version");

/* Per-round values the guest publishes with vtism_ch_end_round(). */
struct vtism_ch_round_meta {
	vtism_u64 count;
	vtism_u32 flags;
	vtism_u32 scan_interval_ms;
	vtism_u32 scan_duration_us;
	vtism_u64 tracked_bytes;
	vtism_u64 hot_frames;
	vtism_u64 publish_time_ns;
};

/* Host feedback as the guest sees it after vtism_ch_read_feedback(). */
struct vtism_ch_feedback {
	vtism_u64 ack_round;
	vtism_u64 entry_budget;
	vtism_u32 min_interval_ms;
	vtism_u32 last_status;
	vtism_u64 fast_quota_bytes;
	vtism_u64 rejected_rounds;
	vtism_u32 host_version;
};

static inline vtism_u64 *vtism_ch_entries(struct vtism_ch_header *h)
{
	return (vtism_u64 *)((vtism_u8 *)h + VTISM_CH_ENTRIES_OFFSET);
}

static inline vtism_u64 vtism_ch_capacity_for(vtism_u64 region_size)
{
	if (region_size < VTISM_CH_ENTRIES_OFFSET)
		return 0;
	return (region_size - VTISM_CH_ENTRIES_OFFSET) / VTISM_CH_ENTRY_SIZE;
}

/*
 * Build an entry. Out-of-range inputs are masked, never spilled into other fields; a huge entry's
 * gfn must already be 512-aligned (the reader rejects it otherwise).
 */
static inline vtism_u64 vtism_entry_make(vtism_u64 gfn, unsigned int count, int write,
					  unsigned int type, int huge, int young)
{
	vtism_u64 e = gfn & VTISM_ENTRY_GFN_MASK;

	if (count > 255)
		count = 255;
	e |= ((vtism_u64)count & VTISM_ENTRY_COUNT_MASK) << VTISM_ENTRY_COUNT_SHIFT;
	if (write)
		e |= VTISM_ENTRY_WRITE;
	e |= ((vtism_u64)type & VTISM_ENTRY_TYPE_MASK) << VTISM_ENTRY_TYPE_SHIFT;
	if (huge)
		e |= VTISM_ENTRY_HUGE;
	if (young)
		e |= VTISM_ENTRY_YOUNG;
	return e;
}

static inline vtism_u64 vtism_entry_gfn(vtism_u64 e) { return e & VTISM_ENTRY_GFN_MASK; }
static inline unsigned int vtism_entry_count(vtism_u64 e)
{
	return (unsigned int)((e >> VTISM_ENTRY_COUNT_SHIFT) & VTISM_ENTRY_COUNT_MASK);
}
static inline int vtism_entry_write(vtism_u64 e) { return !!(e & VTISM_ENTRY_WRITE); }
static inline unsigned int vtism_entry_type(vtism_u64 e)
{
	return (unsigned int)((e >> VTISM_ENTRY_TYPE_SHIFT) & VTISM_ENTRY_TYPE_MASK);
}
static inline int vtism_entry_huge(vtism_u64 e) { return !!(e & VTISM_ENTRY_HUGE); }
static inline int vtism_entry_young(vtism_u64 e) { return !!(e & VTISM_ENTRY_YOUNG); }

/*
 * Initialise a region of region_size bytes (the BAR size). Clears the header page only; the entry
 * array is written round by round. Returns the capacity in entries (0 if the region is too small).
 * Host feedback fields are left as the host wrote them only if preserve_feedback is set (a guest
 * module reloading while the host runs keeps the host's last advice).
 */
static inline vtism_u64 vtism_ch_init(struct vtism_ch_header *h, vtism_u64 region_size,
				      vtism_u32 tracker, int preserve_feedback)
{
	vtism_u64 cap = vtism_ch_capacity_for(region_size);
	/* Zeroed bytewise: a character type may alias every field (no strict-aliasing issue). */
	vtism_u8 *bytes = (vtism_u8 *)h;
	unsigned int i;

	if (cap == 0)
		return 0;
	/* Odd seq first so a reader never takes a half-initialised header as a round. */
	VTISM_STORE(&h->seq, VTISM_LOAD(&h->seq) | 1);
	VTISM_WMB();
	for (i = 0; i < 0x800; i++) {
		if (i >= 0x40 && i < 0x48)
			continue; /* seq */
		VTISM_STORE(&bytes[i], 0);
	}
	if (!preserve_feedback) {
		for (i = 0x800; i < VTISM_CH_HEADER_SIZE; i++)
			VTISM_STORE(&bytes[i], 0);
	}
	VTISM_STORE(&h->version_major, VTISM_CH_VERSION_MAJOR);
	VTISM_STORE(&h->version_minor, VTISM_CH_VERSION_MINOR);
	VTISM_STORE(&h->header_size, VTISM_CH_HEADER_SIZE);
	VTISM_STORE(&h->region_size, region_size);
	VTISM_STORE(&h->entries_offset, VTISM_CH_ENTRIES_OFFSET);
	VTISM_STORE(&h->entry_size, VTISM_CH_ENTRY_SIZE);
	VTISM_STORE(&h->capacity, cap);
	VTISM_STORE(&h->tracker, tracker);
	VTISM_STORE(&h->page_shift, VTISM_CH_PAGE_SHIFT);
	VTISM_STORE(&h->magic, VTISM_CH_MAGIC);
	VTISM_WMB();
	/* Even again, round 0: a valid, empty channel. */
	VTISM_STORE(&h->seq, (VTISM_LOAD(&h->seq) | 1) + 1);
	return cap;
}

/* Start writing a round: seq becomes odd. Returns the seq value to pass to end_round. */
static inline vtism_u64 vtism_ch_begin_round(struct vtism_ch_header *h)
{
	vtism_u64 s = VTISM_LOAD(&h->seq);

	s |= 1; /* odd, whatever state a previous crash left */
	VTISM_STORE(&h->seq, s);
	VTISM_WMB();
	return s;
}

/* Publish the round: metadata, barrier, seq even. round becomes round + 1. */
static inline vtism_u64 vtism_ch_end_round(struct vtism_ch_header *h, vtism_u64 begin_seq,
					   const struct vtism_ch_round_meta *m)
{
	vtism_u64 round = VTISM_LOAD(&h->round) + 1;

	VTISM_STORE(&h->count, m->count);
	VTISM_STORE(&h->round, round);
	VTISM_STORE(&h->flags, m->flags & VTISM_CH_FLAGS_KNOWN);
	VTISM_STORE(&h->scan_interval_ms, m->scan_interval_ms);
	VTISM_STORE(&h->scan_duration_us, m->scan_duration_us);
	VTISM_STORE(&h->tracked_bytes, m->tracked_bytes);
	VTISM_STORE(&h->hot_frames, m->hot_frames);
	VTISM_STORE(&h->publish_time_ns, m->publish_time_ns);
	VTISM_WMB();
	VTISM_STORE(&h->seq, begin_seq + 1);
	return round;
}

/*
 * Read the host's feedback consistently. Returns 0 on success, -1 if the host was writing (try
 * again next round). The values are advice from the host, and the guest still clamps them.
 */
static inline int vtism_ch_read_feedback(struct vtism_ch_header *h, struct vtism_ch_feedback *f)
{
	vtism_u64 s1 = VTISM_LOAD(&h->host_seq), s2;

	if (s1 & 1)
		return -1;
	VTISM_RMB();
	f->ack_round = VTISM_LOAD(&h->ack_round);
	f->entry_budget = VTISM_LOAD(&h->entry_budget);
	f->min_interval_ms = VTISM_LOAD(&h->min_interval_ms);
	f->last_status = VTISM_LOAD(&h->last_status);
	f->fast_quota_bytes = VTISM_LOAD(&h->fast_quota_bytes);
	f->rejected_rounds = VTISM_LOAD(&h->rejected_rounds);
	f->host_version = VTISM_LOAD(&h->host_version);
	VTISM_RMB();
	s2 = VTISM_LOAD(&h->host_seq);
	return s1 == s2 ? 0 : -1;
}

#endif /* VTISM_CHANNEL_H */
