// A trainer's construction: mesh, backend, model shard, tensor and data parallelism, optimizer,
// fresh or resumed; see trainer.h. Each phase that can fail on some ranks only ends with an
// agreement, so no rank enters a collective another has left.
#include "train/trainer_internal.h"

#include "ckpt/llmc_model.h"
#include "core/log.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define AGREE(expr)                                           \
    do {                                                      \
        loom_status agree_s_ = loom_comm_agree(t->world, (expr), report); \
        if (agree_s_ != LOOM_OK) return agree_s_;             \
    } while (0)

// The checkpoint's sequence length, micro-batch and global batch must be this run's; its layout
// may differ (ranks, tp, pp, cp, sp, ZeRO stage, replicas, buckets: load_state reshards its
// optimizer state). Errors: LOOM_EINVAL naming both.
static loom_status check_layout(const loom_trainer *t, int64_t step) {
    const loom_train_state *st = &t->st;
    const loom_train_config *c = &t->cfg;
    int64_t global = (int64_t)st->micro_batch * st->grad_accum * (st->world_size / (st->tp * st->pp * st->cp));
    if (st->micro_batch != c->batch || global != c->global_batch || (c->seq && c->seq != st->seq_len))
        return loom_fail(LOOM_EINVAL, "resume with the checkpoint's --batch, --seq and --global-batch (the ranks and "
                         "the layout may differ)",
                         "checkpoint step %lld was trained with B=%d T=%d and a global batch of %lld sequences, not "
                         "B=%d T=%d and %d", (long long)step, st->micro_batch, st->seq_len, (long long)global,
                         c->batch, c->seq ? c->seq : st->seq_len, c->global_batch);
    return LOOM_OK;
}

// Where the run starts: the whole model in the file's order (*file; NULL: initialise from the
// seed) and its architecture; on resume also t->st.
static loom_status read_start(loom_trainer *t, loom_gpt2_config *cfg, float **file, int64_t *resumed) {
    const loom_train_config *c = &t->cfg;
    int64_t n;
    *file = NULL;
    *resumed = -1;
    *cfg = c->model;
    if (c->resume) LOOM_TRY(loom_ckpt_latest(c->resume, resumed));
    if (*resumed >= 0) {
        LOOM_TRY(loom_ckpt_load_meta(c->resume, *resumed, &t->st));
        LOOM_TRY(check_layout(t, *resumed));
        return loom_ckpt_load_model(c->resume, &t->st, cfg, file, &n);
    }
    if (c->init) LOOM_TRY(loom_llmc_read(c->init, cfg, file, &n));
    t->st = (loom_train_state){.seed = c->seed, .micro_batch = c->batch,
                               .seq_len = c->seq ? c->seq : cfg->max_seq_len, .grad_accum = t->grad_accum};
    return LOOM_OK;
}

// The pipeline schedule (pp > 1). Errors: those of loom_pp_schedule_make; LOOM_EINVAL when the
// blocks do not split into the stages.
static loom_status make_schedule(loom_trainer *t, const loom_gpt2_config *cfg) {
    const loom_train_config *c = &t->cfg;
    if (c->pp == 1) {
        if (c->virtual_stages > 1)
            return loom_fail(LOOM_EINVAL, "add --pp 2 or more", "--virtual-stages %d needs a pipeline", c->virtual_stages);
        return LOOM_OK;
    }
    loom_pp_kind kind;
    LOOM_TRY(loom_pp_kind_parse(c->pp_schedule ? c->pp_schedule : "1f1b", &kind));
    LOOM_TRY(loom_pp_schedule_make(&t->schedule, kind, c->pp, t->grad_accum, c->virtual_stages));
    int S = t->schedule->S, V = t->schedule->V, L = cfg->num_layers;
    if (V > LOOM_MAX_CHUNKS)
        return loom_fail(LOOM_EINVAL, "use --virtual-stages 8 or fewer", "--virtual-stages %d exceeds %d", V, LOOM_MAX_CHUNKS);
    if (L % S != 0)
        return loom_fail(LOOM_EINVAL, "use a --pp (times --virtual-stages) that divides the layers",
                         "the model's %d layers do not split into --pp %d x %d stages per rank = %d equal stages", L,
                         c->pp, V, S);
    return LOOM_OK;
}

loom_stage loom_train_stage_at(const loom_gpt2_config *cfg, int pp, int V, bool v_shape, int pp_rank) {
    int stages[LOOM_MAX_CHUNKS], S = pp * V, per = cfg->num_layers / S;
    loom_pp_placement(pp, V, v_shape, pp_rank, stages);
    loom_stage stage = {.num_chunks = V, .embed = stages[0] == 0, .head = stages[V - 1] == S - 1};
    for (int i = 0; i < V; i++) stage.chunk[i] = (loom_chunk){stages[i] * per, per};
    return stage;
}

loom_stage loom_train_stage_of(const loom_trainer *t, const loom_gpt2_config *cfg, int pp_rank) {
    const loom_pp_schedule *s = t->schedule;
    return s ? loom_train_stage_at(cfg, s->pp, s->V, s->v_shape, pp_rank) : loom_gpt2_whole(cfg);
}

bool loom_train_splits_backward(const loom_pp_schedule *s, int rank) {
    for (int i = 0; s && i < s->count[rank]; i++)
        if (s->actions[rank][i].op == LOOM_PP_I) return true;
    return false;
}

// The model's initial parameters: from the file's whole model, or initialised from the seed. ZeRO
// 3 keeps this rank's pieces only.
static void set_params(loom_trainer *t, const float *file) {
    loom_gpt2 *m = t->model;
    if (!t->fsdp) {
        if (file) loom_gpt2_set_params(m, file);
        else loom_gpt2_init(m, t->cfg.seed);
        return;
    }
    float *flat = loom_xmalloc((size_t)m->num_elements * sizeof(float));
    if (file) loom_param_table_copy(&m->table, m->table.tp_rank, flat, (float *)file, false);
    else loom_param_table_init(&m->table, t->cfg.seed, flat);
    loom_fsdp_set_params(t->fsdp, flat);
    free(flat);
}

// The model shard, its activations, tensor, pipeline and data parallelism, and the optimizer.
static loom_status build_parallel(loom_trainer *t, const loom_gpt2_config *cfg, const float *file) {
    const loom_train_config *c = &t->cfg;
    loom_mesh *mesh = t->mesh;
    loom_gpt2_layout layout = {loom_train_stage_of(t, cfg, t->pp_rank), mesh->coord[LOOM_AXIS_TP], c->tp, c->sp,
                               c->zero == 3};
    LOOM_TRY(loom_gpt2_create_layout(&t->model, t->be, cfg, &layout));
    loom_gpt2 *m = t->model;
    m->recompute = c->recompute;
    if (c->logits_chunk > 0) m->logits_chunk = c->logits_chunk;
    m->offload_activations = c->offload_activations;
    m->slots = t->schedule ? t->schedule->promised[t->pp_rank] : 1;
    m->split_backward = loom_train_splits_backward(t->schedule, t->pp_rank);
    if (c->cp > 1) { // before the activations, which then hold T / cp rows per sequence
        loom_cp_style style = LOOM_CP_RING;
        if (c->cp_style) LOOM_TRY(loom_cp_style_parse(c->cp_style, &style));
        LOOM_TRY(loom_cp_create(&t->cp, mesh->dev[LOOM_GROUP_CP], t->be, style, c->batch, t->st.seq_len,
                                cfg->channels / c->tp, m->NH));
        loom_cp_attach(t->cp, &m->cp);
    }
    LOOM_TRY(loom_gpt2_alloc(m, c->batch, loom_train_seq_rows(t), true));
    if (t->schedule) {
        int64_t rows = (int64_t)c->batch * loom_train_seq_rows(t) / m->row_shards;
        LOOM_TRY(loom_pp_create(&t->pipe, t->schedule, t->pp_rank, mesh->dev[LOOM_GROUP_PP], t->be,
                                rows * cfg->channels, loom_train_pipeline_model(t)));
        loom_hooks_add(&m->hooks, LOOM_HOOK_FORWARD, loom_pp_progress, t->pipe);
        loom_hooks_add(&m->hooks, LOOM_HOOK_BACKWARD, loom_pp_progress, t->pipe);
    }
    if (c->tp > 1) {
        LOOM_TRY(loom_tp_create(&t->tp, mesh->dev[LOOM_GROUP_TP], mesh->host[LOOM_GROUP_TP], t->be, c->sp, m->logits_chunk));
        loom_tp_attach(t->tp, &m->tp, &m->hooks, &m->table, m->g);
    }
    LOOM_TRY(loom_dp_create(&t->dp, mesh->dev[LOOM_GROUP_SHARD], mesh->host[LOOM_GROUP_SHARD],
                            mesh->dev[LOOM_GROUP_REPLICATE], t->be, &m->table, c->zero, c->bucket_mb));
    if (c->zero == 3)
        LOOM_TRY(loom_fsdp_create(&t->fsdp, t->dp, mesh->dev[LOOM_GROUP_SHARD], t->be, &m->table, cfg->num_layers, m->p,
                                  m->g, &m->hooks, c->offload_params));
    loom_hooks_add(&m->hooks, LOOM_HOOK_GRADS, loom_dp_grads_ready, t->dp);
    loom_hooks_add(&m->hooks, LOOM_HOOK_FORWARD, loom_dp_params_ready, t->dp);
    set_params(t, file);
    int n;
    const loom_param_slice *slices = loom_dp_slices(t->dp, &n);
    LOOM_TRY(loom_adamw_create(&t->opt, t->be, &m->table, slices, n, loom_dp_state_elements(t->dp), t->fsdp != NULL,
                               loom_train_adamw_offload(c), c->adamw.stochastic_rounding));
    t->inputs = loom_xmalloc((size_t)c->batch * t->st.seq_len * sizeof(int32_t));
    t->targets = loom_xmalloc((size_t)c->batch * t->st.seq_len * sizeof(int32_t));
    return c->cuda_graphs ? loom_step_graph_create(&t->graph, t) : LOOM_OK;
}

void *loom_train_params(const loom_trainer *t, int64_t *n) {
    if (n) *n = t->fsdp ? loom_fsdp_shard_elements(t->fsdp) : t->model->num_elements;
    return t->fsdp ? loom_fsdp_shard(t->fsdp) : t->model->params;
}

static void init_master(loom_trainer *t) {
    int64_t n;
    void *params = loom_train_params(t, &n);
    loom_adamw_init_master(t->opt, params, n);
}

// Resume: this rank's optimizer state from checkpoint `step` (ZeRO 0: replica 0's of its shard),
// and under FP8 delayed scaling its amax histories when the checkpoint has them (a run that
// scales otherwise ignores them).
static loom_status load_state(loom_trainer *t) {
    const loom_train_state *st = &t->st;
    int64_t sn = loom_dp_state_elements(t->dp);
    size_t bytes = (size_t)sn * sizeof(float);
    float *m = loom_xmalloc(bytes), *v = loom_xmalloc(bytes), *master = t->opt->master ? loom_xmalloc(bytes) : NULL;
    bool has_master;
    int file = t->cfg.zero == 0 ? loom_mesh_replica0(t->mesh) : t->mesh->rank;
    float *fp8 = NULL;
    int64_t fp8_n = 0;
    loom_status s = loom_train_reshards(t) ? loom_train_load_resharded(t, m, v, master, &has_master, &fp8, &fp8_n)
                                           : loom_ckpt_load_state(t->cfg.resume, st, file, m, v, master, &has_master,
                                                                  sn, &fp8, &fp8_n);
    if (s == LOOM_OK && fp8_n && t->be->fp8_history) s = t->be->fp8_load(t->be, fp8, (size_t)fp8_n);
    free(fp8);
    if (s == LOOM_OK) {
        loom_backend *be = t->opt->state_be;
        be->upload(be, t->opt->m, m, bytes);
        be->upload(be, t->opt->v, v, bytes);
        if (has_master) loom_adamw_master_set(t->opt, loom_train_params(t, NULL), master);
        else init_master(t);
        t->opt->t = st->step;
    }
    free(m);
    free(v);
    free(master);
    return s;
}

// The layout a run is saved and resumed with.
static void set_layout(loom_trainer *t) {
    const loom_train_config *c = &t->cfg;
    t->st.world_size = t->mesh->world_size;
    t->st.zero = c->zero;
    t->st.grad_accum = t->grad_accum; // a resharded checkpoint's may differ
    t->st.state_files = c->zero == 0 ? t->mesh->world_size / t->dp_size : t->mesh->world_size;
    t->st.bucket_elements = loom_dp_bucket_elements(t->dp);
    t->st.tp = c->tp, t->st.pp = c->pp, t->st.cp = c->cp, t->st.sp = c->sp;
    t->st.dp_replicate = t->mesh->size[LOOM_AXIS_DP_REPLICATE];
    t->st.virtual_stages = t->schedule ? t->schedule->V : 1;
    t->st.v_shape = t->schedule && t->schedule->v_shape;
}

// --cuda-graphs records one rank's whole step (step_graph.c): no collective, wait for the
// stream, host copy or side-stream copy may sit inside it.
static loom_status check_cuda_graphs(const loom_trainer *t) {
    const loom_train_config *c = &t->cfg;
    int W = loom_comm_size(t->world);
    if (!c->cuda_graphs) return LOOM_OK;
    if (W > 1)
        return loom_fail(LOOM_EUNSUPPORTED, "drop --cuda-graphs, or run one rank",
                         "--cuda-graphs records one rank's step, without collectives; this run has %d ranks", W);
    if (c->zero == 3 || c->offload_activations || c->offload_optimizer)
        return loom_fail(LOOM_EUNSUPPORTED, "drop --cuda-graphs, or --zero 3 and --offload",
                         "--cuda-graphs: %s copies between host and device inside the step",
                         c->zero == 3 ? "--zero 3" : c->offload_activations ? "--offload activations"
                                                                            : "--offload optimizer");
    if (!t->be->graph_begin)
        return loom_fail(LOOM_EUNSUPPORTED, "drop --cuda-graphs, or train on --device cuda",
                         "--cuda-graphs needs a GPU: the %s backend has no graphs", t->be->name);
    return LOOM_OK;
}

// --gemm-autotune chooses among cuBLASLt's algorithms; the CPU backend has one sgemm.
static loom_status check_gemm_autotune(const loom_trainer *t) {
    if (!t->cfg.gemm_autotune || t->be->stream) return LOOM_OK;
    return loom_fail(LOOM_EUNSUPPORTED, "drop --gemm-autotune, or train on --device cuda",
                     "--gemm-autotune times cuBLASLt's matmul algorithms: the %s backend has one", t->be->name);
}

static bool fp8_delayed(const loom_train_config *c) { return c->fp8_recipe && strcmp(c->fp8_recipe, "delayed") == 0; }

// FP8 scales are per tensor: tensor or context parallelism would split a product's operands
// into shards scaled by amaxes of their own, other mathematics than the one-process run's. The
// recipe flags need --precision fp8, and the history the delayed recipe.
static loom_status check_fp8(const loom_train_config *c) {
    bool fp8 = strcmp(c->precision, "fp8") == 0, delayed = fp8_delayed(c);
    if (c->fp8_recipe && !delayed && strcmp(c->fp8_recipe, "tensorwise") != 0)
        return loom_fail(LOOM_EINVAL, "recipes are: tensorwise (scales from the current amax), delayed (from an amax history)",
                         "unknown --fp8-recipe '%s'", c->fp8_recipe);
    if (c->fp8_recipe && !fp8)
        return loom_fail(LOOM_EINVAL, "add --precision fp8, or drop --fp8-recipe",
                         "--fp8-recipe %s scales FP8 copies, and --precision %s makes none", c->fp8_recipe, c->precision);
    if (c->fp8_history && !delayed)
        return loom_fail(LOOM_EINVAL, "add --fp8-recipe delayed, or drop --fp8-history",
                         "--fp8-history %d is the delayed recipe's, and this run scales by %s", c->fp8_history,
                         fp8 ? "the current amax (tensorwise)" : "no FP8 (--precision is not fp8)");
    if (c->fp8_fast_dgrad && !fp8)
        return loom_fail(LOOM_EINVAL, "add --precision fp8, or drop --fp8-fast-dgrad",
                         "--fp8-fast-dgrad sets how FP8 products accumulate, and --precision %s makes none", c->precision);
    if (!fp8 || (c->tp == 1 && c->cp == 1)) return LOOM_OK;
    return loom_fail(LOOM_EUNSUPPORTED, "use --precision bf16 with --tp or --cp; fp8 runs with data and pipeline parallelism",
                     "--precision fp8 scales each tensor by its own amax, which --tp %d --cp %d would split into shards",
                     c->tp, c->cp);
}

static loom_status build(loom_trainer *t, bool *report) {
    const loom_train_config *c = &t->cfg;
    AGREE(loom_mesh_create(&t->mesh, t->world, c->tp, c->pp, c->cp, c->dp_replicate > 1 ? c->dp_replicate : 1));
    t->dp_rank = loom_mesh_rank(t->mesh, LOOM_GROUP_DP);
    t->dp_size = loom_mesh_size(t->mesh, LOOM_GROUP_DP);
    t->pp_rank = t->mesh->coord[LOOM_AXIS_PP];
    if (!t->cfg.global_batch) t->cfg.global_batch = c->batch * t->dp_size;
    t->grad_accum = c->global_batch / (c->batch * t->dp_size);
    int threads = c->threads ? c->threads : omp_get_num_procs() / loom_comm_local_size(t->world);
    omp_set_num_threads(threads > 0 ? threads : 1);
    AGREE(check_fp8(c));
    AGREE(loom_backend_open(&t->be, c->device, c->precision, loom_comm_local_rank(t->world)));
    if (fp8_delayed(c)) t->be->fp8_history = c->fp8_history ? c->fp8_history : LOOM_FP8_HISTORY;
    t->be->fp8_fast_dgrad = c->fp8_fast_dgrad;
    AGREE(check_cuda_graphs(t));
    AGREE(check_gemm_autotune(t));
    t->be->gemm_autotune = c->gemm_autotune;
    if (t->be->stream) AGREE(loom_mesh_attach_device(t->mesh, t->be->stream, c->device_comm));
    loom_gpt2_config cfg;
    float *file = NULL;
    int64_t resumed;
    loom_status s = read_start(t, &cfg, &file, &resumed);
    if (s == LOOM_OK) s = make_schedule(t, &cfg);
    if (s == LOOM_OK) s = loom_train_check_memory(t, &cfg);
    if (loom_comm_agree(t->world, s, report) == LOOM_OK) s = build_parallel(t, &cfg, file); // every rank measured
    free(file);
    AGREE(s);
    if (resumed >= 0) AGREE(load_state(t));
    else init_master(t);
    set_layout(t);
    return LOOM_OK;
}

loom_status loom_trainer_create(loom_trainer **out, loom_comm *world, const loom_train_config *cfg, bool *report) {
    loom_trainer *t = loom_xcalloc(1, sizeof *t);
    t->cfg = *cfg;
    t->world = world;
    loom_status s = build(t, report);
    if (s != LOOM_OK) {
        loom_trainer_free(t);
        t = NULL;
    }
    *out = t;
    return s;
}

void loom_trainer_free(loom_trainer *t) {
    if (!t) return;
    free(t->inputs);
    free(t->targets);
    loom_step_graph_free(t->graph, t->be);
    loom_adamw_free(t->opt);
    loom_dp_free(t->dp);
    loom_fsdp_free(t->fsdp); // before the model: it detaches the model's views
    loom_pp_free(t->pipe);
    loom_pp_schedule_free(t->schedule);
    loom_tp_free(t->tp);
    loom_cp_free(t->cp);
    loom_gpt2_free(t->model);
    loom_mesh_free(t->mesh); // before the backend: NCCL groups wait on its stream
    loom_backend_destroy(t->be);
    free(t);
}

void loom_trainer_memory(const loom_trainer *t, loom_train_memory *mem) {
    size_t es = loom_dtype_size(t->be->dtype), units = 0, peak = 0, acts_host = 0;
    size_t model = loom_gpt2_memory_bytes(t->model, &acts_host), pbytes = (size_t)t->model->num_elements * es;
    if (t->fsdp) loom_fsdp_memory(t->fsdp, &units, &peak);
    loom_train_parts parts = {.params = pbytes,
                              .dp = loom_dp_memory_bytes(t->dp),
                              .state = loom_adamw_state_bytes(loom_dp_state_elements(t->dp), t->be->dtype,
                                                              t->opt->offload, t->cfg.adamw.stochastic_rounding),
                              .shard = t->fsdp ? (size_t)loom_fsdp_shard_elements(t->fsdp) * es : 0,
                              .units = peak,
                              .activations = model - (t->fsdp ? 0 : 2 * pbytes) + (t->cp ? loom_cp_memory_bytes(t->cp) : 0),
                              .activations_host = acts_host};
    *mem = loom_train_memory_of(&t->cfg, &parts);
}
