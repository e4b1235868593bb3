/* libFuzzer target: the GGUF reader on arbitrary bytes, then every getter
 * on whatever it accepted, and a copy of the accepted keys and tensors into
 * a writer (without writing). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"

static volatile uint64_t sink;

static void exercise(const mr_gguf *g)
{
    mr_err err;
    mr_gguf_writer *w = mr_gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const mr_gguf_kv *kv = &g->kv[i];
        char key[256];
        size_t n = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
        memcpy(key, kv->key.ptr, n);
        key[n] = '\0';
        if (mr_gguf_find(g, key) != kv && n == kv->key.len)
            abort(); /* an accepted key must be found again */
        uint64_t u;
        uint32_t u32;
        int64_t i64;
        float f;
        bool b;
        char *s = NULL;
        const mr_gguf_kv *arr;
        sink += (uint64_t)mr_gguf_get_u64(g, key, &u, &err);
        sink += (uint64_t)mr_gguf_get_u32(g, key, &u32, &err);
        sink += (uint64_t)mr_gguf_get_i64(g, key, &i64, &err);
        sink += (uint64_t)mr_gguf_get_f32(g, key, &f, &err);
        sink += (uint64_t)mr_gguf_get_bool(g, key, &b, &err);
        if (mr_gguf_get_str(g, key, &s, &err) == 0) {
            sink += strlen(s);
            free(s);
        }
        if (mr_gguf_get_arr(g, key, MR_GGUF_VTYPE_COUNT, &arr, &err) == 0) {
            uint64_t m = arr->v.arr.n < 64 ? arr->v.arr.n : 64;
            for (uint64_t j = 0; j < m; j++) {
                sink += (uint64_t)mr_gguf_arr_i64(arr, j);
                double f64 = mr_gguf_arr_f64(arr, j);
                uint64_t bits;
                memcpy(&bits, &f64, sizeof bits); /* any double, NaN and inf included */
                sink += bits;
                if (arr->v.arr.type == MR_GGUF_STRING && arr->v.arr.strs[j].len)
                    sink += (uint8_t)arr->v.arr.strs[j].ptr[arr->v.arr.strs[j].len - 1];
            }
            sink += (uint64_t)mr_gguf_arr_i64(arr, arr->v.arr.n); /* out of range */
        }
        mr_gguf_writer_copy_kv(w, kv);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const mr_gguf_tensor *t = &g->tensors[i];
        if (mr_gguf_find_tensor(g, t->name) != t)
            abort();
        /* touch the first and last data byte: must lie inside the input */
        const uint8_t *d = t->data;
        sink += d[0] + d[t->nbytes - 1];
        mr_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    sink += mr_gguf_writer_error(w) != NULL;
    mr_gguf_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a private copy of exactly size bytes, so any overread is caught */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    mr_gguf *g = NULL;
    mr_err err;
    if (mr_gguf_open_mem(copy, size, &g, &err) == 0) {
        exercise(g);
        mr_gguf_close(g);
    } else if (g != NULL || strncmp(err.msg, "gguf: ", 6) != 0) {
        abort(); /* failures leave no object and say where they come from */
    }
    free(copy);
    return 0;
}
