#include "backend/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

loom_status loom_backend_create(loom_backend **out, const char *device, loom_dtype dtype) {
    *out = NULL;
    if (strcmp(device, "cpu") == 0) return loom_backend_cpu_create(out, dtype);
    if (strncmp(device, "cuda", 4) == 0 && (device[4] == '\0' || device[4] == ':')) {
        char *end = NULL;
        long index = device[4] == ':' ? strtol(device + 5, &end, 10) : -1;
        if (device[4] == ':' && (end == device + 5 || *end || index < 0))
            return loom_fail(LOOM_EINVAL, "e.g. --device cuda or cuda:1", "bad device '%s'", device);
#ifdef LOOM_HAVE_CUDA
        return loom_backend_cuda_create(out, dtype, (int)index);
#else
        return loom_fail(LOOM_EUNSUPPORTED, "build on a machine with nvcc, or use --device cpu",
                         "device 'cuda' is not available in this build");
#endif
    }
    return loom_fail(LOOM_EINVAL, "devices are: cpu, cuda", "unknown device '%s'", device);
}

void loom_backend_destroy(loom_backend *be) {
    if (be) be->destroy(be);
}

int loom_backend_device_count(const char *device) {
#ifdef LOOM_HAVE_CUDA
    if (strncmp(device, "cuda", 4) == 0) return loom_backend_cuda_device_count();
#endif
    return 0;
}

const char *loom_backend_precision(const loom_backend *be) {
    return be->fp8 ? "fp8" : loom_dtype_name(be->dtype);
}

static loom_status open_one(loom_backend **out, const char *device, const char *precision, int local_rank) {
    bool gpu = strncmp(device, "cuda", 4) == 0, fp8 = strcmp(precision, "fp8") == 0;
    loom_dtype dt;
    if (strcmp(precision, "fp32") == 0) dt = LOOM_F32;
    else if (strcmp(precision, "bf16") == 0 || fp8) dt = LOOM_BF16;
    else if (strcmp(precision, "auto") == 0) dt = gpu ? LOOM_BF16 : LOOM_F32;
    else return loom_fail(LOOM_EINVAL, "precisions are: auto, fp32, bf16, fp8", "unknown precision '%s'", precision);
    if (fp8 && !gpu)
        return loom_fail(LOOM_EUNSUPPORTED, "use --precision fp8 on a GPU (--device cuda), or fp32 on the cpu",
                         "precision fp8 needs a GPU: the %s backend has no FP8 products", device);
    char name[32];
    int gpus = loom_backend_device_count(device);
    if (strcmp(device, "cuda") == 0 && gpus > 0) snprintf(name, sizeof name, "cuda:%d", local_rank % gpus);
    else snprintf(name, sizeof name, "%s", device);
    LOOM_TRY(loom_backend_create(out, name, dt));
    (*out)->fp8 = fp8;
    return LOOM_OK;
}

loom_status loom_backend_open(loom_backend **out, const char *device, const char *precision, int local_rank) {
    if (strcmp(device, "auto") != 0) return open_one(out, device, precision, local_rank);
    loom_status s = open_one(out, "cuda", precision, local_rank);
    if (s != LOOM_EUNSUPPORTED) return s;
    loom_error_clear(); // no usable GPU here: the CPU
    return open_one(out, "cpu", precision, local_rank);
}

void loom_host_memory_info(size_t *available, size_t *total) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    *available = (size_t)sysconf(_SC_AVPHYS_PAGES) * page;
    *total = (size_t)sysconf(_SC_PHYS_PAGES) * page;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[128];
    unsigned long long kib;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) *available = (size_t)kib * 1024;
    fclose(f);
}

void loom_matmul_residual_forward_ops(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w,
                                      loom_tensor bias, loom_tensor res) {
    LOOM_CHECK(res.data && res.data != out.data);
    be->matmul_forward(be, out, inp, w, bias);
    be->residual_forward(be, out, res, out);
}

void loom_mlp_forward_ops(loom_backend *be, loom_tensor out, loom_tensor pre, loom_tensor act, bool act_kept,
                          loom_tensor inp, loom_tensor fcw, loom_tensor fcb, loom_tensor projw, loom_tensor projb,
                          loom_tensor res) {
    (void)act_kept; // written either way
    int site = be->fp8_site;
    be->fp8_site = be->fp8_site_fc;
    be->matmul_gelu_forward(be, act, pre, inp, fcw, fcb);
    be->fp8_site = site;
    if (res.data) be->matmul_residual_forward(be, out, act, projw, projb, res);
    else be->matmul_forward(be, out, act, projw, projb);
}

void loom_mlp_backward_ops(loom_backend *be, loom_tensor dinp, loom_tensor dfch, loom_tensor dfcw, loom_tensor dfcb,
                           loom_tensor dprojw, loom_tensor dprojb, loom_tensor dout, loom_tensor inp, loom_tensor fcw,
                           loom_tensor pre, loom_tensor act, bool act_kept, loom_tensor projw) {
    LOOM_CHECK(!dfcw.data == !dprojw.data);
    int site = be->fp8_site;
    if (!act_kept && dprojw.data) be->gelu_forward(be, act, pre);
    be->matmul_gelu_backward(be, dfch, dprojw, dprojb, dout, act, projw, pre);
    be->fp8_site = be->fp8_site_fc;
    be->matmul_backward(be, dinp, dfcw, dfcb, dfch, inp, fcw);
    be->fp8_site = site;
}
