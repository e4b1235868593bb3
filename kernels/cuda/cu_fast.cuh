/* Bandwidth-tuned matvec kernels for the weight types that dominate decode
 * (cu_fast.cu).  Each returns false when it does not handle the case; the
 * caller then uses the generic kernels, which compute the same function. */
#ifndef MR_CU_FAST_CUH
#define MR_CU_FAST_CUH

#include "kernels/cuda/cu_common.cuh"

bool mr_cu_fast_matvec(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n);
bool mr_cu_fast_matvec_id(mr_cu_ctx *c, const mr_weight *w, const float *x, int x_slots,
                          const int32_t *ids, int k, float *y, int n);

#endif
