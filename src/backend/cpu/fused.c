// The fused ops of backend.h on the CPU: the plain ops in sequence. The CPU gains little from
// fusing (its passes run from cache), and these definitions are the reference the GPU's single-
// pass versions are tested against.
#include "backend/cpu/cpu_ops.h"

void cpu_matmul_gelu_forward(loom_backend *be, loom_tensor out, loom_tensor pre, loom_tensor inp,
                             loom_tensor w, loom_tensor bias) {
    cpu_matmul_forward(be, pre, inp, w, bias);
    cpu_gelu_forward(be, out, pre);
}

void cpu_matmul_gelu_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor dbias,
                              loom_tensor dout, loom_tensor inp, loom_tensor w, loom_tensor pre) {
    cpu_matmul_backward(be, dinp, dw, dbias, dout, inp, w);
    cpu_gelu_backward(be, dinp, pre, dinp);
}

void cpu_residual_layernorm_forward(loom_backend *be, loom_tensor res, loom_tensor out,
                                    loom_tensor mean, loom_tensor rstd, loom_tensor a, loom_tensor b,
                                    loom_tensor w, loom_tensor bias) {
    cpu_residual_forward(be, res, a, b);
    cpu_layernorm_forward(be, out, mean, rstd, res, w, bias);
}
