/* C-callable hook of the int8-activation matvec (cu_mvq8.cu) for the
 * benchmark program: the activation quantization alone, so that its share
 * of a q8 product can be timed. */
#ifndef MR_CU_MVQ8_H
#define MR_CU_MVQ8_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mr_backend;
/* Quantizes `rows` float rows of `cols` values (a multiple of 256; x 16-byte
 * aligned device memory) into the backend's scratch, as a q8 product does
 * first; enqueued on the backend's stream.  0, or -1 on bad arguments or a
 * (sticky) device error. */
int mr_cuda_q8_quantize(struct mr_backend *be, const float *x, int64_t rows, int64_t cols);

#ifdef __cplusplus
}
#endif
#endif
