#include "backend/backend.h"

#include <string.h>

loom_status loom_backend_create(loom_backend **out, const char *device, loom_dtype dtype) {
    *out = NULL;
    if (strcmp(device, "cpu") == 0) return loom_backend_cpu_create(out, dtype);
    if (strcmp(device, "cuda") == 0)
        return loom_fail(LOOM_EUNSUPPORTED, "build on a machine with nvcc, or use --device cpu",
                         "device 'cuda' is not available in this build");
    return loom_fail(LOOM_EINVAL, "devices are: cpu, cuda", "unknown device '%s'", device);
}

void loom_backend_destroy(loom_backend *be) {
    if (be) be->destroy(be);
}
