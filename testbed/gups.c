// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * GUPS with a hot set, for the testbed's nested guest.
 *
 * Allocates --mib MiB of anonymous memory (4 KiB pages: THP off, mlocked so the guest never
 * moves the frames under the ground truth), learns each page's guest frame from
 * /proc/self/pagemap and prints the ground truth on stdout:
 *   TBHOT <first-gfn> <frames>     runs of the hot set's frames
 *   TBCOLD <first-gfn> <frames>    runs of the rest
 *   TBREADY hot=<frames> cold=<frames>
 * (and creates --ready-file if given), then updates random 8-byte words of the first --hot-mib MiB forever (the GUPS loop), and
 * touches the cold pages round-robin so that each is touched once every --cold-period seconds:
 * rarely enough that a tracker's history separates them from the hot set, often enough that
 * they are not simply idle. Every second:
 *   TBTPUT <ms since ready> <updates per second>
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL

static void die(const char *what)
{
	fprintf(stderr, "gups: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static unsigned long arg(int argc, char **argv, const char *name, unsigned long def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return strtoul(argv[i + 1], NULL, 0);
	return def;
}

static const char *sarg(int argc, char **argv, const char *name)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return argv[i + 1];
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Print the frames of pages [first, first + n) as runs of consecutive gfns, sorted: the page
 * allocator hands out frames in shuffled order, and one line per frame through a TCG serial port
 * costs seconds per thousand.
 */
static void print_runs(const char *tag, uint64_t *gfn, size_t first, size_t n)
{
	size_t i = first, end = first + n;

	qsort(gfn + first, n, sizeof(*gfn), cmp_u64);

	while (i < end) {
		size_t k = 1;

		while (i + k < end && gfn[i + k] == gfn[i] + k)
			k++;
		printf("%s %llu %zu\n", tag, (unsigned long long)gfn[i], k);
		i += k;
	}
}

int main(int argc, char **argv)
{
	size_t mib = arg(argc, argv, "--mib", 128), hot_mib = arg(argc, argv, "--hot-mib", 16);
	unsigned long cold_period = arg(argc, argv, "--cold-period", 30);
	size_t pages = mib * 256, hot = hot_mib * 256;

	if (!mib || hot == 0 || hot >= pages || !cold_period) {
		fprintf(stderr, "usage: gups --mib N --hot-mib H (0 < H < N) [--cold-period S]\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	uint8_t *p = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	madvise(p, pages * PAGE, MADV_NOHUGEPAGE);
	for (size_t i = 0; i < pages; i++)
		p[i * PAGE] = 1;
	if (mlock(p, pages * PAGE))
		die("mlock");

	uint64_t *gfn = calloc(pages, sizeof(*gfn));
	int pm = open("/proc/self/pagemap", O_RDONLY);
	if (!gfn || pm < 0)
		die("pagemap");
	for (size_t i = 0; i < pages; i++) {
		uint64_t e;
		off_t off = (off_t)((uintptr_t)(p + i * PAGE) / PAGE) * 8;

		if (pread(pm, &e, 8, off) != 8)
			die("pagemap read");
		if (!(e & (1ULL << 63)) || !(e & ((1ULL << 55) - 1))) {
			fprintf(stderr, "gups: page %zu not present or no PFN (not root?)\n", i);
			return 1;
		}
		gfn[i] = e & ((1ULL << 55) - 1);
	}
	close(pm);
	print_runs("TBHOT", gfn, 0, hot);
	print_runs("TBCOLD", gfn, hot, pages - hot);
	printf("TBREADY hot=%zu cold=%zu\n", hot, pages - hot);
	free(gfn);
	const char *ready = sarg(argc, argv, "--ready-file");
	if (ready) {
		int fd = open(ready, O_CREAT | O_WRONLY, 0644);

		if (fd < 0)
			die("ready file");
		close(fd);
	}

	uint64_t *words = (uint64_t *)p, nwords = hot * PAGE / 8, x = 0x9e3779b97f4a7c15ULL;
	uint64_t t0 = now_ms(), last = t0, updates = 0;
	size_t cold_next = hot, cold = pages - hot;
	double cold_debt = 0;

	for (;;) {
		for (int i = 0; i < 4096; i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			words[x % nwords] ^= x;
		}
		updates += 4096;
		uint64_t t = now_ms();
		if (t - last < 1000)
			continue;
		/* cold pages due since the last report, round-robin */
		cold_debt += (double)cold * (double)(t - last) / (cold_period * 1000.0);
		for (; cold_debt >= 1; cold_debt--) {
			p[cold_next * PAGE + 64]++;
			if (++cold_next == pages)
				cold_next = hot;
		}
		printf("TBTPUT %llu %llu\n", (unsigned long long)(t - t0),
		       (unsigned long long)(updates * 1000 / (t - last)));
		updates = 0;
		last = t;
	}
}
