// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * A YCSB-like key-value load for redis-server in the bake-off's nested guest: loads --keys values
 * of --value-bytes, prints "TBREADY keys=N", then runs GETs and SETs (--write-share of them
 * SETs, same-size values) on keys drawn from a zipfian distribution (--theta; YCSB's 0.99) whose
 * ranks are scrambled over the key space, as YCSB's scrambled zipfian does, so the hot keys are
 * not the first ones loaded. Speaks RESP over TCP to 127.0.0.1:--port, --pipeline requests in
 * flight. Every second: TBTPUT <ms since ready> <operations per second>.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int fd;
static char rbuf[1 << 16];
static size_t rlen, rpos;

static void die(const char *what)
{
	fprintf(stderr, "kvload: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static const char *sarg(int argc, char **argv, const char *name, const char *def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return argv[i + 1];
	return def;
}

static uint64_t rnd(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static int next_byte(void)
{
	if (rpos == rlen) {
		ssize_t n = read(fd, rbuf, sizeof(rbuf));

		if (n <= 0)
			die("read from redis");
		rlen = (size_t)n;
		rpos = 0;
	}
	return (unsigned char)rbuf[rpos++];
}

/* Consumes one RESP reply (+simple, -error, :integer or $bulk); fails on an error reply. */
static void read_reply(void)
{
	char line[64];
	size_t n = 0;
	int c;

	while ((c = next_byte()) != '\n')
		if (n + 1 < sizeof(line))
			line[n++] = (char)c;
	line[n] = 0;
	if (line[0] == '-') {
		fprintf(stderr, "kvload: redis: %s\n", line);
		exit(1);
	}
	if (line[0] == '$') {
		long len = strtol(line + 1, NULL, 10);

		for (long i = 0; i < len + 2 && len >= 0; i++)
			next_byte();
	}
}

static void send_all(const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w <= 0)
			die("write to redis");
		p += w;
		n -= (size_t)w;
	}
}

/* Appends a RESP command for key k to out; returns the new length. */
static size_t command(char *out, size_t at, int set, uint64_t k, const char *value, size_t vlen)
{
	char key[32];
	int kl = snprintf(key, sizeof(key), "key:%010llu", (unsigned long long)k);

	if (set)
		return at + (size_t)sprintf(out + at, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%zu\r\n%s\r\n",
					    kl, key, vlen, value);
	return at + (size_t)sprintf(out + at, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", kl, key);
}

int main(int argc, char **argv)
{
	uint64_t keys = strtoull(sarg(argc, argv, "--keys", "100000"), NULL, 0);
	size_t vlen = strtoul(sarg(argc, argv, "--value-bytes", "512"), NULL, 0);
	double theta = strtod(sarg(argc, argv, "--theta", "0.99"), NULL);
	double wshare = strtod(sarg(argc, argv, "--write-share", "0.5"), NULL);
	int port = atoi(sarg(argc, argv, "--port", "6379"));
	int depth = atoi(sarg(argc, argv, "--pipeline", "16"));

	if (!keys || !vlen || vlen > 65536 || !(theta > 0) || wshare < 0 || wshare > 1 || depth < 1 ||
	    depth > 256) {
		fprintf(stderr, "usage: kvload --keys N --value-bytes V (<= 65536) --theta T "
				"--write-share W [--port P] [--pipeline D (1-256)]\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (int tries = 0;; tries++) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			die("socket");
		if (!connect(fd, (struct sockaddr *)&a, sizeof(a)))
			break;
		close(fd);
		if (tries > 600)
			die("connect to redis (60 s)");
		usleep(100000);
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

	char *value = malloc(vlen + 1), *out = malloc((size_t)depth * (vlen + 96));
	double *cdf = malloc(keys * sizeof(*cdf));
	if (!value || !out || !cdf)
		die("malloc");
	for (size_t i = 0; i < vlen; i++)
		value[i] = (char)('a' + i % 26);
	value[vlen] = 0;

	/* load, pipelined */
	for (uint64_t k = 0; k < keys;) {
		size_t at = 0;
		int n = 0;

		for (; n < depth && k < keys; n++, k++)
			at = command(out, at, 1, k, value, vlen);
		send_all(out, at);
		while (n--)
			read_reply();
	}

	/* zipfian over ranks 1..keys, scrambled by a fixed multiplicative permutation */
	double h = 0;
	for (uint64_t r = 0; r < keys; r++) {
		h += pow((double)(r + 1), -theta);
		cdf[r] = h;
	}
	uint64_t mult = 2654435761ULL % keys;
	while (mult < 2)
		mult++;
	for (;;) {
		uint64_t x = mult, y = keys;

		while (y) { /* gcd: the multiplier must be coprime to keys to permute */
			uint64_t t = x % y;
			x = y;
			y = t;
		}
		if (x == 1)
			break;
		mult++;
	}
	printf("TBREADY keys=%llu value_bytes=%zu theta=%g write_share=%g\n",
	       (unsigned long long)keys, vlen, theta, wshare);

	uint64_t s = 0x9e3779b97f4a7c15ULL, t0 = now_ms(), last = t0, ops = 0;
	uint64_t wbelow = (uint64_t)(wshare * 4294967296.0);
	for (;;) {
		size_t at = 0;

		for (int i = 0; i < depth; i++) {
			double u = (double)(rnd(&s) >> 11) / 9007199254740992.0 * h;
			uint64_t lo = 0, hi = keys - 1;

			while (lo < hi) {
				uint64_t mid = (lo + hi) / 2;

				if (cdf[mid] < u)
					lo = mid + 1;
				else
					hi = mid;
			}
			uint64_t key = (lo * mult) % keys;
			at = command(out, at, (rnd(&s) >> 32) < wbelow, key, value, vlen);
		}
		send_all(out, at);
		for (int i = 0; i < depth; i++)
			read_reply();
		ops += (uint64_t)depth;
		uint64_t t = now_ms();
		if (t - last >= 1000) {
			printf("TBTPUT %llu %llu\n", (unsigned long long)(t - t0),
			       (unsigned long long)(ops * 1000 / (t - last)));
			ops = 0;
			last = t;
		}
	}
}
