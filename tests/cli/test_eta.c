// The ETA of `loom train` (src/cli/eta.h) on random step and validation times: the first step
// (warm-up) is left out of the rate once a second is timed, validations are counted apart at
// their own mean, and the count of validations left matches a loop that simulates the run.
#include "cli/eta.h"
#include "harness.h"

// Validations still to come in `loom train`'s loop after `done` of `steps` steps.
static int64_t simulate(int64_t done, int64_t steps, int val_every) {
    int64_t n = 1; // the one at the end
    for (int64_t s = done; s < steps; s++) n += val_every && s % val_every == 0;
    return n;
}

int main(void) {
    t_seed();
    for (int trial = 0; trial < 200; trial++) {
        cli_eta e = {0};
        T_ASSERT(cli_eta_seconds(&e, 10, 3) == 0, "nothing timed yet");
        double warm = 1 + 10 * t_uniform(0, 1), sum = 0, vsum = 0;
        int n = 2 + (int)(t_uniform(0, 1) * 20), nv = 1 + (int)(t_uniform(0, 1) * 4);
        cli_eta_step(&e, warm);
        T_ASSERT(fabs(cli_eta_seconds(&e, 7, 0) - 7 * warm) < 1e-9, "one step: its own time");
        for (int v = 0; v < nv; v++) {
            double t = 5 * t_uniform(0, 1);
            vsum += t;
            cli_eta_validation(&e, t);
        }
        for (int i = 1; i < n; i++) {
            double t = 0.1 + t_uniform(0, 1);
            sum += t;
            cli_eta_step(&e, t);
        }
        int64_t left = (int64_t)(t_uniform(0, 1) * 1000), vleft = (int64_t)(t_uniform(0, 1) * 10);
        double want = sum / (n - 1) * (double)left + vsum / nv * (double)vleft;
        double got = cli_eta_seconds(&e, left, vleft);
        T_ASSERT(fabs(got - want) <= 1e-9 * (1 + want), "trial %d: eta %.9g, want %.9g (warm-up %.3g excluded)", trial,
                 got, want, warm);
    }
    for (int trial = 0; trial < 500; trial++) {
        int64_t steps = 1 + (int64_t)(t_uniform(0, 1) * 300), done = (int64_t)(t_uniform(0, 1) * (double)(steps + 1));
        int every = (int)(t_uniform(0, 1) * 60);
        T_ASSERT(cli_eta_validations_left(done, steps, every, 1) == simulate(done, steps, every),
                 "done %lld of %lld, every %d: %lld validations left, the loop makes %lld", (long long)done,
                 (long long)steps, every, (long long)cli_eta_validations_left(done, steps, every, 1),
                 (long long)simulate(done, steps, every));
        T_ASSERT(cli_eta_validations_left(done, steps, every, 0) == 0, "no validation data");
    }
    return t_done("cli_eta");
}
