/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * vtism hint channel v1.1: layout, constants, writer helpers and the rate-level scale.
 *
 * The normative spec is docs/channel.md; the Rust crate vtism-proto implements the same format and
 * both are checked against tests/vectors/channel/. Usable from kernel code (no libc) and from user
 * space (C11 with GCC/Clang atomics).
 *
 * The writer (guest) publishes a round with a seqlock:
 *     vtism_ch_begin_round(h);          seq odd, barrier
 *     h->entries...[i] = vtism_entry_make(...);
 *     vtism_ch_end_round(h, seq, &meta); fields, barrier, seq even
 * An entry's count is a rate level (v1.1): vtism_ch_level_of_rate() and vtism_ch_level_of_share()
 * compute it with integer arithmetic only.
 * The reader (host) never trusts any of this; see docs/channel.md "Validation".
 */
#ifndef VTISM_CHANNEL_H
#define VTISM_CHANNEL_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/compiler.h>
#include <linux/bitops.h>
#include <linux/math64.h>
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
#define VTISM_FLS64(x) fls64(x)
#define VTISM_DIV_U64_U32(a, b) div_u64((a), (b))
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
/* 1-based index of the highest set bit, 0 for 0 (as the kernel's fls64) */
#define VTISM_FLS64(x) ((x) ? 64 - __builtin_clzll(x) : 0)
#define VTISM_DIV_U64_U32(a, b) ((a) / (b))
#endif

/* "VTISMCH1" read as a little-endian u64. */
#define VTISM_CH_MAGIC 0x3148434D53495456ULL
#define VTISM_CH_VERSION_MAJOR 1
#define VTISM_CH_VERSION_MINOR 1
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
	vtism_u32 window_us;		/* 0x064 v1.1: fine window W_f */
	vtism_u64 tracked_bytes;	/* 0x068 */
	vtism_u64 hot_frames;		/* 0x070 */
	vtism_u64 publish_time_ns;	/* 0x078 */
	vtism_u32 windows;		/* 0x080 v1.1: windows since the last round */
	vtism_u32 tracker_cpu_us;	/* 0x084 v1.1: tracker CPU since the last round */
	vtism_u32 coarse_window_us;	/* 0x088 v1.1: coarse window W_c */
	vtism_u32 reserved1;		/* 0x08c */
	vtism_u64 tracked_frames;	/* 0x090 v1.1: frames the tracker holds state for */
	vtism_u8 reserved2[0x800 - 0x098];
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
VTISM_STATIC_ASSERT(__builtin_offsetof(struct vtism_ch_header, window_us) == 0x64, "window_us");
VTISM_STATIC_ASSERT(__builtin_offsetof(struct vtism_ch_header, windows) == 0x80, "windows");
VTISM_STATIC_ASSERT(__builtin_offsetof(struct vtism_ch_header, coarse_window_us) == 0x88, "coarse");
VTISM_STATIC_ASSERT(__builtin_offsetof(struct vtism_ch_header, tracked_frames) == 0x90, "tracked");
VTISM_STATIC_ASSERT(__builtin_offsetof(struct vtism_ch_header, reserved2) == 0x98, "reserved tail");
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
	/* v1.1, informational: the tracker's windows and cost */
	vtism_u32 window_us;		/* fine window W_f at publication */
	vtism_u32 coarse_window_us;	/* coarse window W_c at publication */
	vtism_u32 windows;		/* windows (coarse and fine) completed since the last round */
	vtism_u32 tracker_cpu_us;	/* tracker CPU since the last round, publication included */
	vtism_u64 tracked_frames;	/* frames the tracker holds state for */
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
	VTISM_STORE(&h->window_us, m->window_us);
	VTISM_STORE(&h->windows, m->windows);
	VTISM_STORE(&h->tracker_cpu_us, m->tracker_cpu_us);
	VTISM_STORE(&h->coarse_window_us, m->coarse_window_us);
	VTISM_STORE(&h->tracked_frames, m->tracked_frames);
	VTISM_WMB();
	VTISM_STORE(&h->seq, begin_seq + 1);
	return round;
}

/*
 * Rate levels (v1.1 count): level = round(16 * log2(rate in Hz) + 96), clamped to 0..255; 96 is
 * one access per second, 16 levels per doubling, 0 is one access per 64 s or less (docs/channel.md
 * "Rate levels"; Rust: vtism_proto::count::level_of_rate). Integer arithmetic only.
 *
 * vtism_ch_level_of_rate(rate, shift): the level of rate / 2^shift accesses per second (a count
 * of accesses per 2^shift seconds, or a Q<shift> fixed-point rate), for any rate and shift <= 127.
 * Exact: the nearest level of the exact value (no rate lies on a boundary between two levels,
 * which are irrational). 0 for a rate of 0.
 */
static inline unsigned int vtism_ch_level_of_rate(vtism_u64 rate, unsigned int shift)
{
	/* ceil(2^(63 + (2j - 1) / 32)), j = 1..16: a mantissa in Q63 at or above step j rounds to
	 * at least j sixteenths of an octave */
	static const vtism_u64 steps[16] = {
		0x82cd8698ac2ba1d8ULL, 0x88980e8092da8528ULL, 0x8ea4398b45cd53c1ULL,
		0x94f4efa8fef70962ULL, 0x9b8d39b9d54e5539ULL, 0xa27043030c496819ULL,
		0xa9a15ab4ea7c0ef9ULL, 0xb123f581d2ac2590ULL, 0xb8fbaf4762fb9eeaULL,
		0xc12c4cca66709457ULL, 0xc9b9bd866e2f27a3ULL, 0xd2a81d91f12ae45bULL,
		0xdbfbb797daf23756ULL, 0xe5b906e77c8348a9ULL, 0xefe4b99bdcdaf5ccULL,
		0xfa83b2db722a033bULL,
	};
	int msb, level;
	unsigned int j;
	vtism_u64 m;

	if (rate == 0 || shift > 127)
		return 0;
	msb = VTISM_FLS64(rate) - 1;
	m = rate << (63 - msb);
	level = 16 * (msb - (int)shift) + 96;
	for (j = 0; j < 16 && m >= steps[j]; j++)
		level++;
	if (level < 0)
		return 0;
	return level > 255 ? 255 : (unsigned int)level;
}

/* Rates as vtism_ch_rate_of_share() returns them: accesses per second in Q32. */
#define VTISM_CH_RATE_SHIFT 32
/* The largest young share a rate is taken from, 1 - 1/256, in Q32. */
#define VTISM_CH_SHARE_MAX_Q32 ((1ULL << 32) - (1ULL << 24))

/* (a * b) >> 32, exactly, without a 128-bit intermediate; the result must fit in 64 bits. */
static inline vtism_u64 vtism_ch_mul_shr32(vtism_u64 a, vtism_u32 b)
{
	return (a >> 32) * b + (((a & 0xffffffffULL) * b) >> 32);
}

/* log2(x) in Q32 for 1 <= x < 2^32: the integer part, then one fraction bit per squaring. */
static inline vtism_u64 vtism_ch_log2_q32(vtism_u32 x)
{
	int msb = VTISM_FLS64(x) - 1, i;
	vtism_u64 y = (vtism_u64)x << (31 - msb); /* the mantissa in [1, 2), Q31 */
	vtism_u64 r = (vtism_u64)msb << 32;

	for (i = 31; i >= 0; i--) {
		y = (y * y) >> 31;
		if (y >= (1ULL << 32)) {
			y >>= 1;
			r |= 1ULL << i;
		}
	}
	return r;
}

/*
 * The access rate of a frame found young in a share of observation windows of window_us each,
 * for Poisson accesses: -ln(1 - s) / W (docs/channel.md "Rate levels"; Rust:
 * vtism_proto::count::rate_of_young_share). s = share / 2^share_bits (share_bits <= 32), capped at
 * 1 - 1/256. Returns accesses per second in Q32 (VTISM_CH_RATE_SHIFT); 0 when share or window_us
 * is 0. Relative error below 1e-6 (a power series for s < 2^-10, a Q32 logarithm above), so a
 * level from it differs from the exact one only within 1e-4 of a level of a boundary.
 */
static inline vtism_u64 vtism_ch_rate_of_share(vtism_u64 share, unsigned int share_bits,
					       vtism_u32 window_us)
{
	/* ln 2 in Q32 */
	const vtism_u32 ln2_q32 = 2977044472u;
	vtism_u64 s, nl_q32;

	if (share == 0 || window_us == 0 || share_bits > 32)
		return 0;
	s = share >= (1ULL << share_bits) ? (1ULL << 32) : share << (32 - share_bits);
	if (s > VTISM_CH_SHARE_MAX_Q32)
		s = VTISM_CH_SHARE_MAX_Q32;
	if (s < (1ULL << 22)) {
		/* -ln(1 - s) = s (1 + s/2 + s^2/3 + ...): the terms past s^2/3 are below 1e-9 of it */
		vtism_u64 e = (s >> 1) + ((s * s) >> 32) / 3; /* s/2 + s^2/3 in Q32, < 2^21 */
		vtism_u64 a = s * 1000000u;		     /* < 2^42 */

		return VTISM_DIV_U64_U32(a + vtism_ch_mul_shr32(a, (vtism_u32)e), window_us);
	}
	/* -ln(1 - s) = ln 2 * (32 - log2((1 - s) 2^32)), 1 - s >= 2^-8 */
	nl_q32 = vtism_ch_mul_shr32((32ULL << 32) - vtism_ch_log2_q32((vtism_u32)((1ULL << 32) - s)),
				    ln2_q32);
	return VTISM_DIV_U64_U32(nl_q32 * 1000000u, window_us); /* nl_q32 < 2^35: no overflow */
}

/* The rate level of a young share of windows of window_us: see vtism_ch_rate_of_share(). */
static inline unsigned int vtism_ch_level_of_share(vtism_u64 share, unsigned int share_bits,
						   vtism_u32 window_us)
{
	return vtism_ch_level_of_rate(vtism_ch_rate_of_share(share, share_bits, window_us),
				      VTISM_CH_RATE_SHIFT);
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
