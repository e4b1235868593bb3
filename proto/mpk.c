#include "proto/mpk.h"

#include <math.h>
#include <string.h>

void mr_mpk_init(mr_mpk *r, const void *data, size_t len)
{
    r->p = data;
    r->len = len;
    r->off = 0;
}

static size_t left(const mr_mpk *r) { return r->len - r->off; }

static int need(mr_mpk *r, size_t n, mr_err *err)
{
    if (left(r) < n)
        return mr_errf(err, "msgpack: truncated at byte %zu (need %zu, have %zu)", r->off, n, left(r));
    return 0;
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Reads a big-endian integer of n bytes following the tag byte. */
static int take(mr_mpk *r, int n, uint64_t *v, mr_err *err)
{
    if (need(r, (size_t)n, err))
        return -1;
    *v = be(r->p + r->off, n);
    r->off += (size_t)n;
    return 0;
}

static int tag(mr_mpk *r, uint8_t *t, mr_err *err)
{
    if (need(r, 1, err))
        return -1;
    *t = r->p[r->off++];
    return 0;
}

static int kind_err(mr_mpk *r, const char *want, uint8_t t, mr_err *err)
{
    return mr_errf(err, "msgpack: expected %s at byte %zu, found tag 0x%02x", want, r->off - 1, t);
}

/* Container lengths must be plausible: every element takes at least one byte
 * (two for map entries), so a count larger than the bytes left is a lie. */
static int check_count(mr_mpk *r, uint64_t n, size_t per, mr_err *err)
{
    if (n > left(r) / per)
        return mr_errf(err, "msgpack: container of %llu entries at byte %zu exceeds the %zu bytes left",
                       (unsigned long long)n, r->off, left(r));
    return 0;
}

/* A map or an array header: fix form (tag & 0xf0) == fix, or the 16-bit
 * (tag16) and 32-bit (tag16 + 1) forms; `per` values follow each entry. */
static int container(mr_mpk *r, uint8_t fix, uint8_t tag16, size_t per, const char *what, uint32_t *n,
                     mr_err *err)
{
    uint8_t t;
    uint64_t v;
    if (tag(r, &t, err))
        return -1;
    if ((t & 0xf0) == fix)
        v = t & 0x0f;
    else if (t == tag16 || t == tag16 + 1) {
        if (take(r, t == tag16 ? 2 : 4, &v, err))
            return -1;
    } else
        return kind_err(r, what, t, err);
    if (check_count(r, v, per, err))
        return -1;
    *n = (uint32_t)v;
    return 0;
}

int mr_mpk_map(mr_mpk *r, uint32_t *n, mr_err *err) { return container(r, 0x80, 0xde, 2, "map", n, err); }

int mr_mpk_array(mr_mpk *r, uint32_t *n, mr_err *err) { return container(r, 0x90, 0xdc, 1, "array", n, err); }

static int raw(mr_mpk *r, uint64_t n, const char **s, uint32_t *len, mr_err *err)
{
    if (need(r, n, err))
        return -1;
    *s = (const char *)r->p + r->off;
    *len = (uint32_t)n;
    r->off += n;
    return 0;
}

int mr_mpk_str(mr_mpk *r, const char **s, uint32_t *n, mr_err *err)
{
    uint8_t t;
    uint64_t v;
    if (tag(r, &t, err))
        return -1;
    if ((t & 0xe0) == 0xa0)
        v = t & 0x1f;
    else if (t >= 0xd9 && t <= 0xdb) {
        if (take(r, 1 << (t - 0xd9), &v, err))
            return -1;
    } else
        return kind_err(r, "string", t, err);
    return raw(r, v, s, n, err);
}

/* Reads any integer; *neg says whether it was a negative one (then *v holds
 * the two's complement bits of the int64).  Returns 1 when the tag it
 * consumed (*t) is not an integer's. */
static int any_int(mr_mpk *r, uint64_t *v, bool *neg, uint8_t *t, mr_err *err)
{
    if (tag(r, t, err))
        return -1;
    uint8_t c = *t;
    *neg = false;
    if (c <= 0x7f) {
        *v = c;
        return 0;
    }
    if (c >= 0xe0) {
        *v = (uint64_t)(int64_t)(int8_t)c;
        *neg = true;
        return 0;
    }
    if (c >= 0xcc && c <= 0xcf)
        return take(r, 1 << (c - 0xcc), v, err);
    if (c >= 0xd0 && c <= 0xd3) {
        int n = 1 << (c - 0xd0);
        uint64_t u;
        if (take(r, n, &u, err))
            return -1;
        int64_t s;
        switch (n) {
        case 1: s = (int8_t)u; break;
        case 2: s = (int16_t)u; break;
        case 4: s = (int32_t)u; break;
        default: s = (int64_t)u; break;
        }
        *neg = s < 0;
        *v = (uint64_t)s;
        return 0;
    }
    return 1; /* not an integer: the caller reads tag *t another way */
}

int mr_mpk_uint(mr_mpk *r, uint64_t *v, mr_err *err)
{
    bool neg;
    uint8_t t;
    int rc = any_int(r, v, &neg, &t, err);
    if (rc < 0)
        return -1;
    if (rc > 0)
        return kind_err(r, "unsigned integer", t, err);
    if (neg)
        return mr_errf(err, "msgpack: expected unsigned integer at byte %zu, found a negative one", r->off);
    return 0;
}

int mr_mpk_int(mr_mpk *r, int64_t *v, mr_err *err)
{
    bool neg;
    uint8_t t;
    uint64_t u;
    int rc = any_int(r, &u, &neg, &t, err);
    if (rc < 0)
        return -1;
    if (rc > 0)
        return kind_err(r, "integer", t, err);
    if (!neg && u > INT64_MAX)
        return mr_errf(err, "msgpack: integer at byte %zu does not fit int64", r->off);
    *v = (int64_t)u;
    return 0;
}

int mr_mpk_num(mr_mpk *r, double *v, mr_err *err)
{
    bool neg;
    uint8_t t;
    uint64_t u;
    int rc = any_int(r, &u, &neg, &t, err);
    if (rc < 0)
        return -1;
    if (rc == 0) {
        *v = neg ? (double)(int64_t)u : (double)u;
        return 0;
    }
    if (t == 0xca) {
        if (take(r, 4, &u, err))
            return -1;
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, 4);
        *v = f;
    } else if (t == 0xcb) {
        if (take(r, 8, &u, err))
            return -1;
        memcpy(v, &u, 8);
    } else
        return kind_err(r, "number", t, err);
    if (!isfinite(*v))
        return mr_errf(err, "msgpack: non-finite number at byte %zu", r->off);
    return 0;
}

int mr_mpk_bool(mr_mpk *r, bool *v, mr_err *err)
{
    uint8_t t;
    if (tag(r, &t, err))
        return -1;
    if (t == 0xc2 || t == 0xc3) {
        *v = t == 0xc3;
        return 0;
    }
    return kind_err(r, "boolean", t, err);
}

bool mr_mpk_nil(mr_mpk *r)
{
    if (left(r) >= 1 && r->p[r->off] == 0xc0) {
        r->off++;
        return true;
    }
    return false;
}

int mr_mpk_skip(mr_mpk *r, int depth, mr_err *err)
{
    if (depth <= 0)
        return mr_errf(err, "msgpack: nesting too deep at byte %zu", r->off);
    uint8_t t;
    uint64_t v;
    if (tag(r, &t, err))
        return -1;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3)
        return 0;
    if ((t & 0xe0) == 0xa0)
        return need(r, t & 0x1f, err) ? -1 : (r->off += t & 0x1f, 0);
    uint64_t n;
    size_t per = 1;
    switch (t) {
    case 0xcc: case 0xd0: return take(r, 1, &v, err);
    case 0xcd: case 0xd1: return take(r, 2, &v, err);
    case 0xce: case 0xd2: case 0xca: return take(r, 4, &v, err);
    case 0xcf: case 0xd3: case 0xcb: return take(r, 8, &v, err);
    case 0xc4: case 0xd9: if (take(r, 1, &n, err)) return -1; goto bytes;
    case 0xc5: case 0xda: if (take(r, 2, &n, err)) return -1; goto bytes;
    case 0xc6: case 0xdb: if (take(r, 4, &n, err)) return -1; goto bytes;
    case 0xd4: n = 2; goto bytes;
    case 0xd5: n = 3; goto bytes;
    case 0xd6: n = 5; goto bytes;
    case 0xd7: n = 9; goto bytes;
    case 0xd8: n = 17; goto bytes;
    case 0xc7: if (take(r, 1, &n, err)) return -1; n += 1; goto bytes;
    case 0xc8: if (take(r, 2, &n, err)) return -1; n += 1; goto bytes;
    case 0xc9: if (take(r, 4, &n, err)) return -1; n += 1; goto bytes;
    case 0xdc: if (take(r, 2, &n, err)) return -1; goto array;
    case 0xdd: if (take(r, 4, &n, err)) return -1; goto array;
    case 0xde: if (take(r, 2, &n, err)) return -1; per = 2; goto array;
    case 0xdf: if (take(r, 4, &n, err)) return -1; per = 2; goto array;
    default: break;
    }
    if ((t & 0xf0) == 0x90) {
        n = t & 0x0f;
        goto array;
    }
    if ((t & 0xf0) == 0x80) {
        n = t & 0x0f;
        per = 2;
        goto array;
    }
    return mr_errf(err, "msgpack: invalid tag 0x%02x at byte %zu", t, r->off - 1);
bytes:
    if (need(r, n, err))
        return -1;
    r->off += n;
    return 0;
array:
    if (check_count(r, n, per, err))
        return -1;
    for (uint64_t i = 0; i < n * per; i++)
        if (mr_mpk_skip(r, depth - 1, err))
            return -1;
    return 0;
}
