// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * GUPS with a hot set, for the testbed's and the bake-off's nested guest.
 *
 * Allocates --mib MiB of anonymous memory (4 KiB pages: THP off, mlocked so the guest never
 * moves the frames under the ground truth), learns each page's guest frame from
 * /proc/self/pagemap and prints the ground truth on stdout:
 *   TBHOT <first-gfn> <frames>     runs of the hot set's frames
 *   TBCOLD <first-gfn> <frames>    runs of the rest
 *   TBNEXT <first-gfn> <frames>    with --move-after: runs of the hot set after the move
 *   TBREADY hot=<frames> cold=<frames>
 * (and creates --ready-file if given), then updates random 8-byte words forever (the GUPS loop):
 *   - a share --uniform-share of the updates goes to random words of the whole region (HeMem's
 *     GUPS: the background that keeps every page warm), the rest to the hot set (the first
 *     --hot-mib MiB; --hot-mib may equal --mib: everything is hot);
 *   - with --cold-period S, each cold page is also touched once every S seconds, round-robin
 *     (0: never), but never more touches than a tenth of the updates since the last report:
 *     a vCPU too slow for both would otherwise spend itself on touches (each one a TLB miss)
 *     and leave the hot set colder than the cold pages (the testbed's nested guest, 2026-11-27:
 *     1-2 thousand updates/s against 10,240 touches/s); the hot set stays some 24 times as hot
 *     per page as the rest, as at 0.1 M updates/s, and touches not made are not owed;
 *   - with --move-after S, the hot set jumps S seconds after TBREADY to the middle of the region
 *     (as HeMem's and the simulator's moving hot set do) and the workload prints
 *     TBMOVE <ms since ready>;
 *   - with --warm-after S, the background above starts only S seconds after TBREADY (before
 *     the move, if any): until then every update goes to the hot set and each cold page is
 *     touched every --calm-cold-period seconds (60); the workload prints TBWARM <ms since ready>.
 *     One run then holds a calm case and a warm one.
 * Every second:
 *   TBTPUT <ms since ready> <updates per second> <of them uniform> <cold touches per second>
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

static const char *sarg(int argc, char **argv, const char *name)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return argv[i + 1];
	return NULL;
}

static unsigned long arg(int argc, char **argv, const char *name, unsigned long def)
{
	const char *v = sarg(argc, argv, name);

	return v ? strtoul(v, NULL, 0) : def;
}

static double farg(int argc, char **argv, const char *name, double def)
{
	const char *v = sarg(argc, argv, name);

	return v ? strtod(v, NULL) : def;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Print the frames of pages [first, first + n) as runs of consecutive gfns, sorted: the page
 * allocator hands out frames in shuffled order, and one line per frame through a TCG serial port
 * costs seconds per thousand. Sorts a copy: the caller's page order stays.
 */
static void print_runs(const char *tag, const uint64_t *gfn, size_t first, size_t n)
{
	uint64_t *s = malloc(n * sizeof(*s));
	size_t i = 0;

	if (!s)
		die("malloc");
	memcpy(s, gfn + first, n * sizeof(*s));
	qsort(s, n, sizeof(*s), cmp_u64);
	while (i < n) {
		size_t k = 1;

		while (i + k < n && s[i + k] == s[i] + k)
			k++;
		printf("%s %llu %zu\n", tag, (unsigned long long)s[i], k);
		i += k;
	}
	free(s);
}

static inline uint64_t xorshift(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

int main(int argc, char **argv)
{
	size_t mib = arg(argc, argv, "--mib", 128), hot_mib = arg(argc, argv, "--hot-mib", 16);
	unsigned long cold_period = arg(argc, argv, "--cold-period", 30);
	unsigned long move_after = arg(argc, argv, "--move-after", 0);
	unsigned long warm_after = arg(argc, argv, "--warm-after", 0);
	unsigned long calm_cold_period = arg(argc, argv, "--calm-cold-period", 60);
	double uniform = farg(argc, argv, "--uniform-share", 0);
	size_t pages = mib * 256, hot = hot_mib * 256;

	if (!mib || hot == 0 || hot > pages || !(uniform >= 0 && uniform < 1) ||
	    (move_after && hot * 2 > pages) || (warm_after && move_after && warm_after >= move_after)) {
		fprintf(stderr, "usage: gups --mib N --hot-mib H (0 < H <= N) [--cold-period S (0: off)]\n"
				"            [--uniform-share F (0 <= F < 1)] [--move-after S (needs 2H <= N)]\n"
				"            [--warm-after S (before the move) [--calm-cold-period S]]\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	uint8_t *p = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	madvise(p, pages * PAGE, MADV_NOHUGEPAGE);
	/* mlock faults the (private, writable) pages in for writing inside one system call: a
	 * page fault per page is far dearer in the nested guest, twice emulated */
	if (mlock(p, pages * PAGE))
		die("mlock");

	/* the whole range in as few reads as the kernel allows, not a syscall per page: each is a
	 * trip through a twice-emulated kernel in the nested guest */
	uint64_t *gfn = calloc(pages, sizeof(*gfn));
	int pm = open("/proc/self/pagemap", O_RDONLY);
	if (!gfn || pm < 0)
		die("pagemap");
	for (size_t done = 0; done < pages * 8;) {
		off_t off = (off_t)((uintptr_t)p / PAGE) * 8 + (off_t)done;
		ssize_t n = pread(pm, (uint8_t *)gfn + done, pages * 8 - done, off);

		if (n <= 0 || n % 8)
			die("pagemap read");
		done += (size_t)n;
	}
	for (size_t i = 0; i < pages; i++) {
		uint64_t e = gfn[i];

		if (!(e & (1ULL << 63)) || !(e & ((1ULL << 55) - 1))) {
			fprintf(stderr, "gups: page %zu not present or no PFN (not root?)\n", i);
			return 1;
		}
		gfn[i] = e & ((1ULL << 55) - 1);
	}
	close(pm);
	/* the moved hot set sits in the middle of the region, as in the simulator's model */
	size_t next = (pages - hot) / 2;
	print_runs("TBHOT", gfn, 0, hot);
	if (hot < pages)
		print_runs("TBCOLD", gfn, hot, pages - hot);
	if (move_after)
		print_runs("TBNEXT", gfn, next, hot);
	printf("TBREADY hot=%zu cold=%zu\n", hot, pages - hot);
	free(gfn);
	const char *ready = sarg(argc, argv, "--ready-file");
	if (ready) {
		int fd = open(ready, O_CREAT | O_WRONLY, 0644);

		if (fd < 0)
			die("ready file");
		close(fd);
	}

	uint64_t *all = (uint64_t *)p, nall = pages * PAGE / 8, nhot = hot * PAGE / 8;
	uint64_t *hotw = all, x = 0x9e3779b97f4a7c15ULL, y = 0xd1b54a32d192ed03ULL;
	/* an update is uniform when the top 32 bits of y fall below this; calm: none is */
	uint64_t warm_uniform_below = (uint64_t)(uniform * 4294967296.0);
	uint64_t uniform_below = warm_after ? 0 : warm_uniform_below;
	unsigned long warm_cold_period = cold_period;

	if (warm_after)
		cold_period = calm_cold_period;
	uint64_t t0 = now_ms(), last = t0, updates = 0, uniform_updates = 0, touches = 0;
	/* round-robin over the pages outside the hot set in force */
	size_t cold_next = 0, hot_first = 0;
	double cold_debt = 0;
	int moved = 0;

	for (;;) {
		for (int i = 0; i < 4096; i++) {
			uint64_t r = xorshift(&x);

			if ((xorshift(&y) >> 32) < uniform_below) {
				all[r % nall] ^= r;
				uniform_updates++;
			} else {
				hotw[r % nhot] ^= r;
			}
		}
		updates += 4096;
		uint64_t t = now_ms();
		if (t - last < 1000)
			continue;
		if (warm_after && t - t0 >= warm_after * 1000) {
			warm_after = 0;
			uniform_below = warm_uniform_below;
			cold_period = warm_cold_period;
			printf("TBWARM %llu\n", (unsigned long long)(t - t0));
		}
		if (move_after && !moved && t - t0 >= move_after * 1000) {
			moved = 1;
			hot_first = next;
			hotw = all + next * PAGE / 8;
			printf("TBMOVE %llu\n", (unsigned long long)(t - t0));
		}
		/* cold pages due since the last report, round-robin, skipping the hot set */
		if (cold_period && hot < pages) {
			cold_debt += (double)(pages - hot) * (double)(t - last) / (cold_period * 1000.0);
			if (cold_debt > updates / 10.0)
				cold_debt = updates / 10.0;
			for (; cold_debt >= 1; cold_debt--) {
				for (;;) {
					if (cold_next >= pages)
						cold_next = 0;
					if (cold_next < hot_first || cold_next >= hot_first + hot)
						break;
					cold_next = hot_first + hot;
				}
				p[cold_next * PAGE + 64]++;
				touches++;
				cold_next++;
			}
		}
		printf("TBTPUT %llu %llu %llu %llu\n", (unsigned long long)(t - t0),
		       (unsigned long long)(updates * 1000 / (t - last)),
		       (unsigned long long)(uniform_updates * 1000 / (t - last)),
		       (unsigned long long)(touches * 1000 / (t - last)));
		updates = uniform_updates = touches = 0;
		last = t;
	}
}
