/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * Checks guest/module/vtism_channel.h against the shared vectors in tests/vectors/channel/:
 *
 *  (a) every region is rebuilt from vectors.json with the header's writer helpers
 *      (vtism_ch_init, vtism_ch_begin_round/end_round, vtism_entry_make) plus the listed pokes,
 *      and must be byte-identical to the .bin the Rust writer produced;
 *  (b) a small validating reader written here from docs/channel.md judges every .bin, and its
 *      verdict (decoded round, nothing new, or reject code/label/entry) must match vectors.json;
 *  (c) the rate-level helpers (vtism_ch_level_of_rate, vtism_ch_level_of_share) return the levels
 *      of vectors.json's rate_levels and share_levels, which vtism_proto::count computed.
 *
 * Usage: channel_vectors [vectors-dir]   (default ../vectors/channel)
 * Prints one line per failure and ends with "N passed, N failed"; exits 1 on any failure.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vtism_channel.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "vectors are little-endian; so is this test");

/* ------------------------------------------------------------------------------------------ */
/* A small strict JSON parser: objects, arrays, strings, non-negative integers, true/false/null. */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jval {
	enum jtype type;
	int boolean;
	uint64_t num;
	char *str;
	size_t n;		/* items in an array or object */
	struct jval *items;	/* array items, or object values */
	char **keys;		/* object keys */
};

struct jparser {
	const char *s;
	size_t len;
	size_t pos;
	int depth;
	char err[160];
};

static int jfail(struct jparser *p, const char *what)
{
	if (!p->err[0])
		snprintf(p->err, sizeof(p->err), "JSON error at byte %zu: %s", p->pos, what);
	return -1;
}

static void jskip_ws(struct jparser *p)
{
	while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\n' ||
				   p->s[p->pos] == '\r' || p->s[p->pos] == '\t'))
		p->pos++;
}

static int jlit(struct jparser *p, const char *lit)
{
	size_t n = strlen(lit);

	if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0)
		return jfail(p, "bad literal");
	p->pos += n;
	return 0;
}

static int jstring(struct jparser *p, char **out)
{
	size_t cap = 16, n = 0;
	char *buf;

	if (p->pos >= p->len || p->s[p->pos] != '"')
		return jfail(p, "expected string");
	p->pos++;
	buf = malloc(cap);
	if (!buf)
		return jfail(p, "out of memory");
	for (;;) {
		char c;

		if (p->pos >= p->len) {
			free(buf);
			return jfail(p, "unterminated string");
		}
		c = p->s[p->pos++];
		if (c == '"')
			break;
		if ((unsigned char)c < 0x20) {
			free(buf);
			return jfail(p, "control character in string");
		}
		if (c == '\\') {
			if (p->pos >= p->len) {
				free(buf);
				return jfail(p, "bad escape");
			}
			c = p->s[p->pos++];
			switch (c) {
			case '"': case '\\': case '/': break;
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'n': c = '\n'; break;
			case 'r': c = '\r'; break;
			case 't': c = '\t'; break;
			case 'u': {
				unsigned v = 0;
				int i;

				for (i = 0; i < 4; i++) {
					char h = p->pos < p->len ? p->s[p->pos++] : 0;

					v <<= 4;
					if (h >= '0' && h <= '9')
						v |= (unsigned)(h - '0');
					else if (h >= 'a' && h <= 'f')
						v |= (unsigned)(h - 'a' + 10);
					else if (h >= 'A' && h <= 'F')
						v |= (unsigned)(h - 'A' + 10);
					else {
						free(buf);
						return jfail(p, "bad \\u escape");
					}
				}
				if (v == 0 || v > 0x7f) {
					free(buf);
					return jfail(p, "only ASCII \\u escapes are supported");
				}
				c = (char)v;
				break;
			}
			default:
				free(buf);
				return jfail(p, "bad escape");
			}
		}
		if (n + 1 >= cap) {
			char *nb = realloc(buf, cap * 2);

			if (!nb) {
				free(buf);
				return jfail(p, "out of memory");
			}
			buf = nb;
			cap *= 2;
		}
		buf[n++] = c;
	}
	buf[n] = 0;
	*out = buf;
	return 0;
}

static int jnumber(struct jparser *p, uint64_t *out)
{
	uint64_t v = 0;
	size_t start = p->pos;

	if (p->pos < p->len && p->s[p->pos] == '-')
		return jfail(p, "negative numbers are not used by the vectors");
	while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
		unsigned d = (unsigned)(p->s[p->pos] - '0');

		if (v > (UINT64_MAX - d) / 10)
			return jfail(p, "integer overflows 64 bits");
		v = v * 10 + d;
		p->pos++;
	}
	if (p->pos == start)
		return jfail(p, "expected a value");
	if (p->s[start] == '0' && p->pos - start > 1)
		return jfail(p, "leading zero");
	if (p->pos < p->len && (p->s[p->pos] == '.' || p->s[p->pos] == 'e' || p->s[p->pos] == 'E'))
		return jfail(p, "only integers are supported");
	*out = v;
	return 0;
}

static void jfree(struct jval *v);

static int jvalue(struct jparser *p, struct jval *v)
{
	memset(v, 0, sizeof(*v));
	jskip_ws(p);
	if (p->pos >= p->len)
		return jfail(p, "unexpected end");
	if (++p->depth > 32)
		return jfail(p, "nesting too deep");
	switch (p->s[p->pos]) {
	case 'n':
		v->type = J_NULL;
		if (jlit(p, "null"))
			return -1;
		break;
	case 't':
		v->type = J_BOOL;
		v->boolean = 1;
		if (jlit(p, "true"))
			return -1;
		break;
	case 'f':
		v->type = J_BOOL;
		if (jlit(p, "false"))
			return -1;
		break;
	case '"':
		v->type = J_STR;
		if (jstring(p, &v->str))
			return -1;
		break;
	case '[':
	case '{': {
		int obj = p->s[p->pos] == '{';
		char close = obj ? '}' : ']';
		size_t cap = 0;

		v->type = obj ? J_OBJ : J_ARR;
		p->pos++;
		jskip_ws(p);
		if (p->pos < p->len && p->s[p->pos] == close) {
			p->pos++;
			break;
		}
		for (;;) {
			char *key = NULL;

			if (v->n == cap) {
				size_t nc = cap ? cap * 2 : 8;
				struct jval *ni = realloc(v->items, nc * sizeof(*ni));

				if (!ni)
					return jfail(p, "out of memory");
				v->items = ni;
				if (obj) {
					char **nk = realloc(v->keys, nc * sizeof(*nk));

					if (!nk)
						return jfail(p, "out of memory");
					v->keys = nk;
				}
				cap = nc;
			}
			if (obj) {
				jskip_ws(p);
				if (jstring(p, &key))
					return -1;
				jskip_ws(p);
				if (p->pos >= p->len || p->s[p->pos] != ':') {
					free(key);
					return jfail(p, "expected ':'");
				}
				p->pos++;
				v->keys[v->n] = key;
			}
			if (jvalue(p, &v->items[v->n])) {
				v->n++; /* so jfree releases the partial item */
				return -1;
			}
			v->n++;
			jskip_ws(p);
			if (p->pos < p->len && p->s[p->pos] == ',') {
				p->pos++;
				continue;
			}
			if (p->pos < p->len && p->s[p->pos] == close) {
				p->pos++;
				break;
			}
			return jfail(p, "expected ',' or a closing bracket");
		}
		break;
	}
	default:
		v->type = J_NUM;
		if (jnumber(p, &v->num))
			return -1;
	}
	p->depth--;
	return 0;
}

static void jfree(struct jval *v)
{
	size_t i;

	if (!v)
		return;
	for (i = 0; i < v->n; i++) {
		jfree(&v->items[i]);
		if (v->keys)
			free(v->keys[i]);
	}
	free(v->items);
	free(v->keys);
	free(v->str);
}

/* ------------------------------------------------------------------------------------------ */
/* Typed access. A schema error aborts the vector with a message, never the whole run. */

struct ctx {
	const char *vector;
	char err[256];
};

static int cfail(struct ctx *c, const char *fmt, ...)
{
	va_list ap;

	if (!c->err[0]) {
		va_start(ap, fmt);
		vsnprintf(c->err, sizeof(c->err), fmt, ap);
		va_end(ap);
	}
	return -1;
}

static const struct jval *jget(const struct jval *o, const char *key)
{
	size_t i;

	if (!o || o->type != J_OBJ)
		return NULL;
	for (i = 0; i < o->n; i++)
		if (strcmp(o->keys[i], key) == 0)
			return &o->items[i];
	return NULL;
}

static int get_u64(struct ctx *c, const struct jval *o, const char *key, uint64_t *out)
{
	const struct jval *v = jget(o, key);

	if (!v || v->type != J_NUM)
		return cfail(c, "field '%s' missing or not an integer", key);
	*out = v->num;
	return 0;
}

static int get_u32(struct ctx *c, const struct jval *o, const char *key, uint32_t *out)
{
	uint64_t v = 0;

	if (get_u64(c, o, key, &v))
		return -1;
	if (v > UINT32_MAX)
		return cfail(c, "field '%s' exceeds 32 bits", key);
	*out = (uint32_t)v;
	return 0;
}

static int get_bool(struct ctx *c, const struct jval *o, const char *key, int *out)
{
	const struct jval *v = jget(o, key);

	if (!v || v->type != J_BOOL)
		return cfail(c, "field '%s' missing or not a boolean", key);
	*out = v->boolean;
	return 0;
}

static const char *get_str(struct ctx *c, const struct jval *o, const char *key)
{
	const struct jval *v = jget(o, key);

	if (!v || v->type != J_STR) {
		cfail(c, "field '%s' missing or not a string", key);
		return NULL;
	}
	return v->str;
}

static const struct jval *get_arr(struct ctx *c, const struct jval *o, const char *key)
{
	const struct jval *v = jget(o, key);

	if (!v || v->type != J_ARR) {
		cfail(c, "field '%s' missing or not an array", key);
		return NULL;
	}
	return v;
}

static int page_type_of(struct ctx *c, const char *name, unsigned *out)
{
	static const char *const names[] = { "unknown", "anon", "file", "shmem" };
	unsigned i;

	for (i = 0; i < 4; i++) {
		if (strcmp(name, names[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	return cfail(c, "unknown page type '%s'", name);
}

/* An entry described in JSON, as the C helper builds it. */
static int entry_from_json(struct ctx *c, const struct jval *e, vtism_u64 *out)
{
	uint64_t gfn = 0;
	uint32_t count = 0;
	int write = 0, huge = 0, young = 0;
	unsigned type = 0;
	const char *tname;

	if (get_u64(c, e, "gfn", &gfn) || get_u32(c, e, "count", &count) ||
	    get_bool(c, e, "write", &write) || get_bool(c, e, "huge", &huge) ||
	    get_bool(c, e, "young", &young))
		return -1;
	tname = get_str(c, e, "type");
	if (!tname || page_type_of(c, tname, &type))
		return -1;
	if (gfn > VTISM_ENTRY_GFN_MASK || count > 255)
		return cfail(c, "entry field out of range");
	*out = vtism_entry_make(gfn, count, write, type, huge, young);
	return 0;
}

static int parse_hex(struct ctx *c, const char *s, uint64_t *out)
{
	uint64_t v = 0;
	int digits = 0;

	if (strncmp(s, "0x", 2) != 0)
		return cfail(c, "poke value '%s' is not 0x-hex", s);
	for (s += 2; *s; s++, digits++) {
		unsigned d;

		if (*s >= '0' && *s <= '9')
			d = (unsigned)(*s - '0');
		else if (*s >= 'a' && *s <= 'f')
			d = (unsigned)(*s - 'a' + 10);
		else if (*s >= 'A' && *s <= 'F')
			d = (unsigned)(*s - 'A' + 10);
		else
			return cfail(c, "bad hex digit in poke value");
		if (digits >= 16)
			return cfail(c, "poke value exceeds 64 bits");
		v = v << 4 | d;
	}
	if (!digits)
		return cfail(c, "empty poke value");
	*out = v;
	return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* (a) Rebuild a region with the header's writer helpers. */

static int rebuild(struct ctx *c, const struct jval *v, uint8_t **out, size_t *out_len)
{
	uint64_t region_size = 0, file_len = 0, buf_len, alloc_len;
	uint32_t tracker = 0, version_minor = 0;
	const struct jval *fb, *rounds, *pokes;
	struct vtism_ch_header *h;
	uint8_t *buf;
	vtism_u64 cap;
	size_t r, i;

	if (get_u64(c, v, "region_size", &region_size) || get_u64(c, v, "file_len", &file_len) ||
	    get_u32(c, v, "tracker", &tracker) || get_u32(c, v, "version_minor", &version_minor))
		return -1;
	if (version_minor > VTISM_CH_VERSION_MINOR)
		return cfail(c, "a v1.%u writer cannot be rebuilt", version_minor);
	buf_len = region_size > file_len ? region_size : file_len;
	if (buf_len > (64u << 20))
		return cfail(c, "region of %llu bytes is too large for a vector", (unsigned long long)buf_len);
	alloc_len = (buf_len + 4095) & ~(uint64_t)4095;
	if (alloc_len < VTISM_CH_HEADER_SIZE)
		alloc_len = VTISM_CH_HEADER_SIZE;
	buf = aligned_alloc(4096, (size_t)alloc_len);
	if (!buf)
		return cfail(c, "out of memory");
	memset(buf, 0, (size_t)alloc_len);
	h = (struct vtism_ch_header *)buf;

	fb = jget(v, "feedback");
	if (fb && fb->type == J_OBJ) {
		/* The host's block as the host left it; init is told to preserve it. */
		if (get_u64(c, fb, "host_seq", &h->host_seq) || get_u64(c, fb, "ack_round", &h->ack_round) ||
		    get_u64(c, fb, "entry_budget", &h->entry_budget) ||
		    get_u32(c, fb, "min_interval_ms", &h->min_interval_ms) ||
		    get_u32(c, fb, "last_status", &h->last_status) ||
		    get_u64(c, fb, "fast_quota_bytes", &h->fast_quota_bytes) ||
		    get_u64(c, fb, "rejected_rounds", &h->rejected_rounds) ||
		    get_u32(c, fb, "host_version", &h->host_version))
			goto fail;
	} else if (fb && fb->type != J_NULL) {
		cfail(c, "feedback is neither an object nor null");
		goto fail;
	}
	cap = vtism_ch_init(h, region_size, tracker, fb && fb->type == J_OBJ);
	if (cap == 0) {
		cfail(c, "vtism_ch_init refused region_size %llu", (unsigned long long)region_size);
		goto fail;
	}
	/* The header writes v1.1; an old guest (v1.0) differs only in its minor version and in
	 * leaving the v1.1 fields zero, which its all-zero round metadata does. */
	if (version_minor == 0)
		VTISM_STORE(&h->version_minor, 0);

	rounds = get_arr(c, v, "rounds");
	if (!rounds)
		goto fail;
	for (r = 0; r < rounds->n; r++) {
		const struct jval *ro = &rounds->items[r], *ents = get_arr(c, ro, "entries");
		const struct jval *rep = jget(ro, "tracker_report");
		struct vtism_ch_round_meta m;
		vtism_u64 seq;

		memset(&m, 0, sizeof(m));
		if (!ents || get_u32(c, ro, "flags", &m.flags) ||
		    get_u32(c, ro, "scan_interval_ms", &m.scan_interval_ms) ||
		    get_u32(c, ro, "scan_duration_us", &m.scan_duration_us) ||
		    get_u64(c, ro, "tracked_bytes", &m.tracked_bytes) ||
		    get_u64(c, ro, "hot_frames", &m.hot_frames) ||
		    get_u64(c, ro, "publish_time_ns", &m.publish_time_ns))
			goto fail;
		if (!rep) {
			cfail(c, "round %zu has no tracker_report (null for a v1.0 writer)", r);
			goto fail;
		}
		if (rep->type == J_OBJ) {
			if (get_u32(c, rep, "window_us", &m.window_us) ||
			    get_u32(c, rep, "windows", &m.windows) ||
			    get_u32(c, rep, "tracker_cpu_us", &m.tracker_cpu_us) ||
			    get_u32(c, rep, "coarse_window_us", &m.coarse_window_us) ||
			    get_u64(c, rep, "tracked_frames", &m.tracked_frames))
				goto fail;
		} else if (rep->type != J_NULL) {
			cfail(c, "round %zu: tracker_report is neither an object nor null", r);
			goto fail;
		}
		if (ents->n > cap) {
			cfail(c, "round %zu has %zu entries, capacity %llu", r, ents->n, (unsigned long long)cap);
			goto fail;
		}
		seq = vtism_ch_begin_round(h);
		for (i = 0; i < ents->n; i++) {
			vtism_u64 e = 0;

			if (entry_from_json(c, &ents->items[i], &e))
				goto fail;
			VTISM_STORE(&vtism_ch_entries(h)[i], e);
		}
		m.count = ents->n;
		vtism_ch_end_round(h, seq, &m);
	}

	pokes = get_arr(c, v, "pokes");
	if (!pokes)
		goto fail;
	for (i = 0; i < pokes->n; i++) {
		const struct jval *pk = &pokes->items[i];
		uint64_t off = 0, val = 0;
		uint32_t size = 0;
		const char *hex = get_str(c, pk, "value");

		if (!hex || get_u64(c, pk, "offset", &off) || get_u32(c, pk, "size", &size) ||
		    parse_hex(c, hex, &val))
			goto fail;
		if ((size != 4 && size != 8) || off % size || off > buf_len || buf_len - off < size) {
			cfail(c, "poke %zu (%u bytes at %llu) is outside the region", i, size,
			      (unsigned long long)off);
			goto fail;
		}
		if (size == 8) {
			memcpy(buf + off, &val, 8);
		} else {
			uint32_t v32 = (uint32_t)val;

			memcpy(buf + off, &v32, 4);
		}
	}
	*out = buf;
	*out_len = (size_t)file_len;
	return 0;
fail:
	free(buf);
	return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* (b) A validating reader, written from docs/channel.md. */

struct range { uint64_t start, end; };

struct verdict {
	enum { V_OK, V_NONE, V_ERROR } result;
	unsigned code;
	int64_t entry_index;	/* -1 when the error is not about an entry */
	/* decoded round (V_OK) */
	uint64_t seq, round;
	unsigned version_minor;
	uint32_t tracker, flags, scan_interval_ms, scan_duration_us;
	uint64_t tracked_bytes, hot_frames, publish_time_ns;
	/* v1.1 fields: has_report is 0 for a v1.0 writer, which has none */
	int has_report;
	uint32_t window_us, windows, tracker_cpu_us, coarse_window_us;
	uint64_t tracked_frames;
	uint64_t count;
	vtism_u64 *entries;
};

static const char *const labels[] = {
	"ok", "region_too_small", "bad_magic", "unsupported_version", "bad_layout",
	"capacity_beyond_region", "count_beyond_capacity", "write_in_progress", "torn_round",
	"reserved_header_bits", "reserved_entry_bits", "gfn_out_of_range", "misaligned_huge",
};

static uint64_t ld64(const uint8_t *b, size_t off)
{
	uint64_t v = 0;

	memcpy(&v, b + off, 8);
	return v;
}

static uint32_t ld32(const uint8_t *b, size_t off)
{
	uint32_t v;

	memcpy(&v, b + off, 4);
	return v;
}

/* Every frame of [gfn, gfn + frames) is in some range; ranges are sorted. */
static int all_ram(const struct range *map, size_t n, uint64_t gfn, uint64_t frames)
{
	uint64_t end = gfn + frames; /* gfn < 2^40: no overflow */
	size_t k;

	for (k = 0; k < n; k++)
		if (map[k].start <= gfn && gfn < map[k].end)
			break;
	for (; k < n; k++) {
		if (end <= map[k].end)
			return 1;
		if (k + 1 >= n || map[k + 1].start != map[k].end)
			return 0;
	}
	return 0;
}

static struct verdict verror(unsigned code, int64_t index)
{
	struct verdict v;

	memset(&v, 0, sizeof(v));
	v.result = V_ERROR;
	v.code = code;
	v.entry_index = index;
	return v;
}

/*
 * Judge a region as a fresh reader (last round taken = last_round). `region` is the host's view
 * of shared memory: the copy below is what gets validated, as the spec requires.
 */
static struct verdict c_read(const uint8_t *region, size_t mapped, const struct range *map, size_t nmap,
			     uint64_t last_round)
{
	uint8_t hdr[0x800];
	struct verdict v;
	uint64_t s1, s2, magic, region_size, capacity, count, i;
	uint32_t header_size, entries_offset, entry_size, page_shift, minor, major, flags;

	memset(&v, 0, sizeof(v));
	v.entry_index = -1;
	if (mapped < VTISM_CH_HEADER_SIZE)
		return verror(VTISM_CH_REGION_TOO_SMALL, -1);
	s1 = ld64(region, 0x40);
	if (s1 & 1)
		return verror(VTISM_CH_WRITE_IN_PROGRESS, -1);
	memcpy(hdr, region, sizeof(hdr));

	magic = ld64(hdr, 0x00);
	if (magic != VTISM_CH_MAGIC)
		return verror(VTISM_CH_BAD_MAGIC, -1);
	major = ld32(hdr, 0x08) & 0xffff;
	minor = ld32(hdr, 0x08) >> 16;
	if (major != VTISM_CH_VERSION_MAJOR)
		return verror(VTISM_CH_UNSUPPORTED_VERSION, -1);
	header_size = ld32(hdr, 0x0c);
	entries_offset = ld32(hdr, 0x18);
	entry_size = ld32(hdr, 0x1c);
	page_shift = ld32(hdr, 0x2c);
	if (header_size != VTISM_CH_HEADER_SIZE || entry_size != VTISM_CH_ENTRY_SIZE ||
	    page_shift != VTISM_CH_PAGE_SHIFT || entries_offset < header_size || entries_offset % 8)
		return verror(VTISM_CH_BAD_LAYOUT, -1);
	region_size = ld64(hdr, 0x10);
	if (region_size > mapped)
		return verror(VTISM_CH_REGION_TOO_SMALL, -1);
	capacity = ld64(hdr, 0x20);
	if (capacity > (UINT64_MAX - entries_offset) / 8 || entries_offset + capacity * 8 > region_size)
		return verror(VTISM_CH_CAPACITY_BEYOND_REGION, -1);
	count = ld64(hdr, 0x50);
	if (count > capacity)
		return verror(VTISM_CH_COUNT_BEYOND_CAPACITY, -1);
	flags = ld32(hdr, 0x58);
	/* Reserved space by the writer's minor version; a newer minor's is not checked. */
	if (minor <= 1) {
		size_t off, tail = minor == 0 ? 0x80 : 0x98;
		uint32_t res32 = ld32(hdr, minor == 0 ? 0x64 : 0x8c);

		if (ld64(hdr, 0x30) || ld64(hdr, 0x38) || (flags & ~VTISM_CH_FLAGS_KNOWN) || res32)
			return verror(VTISM_CH_RESERVED_HEADER_BITS, -1);
		for (off = tail; off < 0x800; off += 8)
			if (ld64(hdr, off))
				return verror(VTISM_CH_RESERVED_HEADER_BITS, -1);
	}
	v.round = ld64(hdr, 0x48);
	if (v.round == last_round) {
		v.result = V_NONE;
		return v;
	}
	/* Bounded: entries_offset + count * 8 <= region_size <= mapped. */
	v.entries = malloc(count ? (size_t)count * 8 : 1);
	if (!v.entries)
		return verror(VTISM_CH_REGION_TOO_SMALL, -1);
	memcpy(v.entries, region + entries_offset, (size_t)count * 8);
	s2 = ld64(region, 0x40);
	if (s1 != s2) {
		free(v.entries);
		return verror(VTISM_CH_TORN_ROUND, -1);
	}
	for (i = 0; i < count; i++) {
		vtism_u64 e = v.entries[i];
		uint64_t gfn = vtism_entry_gfn(e);
		int huge = vtism_entry_huge(e);

		if (e & VTISM_ENTRY_RESERVED_MASK) {
			free(v.entries);
			return verror(VTISM_CH_RESERVED_ENTRY_BITS, (int64_t)i);
		}
		if (!all_ram(map, nmap, gfn, huge ? VTISM_CH_HUGE_FRAMES : 1)) {
			free(v.entries);
			return verror(VTISM_CH_GFN_OUT_OF_RANGE, (int64_t)i);
		}
		if (huge && gfn % VTISM_CH_HUGE_FRAMES) {
			free(v.entries);
			return verror(VTISM_CH_MISALIGNED_HUGE, (int64_t)i);
		}
	}
	v.result = V_OK;
	v.seq = s1;
	v.version_minor = minor;
	v.tracker = ld32(hdr, 0x28);
	v.flags = flags;
	v.scan_interval_ms = ld32(hdr, 0x5c);
	v.scan_duration_us = ld32(hdr, 0x60);
	v.tracked_bytes = ld64(hdr, 0x68);
	v.hot_frames = ld64(hdr, 0x70);
	v.publish_time_ns = ld64(hdr, 0x78);
	if (minor >= 1) {
		v.has_report = 1;
		v.window_us = ld32(hdr, 0x64);
		v.windows = ld32(hdr, 0x80);
		v.tracker_cpu_us = ld32(hdr, 0x84);
		v.coarse_window_us = ld32(hdr, 0x88);
		v.tracked_frames = ld64(hdr, 0x90);
	}
	v.count = count;
	return v;
}

static int cmp_range(const void *a, const void *b)
{
	const struct range *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

#define EXPECT_EQ(c, what, got, want)                                                              \
	do {                                                                                       \
		if ((uint64_t)(got) != (uint64_t)(want))                                           \
			return cfail(c, "%s: got %llu, expected %llu", what,                       \
				     (unsigned long long)(got), (unsigned long long)(want));       \
	} while (0)

static int check_verdict(struct ctx *c, const struct verdict *v, const struct jval *ex)
{
	const char *result = get_str(c, ex, "result");

	if (!result)
		return -1;
	if (strcmp(result, "error") == 0) {
		uint32_t code = 0;
		const char *label = get_str(c, ex, "label");
		const struct jval *idx = jget(ex, "entry_index");

		if (!label || get_u32(c, ex, "code", &code))
			return -1;
		if (v->result != V_ERROR)
			return cfail(c, "expected reject %u (%s), got %s", code, label,
				     v->result == V_OK ? "an accepted round" : "nothing new");
		EXPECT_EQ(c, "reject code", v->code, code);
		if (code >= sizeof(labels) / sizeof(labels[0]) || strcmp(labels[code], label) != 0)
			return cfail(c, "label '%s' does not match code %u", label, code);
		if (idx && idx->type == J_NUM)
			EXPECT_EQ(c, "entry_index", v->entry_index, idx->num);
		else if (v->entry_index != -1)
			return cfail(c, "unexpected entry_index %lld", (long long)v->entry_index);
		return 0;
	}
	if (strcmp(result, "none") == 0) {
		if (v->result != V_NONE)
			return cfail(c, "expected nothing new, got %s %u",
				     v->result == V_OK ? "a round" : "reject", v->code);
		return 0;
	}
	if (strcmp(result, "ok") == 0) {
		static const char *const u64_fields[] = {
			"seq", "round", "version_minor", "tracker", "flags", "scan_interval_ms",
			"scan_duration_us", "tracked_bytes", "hot_frames", "publish_time_ns",
		};
		const uint64_t got[] = {
			v->seq, v->round, v->version_minor, v->tracker, v->flags, v->scan_interval_ms,
			v->scan_duration_us, v->tracked_bytes, v->hot_frames, v->publish_time_ns,
		};
		const struct jval *ents = get_arr(c, ex, "entries");
		const struct jval *rep = jget(ex, "tracker_report");
		const char *counts = get_str(c, ex, "counts");
		int overflow = 0;
		size_t i;

		if (v->result != V_OK)
			return cfail(c, "expected a round, got %s %u (%s)",
				     v->result == V_NONE ? "nothing new" : "reject", v->code, labels[v->code]);
		if (!ents || !counts || get_bool(c, ex, "overflow", &overflow))
			return -1;
		/* v1.0: rounds seen; v1.1 and later: rate levels */
		if (strcmp(counts, v->version_minor == 0 ? "rounds_seen" : "rate_level") != 0)
			return cfail(c, "counts '%s' for a v1.%u writer", counts, v->version_minor);
		if (!rep || (rep->type != J_NULL && rep->type != J_OBJ))
			return cfail(c, "tracker_report missing");
		if ((rep->type == J_OBJ) != v->has_report)
			return cfail(c, "tracker report %s, expected %s", v->has_report ? "decoded" : "absent",
				     rep->type == J_OBJ ? "one" : "none");
		if (v->has_report) {
			static const char *const names[] = {
				"window_us", "windows", "tracker_cpu_us", "coarse_window_us", "tracked_frames",
			};
			const uint64_t vals[] = {
				v->window_us, v->windows, v->tracker_cpu_us, v->coarse_window_us, v->tracked_frames,
			};

			for (i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
				uint64_t want = 0;

				if (get_u64(c, rep, names[i], &want))
					return -1;
				EXPECT_EQ(c, names[i], vals[i], want);
			}
		}
		for (i = 0; i < sizeof(got) / sizeof(got[0]); i++) {
			uint64_t want = 0;

			if (get_u64(c, ex, u64_fields[i], &want))
				return -1;
			EXPECT_EQ(c, u64_fields[i], got[i], want);
		}
		EXPECT_EQ(c, "overflow", !!(v->flags & VTISM_CH_FLAG_OVERFLOW), overflow);
		EXPECT_EQ(c, "entry count", v->count, ents->n);
		for (i = 0; i < ents->n; i++) {
			const struct jval *e = &ents->items[i];
			vtism_u64 w = v->entries[i];
			uint64_t gfn = 0;
			uint32_t count = 0;
			int write = 0, huge = 0, young = 0;
			unsigned type = 0;
			const char *tname = get_str(c, e, "type");

			if (!tname || page_type_of(c, tname, &type) || get_u64(c, e, "gfn", &gfn) ||
			    get_u32(c, e, "count", &count) || get_bool(c, e, "write", &write) ||
			    get_bool(c, e, "huge", &huge) || get_bool(c, e, "young", &young))
				return -1;
			if (vtism_entry_gfn(w) != gfn || vtism_entry_count(w) != count ||
			    vtism_entry_write(w) != write || vtism_entry_type(w) != type ||
			    vtism_entry_huge(w) != huge || vtism_entry_young(w) != young)
				return cfail(c, "entry %zu decodes to %#llx, not as described", i,
					     (unsigned long long)w);
		}
		return 0;
	}
	return cfail(c, "unknown expected result '%s'", result);
}

/* ------------------------------------------------------------------------------------------ */

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0, n = 0;

	if (!f)
		return NULL;
	for (;;) {
		size_t got;

		if (n + 4096 + 1 > cap) {
			size_t nc = cap ? cap * 2 : 65536;
			char *nb = realloc(buf, nc);

			if (!nb) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = nb;
			cap = nc;
		}
		got = fread(buf + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		free(buf);
		fclose(f);
		return NULL;
	}
	fclose(f);
	buf[n] = 0;
	*len = n;
	return buf;
}

static int run_vector(struct ctx *c, const char *dir, const struct jval *v, int *rebuilt)
{
	const char *file = get_str(c, v, "file");
	const struct jval *ram = get_arr(c, v, "ram_map"), *ex = jget(v, "expect");
	char path[4096];
	uint8_t *bin = NULL, *built = NULL, *region = NULL;
	size_t bin_len = 0, built_len = 0, i, nmap;
	struct range *map = NULL;
	struct verdict verdict;
	int rc = -1;

	*rebuilt = 0;
	if (!file || !ram || !ex)
		return cfail(c, "vector lacks file, ram_map or expect");
	if (strchr(file, '/') || (size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path))
		return cfail(c, "bad file name");
	bin = (uint8_t *)read_file(path, &bin_len);
	if (!bin)
		return cfail(c, "cannot read %s", path);

	/* (a) the C writer helpers produce the same bytes */
	if (rebuild(c, v, &built, &built_len))
		goto out;
	if (built_len != bin_len) {
		cfail(c, "rebuilt %zu bytes, file has %zu", built_len, bin_len);
		goto out;
	}
	for (i = 0; i < bin_len; i++) {
		if (built[i] != bin[i]) {
			cfail(c, "rebuilt region differs from %s at byte %#zx (%#x vs %#x)", file, i, built[i], bin[i]);
			goto out;
		}
	}
	*rebuilt = 1;

	/* (b) the C reader judges the file as vectors.json says */
	nmap = ram->n;
	map = calloc(nmap ? nmap : 1, sizeof(*map));
	if (!map) {
		cfail(c, "out of memory");
		goto out;
	}
	for (i = 0; i < nmap; i++) {
		const struct jval *r = &ram->items[i];

		if (r->type != J_ARR || r->n != 2 || r->items[0].type != J_NUM || r->items[1].type != J_NUM ||
		    r->items[0].num >= r->items[1].num) {
			cfail(c, "ram_map[%zu] is not [start, end) with start < end", i);
			goto out;
		}
		map[i].start = r->items[0].num;
		map[i].end = r->items[1].num;
	}
	qsort(map, nmap, sizeof(*map), cmp_range);
	/* The host maps the file: give the reader an 8-aligned copy of exactly file_len bytes. */
	region = aligned_alloc(8, bin_len ? (bin_len + 7) & ~(size_t)7 : 8);
	if (!region) {
		cfail(c, "out of memory");
		goto out;
	}
	memcpy(region, bin, bin_len);
	verdict = c_read(region, bin_len, map, nmap, 0);
	rc = check_verdict(c, &verdict, ex);
	if (verdict.result == V_OK)
		free(verdict.entries);
out:
	free(region);
	free(map);
	free(built);
	free(bin);
	return rc;
}

/* (c) The rate-level helpers against the tables vtism_proto::count produced. */
static unsigned check_levels(const struct jval *table, const char *name, int shares, size_t *checked)
{
	unsigned failed = 0;
	size_t i;

	*checked = 0;
	if (!table || table->type != J_ARR || table->n == 0) {
		printf("FAIL %s: missing or empty\n", name);
		return 1;
	}
	for (i = 0; i < table->n; i++) {
		const struct jval *t = &table->items[i];
		struct ctx c;
		uint64_t a = 0, bits = 0, window = 0, want = 0;
		unsigned got;

		memset(&c, 0, sizeof(c));
		if (get_u64(&c, t, shares ? "share" : "rate", &a) ||
		    get_u64(&c, t, shares ? "share_bits" : "shift", &bits) ||
		    (shares && get_u64(&c, t, "window_us", &window)) || get_u64(&c, t, "level", &want) ||
		    bits > 127 || window > UINT32_MAX) {
			printf("FAIL %s[%zu]: %s\n", name, i, c.err[0] ? c.err : "argument out of range");
			failed++;
			continue;
		}
		got = shares ? vtism_ch_level_of_share(a, (unsigned)bits, (vtism_u32)window)
			     : vtism_ch_level_of_rate(a, (unsigned)bits);
		if (got != want) {
			if (failed < 20)
				printf("FAIL %s[%zu]: (%llu, %llu, %llu) gives level %u, expected %llu\n", name, i,
				       (unsigned long long)a, (unsigned long long)bits,
				       (unsigned long long)window, got, (unsigned long long)want);
			failed++;
		}
		(*checked)++;
	}
	return failed;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "../vectors/channel";
	char path[4096];
	char *text;
	size_t len, i;
	struct jparser p;
	struct jval root;
	const struct jval *vectors, *format;
	unsigned passed = 0, failed = 0, rebuilt_total = 0;
	unsigned codes_seen = 0;

	if ((size_t)snprintf(path, sizeof(path), "%s/vectors.json", dir) >= sizeof(path)) {
		fprintf(stderr, "path too long\n");
		return 2;
	}
	text = read_file(path, &len);
	if (!text) {
		fprintf(stderr, "cannot read %s\n", path);
		return 2;
	}
	memset(&p, 0, sizeof(p));
	p.s = text;
	p.len = len;
	if (jvalue(&p, &root)) {
		fprintf(stderr, "%s: %s\n", path, p.err);
		jfree(&root);
		free(text);
		return 2;
	}
	jskip_ws(&p);
	format = jget(&root, "format");
	vectors = jget(&root, "vectors");
	if (p.pos != p.len || !format || format->type != J_STR ||
	    strcmp(format->str, "vtism-channel-vectors") != 0 || !vectors || vectors->type != J_ARR ||
	    vectors->n == 0) {
		fprintf(stderr, "%s: not a vtism channel vector file\n", path);
		jfree(&root);
		free(text);
		return 2;
	}
	for (i = 0; i < vectors->n; i++) {
		struct ctx c;
		const struct jval *v = &vectors->items[i];
		const char *name;
		int rebuilt = 0;
		const struct jval *ex = jget(v, "expect"), *code = jget(ex, "code");

		memset(&c, 0, sizeof(c));
		name = get_str(&c, v, "name");
		c.vector = name ? name : "?";
		if (name && run_vector(&c, dir, v, &rebuilt) == 0) {
			passed++;
			if (code && code->type == J_NUM && code->num < 32)
				codes_seen |= 1u << code->num;
		} else {
			failed++;
			printf("FAIL %s: %s\n", c.vector, c.err[0] ? c.err : "unknown error");
		}
		rebuilt_total += rebuilt;
	}
	{
		size_t nr = 0, ns = 0;
		unsigned bad = check_levels(jget(&root, "rate_levels"), "rate_levels", 0, &nr) +
			       check_levels(jget(&root, "share_levels"), "share_levels", 1, &ns);

		printf("rate levels: %zu rates and %zu young shares checked, %u wrong\n", nr, ns, bad);
		failed += bad;
	}
	/* Every reject code but TornRound (dynamic only) must have a vector. */
	for (i = 1; i <= 12; i++) {
		if (i != VTISM_CH_TORN_ROUND && !(codes_seen & (1u << i))) {
			printf("FAIL coverage: no passing vector for reject code %zu (%s)\n", i, labels[i]);
			failed++;
		}
	}
	printf("channel vectors (%s): %zu vectors, %u rebuilt byte-identical with vtism_channel.h, "
	       "%u judged as expected by the C reader\n", dir, vectors->n, rebuilt_total, passed);
	printf("%u passed, %u failed\n", passed, failed);
	jfree(&root);
	free(text);
	return failed ? 1 : 0;
}
