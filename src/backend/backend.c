#include "backend/backend.h"

#include <stdlib.h>
#include <string.h>

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
