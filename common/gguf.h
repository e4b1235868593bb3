/* GGUF v2/v3 reader (mmap, validated, zero-copy) and writer.
 *
 * The reader validates every length, count, type and offset against the
 * file size before it is used; any violation is returned as an mr_err that
 * names the key or tensor, the byte offset and what was expected.  Tensor
 * data is never copied: mr_gguf_tensor.data points into the mapping. */
#ifndef MR_GGUF_H
#define MR_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/quant.h"

#define MR_GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define MR_GGUF_DEFAULT_ALIGNMENT 32

enum mr_gguf_vtype {
    MR_GGUF_UINT8 = 0,
    MR_GGUF_INT8 = 1,
    MR_GGUF_UINT16 = 2,
    MR_GGUF_INT16 = 3,
    MR_GGUF_UINT32 = 4,
    MR_GGUF_INT32 = 5,
    MR_GGUF_FLOAT32 = 6,
    MR_GGUF_BOOL = 7,
    MR_GGUF_STRING = 8,
    MR_GGUF_ARRAY = 9,
    MR_GGUF_UINT64 = 10,
    MR_GGUF_INT64 = 11,
    MR_GGUF_FLOAT64 = 12,
    MR_GGUF_VTYPE_COUNT
};

/* A string inside the mapping: not NUL-terminated. */
typedef struct mr_str {
    const char *ptr;
    uint64_t len;
} mr_str;

typedef struct mr_gguf_kv {
    mr_str key;
    enum mr_gguf_vtype type;
    union {
        uint64_t u;   /* UINT8..UINT64 */
        int64_t i;    /* INT8..INT64 */
        double f;     /* FLOAT32, FLOAT64 */
        bool b;       /* BOOL */
        mr_str s;     /* STRING */
        struct {
            enum mr_gguf_vtype type; /* element type (never ARRAY: nested arrays are rejected) */
            uint64_t n;
            const void *data;        /* scalar elements, packed little-endian, unaligned */
            const mr_str *strs;      /* STRING elements, indexed at open time */
        } arr;
    } v;
} mr_gguf_kv;

#define MR_GGUF_MAX_DIMS 4

typedef struct mr_gguf_tensor {
    char *name;            /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t ne[MR_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    enum mr_type type;
    uint64_t offset;       /* relative to the data section */
    size_t nbytes;
    const void *data;      /* into the mapping */
} mr_gguf_tensor;

typedef struct mr_gguf {
    const uint8_t *base;   /* the whole file */
    size_t size;
    bool mapped;           /* base is an mmap owned by this object */
    uint32_t version;
    uint64_t n_kv;
    mr_gguf_kv *kv;
    uint64_t n_tensors;
    mr_gguf_tensor *tensors;
    size_t alignment;
    size_t data_offset;    /* start of the tensor data section */
} mr_gguf;

/* Opens and validates a file (mmap). On error *out is NULL. */
int mr_gguf_open(const char *path, mr_gguf **out, mr_err *err);
/* Same over caller memory, which must outlive the returned object. */
int mr_gguf_open_mem(const void *buf, size_t size, mr_gguf **out, mr_err *err);
void mr_gguf_close(mr_gguf *g);

const mr_gguf_kv *mr_gguf_find(const mr_gguf *g, const char *key);
const mr_gguf_tensor *mr_gguf_find_tensor(const mr_gguf *g, const char *name);

/* Typed getters. Integers accept any integer type whose value fits; floats
 * accept FLOAT32/FLOAT64. A missing key or a wrong type is an error naming
 * the key. */
int mr_gguf_get_u64(const mr_gguf *g, const char *key, uint64_t *out, mr_err *err);
int mr_gguf_get_u32(const mr_gguf *g, const char *key, uint32_t *out, mr_err *err);
int mr_gguf_get_i64(const mr_gguf *g, const char *key, int64_t *out, mr_err *err);
int mr_gguf_get_f32(const mr_gguf *g, const char *key, float *out, mr_err *err);
int mr_gguf_get_bool(const mr_gguf *g, const char *key, bool *out, mr_err *err);
/* Copies the string into a malloc'd NUL-terminated buffer. */
int mr_gguf_get_str(const mr_gguf *g, const char *key, char **out, mr_err *err);
/* An array of the given element type (MR_GGUF_VTYPE_COUNT: any). */
int mr_gguf_get_arr(const mr_gguf *g, const char *key, enum mr_gguf_vtype elem,
                    const mr_gguf_kv **out, mr_err *err);
/* Element i of a scalar array, converted (integer or float element types). */
int64_t mr_gguf_arr_i64(const mr_gguf_kv *kv, uint64_t i);
double mr_gguf_arr_f64(const mr_gguf_kv *kv, uint64_t i);

const char *mr_gguf_vtype_name(enum mr_gguf_vtype t);

/* ---- writer ----
 * Build in memory, then write: metadata and tensor infos first, then the
 * data section aligned to `general.alignment` (default 32). */
typedef struct mr_gguf_writer mr_gguf_writer;

mr_gguf_writer *mr_gguf_writer_new(void);
void mr_gguf_writer_free(mr_gguf_writer *w);
int mr_gguf_writer_set_u32(mr_gguf_writer *w, const char *key, uint32_t v);
int mr_gguf_writer_set_i32(mr_gguf_writer *w, const char *key, int32_t v);
int mr_gguf_writer_set_u64(mr_gguf_writer *w, const char *key, uint64_t v);
int mr_gguf_writer_set_f32(mr_gguf_writer *w, const char *key, float v);
int mr_gguf_writer_set_bool(mr_gguf_writer *w, const char *key, bool v);
int mr_gguf_writer_set_str(mr_gguf_writer *w, const char *key, const char *v);
/* Scalar array: n elements of type elem, packed little-endian in data. */
int mr_gguf_writer_set_arr(mr_gguf_writer *w, const char *key, enum mr_gguf_vtype elem,
                           const void *data, uint64_t n);
int mr_gguf_writer_set_arr_str(mr_gguf_writer *w, const char *key, const char *const *strs,
                               uint64_t n);
/* Copies one key/value (any type) from an opened file. */
int mr_gguf_writer_copy_kv(mr_gguf_writer *w, const mr_gguf_kv *kv);
/* Adds a tensor; data (nbytes = mr_row_size(type, ne[0]) * rows) is
 * referenced, not copied, and must live until mr_gguf_writer_write returns.
 * data may be NULL when a fill callback is given to write_file. */
int mr_gguf_writer_add_tensor(mr_gguf_writer *w, const char *name, enum mr_type type,
                              uint32_t n_dims, const int64_t *ne, const void *data);
int mr_gguf_writer_write(mr_gguf_writer *w, const char *path, mr_err *err);

/* More scalar setters (every GGUF value type has one). */
int mr_gguf_writer_set_u8(mr_gguf_writer *w, const char *key, uint8_t v);
int mr_gguf_writer_set_i8(mr_gguf_writer *w, const char *key, int8_t v);
int mr_gguf_writer_set_u16(mr_gguf_writer *w, const char *key, uint16_t v);
int mr_gguf_writer_set_i16(mr_gguf_writer *w, const char *key, int16_t v);
int mr_gguf_writer_set_i64(mr_gguf_writer *w, const char *key, int64_t v);
int mr_gguf_writer_set_f64(mr_gguf_writer *w, const char *key, double v);
/* A string of len bytes (may hold any bytes). */
int mr_gguf_writer_set_strn(mr_gguf_writer *w, const char *key, const char *v, uint64_t len);
int mr_gguf_writer_set_arr_mrstr(mr_gguf_writer *w, const char *key, const mr_str *strs,
                                 uint64_t n);
/* Setting a key again replaces its value (it keeps its first position).
 * `general.alignment` (uint32, a power of two) sets the data alignment.
 * Setters and add_tensor return -1 on bad arguments; the first such error
 * is kept (mr_gguf_writer_error) and returned again by the write calls. */
const char *mr_gguf_writer_error(const mr_gguf_writer *w);

/* Streaming data: fills bytes [off, off + len) of tensor number `index`
 * (in add order) into dst.  off and len are whole blocks of the tensor's
 * type (len <= 8 MiB).  t describes the tensor (t->data is NULL).  Called
 * from several threads at once, on disjoint ranges; returns 0 or -1 with
 * err filled. */
typedef int (*mr_gguf_fill_fn)(void *ctx, const mr_gguf_tensor *t, uint64_t index, size_t off,
                               void *dst, size_t len, mr_err *err);
/* Writes the file: tensors with data are copied from it, tensors without
 * are produced by fill (which may be NULL when every tensor has data).  The
 * data section is written by n_threads threads (0: one per online CPU)
 * with pwrite into PATH.tmp.XXXXXX, renamed to path when complete. */
int mr_gguf_writer_write_file(mr_gguf_writer *w, const char *path, mr_gguf_fill_fn fill,
                              void *ctx, unsigned n_threads, mr_err *err);

#endif
