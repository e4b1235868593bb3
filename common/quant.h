/* Tensor element types (numbered as GGUF/ggml number them), their block
 * layouts, and the CPU reference for each: dequantize, dot product with a
 * float32 vector, and a reference quantizer (for tests and synthetic models). */
#ifndef MR_QUANT_H
#define MR_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum mr_type {
    MR_TYPE_F32 = 0,
    MR_TYPE_F16 = 1,
    MR_TYPE_Q4_0 = 2,
    MR_TYPE_Q4_1 = 3,
    MR_TYPE_Q5_0 = 6,
    MR_TYPE_Q5_1 = 7,
    MR_TYPE_Q8_0 = 8,
    MR_TYPE_Q8_1 = 9,
    MR_TYPE_Q2_K = 10,
    MR_TYPE_Q3_K = 11,
    MR_TYPE_Q4_K = 12,
    MR_TYPE_Q5_K = 13,
    MR_TYPE_Q6_K = 14,
    MR_TYPE_Q8_K = 15,
    MR_TYPE_IQ2_XXS = 16,
    MR_TYPE_IQ2_XS = 17,
    MR_TYPE_IQ3_XXS = 18,
    MR_TYPE_IQ1_S = 19,
    MR_TYPE_IQ4_NL = 20,
    MR_TYPE_IQ3_S = 21,
    MR_TYPE_IQ2_S = 22,
    MR_TYPE_IQ4_XS = 23,
    MR_TYPE_I8 = 24,
    MR_TYPE_I16 = 25,
    MR_TYPE_I32 = 26,
    MR_TYPE_I64 = 27,
    MR_TYPE_F64 = 28,
    MR_TYPE_IQ1_M = 29,
    MR_TYPE_BF16 = 30,
    MR_TYPE_TQ1_0 = 34,
    MR_TYPE_TQ2_0 = 35,
    MR_TYPE_MXFP4 = 39,
    MR_TYPE_NVFP4 = 40,
    MR_TYPE_Q1_0 = 41,
    MR_TYPE_Q2_0 = 42,
    MR_TYPE_COUNT
};

typedef struct mr_type_info {
    const char *name;     /* upstream spelling: "Q4_K", "IQ4_XS", ... */
    int64_t block_elems;  /* elements per block (1 for plain types) */
    size_t block_bytes;   /* bytes per block */
    bool known;           /* a type id GGUF files may carry (size is known) */
    bool supported;       /* dequantize/dot implemented here */
} mr_type_info;

/* NULL for ids that are not types. */
const mr_type_info *mr_type_get(int type);
const char *mr_type_name(int type);
/* Parses an upstream name ("q4_k", "Q4_K", "iq4_xs"); -1 if unknown. */
int mr_type_from_name(const char *name);

/* Bytes for n elements of a row; 0 when n is not a multiple of the block
 * size or the type is unknown. */
size_t mr_row_size(int type, int64_t n);

/* Dequantizes n elements (n a multiple of the block size) into dst.
 * Returns 0, or -1 for an unsupported type. */
int mr_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* Dot product of one quantized row of n elements with a float32 vector,
 * computed as the dequantized values times x, accumulated in float32 per
 * block and in double across blocks.  NAN for an unsupported type or an n
 * that is not a multiple of the block size. */
float mr_vec_dot(int type, const void *row, const float *x, int64_t n);

/* Reference quantizer (round-to-nearest with the format's own scale rules;
 * not tuned for quality). Returns bytes written, 0 if unsupported. */
size_t mr_quantize_row(int type, const float *src, void *dst, int64_t n);

#endif
