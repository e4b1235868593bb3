/* Formats whose 4-bit codes index a code book instead of a uniform grid.
 *
 *   IQ4_NL 18:  fp16 d@0, qs[16]@2.  x = d * K[q], K the 16 non-uniform
 *               levels below; element j < 16 is the low nibble of qs[j],
 *               j + 16 the high nibble.
 *   IQ4_XS 136: fp16 d@0, u16 scales_h@2, scales_l[4]@4, qs[128]@8.
 *               Sub-block ib (32 elements) has the 6-bit code
 *               ls = nibble ib%2 of scales_l[ib/2] | bits 2ib..2ib+1 of
 *               scales_h << 4; x = d * (ls - 32) * K[q], nibbles as IQ4_NL
 *               within the sub-block's 16 bytes.
 *   MXFP4 17:   E8M0 exponent e@0, qs[16]@1.  x = E2M1[q] * 2^(e - 127)
 *               (OCP MX: the scale is a bare power of two); nibbles as IQ4_NL.
 *   NVFP4 36:   UE4M3 scales d[4]@0, one per 16 elements, qs[32]@4.
 *               x = E2M1[q] * UE4M3(d[s]); sub-block s uses qs[8s..8s+7],
 *               low nibbles for its first 8 elements, high for the last 8.
 * The E2M1 code book is kept doubled (integers) with the scales halved, as
 * upstream does, which gives bit-identical products. */
#include <math.h>
#include <string.h>

#include "common/quant_impl.h"

static const int8_t k_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

/* E2M1 values times 2: codes 0..7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6 and the
 * top bit is the sign. */
static const int8_t k_fp4x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float mr_e8m0_half_to_f32(uint8_t e) { return ldexpf(1.0f, (int)e - 128); }

float mr_ue4m3_to_f32(uint8_t x)
{
    /* upstream reads the low 7 bits (the sign bit is ignored) and treats
     * 0x7F, the E4M3 NaN, as zero */
    if (x == 0 || x == 0x7f)
        return 0.0f;
    const int exp = (x >> 3) & 0xf, man = x & 7;
    if (exp == 0)
        return ldexpf((float)man, -9);
    return ldexpf(1.0f + (float)man / 8.0f, exp - 7);
}

/* Index of the code-book entry nearest to v (the first on ties). */
static int nearest(const int8_t *book, float v)
{
    int best = 0;
    float berr = fabsf(v - (float)book[0]);
    for (int i = 1; i < 16; i++) {
        float err = fabsf(v - (float)book[i]);
        if (err < berr) {
            berr = err;
            best = i;
        }
    }
    return best;
}

/* n codes (n even) for x ~ s * book[q], split in halves across nibbles */
static void put_nibbles(const float *x, int n, float s, const int8_t *book, uint8_t *qs)
{
    const float is = s != 0.0f ? 1.0f / s : 0.0f;
    for (int j = 0; j < n / 2; j++) {
        int lo = nearest(book, x[j] * is), hi = nearest(book, x[j + n / 2] * is);
        qs[j] = (uint8_t)(lo | (hi << 4));
    }
}

static void get_nibbles(const uint8_t *qs, int n, float s, const int8_t *book, float *y)
{
    for (int j = 0; j < n / 2; j++) {
        y[j] = s * (float)book[qs[j] & 0xf];
        y[j + n / 2] = s * (float)book[qs[j] >> 4];
    }
}

/* ---- dequantize ---- */

void mr_dq_iq4_nl(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 18, y += 32)
        get_nibbles(s + 2, 32, mr_rdf16(s), k_iq4nl, y);
}

static int iq4xs_scale(const uint8_t *s, int ib)
{
    const int lo = (s[4 + ib / 2] >> (4 * (ib % 2))) & 0xf;
    const int hi = (mr_rd16(s + 2) >> (2 * ib)) & 3;
    return lo | (hi << 4);
}

void mr_dq_iq4_xs(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 136, y += 256) {
        const float d = mr_rdf16(s);
        for (int ib = 0; ib < 8; ib++)
            get_nibbles(s + 8 + 16 * ib, 32, d * (float)(iq4xs_scale(s, ib) - 32), k_iq4nl, y + 32 * ib);
    }
}

void mr_dq_mxfp4(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 17, y += 32)
        get_nibbles(s + 1, 32, mr_e8m0_half_to_f32(s[0]), k_fp4x2, y);
}

void mr_dq_nvfp4(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 36, y += 64)
        for (int sb = 0; sb < 4; sb++)
            get_nibbles(s + 4 + 8 * sb, 16, 0.5f * mr_ue4m3_to_f32(s[sb]), k_fp4x2, y + 16 * sb);
}

/* ---- quantize ---- */

/* Scale s for x ~ s * K[q] over n elements: candidates map the extreme
 * element near either end of the code book, each refitted by least squares
 * for its codes; the one with the least squared error wins. */
static float fit_iq4(const float *x, int n)
{
    const float max = mr_signed_absmax(x, n);
    if (max == 0.0f)
        return 0.0f;
    float best = max / (float)k_iq4nl[0];
    double best_err = INFINITY;
    for (int end = 0; end < 2; end++) {
        const float top = (float)(end == 0 ? k_iq4nl[0] : k_iq4nl[15]);
        for (int k = -8; k <= 8; k++) {
            const float s0 = max / top * (1.0f + 0.02f * (float)k);
            const float is = 1.0f / s0;
            double skk = 0, skx = 0;
            int q[32];
            for (int i = 0; i < n; i++) {
                q[i] = nearest(k_iq4nl, x[i] * is);
                skk += (double)k_iq4nl[q[i]] * k_iq4nl[q[i]];
                skx += (double)k_iq4nl[q[i]] * x[i];
            }
            if (skk <= 0)
                continue;
            const double s = skx / skk;
            double err = 0;
            for (int i = 0; i < n; i++) {
                double r = s * k_iq4nl[q[i]] - x[i];
                err += r * r;
            }
            if (err < best_err) {
                best_err = err;
                best = (float)s;
            }
        }
    }
    return best;
}

void mr_qz_iq4_nl(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 32, y += 18) {
        const float d = mr_wrf16(y, fit_iq4(x, 32));
        put_nibbles(x, 32, d, k_iq4nl, y + 2);
    }
}

void mr_qz_iq4_xs(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 256, y += 136) {
        float sc[8];
        int q[8];
        for (int ib = 0; ib < 8; ib++)
            sc[ib] = fit_iq4(x + 32 * ib, 32);
        /* sub-block scales are (ls - 32) * d with ls in 0..63 */
        const float d = mr_quant_signed_scales(y, sc, 8, 32, 31, q);
        uint16_t sh = 0;
        memset(y + 4, 0, 4);
        for (int ib = 0; ib < 8; ib++) {
            const int ls = q[ib] + 32;
            y[4 + ib / 2] |= (uint8_t)((ls & 0xf) << (4 * (ib % 2)));
            sh |= (uint16_t)((ls >> 4) << (2 * ib));
            put_nibbles(x + 32 * ib, 32, d * (float)q[ib], k_iq4nl, y + 8 + 16 * ib);
        }
        mr_wr16(y + 2, sh);
    }
}

void mr_qz_mxfp4(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 32, y += 17) {
        const float amax = mr_absmax(x, 32);
        /* OCP MX rule: shared exponent floor(log2(amax)) - 2, the exponent
         * of the largest E2M1 value (6 = 1.5 * 2^2) */
        int e = 0;
        if (amax > 0.0f && isfinite(amax)) {
            int ex;
            frexpf(amax, &ex); /* amax = f * 2^ex, f in [0.5, 1) */
            e = mr_clampi(ex - 1 - 2 + 127, 0, 254);
        }
        y[0] = (uint8_t)e;
        put_nibbles(x, 32, mr_e8m0_half_to_f32((uint8_t)e), k_fp4x2, y + 1);
    }
}

/* The UE4M3 code (0..0x7E) whose value is nearest to v >= 0. */
static uint8_t nearest_ue4m3(float v)
{
    uint8_t best = 0;
    float berr = fabsf(v);
    for (int c = 1; c < 0x7f; c++) {
        float err = fabsf(v - mr_ue4m3_to_f32((uint8_t)c));
        if (err < berr) {
            berr = err;
            best = (uint8_t)c;
        }
    }
    return best;
}

void mr_qz_nvfp4(const float *x, uint8_t *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 64, y += 36) {
        for (int sb = 0; sb < 4; sb++) {
            const float *xs = x + 16 * sb;
            /* the largest E2M1 magnitude, 6, lands on the largest magnitude */
            y[sb] = nearest_ue4m3(mr_absmax(xs, 16) / 6.0f);
            put_nibbles(xs, 16, 0.5f * mr_ue4m3_to_f32(y[sb]), k_fp4x2, y + 4 + 8 * sb);
        }
    }
}
