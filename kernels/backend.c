/* Backend selection by name. */
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

mr_backend *mr_backend_create(const char *name, mr_err *err)
{
    if (!name || !strcmp(name, "auto")) {
        if (mr_backend_cuda_available())
            return mr_backend_cuda_create(0, err);
        return mr_backend_cpu_create(err);
    }
    if (!strcmp(name, "cpu"))
        return mr_backend_cpu_create(err);
    if (!strcmp(name, "cuda"))
        return mr_backend_cuda_create(0, err);
    mr_errf(err, "unknown backend '%s' (expected cpu, cuda or auto)", name);
    return NULL;
}

void mr_backend_destroy(mr_backend *be)
{
    if (be && be->destroy)
        be->destroy(be);
}

#ifndef MR_HAVE_CUDA
/* Built without nvcc: the CUDA backend does not exist in this binary. */
mr_backend *mr_backend_cuda_create(int device, mr_err *err)
{
    (void)device;
    mr_errf(err, "this build has no CUDA backend (nvcc was not found at build time)");
    return NULL;
}

bool mr_backend_cuda_available(void) { return false; }
#endif
