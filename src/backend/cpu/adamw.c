// AdamW (Loshchilov & Hutter, ICLR'19) on one contiguous range, the update of
// torch.optim.AdamW (backend.h gives the formula): bias corrections 1 - beta^t, eps added to
// sqrt(v_hat), decoupled weight decay lr * wd * p. fp32 parameters, so no master copy. And the
// per-step scalars a recorded update reads (step_scalars: the clipping factor and the skip flag),
// in host memory here.
#include "backend/cpu/cpu_ops.h"

#include <math.h>

void cpu_adamw_update(loom_backend *be, loom_tensor param, loom_tensor master, loom_tensor grad,
                      loom_tensor m, loom_tensor v, loom_adamw_args args) {
    float *p = cpu_f32(param), *mp = cpu_f32(m), *vp = cpu_f32(v); // (n) each
    const float *g = cpu_f32(grad); // (n)
    int64_t n = loom_numel(&param);
    const loom_step_scalars *s = args.scalars;
    LOOM_CHECK(master.data == NULL && !args.master_low && (s || args.t >= 1));
    LOOM_CHECK(loom_numel(&grad) == n && loom_numel(&m) == n && loom_numel(&v) == n);
    if (s && s->skip) return;
    float b1 = args.beta1, b2 = args.beta2, wd = args.weight_decay, eps = args.eps;
    float lr = s ? s->lr : args.lr, gs = s ? s->grad_scale : args.grad_scale;
    float bc1 = s ? s->bc1 : loom_adamw_bias(b1, args.t), bc2 = s ? s->bc2 : loom_adamw_bias(b2, args.t);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        float mi = b1 * mp[i] + (1.0f - b1) * gi, vi = b2 * vp[i] + (1.0f - b2) * gi * gi;
        mp[i] = mi;
        vp[i] = vi;
        p[i] -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i]);
    }
}

void cpu_step_scalars(loom_backend *be, loom_step_scalars *sc, loom_tensor losses, float max_norm) {
    const float *l = cpu_f32(losses);
    int64_t n = loom_numel(&losses);
    double norm = sqrt(sc->sumsq);
    bool finite = isfinite(norm);
    for (int64_t i = 0; i < n && finite; i++) finite = isfinite(l[i]);
    sc->skip = !finite;
    sc->grad_scale = loom_clip_scale(norm, max_norm);
}
