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
 * moves), and the level of a code (publication). Rates are drawn uniformly over codes
 * 1408-3071 (2^-10 to 2^16 Hz).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef uint64_t u64;
typedef int64_t s64;
typedef uint32_t u32;
static inline int fls64(u64 x) { return x ? 64 - __builtin_clzll(x) : 0; }
#define min_t(t, a, b) ((t)(a) < (t)(b) ? (t)(a) : (t)(b))
#define max_t(t, a, b) ((t)(a) > (t)(b) ? (t)(a) : (t)(b))
#define clamp_t(t, v, lo, hi) min_t(t, max_t(t, v, lo), hi)
#define S64_MIN INT64_MIN
#define min(a, b) ((a) < (b) ? (a) : (b))
#define VT_RATE_USERSPACE
#include "../module/vtism_rate.c"

#define CALLS (1u << 22)
#define RUNS 11

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static volatile unsigned int sink;

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
		default:
			acc += vt_level_of_code((s64)c + (y & 63) - 32);
		}
	}
	sink = acc;
	return (now_ns() - t0) / CALLS;
}

int main(void)
{
	static const char *name[] = { "coarse window, young", "coarse window, not young",
				      "fine burst, young windows (1 + 4)", "fine burst, nothing seen",
				      "level of a code" };
	double t[RUNS];
	int w, r;

	srand(1);
	for (r = 0; r < 4096; r++) {
		codes[r] = 1408 + rand() % 1664;
		young[r] = rand();
	}
	for (w = 0; w < 5; w++) {
		for (r = 0; r < RUNS; r++)
			t[r] = run(w);
		qsort(t, RUNS, sizeof(t[0]), cmp);
		printf("%-42s %6.1f ns per call (median of %d x %u; min %.1f, max %.1f)\n", name[w],
		       t[RUNS / 2], RUNS, CALLS, t[0], t[RUNS - 1]);
	}
	return 0;
}
