// SPDX-License-Identifier: GPL-2.0
/*
 * User-space test of vtism_rate.c, the module's fixed-point rate arithmetic: against floating
 * point (log2, exp2, codes, 1 - e^-x), the channel v1.1 level of a code (docs/channel.md:
 * level = 16 log2(rate) + 96, rounded), and the estimator on simulated Poisson pages seen
 * through the module's windows (a coarse period: 198 ms since the last read and 2 ms; a fine
 * burst: 3 s since the last burst and four windows of 30 ms). Run by `make -C guest/module
 * check` (and so by all-kernels and make test-module).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
#include "vtism_rate.c"

static int failures;

static void check(bool ok, const char *what, double got, double want)
{
	if (!ok) {
		printf("FAIL %s: got %.6g want %.6g\n", what, got, want);
		failures++;
	}
}

static double hz_of(unsigned int c)
{
	return c ? exp2(((double)c - VT_RC_1HZ) / VT_RC_PER_OCTAVE) : 0;
}

/*
 * A page's rate through a repeating pattern of windows, w[0] the long one, as the module takes
 * them (vtism_track.c, vt_frame_rate): a rate fast for the long window (vt_fast_code) weighs
 * only the short windows' exposure before it and leaves that window out when it saw the page.
 * t: all windows' exposure, s: the short ones'.
 */
struct page {
	unsigned int code;
	u64 t, s;
};

static void windows(struct page *p, const double *w, int n, u32 div, const bool *young)
{
	u64 l_us = (u64)(w[0] * 1e6), t_run;
	bool fast = p->code && p->code >= vt_fast_code(l_us);
	u64 hz = vt_hz_of_code(p->code);
	int j;

	t_run = fast ? p->s : p->t;
	if (!(fast && young[0])) {
		hz = vt_rate_add(hz, t_run, l_us, young[0], div);
		t_run = vt_exposure(t_run, l_us, div);
	}
	p->t = vt_exposure(p->t, l_us, div);
	for (j = 1; j < n; j++) {
		u64 w_us = (u64)(w[j] * 1e6);

		hz = vt_rate_add(hz, t_run, w_us, young[j], div);
		t_run = vt_exposure(t_run, w_us, div);
		p->t = vt_exposure(p->t, w_us, div);
		p->s = vt_exposure(p->s, w_us, div);
	}
	p->code = vt_code_of_hz(hz, rand());
}

/* a Poisson page of `rate` Hz through the pattern; geometric mean estimate */
static double estimate(double rate, const double *w, int n, u32 div, unsigned int seed)
{
	struct page p = { 0, 0, 0 };
	bool young[8];
	double sum = 0;
	int cnt = 0, j;
	unsigned int k;

	srand(seed);
	for (k = 0; k < 40000 / (unsigned int)n; k++) {
		for (j = 0; j < n; j++)
			young[j] = rand() < RAND_MAX * (1 - exp(-rate * w[j]));
		windows(&p, w, n, div, young);
		if (k >= 2000 / (unsigned int)n) {
			sum += log2(p.code ? hz_of(p.code) : 1.0 / 1024);
			cnt++;
		}
	}
	return exp2(sum / cnt);
}

/*
 * A warm background touches every page in every long window: a page whose true rate changed
 * must still get there through its short windows. Bursts of a young long window of gap_s and
 * four windows of 40 ms, Poisson at true_hz, from an estimate of from_hz settled over many such
 * bursts; the estimate after `bursts` of them.
 */
static double moved(double from_hz, double true_hz, double gap_s, int bursts, unsigned int seed)
{
	static double w[5] = { 0, 0.04, 0.04, 0.04, 0.04 };
	struct page p = { 0, 0, 0 };
	bool young[5] = { true };
	int b, j;

	srand(seed);
	w[0] = gap_s;
	/* settle: the page at from_hz through the same windows */
	for (b = 0; b < 200 + bursts; b++) {
		double r = b < 200 ? from_hz : true_hz;

		for (j = 1; j < 5; j++)
			young[j] = rand() < RAND_MAX * (1 - exp(-r * w[j]));
		windows(&p, w, 5, 8, young);
	}
	return hz_of(p.code);
}

int main(void)
{
	static const double coarse[] = { 0.198, 0.002 }, fine[] = { 3.0, 0.03, 0.03, 0.03, 0.03 };
	/* what each kind of window can resolve: a rate with about one access in its memory or more
	 * (coarse: 48 windows, 4.8 s; fine: 8 windows, 5 s) and below what its short windows fill */
	static const double rates[] = { 0.5, 2, 20 };
	u64 x;
	s64 y;
	unsigned int c, i;

	for (x = 1; x < (1ULL << 62); x = x * 3 + 1)
		check(fabs(vt_log2_q16(x) / 65536.0 - log2((double)x)) < 2e-4, "log2", vt_log2_q16(x) / 65536.0, log2((double)x));
	for (y = -40 * 65536; y < 30 * 65536; y += 777)
		check(fabs(vt_exp2_q32(y) / 4294967296.0 / exp2(y / 65536.0) - 1) < 2e-4 ||
		      vt_exp2_q32(y) < 20000, "exp2", vt_exp2_q32(y) / 4294967296.0, exp2(y / 65536.0));
	for (c = VT_RC_ZERO; c <= VT_RC_MAX; c++) {
		check(fabs(vt_hz_of_code(c) / 4294967296.0 / hz_of(c) - 1) < 3e-4 || c < 1500, "hz_of_code", vt_hz_of_code(c) / 4294967296.0, hz_of(c));
		check(vt_code_of_hz(vt_hz_of_code(c), 512) == c, "code round trip", vt_code_of_hz(vt_hz_of_code(c), 512), c);
	}
	check(vt_code_of_hz(0, 512) == 0 && vt_hz_of_code(0) == 0, "zero", 0, 0);
	for (x = 1000; x < (60ULL << 32); x = x * 5 / 4 + 1) {
		double xd = x / 4294967296.0, want = 1 - exp(-xd);

		check(fabs(vt_share_of_x(x) / 4294967296.0 - want) < 1e-3 * want + 1e-9, "share_of_x", vt_share_of_x(x) / 4294967296.0, want);
	}

	/* levels: the channel's scale (crates/proto count.rs level_of_rate) */
	for (c = 1; c <= VT_RC_MAX; c++) {
		double l = round(log2(hz_of(c)) * 16 + 96);

		l = l < 0 ? 0 : l > 255 ? 255 : l;
		/* codes sit 1/4 level apart: rounding may differ only at the exact half */
		check(fabs(vt_level_of_code(c) - l) <= (c % 4 == 2 ? 1 : 0), "level", vt_level_of_code(c), l);
	}
	check(vt_level_of_code(VT_RC_1HZ) == 96, "1 Hz", vt_level_of_code(VT_RC_1HZ), 96);
	check(vt_level_of_code(VT_RC_1HZ - 6 * 64) == 0, "1/64 Hz", vt_level_of_code(VT_RC_1HZ - 6 * 64), 0);

	/* idle windows in the code domain: the same as the update, within 1 code */
	for (c = 1500; c <= VT_RC_MAX; c += 5) {
		u64 t = 2500000, w = 300000;
		unsigned int exact = vt_code_of_hz(vt_rate_add(vt_hz_of_code(c), t, w, false, 8), 512);

		check(abs((int)vt_code_moved(c, vt_idle_codes(t, w, 8), 512) - (int)exact) <= 1, "idle codes",
		      vt_code_moved(c, vt_idle_codes(t, w, 8), 512), exact);
	}
	check(vt_code_moved(3000, vt_idle_codes(0, 30000, 8), 512) == 0, "no exposure", 0, 0);
	/* and on average (dithered) as small a step as the window makes: 10000 windows of 2 ms in
	 * 4.8 s of exposure scale a rate by (1 + 2/4700)^-10000 = 2^-6.1 */
	{
		unsigned int code = 2600, k;

		srand(9);
		for (k = 0; k < 10000; k++)
			code = vt_code_moved(code, vt_idle_codes(4800000, 2000, 48), rand());
		check(abs((int)code - (int)(2600 - 64 * 10000 * log2(1 + 2000.0 / (4800000 - 100000)))) <= 8,
		      "dithered idle steps", code, 2600 - 64 * 10000 * log2(1 + 2000.0 / 4700000));
	}

	/* a first young window: one access in it */
	c = vt_code_of_hz(vt_rate_add(0, 0, 30000, true, 8), 512);
	check(fabs(hz_of(c) - 1 / 0.03) < 1, "first window", hz_of(c), 1 / 0.03);

	/* Poisson pages: the estimate's geometric mean within a factor 1.5 of the rate; a slower
	 * page in the fine windows' memory (0.2 Hz: one access in 5 s) within a factor 2 */
	{
		double ef = estimate(0.2, fine, 5, 8, 3);

		check(ef / 0.2 < 2 && 0.2 / ef < 2, "slow fine estimate", ef, 0.2);
	}
	for (i = 0; i < sizeof(rates) / sizeof(rates[0]); i++) {
		double ec = estimate(rates[i], coarse, 2, 48, 11 + i), ef = estimate(rates[i], fine, 5, 8, 21 + i);

		check(ec / rates[i] < 1.5 && rates[i] / ec < 1.5, "coarse estimate", ec, rates[i]);
		/* between 4 accesses per long window (1.3 Hz for 3 s) and ~1 per short window's
		 * memory of 8 (4 Hz for 30 ms), the fine rate rests on a few young short windows: it
		 * is noisy and its geometric mean low, by at most 2 */
		if (rates[i] > 4.0 / fine[0] && rates[i] < 1 / (8 * fine[1]))
			check(ef / rates[i] < 1.5 && rates[i] / ef < 2, "fine estimate, noisy band", ef, rates[i]);
		else
			check(ef / rates[i] < 1.5 && rates[i] / ef < 1.5, "fine estimate", ef, rates[i]);
	}
	/* and it ranks: the estimate grows with the rate, 0.1 Hz to 400 Hz in doublings */
	{
		double r, last = 0;

		for (r = 0.1; r < 400; r *= 2) {
			double e = estimate(r, fine, 5, 8, 41);

			check(e > last, "fine estimate ranks", e, last);
			last = e;
		}
	}
	/* faster pages: as far as the short windows tell them (x = rW up to a few) */
	{
		static const double c10[] = { 0.19, 0.01 }, f5[] = { 3.0, 0.005, 0.005, 0.005, 0.005 };
		double e1 = estimate(200, c10, 2, 48, 31), e2 = estimate(200, f5, 5, 8, 32);

		check(e1 / 200 < 1.5 && 200 / e1 < 1.5, "fast coarse estimate", e1, 200);
		check(e2 / 200 < 1.5 && 200 / e2 < 1.5, "fast fine estimate", e2, 200);
	}
	/* a page seen in every window rises toward several per window, and stays there */
	{
		double e = estimate(10000, fine + 1, 4, 8, 5);

		check(e > 2 / 0.03 && e < 1000, "saturated", e, 5 / 0.03);
	}

	/* a hot set that moved under a warm background (docs/guest.md): the old hot pages (60 Hz,
	 * now 2) and the new ones (2 Hz, now 60) cross within 5 bursts, whatever the gap, and the
	 * new ones pass 20 Hz; geometric means of 20 seeds (counting young long windows as other
	 * windows, the old ones stayed near 60 Hz and the new ones under 5 for 10 bursts) */
	{
		static const double gaps[] = { 5, 30 };

		for (i = 0; i < 2; i++) {
			double down = 0, up = 0;
			unsigned int k;

			for (k = 0; k < 20; k++) {
				down += log2(moved(60, 2, gaps[i], 5, 100 + k)) / 20;
				up += log2(moved(2, 60, gaps[i], 5, 200 + k)) / 20;
			}
			check(exp2(down) < exp2(up), "old and new hot cross (gap)", gaps[i], 0);
			check(exp2(up) > 20, "new hot warms (gap)", exp2(up), gaps[i]);
		}
	}

	printf("vtism_rate_test: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
