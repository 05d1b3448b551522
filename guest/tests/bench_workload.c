// SPDX-License-Identifier: GPL-2.0
/*
 * Static workload for guest/tests/bench.sh (a benchmark, not a test).
 *
 *   bench_workload shape --mb N --hot-chunks-per-64 H --pages-per-chunk P --secs S
 *       mmap N MiB of anonymous memory (no THP, so every page has a PTE), touch all of it once,
 *       print "VTB ready", then for S seconds (0 = until killed) keep writing P pages in each
 *       of H out of every 64 2-MiB chunks (spread evenly). H=64,P=512 is dense (GUPS-like:
 *       every page every pass); H=2,P=8 is sparse (graph-like: a few hot pages in a big
 *       mapped region, most PMDs idle).
 *   bench_workload tput --mb N --secs S
 *       GUPS-like random read-modify-write updates of 8-byte words over N MiB; prints
 *       "VTB tput ops=<n> secs=<s> ops_per_s=<r>" measured with CLOCK_MONOTONIC.
 *       With --slice-ms M --phase-file F (and --secs 0: until killed) it also prints, every
 *       M ms, "VTB slice <phase> ops=<n> secs=<s>" where <phase> is F's first word, read at
 *       the start and at the end of the slice; slices during which it changed, or whose
 *       phase is "x" (a transition), are not printed. For interleaved A/B comparisons in one
 *       process (bench-init.sh, part 3).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define PAGE 4096UL
#define CHUNK (2UL << 20)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static char *map(size_t len)
{
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	madvise(p, len, MADV_NOHUGEPAGE);
	for (size_t o = 0; o < len; o += PAGE)
		p[o] = 1;
	return p;
}

/* The value after option `name`, NULL when absent. */
static const char *sarg(int argc, char **argv, const char *name)
{
	for (int i = 2; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return argv[i + 1];
	return NULL;
}

static long arg(int argc, char **argv, const char *name, long def)
{
	const char *v = sarg(argc, argv, name);

	return v ? atol(v) : def;
}

/* The first word of the phase file, "x" when it cannot be read. */
static void read_phase(const char *path, char out[32])
{
	FILE *f = fopen(path, "r");

	strcpy(out, "x");
	if (f) {
		if (fscanf(f, "%31s", out) != 1)
			strcpy(out, "x");
		fclose(f);
	}
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s shape|tput [--mb N] [--secs S] ...\n", argv[0]);
		return 2;
	}
	size_t len = (size_t)arg(argc, argv, "--mb", 512) << 20;
	long secs = arg(argc, argv, "--secs", 0);
	char *p = map(len);

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "shape")) {
		long h = arg(argc, argv, "--hot-chunks-per-64", 64);
		long ppc = arg(argc, argv, "--pages-per-chunk", 512);
		size_t nchunks = len / CHUNK, stride = 512 / (ppc > 0 ? ppc : 1);
		unsigned long passes = 0;
		double t0 = now();

		printf("VTB ready shape mb=%zu hot_chunks_per_64=%ld pages_per_chunk=%ld\n",
		       len >> 20, h, ppc);
		while (!secs || now() - t0 < secs) {
			for (size_t c = 0; c < nchunks; c++) {
				/* h of every 64 chunks, spread evenly */
				if ((c % 64) * h / 64 == ((c % 64) + 1) * h / 64)
					continue;
				for (long i = 0; i < ppc; i++)
					p[c * CHUNK + i * stride * PAGE]++;
			}
			passes++;
		}
		printf("VTB shape passes=%lu\n", passes);
	} else if (!strcmp(argv[1], "tput")) {
		uint64_t *w = (uint64_t *)p, n = len / 8, x = 88172645463325252ULL, ops = 0;
		double t0 = now(), t;
		long slice_ms = arg(argc, argv, "--slice-ms", 0);
		const char *pf = sarg(argc, argv, "--phase-file");
		char ph0[32], ph1[32];
		uint64_t sops = 0;
		double ts = t0;

		if (slice_ms > 0 && pf)
			read_phase(pf, ph0);

		printf("VTB ready tput mb=%zu\n", len >> 20);
		do {
			for (int i = 0; i < 4096; i++) {
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				w[x % n] += x;
			}
			ops += 4096;
			/*
			 * Unmap a 64-page scratch region now and then: more than the kernel's 33-page
			 * single-flush ceiling, so a full local TLB flush. QEMU TCG resizes its soft
			 * TLB only on a flush; without this, the tracker's own TLB flushes would make
			 * the workload *faster* under TCG (a bigger soft TLB), in no way a hardware
			 * effect. Same cost in every configuration.
			 */
			if (!(ops & 65535)) {
				char *s = mmap(NULL, 64 * PAGE, PROT_READ | PROT_WRITE,
					       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

				if (s != MAP_FAILED) {
					for (size_t o = 0; o < 64 * PAGE; o += PAGE)
						s[o] = 1;
					munmap(s, 64 * PAGE);
				}
			}
			t = now() - t0;
			if (slice_ms > 0 && pf && (t0 + t - ts) * 1000 >= slice_ms) {
				read_phase(pf, ph1);
				if (!strcmp(ph0, ph1) && strcmp(ph0, "x"))
					printf("VTB slice %s ops=%llu secs=%.3f\n", ph0,
					       (unsigned long long)(ops - sops), t0 + t - ts);
				strcpy(ph0, ph1);
				sops = ops;
				ts = t0 + t;
			}
		} while (!secs || t < secs);
		printf("VTB tput ops=%llu secs=%.3f ops_per_s=%.0f\n", (unsigned long long)ops, t,
		       ops / t);
	} else {
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		return 2;
	}
	return 0;
}
