/* The single-scale block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (32
 * elements per block) and the low-bit Q1_0 (128) and Q2_0 (64).
 *
 * Layouts (little-endian, fp16 scales):
 *   Q4_0  d | qs[16]            x = d * (q - 8)
 *   Q4_1  d m | qs[16]          x = d * q + m
 *   Q5_0  d | qh[4] | qs[16]    x = d * (q - 16)
 *   Q5_1  d m | qh[4] | qs[16]  x = d * q + m
 *   Q8_0  d | qs[32] (int8)     x = d * q
 *   Q8_1  d s | qs[32] (int8)   x = d * q   (s = d * sum(q), for dot kernels)
 *   Q1_0  d | qs[16] (bits)     x = bit ? d : -d
 *   Q2_0  d | qs[16] (2 bits)   x = d * (q - 1)
 * In the 4/5-bit formats element j < 16 is the low nibble of qs[j] and
 * element j + 16 its high nibble; element j's fifth bit is bit j of the
 * 32-bit little-endian qh.  Q1_0 / Q2_0 pack elements from the low bits up. */
#include <math.h>
#include <string.h>

#include "common/quant_impl.h"

static void min_max(const float *x, int n, float *mn, float *mx)
{
    *mn = x[0];
    *mx = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < *mn)
            *mn = x[i];
        if (x[i] > *mx)
            *mx = x[i];
    }
}

static inline float inv(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

/* ---- Q4_0 ---- */

void mr_dq_q4_0(const uint8_t *s, float *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 18, d += 32) {
        const float sc = mr_rdf16(s);
        for (int j = 0; j < 16; j++) {
            d[j] = sc * (float)((s[2 + j] & 0xf) - 8);
            d[j + 16] = sc * (float)((s[2 + j] >> 4) - 8);
        }
    }
}

void mr_qz_q4_0(const float *s, uint8_t *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 32, d += 18) {
        /* the largest magnitude maps to -8, using the whole signed range */
        const float sc = mr_wrf16(d, mr_signed_absmax(s, 32) / -8.0f);
        const float id = inv(sc);
        for (int j = 0; j < 16; j++) {
            int lo = mr_clampi(mr_iround(s[j] * id) + 8, 0, 15);
            int hi = mr_clampi(mr_iround(s[j + 16] * id) + 8, 0, 15);
            d[2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* ---- Q4_1 ---- */

void mr_dq_q4_1(const uint8_t *s, float *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 20, d += 32) {
        const float sc = mr_rdf16(s), m = mr_rdf16(s + 2);
        for (int j = 0; j < 16; j++) {
            d[j] = sc * (float)(s[4 + j] & 0xf) + m;
            d[j + 16] = sc * (float)(s[4 + j] >> 4) + m;
        }
    }
}

void mr_qz_q4_1(const float *s, uint8_t *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 32, d += 20) {
        float mn, mx;
        min_max(s, 32, &mn, &mx);
        const float sc = mr_wrf16(d, (mx - mn) / 15.0f);
        const float m = mr_wrf16(d + 2, mn);
        const float id = inv(sc);
        for (int j = 0; j < 16; j++) {
            int lo = mr_clampi(mr_iround((s[j] - m) * id), 0, 15);
            int hi = mr_clampi(mr_iround((s[j + 16] - m) * id), 0, 15);
            d[4 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

/* ---- Q5_0 / Q5_1 ---- */

static void unpack5(const uint8_t *qh4, const uint8_t *qs, int q[32])
{
    const uint32_t qh = mr_rd32(qh4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xf) | (int)(((qh >> j) & 1u) << 4);
        q[j + 16] = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    }
}

static void pack5(const int q[32], uint8_t *qh4, uint8_t *qs)
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    mr_wr32(qh4, qh);
}

void mr_dq_q5_0(const uint8_t *s, float *d, int64_t nb)
{
    int q[32];
    for (int64_t b = 0; b < nb; b++, s += 22, d += 32) {
        const float sc = mr_rdf16(s);
        unpack5(s + 2, s + 6, q);
        for (int j = 0; j < 32; j++)
            d[j] = sc * (float)(q[j] - 16);
    }
}

void mr_qz_q5_0(const float *s, uint8_t *d, int64_t nb)
{
    int q[32];
    for (int64_t b = 0; b < nb; b++, s += 32, d += 22) {
        const float sc = mr_wrf16(d, mr_signed_absmax(s, 32) / -16.0f);
        const float id = inv(sc);
        for (int j = 0; j < 32; j++)
            q[j] = mr_clampi(mr_iround(s[j] * id) + 16, 0, 31);
        pack5(q, d + 2, d + 6);
    }
}

void mr_dq_q5_1(const uint8_t *s, float *d, int64_t nb)
{
    int q[32];
    for (int64_t b = 0; b < nb; b++, s += 24, d += 32) {
        const float sc = mr_rdf16(s), m = mr_rdf16(s + 2);
        unpack5(s + 4, s + 8, q);
        for (int j = 0; j < 32; j++)
            d[j] = sc * (float)q[j] + m;
    }
}

void mr_qz_q5_1(const float *s, uint8_t *d, int64_t nb)
{
    int q[32];
    for (int64_t b = 0; b < nb; b++, s += 32, d += 24) {
        float mn, mx;
        min_max(s, 32, &mn, &mx);
        const float sc = mr_wrf16(d, (mx - mn) / 31.0f);
        const float m = mr_wrf16(d + 2, mn);
        const float id = inv(sc);
        for (int j = 0; j < 32; j++)
            q[j] = mr_clampi(mr_iround((s[j] - m) * id), 0, 31);
        pack5(q, d + 4, d + 8);
    }
}

/* ---- Q8_0 / Q8_1 ---- */

void mr_dq_q8_0(const uint8_t *s, float *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 34, d += 32) {
        const float sc = mr_rdf16(s);
        for (int j = 0; j < 32; j++)
            d[j] = sc * (float)(int8_t)s[2 + j];
    }
}

/* Writes the 32 int8 codes of x at q for scale amax/127; returns their sum. */
static int quant8(const float *x, float sc, uint8_t *q)
{
    const float id = inv(sc);
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        int v = mr_clampi(mr_iround(x[j] * id), -127, 127);
        q[j] = (uint8_t)(int8_t)v;
        sum += v;
    }
    return sum;
}

void mr_qz_q8_0(const float *s, uint8_t *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 32, d += 34) {
        const float sc = mr_wrf16(d, mr_absmax(s, 32) / 127.0f);
        quant8(s, sc, d + 2);
    }
}

void mr_dq_q8_1(const uint8_t *s, float *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 36, d += 32) {
        const float sc = mr_rdf16(s);
        for (int j = 0; j < 32; j++)
            d[j] = sc * (float)(int8_t)s[4 + j];
    }
}

void mr_qz_q8_1(const float *s, uint8_t *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 32, d += 36) {
        const float sc = mr_wrf16(d, mr_absmax(s, 32) / 127.0f);
        int sum = quant8(s, sc, d + 4);
        mr_wrf16(d + 2, sc * (float)sum);
    }
}

/* ---- Q1_0 ---- */

void mr_dq_q1_0(const uint8_t *s, float *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 18, d += 128) {
        const float sc = mr_rdf16(s);
        for (int j = 0; j < 128; j++)
            d[j] = ((s[2 + j / 8] >> (j % 8)) & 1) ? sc : -sc;
    }
}

void mr_qz_q1_0(const float *s, uint8_t *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 128, d += 18) {
        /* the mean magnitude is the least-squares scale for sign codes */
        double sum = 0.0;
        for (int j = 0; j < 128; j++)
            sum += fabsf(s[j]);
        mr_wrf16(d, (float)(sum / 128.0));
        memset(d + 2, 0, 16);
        for (int j = 0; j < 128; j++)
            if (s[j] >= 0.0f)
                d[2 + j / 8] |= (uint8_t)(1u << (j % 8));
    }
}

/* ---- Q2_0 ---- */

void mr_dq_q2_0(const uint8_t *s, float *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 18, d += 64) {
        const float sc = mr_rdf16(s);
        for (int j = 0; j < 64; j++)
            d[j] = sc * (float)(((s[2 + j / 4] >> (2 * (j % 4))) & 3) - 1);
    }
}

void mr_qz_q2_0(const float *s, uint8_t *d, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 64, d += 18) {
        /* levels are -1, 0, 1, 2 (times d, d > 0): a positive extreme maps
         * to 2, a negative one to -1 */
        const float m = mr_signed_absmax(s, 64);
        const float sc = mr_wrf16(d, m >= 0.0f ? m / 2.0f : -m);
        const float id = inv(sc);
        memset(d + 2, 0, 16);
        for (int j = 0; j < 64; j++) {
            int q = mr_clampi(mr_iround(s[j] * id) + 1, 0, 3);
            d[2 + j / 4] |= (uint8_t)(q << (2 * (j % 4)));
        }
    }
}
