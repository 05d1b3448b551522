// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * vtism_guest access-rate arithmetic, in fixed point (no FPU in kernel code).
 *
 * A rate is stored as a code on a log scale: 64 codes per doubling, VT_RC_1HZ = 1 access per
 * second, 0 = none (below 2^-10 Hz); it is computed on in Hz, Q32. An observation window of
 * length W in which a page's Accessed bit got set says it had at least one access; with Poisson
 * accesses at rate r, the expected number given that is x / (1 - e^-x), x = r W. A rate is the
 * accesses so counted over the window time they were counted in, both decayed by (div-1)/div
 * per window: events over exposure, the estimate that windows of any length (a 30 ms window, the
 * 3 s since the last burst) can share without the short ones, which rarely see a slow page,
 * dragging its rate down or making it jump.
 *
 * Built into the module and, with VT_RATE_USERSPACE, into vtism_rate_test.c,
 * guest/tests/bench_rate.c and the simulator (crates/sim): hence dual-licensed.
 */
#ifndef VT_RATE_USERSPACE
#include <linux/bitops.h>
#include <linux/kernel.h>
#endif
#include "vtism_guest.h"

/* log2(1 + i/64) in Q16, i = 0..64 */
static const u32 vt_log2_tab[65] = {
	0, 1466, 2909, 4331, 5732, 7112, 8473, 9814, 11136, 12440, 13727, 14996, 16248, 17484,
	18704, 19909, 21098, 22272, 23433, 24579, 25711, 26830, 27936, 29029, 30109, 31178, 32234,
	33279, 34312, 35334, 36346, 37346, 38336, 39316, 40286, 41246, 42196, 43137, 44068, 44990,
	45904, 46809, 47705, 48593, 49472, 50344, 51207, 52063, 52911, 53751, 54584, 55410, 56229,
	57040, 57845, 58643, 59434, 60219, 60997, 61769, 62534, 63294, 64047, 64794, 65536,
};

/* 2^(i/64) in Q30, i = 0..64 */
static const u32 vt_exp2_tab[65] = {
	1073741824, 1085434106, 1097253708, 1109202018, 1121280436, 1133490379, 1145833280,
	1158310587, 1170923762, 1183674286, 1196563654, 1209593378, 1222764986, 1236080024,
	1249540052, 1263146652, 1276901417, 1290805962, 1304861917, 1319070932, 1333434672,
	1347954824, 1362633090, 1377471191, 1392470869, 1407633882, 1422962010, 1438457051,
	1454120821, 1469955159, 1485961921, 1502142985, 1518500250, 1535035634, 1551751076,
	1568648537, 1585730000, 1602997467, 1620452965, 1638098541, 1655936265, 1673968228,
	1692196547, 1710623359, 1729250827, 1748081133, 1767116489, 1786359126, 1805811301,
	1825475297, 1845353420, 1865448001, 1885761398, 1906295993, 1927054196, 1948038440,
	1969251188, 1990694927, 2012372174, 2034285470, 2056437387, 2078830522, 2101467502,
	2124350982, 2147483648,
};

#define VT_Q16 65536LL
#define VT_ONE (1ULL << 32)
#define VT_LOG2E_Q32 6196328019ULL	/* log2(e) in Q32 */
#define VT_RC_ZERO 1408			/* codes below (2^-10 Hz) are no accesses at all */
#define VT_US 1000000ULL
#define VT_T_MAX (1ULL << 34)		/* windows and exposures are clamped to 4.7 hours */

#ifdef VT_RATE_USERSPACE
static inline u64 mul_u64_u64_div_u64(u64 a, u64 b, u64 c)
{
	return (u64)((unsigned __int128)a * b / c);
}
#endif

/* log2(x) in Q16, x > 0: table of the mantissa with linear interpolation (error < 1e-4) */
s64 vt_log2_q16(u64 x)
{
	int n = fls64(x) - 1;
	u64 m = n >= 32 ? x >> (n - 32) : x << (32 - n);	/* [2^32, 2^33) */
	u32 f = (u32)m, i = f >> 26, r = f & ((1u << 26) - 1);

	return (s64)n * VT_Q16 + vt_log2_tab[i] +
	       (s64)(((u64)(vt_log2_tab[i + 1] - vt_log2_tab[i]) * r) >> 26);
}

/* 2^y for y in Q16, as Q32 (2^y * 2^32), saturating */
u64 vt_exp2_q32(s64 y)
{
	s64 ip = y >> 16;	/* floor */
	u32 f = (u32)(y & 0xffff), i = f >> 10, r = f & 1023;
	u64 m = vt_exp2_tab[i] + (((u64)(vt_exp2_tab[i + 1] - vt_exp2_tab[i]) * r) >> 10);
	s64 sh = ip + 2;	/* Q30 -> Q32, times 2^ip */

	if (sh > 32)
		return ~0ULL;
	if (sh >= 0)
		return m << sh;
	if (sh < -63)
		return 0;
	return m >> -sh;
}

/* Hz in Q32 of a rate code */
u64 vt_hz_of_code(unsigned int code)
{
	if (!code)
		return 0;
	return vt_exp2_q32(((s64)code - VT_RC_1HZ) * (VT_Q16 / VT_RC_PER_OCTAVE));
}

/*
 * Rate code of Hz in Q32; 0 below 2^-10 Hz. Rounded up with probability (fraction + dither) /
 * 1024 for a dither drawn uniformly from 0..1023: a window moves a rate by far less than a
 * code (a 2 ms window among 4.8 s of exposure: 0.04%), and rounding to the nearest code would
 * lose every such step; stochastic rounding keeps the stored code unbiased. 512 rounds to the
 * nearest code.
 */
unsigned int vt_code_of_hz(u64 hz, u32 dither)
{
	s64 code;

	if (!hz)
		return 0;
	code = VT_RC_1HZ + ((vt_log2_q16(hz) - 32 * VT_Q16 + (dither & 1023)) >> 10);
	if (code < VT_RC_ZERO)
		return 0;
	return min_t(s64, code, VT_RC_MAX);
}

/* 1 - e^-x for x in Q32, as Q32 */
u64 vt_share_of_x(u64 x)
{
	u64 y;

	if (x < (VT_ONE >> 4)) {	/* the series keeps the precision */
		u64 x2 = (x * x) >> 32, x3 = (x2 * x) >> 32;

		return x - x2 / 2 + x3 / 6;
	}
	if (x >= (48 * VT_ONE))
		return VT_ONE;
	y = mul_u64_u64_div_u64(x, VT_LOG2E_Q32, VT_ONE << 16);	/* x log2(e), Q16 */
	return VT_ONE - min_t(u64, vt_exp2_q32(-(s64)y), VT_ONE);
}

/* The exposure after one more window: what came before weighs (div-1)/div less. */
u64 vt_exposure(u64 t_us, u64 w_us, u32 div)
{
	t_us = min(t_us, VT_T_MAX);
	return t_us - t_us / div + min(w_us, VT_T_MAX);
}

/*
 * One window of w_us averaged into a rate (Hz, Q32) seen through t_us of earlier windows:
 * (accesses before, decayed, + those of this window) / vt_exposure(t_us, w_us, div).
 */
u64 vt_rate_add(u64 hz, u64 t_us, u64 w_us, bool young, u32 div)
{
	u64 td, ev;

	/* bounded so no product or quotient below leaves 64 bits */
	hz = min(hz, vt_hz_of_code(VT_RC_MAX));
	t_us = min(t_us, VT_T_MAX);
	w_us = min(w_us, VT_T_MAX);
	td = t_us - t_us / div;
	ev = mul_u64_u64_div_u64(hz, td, VT_US);	/* accesses, Q32 */
	if (young) {
		u64 x = mul_u64_u64_div_u64(hz, w_us, VT_US);

		if (x < (VT_ONE >> 20))
			ev += VT_ONE + x / 2;		/* x / (1 - e^-x) */
		else
			ev += mul_u64_u64_div_u64(x, VT_ONE, vt_share_of_x(x));
	} else {
		ev = mul_u64_u64_div_u64(hz, td, VT_US);
	}
	return mul_u64_u64_div_u64(ev, VT_US, max_t(u64, td + w_us, 1));
}

/*
 * Long windows (the gap since a frame's last burst, the time since a region's last coarse read)
 * and a rate that expects many accesses in them. Seen young, such a window says only "at least
 * one access", next to nothing when the estimate expects x = rate w >= 4 (it would be idle with
 * probability < 2%); yet vt_rate_add() counts the estimate's own accesses back with the window's
 * whole length as weight, seconds against the short windows' milliseconds. Under a warm
 * background, which touches every page in any long window, rates then stay where they were
 * whatever the short windows see: a hot set that moved was still ranked by where it had been
 * minutes later (docs/guest.md). So a rate at or above this code for a window of w_us is fast
 * for it: its young long windows are left out, accesses and exposure both, and its prior weighs
 * the short windows' exposure only. An idle long window always enters: that is real evidence.
 */
unsigned int vt_fast_code(u64 w_us)
{
	u64 hz = mul_u64_u64_div_u64(VT_US, VT_ONE, clamp_t(u64, w_us, 1, VT_T_MAX));

	/* below the scale (w > 68 min): every rate it holds is fast */
	return max_t(unsigned int, vt_code_of_hz(hz << VT_FAST_OCTAVES, 512), VT_RC_ZERO);
}

/*
 * A page young in every one of m windows of w_us, though its rate says that happens in fewer than
 * 1 burst in 100: its rate rose (a hot set that moved onto it), and the windows are evidence the
 * rate cannot weigh. Averaged in, m young windows move a rate that expected little by about one
 * access each against all its exposure: a page cold until now was published below the warm pages
 * it overtook for several sweeps, minutes in a slow guest (docs/testbed.md). Below the code this
 * returns, such a page starts over from the m windows alone, as on its first burst (about 1.6 / w
 * for m = 4). The code: (1 - e^-rw)^m = 1/100, r = -ln(1 - 100^(-1/m)) / w.
 */
unsigned int vt_rise_code(u64 w_us, unsigned int m)
{
	/* -ln(1 - 100^(-1/m)) in Q16, m = 1..6 */
	static const u32 x_q16[] = { 659, 6905, 15901, 24912, 33271, 40889 };
	u64 x = x_q16[clamp_t(unsigned int, m, 1, ARRAY_SIZE(x_q16)) - 1];

	return vt_code_of_hz(mul_u64_u64_div_u64(x << 16, VT_US, clamp_t(u64, w_us, 1, VT_T_MAX)),
			     512);
}

/*
 * The other way: a page idle in every one of m windows of w_us, though its rate says that happens
 * in fewer than 1 burst in 100: its rate fell (a hot set that moved off it). Averaged in, m idle
 * windows move a rate by about m w against the region's exposure, some 8 windows: a hot set that
 * moved was still ranked where it had been for several bursts of each region, minutes in a slow
 * guest (docs/testbed.md), and kept the quota. At or above the code this returns, such a page starts
 * over from the burst's windows and the long one before them. The code: e^(-r w m) = 1/100,
 * r = ln(100) / (m w).
 */
unsigned int vt_fall_code(u64 w_us, unsigned int m)
{
	u64 mw = (u64)clamp_t(unsigned int, m, 1, 6) *	/* 6: VT_BURST_MAX_WINDOWS */
		 clamp_t(u64, w_us, 1, VT_T_MAX);

	/* ln(100) = 4.60517 = 301805 / 2^16 */
	return vt_code_of_hz(mul_u64_u64_div_u64(301805ULL << 16, VT_US, mw), 512);
}

/*
 * What a window of w_us that did not see the page does to its rate after t_us of exposure: it
 * scales by td / (td + w), td = t decayed. In 1/1024 codes; S64_MIN when nothing came before
 * (the rate is then 0). Sums of these move a code through several idle windows at once.
 */
s64 vt_idle_codes(u64 t_us, u64 w_us, u32 div)
{
	u64 td = min(t_us, VT_T_MAX) - min(t_us, VT_T_MAX) / div;

	if (!td)
		return S64_MIN;
	return -(((vt_log2_q16(td + min(w_us, VT_T_MAX)) - vt_log2_q16(td)) * VT_RC_PER_OCTAVE) >> 6);
}

/* A code moved by d/1024 codes (vt_idle_codes, summed), rounded as vt_code_of_hz(); 0 when it
 * falls below the scale */
unsigned int vt_code_moved(unsigned int code, s64 d, u32 dither)
{
	s64 c;

	if (!code || d == S64_MIN)
		return 0;
	c = (((s64)code << 10) + d + (dither & 1023)) >> 10;
	if (c < VT_RC_ZERO)
		return 0;
	return min_t(s64, c, VT_RC_MAX);
}

/* Channel v1.1 rate level of a code: 16 levels per doubling, level 96 = 1 Hz, rounded */
unsigned int vt_level_of_code(s64 code)
{
	s64 l;

	if (code <= 0)
		return 0;
	l = (code - (VT_RC_1HZ - 96 * (VT_RC_PER_OCTAVE / 16)) + 2) >> 2;
	return clamp_t(s64, l, 0, 255);
}

/*
 * A region's frames before their first fine burst: the region's rate shared evenly among its
 * present frames, rate / present. Every access of the region is an access of some frame, so
 * their rates sum to at least the region's, and none exceeds it; the even share ranks a busy
 * region's frames above a quiet one's from its first coarse windows, minutes before the sweep
 * reaches it. 0 when the region is idle or has no frame present.
 */
unsigned int vt_share_code(unsigned int region_code, unsigned int present)
{
	s64 c;

	if (!region_code || !present)
		return 0;
	c = (s64)region_code - ((vt_log2_q16(present) * VT_RC_PER_OCTAVE) >> 16);
	return c < VT_RC_ZERO ? 0 : c;
}

/*
 * The code a measured frame is published at: its rate moved by how far its region's moved
 * since its burst (follow), bounded by its region both ways. Not above the region's rate while a
 * coarse window W_c can tell that rate (below wc_fast_code = vt_fast_code(W_c)): every access
 * of a frame is one of its region. A frame's rate is one burst's snapshot, refreshed once a
 * sweep: a region hot one second in ten and measured in that second would otherwise be
 * published ten times too hot for minutes. And not below the region's rate shared among its
 * frames (share, vt_share_code): their rates sum to at least the region's, and a region that
 * became busy after its burst (a hot set that moved) would otherwise have its frames follow it
 * up by at most 4x until the sweep comes back, minutes later.
 */
s64 vt_published_code(unsigned int code, s64 follow, unsigned int region_code,
		      unsigned int wc_fast_code, s64 share)
{
	s64 c = (s64)code + follow;

	if (region_code < wc_fast_code)
		c = min_t(s64, c, region_code);
	return max_t(s64, c, share);
}

/*
 * Change detection: Page's CUSUM on a rate's short windows. A rate's estimate remembers about
 * its divisor's worth of windows (48 coarse ones, seconds), so a hot set that moves is ranked
 * where it was for seconds after the move; yet one window that a rate makes unlikely (an idle
 * window of a rate expected to be seen, or young ones in a row of a rate expected not to be) is
 * strong evidence. Each window adds the log-likelihood ratio of its outcome for a rate moved by
 * a factor of 2^VT_CHANGE_OCTAVES down (*down) and up (*up), against the estimate; a sum that
 * reaches VT_CHANGE_H is an alarm, and the caller moves the rate by that factor. Whether a
 * window of a rate r is young is Bernoulli with P = 1 - e^-x, x = r w: an idle window adds
 * (1 - 1/4) x to *down and takes 3 x from *up; a young one adds ln((1 - e^-4x) / (1 - e^-x))
 * to *up and ln((1 - e^-x/4) / (1 - e^-x)) (< 0) to *down. Sums are in 1/1024 nat, never below
 * 0; a steady rate raises a false alarm about once per e^8 windows of it.
 */
#define VT_NAT 1024
#define VT_CHANGE_H (8 * VT_NAT)
#define VT_X_MAX (32 * VT_ONE)	/* x beyond: every log-likelihood ratio is saturated */

/* log2 of a window of w_us in seconds, Q16: vt_change_step()'s lw, once per window length */
s64 vt_change_lw(u64 w_us)
{
	return vt_log2_q16(clamp_t(u64, w_us, 1, VT_T_MAX)) - vt_log2_q16(VT_US);
}

/* a difference of vt_log2_q16()s in 1/1024 nat: d * ln 2 * 1024 / 2^16, ln 2 = 45426 / 2^16 */
static s64 vt_nats_of_log2(s64 d)
{
	return (d * 45426) >> 22;
}

/* log2 of 1 - e^-x, Q16, x in Q32 (> 0) */
static s64 vt_log2_share(u64 x)
{
	return vt_log2_q16(max_t(u64, vt_share_of_x(x), 1));
}

/* x = r w, Q32: the accesses a rate of code `code` expects in a window of lw */
static u64 vt_change_x(unsigned int code, s64 lw)
{
	u64 x = vt_exp2_q32(((s64)min_t(unsigned int, code, VT_RC_MAX) - VT_RC_1HZ) *
			    (VT_Q16 / VT_RC_PER_OCTAVE) + lw);

	return clamp_t(u64, x, 1, VT_X_MAX);
}

/*
 * One window of a rate of code `code` (the estimate before the window; 0: no rate, nothing
 * to detect) of lw = vt_change_lw(w), young or not. Returns -1 (a drop), +1 (a rise) or 0, and
 * clears both sums on an alarm. dither rounds the idle window's increment (uniform 32 bits).
 */
int vt_change_step(unsigned int code, s64 lw, bool young, u32 dither, u16 *down, u16 *up)
{
	s64 d = *down, u = *up, a;
	u64 x;

	if (!code)
		return 0;
	x = vt_change_x(code, lw);
	if (young) {
		a = vt_log2_share(x);
		u += vt_nats_of_log2(vt_log2_share(x << VT_CHANGE_OCTAVES) - a);
		if (d)	/* the ratio is below 1: a sum at 0 stays there */
			d += vt_nats_of_log2(vt_log2_share(x >> VT_CHANGE_OCTAVES) - a);
	} else {
		d += (s64)((x * (VT_NAT - (VT_NAT >> VT_CHANGE_OCTAVES)) + dither) >> 32);
		u -= (s64)((x * (VT_NAT * ((1 << VT_CHANGE_OCTAVES) - 1))) >> 32);
	}
	d = clamp_t(s64, d, 0, VT_CHANGE_H);
	u = clamp_t(s64, u, 0, VT_CHANGE_H);
	if (d >= VT_CHANGE_H || u >= VT_CHANGE_H) {
		*down = 0;
		*up = 0;
		return d >= VT_CHANGE_H ? -1 : 1;
	}
	*down = d;
	*up = u;
	return 0;
}

/* The chance that a window of lw = vt_change_lw(w) finds a rate of code `code` young, Q32 */
u64 vt_young_chance(unsigned int code, s64 lw)
{
	return code ? vt_share_of_x(vt_change_x(code, lw)) : 0;
}

/*
 * A stalled coarse window: its regions were young fewer than half as often as their rates
 * expect (expected: the sum of their vt_young_chance()s, at least VT_STALL_MIN regions' worth).
 * Independent regions fall that short rarely; a vCPU that did not execute for most of the
 * window (its host preempted it, or stalled it on a page being migrated) makes every region
 * idle at once, and read one by one, each such window is strong evidence of a drop for every
 * busy region: under nested TCG, hot regions alarmed two octaves down together in such windows
 * and warm data took their place (docs/testbed.md, 2026-11-30). Its idle outcomes are not
 * evidence of a drop (vt_coarse_window_done).
 */
bool vt_window_stalled(u64 expected, u64 young)
{
	return expected >= (u64)VT_STALL_MIN * VT_ONE && young * 2 * VT_ONE < expected;
}
