// The CPU kernels' expf and tanhf (backend/cpu/cpu_math.h) on every kind of input, built under
// UndefinedBehaviorSanitizer (tests.cmake): NaN and infinities, which reach them from a diverged
// model, must give NaN and the saturated values without undefined behaviour (a NaN once reached
// a float-to-int conversion and a left shift of a negative value); finite inputs must match libm
// within 2 ulp (clamped to [-87.3, 88.3]).
#include "harness.h"

#include "backend/cpu/cpu_math.h"

#include <float.h>

static float clamp(float x) { return x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x; }

static void check_exp(float x) {
    float got = cpu_expf(x), want = expf(clamp(x));
    T_ASSERT(fabsf(got - want) <= 2 * FLT_EPSILON * want, "cpu_expf(%g) = %.9g, libm %.9g", (double)x, (double)got,
             (double)want);
}

int main(void) {
    t_seed();
    T_ASSERT(isnan(cpu_expf(NAN)) && isnan(cpu_expf(-NAN)), "cpu_expf(NaN) = %g", (double)cpu_expf(NAN));
    T_ASSERT(isnan(cpu_tanhf(NAN)), "cpu_tanhf(NaN) = %g", (double)cpu_tanhf(NAN));
    T_ASSERT(cpu_tanhf(INFINITY) == 1.0f && cpu_tanhf(-INFINITY) == -1.0f, "tanh(+-inf) = %g, %g",
             (double)cpu_tanhf(INFINITY), (double)cpu_tanhf(-INFINITY));
    const float special[] = {INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 1e30f, -1e30f, 88.3f, -87.3f, 89.0f, -88.0f,
                             0.0f, -0.0f, FLT_TRUE_MIN, -FLT_MIN, 1.0f, -1.0f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) check_exp(special[i]);
    for (int i = 0; i < 100000; i++) check_exp(t_uniform(-100.0f, 100.0f));
    for (int i = 0; i < 1000; i++) { // random bit patterns: NaNs with payloads, infinities, denormals
        uint32_t bits = (uint32_t)t_next();
        float x;
        memcpy(&x, &bits, sizeof x);
        if (isnan(x)) T_ASSERT(isnan(cpu_expf(x)) && isnan(cpu_tanhf(x)), "NaN bits %08x", bits);
        else check_exp(x);
    }
    return t_done("cpu_math");
}
