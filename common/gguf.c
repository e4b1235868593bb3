/* GGUF v2/v3 reader and writer.
 *
 * Reader: the whole file is mapped read-only and parsed once.  Every length,
 * count and offset read from the file is checked against the bytes that
 * remain before it is used or allocated for, so a hostile file costs at most
 * a small multiple of its own size in memory and never reads out of bounds.
 * Errors name the key or tensor, the byte offset and what was expected.
 *
 * Writer: keys and tensor infos are serialised in memory; the data section
 * is written with pwrite, from caller buffers or from a fill callback run on
 * several threads (for multi-gigabyte synthetic models), into a temporary
 * file that is renamed over the destination at the end. */
#include "common/gguf.h"
#include "common/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "GGUF is little-endian and is read here with plain loads");

/* Smallest encodings, used to bound counts before allocating. */
#define MIN_KV_BYTES 14    /* key length (8) + 1-byte key + type (4) + 1-byte value */
#define MIN_TINFO_BYTES 33 /* name length (8) + 1-byte name + n_dims (4) + one dim (8) + type (4) + offset (8) */
#define MAX_ALIGNMENT (1u << 30)

/* ---- shared helpers ---- */

static size_t vtype_size(enum mr_gguf_vtype t)
{
    switch (t) {
    case MR_GGUF_UINT8:
    case MR_GGUF_INT8:
    case MR_GGUF_BOOL:
        return 1;
    case MR_GGUF_UINT16:
    case MR_GGUF_INT16:
        return 2;
    case MR_GGUF_UINT32:
    case MR_GGUF_INT32:
    case MR_GGUF_FLOAT32:
        return 4;
    case MR_GGUF_UINT64:
    case MR_GGUF_INT64:
    case MR_GGUF_FLOAT64:
        return 8;
    default:
        return 0; /* STRING, ARRAY, unknown: not fixed-size */
    }
}

static bool vtype_is_uint(enum mr_gguf_vtype t)
{
    return t == MR_GGUF_UINT8 || t == MR_GGUF_UINT16 || t == MR_GGUF_UINT32 || t == MR_GGUF_UINT64;
}

static bool vtype_is_int(enum mr_gguf_vtype t)
{
    return t == MR_GGUF_INT8 || t == MR_GGUF_INT16 || t == MR_GGUF_INT32 || t == MR_GGUF_INT64;
}

const char *mr_gguf_vtype_name(enum mr_gguf_vtype t)
{
    static const char *const names[MR_GGUF_VTYPE_COUNT] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
        "bool", "string", "array", "uint64", "int64", "float64",
    };
    if ((unsigned)t >= MR_GGUF_VTYPE_COUNT)
        return "unknown";
    return names[t];
}

/* Copies up to 80 bytes of a name for an error message, printable only. */
static const char *printable(const char *p, uint64_t n, char *buf, size_t cap)
{
    size_t m = n < 80 ? (size_t)n : 80;
    if (m > cap - 4)
        m = cap - 4;
    size_t j = 0;
    for (size_t i = 0; i < m; i++) {
        unsigned char c = (unsigned char)p[i];
        buf[j++] = (c >= 0x20 && c < 0x7f && c != '\'') ? (char)c : '?';
    }
    if (m < n) {
        buf[j++] = '.';
        buf[j++] = '.';
    }
    buf[j] = '\0';
    return buf;
}

/* Index of names: open addressing over (index + 1), 0 = empty slot. */
typedef struct name_index {
    size_t *slot;
    size_t mask;
} name_index;

static int index_init(name_index *ix, uint64_t n)
{
    size_t cap = 8;
    while (cap < 2 * n)
        cap *= 2;
    ix->slot = calloc(cap, sizeof *ix->slot);
    ix->mask = cap - 1;
    return ix->slot ? 0 : -1;
}

/* ---- reader ---- */

typedef struct gguf_impl {
    mr_gguf pub; /* first: mr_gguf pointers are gguf_impl pointers */
    name_index kv_ix;
    name_index t_ix;
} gguf_impl;

typedef struct rd {
    const uint8_t *b;
    size_t n;
    size_t pos;
    char ctx[200]; /* what is being parsed: "header", "key 'x'", "tensor 'y'" */
    size_t ctx_at; /* where that item starts */
    mr_err *err;
} rd;

static int fail(rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(rd *r, const char *fmt, ...)
{
    char detail[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return mr_errf(r->err, "gguf: %s (at byte %zu): %s", r->ctx, r->ctx_at, detail);
}

static void set_ctx(rd *r, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_ctx(rd *r, size_t at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->ctx, sizeof r->ctx, fmt, ap);
    va_end(ap);
    r->ctx_at = at;
}

static int need(rd *r, size_t k, const char *what)
{
    if (r->n - r->pos < k)
        return fail(r, "truncated: %s needs %zu bytes at byte %zu, only %zu remain (file size %zu)",
                    what, k, r->pos, r->n - r->pos, r->n);
    return 0;
}

static int rd_u32(rd *r, uint32_t *v, const char *what)
{
    if (need(r, 4, what))
        return -1;
    memcpy(v, r->b + r->pos, 4);
    r->pos += 4;
    return 0;
}

static int rd_u64(rd *r, uint64_t *v, const char *what)
{
    if (need(r, 8, what))
        return -1;
    memcpy(v, r->b + r->pos, 8);
    r->pos += 8;
    return 0;
}

/* A string; elem is its index inside a string array, or -1.  The element
 * index is only formatted on failure (arrays hold 150k strings). */
static int rd_str_elem(rd *r, mr_str *s, const char *what, int64_t elem)
{
    uint64_t len;
    size_t at = r->pos;
    char w[64];
    if (r->n - r->pos < 8 || (memcpy(&len, r->b + r->pos, 8), len > r->n - r->pos - 8)) {
        if (elem >= 0)
            snprintf(w, sizeof w, "%s %lld", what, (long long)elem);
        else
            snprintf(w, sizeof w, "%s", what);
        if (rd_u64(r, &len, w))
            return -1;
        return fail(r, "%s: length %llu at byte %zu runs past end of file (%zu bytes remain)", w,
                    (unsigned long long)len, at, r->n - r->pos);
    }
    r->pos += 8;
    s->ptr = (const char *)r->b + r->pos;
    s->len = len;
    r->pos += (size_t)len;
    return 0;
}

static int rd_str(rd *r, mr_str *s, const char *what) { return rd_str_elem(r, s, what, -1); }

/* A key or tensor name: non-empty, no NUL inside (it is compared as a C string). */
static int rd_name(rd *r, mr_str *s, const char *what)
{
    size_t at = r->pos;
    if (rd_str(r, s, what))
        return -1;
    if (s->len == 0)
        return fail(r, "%s at byte %zu is empty", what, at);
    if (memchr(s->ptr, '\0', (size_t)s->len))
        return fail(r, "%s at byte %zu contains a NUL byte", what, at);
    return 0;
}

static int rd_array(rd *r, mr_gguf_kv *kv)
{
    uint32_t et;
    uint64_t n;
    size_t at = r->pos;
    if (rd_u32(r, &et, "array element type"))
        return -1;
    if (et >= MR_GGUF_VTYPE_COUNT)
        return fail(r, "array element type %u at byte %zu is not a GGUF value type (0..%d)", et, at,
                    MR_GGUF_VTYPE_COUNT - 1);
    if (et == MR_GGUF_ARRAY)
        return fail(r, "array of arrays at byte %zu is not supported", at);
    if (rd_u64(r, &n, "array length"))
        return -1;
    kv->v.arr.type = (enum mr_gguf_vtype)et;
    kv->v.arr.n = n;
    if (et == MR_GGUF_STRING) {
        /* each element takes at least its 8-byte length */
        if (n > (r->n - r->pos) / 8)
            return fail(r, "string array of %llu elements cannot fit in the %zu remaining bytes",
                        (unsigned long long)n, r->n - r->pos);
        mr_str *strs = malloc(n ? (size_t)n * sizeof *strs : 1);
        if (!strs)
            return fail(r, "out of memory for %llu strings", (unsigned long long)n);
        kv->v.arr.strs = strs;
        kv->v.arr.data = NULL;
        for (uint64_t i = 0; i < n; i++)
            if (rd_str_elem(r, &strs[i], "string element", (int64_t)i))
                return -1;
        return 0;
    }
    size_t esz = vtype_size((enum mr_gguf_vtype)et);
    if (n > (r->n - r->pos) / esz)
        return fail(r, "array of %llu %s elements (%zu bytes each) runs past end of file (%zu bytes remain)",
                    (unsigned long long)n, mr_gguf_vtype_name((enum mr_gguf_vtype)et), esz,
                    r->n - r->pos);
    const uint8_t *d = r->b + r->pos;
    if (et == MR_GGUF_BOOL) {
        for (uint64_t i = 0; i < n; i++)
            if (d[i] > 1)
                return fail(r, "bool element %llu at byte %zu is %u (expected 0 or 1)",
                            (unsigned long long)i, r->pos + (size_t)i, d[i]);
    }
    kv->v.arr.data = d;
    kv->v.arr.strs = NULL;
    r->pos += (size_t)(n * esz);
    return 0;
}

static int rd_value(rd *r, mr_gguf_kv *kv, uint32_t type, size_t type_at)
{
    const uint8_t *p;
    if (type >= MR_GGUF_VTYPE_COUNT)
        return fail(r, "value type %u at byte %zu is not a GGUF value type (0..%d)", type, type_at,
                    MR_GGUF_VTYPE_COUNT - 1);
    kv->type = (enum mr_gguf_vtype)type;
    if (type == MR_GGUF_STRING)
        return rd_str(r, &kv->v.s, "string value");
    if (type == MR_GGUF_ARRAY)
        return rd_array(r, kv);
    size_t sz = vtype_size(kv->type);
    if (need(r, sz, mr_gguf_vtype_name(kv->type)))
        return -1;
    p = r->b + r->pos;
    switch (kv->type) {
    case MR_GGUF_UINT8: kv->v.u = p[0]; break;
    case MR_GGUF_INT8: kv->v.i = (int8_t)p[0]; break;
    case MR_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; break; }
    case MR_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i = x; break; }
    case MR_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; break; }
    case MR_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i = x; break; }
    case MR_GGUF_UINT64: { uint64_t x; memcpy(&x, p, 8); kv->v.u = x; break; }
    case MR_GGUF_INT64: { int64_t x; memcpy(&x, p, 8); kv->v.i = x; break; }
    case MR_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f = x; break; }
    case MR_GGUF_FLOAT64: { double x; memcpy(&x, p, 8); kv->v.f = x; break; }
    case MR_GGUF_BOOL:
        if (p[0] > 1)
            return fail(r, "bool value at byte %zu is %u (expected 0 or 1)", r->pos, p[0]);
        kv->v.b = p[0] != 0;
        break;
    default:
        return fail(r, "internal: unhandled value type %u", type);
    }
    r->pos += sz;
    return 0;
}

static bool str_eq(mr_str s, const char *c, size_t clen)
{
    return s.len == clen && memcmp(s.ptr, c, clen) == 0;
}

/* Inserts kv i into the index; returns the earlier index on a duplicate, or -1. */
static int64_t kv_index_add(gguf_impl *g, uint64_t i)
{
    mr_str k = g->pub.kv[i].key;
    size_t h = (size_t)mr_fnv1a(k.ptr, (size_t)k.len) & g->kv_ix.mask;
    for (;; h = (h + 1) & g->kv_ix.mask) {
        size_t s = g->kv_ix.slot[h];
        if (!s) {
            g->kv_ix.slot[h] = (size_t)i + 1;
            return -1;
        }
        if (str_eq(g->pub.kv[s - 1].key, k.ptr, (size_t)k.len))
            return (int64_t)(s - 1);
    }
}

static int64_t t_index_add(gguf_impl *g, uint64_t i)
{
    const char *nm = g->pub.tensors[i].name;
    size_t len = strlen(nm);
    size_t h = (size_t)mr_fnv1a(nm, len) & g->t_ix.mask;
    for (;; h = (h + 1) & g->t_ix.mask) {
        size_t s = g->t_ix.slot[h];
        if (!s) {
            g->t_ix.slot[h] = (size_t)i + 1;
            return -1;
        }
        if (strcmp(g->pub.tensors[s - 1].name, nm) == 0)
            return (int64_t)(s - 1);
    }
}

static int parse_alignment(rd *r, const mr_gguf_kv *kv, size_t *align)
{
    uint64_t a;
    if (vtype_is_uint(kv->type))
        a = kv->v.u;
    else if (vtype_is_int(kv->type) && kv->v.i > 0)
        a = (uint64_t)kv->v.i;
    else if (vtype_is_int(kv->type))
        return fail(r, "alignment %lld must be a positive power of two", (long long)kv->v.i);
    else
        return fail(r, "alignment has type %s, expected an integer (uint32)",
                    mr_gguf_vtype_name(kv->type));
    if (a == 0 || (a & (a - 1)) != 0 || a > MAX_ALIGNMENT)
        return fail(r, "alignment %llu must be a non-zero power of two <= %u",
                    (unsigned long long)a, MAX_ALIGNMENT);
    *align = (size_t)a;
    return 0;
}

static int parse_kvs(rd *r, gguf_impl *g)
{
    mr_gguf *pub = &g->pub;
    for (uint64_t i = 0; i < pub->n_kv; i++) {
        mr_gguf_kv *kv = &pub->kv[i];
        size_t at = r->pos;
        char pk[100];
        set_ctx(r, at, "key #%llu", (unsigned long long)i);
        if (rd_name(r, &kv->key, "key name"))
            return -1;
        set_ctx(r, at, "key '%s'", printable(kv->key.ptr, kv->key.len, pk, sizeof pk));
        int64_t dup = kv_index_add(g, i);
        if (dup >= 0)
            return fail(r, "duplicate key (first defined as key #%lld)", (long long)dup);
        uint32_t type;
        size_t type_at = r->pos;
        if (rd_u32(r, &type, "value type"))
            return -1;
        if (rd_value(r, kv, type, type_at))
            return -1;
        if (str_eq(kv->key, "general.alignment", strlen("general.alignment")) &&
            parse_alignment(r, kv, &pub->alignment))
            return -1;
    }
    return 0;
}

static int parse_tensor_infos(rd *r, gguf_impl *g, size_t *info_at)
{
    mr_gguf *pub = &g->pub;
    for (uint64_t i = 0; i < pub->n_tensors; i++) {
        mr_gguf_tensor *t = &pub->tensors[i];
        size_t at = r->pos;
        info_at[i] = at;
        mr_str nm;
        char pk[100];
        set_ctx(r, at, "tensor #%llu info", (unsigned long long)i);
        if (rd_name(r, &nm, "tensor name"))
            return -1;
        t->name = malloc((size_t)nm.len + 1);
        if (!t->name)
            return fail(r, "out of memory for a name of %llu bytes", (unsigned long long)nm.len);
        memcpy(t->name, nm.ptr, (size_t)nm.len);
        t->name[nm.len] = '\0';
        set_ctx(r, at, "tensor '%s' info", printable(nm.ptr, nm.len, pk, sizeof pk));
        int64_t dup = t_index_add(g, i);
        if (dup >= 0)
            return fail(r, "duplicate tensor name (first defined as tensor #%lld)", (long long)dup);
        uint32_t nd;
        if (rd_u32(r, &nd, "n_dims"))
            return -1;
        if (nd < 1 || nd > MR_GGUF_MAX_DIMS)
            return fail(r, "n_dims %u (expected 1..%d)", nd, MR_GGUF_MAX_DIMS);
        t->n_dims = nd;
        int64_t nel = 1;
        for (int d = 0; d < MR_GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t v;
            if (rd_u64(r, &v, "dimension"))
                return -1;
            if (v == 0 || v > (uint64_t)INT64_MAX)
                return fail(r, "ne[%u] = %llu (expected 1..2^63-1)", d, (unsigned long long)v);
            t->ne[d] = (int64_t)v;
            if (__builtin_mul_overflow(nel, t->ne[d], &nel))
                return fail(r, "element count overflows 64 bits at ne[%u] = %llu", d,
                            (unsigned long long)v);
        }
        uint32_t type;
        if (rd_u32(r, &type, "tensor type"))
            return -1;
        const mr_type_info *ti = mr_type_get((int)type);
        if (!ti || !ti->known)
            return fail(r, "unknown tensor type %u", type);
        t->type = (enum mr_type)type;
        if (t->ne[0] % ti->block_elems != 0)
            return fail(r, "ne[0] = %lld is not a multiple of the %s block size %lld",
                        (long long)t->ne[0], ti->name, (long long)ti->block_elems);
        size_t row = mr_row_size((int)type, t->ne[0]);
        if (row == 0)
            return fail(r, "row of %lld %s elements has no size", (long long)t->ne[0], ti->name);
        uint64_t rows = (uint64_t)(nel / t->ne[0]);
        uint64_t nbytes;
        if (__builtin_mul_overflow((uint64_t)row, rows, &nbytes) || nbytes > SIZE_MAX)
            return fail(r, "byte size of %llu rows of %zu bytes overflows",
                        (unsigned long long)rows, row);
        t->nbytes = (size_t)nbytes;
        if (rd_u64(r, &t->offset, "data offset"))
            return -1;
    }
    return 0;
}

static int check_tensor_data(rd *r, gguf_impl *g, const size_t *info_at)
{
    mr_gguf *pub = &g->pub;
    for (uint64_t i = 0; i < pub->n_tensors; i++) {
        mr_gguf_tensor *t = &pub->tensors[i];
        char pk[100];
        set_ctx(r, info_at[i], "tensor '%s' info", printable(t->name, strlen(t->name), pk, sizeof pk));
        if (t->offset % pub->alignment != 0)
            return fail(r, "data offset %llu is not a multiple of the alignment %zu",
                        (unsigned long long)t->offset, pub->alignment);
        uint64_t a, b;
        if (__builtin_add_overflow((uint64_t)pub->data_offset, t->offset, &a) ||
            __builtin_add_overflow(a, (uint64_t)t->nbytes, &b))
            return fail(r, "data offset %llu + %zu bytes overflows 64 bits",
                        (unsigned long long)t->offset, t->nbytes);
        if (b > pub->size)
            return fail(r, "data [%llu, %llu) runs past end of file (size %zu)",
                        (unsigned long long)a, (unsigned long long)b, pub->size);
        t->data = pub->base + a;
    }
    return 0;
}

void mr_gguf_close(mr_gguf *pub)
{
    if (!pub)
        return;
    gguf_impl *g = (gguf_impl *)pub;
    if (pub->kv)
        for (uint64_t i = 0; i < pub->n_kv; i++)
            if (pub->kv[i].type == MR_GGUF_ARRAY)
                free((void *)pub->kv[i].v.arr.strs);
    free(pub->kv);
    if (pub->tensors)
        for (uint64_t i = 0; i < pub->n_tensors; i++)
            free(pub->tensors[i].name);
    free(pub->tensors);
    free(g->kv_ix.slot);
    free(g->t_ix.slot);
    if (pub->mapped && pub->size)
        munmap((void *)pub->base, pub->size);
    free(g);
}

static int parse(const uint8_t *base, size_t size, bool mapped, mr_gguf **out, mr_err *err)
{
    *out = NULL;
    gguf_impl *g = calloc(1, sizeof *g);
    if (!g) {
        if (mapped)
            munmap((void *)base, size);
        return mr_errf(err, "gguf: out of memory");
    }
    mr_gguf *pub = &g->pub;
    pub->base = base;
    pub->size = size;
    pub->mapped = mapped;
    pub->alignment = MR_GGUF_DEFAULT_ALIGNMENT;

    rd r = {.b = base, .n = size, .pos = 0, .err = err};
    size_t *info_at = NULL;
    set_ctx(&r, 0, "header");
    uint32_t magic, version;
    if (rd_u32(&r, &magic, "magic"))
        goto fail;
    if (magic != MR_GGUF_MAGIC) {
        fail(&r, "bad magic %02x %02x %02x %02x (expected \"GGUF\")", base[0], base[1], base[2],
             base[3]);
        goto fail;
    }
    if (rd_u32(&r, &version, "version"))
        goto fail;
    if (version != 2 && version != 3) {
        fail(&r, "unsupported version %u (expected 2 or 3)", version);
        goto fail;
    }
    pub->version = version;
    uint64_t n_tensors, n_kv;
    if (rd_u64(&r, &n_tensors, "tensor count") || rd_u64(&r, &n_kv, "key count"))
        goto fail;
    size_t rem = size - r.pos;
    if (n_kv > rem / MIN_KV_BYTES) {
        fail(&r, "%llu keys cannot fit in the %zu bytes after the header",
             (unsigned long long)n_kv, rem);
        goto fail;
    }
    if (n_tensors > (rem - (size_t)n_kv * MIN_KV_BYTES) / MIN_TINFO_BYTES) {
        fail(&r, "%llu tensor infos cannot fit in the %zu bytes after the header",
             (unsigned long long)n_tensors, rem);
        goto fail;
    }
    pub->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *pub->kv);
    pub->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *pub->tensors);
    info_at = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *info_at);
    if (!pub->kv || !pub->tensors || !info_at || index_init(&g->kv_ix, n_kv) ||
        index_init(&g->t_ix, n_tensors)) {
        fail(&r, "out of memory for %llu keys and %llu tensors", (unsigned long long)n_kv,
             (unsigned long long)n_tensors);
        goto fail;
    }
    pub->n_kv = n_kv;
    pub->n_tensors = n_tensors;
    if (parse_kvs(&r, g) || parse_tensor_infos(&r, g, info_at))
        goto fail;
    size_t end = r.pos;
    size_t aligned = (end + pub->alignment - 1) / pub->alignment * pub->alignment;
    if (aligned < end) { /* cannot happen with size_t files below 2^63 */
        set_ctx(&r, end, "data section");
        fail(&r, "aligned start overflows");
        goto fail;
    }
    /* a file without tensors may end right after its last value, without
     * the padding: its (empty) data section then starts at the end */
    pub->data_offset = n_tensors == 0 && aligned > size ? size : aligned;
    if (check_tensor_data(&r, g, info_at))
        goto fail;
    free(info_at);
    *out = pub;
    return 0;
fail:
    free(info_at);
    mr_gguf_close(pub);
    return -1;
}

int mr_gguf_open_mem(const void *buf, size_t size, mr_gguf **out, mr_err *err)
{
    *out = NULL;
    if (!buf && size)
        return mr_errf(err, "gguf: NULL buffer of %zu bytes", size);
    static const uint8_t empty[1];
    return parse(buf ? buf : empty, size, false, out, err);
}

int mr_gguf_open(const char *path, mr_gguf **out, mr_err *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return mr_errf(err, "gguf: %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mr_errf(err, "gguf: %s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mr_errf(err, "gguf: %s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) {
        close(fd);
        return mr_errf(err, "gguf: %s: empty file (expected a GGUF header)", path);
    }
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return mr_errf(err, "gguf: %s: cannot map %zu bytes: %s", path, size, strerror(e));
    if (parse(m, size, true, out, err))
        return mr_err_wrap(err, "%s", path);
    return 0;
}

/* ---- lookups and typed getters ---- */

const mr_gguf_kv *mr_gguf_find(const mr_gguf *pub, const char *key)
{
    const gguf_impl *g = (const gguf_impl *)pub;
    if (!pub || !key)
        return NULL;
    size_t len = strlen(key);
    for (size_t h = (size_t)mr_fnv1a(key, len) & g->kv_ix.mask;; h = (h + 1) & g->kv_ix.mask) {
        size_t s = g->kv_ix.slot[h];
        if (!s)
            return NULL;
        if (str_eq(pub->kv[s - 1].key, key, len))
            return &pub->kv[s - 1];
    }
}

const mr_gguf_tensor *mr_gguf_find_tensor(const mr_gguf *pub, const char *name)
{
    const gguf_impl *g = (const gguf_impl *)pub;
    if (!pub || !name)
        return NULL;
    for (size_t h = (size_t)mr_fnv1a(name, strlen(name)) & g->t_ix.mask;; h = (h + 1) & g->t_ix.mask) {
        size_t s = g->t_ix.slot[h];
        if (!s)
            return NULL;
        if (strcmp(pub->tensors[s - 1].name, name) == 0)
            return &pub->tensors[s - 1];
    }
}

static const mr_gguf_kv *find_or_err(const mr_gguf *g, const char *key, mr_err *err)
{
    const mr_gguf_kv *kv = mr_gguf_find(g, key);
    if (!kv)
        mr_errf(err, "gguf: key '%s' is missing", key);
    return kv;
}

static int wrong_type(const mr_gguf_kv *kv, const char *key, const char *expected, mr_err *err)
{
    return mr_errf(err, "gguf: key '%s' has type %s, expected %s", key,
                   mr_gguf_vtype_name(kv->type), expected);
}

int mr_gguf_get_u64(const mr_gguf *g, const char *key, uint64_t *out, mr_err *err)
{
    const mr_gguf_kv *kv = find_or_err(g, key, err);
    if (!kv)
        return -1;
    if (vtype_is_uint(kv->type)) {
        *out = kv->v.u;
        return 0;
    }
    if (vtype_is_int(kv->type)) {
        if (kv->v.i < 0)
            return mr_errf(err, "gguf: key '%s' is %lld, expected a non-negative integer", key,
                           (long long)kv->v.i);
        *out = (uint64_t)kv->v.i;
        return 0;
    }
    return wrong_type(kv, key, "an integer", err);
}

int mr_gguf_get_u32(const mr_gguf *g, const char *key, uint32_t *out, mr_err *err)
{
    uint64_t v;
    if (mr_gguf_get_u64(g, key, &v, err))
        return -1;
    if (v > UINT32_MAX)
        return mr_errf(err, "gguf: key '%s' is %llu, expected a value that fits 32 bits", key,
                       (unsigned long long)v);
    *out = (uint32_t)v;
    return 0;
}

int mr_gguf_get_i64(const mr_gguf *g, const char *key, int64_t *out, mr_err *err)
{
    const mr_gguf_kv *kv = find_or_err(g, key, err);
    if (!kv)
        return -1;
    if (vtype_is_int(kv->type)) {
        *out = kv->v.i;
        return 0;
    }
    if (vtype_is_uint(kv->type)) {
        if (kv->v.u > (uint64_t)INT64_MAX)
            return mr_errf(err, "gguf: key '%s' is %llu, expected a value that fits int64", key,
                           (unsigned long long)kv->v.u);
        *out = (int64_t)kv->v.u;
        return 0;
    }
    return wrong_type(kv, key, "an integer", err);
}

int mr_gguf_get_f32(const mr_gguf *g, const char *key, float *out, mr_err *err)
{
    const mr_gguf_kv *kv = find_or_err(g, key, err);
    if (!kv)
        return -1;
    if (kv->type != MR_GGUF_FLOAT32 && kv->type != MR_GGUF_FLOAT64)
        return wrong_type(kv, key, "float32 or float64", err);
    *out = (float)kv->v.f;
    return 0;
}

int mr_gguf_get_bool(const mr_gguf *g, const char *key, bool *out, mr_err *err)
{
    const mr_gguf_kv *kv = find_or_err(g, key, err);
    if (!kv)
        return -1;
    if (kv->type != MR_GGUF_BOOL)
        return wrong_type(kv, key, "bool", err);
    *out = kv->v.b;
    return 0;
}

int mr_gguf_get_str(const mr_gguf *g, const char *key, char **out, mr_err *err)
{
    const mr_gguf_kv *kv = find_or_err(g, key, err);
    if (!kv)
        return -1;
    if (kv->type != MR_GGUF_STRING)
        return wrong_type(kv, key, "string", err);
    char *s = malloc((size_t)kv->v.s.len + 1);
    if (!s)
        return mr_errf(err, "gguf: key '%s': out of memory for %llu bytes", key,
                       (unsigned long long)kv->v.s.len);
    memcpy(s, kv->v.s.ptr, (size_t)kv->v.s.len);
    s[kv->v.s.len] = '\0';
    *out = s;
    return 0;
}

int mr_gguf_get_arr(const mr_gguf *g, const char *key, enum mr_gguf_vtype elem,
                    const mr_gguf_kv **out, mr_err *err)
{
    const mr_gguf_kv *kv = find_or_err(g, key, err);
    if (!kv)
        return -1;
    if (kv->type != MR_GGUF_ARRAY)
        return wrong_type(kv, key, "array", err);
    if (elem != MR_GGUF_VTYPE_COUNT && kv->v.arr.type != elem)
        return mr_errf(err, "gguf: key '%s' is an array of %s, expected an array of %s", key,
                       mr_gguf_vtype_name(kv->v.arr.type), mr_gguf_vtype_name(elem));
    *out = kv;
    return 0;
}

static const uint8_t *arr_elem(const mr_gguf_kv *kv, uint64_t i)
{
    if (!kv || kv->type != MR_GGUF_ARRAY || i >= kv->v.arr.n || !kv->v.arr.data)
        return NULL;
    size_t esz = vtype_size(kv->v.arr.type);
    if (!esz)
        return NULL;
    return (const uint8_t *)kv->v.arr.data + i * esz;
}

/* Elements are read as the file stores them (unaligned, little-endian). */
static bool arr_read(const mr_gguf_kv *kv, uint64_t i, int64_t *iv, uint64_t *uv, double *fv)
{
    const uint8_t *p = arr_elem(kv, i);
    if (!p)
        return false;
    *iv = 0;
    *uv = 0;
    *fv = 0;
    switch (kv->v.arr.type) {
    case MR_GGUF_UINT8: *uv = p[0]; *fv = p[0]; *iv = p[0]; return true;
    case MR_GGUF_BOOL: *uv = p[0]; *fv = p[0]; *iv = p[0]; return true;
    case MR_GGUF_INT8: *iv = (int8_t)p[0]; break;
    case MR_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); *uv = x; *iv = x; *fv = x; return true; }
    case MR_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); *iv = x; break; }
    case MR_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); *uv = x; *iv = x; *fv = x; return true; }
    case MR_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); *iv = x; break; }
    case MR_GGUF_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        *uv = x;
        *iv = x > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)x;
        *fv = (double)x;
        return true;
    }
    case MR_GGUF_INT64: { int64_t x; memcpy(&x, p, 8); *iv = x; break; }
    case MR_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); *fv = x; goto float_to_int; }
    case MR_GGUF_FLOAT64: { double x; memcpy(&x, p, 8); *fv = x; goto float_to_int; }
    default:
        return false;
    }
    *fv = (double)*iv;
    return true;
float_to_int:
    /* truncation toward zero, saturated; NaN gives 0 */
    if (*fv != *fv)
        *iv = 0;
    else if (*fv >= 9223372036854775807.0)
        *iv = INT64_MAX;
    else if (*fv <= -9223372036854775808.0)
        *iv = INT64_MIN;
    else
        *iv = (int64_t)*fv;
    return true;
}

int64_t mr_gguf_arr_i64(const mr_gguf_kv *kv, uint64_t i)
{
    int64_t iv;
    uint64_t uv;
    double fv;
    return arr_read(kv, i, &iv, &uv, &fv) ? iv : 0;
}

double mr_gguf_arr_f64(const mr_gguf_kv *kv, uint64_t i)
{
    int64_t iv;
    uint64_t uv;
    double fv;
    return arr_read(kv, i, &iv, &uv, &fv) ? fv : 0.0;
}

/* ---- writer ---- */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} wbuf;

static void wb_put(wbuf *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void wb_u32(wbuf *b, uint32_t v) { wb_put(b, &v, 4); }
static void wb_u64(wbuf *b, uint64_t v) { wb_put(b, &v, 8); }
static void wb_str(wbuf *b, const char *s, uint64_t n)
{
    wb_u64(b, n);
    wb_put(b, s, (size_t)n);
}

typedef struct wkv {
    char *key;
    enum mr_gguf_vtype type;
    uint8_t *val; /* the value as serialised after the type field */
    size_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    enum mr_type type;
    uint32_t n_dims;
    int64_t ne[MR_GGUF_MAX_DIMS];
    const void *data;
    size_t nbytes;
    uint64_t offset;
} wtensor;

struct mr_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    size_t alignment;
    char err[256]; /* first failure of a setter, reported by write */
};

static int w_fail(mr_gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int w_fail(mr_gguf_writer *w, const char *fmt, ...)
{
    if (w && !w->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err, sizeof w->err, fmt, ap);
        va_end(ap);
    }
    return -1;
}

mr_gguf_writer *mr_gguf_writer_new(void)
{
    mr_gguf_writer *w = calloc(1, sizeof *w);
    if (w)
        w->alignment = MR_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void mr_gguf_writer_free(mr_gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

const char *mr_gguf_writer_error(const mr_gguf_writer *w)
{
    return w && w->err[0] ? w->err : NULL;
}

/* Takes ownership of b's bytes.  A key set twice keeps its first position
 * and takes the new value. */
static int put_kv(mr_gguf_writer *w, const char *key, enum mr_gguf_vtype type, wbuf *b)
{
    if (!w) {
        free(b->p);
        return -1;
    }
    if (b->oom) {
        free(b->p);
        return w_fail(w, "gguf writer: key '%s': out of memory", key ? key : "(null)");
    }
    if (!key || !*key) {
        free(b->p);
        return w_fail(w, "gguf writer: empty key");
    }
    if (strcmp(key, "general.alignment") == 0) {
        uint64_t a = 0;
        if (type == MR_GGUF_UINT32 && b->n == 4) {
            uint32_t x;
            memcpy(&x, b->p, 4);
            a = x;
        }
        if (a == 0 || (a & (a - 1)) || a > MAX_ALIGNMENT) {
            free(b->p);
            return w_fail(w, "gguf writer: general.alignment must be a uint32 non-zero power of two "
                             "<= %u", MAX_ALIGNMENT);
        }
        w->alignment = (size_t)a;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = b->p;
            w->kv[i].val_len = b->n;
            return 0;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *nk = realloc(w->kv, cap * sizeof *nk);
        if (!nk) {
            free(b->p);
            return w_fail(w, "gguf writer: out of memory");
        }
        w->kv = nk;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(b->p);
        return w_fail(w, "gguf writer: out of memory");
    }
    w->kv[w->n_kv++] = (wkv){.key = k, .type = type, .val = b->p, .val_len = b->n};
    return 0;
}

static int put_scalar(mr_gguf_writer *w, const char *key, enum mr_gguf_vtype t, const void *v)
{
    wbuf b = {0};
    wb_put(&b, v, vtype_size(t));
    return put_kv(w, key, t, &b);
}

int mr_gguf_writer_set_u8(mr_gguf_writer *w, const char *key, uint8_t v)
{
    return put_scalar(w, key, MR_GGUF_UINT8, &v);
}
int mr_gguf_writer_set_i8(mr_gguf_writer *w, const char *key, int8_t v)
{
    return put_scalar(w, key, MR_GGUF_INT8, &v);
}
int mr_gguf_writer_set_u16(mr_gguf_writer *w, const char *key, uint16_t v)
{
    return put_scalar(w, key, MR_GGUF_UINT16, &v);
}
int mr_gguf_writer_set_i16(mr_gguf_writer *w, const char *key, int16_t v)
{
    return put_scalar(w, key, MR_GGUF_INT16, &v);
}
int mr_gguf_writer_set_u32(mr_gguf_writer *w, const char *key, uint32_t v)
{
    return put_scalar(w, key, MR_GGUF_UINT32, &v);
}
int mr_gguf_writer_set_i32(mr_gguf_writer *w, const char *key, int32_t v)
{
    return put_scalar(w, key, MR_GGUF_INT32, &v);
}
int mr_gguf_writer_set_u64(mr_gguf_writer *w, const char *key, uint64_t v)
{
    return put_scalar(w, key, MR_GGUF_UINT64, &v);
}
int mr_gguf_writer_set_i64(mr_gguf_writer *w, const char *key, int64_t v)
{
    return put_scalar(w, key, MR_GGUF_INT64, &v);
}
int mr_gguf_writer_set_f32(mr_gguf_writer *w, const char *key, float v)
{
    return put_scalar(w, key, MR_GGUF_FLOAT32, &v);
}
int mr_gguf_writer_set_f64(mr_gguf_writer *w, const char *key, double v)
{
    return put_scalar(w, key, MR_GGUF_FLOAT64, &v);
}
int mr_gguf_writer_set_bool(mr_gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return put_scalar(w, key, MR_GGUF_BOOL, &b);
}

int mr_gguf_writer_set_strn(mr_gguf_writer *w, const char *key, const char *v, uint64_t len)
{
    if (!v && len)
        return w_fail(w, "gguf writer: key '%s': NULL string", key ? key : "(null)");
    wbuf b = {0};
    wb_str(&b, v, len);
    return put_kv(w, key, MR_GGUF_STRING, &b);
}

int mr_gguf_writer_set_str(mr_gguf_writer *w, const char *key, const char *v)
{
    if (!v)
        return w_fail(w, "gguf writer: key '%s': NULL string", key ? key : "(null)");
    return mr_gguf_writer_set_strn(w, key, v, strlen(v));
}

int mr_gguf_writer_set_arr(mr_gguf_writer *w, const char *key, enum mr_gguf_vtype elem,
                           const void *data, uint64_t n)
{
    size_t esz = vtype_size(elem);
    if (!esz)
        return w_fail(w, "gguf writer: key '%s': %s is not a scalar array element type",
                      key ? key : "(null)", mr_gguf_vtype_name(elem));
    if (!data && n)
        return w_fail(w, "gguf writer: key '%s': NULL array data", key ? key : "(null)");
    if (n > SIZE_MAX / esz)
        return w_fail(w, "gguf writer: key '%s': array too large", key ? key : "(null)");
    wbuf b = {0};
    wb_u32(&b, (uint32_t)elem);
    wb_u64(&b, n);
    wb_put(&b, data, (size_t)n * esz);
    return put_kv(w, key, MR_GGUF_ARRAY, &b);
}

int mr_gguf_writer_set_arr_str(mr_gguf_writer *w, const char *key, const char *const *strs,
                               uint64_t n)
{
    if (!strs && n)
        return w_fail(w, "gguf writer: key '%s': NULL string array", key ? key : "(null)");
    wbuf b = {0};
    wb_u32(&b, MR_GGUF_STRING);
    wb_u64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) {
            free(b.p);
            return w_fail(w, "gguf writer: key '%s': string %llu is NULL", key ? key : "(null)",
                          (unsigned long long)i);
        }
        wb_str(&b, strs[i], strlen(strs[i]));
    }
    return put_kv(w, key, MR_GGUF_ARRAY, &b);
}

int mr_gguf_writer_set_arr_mrstr(mr_gguf_writer *w, const char *key, const mr_str *strs,
                                 uint64_t n)
{
    if (!strs && n)
        return w_fail(w, "gguf writer: key '%s': NULL string array", key ? key : "(null)");
    wbuf b = {0};
    wb_u32(&b, MR_GGUF_STRING);
    wb_u64(&b, n);
    for (uint64_t i = 0; i < n; i++)
        wb_str(&b, strs[i].ptr, strs[i].len);
    return put_kv(w, key, MR_GGUF_ARRAY, &b);
}

int mr_gguf_writer_copy_kv(mr_gguf_writer *w, const mr_gguf_kv *kv)
{
    if (!kv)
        return w_fail(w, "gguf writer: copy of a NULL key");
    char *key = malloc((size_t)kv->key.len + 1);
    if (!key)
        return w_fail(w, "gguf writer: out of memory");
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = '\0';
    wbuf b = {0};
    int rc;
    switch (kv->type) {
    case MR_GGUF_UINT8: case MR_GGUF_UINT16: case MR_GGUF_UINT32: case MR_GGUF_UINT64:
        /* little-endian: the low bytes of the u64 are the narrower value */
        wb_put(&b, &kv->v.u, vtype_size(kv->type));
        rc = put_kv(w, key, kv->type, &b);
        break;
    case MR_GGUF_INT8: case MR_GGUF_INT16: case MR_GGUF_INT32: case MR_GGUF_INT64:
        wb_put(&b, &kv->v.i, vtype_size(kv->type));
        rc = put_kv(w, key, kv->type, &b);
        break;
    case MR_GGUF_FLOAT32: {
        float f = (float)kv->v.f;
        wb_put(&b, &f, 4);
        rc = put_kv(w, key, kv->type, &b);
        break;
    }
    case MR_GGUF_FLOAT64:
        wb_put(&b, &kv->v.f, 8);
        rc = put_kv(w, key, kv->type, &b);
        break;
    case MR_GGUF_BOOL:
        rc = mr_gguf_writer_set_bool(w, key, kv->v.b);
        break;
    case MR_GGUF_STRING:
        rc = mr_gguf_writer_set_strn(w, key, kv->v.s.ptr, kv->v.s.len);
        break;
    case MR_GGUF_ARRAY:
        if (kv->v.arr.type == MR_GGUF_STRING)
            rc = mr_gguf_writer_set_arr_mrstr(w, key, kv->v.arr.strs, kv->v.arr.n);
        else
            rc = mr_gguf_writer_set_arr(w, key, kv->v.arr.type, kv->v.arr.data, kv->v.arr.n);
        break;
    default:
        rc = w_fail(w, "gguf writer: key '%s': unknown value type %d", key, (int)kv->type);
    }
    free(key);
    return rc;
}

int mr_gguf_writer_add_tensor(mr_gguf_writer *w, const char *name, enum mr_type type,
                              uint32_t n_dims, const int64_t *ne, const void *data)
{
    if (!w)
        return -1;
    if (!name || !*name)
        return w_fail(w, "gguf writer: tensor with an empty name");
    if (n_dims < 1 || n_dims > MR_GGUF_MAX_DIMS || !ne)
        return w_fail(w, "gguf writer: tensor '%s': n_dims %u (expected 1..%d)", name, n_dims,
                      MR_GGUF_MAX_DIMS);
    const mr_type_info *ti = mr_type_get((int)type);
    if (!ti || !ti->known)
        return w_fail(w, "gguf writer: tensor '%s': unknown type %d", name, (int)type);
    wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    int64_t nel = 1;
    for (int d = 0; d < MR_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < (int)n_dims ? ne[d] : 1;
        if (t.ne[d] <= 0 || __builtin_mul_overflow(nel, t.ne[d], &nel))
            return w_fail(w, "gguf writer: tensor '%s': bad dimension ne[%d] = %lld", name, d,
                          (long long)t.ne[d]);
    }
    size_t row = mr_row_size((int)type, t.ne[0]);
    if (!row)
        return w_fail(w, "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block",
                      name, (long long)t.ne[0], ti->name);
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)row, (uint64_t)(nel / t.ne[0]), &nbytes) ||
        nbytes > SIZE_MAX / 2)
        return w_fail(w, "gguf writer: tensor '%s': byte size overflows", name);
    t.nbytes = (size_t)nbytes;
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return w_fail(w, "gguf writer: duplicate tensor '%s'", name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt)
            return w_fail(w, "gguf writer: out of memory");
        w->t = nt;
        w->cap_t = cap;
    }
    t.name = strdup(name);
    if (!t.name)
        return w_fail(w, "gguf writer: out of memory");
    w->t[w->n_t++] = t;
    return 0;
}

/* Data section writing: the tensors are cut into chunks of whole blocks,
 * which threads take in order and write with pwrite. */
#define CHUNK_BYTES (8u << 20)

typedef struct wjob {
    const mr_gguf_writer *w;
    int fd;
    size_t data_offset;
    mr_gguf_fill_fn fill;
    void *ctx;
    pthread_mutex_t mu;
    size_t cur_t; /* chunk cursor: tensor, then offset inside it */
    size_t cur_off;
    atomic_bool failed;
    mr_err err;
} wjob;

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = pwrite(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (k == 0) {
            errno = EIO;
            return -1;
        }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

static size_t chunk_for(const wtensor *t)
{
    const mr_type_info *ti = mr_type_get((int)t->type);
    size_t bb = ti->block_bytes;
    size_t c = CHUNK_BYTES / bb * bb;
    return c ? c : bb;
}

/* Takes the next chunk; false when all are taken. */
static bool next_chunk(wjob *j, size_t *ti, size_t *off, size_t *len)
{
    bool ok = false;
    pthread_mutex_lock(&j->mu);
    while (j->cur_t < j->w->n_t) {
        const wtensor *t = &j->w->t[j->cur_t];
        if (j->cur_off < t->nbytes) {
            size_t c = chunk_for(t);
            *ti = j->cur_t;
            *off = j->cur_off;
            *len = t->nbytes - j->cur_off < c ? t->nbytes - j->cur_off : c;
            j->cur_off += *len;
            ok = true;
            break;
        }
        j->cur_t++;
        j->cur_off = 0;
    }
    pthread_mutex_unlock(&j->mu);
    return ok;
}

static void job_fail(wjob *j, const mr_err *e)
{
    pthread_mutex_lock(&j->mu);
    if (!atomic_load(&j->failed)) {
        j->err = *e;
        atomic_store(&j->failed, true);
    }
    pthread_mutex_unlock(&j->mu);
}

static void *write_worker(void *arg)
{
    wjob *j = arg;
    uint8_t *buf = NULL;
    size_t ti, off, len;
    mr_err e = {{0}};
    while (!atomic_load(&j->failed) && next_chunk(j, &ti, &off, &len)) {
        const wtensor *t = &j->w->t[ti];
        const void *src;
        if (t->data) {
            src = (const uint8_t *)t->data + off;
        } else {
            if (!buf && !(buf = malloc(CHUNK_BYTES + 4096))) {
                mr_errf(&e, "gguf writer: out of memory for a %u-byte buffer", CHUNK_BYTES);
                job_fail(j, &e);
                break;
            }
            mr_gguf_tensor desc = {.name = t->name, .n_dims = t->n_dims, .type = t->type,
                                   .offset = t->offset, .nbytes = t->nbytes, .data = NULL};
            memcpy(desc.ne, t->ne, sizeof desc.ne);
            e.msg[0] = '\0';
            if (j->fill(j->ctx, &desc, ti, off, buf, len, &e)) {
                if (!e.msg[0])
                    mr_errf(&e, "fill failed");
                mr_err_wrap(&e, "gguf writer: tensor '%s' bytes [%zu, %zu)", t->name, off, off + len);
                job_fail(j, &e);
                break;
            }
            src = buf;
        }
        if (pwrite_all(j->fd, src, len, j->data_offset + t->offset + off)) {
            mr_errf(&e, "gguf writer: tensor '%s': write of %zu bytes failed: %s", t->name, len,
                    strerror(errno));
            job_fail(j, &e);
            break;
        }
    }
    free(buf);
    return NULL;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

int mr_gguf_writer_write_file(mr_gguf_writer *w, const char *path, mr_gguf_fill_fn fill,
                              void *ctx, unsigned n_threads, mr_err *err)
{
    if (!w)
        return mr_errf(err, "gguf writer: NULL writer");
    if (w->err[0])
        return mr_errf(err, "%s", w->err);
    for (size_t i = 0; i < w->n_t; i++)
        if (!w->t[i].data && !fill)
            return mr_errf(err, "gguf writer: tensor '%s' has no data and no fill callback was given",
                           w->t[i].name);

    /* header, key/values, tensor infos */
    wbuf h = {0};
    wb_u32(&h, MR_GGUF_MAGIC);
    wb_u32(&h, 3);
    wb_u64(&h, w->n_t);
    wb_u64(&h, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        wb_str(&h, w->kv[i].key, strlen(w->kv[i].key));
        wb_u32(&h, (uint32_t)w->kv[i].type);
        wb_put(&h, w->kv[i].val, w->kv[i].val_len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        off = align_up(off + t->nbytes, w->alignment);
        wb_str(&h, t->name, strlen(t->name));
        wb_u32(&h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            wb_u64(&h, (uint64_t)t->ne[d]);
        wb_u32(&h, (uint32_t)t->type);
        wb_u64(&h, t->offset);
    }
    if (h.oom) {
        free(h.p);
        return mr_errf(err, "gguf writer: out of memory for the header");
    }
    size_t data_offset = align_up(h.n, w->alignment);
    uint64_t total = w->n_t ? data_offset + off : h.n;

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        free(h.p);
        return mr_errf(err, "gguf writer: out of memory");
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(h.p);
        free(tmp);
        return mr_errf(err, "gguf writer: %s: cannot create a temporary file: %s", path, strerror(e));
    }
    mode_t um = umask(0);
    umask(um);
    int rc = -1;
    if (fchmod(fd, 0666 & ~um) != 0 || ftruncate(fd, (off_t)total) != 0 ||
        pwrite_all(fd, h.p, h.n, 0) != 0) {
        mr_errf(err, "gguf writer: %s: writing the header: %s", tmp, strerror(errno));
        goto out;
    }

    if (w->n_t) {
        wjob j = {.w = w, .fd = fd, .data_offset = data_offset, .fill = fill, .ctx = ctx};
        pthread_mutex_init(&j.mu, NULL);
        atomic_init(&j.failed, false);
        if (n_threads == 0) {
            long nc = sysconf(_SC_NPROCESSORS_ONLN);
            n_threads = nc > 0 ? (unsigned)nc : 1;
        }
        if (n_threads > 256)
            n_threads = 256;
        pthread_t th[256];
        unsigned started = 0;
        for (unsigned i = 1; i < n_threads; i++) {
            if (pthread_create(&th[started], NULL, write_worker, &j) != 0)
                break;
            started++;
        }
        write_worker(&j);
        for (unsigned i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        pthread_mutex_destroy(&j.mu);
        if (atomic_load(&j.failed)) {
            if (err)
                *err = j.err;
            goto out;
        }
    }
    if (close(fd) != 0) {
        fd = -1;
        mr_errf(err, "gguf writer: %s: close: %s", tmp, strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        mr_errf(err, "gguf writer: cannot rename %s to %s: %s", tmp, path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    if (rc)
        unlink(tmp);
    free(tmp);
    free(h.p);
    return rc;
}

int mr_gguf_writer_write(mr_gguf_writer *w, const char *path, mr_err *err)
{
    return mr_gguf_writer_write_file(w, path, NULL, NULL, 1, err);
}
