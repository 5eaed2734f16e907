#include "optim/schedule.h"

#include <math.h>
#include <string.h>

float loom_lr_at(const loom_lr_schedule *s, int64_t step) {
    if (step < s->warmup) return s->max_lr * (float)(step + 1) / (float)s->warmup;
    if (s->kind == LOOM_LR_CONSTANT || s->total <= s->warmup) return s->max_lr;
    double ratio = (double)(step - s->warmup) / (double)(s->total - s->warmup);
    if (ratio > 1.0) ratio = 1.0;
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio)); // 1 -> 0
    return (float)(s->min_lr + coeff * (s->max_lr - s->min_lr));
}

loom_status loom_lr_kind_parse(const char *name, loom_lr_kind *kind) {
    if (strcmp(name, "cosine") == 0) *kind = LOOM_LR_COSINE;
    else if (strcmp(name, "constant") == 0) *kind = LOOM_LR_CONSTANT;
    else return loom_fail(LOOM_EINVAL, "schedules are: cosine, constant", "unknown LR schedule '%s'", name);
    return LOOM_OK;
}

const char *loom_lr_kind_name(loom_lr_kind kind) {
    return kind == LOOM_LR_COSINE ? "cosine" : "constant";
}
