/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * The kernel helpers vtism_rate.c uses, for building it in user space: its test
 * (vtism_rate_test.c), its benchmark (guest/tests/bench_rate.c) and the simulator
 * (crates/sim/csrc/vtism_rate_sim.c). Include this, then vtism_rate.c.
 */
#ifndef VTISM_RATE_USER_H
#define VTISM_RATE_USER_H

#include <stdbool.h>
#include <stdint.h>

typedef uint64_t u64;
typedef int64_t s64;
typedef uint32_t u32;
typedef uint16_t u16;
typedef uint8_t u8;
static inline int fls64(u64 x) { return x ? 64 - __builtin_clzll(x) : 0; }
#define min_t(t, a, b) ((t)(a) < (t)(b) ? (t)(a) : (t)(b))
#define max_t(t, a, b) ((t)(a) > (t)(b) ? (t)(a) : (t)(b))
#define clamp_t(t, v, lo, hi) min_t(t, max_t(t, v, lo), hi)
#define S64_MIN INT64_MIN
#define min(a, b) ((a) < (b) ? (a) : (b))
static inline u64 div_u64(u64 a, u32 b) { return a / b; }
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define VT_RATE_USERSPACE

#endif /* VTISM_RATE_USER_H */
