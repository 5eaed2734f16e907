// The --metrics file of `loom train`: JSON Lines, one record a line.
//   {"config": {...}}                 first line of a run (and of each resumed part): the model,
//                                     mesh, batch, precision, loom's version and commit
//   {"step": S, "loss": ..., "lr": ..., "grad_norm": ..., "step_time_s": ..., "tokens_per_s": ...
//    [, "mfu": ...]}                  after optimizer step S (mfu: a fraction, when a peak is known)
//   {"step": S, "val_loss": ...}      validation after S steps
// A fresh run replaces the file. A resumed run appends, after cutting off the records that the
// interrupted run wrote after the step it resumes from (they are written again).
#pragma once
#include "cli/train_options.h"
#include "core/status.h"

#include <cjson/cJSON.h>
#include <stdint.h>

typedef struct cli_metrics cli_metrics;

// Opens `path` for a run that starts after `resume_step` steps (0: a fresh run, which replaces
// the file). Resuming from step S keeps the file up to its record of step S and appends; a file
// without that record (or not a regular file) is appended to whole. Prints a note saying which
// it did. Errors: LOOM_EIO naming the path (folder missing, not writable).
loom_status cli_metrics_open(cli_metrics **out, const char *path, int64_t resume_step);
// Appends one record (not owned) as a line and flushes. Errors: LOOM_EIO (disk full, ...).
loom_status cli_metrics_write(cli_metrics *m, const cJSON *record);
// Appends {"step": keys...}: n numbers under their keys. Errors: as cli_metrics_write.
loom_status cli_metrics_numbers(cli_metrics *m, const char *const *keys, const double *vals, int n);
// Closes the file (NULL: nothing). Errors: LOOM_EIO when the last writes fail at close.
loom_status cli_metrics_close(cli_metrics *m);

// Appends the run's configuration record: {"config": {"loom", "commit", "model", "L", "NH", "C",
// "maxT", "V", "params", "mesh", "tp", "pp", "cp", "dp", "zero", "micro_batch", "seq",
// "global_batch", "grad_accum", "device", "precision", "threads", "steps", "lr", "min_lr",
// "warmup", "schedule", "seed", "train_data", "from_step"}} (from_step: the step it resumes
// from, 0 for a fresh run). Errors: as cli_metrics_write.
loom_status cli_metrics_config(cli_metrics *m, const train_options *o, const loom_trainer *t);
