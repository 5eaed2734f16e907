#include "core/tensor.h"

#include "core/bf16.h"
#include "core/status.h"

#include <string.h>


size_t loom_dtype_size(loom_dtype dt) {
    switch (dt) {
    case LOOM_F32: return 4;
    case LOOM_BF16: return 2;
    case LOOM_I32: return 4;
    case LOOM_F64: return 8;
    }
    return 0;
}

void loom_f32_to_dtype(void *dst, loom_dtype dt, const float *src, size_t n) {
    LOOM_CHECK(dt == LOOM_F32 || dt == LOOM_BF16);
    if (dt == LOOM_F32) memcpy(dst, src, n * sizeof(float));
    else for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = loom_f32_to_bf16(src[i]);
}

void loom_dtype_to_f32(float *dst, const void *src, loom_dtype dt, size_t n) {
    LOOM_CHECK(dt == LOOM_F32 || dt == LOOM_BF16);
    if (dt == LOOM_F32) memcpy(dst, src, n * sizeof(float));
    else for (size_t i = 0; i < n; i++) dst[i] = loom_bf16_to_f32(((const uint16_t *)src)[i]);
}

const char *loom_dtype_name(loom_dtype dt) {
    switch (dt) {
    case LOOM_F32: return "fp32";
    case LOOM_BF16: return "bf16";
    case LOOM_I32: return "int32";
    case LOOM_F64: return "fp64";
    }
    return "?";
}

loom_tensor loom_view_dims(void *data, loom_dtype dt, const int64_t *shape, int ndim) {
    LOOM_CHECK(ndim >= 1 && ndim <= 4);
    loom_tensor t = {.data = data, .dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    return t;
}

int64_t loom_numel(const loom_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t loom_nbytes(const loom_tensor *t) { return (size_t)loom_numel(t) * loom_dtype_size(t->dtype); }

int64_t loom_cols(const loom_tensor *t) { return t->shape[t->ndim - 1]; }

int64_t loom_rows(const loom_tensor *t) { return loom_numel(t) / loom_cols(t); }

loom_tensor loom_index(const loom_tensor *t, int64_t i) {
    LOOM_CHECK(t->ndim >= 2 && i >= 0 && i < t->shape[0]);
    loom_tensor s = {.dtype = t->dtype, .ndim = t->ndim - 1};
    for (int d = 1; d < t->ndim; d++) s.shape[d - 1] = t->shape[d];
    s.data = (char *)t->data + (size_t)i * loom_nbytes(&s);
    return s;
}

loom_tensor loom_row_slice(const loom_tensor *t, int64_t r0, int64_t r1) {
    int64_t cols = loom_cols(t);
    LOOM_CHECK(r0 >= 0 && r0 <= r1 && r1 <= loom_rows(t));
    loom_tensor s = {.dtype = t->dtype, .ndim = 2, .shape = {r1 - r0, cols}};
    s.data = (char *)t->data + (size_t)(r0 * cols) * loom_dtype_size(t->dtype);
    return s;
}
