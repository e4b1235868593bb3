#include "kernels/cuda/cu_fast.cuh"
#include "kernels/cuda/cu_quant.cuh"


bool mr_cu_fast_matvec(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n)
{
    return false;
}

bool mr_cu_fast_matvec_id(mr_cu_ctx *c, const mr_weight *w, const float *x, int x_slots,
                          const int32_t *ids, int k, float *y, int n)
{
    return false;
}

int mr_cu_weight_prepare(mr_backend *be, mr_weight *w, mr_err *err)
{
    return 0;
}

void mr_cu_weight_free_priv(mr_backend *be, mr_weight *w)
{
}
