// The memory plan of a run, computed before anything is allocated from the same sizing code the
// allocations use (the model's activation layout, data parallelism's buckets, ZeRO 3's unit
// reservation, the optimizer's state), and the refusal of a run that will not fit (trainer.h).
#include "core/log.h"
#include "train/trainer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// bytes as "12.3 GiB" or "45.6 MiB" in one of the buffers of `text` (NBUF calls per message)
enum { NBUF = 8 };
typedef struct {
    char buf[NBUF][16];
    int next;
} text;
static const char *human(text *t, size_t bytes) {
    char *b = t->buf[t->next++ % NBUF];
    loom_format_bytes(b, sizeof t->buf[0], (double)bytes, 1);
    return b;
}

// The plan of config c on t's mesh with ZeRO over W ranks (t's schedule and pipeline rank).
static loom_status plan_of(const loom_trainer *t, const loom_gpt2_config *cfg, const loom_train_config *c, int W,
                           loom_train_memory *out) {
    loom_backend *be = t->be;
    loom_gpt2_layout layout = {loom_train_stage_of(t, cfg, t->pp_rank), t->mesh->coord[LOOM_AXIS_TP], c->tp, c->sp,
                               true}; // external parameters: the probe allocates none
    loom_gpt2 *m;
    LOOM_TRY(loom_gpt2_create_layout(&m, be, cfg, &layout));
    m->recompute = c->recompute;
    m->offload_activations = c->offload_activations;
    m->slots = t->schedule ? t->schedule->promised[t->pp_rank] : 1;
    m->split_backward = loom_train_splits_backward(t->schedule, t->pp_rank);
    size_t host_acts, acts = loom_gpt2_activation_bytes(m, c->batch, loom_train_seq_rows(t), true, &host_acts);
    loom_cp_style style = LOOM_CP_RING;
    loom_status s = c->cp_style ? loom_cp_style_parse(c->cp_style, &style) : LOOM_OK;
    if (s == LOOM_OK && c->cp > 1) // its travelling keys and values (ring) or all-to-all buffers (Ulysses)
        acts += loom_cp_plan_bytes(style, c->cp, c->batch, t->st.seq_len, cfg->channels / c->tp, m->NH, be->dtype);
    size_t es = loom_dtype_size(be->dtype), dp_bytes;
    int64_t state_n;
    bool replicas = loom_mesh_size(t->mesh, LOOM_GROUP_REPLICATE) > 1;
    if (s == LOOM_OK) s = loom_dp_plan(&m->table, W, replicas, be->dtype, c->zero, c->bucket_mb, &dp_bytes, &state_n);
    if (s == LOOM_OK) {
        loom_train_parts parts = {.params = (size_t)m->num_elements * es,
                                  .dp = dp_bytes,
                                  .state = loom_adamw_state_bytes(state_n, be->dtype, loom_train_adamw_offload(c),
                                                                  c->adamw.stochastic_rounding),
                                  .shard = c->zero == 3 ? (size_t)state_n * es : 0, // the state's layout
                                  .units = c->zero == 3 ? loom_fsdp_plan_units(&m->table, cfg->num_layers, W, be->dtype) : 0,
                                  .activations = acts,
                                  .activations_host = host_acts};
        *out = loom_train_memory_of(c, &parts);
    }
    loom_gpt2_free(m);
    return s;
}

loom_train_memory loom_train_memory_of(const loom_train_config *c, const loom_train_parts *p) {
    loom_train_memory m = {.params_grads = 2 * p->params + p->dp, // the model's parameters and gradients
                           .activations = p->activations,
                           .optimizer = c->offload_optimizer ? 0 : p->state,
                           .offloaded = p->activations_host + (c->offload_optimizer ? p->state : 0)};
    if (c->zero == 3) { // the parameter shard and the unit buffers instead of the model's
        m.params_grads = (c->offload_params ? 0 : p->shard) + p->units + p->dp;
        if (c->offload_params) m.offloaded += p->shard;
    }
    return m;
}

loom_status loom_trainer_plan(const loom_trainer *t, loom_train_memory *plan) {
    return plan_of(t, &t->model->cfg, &t->cfg, loom_mesh_size(t->mesh, LOOM_GROUP_SHARD), plan);
}

// What a plan takes of the backend's memory and of the host's (on the CPU backend both are the
// host's: everything counts there).
static void demand(const loom_trainer *t, const loom_train_memory *p, size_t *device, size_t *host) {
    bool cpu = strcmp(t->be->name, "cpu") == 0;
    *device = p->params_grads + p->activations + p->optimizer + (cpu ? p->offloaded : 0);
    *host = cpu ? 0 : p->offloaded;
}

// Ranks whose allocations come out of this rank's device memory (the host's ranks on the CPU).
static int sharing(const loom_trainer *t) {
    int local = loom_comm_local_size(t->world), gpus = loom_backend_device_count(t->be->name);
    return gpus > 0 ? (local + gpus - 1) / gpus : local;
}

// Whether the plan fits: the ranks sharing a device each need *device, the host's ranks *host.
static bool fits(const loom_trainer *t, const loom_train_memory *p, size_t free_dev, size_t free_host) {
    size_t device, host;
    demand(t, p, &device, &host);
    return device * (size_t)sharing(t) <= free_dev && host * (size_t)loom_comm_local_size(t->world) <= free_host;
}

typedef struct {
    const char *flags; // what the user would change
    loom_train_config c;
    int W;             // ranks ZeRO shards over
} alternative;

// Appends c changed as `flags` say (the caller changes the returned copy) over W ranks.
static loom_train_config *alternative_add(alternative *alt, int *n, const char *flags, const loom_train_config *c, int W) {
    alt[*n] = (alternative){flags, *c, W};
    return &alt[(*n)++].c;
}

loom_status loom_train_check_memory(const loom_trainer *t, const loom_gpt2_config *cfg) {
    const loom_train_config *c = &t->cfg;
    int W = loom_mesh_size(t->mesh, LOOM_GROUP_SHARD);
    loom_train_memory p;
    LOOM_TRY(plan_of(t, cfg, c, W, &p));
    size_t free_dev, total, free_host, host_total;
    t->be->memory_info(t->be, &free_dev, &total);
    loom_host_memory_info(&free_host, &host_total);
    const char *limit = getenv("LOOM_DEVICE_MEMORY_GIB"); // plan for a device of this size
    if (limit && atof(limit) > 0) free_dev = (size_t)(atof(limit) * 1024 * 1024 * 1024);
    if (fits(t, &p, free_dev, free_host)) return LOOM_OK;
    // the changes that would make it fit, each alone
    alternative alt[5];
    int n = 0;
    if (c->zero < 3 && W > 1) alternative_add(alt, &n, "--zero 3", c, W)->zero = 3;
    if (!c->offload_optimizer) alternative_add(alt, &n, "--offload optimizer", c, W)->offload_optimizer = true;
    if (c->recompute != LOOM_RECOMPUTE_FULL)
        alternative_add(alt, &n, "--recompute full", c, W)->recompute = LOOM_RECOMPUTE_FULL;
    if (!c->offload_params) {
        loom_train_config *a = alternative_add(alt, &n, "--zero 3 --offload optimizer,params,activations", c, W);
        a->zero = 3, a->offload_optimizer = a->offload_params = a->offload_activations = true;
    }
    alternative_add(alt, &n, "twice the ranks", c, 2 * W);
    char hint[512] = "";
    size_t used = 0;
    text x = {0};
    for (int i = 0; i < n; i++) {
        loom_train_memory q;
        if (plan_of(t, cfg, &alt[i].c, alt[i].W, &q) != LOOM_OK || !fits(t, &q, free_dev, free_host)) continue;
        size_t device, host;
        demand(t, &q, &device, &host);
        used += (size_t)snprintf(hint + used, sizeof hint - used, "%s%s (%s)", used ? ", " : "would fit: ",
                                 alt[i].flags, human(&x, device));
        if (used >= sizeof hint) break;
    }
    if (!used) snprintf(hint, sizeof hint, "lower --batch or --seq, or use a smaller model: none of --zero 3, "
                                           "--offload, --recompute full or twice the ranks fits alone");
    size_t device, host;
    demand(t, &p, &device, &host);
    char shared[48] = "";
    if (sharing(t) > 1) snprintf(shared, sizeof shared, ", %d ranks sharing it", sharing(t));
    if (strcmp(t->be->name, "cpu") == 0)
        return loom_fail(LOOM_ENOMEM, hint,
                         "this run needs about %s of memory per rank (%s params+grads, %s activations, %s AdamW, "
                         "%s offloaded)%s; %s is free", human(&x, device), human(&x, p.params_grads),
                         human(&x, p.activations), human(&x, p.optimizer), human(&x, p.offloaded), shared,
                         human(&x, free_dev));
    return loom_fail(LOOM_ENOMEM, hint,
                     "this run needs about %s per rank on the %s device (%s params+grads, %s activations, %s AdamW)%s "
                     "and %s of host memory; %s of the device and %s of host memory are free", human(&x, device),
                     t->be->name, human(&x, p.params_grads), human(&x, p.activations), human(&x, p.optimizer), shared,
                     human(&x, host), human(&x, free_dev), human(&x, free_host));
}
