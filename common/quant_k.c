/* K-quants: 256-element super-blocks with per-sub-block scales that are
 * themselves quantized against one or two fp16 super-block scales.
 *
 * Layouts (byte offsets; e is the element index 0..255 in the block):
 *   Q2_K 84:  scales[16]@0 (low nibble scale, high nibble min), qs[64]@16,
 *             d@80, dmin@82.  q = 2 bits of qs[32*(e/128) + e%32] at bit
 *             2*((e%128)/32); x = d*sc*q - dmin*m for sub-block e/16.
 *   Q3_K 110: hmask[32]@0, qs[64]@32, scales[12]@96, d@108.  q as in Q2_K,
 *             minus 4 unless bit e/32 of hmask[e%32] is set; 6-bit signed
 *             (offset 32) scale per sub-block e/16; x = d*(sc-32)*q.
 *   Q4_K 144: d@0, dmin@2, scales[12]@4, qs[128]@16.  Sub-block e/32; q is
 *             the low nibble of qs[32*(e/64) + e%32] for the first 32 of
 *             each 64, the high nibble for the second; x = d*sc*q - dmin*m.
 *   Q5_K 176: as Q4_K with qh[32]@16 and qs[128]@48: bit e/32 of
 *             qh[e%32] adds 16 to q.
 *   Q6_K 210: ql[128]@0, qh[64]@128, int8 scales[16]@192, d@208.  With
 *             h = e/128, r = (e%128)/32, l = e%32: low 4 bits are nibble
 *             r/2 of ql[64h + 32(r%2) + l], high 2 bits are bits 2r..2r+1
 *             of qh[32h + l]; x = d*sc[e/16]*(q - 32).
 *   Q8_K 292: float32 d@0, int8 qs[256]@4, int16 bsums[16]@260; x = d*q.
 * Q4_K / Q5_K pack eight 6-bit scales and mins into 12 bytes: for j < 4,
 * byte j holds scale j (low 6 bits) and the top 2 bits of scale j+4, byte
 * j+4 the same for the mins, byte j+8 the low nibbles of scale j+4 (low)
 * and min j+4 (high). */
#include <math.h>
#include <string.h>

#include "common/quant_impl.h"

/* ---- scale packing ---- */

static void get_scale_min_k4(const uint8_t *q, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void put_scale_min_k4(uint8_t *q, const int sc[8], const int m[8])
{
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4));
    }
}

/* Q3_K: sub-block j's 6-bit code (0..63; the scale is code - 32). */
static int get_scale_q3(const uint8_t *s, int j)
{
    int lo = j < 8 ? (s[j] & 0xf) : (s[j - 8] >> 4);
    int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return lo | (hi << 4);
}

static void put_scales_q3(uint8_t *s, const int code[16])
{
    memset(s, 0, 12);
    for (int j = 0; j < 16; j++) {
        if (j < 8)
            s[j] |= (uint8_t)(code[j] & 0xf);
        else
            s[j - 8] |= (uint8_t)((code[j] & 0xf) << 4);
        s[8 + j % 4] |= (uint8_t)(((code[j] >> 4) & 3) << (2 * (j / 4)));
    }
}

/* 2-bit fields shared by Q2_K and Q3_K */
static inline int get_q2(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

static void put_q2(uint8_t *qs, const uint8_t L[256])
{
    memset(qs, 0, 64);
    for (int e = 0; e < 256; e++)
        qs[32 * (e / 128) + e % 32] |= (uint8_t)((L[e] & 3) << (2 * ((e % 128) / 32)));
}

/* 4-bit fields shared by Q4_K and Q5_K: sub-block j is the low (j even) or
 * high (j odd) nibbles of bytes 32*(j/2) .. 32*(j/2)+31 */
static void put_q4(uint8_t *qs, const uint8_t L[256])
{
    memset(qs, 0, 128);
    for (int e = 0; e < 256; e++)
        qs[32 * (e / 64) + e % 32] |= (uint8_t)((L[e] & 0xf) << ((e % 64) < 32 ? 0 : 4));
}

/* ---- dequantize ---- */

void mr_dq_q2_k(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 84, y += 256) {
        const float d = mr_rdf16(s + 80), dmin = mr_rdf16(s + 82);
        for (int e = 0; e < 256; e++) {
            const uint8_t sc = s[e / 16];
            y[e] = d * (float)(sc & 0xf) * (float)get_q2(s + 16, e) - dmin * (float)(sc >> 4);
        }
    }
}

void mr_dq_q3_k(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 110, y += 256) {
        const float d = mr_rdf16(s + 108);
        float dl[16];
        for (int j = 0; j < 16; j++)
            dl[j] = d * (float)(get_scale_q3(s + 96, j) - 32);
        for (int e = 0; e < 256; e++) {
            int q = get_q2(s + 32, e) - (((s[e % 32] >> (e / 32)) & 1) ? 0 : 4);
            y[e] = dl[e / 16] * (float)q;
        }
    }
}

void mr_dq_q4_k(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 144, y += 256) {
        const float d = mr_rdf16(s), dmin = mr_rdf16(s + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            get_scale_min_k4(s + 4, j, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            /* sub-block j: the low (j even) or high (j odd) nibbles of 32 bytes */
            const uint8_t *q = s + 16 + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++)
                y[32 * j + l] = dl * (float)((q[l] >> shift) & 0xf) - ml;
        }
    }
}

void mr_dq_q5_k(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 176, y += 256) {
        const float d = mr_rdf16(s), dmin = mr_rdf16(s + 2);
        const uint8_t *qh = s + 16;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            get_scale_min_k4(s + 4, j, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = s + 48 + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                const int v = ((q[l] >> shift) & 0xf) | (((qh[l] >> j) & 1) << 4);
                y[32 * j + l] = dl * (float)v - ml;
            }
        }
    }
}

void mr_dq_q6_k(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 210, y += 256) {
        const float d = mr_rdf16(s + 208);
        const int8_t *sc = (const int8_t *)(s + 192);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = s + 64 * h, *qh = s + 128 + 32 * h;
            for (int r = 0; r < 4; r++) {
                /* quarter r of this half: nibble r/2 of ql[32*(r%2) + l],
                 * bits 2r..2r+1 of qh[l] */
                const uint8_t *lo = ql + 32 * (r % 2);
                const int e0 = 128 * h + 32 * r;
                for (int l = 0; l < 32; l++) {
                    const int q = ((lo[l] >> (4 * (r / 2))) & 0xf) | (((qh[l] >> (2 * r)) & 3) << 4);
                    y[e0 + l] = d * (float)sc[(e0 + l) / 16] * (float)(q - 32);
                }
            }
        }
    }
}

void mr_dq_q8_k(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 292, y += 256) {
        const float d = mr_bits_to_f32(mr_rd32(s));
        for (int e = 0; e < 256; e++)
            y[e] = d * (float)(int8_t)s[4 + e];
    }
}

/* ---- scale search ----
 * Each sub-block gets the scale (and min) that minimise the squared error
 * over a small set of candidate grids: for each candidate the codes are
 * rounded, then scale (and offset) are refitted by least squares for those
 * codes.  The sub-block scales are then quantized against the super-block
 * scale and the codes rounded again with the scales the decoder will see. */

/* x ~ a*L - m with L in [0, nmax], a >= 0, m >= 0.  Returns a, sets *m. */
static float fit_affine(const float *x, int n, int nmax, float *m_out)
{
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; i++) {
        if (x[i] < lo)
            lo = x[i];
        if (x[i] > hi)
            hi = x[i];
    }
    *m_out = -lo;
    if (!(hi > lo))
        return 0.0f;
    float best_a = (hi - lo) / (float)nmax, best_m = -lo, best_err = INFINITY;
    for (int k = -6; k <= 6; k++) {
        const float iscale = ((float)nmax + 0.1f * (float)k) / (hi - lo);
        double sl = 0, sll = 0, sx = 0, slx = 0;
        int L[32];
        for (int i = 0; i < n; i++) {
            L[i] = mr_clampi(mr_iround((x[i] - lo) * iscale), 0, nmax);
            sl += L[i];
            sll += (double)L[i] * L[i];
            sx += x[i];
            slx += (double)L[i] * x[i];
        }
        const double det = n * sll - sl * sl;
        if (det <= 0)
            continue;
        double a = (n * slx - sl * sx) / det;
        double b = (sll * sx - sl * slx) / det;
        if (b > 0) { /* the offset must be a non-negative min: refit without it */
            b = 0;
            a = slx / sll;
        }
        if (a <= 0)
            continue;
        double err = 0;
        for (int i = 0; i < n; i++) {
            double r = a * L[i] + b - x[i];
            err += r * r;
        }
        if (err < best_err) {
            best_err = (float)err;
            best_a = (float)a;
            best_m = (float)-b;
        }
    }
    *m_out = best_m;
    return best_a;
}

/* x ~ a*L with L in [-nneg, npos]; a may be negative. */
static float fit_symmetric(const float *x, int n, int nneg, int npos)
{
    const float max = mr_signed_absmax(x, n);
    if (max == 0.0f)
        return 0.0f;
    float best_a = max / (float)-nneg;
    double best_err = INFINITY;
    /* map the extreme to either end of the code range, a little inside or out */
    for (int end = 0; end < 2; end++) {
        const float top = end == 0 ? (float)-nneg : (float)npos;
        for (int k = -6; k <= 6; k++) {
            const float iscale = (top + (top < 0 ? -0.1f : 0.1f) * (float)k) / max;
            double sll = 0, slx = 0;
            int L[32];
            for (int i = 0; i < n; i++) {
                L[i] = mr_clampi(mr_iround(x[i] * iscale), -nneg, npos);
                sll += (double)L[i] * L[i];
                slx += (double)L[i] * x[i];
            }
            if (sll <= 0)
                continue;
            const double a = slx / sll;
            double err = 0;
            for (int i = 0; i < n; i++) {
                double r = a * L[i] - x[i];
                err += r * r;
            }
            if (err < best_err) {
                best_err = err;
                best_a = (float)a;
            }
        }
    }
    return best_a;
}

/* Quantizes n non-negative values against a scale with codes 0..qmax;
 * returns the stored fp16 scale (max/qmax) and writes the codes. */
static float quant_unsigned_scales(uint8_t *d16, const float *v, int n, int qmax, int *code)
{
    float vmax = 0.0f;
    for (int j = 0; j < n; j++)
        if (v[j] > vmax)
            vmax = v[j];
    const float d = mr_wrf16(d16, vmax / (float)qmax);
    for (int j = 0; j < n; j++)
        code[j] = d > 0.0f ? mr_clampi(mr_iround(v[j] / d), 0, qmax) : 0;
    return d;
}

float mr_quant_signed_scales(uint8_t *d16, const float *v, int n, int qneg, int qpos, int *code)
{
    const float d = mr_wrf16(d16, mr_signed_absmax(v, n) / (float)-qneg);
    for (int j = 0; j < n; j++)
        code[j] = d != 0.0f ? mr_clampi(mr_iround(v[j] / d), -qneg, qpos) : 0;
    return d;
}

/* Codes for x ~ s*L - m, L in [0, nmax]. */
static void codes_affine(const float *x, int n, float s, float m, int nmax, uint8_t *L)
{
    for (int i = 0; i < n; i++)
        L[i] = (uint8_t)(s > 0.0f ? mr_clampi(mr_iround((x[i] + m) / s), 0, nmax) : 0);
}

/* ---- quantize ---- */

void mr_qz_q2_k(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 256, y += 84) {
        float sc[16], mn[16];
        int qs[16], qm[16];
        for (int j = 0; j < 16; j++)
            sc[j] = fit_affine(x + 16 * j, 16, 3, &mn[j]);
        const float d = quant_unsigned_scales(y + 80, sc, 16, 15, qs);
        const float dmin = quant_unsigned_scales(y + 82, mn, 16, 15, qm);
        uint8_t L[256];
        for (int j = 0; j < 16; j++) {
            y[j] = (uint8_t)(qs[j] | (qm[j] << 4));
            codes_affine(x + 16 * j, 16, d * (float)qs[j], dmin * (float)qm[j], 3, L + 16 * j);
        }
        put_q2(y + 16, L);
    }
}

/* Shared by Q3_K (codes -4..3, scale codes -32..31) and Q6_K (-32..31,
 * -128..127): fits the 16 sub-block scales, writes d at d16, the scale codes
 * in code and the element codes, offset by nneg to 0..nneg+npos, in L. */
static void qz_k_symmetric(const float *x, uint8_t *d16, int nneg, int npos, int sneg, int spos,
                           int code[16], uint8_t L[256])
{
    float sc[16];
    for (int j = 0; j < 16; j++)
        sc[j] = fit_symmetric(x + 16 * j, 16, nneg, npos);
    const float d = mr_quant_signed_scales(d16, sc, 16, sneg, spos, code);
    for (int e = 0; e < 256; e++) {
        const float s = d * (float)code[e / 16];
        L[e] = (uint8_t)((s != 0.0f ? mr_clampi(mr_iround(x[e] / s), -nneg, npos) : 0) + nneg);
    }
}

void mr_qz_q3_k(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 256, y += 110) {
        int code[16];
        uint8_t L[256];
        qz_k_symmetric(x, y + 108, 4, 3, 32, 31, code, L);
        memset(y, 0, 32); /* hmask */
        for (int e = 0; e < 256; e++) {
            /* 0..7: bit 2 goes to hmask, the low 2 bits to qs */
            if (L[e] & 4)
                y[e % 32] |= (uint8_t)(1u << (e / 32));
            L[e] &= 3;
        }
        for (int j = 0; j < 16; j++)
            code[j] += 32;
        put_scales_q3(y + 96, code);
        put_q2(y + 32, L);
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31); writes d, dmin, the packed
 * scales and the codes in L. */
static void qz_k_affine(const float *x, uint8_t *y, int nmax, uint8_t L[256])
{
    float sc[8], mn[8];
    int qs[8], qm[8];
    for (int j = 0; j < 8; j++)
        sc[j] = fit_affine(x + 32 * j, 32, nmax, &mn[j]);
    const float d = quant_unsigned_scales(y, sc, 8, 63, qs);
    const float dmin = quant_unsigned_scales(y + 2, mn, 8, 63, qm);
    put_scale_min_k4(y + 4, qs, qm);
    for (int j = 0; j < 8; j++)
        codes_affine(x + 32 * j, 32, d * (float)qs[j], dmin * (float)qm[j], nmax, L + 32 * j);
}

void mr_qz_q4_k(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 256, y += 144) {
        uint8_t L[256];
        qz_k_affine(x, y, 15, L);
        put_q4(y + 16, L);
    }
}

void mr_qz_q5_k(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 256, y += 176) {
        uint8_t L[256], lo[256];
        qz_k_affine(x, y, 31, L);
        memset(y + 16, 0, 32);
        for (int e = 0; e < 256; e++) {
            lo[e] = L[e] & 0xf;
            if (L[e] & 0x10)
                y[16 + e % 32] |= (uint8_t)(1u << (e / 32));
        }
        put_q4(y + 48, lo);
    }
}

void mr_qz_q6_k(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 256, y += 210) {
        int code[16];
        uint8_t L[256];
        qz_k_symmetric(x, y + 208, 32, 31, 128, 127, code, L);
        memset(y, 0, 192);
        for (int j = 0; j < 16; j++)
            y[192 + j] = (uint8_t)(int8_t)code[j];
        for (int e = 0; e < 256; e++) {
            const int q = L[e];
            const int h = e / 128, r = (e % 128) / 32, l = e % 32;
            y[64 * h + 32 * (r % 2) + l] |= (uint8_t)((q & 0xf) << (4 * (r / 2)));
            y[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * r));
        }
    }
}

void mr_qz_q8_k(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 256, y += 292) {
        const float d = mr_signed_absmax(x, 256) / -127.0f; /* a float32 scale: no rounding */
        mr_wr32(y, mr_f32_to_bits(d));
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++) {
                int q = d != 0.0f ? mr_clampi(mr_iround(x[e] / d), -128, 127) : 0;
                y[4 + e] = (uint8_t)(int8_t)q;
                sum += q;
            }
            mr_wr16(y + 260 + 2 * j, (uint16_t)(int16_t)sum);
        }
    }
}
