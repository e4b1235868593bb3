/* What the worker's command-line programs (worker/bin) share: parsing
 * token lists and counts, and loading a model on a named backend. */
#ifndef MR_WORKER_CLI_H
#define MR_WORKER_CLI_H

#include <stdint.h>

#include "common/err.h"
#include "kernels/ops.h"
#include "worker/model.h"

/* Parses "1,2,3" (decimal ids, no empty items) into a malloc'd array;
 * errors name the option `what` the ids came from. */
int mr_cli_parse_tokens(const char *what, const char *s, int32_t **out, int *n_out, mr_err *err);

/* A decimal integer in [lo, hi] that spans all of s; 0, or -1 (nothing
 * written) when s is anything else. */
int mr_cli_parse_int(const char *s, long lo, long hi, int *out);

/* "f32", "f16" or "bf16" (the K/V element type); 0, or -1 (nothing written)
 * for anything else. */
int mr_cli_parse_kv_dtype(const char *s, mr_kv_dtype *out);

/* Creates the backend ("cpu", "cuda", "auto") and loads the model at path
 * on it.  Fails when the model's context (opts->n_ctx capped by the length
 * it was trained for) is shorter than opts->n_ctx.  On failure neither is
 * left; on success the caller frees the model, then the backend. */
int mr_cli_load(const char *path, const char *backend, const mr_model_opts *opts, mr_backend **be,
                mr_model **m, mr_err *err);

#endif
