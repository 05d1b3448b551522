// SPDX-License-Identifier: GPL-2.0
/*
 * Benchmark of vtism_guest's fixed-point rate arithmetic (guest/module/vtism_rate.c), compiled
 * for user space: the CPU one window costs per active region (coarse) or frame (fine), which,
 * with the page-table costs measured by `cargo bench -p vtism-sim --bench tracker_costs`,
 * gives the module's cost per window on hardware (docs/guest.md, "Cost"). Not a test.
 *
 *   gcc -O2 -o bench_rate guest/tests/bench_rate.c -lm && ./bench_rate
 *
 * Prints ns per call, the median of 11 runs of 4 Mi calls each, for a region's coarse window
 * (young: the rate arithmetic; not young: a move in the code domain), a frame's fine burst (with
 * young windows: the long window of 3 s and 4 of 30 ms; without: the region's sum of code
 * moves), the level of a code (publication), change detection's step for a short window and
 * stall detection's young chance of a region.
 * Rates are drawn uniformly over codes 1408-3071 (2^-10 to 2^16 Hz). Then publication's passes
 * over a 16 GiB guest's frame words, ns per frame slot (pub_run).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../module/vtism_rate_user.h"
#include "../module/vtism_rate.c"

#define CALLS (1u << 22)
#define RUNS 11

/*
 * The thread's CPU time, not the wall clock: on a shared machine the wall clock also counts the
 * slices other processes ran in (the first figures, taken at load 6-9, were 4x too high).
 */
static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static volatile unsigned int sink;
static u16 sums[2];	/* change detection's, carried from call to call */

/* codes and young bits drawn once, so the loop measures the arithmetic, not the generator */
static unsigned int codes[4096];
static unsigned char young[4096];

static double run(int what)
{
	double t0 = now_ns();
	unsigned int i, j, acc = 0;
	u64 t = 4800000;

	for (i = 0; i < CALLS; i++) {
		unsigned int c = codes[i & 4095], y = young[i & 4095];
		u64 hz;

		switch (what) {
		case 0:	/* a coarse window of 2 ms, young (the full path) */
			acc += vt_code_of_hz(vt_rate_add(vt_hz_of_code(c), t, 2000, true, 48), i);
			break;
		case 1:	/* a coarse window of 2 ms, not young (the code-domain path) */
			acc += vt_code_moved(c, vt_idle_codes(t, 2000, 48), i);
			break;
		case 2:	/* a fine burst with young windows: the long one (3 s), then 4 of 30 ms */
			hz = vt_rate_add(vt_hz_of_code(c), t, 3000000, y & 0x80, 8);
			for (j = 0; j < 4; j++)
				hz = vt_rate_add(hz, t, 30000, y & (1u << j), 8);
			acc += vt_code_of_hz(hz, i);
			break;
		case 3:	/* a fine burst that saw nothing (its 5 windows' codes summed once per region) */
			acc += vt_code_moved(c, -12000, i);
			break;
		case 4:
			acc += vt_level_of_code((s64)c + (y & 63) - 32);
			break;
		case 5:	/* change detection, a short coarse window, young */
			acc += vt_change_step(c, -9 * 65536, true, i, &sums[0], &sums[1]);
			break;
		case 6:	/* change detection, a short coarse window, not young */
			acc += vt_change_step(c, -9 * 65536, false, i, &sums[0], &sums[1]);
			break;
		default:	/* stall detection's young chance of a region, a short coarse window */
			acc += vt_young_chance(c, -9 * 65536);
		}
	}
	sink = acc;
	return (now_ns() - t0) / CALLS;
}

/*
 * Publication (vtism_track.c, vt_pub_frames) over the frame words of a 16 GiB guest: 8192
 * regions of 512 words, 90% present, rates over the whole scale, the region's follow, rate and
 * share as publication finds them. Passes, ns per frame slot:
 *  - count: read the word, its published code and level, the histogram (pass 1 before the
 *    level scratch, and pass 2's work before it too but for the entry);
 *  - count, keeping the level: the same, the level stored in the scratch (pass 1 now);
 *  - write computing levels: the word read, its level, the entry stored in its level's slot
 *    (pass 2 before the scratch);
 *  - write from the scratch: the level read back, and for those at or above `low` the word
 *    read and the entry stored (pass 2 now), with every level written and with none (every
 *    level past the budget: the check alone).
 */
#define PUB_REGIONS 8192
#define PUB_FRAMES (PUB_REGIONS * 512u)

static u64 *pub_words, *pub_entries;
static u8 *pub_levels;
static u64 pub_hist[256], pub_off[256];

static void pub_init(void)
{
	unsigned int i;

	pub_words = malloc(PUB_FRAMES * sizeof(u64));
	pub_entries = malloc(PUB_FRAMES * sizeof(u64));
	pub_levels = malloc(PUB_FRAMES);
	for (i = 0; i < PUB_FRAMES; i++)
		pub_words[i] = (rand() % 10 ? 1ull << 62 : 0) | ((u64)(1408 + rand() % 1664) << 40) | i;
}

static double pub_run(int what, unsigned int low)
{
	double t0 = now_ns();
	unsigned int r, i;
	u64 acc = 0;

	for (r = 0; r < PUB_REGIONS; r++) {
		const u64 *w = pub_words + r * 512u;
		u8 *lv = pub_levels + r * 512u;
		unsigned int crate = 2600 + (r & 255), wc_fast = 2500;
		s64 follow = (s64)(r & 63) - 32, share = vt_share_code(crate, 460);

		for (i = 0; i < 512; i++) {
			unsigned int level;
			s64 code;
			u64 f;

			if (what == 2) {
				level = lv[i];
				if (level >= low && level)
					pub_entries[pub_off[level]++ & (PUB_FRAMES - 1)] =
						(w[i] & ((1ull << 40) - 1)) << 12 | level;
				continue;
			}
			f = w[i];
			if (!(f & (1ull << 62))) {
				if (what == 1)
					lv[i] = 0;
				continue;
			}
			code = vt_published_code((f >> 40) & 4095, follow, crate, wc_fast, share);
			level = code > 0 ? vt_level_of_code(code) : 0;
			if (what == 3) {	/* the write pass computing levels (before the scratch) */
				if (level)
					pub_entries[pub_off[level]++ & (PUB_FRAMES - 1)] =
						(f & ((1ull << 40) - 1)) << 12 | level;
				continue;
			}
			if (what == 1)
				lv[i] = level;
			pub_hist[level]++;
		}
	}
	for (i = 0; i < 256; i++)
		acc += pub_hist[i];
	sink = acc;
	return (now_ns() - t0) / PUB_FRAMES;
}

int main(void)
{
	static const char *name[] = { "coarse window, young", "coarse window, not young",
				      "fine burst, young windows (1 + 4)", "fine burst, nothing seen",
				      "level of a code", "change detection, young window",
				      "change detection, idle window",
				      "young chance (stall detection)" };
	static const char *pub_name[] = { "publication: count",
					   "publication: count, keeping the level",
					   "publication: write from the scratch, all",
					   "publication: write computing levels",
					   "publication: write from the scratch, none" };
	static const int pub_what[] = { 0, 1, 2, 3, 2 };
	static const unsigned int pub_low[] = { 1, 1, 1, 1, 256 };
	double t[RUNS];
	int w, r;

	srand(1);
	for (r = 0; r < 4096; r++) {
		codes[r] = 1408 + rand() % 1664;
		young[r] = rand();
	}
	for (w = 0; w < (int)(sizeof(name) / sizeof(name[0])); w++) {
		for (r = 0; r < RUNS; r++)
			t[r] = run(w);
		qsort(t, RUNS, sizeof(t[0]), cmp);
		printf("%-42s %6.1f ns per call (median of %d x %u; min %.1f, max %.1f)\n", name[w],
		       t[RUNS / 2], RUNS, CALLS, t[0], t[RUNS - 1]);
	}
	pub_init();
	pub_run(1, 1);	/* levels in the scratch for the write passes */
	for (w = 0; w < 5; w++) {
		for (r = 0; r < RUNS; r++)
			t[r] = pub_run(pub_what[w], pub_low[w]);
		qsort(t, RUNS, sizeof(t[0]), cmp);
		printf("%-42s %6.2f ns per frame slot (median of %d x %u; min %.2f, max %.2f)\n",
		       pub_name[w], t[RUNS / 2], RUNS, PUB_FRAMES, t[0], t[RUNS - 1]);
	}
	return 0;
}
