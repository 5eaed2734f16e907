#include "cli/eta.h"

void cli_eta_step(cli_eta *e, double seconds) {
    if (e->n++ == 0) e->first = seconds;
    else e->steps += seconds;
}

void cli_eta_validation(cli_eta *e, double seconds) {
    e->val += seconds;
    e->nval++;
}

double cli_eta_seconds(const cli_eta *e, int64_t steps_left, int64_t validations_left) {
    double per_step = e->n > 1 ? e->steps / (double)(e->n - 1) : e->first; // 0 before any step
    double per_val = e->nval ? e->val / (double)e->nval : 0;
    return per_step * (double)steps_left + per_val * (double)validations_left;
}

int64_t cli_eta_validations_left(int64_t done, int64_t steps, int val_every, int has_val) {
    if (!has_val) return 0;
    // the loop validates before running step s + 1 when s % val_every == 0, for s in [done, steps):
    // the multiples of val_every there; then once at the end
    if (val_every <= 0 || done >= steps) return 1;
    return (steps - 1) / val_every - (done + val_every - 1) / val_every + 1 + 1;
}
