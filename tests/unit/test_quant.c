/* Element types: the type table, hand-built blocks decoded against the
 * format descriptions, synthetic quantize/dequantize round trips with error
 * bounds, and mr_vec_dot against a float64 dot of the dequantized row. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/half.h"
#include "common/quant.h"
#include "tests/unit/testutil.h"

/* ---- helpers ---- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(void) { return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0; }

static double rng_normal(void)
{
    return sqrt(-2.0 * log(rng_unit())) * cos(6.283185307179586 * rng_unit());
}

enum dist { D_NORMAL, D_UNIFORM, D_LAPLACE, D_SHIFTED, D_OUTLIERS, D_COUNT };
static const char *dist_name[D_COUNT] = {"normal", "uniform", "laplace", "shifted", "outliers"};

static void fill(float *x, int64_t n, enum dist d, uint64_t seed)
{
    rng_state = seed;
    for (int64_t i = 0; i < n; i++) {
        double v = 0;
        switch (d) {
        case D_NORMAL:
            v = 0.08 * rng_normal(); /* the scale of the fixture weights */
            break;
        case D_UNIFORM:
            v = 2.0 * rng_unit() - 1.0;
            break;
        case D_LAPLACE: {
            double u = rng_unit() - 0.5;
            v = (u < 0 ? 1 : -1) * log(1 - 2 * fabs(u));
            break;
        }
        case D_SHIFTED:
            v = 1.5 + 0.5 * rng_normal();
            break;
        case D_OUTLIERS:
            v = rng_normal() * (rng_unit() < 0.01 ? 20.0 : 1.0);
            break;
        default:
            break;
        }
        x[i] = (float)v;
    }
}

/* The types this module decodes, with bounds on the round-trip relative L2
 * error.  The noise of a uniform grid of step h is h/sqrt(12): for 32-element
 * blocks of normal data the largest magnitude is ~2.1 sigma, so Q8_0 gives
 * ~0.005, 4-bit ~0.08 and 5-bit ~0.04; a wrong layout gives ~1 or more.
 * `outl` is the bound for the heavy-outlier rows (1% of elements at 20x),
 * where an outlier stretches its block's scale; a negative bound skips that case (sign-only
 * Q1_0 cannot represent such a row at all). */
typedef struct rt_case {
    int type;
    double bound, outl;
} rt_case;

static const rt_case rt_cases[] = {
    {MR_TYPE_F32, 0.0, 0.0},      {MR_TYPE_F16, 1e-3, 1e-3},    {MR_TYPE_BF16, 5e-3, 5e-3},
    {MR_TYPE_Q8_0, 0.01, 0.02},   {MR_TYPE_Q8_1, 0.01, 0.02},   {MR_TYPE_Q8_K, 0.015, 0.04},
    {MR_TYPE_Q6_K, 0.03, 0.05},   {MR_TYPE_Q5_0, 0.07, 0.12},   {MR_TYPE_Q5_1, 0.07, 0.12},
    {MR_TYPE_Q5_K, 0.07, 0.12},   {MR_TYPE_Q4_0, 0.15, 0.2},    {MR_TYPE_Q4_1, 0.15, 0.2},
    {MR_TYPE_Q4_K, 0.15, 0.2},    {MR_TYPE_IQ4_NL, 0.15, 0.2},  {MR_TYPE_IQ4_XS, 0.15, 0.2},
    {MR_TYPE_NVFP4, 0.15, 0.15},  {MR_TYPE_MXFP4, 0.2, 0.25},   {MR_TYPE_Q3_K, 0.25, 0.25},
    {MR_TYPE_Q2_K, 0.4, 0.4},     {MR_TYPE_Q2_0, 0.65, 0.5},    {MR_TYPE_Q1_0, 0.75, -1},
};
#define N_RT (sizeof rt_cases / sizeof rt_cases[0])

#define ROW 4096 /* a multiple of every block size */

/* ---- type table ---- */

START_TEST(table_sizes)
{
    /* block bytes from the block layouts: scales + packed codes */
    struct {
        int type;
        int64_t elems;
        size_t bytes;
    } want[] = {
        {MR_TYPE_F32, 1, 4},           {MR_TYPE_F16, 1, 2},
        {MR_TYPE_BF16, 1, 2},          {MR_TYPE_Q4_0, 32, 2 + 16},
        {MR_TYPE_Q4_1, 32, 4 + 16},    {MR_TYPE_Q5_0, 32, 2 + 4 + 16},
        {MR_TYPE_Q5_1, 32, 4 + 4 + 16},{MR_TYPE_Q8_0, 32, 2 + 32},
        {MR_TYPE_Q8_1, 32, 4 + 32},    {MR_TYPE_Q2_K, 256, 16 + 64 + 4},
        {MR_TYPE_Q3_K, 256, 32 + 64 + 12 + 2},
        {MR_TYPE_Q4_K, 256, 4 + 12 + 128},
        {MR_TYPE_Q5_K, 256, 4 + 12 + 32 + 128},
        {MR_TYPE_Q6_K, 256, 128 + 64 + 16 + 2},
        {MR_TYPE_Q8_K, 256, 4 + 256 + 32},
        {MR_TYPE_IQ2_XXS, 256, 2 + 64},{MR_TYPE_IQ2_XS, 256, 2 + 64 + 8},
        {MR_TYPE_IQ3_XXS, 256, 2 + 96},{MR_TYPE_IQ1_S, 256, 2 + 32 + 16},
        {MR_TYPE_IQ4_NL, 32, 2 + 16},  {MR_TYPE_IQ3_S, 256, 2 + 64 + 8 + 32 + 4},
        {MR_TYPE_IQ2_S, 256, 2 + 64 + 16},
        {MR_TYPE_IQ4_XS, 256, 2 + 2 + 4 + 128},
        {MR_TYPE_I8, 1, 1},            {MR_TYPE_I16, 1, 2},
        {MR_TYPE_I32, 1, 4},           {MR_TYPE_I64, 1, 8},
        {MR_TYPE_F64, 1, 8},           {MR_TYPE_IQ1_M, 256, 32 + 16 + 8},
        {MR_TYPE_TQ1_0, 256, 48 + 4 + 2},
        {MR_TYPE_TQ2_0, 256, 64 + 2},  {MR_TYPE_MXFP4, 32, 1 + 16},
        {MR_TYPE_NVFP4, 64, 4 + 32},   {MR_TYPE_Q1_0, 128, 2 + 16},
        {MR_TYPE_Q2_0, 64, 2 + 16},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const mr_type_info *ti = mr_type_get(want[i].type);
        ck_assert_msg(ti != NULL, "type %d missing", want[i].type);
        ck_assert_msg(ti->known, "type %s not known", ti->name);
        ck_assert_int_eq(ti->block_elems, want[i].elems);
        ck_assert_msg(ti->block_bytes == want[i].bytes, "%s: %zu bytes, want %zu", ti->name,
                      ti->block_bytes, want[i].bytes);
        ck_assert_int_eq(mr_type_from_name(ti->name), want[i].type);
        ck_assert_uint_eq(mr_row_size(want[i].type, want[i].elems * 3), want[i].bytes * 3);
    }
    /* ids upstream removed or never used */
    const int holes[] = {-1, 4, 5, 31, 32, 33, 36, 37, 38, MR_TYPE_COUNT, 1000};
    for (size_t i = 0; i < sizeof holes / sizeof holes[0]; i++) {
        ck_assert_ptr_null(mr_type_get(holes[i]));
        ck_assert_uint_eq(mr_row_size(holes[i], 256), 0);
    }
    ck_assert_int_eq(mr_type_from_name("q4_k"), MR_TYPE_Q4_K);
    ck_assert_int_eq(mr_type_from_name("iq4_xs"), MR_TYPE_IQ4_XS);
    ck_assert_int_eq(mr_type_from_name("bf16"), MR_TYPE_BF16);
    ck_assert_int_eq(mr_type_from_name("Q4_2"), -1);
    ck_assert_int_eq(mr_type_from_name(NULL), -1);
    ck_assert_str_eq(mr_type_name(MR_TYPE_MXFP4), "MXFP4");
    ck_assert_uint_eq(mr_row_size(MR_TYPE_Q4_K, 255), 0);
    ck_assert_uint_eq(mr_row_size(MR_TYPE_Q4_K, -256), 0);
    ck_assert_uint_eq(mr_row_size(MR_TYPE_Q4_K, 0), 0);
}
END_TEST

START_TEST(unsupported_and_bad_lengths)
{
    uint8_t buf[512] = {0};
    float out[256], x[256] = {0};
    /* a type that is only sized, a hole, and a bad length */
    ck_assert_int_eq(mr_dequantize_row(MR_TYPE_IQ2_XXS, buf, out, 256), -1);
    ck_assert_int_eq(mr_dequantize_row(4, buf, out, 32), -1);
    ck_assert_int_eq(mr_dequantize_row(MR_TYPE_Q4_0, buf, out, 31), -1);
    ck_assert(isnan(mr_vec_dot(MR_TYPE_IQ2_XXS, buf, x, 256)));
    ck_assert(isnan(mr_vec_dot(MR_TYPE_Q4_K, buf, x, 128)));
    ck_assert_uint_eq(mr_quantize_row(MR_TYPE_IQ2_XXS, x, buf, 256), 0);
    ck_assert_uint_eq(mr_quantize_row(MR_TYPE_Q8_0, x, buf, 33), 0);
    ck_assert(!mr_type_get(MR_TYPE_IQ2_XXS)->supported);
    ck_assert(mr_type_get(MR_TYPE_NVFP4)->supported);
}
END_TEST

/* ---- hand-built blocks ----
 * Each block is assembled byte by byte from the format description and the
 * expected values are worked out by hand from it. */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void dq(int type, const uint8_t *blk, float *out)
{
    const mr_type_info *ti = mr_type_get(type);
    ck_assert_int_eq(mr_dequantize_row(type, blk, out, ti->block_elems), 0);
}

START_TEST(known_plain)
{
    const uint8_t f32[8] = {0xdb, 0x0f, 0x49, 0xc0, 0x00, 0x00, 0x80, 0x3f};
    const uint8_t f16[4] = {0x00, 0x3c, 0x00, 0xc2}; /* 1.0, -3.0 */
    const uint8_t bf16[4] = {0x80, 0x3f, 0x40, 0xc0}; /* 1.0, -3.0 */
    float y[2];
    ck_assert_int_eq(mr_dequantize_row(MR_TYPE_F32, f32, y, 2), 0);
    ck_assert_float_eq(y[0], -3.14159274f);
    ck_assert_float_eq(y[1], 1.0f);
    ck_assert_int_eq(mr_dequantize_row(MR_TYPE_F16, f16, y, 2), 0);
    ck_assert_float_eq(y[0], 1.0f);
    ck_assert_float_eq(y[1], -3.0f);
    ck_assert_int_eq(mr_dequantize_row(MR_TYPE_BF16, bf16, y, 2), 0);
    ck_assert_float_eq(y[0], 1.0f);
    ck_assert_float_eq(y[1], -3.0f);
}
END_TEST

START_TEST(known_q8)
{
    uint8_t b[36];
    float y[256];
    /* Q8_0: d = 0.5, q[j] = j - 16 */
    put16(b, 0x3800);
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)(j - 16);
    dq(MR_TYPE_Q8_0, b, y);
    for (int j = 0; j < 32; j++)
        ck_assert_float_eq(y[j], 0.5f * (float)(j - 16));
    /* Q8_1: d = 0.5, s (ignored by decoding) = 7, q[j] = 15 - j */
    put16(b, 0x3800);
    put16(b + 2, 0x4700);
    for (int j = 0; j < 32; j++)
        b[4 + j] = (uint8_t)(int8_t)(15 - j);
    dq(MR_TYPE_Q8_1, b, y);
    for (int j = 0; j < 32; j++)
        ck_assert_float_eq(y[j], 0.5f * (float)(15 - j));
    /* Q8_K: float32 d = 0.25, q[e] = e - 128 */
    uint8_t k[292] = {0x00, 0x00, 0x80, 0x3e};
    for (int e = 0; e < 256; e++)
        k[4 + e] = (uint8_t)(int8_t)(e - 128);
    dq(MR_TYPE_Q8_K, k, y);
    for (int e = 0; e < 256; e++)
        ck_assert_float_eq(y[e], 0.25f * (float)(e - 128));
}
END_TEST

START_TEST(known_q4_q5)
{
    uint8_t b[24];
    float y[32];
    /* qs[j] = j | (15 - j) << 4: element j has code j, element j+16 code 15-j */
    /* Q4_0: d = 2: x = 2 * (q - 8) */
    put16(b, 0x4000);
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    dq(MR_TYPE_Q4_0, b, y);
    ck_assert_float_eq(y[0], -16.0f);
    ck_assert_float_eq(y[15], 14.0f);
    ck_assert_float_eq(y[16], 14.0f);
    ck_assert_float_eq(y[31], -16.0f);
    ck_assert_float_eq(y[9], 2.0f);
    /* Q4_1: d = 1, m = -1: x = q - 1 */
    put16(b, 0x3c00);
    put16(b + 2, 0xbc00);
    for (int j = 0; j < 16; j++)
        b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
    dq(MR_TYPE_Q4_1, b, y);
    for (int j = 0; j < 16; j++) {
        ck_assert_float_eq(y[j], (float)j - 1.0f);
        ck_assert_float_eq(y[j + 16], 14.0f - (float)j);
    }
    /* Q5_0: d = 1; qh = bits 0 and 31 set (elements 0 and 31 get +16) */
    put16(b, 0x3c00);
    b[2] = 0x01, b[3] = 0x00, b[4] = 0x00, b[5] = 0x80;
    for (int j = 0; j < 16; j++)
        b[6 + j] = (uint8_t)(j | ((15 - j) << 4));
    dq(MR_TYPE_Q5_0, b, y);
    ck_assert_float_eq(y[0], 0.0f);    /* 0 + 16 - 16 */
    ck_assert_float_eq(y[1], -15.0f);  /* 1 - 16 */
    ck_assert_float_eq(y[15], -1.0f);  /* 15 - 16 */
    ck_assert_float_eq(y[16], -1.0f);  /* 15 - 16 */
    ck_assert_float_eq(y[30], -15.0f); /* 1 - 16 */
    ck_assert_float_eq(y[31], 0.0f);   /* 0 + 16 - 16 */
    /* Q5_1: d = 0.5, m = 2, qh bits 1 and 16 */
    put16(b, 0x3800);
    put16(b + 2, 0x4000);
    b[4] = 0x02, b[5] = 0x00, b[6] = 0x01, b[7] = 0x00;
    for (int j = 0; j < 16; j++)
        b[8 + j] = (uint8_t)(j | ((15 - j) << 4));
    dq(MR_TYPE_Q5_1, b, y);
    ck_assert_float_eq(y[0], 2.0f);          /* q 0 */
    ck_assert_float_eq(y[1], 0.5f * 17 + 2); /* q 1 + 16 */
    ck_assert_float_eq(y[16], 0.5f * 31 + 2); /* q 15 + 16 */
    ck_assert_float_eq(y[17], 0.5f * 14 + 2); /* q 14 */
}
END_TEST

START_TEST(known_q1_q2)
{
    uint8_t b[18];
    float y[128];
    /* Q1_0: d = 0.5; byte 0 = 0x81: elements 0 and 7 positive */
    put16(b, 0x3800);
    memset(b + 2, 0, 16);
    b[2] = 0x81;
    b[17] = 0x40; /* element 126 */
    dq(MR_TYPE_Q1_0, b, y);
    ck_assert_float_eq(y[0], 0.5f);
    ck_assert_float_eq(y[1], -0.5f);
    ck_assert_float_eq(y[7], 0.5f);
    ck_assert_float_eq(y[126], 0.5f);
    ck_assert_float_eq(y[127], -0.5f);
    /* Q2_0: d = 2; byte 0 = 0xE4 holds codes 0,1,2,3: x = 2 * (q - 1) */
    put16(b, 0x4000);
    memset(b + 2, 0, 16);
    b[2] = 0xe4;
    dq(MR_TYPE_Q2_0, b, y);
    ck_assert_float_eq(y[0], -2.0f);
    ck_assert_float_eq(y[1], 0.0f);
    ck_assert_float_eq(y[2], 2.0f);
    ck_assert_float_eq(y[3], 4.0f);
    ck_assert_float_eq(y[4], -2.0f);
}
END_TEST

START_TEST(known_q2_k)
{
    uint8_t b[84];
    float y[256];
    /* sub-block j: scale j, min 15 - j; d = 1, dmin = 0.5 */
    for (int j = 0; j < 16; j++)
        b[j] = (uint8_t)(j | ((15 - j) << 4));
    /* even bytes 0xE4 (codes 0,1,2,3 at shifts 0,2,4,6), odd bytes 0x1B (3,2,1,0) */
    for (int i = 0; i < 64; i++)
        b[16 + i] = (i % 2) ? 0x1b : 0xe4;
    put16(b + 80, 0x3c00);
    put16(b + 82, 0x3800);
    dq(MR_TYPE_Q2_K, b, y);
    ck_assert_float_eq(y[0], -7.5f);   /* sub 0, q 0: 0 - 0.5*15 */
    ck_assert_float_eq(y[33], -2.5f);  /* sub 2 (scale 2, min 13), byte 1 shift 2: q 2 */
    ck_assert_float_eq(y[96], 6.0f * 3 - 0.5f * 9); /* sub 6, byte 0 shift 6: q 3 */
    ck_assert_float_eq(y[129], 8.0f * 3 - 0.5f * 7); /* sub 8, byte 33 shift 0: q 3 */
    ck_assert_float_eq(y[255], 0.0f - 0.5f * 0);    /* sub 15, byte 63 shift 6: q 0 */
    ck_assert_float_eq(y[254], 15.0f * 3);          /* sub 15, byte 62 shift 6: q 3 */
}
END_TEST

START_TEST(known_q3_k)
{
    uint8_t b[110];
    float y[256];
    /* hmask: even bytes 0x0F (high bit set for e < 128), odd bytes 0xF0 */
    for (int i = 0; i < 32; i++)
        b[i] = (i % 2) ? 0xf0 : 0x0f;
    for (int i = 0; i < 64; i++)
        b[32 + i] = 0xe4; /* low 2 bits = (e % 128) / 32 */
    /* 6-bit scale codes: 33 (scale 1) everywhere except sub-block 5 = 30
     * (scale -2) and sub-block 12 = 40 (scale 8).  Low nibbles: bytes 0..7
     * hold sub-blocks 0..7 (low) and 8..15 (high); bytes 8..11 hold the top
     * 2 bits, sub-block j at byte 8 + j%4, bits 2*(j/4). */
    const uint8_t sc[12] = {0x11, 0x11, 0x11, 0x11, 0x81, 0x1e, 0x11, 0x11, 0xaa, 0xa6, 0xaa, 0xaa};
    memcpy(b + 96, sc, 12);
    put16(b + 108, 0x3c00);
    dq(MR_TYPE_Q3_K, b, y);
    ck_assert_float_eq(y[0], 0.0f);     /* scale 1, q 0, high bit set */
    ck_assert_float_eq(y[1], -4.0f);    /* odd byte: high bit clear -> 0 - 4 */
    ck_assert_float_eq(y[80], -4.0f);   /* sub 5 (scale -2), q 2 */
    ck_assert_float_eq(y[81], 4.0f);    /* sub 5, q 2 - 4 */
    ck_assert_float_eq(y[200], -16.0f); /* sub 12 (scale 8), q 2 - 4 (even byte, e >= 128) */
    ck_assert_float_eq(y[201], 16.0f);  /* odd byte, e >= 128: high bit set, q 2 */
    ck_assert_float_eq(y[255], 3.0f);   /* sub 15, q 3, odd byte high bit set */
}
END_TEST

/* Q4_K / Q5_K scales and mins: sc = {1,2,3,4,17,33,50,63},
 * m = {0,5,10,15,20,40,48,63}, packed by hand as described in quant_k.c. */
static const uint8_t k4_scales[12] = {0x41, 0x82, 0xc3, 0xc4, 0x40, 0x85,
                                      0xca, 0xcf, 0x41, 0x81, 0x02, 0xff};

START_TEST(known_q4_k)
{
    uint8_t b[144];
    float y[256];
    put16(b, 0x3c00);     /* d = 1 */
    put16(b + 2, 0x3400); /* dmin = 0.25 */
    memcpy(b + 4, k4_scales, 12);
    for (int i = 0; i < 128; i++)
        b[16 + i] = (uint8_t)((i % 16) | ((15 - i % 16) << 4));
    dq(MR_TYPE_Q4_K, b, y);
    ck_assert_float_eq(y[0], 0.0f);                    /* sub 0: 1*0 - 0 */
    ck_assert_float_eq(y[33], 2.0f * 14 - 0.25f * 5);  /* sub 1, high nibble of byte 1 */
    ck_assert_float_eq(y[70], 3.0f * 6 - 0.25f * 10);  /* sub 2, low nibble of byte 38 */
    ck_assert_float_eq(y[140], 17.0f * 12 - 0.25f * 20); /* sub 4, byte 76 low */
    ck_assert_float_eq(y[170], 33.0f * 5 - 0.25f * 40);  /* sub 5, byte 74 high: 15-10 */
    ck_assert_float_eq(y[200], 50.0f * 8 - 0.25f * 48);  /* sub 6, byte 104 low */
    ck_assert_float_eq(y[255], 63.0f * 0 - 0.25f * 63); /* sub 7, byte 127 high */
}
END_TEST

START_TEST(known_q5_k)
{
    uint8_t b[176];
    float y[256];
    put16(b, 0x3c00);
    put16(b + 2, 0x3400);
    memcpy(b + 4, k4_scales, 12);
    for (int i = 0; i < 32; i++)
        b[16 + i] = (uint8_t)(1u << (i % 8)); /* element e gets +16 iff e/32 == (e%32)%8 */
    for (int i = 0; i < 128; i++)
        b[48 + i] = (uint8_t)((i % 16) | ((15 - i % 16) << 4));
    dq(MR_TYPE_Q5_K, b, y);
    ck_assert_float_eq(y[0], 1.0f * 16);               /* sub 0, q 0 + 16 */
    ck_assert_float_eq(y[1], 0.0f + 1.0f);             /* sub 0, q 1 */
    ck_assert_float_eq(y[33], 2.0f * 30 - 0.25f * 5);  /* sub 1, q 14 + 16 (33%32=1) */
    ck_assert_float_eq(y[200], 50.0f * 8 - 0.25f * 48); /* sub 6: 200%32=8, 8%8=0 != 6 */
    ck_assert_float_eq(y[230], 63.0f * 9 - 0.25f * 63);  /* sub 7: 230%32=6 != 7; byte 102 high */
    ck_assert_float_eq(y[231], 63.0f * 24 - 0.25f * 63); /* sub 7: 7 == 7: q 8 + 16 */
}
END_TEST

START_TEST(known_q6_k)
{
    uint8_t b[210];
    float y[256];
    for (int i = 0; i < 128; i++)
        b[i] = (uint8_t)i;            /* ql */
    for (int i = 0; i < 64; i++)
        b[128 + i] = (uint8_t)(i * 37); /* qh */
    for (int j = 0; j < 16; j++)
        b[192 + j] = (uint8_t)(int8_t)(j - 8);
    put16(b + 208, 0x3800); /* d = 0.5 */
    dq(MR_TYPE_Q6_K, b, y);
    ck_assert_float_eq(y[0], 128.0f);   /* ql 0, qh 0: q -32; scale -8 */
    ck_assert_float_eq(y[100], -2.0f);  /* ql[36]=0x24 high 2, qh[4]=148 bits 6-7 = 2: q 2; scale -2 */
    ck_assert_float_eq(y[200], -56.0f); /* ql[72]=0x48 high 4, qh[40]=200 bits 4-5 = 0: q -28; scale 4 */
    ck_assert_float_eq(y[255], -87.5f); /* ql[127] high 7, qh[63]=27 bits 6-7 = 0: q -25; scale 7 */
    ck_assert_float_eq(y[37], -15.0f);  /* ql[37] low 5, qh[5]=185 bits 2-3 = 2: q 5; scale -6 */
}
END_TEST

static const float iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

START_TEST(known_iq4)
{
    uint8_t b[136];
    float y[256];
    /* IQ4_NL: d = 2 */
    put16(b, 0x4000);
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    dq(MR_TYPE_IQ4_NL, b, y);
    for (int j = 0; j < 16; j++) {
        ck_assert_float_eq(y[j], 2.0f * iq4nl_levels[j]);
        ck_assert_float_eq(y[16 + j], 2.0f * iq4nl_levels[15 - j]);
    }
    /* IQ4_XS: d = 0.5, sub-block codes ls = {33,31,34,32,0,63,40,20}
     * (scales 1,-1,2,0,-32,31,8,-12) */
    put16(b, 0x3800);
    put16(b + 2, 0x6ca6);
    b[4] = 0xf1, b[5] = 0x02, b[6] = 0xf0, b[7] = 0x48;
    for (int i = 0; i < 128; i++)
        b[8 + i] = (uint8_t)((i % 16) | ((15 - i % 16) << 4));
    dq(MR_TYPE_IQ4_XS, b, y);
    const float scale[8] = {1, -1, 2, 0, -32, 31, 8, -12};
    for (int ib = 0; ib < 8; ib++)
        for (int p = 0; p < 16; p++) {
            ck_assert_float_eq(y[32 * ib + p], 0.5f * scale[ib] * iq4nl_levels[p]);
            ck_assert_float_eq(y[32 * ib + 16 + p], 0.5f * scale[ib] * iq4nl_levels[15 - p]);
        }
    ck_assert_float_eq(y[160], -1968.5f);
}
END_TEST

static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

START_TEST(known_fp4)
{
    uint8_t b[36];
    float y[64];
    /* MXFP4: e = 127 (scale 1) */
    b[0] = 127;
    for (int j = 0; j < 16; j++)
        b[1 + j] = (uint8_t)(j | ((15 - j) << 4));
    dq(MR_TYPE_MXFP4, b, y);
    for (int j = 0; j < 16; j++) {
        ck_assert_float_eq(y[j], e2m1[j]);
        ck_assert_float_eq(y[16 + j], e2m1[15 - j]);
    }
    b[0] = 130; /* 2^3 */
    dq(MR_TYPE_MXFP4, b, y);
    ck_assert_float_eq(y[7], 48.0f);
    ck_assert_float_eq(y[16], -48.0f);
    b[0] = 0; /* 2^-127, a float32 subnormal */
    dq(MR_TYPE_MXFP4, b, y);
    ck_assert_float_eq(y[1], ldexpf(1.0f, -128));
    ck_assert_float_eq(y[7], 6.0f * ldexpf(1.0f, -127));

    /* NVFP4: UE4M3 scales 0x38 = 1.0, 0x3C = 1.5, 0x7E = 448 (the largest),
     * 0x01 = 2^-9 (subnormal); sub-block s byte j: low code j, high code 8+j */
    b[0] = 0x38, b[1] = 0x3c, b[2] = 0x7e, b[3] = 0x01;
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < 8; j++)
            b[4 + 8 * s + j] = (uint8_t)(j | ((8 + j) << 4));
    dq(MR_TYPE_NVFP4, b, y);
    const float sc[4] = {1.0f, 1.5f, 448.0f, 1.0f / 512};
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < 8; j++) {
            ck_assert_float_eq(y[16 * s + j], sc[s] * e2m1[j]);
            ck_assert_float_eq(y[16 * s + 8 + j], -sc[s] * e2m1[j]);
        }
    ck_assert_float_eq(y[32 + 7], 2688.0f);
    /* 0x7F is the E4M3 NaN, which upstream decodes as a zero scale */
    b[0] = 0x7f;
    dq(MR_TYPE_NVFP4, b, y);
    for (int j = 0; j < 16; j++)
        ck_assert_float_eq(fabsf(y[j]), 0.0f);
}
END_TEST

/* ---- quantizer scale rules, checked on the bytes ---- */

START_TEST(quantizer_scale_rules)
{
    float x[64] = {0};
    uint8_t b[36];
    /* Q4_0: the largest magnitude (-1) maps to code 0, so d = 1/8 */
    x[0] = -1.0f, x[1] = 0.5f, x[17] = 0.25f;
    ck_assert_uint_eq(mr_quantize_row(MR_TYPE_Q4_0, x, b, 32), 18);
    ck_assert_uint_eq(b[0] | (b[1] << 8), 0x3000); /* 0.125 */
    ck_assert_uint_eq(b[2], 0 | (8 << 4)); /* x0 -> 0, x16 = 0 -> 8 */
    ck_assert_uint_eq(b[3] & 0xf, 12);                          /* 0.5 / 0.125 + 8 */
    ck_assert_uint_eq(b[3] >> 4, 10);                           /* x17: 0.25 / 0.125 + 8 */
    /* Q8_0: d = amax / 127; Q8_1 also stores d * sum(q) */
    memset(x, 0, sizeof x);
    x[0] = 127.0f / 64, x[5] = -0.5f, x[6] = 1.5f / 64; /* d = 1/64, exact in fp16 */
    mr_quantize_row(MR_TYPE_Q8_1, x, b, 32);
    ck_assert_uint_eq(b[0] | (b[1] << 8), 0x2400);      /* 2^-6 */
    ck_assert_int_eq((int8_t)b[4], 127);
    ck_assert_int_eq((int8_t)b[9], -32);
    ck_assert_int_eq((int8_t)b[10], 2);                 /* 1.5 rounds away from zero */
    ck_assert_uint_eq(b[2] | (b[3] << 8), 0x3e10);      /* s = 97/64 = 1.515625 */
    /* MXFP4: amax 3 = 1.5 * 2^1 -> shared exponent 1 - 2 (E8M0 126), so 3
     * is E2M1 6 (code 7) exactly and -0.5 is -1 (code 10) */
    memset(x, 0, sizeof x);
    x[0] = 3.0f, x[16] = -0.5f;
    mr_quantize_row(MR_TYPE_MXFP4, x, b, 32);
    ck_assert_uint_eq(b[0], 126);
    ck_assert_uint_eq(b[1], 7 | (10 << 4));
    /* NVFP4: each 16-element scale is amax / 6 in UE4M3: 6 -> 1.0 (0x38),
     * 0.75 -> 0.125 (0x20), 2688 -> 448 (0x7E), zeros -> 0 */
    memset(x, 0, sizeof x);
    x[3] = 6.0f, x[16] = -0.75f, x[40] = 2688.0f;
    mr_quantize_row(MR_TYPE_NVFP4, x, b, 64);
    ck_assert_uint_eq(b[0], 0x38);
    ck_assert_uint_eq(b[1], 0x20);
    ck_assert_uint_eq(b[2], 0x7e);
    ck_assert_uint_eq(b[3], 0x00);
    ck_assert_uint_eq(b[4 + 3] & 0xf, 7);  /* 6 = E2M1 6 */
    ck_assert_uint_eq(b[4 + 8] & 0xf, 15); /* -0.75 / 0.125 = -6 */
}
END_TEST

/* ---- round trips ---- */

START_TEST(roundtrip)
{
    const rt_case *c = &rt_cases[_i];
    const mr_type_info *ti = mr_type_get(c->type);
    ck_assert(ti && ti->supported);
    float *x = malloc(sizeof(float) * ROW), *y = malloc(sizeof(float) * ROW);
    uint8_t *q = malloc(mr_row_size(c->type, ROW));
    double worst = 0;
    for (int d = 0; d < D_COUNT; d++) {
        fill(x, ROW, (enum dist)d, 1000 + (uint64_t)d);
        ck_assert_uint_eq(mr_quantize_row(c->type, x, q, ROW), mr_row_size(c->type, ROW));
        ck_assert_int_eq(mr_dequantize_row(c->type, q, y, ROW), 0);
        const double bound = d == D_OUTLIERS ? c->outl : c->bound;
        if (bound < 0)
            continue;
        double e = rel_l2(y, x, ROW);
        ck_assert_msg(e <= bound, "%s on %s data: relative L2 error %.4g > %.4g", ti->name,
                      dist_name[d], e, bound);
        if (e > worst)
            worst = e;
    }
    /* zeros stay zeros */
    memset(x, 0, sizeof(float) * ROW);
    mr_quantize_row(c->type, x, q, ROW);
    mr_dequantize_row(c->type, q, y, ROW);
    for (int i = 0; i < ROW; i++)
        ck_assert_msg(y[i] == 0.0f, "%s: zero input decodes to %g at %d", ti->name, y[i], i);
    printf("roundtrip %-7s worst relative L2 %.4f (bounds %.3g, outliers %.3g)\n", ti->name, worst,
           c->bound, c->outl);
    free(x);
    free(y);
    free(q);
}
END_TEST

/* The quantizer must not just be self-consistent: decoding a row with the
 * layout of a different type of the same block size must be far off, which
 * is what the bounds above rely on to tell layouts apart. */
START_TEST(bounds_separate_layouts)
{
    float *x = malloc(sizeof(float) * ROW), *y = malloc(sizeof(float) * ROW);
    uint8_t *q = malloc(mr_row_size(MR_TYPE_Q4_0, ROW));
    fill(x, ROW, D_NORMAL, 7);
    mr_quantize_row(MR_TYPE_Q4_0, x, q, ROW);
    mr_dequantize_row(MR_TYPE_IQ4_NL, q, y, ROW); /* same size, other code book */
    ck_assert(rel_l2(y, x, ROW) > 0.5);
    free(x);
    free(y);
    free(q);
}
END_TEST

/* ---- dot products ---- */

START_TEST(vec_dot_matches_dequantized)
{
    const rt_case *c = &rt_cases[_i];
    float *w = malloc(sizeof(float) * ROW), *x = malloc(sizeof(float) * ROW),
          *y = malloc(sizeof(float) * ROW);
    uint8_t *q = malloc(mr_row_size(c->type, ROW));
    for (int d = 0; d < D_COUNT; d++) {
        fill(w, ROW, (enum dist)d, 77 + (uint64_t)d);
        fill(x, ROW, D_NORMAL, 99 + (uint64_t)d);
        mr_quantize_row(c->type, w, q, ROW);
        mr_dequantize_row(c->type, q, y, ROW);
        double ref = 0, mag = 0;
        for (int i = 0; i < ROW; i++) {
            ref += (double)y[i] * x[i];
            mag += fabs((double)y[i] * x[i]);
        }
        /* float32 sums within a block of at most 256 terms */
        const double tol = 256 * 6e-8 * mag + 1e-30;
        const float got = mr_vec_dot(c->type, q, x, ROW);
        ck_assert_msg(fabs(got - ref) <= tol, "%s: dot %.9g, want %.9g (tol %.3g)",
                      mr_type_name(c->type), got, ref, tol);
        /* a sub-row (first blocks only) too */
        const int64_t qk = mr_type_get(c->type)->block_elems;
        const int64_t n = qk == 1 ? 77 : qk * 3;
        ref = 0;
        for (int64_t i = 0; i < n; i++)
            ref += (double)y[i] * x[i];
        ck_assert(fabs(mr_vec_dot(c->type, q, x, n) - ref) <= tol);
    }
    free(w);
    free(x);
    free(y);
    free(q);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("quant");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, table_sizes);
    tcase_add_test(tc, unsupported_and_bad_lengths);
    suite_add_tcase(s, tc);
    tc = tcase_create("known");
    tcase_add_test(tc, known_plain);
    tcase_add_test(tc, known_q8);
    tcase_add_test(tc, known_q4_q5);
    tcase_add_test(tc, known_q1_q2);
    tcase_add_test(tc, known_q2_k);
    tcase_add_test(tc, known_q3_k);
    tcase_add_test(tc, known_q4_k);
    tcase_add_test(tc, known_q5_k);
    tcase_add_test(tc, known_q6_k);
    tcase_add_test(tc, known_iq4);
    tcase_add_test(tc, known_fp4);
    tcase_add_test(tc, quantizer_scale_rules);
    suite_add_tcase(s, tc);
    tc = tcase_create("roundtrip");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, roundtrip, 0, (int)N_RT);
    tcase_add_test(tc, bounds_separate_layouts);
    tcase_add_loop_test(tc, vec_dot_matches_dequantized, 0, (int)N_RT);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
