/* Device-side decoding of the GGUF block formats, one group of 32
 * consecutive elements at a time (every supported format splits its block
 * into whole groups of 32).  Layouts follow ggml's block structs byte for
 * byte; the fast matvec kernels decode the same bits their own way and are
 * checked against these. */
#ifndef MR_CU_QUANT_CUH
#define MR_CU_QUANT_CUH

#include "kernels/cuda/cu_common.cuh"

/* The IQ4_NL code book as four words of int8 bytes (entries 4w..4w+3 in
 * word w), for mr_lut16. */
__host__ __device__ constexpr uint32_t mr_pack4(int a, int b, int c, int d)
{
    return (uint32_t)(uint8_t)a | (uint32_t)(uint8_t)b << 8 | (uint32_t)(uint8_t)c << 16 |
           (uint32_t)(uint8_t)d << 24;
}
#define MR_IQ4NL_W0 mr_pack4(-127, -104, -83, -65)
#define MR_IQ4NL_W1 mr_pack4(-49, -35, -22, -10)
#define MR_IQ4NL_W2 mr_pack4(1, 13, 25, 38)
#define MR_IQ4NL_W3 mr_pack4(53, 69, 89, 113)

/* Four lookups in a 16-entry byte table at once: byte k of the result is
 * table[n_k], n_k = byte k of `nib` (each 0..15).  A table in memory
 * indexed by 32 lanes with different indices serialises (constant memory)
 * or costs a load per weight; this stays in registers: __byte_perm picks
 * bytes by 3-bit indices, so entries 0-7 and 8-15 are looked up apart and
 * bit 3 of each index then chooses between the two results. */
__device__ __forceinline__ uint32_t mr_lut16(uint32_t nib, uint32_t w0, uint32_t w1, uint32_t w2,
                                             uint32_t w3)
{
    const uint32_t x = nib | (nib >> 4);             /* bytes 0 and 2: n0|n1<<4, n2|n3<<4 */
    const uint32_t sel = __byte_perm(x, 0, 0x4420);  /* n0 | n1<<4 | n2<<8 | n3<<12 */
    const uint32_t lo = __byte_perm(w0, w1, sel), hi = __byte_perm(w2, w3, sel);
    return __byte_perm(lo, hi, 0x3210u | ((sel >> 1) & 0x4444u));
}
__device__ __forceinline__ uint32_t mr_iq4nl4(uint32_t nib)
{
    return mr_lut16(nib, MR_IQ4NL_W0, MR_IQ4NL_W1, MR_IQ4NL_W2, MR_IQ4NL_W3);
}

/* E2M1 values times 2 (the scale decoders below carry the 1/2). */
__device__ __constant__ static const int8_t mr_kv_fp4[16] = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

__device__ __forceinline__ float mr_e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return __uint_as_float(bits);
}

__device__ __forceinline__ float mr_ue4m3_half(uint8_t x)
{
    if (x == 0 || x == 0x7F)
        return 0.0f;
    int e = (x >> 3) & 0xF, m = x & 7;
    float raw = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return raw * 0.5f;
}

/* Byte i (a constant after unrolling) of little-endian words w. */
__device__ __forceinline__ uint32_t mr_byte(const uint32_t *w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xFF; }

/* N little-endian words from p, 16-byte aligned: N / 4 vector loads. */
template <int N>
__device__ __forceinline__ void mr_ld_words_a16(const uint8_t *p, uint32_t *w)
{
    static_assert(N % 4 == 0, "whole 16-byte loads");
#pragma unroll
    for (int i = 0; i < N / 4; i++) {
        const uint4 u = ((const uint4 *)p)[i];
        w[4 * i] = u.x;
        w[4 * i + 1] = u.y;
        w[4 * i + 2] = u.z;
        w[4 * i + 3] = u.w;
    }
}

/* N little-endian words from p at any alignment: the aligned words that
 * cover them, joined by funnel shifts (N + 1 word loads at most instead of
 * 4 N byte loads; never a word past the last byte asked for). */
template <int N>
__device__ __forceinline__ void mr_ld_words(const uint8_t *p, uint32_t *w)
{
    const uint32_t off = (uint32_t)((uintptr_t)p & 3);
    const uint32_t *a = (const uint32_t *)(p - off);
    if (off == 0) {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = a[i];
        return;
    }
    uint32_t x[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++) x[i] = a[i];
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = __funnelshift_r(x[i], x[i + 1], 8 * off);
}

/* K-quant 6-bit scale/min pair j (0..7) from the 12 packed bytes. */
__device__ __forceinline__ void mr_k4_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The same from the 12 bytes as three aligned words (q: 4-byte aligned). */
__device__ __forceinline__ void mr_k4_scale_min_w(int j, const uint32_t *q, int *sc, int *m)
{
    /* j is not a constant: pick words with selects, not an indexed array
     * (which would live in local memory) */
    const uint32_t w0 = q[0], w1 = q[1], w2 = q[2];
    const uint32_t sh = 8 * (uint32_t)(j & 3);
    const uint32_t a = ((j < 4 ? w0 : w1) >> sh) & 0xFF; /* byte j */
    const uint32_t b = ((j < 4 ? w1 : w2) >> sh) & 0xFF; /* byte j + 4 */
    if (j < 4) {
        *sc = (int)(a & 63);
        *m = (int)(b & 63);
    } else {
        const uint32_t c = (w0 >> sh) & 0xFF; /* byte j - 4 */
        *sc = (int)((b & 0xF) | ((c >> 6) << 4));
        *m = (int)((b >> 4) | ((a >> 6) << 4));
    }
}

/* Decodes group g (elements 32g..32g+31) of row `row` into v. */
template <int T>
__device__ __forceinline__ void mr_dq32(const uint8_t *row, int64_t g, float v[32])
{
    if constexpr (T == MR_TYPE_F32) {
        const float *p = (const float *)row + g * 32;
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = p[i];
    } else if constexpr (T == MR_TYPE_F16) {
        const uint16_t *p = (const uint16_t *)row + g * 32;
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = mr_h2f(p[i]);
    } else if constexpr (T == MR_TYPE_BF16) {
        const uint16_t *p = (const uint16_t *)row + g * 32;
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = mr_bf2f(p[i]);
    } else if constexpr (T == MR_TYPE_Q4_0 || T == MR_TYPE_IQ4_NL) {
        const uint8_t *b = row + g * 18;
        float d = mr_h2f(mr_ld_u16(b));
        const uint8_t *qs = b + 2;
        if constexpr (T == MR_TYPE_Q4_0) {
#pragma unroll
            for (int j = 0; j < 16; j++) {
                v[j] = (float)((qs[j] & 15) - 8) * d;
                v[j + 16] = (float)((qs[j] >> 4) - 8) * d;
            }
        } else { /* 18-byte blocks: the quants are not word aligned */
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const uint32_t q = mr_ld_u32(qs + 4 * w);
                const uint32_t lo = mr_iq4nl4(q & 0x0F0F0F0Fu), hi = mr_iq4nl4((q >> 4) & 0x0F0F0F0Fu);
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    v[4 * w + c] = d * (float)(int8_t)(lo >> (8 * c));
                    v[4 * w + c + 16] = d * (float)(int8_t)(hi >> (8 * c));
                }
            }
        }
    } else if constexpr (T == MR_TYPE_Q4_1) {
        const uint8_t *b = row + g * 20;
        float d = mr_h2f(mr_ld_u16(b)), m = mr_h2f(mr_ld_u16(b + 2));
        const uint8_t *qs = b + 4;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = (float)(qs[j] & 15) * d + m;
            v[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
    } else if constexpr (T == MR_TYPE_Q5_0 || T == MR_TYPE_Q5_1) {
        constexpr int bs = T == MR_TYPE_Q5_0 ? 22 : 24;
        const uint8_t *b = row + g * bs;
        float d = mr_h2f(mr_ld_u16(b));
        float m = T == MR_TYPE_Q5_1 ? mr_h2f(mr_ld_u16(b + 2)) : 0.0f;
        const uint8_t *qhp = b + (T == MR_TYPE_Q5_0 ? 2 : 4);
        uint32_t qh = mr_ld_u32(qhp);
        const uint8_t *qs = qhp + 4;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 15) | (((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            if constexpr (T == MR_TYPE_Q5_0) {
                v[j] = (float)(lo - 16) * d;
                v[j + 16] = (float)(hi - 16) * d;
            } else {
                v[j] = (float)lo * d + m;
                v[j + 16] = (float)hi * d + m;
            }
        }
    } else if constexpr (T == MR_TYPE_Q8_0) {
        const uint8_t *b = row + g * 34; /* 2-byte aligned */
        float d = mr_h2f(*(const uint16_t *)b);
        uint32_t qw[8];
        mr_ld_words<8>(b + 2, qw);
#pragma unroll
        for (int j = 0; j < 32; j++) v[j] = (float)(int8_t)mr_byte(qw, j) * d;
    } else if constexpr (T == MR_TYPE_MXFP4) {
        const uint8_t *b = row + g * 17;
        float d = mr_e8m0_half(b[0]);
        const uint8_t *qs = b + 1;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = (float)mr_kv_fp4[qs[j] & 15] * d;
            v[j + 16] = (float)mr_kv_fp4[qs[j] >> 4] * d;
        }
    } else if constexpr (T == MR_TYPE_NVFP4) {
        const uint8_t *b = row + (g >> 1) * 36;
        int s0 = (int)(g & 1) * 2;
#pragma unroll
        for (int s = 0; s < 2; s++) {
            float d = mr_ue4m3_half(b[s0 + s]);
            const uint8_t *qs = b + 4 + 8 * (s0 + s);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                v[16 * s + j] = (float)mr_kv_fp4[qs[j] & 15] * d;
                v[16 * s + j + 8] = (float)mr_kv_fp4[qs[j] >> 4] * d;
            }
        }
    } else if constexpr (T == MR_TYPE_Q4_K) {
        /* 144-byte blocks, rows of whole blocks from a cudaMalloc'd base:
         * every block starts 16-byte aligned, so the 32 quant bytes are two
         * 16-byte loads (byte loads cost a load instruction per weight) */
        const uint8_t *b = row + (g >> 3) * 144;
        int s = (int)(g & 7);
        const uint32_t dm = *(const uint32_t *)b;
        float d = mr_h2f((uint16_t)dm), dmin = mr_h2f((uint16_t)(dm >> 16));
        int sc, m;
        mr_k4_scale_min_w(s, (const uint32_t *)(b + 4), &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        uint32_t qw[8];
        mr_ld_words_a16<8>(b + 16 + 32 * (s >> 1), qw);
        int sh = (s & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++) v[l] = d1 * (float)((mr_byte(qw, l) >> sh) & 15) - m1;
    } else if constexpr (T == MR_TYPE_Q5_K) {
        const uint8_t *b = row + (g >> 3) * 176; /* 176 = 11 x 16: aligned as Q4_K's */
        int s = (int)(g & 7);
        const uint32_t dm = *(const uint32_t *)b;
        float d = mr_h2f((uint16_t)dm), dmin = mr_h2f((uint16_t)(dm >> 16));
        int sc, m;
        mr_k4_scale_min_w(s, (const uint32_t *)(b + 4), &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        uint32_t hw[8], qw[8];
        mr_ld_words_a16<8>(b + 16, hw);
        mr_ld_words_a16<8>(b + 48 + 32 * (s >> 1), qw);
        int sh = (s & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = ((mr_byte(qw, l) >> sh) & 15) | (((mr_byte(hw, l) >> s) & 1) << 4);
            v[l] = d1 * (float)q - m1;
        }
    } else if constexpr (T == MR_TYPE_Q6_K) {
        /* 210-byte blocks: only 2-byte alignment, so the quant bytes come
         * from aligned words put together (mr_ld_words) */
        const uint8_t *b = row + (g >> 3) * 210;
        int s = (int)(g & 7), n = s >> 2, qq = s & 3;
        float d = mr_h2f(*(const uint16_t *)(b + 208));
        uint32_t lw[8], hw[8];
        mr_ld_words<8>(b + 64 * n + (qq & 1) * 32, lw);
        mr_ld_words<8>(b + 128 + 32 * n, hw);
        const uint16_t scp = *(const uint16_t *)(b + 192 + 8 * n + 2 * qq);
        const float sc0 = (float)(int8_t)(scp & 0xFF), sc1 = (float)(int8_t)(scp >> 8);
        int shl = (qq >> 1) * 4, shh = 2 * qq;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (((mr_byte(lw, l) >> shl) & 15) | (((mr_byte(hw, l) >> shh) & 3) << 4)) - 32;
            v[l] = d * (l < 16 ? sc0 : sc1) * (float)q;
        }
    } else if constexpr (T == MR_TYPE_Q2_K) {
        const uint8_t *b = row + (g >> 3) * 84;
        int s = (int)(g & 7), n = s >> 2, j = s & 3;
        float d = mr_h2f(mr_ld_u16(b + 80)), dmin = mr_h2f(mr_ld_u16(b + 82));
        const uint8_t *q = b + 16 + 32 * n;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int sc = b[2 * s + l / 16];
            v[l] = d * (float)(sc & 15) * (float)((q[l] >> (2 * j)) & 3) - dmin * (float)(sc >> 4);
        }
    } else if constexpr (T == MR_TYPE_Q3_K) {
        const uint8_t *b = row + (g >> 3) * 110;
        int s = (int)(g & 7), n = s >> 2, j = s & 3;
        const uint8_t *hm = b, *q = b + 32 + 32 * n, *scb = b + 96;
        float d = mr_h2f(mr_ld_u16(b + 108));
        float dl[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = 2 * s + h;
            int lo = i < 8 ? (scb[i] & 15) : (scb[i - 8] >> 4);
            int hi = (scb[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
            dl[h] = d * (float)((lo | (hi << 4)) - 32);
        }
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int qv = ((q[l] >> (2 * j)) & 3) - ((hm[l] >> s) & 1 ? 0 : 4);
            v[l] = dl[l / 16] * (float)qv;
        }
    } else if constexpr (T == MR_TYPE_IQ4_XS) {
        const uint8_t *b = row + (g >> 3) * 136;
        int ib = (int)(g & 7);
        float d = mr_h2f(mr_ld_u16(b));
        uint16_t sh = mr_ld_u16(b + 2);
        int ls = ((b[4 + ib / 2] >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
        float dl = d * (float)(ls - 32);
        /* blocks are 136 bytes and rows start 4-byte aligned: word loads */
        const uint32_t *qs = (const uint32_t *)(b + 8 + 16 * ib);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const uint32_t q = qs[w];
            const uint32_t lo = mr_iq4nl4(q & 0x0F0F0F0Fu), hi = mr_iq4nl4((q >> 4) & 0x0F0F0F0Fu);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                v[4 * w + c] = dl * (float)(int8_t)(lo >> (8 * c));
                v[4 * w + c + 16] = dl * (float)(int8_t)(hi >> (8 * c));
            }
        }
    }
}

/* Element c of a row of a plain type (F32, F16, BF16). */
template <int T>
__device__ __forceinline__ float mr_plain_at(const uint8_t *row, int64_t c)
{
    if constexpr (T == MR_TYPE_F32) return ((const float *)row)[c];
    else if constexpr (T == MR_TYPE_F16) return mr_h2f(((const uint16_t *)row)[c]);
    else return mr_bf2f(((const uint16_t *)row)[c]);
}

/* Types stored element by element (no 32-weight groups): any column count. */
__host__ __device__ constexpr bool mr_cu_plain_type(int t)
{
    return t == MR_TYPE_F32 || t == MR_TYPE_F16 || t == MR_TYPE_BF16;
}

/* The types this backend runs, as an X-macro: X(type) for each.  Their block
 * sizes are common/quant.c's (mr_type_get). */
#define MR_CU_TYPE_LIST(X)                                                                  \
    X(MR_TYPE_F32) X(MR_TYPE_F16) X(MR_TYPE_BF16) X(MR_TYPE_Q4_0) X(MR_TYPE_Q4_1)            \
    X(MR_TYPE_Q5_0) X(MR_TYPE_Q5_1) X(MR_TYPE_Q8_0) X(MR_TYPE_IQ4_NL) X(MR_TYPE_MXFP4)        \
    X(MR_TYPE_NVFP4) X(MR_TYPE_Q2_K) X(MR_TYPE_Q3_K) X(MR_TYPE_Q4_K) X(MR_TYPE_Q5_K)          \
    X(MR_TYPE_Q6_K) X(MR_TYPE_IQ4_XS)

#endif
