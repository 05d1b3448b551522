// SPDX-License-Identifier: GPL-2.0
/*
 * vtism e2e workload: a process with a known hot set and a known cold set, run inside the
 * test guest (static binary, busybox initramfs).
 *
 *   vtism-workload run [opts]   hot/cold sets; prints the ground truth (guest frame numbers
 *                               from /proc/self/pagemap) on stdout as "VTGT ..." lines
 *   vtism-workload churn [opts] keeps forking short-lived children that map, touch and exit,
 *                               so address spaces die while the module scans them
 *
 * The hot set is touched continuously (every 20 ms plus the time a pass takes). With
 * --cold-every-ms the cold set is a warm background: each of its pages is touched once every
 * that many milliseconds, the touches spread evenly over the period (what HeMem's GUPS, whose
 * background updates are spread uniformly over its region, looks like to a tracker); without
 * it the whole cold set is touched once
 * every --cold-period rounds of the tracker (read from --rounds-file), so in any single round
 * some cold frames are young and only an estimate over several rounds can tell them from the
 * hot ones. It sits alone in a 1 GiB-aligned block (an idle PUD entry between touches); a
 * second, idle cold set (touched at setup only) sits among the hot mappings (idle PMD entries).
 *
 * Ground-truth lines: "VTGT <class> <type> <dirty> <first-gfn> <frames>", class hot|cold,
 * type anon|file|shmem, dirty 0|1 (was the page ever written through this mapping: the
 * write bit the module must report, from a Dirty bit it never clears), and for THPs
 * "VTGT thp anon 1 <head-gfn> 512"; the idle part of the cold frames once more as
 * "VTGT idle <first-gfn> <frames>". Then "VTGT ready".
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define HUGE (2UL << 20)
#define KPF_THP 22

enum type { T_ANON, T_FILE, T_SHMEM };
static const char *type_name[] = { "anon", "file", "shmem" };

struct region {
	const char *class;
	enum type type;
	int write;	/* the loop writes it (else only reads) */
	int dirty;	/* ground truth: the PTE is dirty (written at least once through it) */
	int thp;
	unsigned char *p;
	size_t pages;
	uint64_t *gfn;	/* frame of each page at setup */
};

static int pagemap_fd = -1;
static volatile sig_atomic_t stop;

static void die(const char *what)
{
	fprintf(stderr, "vtism-workload: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint64_t gfn_of(const void *addr)
{
	uint64_t e;
	off_t off = (off_t)((uintptr_t)addr / PAGE) * 8;

	if (pread(pagemap_fd, &e, 8, off) != 8)
		die("pagemap");
	if (!(e & (1ULL << 63)))
		return 0;
	return e & ((1ULL << 55) - 1);
}

/*
 * Reserve address space inaccessible (PROT_NONE: not committed, never faulted), open an
 * aligned part of it and keep the rest as a guard: nothing else can be mapped in the same
 * aligned block, so e.g. a 1 GiB-aligned region has its PUD entry to itself.
 */
static void *map_aligned(size_t len, size_t align)
{
	unsigned char *p = mmap(NULL, len + 2 * align, PROT_NONE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uintptr_t a;

	if (p == MAP_FAILED)
		die("mmap");
	a = ((uintptr_t)p + align - 1) & ~(align - 1);
	if (mprotect((void *)a, len, PROT_READ | PROT_WRITE))
		die("mprotect");
	return (void *)a;
}

static void setup_anon(struct region *r, int thp, size_t align)
{
	size_t len = r->pages * PAGE;

	r->p = map_aligned(len, align);
	/* THP is "always" in Debian's kernels: keep the 4 KiB sets 4 KiB, the THP set huge */
	if (madvise(r->p, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE))
		die("madvise");
	memset(r->p, 0x5a, len);
}

static void setup_file(struct region *r, const char *dir)
{
	char path[256];
	size_t len = r->pages * PAGE, done = 0;
	unsigned char buf[PAGE];
	int fd;

	snprintf(path, sizeof(path), "%s/vtism-workload.%d", dir, getpid());
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		die(path);
	memset(buf, 0xa5, sizeof(buf));
	/* filled with write(2), mapped read-only: page cache pages whose PTEs are never dirty */
	while (done < len) {
		if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
			die("write");
		done += sizeof(buf);
	}
	r->p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	if (r->p == MAP_FAILED)
		die("mmap file");
	unlink(path);
	close(fd);
	madvise(r->p, len, MADV_NOHUGEPAGE);
}

static void setup_shmem(struct region *r)
{
	size_t len = r->pages * PAGE;
	int fd = memfd_create("vtism-workload", 0);

	if (fd < 0 || ftruncate(fd, (off_t)len))
		die("memfd");
	r->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r->p == MAP_FAILED)
		die("mmap shmem");
	close(fd);
	madvise(r->p, len, MADV_NOHUGEPAGE);
	memset(r->p, 0x3c, len);
}

static unsigned int sum;

static void touch_page(struct region *r, size_t i)
{
	if (r->write)
		r->p[i * PAGE + 64]++;
	else
		sum += r->p[i * PAGE + 64];
}

static void touch(struct region *r)
{
	size_t i;

	for (i = 0; i < r->pages; i++)
		touch_page(r, i);
}

static void record(struct region *r)
{
	size_t i;

	r->gfn = calloc(r->pages, sizeof(*r->gfn));
	if (!r->gfn)
		die("calloc");
	for (i = 0; i < r->pages; i++) {
		r->gfn[i] = gfn_of(r->p + i * PAGE);
		if (!r->gfn[i]) {
			fprintf(stderr, "vtism-workload: %s page %zu not present\n", r->class, i);
			exit(1);
		}
	}
}

/* Print runs of consecutive frames, in either direction, as first-gfn + count. */
static void print_truth(struct region *r, int idle)
{
	size_t i = 0;

	if (r->thp) {
		for (i = 0; i < r->pages; i += 512)
			printf("VTGT thp anon 1 %llu 512\n", (unsigned long long)r->gfn[i]);
		return;
	}
	while (i < r->pages) {
		size_t n = 1;

		while (i + n < r->pages && r->gfn[i + n] == r->gfn[i] + n)
			n++;
		if (idle)
			printf("VTGT idle %llu %zu\n", (unsigned long long)r->gfn[i], n);
		else
			printf("VTGT %s %s %d %llu %zu\n", r->class, type_name[r->type], r->dirty,
			       (unsigned long long)r->gfn[i], n);
		i += n;
	}
}

/* The THP set is only useful if it really is PMD-mapped huge pages. */
static int check_thp(struct region *r)
{
	int fd = open("/proc/kpageflags", O_RDONLY);
	size_t i, j;
	int bad = 0;

	if (fd < 0)
		die("kpageflags");
	for (i = 0; i < r->pages; i += 512) {
		uint64_t f = 0;

		if (pread(fd, &f, 8, (off_t)r->gfn[i] * 8) != 8)
			die("kpageflags read");
		if (!(f & (1ULL << KPF_THP)) || r->gfn[i] % 512)
			bad++;
		for (j = 1; j < 512; j++)
			if (r->gfn[i + j] != r->gfn[i] + j)
				bad++;
	}
	close(fd);
	return bad;
}

/* Frames must not move under the checker: count the pages whose frame changed. */
static size_t moved(struct region *r)
{
	size_t i, n = 0;

	for (i = 0; i < r->pages; i++)
		if (gfn_of(r->p + i * PAGE) != r->gfn[i])
			n++;
	return n;
}

static long read_rounds(int fd)
{
	char buf[32];
	ssize_t n;

	if (fd < 0)
		return -1;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	return strtol(buf, NULL, 10);
}

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static size_t opt(int argc, char **argv, const char *name, size_t def)
{
	int i;

	for (i = 2; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return strtoul(argv[i + 1], NULL, 0);
	return def;
}

static const char *sopt(int argc, char **argv, const char *name, const char *def)
{
	int i;

	for (i = 2; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return argv[i + 1];
	return def;
}

static int run(int argc, char **argv)
{
	struct region r[] = {
		{ "hot", T_ANON, 1, 1, 0, NULL, opt(argc, argv, "--hot-anon", 1024), NULL },
		/* written once at setup, then only read: its Dirty bit must survive every round */
		{ "hot", T_ANON, 0, 1, 0, NULL, opt(argc, argv, "--hot-anon-ro", 256), NULL },
		{ "hot", T_FILE, 0, 0, 0, NULL, opt(argc, argv, "--hot-file", 256), NULL },
		{ "hot", T_SHMEM, 1, 1, 0, NULL, opt(argc, argv, "--hot-shmem", 256), NULL },
		{ "thp", T_ANON, 1, 1, 1, NULL, 512 * opt(argc, argv, "--thp", 2), NULL },
		{ "cold", T_ANON, 1, 1, 0, NULL, opt(argc, argv, "--cold-anon", 4096), NULL },
		/* touched at setup only, among the hot mappings: idle PMD subtrees */
		{ "cold", T_ANON, 1, 1, 0, NULL, opt(argc, argv, "--idle-anon", 1024), NULL },
	};
	const size_t nr = sizeof(r) / sizeof(r[0]), cold = 5;
	long period = (long)opt(argc, argv, "--cold-period", 5);
	long every_ms = (long)opt(argc, argv, "--cold-every-ms", 0);
	const char *rounds_path = sopt(argc, argv, "--rounds-file",
				       "/sys/kernel/vtism_guest/rounds");
	long last_cold = -1, cold_touches = 0;
	struct timespec now, t_start;
	size_t due, warm_done = 0;
	struct timespec nap = { 0, 20 * 1000 * 1000 };
	size_t i, m = 0;
	int rfd, bad;

	signal(SIGTERM, on_term);
	signal(SIGINT, on_term);
	pagemap_fd = open("/proc/self/pagemap", O_RDONLY);
	if (pagemap_fd < 0)
		die("pagemap");

	setup_anon(&r[0], 0, PAGE);
	setup_anon(&r[1], 0, PAGE);
	setup_file(&r[2], sopt(argc, argv, "--file-dir", "/mnt/ramfs"));
	setup_shmem(&r[3]);
	setup_anon(&r[4], 1, HUGE);
	/* next to the hot mappings (mmap goes top-down), before the 2 GiB reservation below */
	setup_anon(&r[6], 0, HUGE);
	/* alone in its 1 GiB: an idle PUD entry the scanner can skip whole */
	setup_anon(&r[5], 0, 1UL << 30);
	for (i = 0; i < nr; i++) {
		touch(&r[i]);	/* fault everything in */
		if (mlock(r[i].p, r[i].pages * PAGE))
			die("mlock");	/* with compact_unevictable_allowed=0: frames stay put */
		record(&r[i]);
	}
	bad = check_thp(&r[4]);
	if (bad)
		printf("VTGT thp-bad %d\n", bad);
	for (i = 0; i < nr; i++)
		print_truth(&r[i], 0);
	print_truth(&r[6], 1);
	printf("VTGT ready\n");
	fflush(stdout);

	rfd = open(rounds_path, O_RDONLY);
	clock_gettime(CLOCK_MONOTONIC, &t_start);
	while (!stop) {
		long rounds;

		for (i = 0; i < cold; i++)
			touch(&r[i]);
		if (every_ms) {
			/* spread over the period, as GUPS's background updates are: each page once */
			clock_gettime(CLOCK_MONOTONIC, &now);
			due = (size_t)(((now.tv_sec - t_start.tv_sec) * 1000 +
					(now.tv_nsec - t_start.tv_nsec) / 1000000) *
				       (long)r[cold].pages / every_ms);
			for (; warm_done < due; warm_done++)
				touch_page(&r[cold], warm_done % r[cold].pages);
			cold_touches = (long)(warm_done / r[cold].pages);
			nanosleep(&nap, NULL);
			continue;
		}
		rounds = read_rounds(rfd);
		if (rounds < 0) {	/* module reloading: reopen */
			if (rfd >= 0)
				close(rfd);
			rfd = open(rounds_path, O_RDONLY);
		} else if (rounds < last_cold || rounds - last_cold >= period) {
			touch(&r[cold]);
			last_cold = rounds;
			cold_touches++;
		}
		nanosleep(&nap, NULL);
	}
	for (i = 0; i < nr; i++)
		m += moved(&r[i]);
	/* THPs must still be whole: the module never splits them */
	printf("VTGT end moved=%zu thp_bad=%d cold_touches=%ld\n", m, check_thp(&r[4]),
	       cold_touches);
	fflush(stdout);
	return sum == 0xdeadbeef;
}

/*
 * Children that map, touch and exit at random moments, forever. Each maps one 4 MiB memfd
 * --size/4 times: many present PTEs (long to scan) for little memory, and keeps them young.
 */
static int churn(int argc, char **argv)
{
	size_t maps = opt(argc, argv, "--size", 256) / 4, len = 4UL << 20;
	unsigned int max_ms = (unsigned int)opt(argc, argv, "--max-ms", 500);
	unsigned int procs = (unsigned int)opt(argc, argv, "--procs", 3), live = 0;
	unsigned long started = 0;

	signal(SIGTERM, on_term);
	srand((unsigned int)getpid());
	while (!stop) {
		while (live < procs && !stop) {
			unsigned int ms = (unsigned int)rand() % (max_ms + 1);
			pid_t pid = fork();

			if (pid < 0)
				die("fork");
			if (pid == 0) {
				struct timespec t0, t;
				unsigned char **p = calloc(maps, sizeof(*p));
				int fd = memfd_create("vtism-churn", 0);
				size_t i, j;

				if (!p || fd < 0 || ftruncate(fd, (off_t)len))
					_exit(1);
				for (i = 0; i < maps; i++) {
					p[i] = mmap(NULL, len, PROT_READ | PROT_WRITE,
						    MAP_SHARED | MAP_POPULATE, fd, 0);
					if (p[i] == MAP_FAILED)
						_exit(1);
				}
				clock_gettime(CLOCK_MONOTONIC, &t0);
				do {
					for (i = 0; i < maps; i++)
						for (j = 0; j < len; j += PAGE)
							sum += p[i][j];
					clock_gettime(CLOCK_MONOTONIC, &t);
				} while ((t.tv_sec - t0.tv_sec) * 1000 +
					 (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
				_exit(0);
			}
			live++;
			started++;
		}
		if (wait(NULL) > 0)
			live--;
	}
	while (live && wait(NULL) > 0)
		live--;
	printf("VTGT churn started=%lu\n", started);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 2 && !strcmp(argv[1], "run"))
		return run(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "churn"))
		return churn(argc, argv);
	fprintf(stderr, "usage: %s run|churn [--opt value ...]\n", argv[0]);
	return 2;
}
