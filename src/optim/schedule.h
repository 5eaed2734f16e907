// Learning-rate schedules: linear warmup from lr/warmup to lr over `warmup` steps, then cosine
// decay to `min_lr` at step `total` (Loshchilov & Hutter 2017, SGDR; as llm.c and nanoGPT
// configure it), or constant after warmup.
#pragma once
#include "core/status.h"

#include <stdint.h>

typedef enum { LOOM_LR_COSINE, LOOM_LR_CONSTANT } loom_lr_kind;

typedef struct {
    loom_lr_kind kind;
    float max_lr, min_lr;
    int64_t warmup; // steps of linear warmup (0: none)
    int64_t total;  // steps of the whole run (cosine reaches min_lr here)
} loom_lr_schedule;

// Learning rate for 0-based optimizer step `step`.
float loom_lr_at(const loom_lr_schedule *s, int64_t step);
// "cosine" or "constant". Errors: LOOM_EINVAL naming the unknown schedule.
loom_status loom_lr_kind_parse(const char *name, loom_lr_kind *kind);
const char *loom_lr_kind_name(loom_lr_kind kind);
