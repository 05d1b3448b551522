// SPDX-License-Identifier: GPL-2.0
/*
 * The DAMON agent's e2e workload (run-damon-e2e.sh): a hot set, a warm background and idle
 * memory, as a GUPS run over a region with a hot set sees them (HeMem's GUPS: a share of the
 * updates goes to a hot set, the rest is spread uniformly over the whole region).
 *
 *   hot    anon, file (mapped read-only), shmem and --thp 2 MiB THPs: every page touched every
 *          --nap-ms (20 ms: about 50 Hz)
 *   warm   anon 4 KiB pages touched only by the uniform updates: at random, --warm-period-ms
 *          apart on average per page (2000: each page about every 2 s)
 *   idle   anon, touched once at setup
 *
 * The uniform updates go over the whole anon region (hot and warm pages alike). Everything is
 * mlocked (with compact_unevictable_allowed=0 the frames stay put). Ground truth on stdout, as
 * guest/tests/workload.c prints it: "VTGT <class> <type> <dirty> <first-gfn> <frames>" with
 * class hot|warm|cold, "VTGT thp anon 1 <head> 512", then "VTGT ready"; every 10 s
 * "VTGT rate <uniform updates per warm page per second>"; at the end "VTGT end moved=<n>
 * thp_bad=<n> ...".
 *
 * usage: vtism-warm [--hot-anon 1024] [--hot-file 256] [--hot-shmem 256] [--thp 2]
 *                   [--warm 4096] [--idle 2048] [--warm-period-ms 2000] [--nap-ms 20]
 *                   [--file-dir /mnt/ramfs]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define HUGE (2UL << 20)
#define KPF_THP 22

struct set {
	const char *class, *type;
	int dirty;
	unsigned char *p;
	size_t pages;
	uint64_t *gfn;
};

static int pagemap_fd = -1;
static volatile sig_atomic_t stop;
static volatile uint64_t sum;

static void die(const char *what)
{
	fprintf(stderr, "vtism-warm: %s: %s\n", what, strerror(errno));
	exit(1);
}

static size_t opt(int argc, char **argv, const char *name, size_t def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return strtoul(argv[i + 1], NULL, 0);
	return def;
}

static const char *sopt(int argc, char **argv, const char *name, const char *def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return argv[i + 1];
	return def;
}

static uint64_t gfn_of(const void *addr)
{
	uint64_t e;

	if (pread(pagemap_fd, &e, 8, (off_t)((uintptr_t)addr / PAGE) * 8) != 8)
		die("pagemap");
	return (e & (1ULL << 63)) ? e & ((1ULL << 55) - 1) : 0;
}

/* An aligned mapping in a PROT_NONE reservation, so nothing else shares its aligned block. */
static unsigned char *map_anon(size_t pages, size_t align, int thp)
{
	size_t len = pages * PAGE;
	unsigned char *r = mmap(NULL, len + 2 * align, PROT_NONE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	unsigned char *p;

	if (r == MAP_FAILED)
		die("mmap");
	p = (unsigned char *)(((uintptr_t)r + align - 1) & ~(align - 1));
	if (mprotect(p, len, PROT_READ | PROT_WRITE))
		die("mprotect");
	if (madvise(p, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE))
		die("madvise");
	memset(p, 0x5a, len);
	return p;
}

static unsigned char *map_file(size_t pages, const char *dir)
{
	char path[256], buf[PAGE];
	unsigned char *p;
	int fd;

	snprintf(path, sizeof(path), "%s/vtism-warm.%d", dir, getpid());
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		die(path);
	memset(buf, 0xa5, sizeof(buf));
	for (size_t i = 0; i < pages; i++)
		if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
			die("write");
	p = mmap(NULL, pages * PAGE, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		die("mmap file");
	close(fd);
	return p;
}

static unsigned char *map_shmem(size_t pages)
{
	unsigned char *p = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE,
				MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap shmem");
	memset(p, 0x3c, pages * PAGE);
	return p;
}

static void touch_page(struct set *s, size_t i)
{
	if (s->dirty)
		s->p[i * PAGE] += 1;
	else
		sum += s->p[i * PAGE];
}

static void record(struct set *s)
{
	s->gfn = malloc(s->pages * sizeof(*s->gfn));
	if (!s->gfn)
		die("malloc");
	for (size_t i = 0; i < s->pages; i++)
		s->gfn[i] = gfn_of(s->p + i * PAGE);
}

static void print_truth(struct set *s)
{
	size_t i = 0;

	while (i < s->pages) {
		size_t n = 1;

		while (i + n < s->pages && s->gfn[i + n] == s->gfn[i] + n)
			n++;
		printf("VTGT %s %s %d %llu %zu\n", s->class, s->type, s->dirty,
		       (unsigned long long)s->gfn[i], n);
		i += n;
	}
}

static int thp_bad(struct set *s)
{
	int fd = open("/proc/kpageflags", O_RDONLY), bad = 0;

	if (fd < 0)
		die("kpageflags");
	for (size_t i = 0; i < s->pages; i += 512) {
		uint64_t f = 0;

		if (pread(fd, &f, 8, (off_t)s->gfn[i] * 8) != 8)
			die("kpageflags read");
		if (!(f & (1ULL << KPF_THP)) || s->gfn[i] % 512)
			bad++;
		for (size_t j = 1; j < 512; j++)
			if (s->gfn[i + j] != s->gfn[i] + j)
				bad++;
	}
	close(fd);
	return bad;
}

static size_t moved(struct set *s)
{
	size_t n = 0;

	for (size_t i = 0; i < s->pages; i++)
		if (gfn_of(s->p + i * PAGE) != s->gfn[i])
			n++;
	return n;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* xorshift64*: the uniform updates' page picks */
static uint64_t rng(void)
{
	static uint64_t x = 0x9e3779b97f4a7c15ULL;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	return x * 0x2545f4914f6cdd1dULL;
}

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

int main(int argc, char **argv)
{
	size_t hot_anon = opt(argc, argv, "--hot-anon", 1024);
	size_t warm = opt(argc, argv, "--warm", 4096);
	double period = opt(argc, argv, "--warm-period-ms", 2000) / 1e3;
	long nap_ms = (long)opt(argc, argv, "--nap-ms", 20);
	struct timespec nap = { nap_ms / 1000, (nap_ms % 1000) * 1000000L };
	/* the anon region: hot pages first, then warm; the uniform updates span both */
	unsigned char *region = map_anon(hot_anon + warm, HUGE, 0);
	struct set s[] = {
		{ "hot", "anon", 1, region, hot_anon, NULL },
		{ "hot", "file", 0, NULL, opt(argc, argv, "--hot-file", 256), NULL },
		{ "hot", "shmem", 1, NULL, opt(argc, argv, "--hot-shmem", 256), NULL },
		{ "thp", "anon", 1, NULL, 512 * opt(argc, argv, "--thp", 2), NULL },
		{ "warm", "anon", 1, region + hot_anon * PAGE, warm, NULL },
		{ "cold", "anon", 1, NULL, opt(argc, argv, "--idle", 2048), NULL },
	};
	const size_t nr = sizeof(s) / sizeof(s[0]), nr_hot = 4;
	double t0, last, last_report, debt = 0;
	uint64_t updates = 0, report_updates = 0;
	size_t i, j, m = 0;

	signal(SIGTERM, on_term);
	signal(SIGINT, on_term);
	pagemap_fd = open("/proc/self/pagemap", O_RDONLY);
	if (pagemap_fd < 0)
		die("pagemap");
	s[1].p = map_file(s[1].pages, sopt(argc, argv, "--file-dir", "/mnt/ramfs"));
	s[2].p = map_shmem(s[2].pages);
	s[3].p = map_anon(s[3].pages, HUGE, 1);
	s[5].p = map_anon(s[5].pages, HUGE, 0);
	for (i = 0; i < nr; i++) {
		for (j = 0; j < s[i].pages; j++)
			touch_page(&s[i], j);
		if (mlock(s[i].p, s[i].pages * PAGE))
			die("mlock");
		record(&s[i]);
	}
	if (thp_bad(&s[3]))
		printf("VTGT thp-bad %d\n", thp_bad(&s[3]));
	for (i = 0; i < nr; i++) {
		if (!strcmp(s[i].class, "thp")) {
			for (j = 0; j < s[i].pages; j += 512)
				printf("VTGT thp anon 1 %llu 512\n", (unsigned long long)s[i].gfn[j]);
		} else {
			print_truth(&s[i]);
		}
	}
	printf("VTGT ready\n");
	fflush(stdout);

	t0 = last = last_report = now_s();
	while (!stop) {
		double t = now_s();

		for (i = 0; i < nr_hot; i++)
			for (j = 0; j < s[i].pages; j++)
				touch_page(&s[i], j);
		/* uniform updates owed since the last pass: 1/period per page of the region */
		debt += (t - last) * (double)(hot_anon + warm) / period;
		last = t;
		while (debt >= 1) {
			size_t k = rng() % (hot_anon + warm);

			region[k * PAGE] += 1;
			debt -= 1;
			updates++;
		}
		if (t - last_report >= 10) {
			printf("VTGT rate %.3f\n", (updates - report_updates) / (t - last_report) /
						       (double)(hot_anon + warm));
			fflush(stdout);
			report_updates = updates;
			last_report = t;
		}
		nanosleep(&nap, NULL);
	}
	for (i = 0; i < nr; i++)
		m += moved(&s[i]);
	printf("VTGT end moved=%zu thp_bad=%d updates=%llu seconds=%.0f\n", m, thp_bad(&s[3]),
	       (unsigned long long)updates, now_s() - t0);
	fflush(stdout);
	return sum == 0xdeadbeef;
}
