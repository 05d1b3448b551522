// SPDX-License-Identifier: GPL-2.0
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
 * Built into the module and, with VT_RATE_USERSPACE, into vtism_rate_test.c and
 * guest/tests/bench_rate.c.
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
