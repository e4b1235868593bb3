/* Internal to the quant module: per-type block codecs that common/quant.c
 * dispatches to.  Every codec works on whole blocks (nb of them) and reads
 * multi-byte fields as little-endian bytes, so it is independent of host
 * alignment and byte order.  Every bit pattern decodes to some float: there
 * is no invalid block, so decoders cannot fail. */
#ifndef MR_QUANT_IMPL_H
#define MR_QUANT_IMPL_H

#include <math.h>
#include <stdint.h>

#include "common/half.h"

typedef void (*mr_dequant_fn)(const uint8_t *src, float *dst, int64_t nb);
typedef void (*mr_quant_fn)(const float *src, uint8_t *dst, int64_t nb);

#define MR_QK_K 256 /* K-quant super-block */

static inline uint16_t mr_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline uint32_t mr_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline void mr_wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void mr_wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline float mr_rdf16(const uint8_t *p) { return mr_f16_to_f32(mr_rd16(p)); }

/* Stores v as fp16 and returns the stored value, so that quantizers derive
 * their integer codes from the scale the decoder will actually see. */
static inline float mr_wrf16(uint8_t *p, float v)
{
    uint16_t h = mr_f32_to_f16(v);
    mr_wr16(p, h);
    return mr_f16_to_f32(h);
}

/* Round half away from zero, as C's roundf, returned as int (callers clamp
 * the argument to a small range first). */
static inline int mr_iround(float v) { return (int)lroundf(v); }

static inline int mr_clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The element of largest magnitude, with its sign (the first one on ties);
 * 0 when every element is 0. */
static inline float mr_signed_absmax(const float *x, int n)
{
    float best = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            best = x[i];
        }
    }
    return best;
}

/* The largest magnitude of x[0..n); 0 when every element is 0. */
static inline float mr_absmax(const float *x, int n) { return fabsf(mr_signed_absmax(x, n)); }

/* Signed sub-block scales v[0..n) against one fp16 scale d stored at d16:
 * the largest magnitude maps to -qneg (the wider end), code[j] in
 * [-qneg, qpos].  Returns the stored d.  (quant_k.c) */
float mr_quant_signed_scales(uint8_t *d16, const float *v, int n, int qneg, int qpos, int *code);

/* quant_legacy.c: 32-element blocks (and Q1_0 / Q2_0) */
void mr_dq_q4_0(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q4_1(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q5_0(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q5_1(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q8_0(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q8_1(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q1_0(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q2_0(const uint8_t *s, float *d, int64_t nb);
void mr_qz_q4_0(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q4_1(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q5_0(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q5_1(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q8_0(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q8_1(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q1_0(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q2_0(const float *s, uint8_t *d, int64_t nb);

/* quant_k.c: 256-element super-blocks */
void mr_dq_q2_k(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q3_k(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q4_k(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q5_k(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q6_k(const uint8_t *s, float *d, int64_t nb);
void mr_dq_q8_k(const uint8_t *s, float *d, int64_t nb);
void mr_qz_q2_k(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q3_k(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q4_k(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q5_k(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q6_k(const float *s, uint8_t *d, int64_t nb);
void mr_qz_q8_k(const float *s, uint8_t *d, int64_t nb);

/* quant_nl.c: non-linear code books (IQ4_NL, IQ4_XS) and FP4 (MXFP4, NVFP4) */
void mr_dq_iq4_nl(const uint8_t *s, float *d, int64_t nb);
void mr_dq_iq4_xs(const uint8_t *s, float *d, int64_t nb);
void mr_dq_mxfp4(const uint8_t *s, float *d, int64_t nb);
void mr_dq_nvfp4(const uint8_t *s, float *d, int64_t nb);
void mr_qz_iq4_nl(const float *s, uint8_t *d, int64_t nb);
void mr_qz_iq4_xs(const float *s, uint8_t *d, int64_t nb);
void mr_qz_mxfp4(const float *s, uint8_t *d, int64_t nb);
void mr_qz_nvfp4(const float *s, uint8_t *d, int64_t nb);

/* Scale decoders of the FP4 formats, exposed for tests. */
float mr_e8m0_half_to_f32(uint8_t e); /* 2^(e-128): the E8M0 scale times 1/2 */
float mr_ue4m3_to_f32(uint8_t x);     /* unsigned E4M3 (bias 7); 0x7F decodes to 0 */

#endif
