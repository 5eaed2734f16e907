// Time left in a training run, from the steps and validations timed so far. The first step
// warms up (allocations, caches, kernel and algorithm selection) and is left out of the step
// rate once a later step is timed. Validation is timed apart from the steps: it does not
// inflate the step rate, and each validation still to come is counted at the mean time of those
// run so far. Samples and checkpoints are not counted.
#pragma once
#include <stdint.h>

typedef struct {
    double first;    // seconds of the first step timed (the warm-up)
    double steps;    // seconds of the steps after it
    int64_t n;       // steps timed, the first included
    double val;      // seconds of the validations timed
    int64_t nval;    // validations timed
} cli_eta;

// Records one training step of `seconds`.
void cli_eta_step(cli_eta *e, double seconds);
// Records one validation of `seconds`.
void cli_eta_validation(cli_eta *e, double seconds);
// Seconds left for `steps_left` steps (at the mean of the steps after the first; the first's
// time while it is the only one) and `validations_left` validations (at their mean; 0 while
// none was timed). 0 when nothing was timed.
double cli_eta_seconds(const cli_eta *e, int64_t steps_left, int64_t validations_left);
// Validations a run still makes once `done` of its `steps` steps are done: one before each step
// whose count of steps done is a multiple of `val_every` (0: none), and one at the end. 0
// without validation data (has_val false).
int64_t cli_eta_validations_left(int64_t done, int64_t steps, int val_every, int has_val);
