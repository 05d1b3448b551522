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

#include "vtism_rate_user.h"
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
	bool risen = p->code && n > 1 && p->code < vt_rise_code((u64)(w[1] * 1e6), n - 1);
	bool fallen = p->code && n > 1 && p->code >= vt_fall_code((u64)(w[1] * 1e6), n - 1);
	int j;

	for (j = 1; j < n; j++) {
		risen = risen && young[j];
		fallen = fallen && !young[j];
	}
	t_run = fast ? p->s : p->t;
	if (risen) {	/* vt_frame_shift: starts over from the short windows */
		hz = 0;
		t_run = 0;
	} else if (fallen) {	/* ...and the long one */
		hz = vt_rate_add(0, 0, l_us, young[0], div);
		t_run = vt_exposure(0, l_us, div);
	} else if (!(fast && young[0])) {
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
static double moved_w(double from_hz, double true_hz, double gap_s, double w_s, int bursts,
		      unsigned int seed)
{
	double w[5] = { gap_s, w_s, w_s, w_s, w_s };
	struct page p = { 0, 0, 0 };
	bool young[5] = { true };
	int b, j;

	srand(seed);
	/* settle: the page at from_hz through the same windows */
	for (b = 0; b < 200 + bursts; b++) {
		double r = b < 200 ? from_hz : true_hz;

		for (j = 1; j < 5; j++)
			young[j] = rand() < RAND_MAX * (1 - exp(-r * w[j]));
		windows(&p, w, 5, 8, young);
	}
	return hz_of(p.code);
}

static double moved(double from_hz, double true_hz, double gap_s, int bursts, unsigned int seed)
{
	return moved_w(from_hz, true_hz, gap_s, 0.04, bursts, seed);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The code of a rate that expects x accesses in a window of 1 ms */
/* 200 runs of moved_w() in the testbed's windows (bursts 120 s apart, 437 ms), sorted */
static void testbed_moves(double *out, double from_hz, double true_hz, int bursts,
			  unsigned int seed)
{
	unsigned int k;

	for (k = 0; k < 200; k++)
		out[k] = moved_w(from_hz, true_hz, 120, 0.437, bursts, seed + k);
	qsort(out, 200, sizeof(double), cmp_double);
}

static unsigned int code_of_x(double x)
{
	return vt_code_of_hz((u64)(x / 0.001 * 4294967296.0), 512);
}

/* Windows of 1 ms at true x until an alarm, from the estimate's code; 0: none within n */
static int windows_to_alarm(unsigned int code, double true_x, int n, int *dir)
{
	s64 lw = vt_change_lw(1000);
	u16 down = 0, up = 0;
	int i;

	for (i = 1; i <= n; i++) {
		bool young = rand() < RAND_MAX * (1 - exp(-true_x));

		*dir = vt_change_step(code, lw, young, (u32)rand() * 2u, &down, &up);
		if (*dir)
			return i;
	}
	return 0;
}

/*
 * vt_change_step: its log-likelihood ratios against floating point; a steady rate rarely
 * alarms; a drop or a rise by 100x alarms within a few windows in its direction.
 */
static void change_tests(void)
{
	static const double xs[] = { 0.002, 0.02, 0.07, 0.3, 1, 3, 6.6, 15 };
	s64 lw = vt_change_lw(1000);
	unsigned int i;
	int dir, n;

	check(vt_change_lw(1000000) == 0, "lw of 1 s", vt_change_lw(1000000), 0);
	for (i = 0; i < sizeof(xs) / sizeof(xs[0]); i++) {
		double x = xs[i], xc = exp2(((double)code_of_x(x) - VT_RC_1HZ) / 64) * 0.001;
		double up_y = log((1 - exp(-4 * xc)) / (1 - exp(-xc))) * 1024;
		double down_y = log((1 - exp(-xc / 4)) / (1 - exp(-xc))) * 1024;
		u16 down = 0, up = 0;
		int r = vt_change_step(code_of_x(x), lw, false, 0, &down, &up);

		if (0.75 * xc * 1024 < 8192)
			check(fabs(down - 0.75 * xc * 1024) <= 0.01 * 0.75 * xc * 1024 + 1,
			      "idle: down", down, 0.75 * xc * 1024);
		else	/* one idle window of a rate that expects 15 accesses in it: a drop */
			check(r == -1 && down == 0 && up == 0, "idle: a certain drop", r, -1);
		up = 4000;
		vt_change_step(code_of_x(x), lw, false, 0, &down, &up);
		check(fabs((4000 - up) - 3 * xc * 1024) <= 0.01 * 3 * xc * 1024 + 1 ||
		      (up == 0 && 3 * xc * 1024 >= 4000), "idle: up", 4000 - up, 3 * xc * 1024);
		down = 4000;
		up = 0;
		vt_change_step(code_of_x(x), lw, true, 0, &down, &up);
		check(fabs(up - up_y) <= 0.01 * up_y + 2, "young: up", up, up_y);
		check(fabs((down - 4000) - down_y) <= 0.01 * fabs(down_y) + 2, "young: down",
		      down - 4000, down_y);
	}
	/* steady rates: at most a false alarm per e^8 (~3000) windows, with room for chance */
	srand(11);
	for (i = 0; i < sizeof(xs) / sizeof(xs[0]); i++) {
		unsigned int code = code_of_x(xs[i]), alarms = 0, k;
		double xc = exp2(((double)code - VT_RC_1HZ) / 64) * 0.001;
		u16 down = 0, up = 0;

		for (k = 0; k < 300000; k++)
			alarms += !!vt_change_step(code, lw, rand() < RAND_MAX * (1 - exp(-xc)),
						   (u32)rand() * 2u, &down, &up);
		check(alarms <= 300000 / 2000, "steady rate: false alarms", alarms, 300000 / 2981.0);
	}
	/* a hot region gone quiet (6.6 -> 0.066 expected per window) alarms down at once */
	n = windows_to_alarm(code_of_x(6.6), 0.066, 1000, &dir);
	check(n >= 1 && n <= 3 && dir == -1, "drop: windows to a down alarm", n, 2);
	/* a quiet region gone hot (0.07 -> 7) alarms up within a few windows */
	n = windows_to_alarm(code_of_x(0.07), 7, 1000, &dir);
	check(n >= 1 && n <= 8 && dir == 1, "rise: windows to an up alarm", n, 6);
	/* no rate, nothing to detect */
	{
		u16 down = 7, up = 9;

		check(vt_change_step(0, lw, true, 0, &down, &up) == 0 && down == 7 && up == 9,
		      "no rate: untouched", down, 7);
	}
}

/*
 * vt_young_chance against 1 - e^-x; vt_window_stalled: a window of 64 independent regions at
 * rates from 1/16 to 32 expected accesses is rarely called stalled, one in which the vCPU ran
 * for a 30th of it (each region's x a 30th) nearly always, and too few expected regions
 * never are.
 */
static void stall_tests(void)
{
	s64 lw = vt_change_lw(1000);
	unsigned int codes[64], i, k, stalled = 0, caught = 0;
	static const double xs[] = { 0.1, 1, 4, 20 };

	for (i = 0; i < sizeof(xs) / sizeof(xs[0]); i++) {
		double p = (double)vt_young_chance(code_of_x(xs[i]), lw) / 4294967296.0;

		check(fabs(p - (1 - exp(-xs[i]))) < 0.01, "young chance", p, 1 - exp(-xs[i]));
	}
	check(vt_young_chance(0, lw) == 0, "young chance of no rate", 0, 0);
	srand(13);
	for (i = 0; i < 64; i++)
		codes[i] = code_of_x(exp2(-4 + 9.0 * i / 63));
	for (k = 0; k < 100000; k++) {
		u64 expect = 0, young = 0, young_stall = 0;

		for (i = 0; i < 64; i++) {
			double x = exp2(((double)codes[i] - VT_RC_1HZ) / 64) * 0.001;

			expect += vt_young_chance(codes[i], lw);
			young += rand() < RAND_MAX * (1 - exp(-x));
			young_stall += rand() < RAND_MAX * (1 - exp(-x / 30));
		}
		stalled += vt_window_stalled(expect, young);
		caught += vt_window_stalled(expect, young_stall);
	}
	check(stalled <= 100, "steady windows called stalled (of 100000)", stalled, 0);
	check(caught >= 99000, "a vCPU that ran a 30th of the window: stalled (of 100000)", caught,
	      100000);
	check(!vt_window_stalled(3 * 4294967296ULL, 0), "three regions expected: no stall", 1, 0);
	check(vt_window_stalled(50 * 4294967296ULL, 19) && !vt_window_stalled(50 * 4294967296ULL, 25),
	      "half of the expected young regions", 19, 25);
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

	/* the risen code: a rate there is young in all m windows in 1 burst of 100 */
	for (i = 1; i <= 6; i++) {
		for (x = 5000; x <= 2000000; x *= 7) {
			double w = x / 1e6, p = pow(1 - exp(-hz_of(vt_rise_code(x, i)) * w), i);

			check(fabs(log(p / 0.01)) < 0.1 * i, "rise code", p, 0.01);
		}
	}

	/* the fallen code: a rate there is idle in all m windows in 1 burst of 100 */
	for (i = 1; i <= 6; i++) {
		for (x = 5000; x <= 2000000; x *= 7) {
			double p = exp(-hz_of(vt_fall_code(x, i)) * i * x / 1e6);

			check(fabs(log(p / 0.01)) < 0.05, "fall code", p, 0.01);
		}
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

	/*
	 * The testbed's moving hot set in its slow nested guest: bursts 120 s apart (one sweep),
	 * windows of 437 ms, the background 0.5 Hz. A page cold until the move and 13 Hz after it
	 * is above every warm page (2 Hz at most, the 99th percentile of their estimates) after one
	 * burst: averaged in, its four young windows left it at 0.2 Hz (level 59 against the warm
	 * pages' 80, docs/testbed.md), to be found again a sweep later. The other side: a page 13 Hz
	 * until the move and 0.05 Hz after it is below the warm pages (their 5th percentile) after two
	 * bursts in 99% of runs; averaged in, its eight idle windows left it above 4 Hz, ranked over
	 * the new hot set for several sweeps.
	 */
	{
		double warm[200], risen[200], fallen[200];

		testbed_moves(warm, 0.5, 0.5, 1, 300);
		testbed_moves(risen, 0.05, 13, 1, 600);
		testbed_moves(fallen, 13, 0.05, 2, 1200);
		check(warm[197] <= 2, "warm pages stay warm (99th percentile)", warm[197], 2);
		check(risen[10] > 2, "a risen page is above them after one burst (5th percentile)",
		      risen[10], 2);
		check(fallen[197] < warm[10],
		      "a fallen page is below the warm ones after two bursts (99th percentile)",
		      fallen[197], warm[10]);
	}

	/*
	 * Publication before a region's first burst (vt_share_code): 512 frames each at f Hz make a
	 * region of 512 f Hz (while it is slow enough that its accesses rarely fall on the same
	 * window); its coarse estimate shared among them lands within 1.5x of f, one frame of it
	 * within 1.5x of the region itself. No frame present or an idle region: nothing.
	 */
	for (i = 1; i < 3; i++) {	/* 0.5 Hz / 512 is below the scale */
		double f = rates[i] / 512, ec = estimate(rates[i], coarse, 2, 48, 51 + i);
		unsigned int rc = vt_code_of_hz((u64)(ec * 4294967296.0), 512);

		check(hz_of(vt_share_code(rc, 512)) / f < 1.5 && f / hz_of(vt_share_code(rc, 512)) < 1.5,
		      "region rate shared by 512 frames", hz_of(vt_share_code(rc, 512)), f);
		check(vt_share_code(rc, 1) == rc, "region rate of its one frame", vt_share_code(rc, 1), rc);
		check(fabs(hz_of(vt_share_code(rc, 100)) * 100 / hz_of(rc) - 1) < 0.02,
		      "region rate shared by 100 frames", hz_of(vt_share_code(rc, 100)), hz_of(rc) / 100);
	}
	check(vt_share_code(0, 512) == 0 && vt_share_code(VT_RC_1HZ, 0) == 0, "no share", 0, 0);
	check(vt_share_code(VT_RC_ZERO + 100, 512) == 0, "share below the scale", 0, 0);

	/*
	 * A region's rate bounds its frames' (vt_published_code). Graph edges: a region busy at
	 * 20 Hz one second in ten, idle the other nine. A burst that lands in the busy second
	 * measures a frame near 20 Hz; the region's coarse rate, over 200 ms periods (198 + 2 ms
	 * windows), is a few Hz at most by the end of the idle seconds: the frame is published at
	 * the region's rate. A region too busy for W_c to tell its rate (at or above
	 * vt_fast_code(W_c)) bounds nothing.
	 */
	{
		struct page r = { 0, 0, 0 };
		unsigned int fc = vt_code_of_hz((u64)(estimate(20, fine, 5, 8, 61) * 4294967296.0), 512);
		unsigned int k, wc_fast = vt_fast_code(2000);
		bool young[2];

		srand(62);
		for (k = 0; k < 50 * 50; k++) {
			double hz = k % 50 < 5 ? 20 : 0;

			young[0] = rand() < RAND_MAX * (1 - exp(-hz * coarse[0]));
			young[1] = rand() < RAND_MAX * (1 - exp(-hz * coarse[1]));
			windows(&r, coarse, 2, 48, young);
		}
		check(hz_of(r.code) < 5 && hz_of(fc) > 10, "graph edge: region cool, frame hot",
		      hz_of(r.code), hz_of(fc));
		check(vt_published_code(fc, 0, r.code, wc_fast, 0) == r.code, "frame bounded by its region",
		      vt_published_code(fc, 0, r.code, wc_fast, 0), r.code);
		check(vt_published_code(r.code + 100, -200, r.code, wc_fast, 0) == (s64)r.code - 100,
		      "follow, then the bound", vt_published_code(r.code + 100, -200, r.code, wc_fast, 0),
		      r.code - 100);
		check(vt_published_code(r.code - 10, 0, r.code, wc_fast, 0) == (s64)r.code - 10,
		      "a cooler frame unbounded", vt_published_code(r.code - 10, 0, r.code, wc_fast, 0),
		      r.code - 10);
		check(vt_published_code(VT_RC_MAX, 0, wc_fast, wc_fast, 0) == VT_RC_MAX,
		      "a saturated region bounds nothing", vt_published_code(VT_RC_MAX, 0, wc_fast, wc_fast, 0),
		      VT_RC_MAX);
	}

	/*
	 * And it bounds them from below: a hot set that moved after the region's burst. The
	 * region's frames were measured at 0.05 Hz; now each is at 20 Hz, the region at 10 kHz
	 * (saturated for W_c = 2 ms: no upper bound), its coarse rate up 8 octaves since the burst.
	 * Following it up by at most 4x would leave the frames at 0.2 Hz until the sweep comes
	 * back; its rate shared among its 512 frames puts them at 20 Hz.
	 */
	{
		unsigned int cold = VT_RC_1HZ - 277, region = VT_RC_1HZ + 850;	/* 0.05 Hz, ~10 kHz */
		s64 share = vt_share_code(region, 512), c;

		c = vt_published_code(cold, 2 * VT_RC_PER_OCTAVE, region, vt_fast_code(2000), share);
		check(hz_of(c) > 15 && hz_of(c) < 25, "moved hot set: frames at their share", hz_of(c), 20);
		c = vt_published_code(region - 100, 0, region, vt_fast_code(2000), share);
		check(c == (s64)region - 100, "a frame above its share keeps its rate", c, region - 100);
	}

	change_tests();
	stall_tests();
	printf("vtism_rate_test: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
