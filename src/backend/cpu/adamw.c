// AdamW (Loshchilov & Hutter, ICLR'19) on one contiguous range, the update of
// torch.optim.AdamW (backend.h gives the formula): bias corrections 1 - beta^t, eps added to
// sqrt(v_hat), decoupled weight decay lr * wd * p. fp32 parameters, so no master copy.
#include "backend/cpu/cpu_ops.h"

#include <math.h>

void cpu_adamw_update(loom_backend *be, loom_tensor param, loom_tensor master, loom_tensor grad,
                      loom_tensor m, loom_tensor v, loom_adamw_args args) {
    float *p = cpu_f32(param), *mp = cpu_f32(m), *vp = cpu_f32(v); // (n) each
    const float *g = cpu_f32(grad); // (n)
    int64_t n = loom_numel(&param);
    LOOM_CHECK(master.data == NULL && args.t >= 1);
    LOOM_CHECK(loom_numel(&grad) == n && loom_numel(&m) == n && loom_numel(&v) == n);
    float b1 = args.beta1, b2 = args.beta2, lr = args.lr, wd = args.weight_decay;
    float gs = args.grad_scale, eps = args.eps;
    float bc1 = (float)(1.0 - pow(b1, (double)args.t)),
          bc2 = (float)(1.0 - pow(b2, (double)args.t));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        float mi = b1 * mp[i] + (1.0f - b1) * gi, vi = b2 * vp[i] + (1.0f - b2) * gi * gi;
        mp[i] = mi;
        vp[i] = vi;
        p[i] -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i]);
    }
}
