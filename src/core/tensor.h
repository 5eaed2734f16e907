// Tensor views: a pointer into some backend's memory plus dtype and shape (row-major, at most
// 4 dimensions). Views never own memory; the flat buffers of DESIGN principle 3 do.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { LOOM_F32 = 0, LOOM_BF16, LOOM_I32, LOOM_F64 } loom_dtype;

typedef struct {
    void *data;       // device (or host) pointer of the owning backend
    loom_dtype dtype;
    int ndim;         // 1..4
    int64_t shape[4];
} loom_tensor;

size_t loom_dtype_size(loom_dtype dt);
// Host conversions between fp32 and a float dtype dt (F32 or BF16, round to nearest even).
void loom_f32_to_dtype(void *dst, loom_dtype dt, const float *src, size_t n);
void loom_dtype_to_f32(float *dst, const void *src, loom_dtype dt, size_t n);
const char *loom_dtype_name(loom_dtype dt);

// A view of dims `shape[0..ndim)` starting at `data`.
loom_tensor loom_view_dims(void *data, loom_dtype dt, const int64_t *shape, int ndim);
// Shorthand with the dims listed: LOOM_VIEW(p, LOOM_F32, B, T, C) is a (B, T, C) fp32 view.
#define LOOM_VIEW(data, dt, ...)                                                    \
    loom_view_dims((data), (dt), (const int64_t[]){__VA_ARGS__},                   \
                   (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
int64_t loom_numel(const loom_tensor *t);
size_t loom_nbytes(const loom_tensor *t);
// Product of all dims but the last (the "rows" of a (..., C) tensor), and the last dim.
int64_t loom_rows(const loom_tensor *t);
int64_t loom_cols(const loom_tensor *t);
// The sub-view [i] along the first dimension (drops that dimension).
loom_tensor loom_index(const loom_tensor *t, int64_t i);
// Rows [r0, r1) of a view reshaped to (rows, cols).
loom_tensor loom_row_slice(const loom_tensor *t, int64_t r0, int64_t r1);
