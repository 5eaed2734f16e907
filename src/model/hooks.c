#include "model/hooks.h"

#include "core/status.h"

void loom_hooks_add(loom_hooks *h, loom_hook_kind kind, loom_hook_fn fn, void *ctx) {
    LOOM_CHECK(h->n[kind] < LOOM_MAX_HOOKS);
    h->at[kind][h->n[kind]].fn = fn;
    h->at[kind][h->n[kind]].ctx = ctx;
    h->n[kind]++;
}

void loom_hooks_run(const loom_hooks *h, loom_hook_kind kind, int layer) {
    for (int i = 0; i < h->n[kind]; i++) h->at[kind][i].fn(h->at[kind][i].ctx, layer);
}
