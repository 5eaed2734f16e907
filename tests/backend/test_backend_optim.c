// AdamW against the closed-form update of backend.h (torch.optim.AdamW) over a few steps,
// with weight decay on and off; sumsq against an fp64 sum; and the backend's set-up: fp32
// only, zero-filled aligned memory, copies in and out.
#include "backend_test.h"

#include <stdint.h>

#define F32 LOOM_F32

static void test_adamw(float weight_decay, float grad_scale) {
    const int n = 1000, steps = 4;
    float *p = t_randn(n, 1), *m = t_randn(n, 0), *v = t_randn(n, 0), *g = t_randn(n, 1);
    float *p0 = t_dup(p, n), *fp = t_nans(n), *fm = t_nans(n), *fv = t_nans(n);
    double *rp = malloc(sizeof(double) * n), *rm = calloc(n, sizeof(double)),
           *rv = calloc(n, sizeof(double));
    for (int i = 0; i < n; i++) rp[i] = p[i];
    loom_adamw_args a = {.lr = 1e-2f,
                         .beta1 = 0.9f,
                         .beta2 = 0.95f,
                         .eps = 1e-8f,
                         .weight_decay = weight_decay,
                         .grad_scale = grad_scale};
    for (a.t = 1; a.t <= steps; a.t++) {
        t_fill_normal(g, n, 1);
        g[0] = 0; // a zero gradient: the update is momentum and decay only
        t_be->adamw_update(t_be, LOOM_VIEW(p, F32, n), LOOM_VIEW(NULL, F32, n),
                           LOOM_VIEW(g, F32, n), LOOM_VIEW(m, F32, n), LOOM_VIEW(v, F32, n), a);
        double bc1 = 1 - pow(a.beta1, (double)a.t), bc2 = 1 - pow(a.beta2, (double)a.t);
        for (int i = 0; i < n; i++) {
            double gi = (double)g[i] * a.grad_scale;
            rm[i] = a.beta1 * rm[i] + (1 - (double)a.beta1) * gi;
            rv[i] = a.beta2 * rv[i] + (1 - (double)a.beta2) * gi * gi;
            rp[i] -= a.lr * ((rm[i] / bc1) / (sqrt(rv[i] / bc2) + a.eps) + a.weight_decay * rp[i]);
        }
    }
    // the moments, and the parameters' total change (about lr per step) against the reference's
    for (int i = 0; i < n; i++)
        fp[i] = (float)(rp[i] - p0[i]), fm[i] = (float)rm[i], fv[i] = (float)rv[i];
    for (int i = 0; i < n; i++) p[i] -= p0[i];
    double ep = t_max_rel_err(p, fp, n), em = t_max_rel_err(m, fm, n), ev = t_max_rel_err(v, fv, n);
    T_ASSERT(ep < 1e-4, "adamw wd=%g: parameter change rel err %.3g", weight_decay, ep);
    T_ASSERT(em < T_TOL && ev < T_TOL, "adamw wd=%g: moment rel errs %.3g %.3g", weight_decay, em,
             ev);
    free(p), free(m), free(v), free(g), free(p0), free(fp), free(fm), free(fv), free(rp), free(rm),
        free(rv);
}

static void test_sumsq(int64_t n) {
    float *x = t_randn((size_t)n, 3);
    double ref = 0;
    for (int64_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    double s = t_be->sumsq(t_be, LOOM_VIEW(x, F32, n));
    T_ASSERT(fabs(s - ref) <= 1e-12 * ref, "sumsq n=%lld: %.17g vs %.17g", (long long)n, s, ref);
    free(x);
}

static void test_setup(void) {
    loom_backend *be = (loom_backend *)1;
    T_ASSERT(loom_backend_cpu_create(&be, LOOM_BF16) == LOOM_EUNSUPPORTED && be == NULL,
             "bf16 refused");
    T_ASSERT(strstr(loom_error_message(), "fp32") != NULL, "message: %s", loom_error_message());
    T_ASSERT(t_be->dtype == LOOM_F32 && strcmp(t_be->name, "cpu") == 0, "name and dtype");
    size_t sizes[] = {0, 1, 100, 4096 * 3 + 5};
    for (int k = 0; k < 4; k++) {
        size_t bytes = sizes[k];
        unsigned char *p = t_be->alloc(t_be, bytes), *host = malloc(bytes + 1);
        T_ASSERT(p != NULL && (uintptr_t)p % 64 == 0, "alloc %zu: %p", bytes, (void *)p);
        int nonzero = 0;
        for (size_t i = 0; i < bytes; i++) nonzero |= p[i];
        T_ASSERT(!nonzero, "alloc %zu is zero-filled", bytes);
        for (size_t i = 0; i < bytes; i++) host[i] = (unsigned char)(i * 7 + 1);
        t_be->upload(t_be, p, host, bytes);
        memset(host, 0, bytes);
        t_be->download(t_be, host, p, bytes);
        int bad = 0;
        for (size_t i = 0; i < bytes; i++) bad |= host[i] != (unsigned char)(i * 7 + 1);
        T_ASSERT(!bad, "upload/download %zu bytes", bytes);
        t_be->zero(t_be, p, bytes);
        t_be->synchronize(t_be);
        for (size_t i = 0; i < bytes; i++) nonzero |= p[i];
        T_ASSERT(!nonzero, "zero %zu bytes", bytes);
        t_be->free(t_be, p);
        free(host);
    }
}

int main(void) {
    t_backend_init("backend_optim");
    test_adamw(0.0f, 1.0f);
    test_adamw(0.1f, 0.5f);
    test_sumsq(1);
    test_sumsq(1000);
    test_sumsq(300001);
    test_setup();
    loom_backend_destroy(t_be);
    return t_done("backend_optim");
}
