#include "cli/train_options.h"

#include "cli/common.h"
#include "cli/flags.h"
#include "core/log.h"

#include <float.h>
#include <limits.h>
#include <string.h>

// The mesh: --tp/--pp/--cp fill the world with dp = world / (tp pp cp) data-parallel ranks.
// (Each flag's own range is checked by the parser.)
static loom_status validate_mesh(train_options *o, int world_size) {
    loom_train_config *r = &o->run;
    loom_cp_style style;
    LOOM_TRY(loom_cp_style_parse(r->cp_style, &style));
    if (r->sp && r->tp == 1)
        return loom_fail(LOOM_EINVAL, "add --tp 2 or more: sequence parallelism splits rows over the tensor-parallel ranks",
                         "--sp needs --tp 2 or more, got --tp 1");
    int64_t model_ranks = (int64_t)r->tp * r->pp * r->cp;
    if (world_size % model_ranks != 0)
        return loom_fail(LOOM_EINVAL, "launch a multiple of tp x pp x cp ranks",
                         "%d rank%s do%s not fill a mesh of --tp %d x --pp %d x --cp %d", world_size,
                         loom_plural(world_size), world_size == 1 ? "es" : "", r->tp, r->pp,
                         r->cp);
    o->dp = (int)(world_size / model_ranks);
    if (o->dp % r->dp_replicate != 0)
        return loom_fail(LOOM_EINVAL, "use a --dp-replicate that divides the data-parallel ranks",
                         "--dp-replicate %d does not divide the %d data-parallel rank%s", r->dp_replicate, o->dp,
                         loom_plural(o->dp));
    r->zero = cli_zero_stage(r->zero, o->dp);
    if (r->dp_replicate > 1 && r->zero == 0)
        return loom_fail(LOOM_EINVAL, "add --zero 1, 2 or 3: hybrid sharding shards within each replica",
                         "--dp-replicate %d needs a ZeRO stage of 1 or more, got --zero 0", r->dp_replicate);
    return LOOM_OK;
}

loom_status train_offload_parse(const char *offload, loom_train_config *run) {
    char *list = strdup(offload), *save = NULL;
    loom_status s = LOOM_OK;
    for (char *item = strtok_r(list, ",", &save); item && s == LOOM_OK; item = strtok_r(NULL, ",", &save)) {
        if (strcmp(item, "optimizer") == 0) run->offload_optimizer = true;
        else if (strcmp(item, "params") == 0) run->offload_params = true;
        else if (strcmp(item, "activations") == 0) run->offload_activations = true;
        else
            s = loom_fail(LOOM_EINVAL, "offload is a comma list of: optimizer, params, activations",
                          "unknown --offload item '%s'", item);
    }
    free(list);
    if (s == LOOM_OK && run->offload_params && (run->zero != 3 || !run->offload_optimizer))
        s = loom_fail(LOOM_EINVAL, "use --zero 3 --offload optimizer,params: the offloaded optimizer updates the "
                                   "host shard",
                      "--offload params needs ZeRO 3's parameter shard and the offloaded optimizer, got --zero %d "
                      "--offload %s", run->zero, offload);
    if (s == LOOM_OK && run->offload_optimizer && run->adamw.stochastic_rounding)
        s = loom_fail(LOOM_EINVAL, "drop --stochastic-rounding or --offload optimizer",
                      "--stochastic-rounding: the offloaded optimizer rounds the parameters to nearest on the host");
    return s;
}

static loom_status validate(train_options *o, int world_size) {
    loom_train_config *r = &o->run;
    if (!o->train_data)
        return loom_fail(LOOM_EINVAL, "give the training shards, e.g. --train-data 'data/x_train_*.bin'",
                         "--train-data is required");
    LOOM_TRY(validate_mesh(o, world_size));
    if ((r->pp > 1 || r->cp > 1) && o->sample_every)
        return loom_fail(LOOM_EUNSUPPORTED, "sample the saved model with 'loom sample --model DIR/model_S.bin'",
                         "--sample-every: sampling during training under --%s %d is not in this version of loom",
                         r->pp > 1 ? "pp" : "cp", r->pp > 1 ? r->pp : r->cp);
    int64_t per_step = (int64_t)r->batch * o->dp; // sequences of one micro-batch on every data-parallel rank
    if (r->global_batch == 0 && per_step > 1 << 20)
        return loom_fail(LOOM_EINVAL, "lower --batch", "%d data-parallel ranks x --batch %d exceed 1048576 sequences per step",
                         o->dp, r->batch);
    if (r->global_batch == 0) r->global_batch = (int)per_step;
    if (r->global_batch % per_step != 0) {
        if (o->dp == 1)
            return loom_fail(LOOM_EINVAL, "make --global-batch a multiple of --batch",
                             "--global-batch %d is not a positive multiple of --batch %d", r->global_batch, r->batch);
        return loom_fail(LOOM_EINVAL, "make --global-batch a multiple of data-parallel ranks x --batch",
                         "--global-batch %d is not a positive multiple of %d %s x --batch %d", r->global_batch,
                         o->dp, o->dp == world_size ? "ranks" : "data-parallel ranks", r->batch);
    }
    const loom_adamw_config *a = &r->adamw;
    if (o->min_lr < 0) o->min_lr = a->lr * 0.1f;
    if (o->min_lr > a->lr)
        return loom_fail(LOOM_EINVAL, "the floor must not exceed --lr", "--min-lr %g exceeds --lr %g",
                         (double)o->min_lr, (double)a->lr);
    r->lr = (loom_lr_schedule){.max_lr = a->lr, .min_lr = o->min_lr, .warmup = o->warmup, .total = o->steps};
    LOOM_TRY(loom_lr_kind_parse(o->schedule, &r->lr.kind));
    LOOM_TRY(cli_recompute_parse(o->recompute, r->precision, &r->recompute));
    LOOM_TRY(train_offload_parse(o->offload, r));
    if (strcmp(r->device_comm, "nccl") != 0 && strcmp(r->device_comm, "mpi") != 0)
        return loom_fail(LOOM_EINVAL, "use --device-comm nccl or mpi", "unknown --device-comm '%s'", r->device_comm);
    if (!(o->peak_tflops >= 0))
        return loom_fail(LOOM_EINVAL, "e.g. --peak-tflops 989 (0: the default)", "--peak-tflops must be >= 0, got %g",
                         (double)o->peak_tflops);
    if (o->plot && !o->metrics)
        return loom_fail(LOOM_EINVAL, "add --metrics FILE.jsonl: the plot is drawn from it", "--plot needs --metrics");
    if ((o->resume || o->ckpt_every) && !o->ckpt_dir)
        return loom_fail(LOOM_EINVAL, "give --ckpt-dir DIR", "--resume and --ckpt-every need --ckpt-dir");
    r->resume = o->resume ? o->ckpt_dir : NULL;
    r->seed = (uint64_t)o->seed;
    r->adamw.seed = (uint64_t)o->seed;
    r->bucket_mb = o->bucket_mb;
    if (!r->init) LOOM_TRY(cli_model_config(o->model, o->layers, o->heads, o->channels, o->max_seq, o->vocab, &r->model));
    return LOOM_OK;
}

loom_status train_options_parse(train_options *o, int argc, char **argv, int world_size, bool *help) {
    *o = (train_options){.run = {.batch = 8, .tp = 1, .pp = 1, .cp = 1, .dp_replicate = 1, .pp_schedule = "1f1b",
                                 .adamw = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                           .weight_decay = 0.1f, .grad_clip = 1.0f},
                                 .device = "auto", .precision = "auto", .device_comm = "nccl", .cp_style = "ring",
                                 .zero = -1},
                         .model = "gpt2-mini", .steps = 100, .schedule = "cosine", .min_lr = -1, .seed = 1337,
                         .val_batches = 20, .sample_tokens = 64, .bucket_mb = 25, .recompute = "auto",
                         .offload = ""};
    loom_train_config *r = &o->run;
    const loom_flag flags[] = {
        {"model", FLAG_STR, &o->model, "named config: gpt2-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl"},
        {"init", FLAG_STR, &r->init, "start from this llm.c model file instead of random weights"},
        {"layers", FLAG_INT, &o->layers, "layers L (0: the config's value)", CLI_LAYERS_RANGE},
        {"heads", FLAG_INT, &o->heads, "heads NH (0: the config's value)", CLI_HEADS_RANGE},
        {"channels", FLAG_INT, &o->channels, "channels C (0: the config's value)", CLI_CHANNELS_RANGE},
        {"max-seq", FLAG_INT, &o->max_seq, "maximum sequence length (0: the config's value)", CLI_SEQ_RANGE},
        {"vocab", FLAG_INT, &o->vocab, "vocabulary size V, token ids below it (0: the config's value)", 0, 65536},
        {"train-data", FLAG_STR, &o->train_data, "training token shards (file or glob)"},
        {"val-data", FLAG_STR, &o->val_data, "validation token shards (file or glob)"},
        {"batch", FLAG_INT, &r->batch, "micro-batch size B (sequences)", CLI_BATCH_RANGE},
        {"seq", FLAG_INT, &r->seq, "sequence length T (0: the model's maximum)", CLI_SEQ_RANGE},
        {"global-batch", FLAG_INT, &r->global_batch, "sequences per optimizer step over all data-parallel ranks (0: dp x batch); accumulation = global-batch / (dp x batch)", 0, 1 << 20},
        {"shuffle", FLAG_BOOL, &o->shuffle, "shuffle shards and micro-batch order per epoch (from --seed)"},
        {"steps", FLAG_I64, &o->steps, "optimizer steps", 1, 1e12},
        {"lr", FLAG_FLOAT, &r->adamw.lr, "peak learning rate", 0, FLT_MAX, FLAG_ABOVE_MIN},
        {"min-lr", FLAG_FLOAT, &o->min_lr, "learning-rate floor of the cosine decay (-1: lr/10)", -1, FLT_MAX},
        {"schedule", FLAG_STR, &o->schedule, "cosine or constant (after warmup)"},
        {"warmup", FLAG_INT, &o->warmup, "linear warmup steps", 0, INT_MAX},
        {"beta1", FLAG_FLOAT, &r->adamw.beta1, "AdamW beta1", 0, 1, FLAG_BELOW_MAX},
        {"beta2", FLAG_FLOAT, &r->adamw.beta2, "AdamW beta2", 0, 1, FLAG_BELOW_MAX},
        {"eps", FLAG_FLOAT, &r->adamw.eps, "AdamW epsilon", 0, FLT_MAX, FLAG_ABOVE_MIN},
        {"weight-decay", FLAG_FLOAT, &r->adamw.weight_decay, "decoupled weight decay (matrices and embeddings)", 0, FLT_MAX},
        {"grad-clip", FLAG_FLOAT, &r->adamw.grad_clip, "clip the global gradient norm to this (0: off)", 0, FLT_MAX},
        {"stochastic-rounding", FLAG_BOOL, &r->adamw.stochastic_rounding, "bf16: round the parameters from the fp32 master weights stochastically (unbiased) instead of to nearest (the master weights are then kept whole: 2 bytes a parameter more than split into the parameter and 16 bits)"},
        {"seed", FLAG_I64, &o->seed, "seed of initialisation, shuffling and sampling", CLI_SEED_RANGE},
        {"val-every", FLAG_INT, &o->val_every, "validation every N steps (0: only at the end)", 0, INT_MAX},
        {"val-batches", FLAG_INT, &o->val_batches, "micro-batches per validation", 1, INT_MAX},
        {"sample-every", FLAG_INT, &o->sample_every, "print a sample every N steps (0: off)", 0, INT_MAX},
        {"sample-tokens", FLAG_INT, &o->sample_tokens, "tokens per sample at most (a sample stops at <|endoftext|>)", CLI_TOKENS_RANGE},
        {"ckpt-every", FLAG_INT, &o->ckpt_every, "checkpoint every N steps (0: only at the end)", 0, INT_MAX},
        {"ckpt-dir", FLAG_STR, &o->ckpt_dir, "checkpoint folder (created if missing)"},
        {"resume", FLAG_BOOL, &o->resume, "continue from the newest checkpoint in --ckpt-dir"},
        {"skip-nonfinite", FLAG_BOOL, &o->skip_nonfinite, "skip a step whose loss or gradient norm is NaN or infinite (no update) instead of stopping"},
        {"metrics", FLAG_STR, &o->metrics, "per-step metrics as JSON Lines, the run's configuration first (a fresh run replaces the file, --resume appends)"},
        {"plot", FLAG_STR, &o->plot, "redraw the --metrics curves into this FILE.png or FILE.svg at each validation and at the end (gnuplot)"},
        {"tensorboard", FLAG_STR, &o->tensorboard, "write TensorBoard event files of the metrics into this folder (created if missing)"},
        {"peak-tflops", FLAG_FLOAT, &o->peak_tflops, CLI_PEAK_HELP, 0, FLT_MAX},
        {"device", FLAG_STR, &r->device, CLI_DEVICE_HELP},
        {"precision", FLAG_STR, &r->precision, CLI_PRECISION_HELP},
        {"fp8-recipe", FLAG_STR, &r->fp8_recipe, CLI_FP8_RECIPE_HELP},
        {"fp8-history", FLAG_INT, &r->fp8_history, CLI_FP8_HISTORY_HELP, CLI_FP8_HISTORY_RANGE},
        {"fp8-fast-dgrad", FLAG_BOOL, &r->fp8_fast_dgrad, CLI_FP8_FAST_DGRAD_HELP},
        {"threads", FLAG_INT, &r->threads, "CPU threads per rank (0: the cores shared among this host's ranks)", CLI_THREADS_RANGE},
        {"recompute", FLAG_STR, &o->recompute, CLI_RECOMPUTE_HELP},
        {"cuda-graphs", FLAG_BOOL, &r->cuda_graphs, "replay each step (zeroed gradients, every micro-batch's forward and backward, the norm, clipping, AdamW) as one recorded CUDA graph (one GPU, one rank): fewer kernel launches, no host round trip inside the step"},
        {"gemm-autotune", FLAG_BOOL, &r->gemm_autotune, CLI_GEMM_AUTOTUNE_HELP},
        {"logits-chunk", FLAG_INT, &r->logits_chunk, CLI_LOGITS_CHUNK_HELP, CLI_LOGITS_CHUNK_RANGE},
        {"offload", FLAG_STR, &o->offload, "what lives in host memory (comma list): optimizer (AdamW state, stepped on the CPU cores: ZeRO-Offload), params (ZeRO 3's parameter shard; with --zero 3 and optimizer), activations (each block's saved activations)"},
        {"tp", FLAG_INT, &r->tp, "tensor-parallel ranks: heads, MLP columns and vocabulary split over them (Megatron-LM)", 1, 1024},
        {"sp", FLAG_BOOL, &r->sp, "sequence parallelism: LayerNorm and residual rows split over the --tp ranks too"},
        {"pp", FLAG_INT, &r->pp, "pipeline-parallel ranks: the blocks split into consecutive stages over them", 1, 1024},
        {"pp-schedule", FLAG_STR, &r->pp_schedule, "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1, zb-v, dualpipev ('loom schedule' draws them)"},
        {"virtual-stages", FLAG_INT, &r->virtual_stages, "stages per pipeline rank of the interleaved schedule (0: the schedule's own)", 0, LOOM_MAX_CHUNKS},
        {"cp", FLAG_INT, &r->cp, "context-parallel ranks: every sequence split over them, each holding 2 of 2 x cp chunks (the zigzag layout); --seq must divide by 2 x cp", 1, 1024},
        {"cp-style", FLAG_STR, &r->cp_style, "context parallelism's attention: ring (keys/values passed around the ranks) or ulysses (all-to-all to heads; the heads per tp rank must divide by cp)"},
        {"device-comm", FLAG_STR, &r->device_comm, "collectives on GPU buffers: nccl, or mpi (staged through host memory, for ranks sharing a GPU)"},
        {"zero", FLAG_INT, &r->zero, CLI_ZERO_HELP, CLI_ZERO_RANGE},
        {"dp-replicate", FLAG_INT, &r->dp_replicate, "hybrid sharding (HSDP): the data-parallel ranks as this many replicas, ZeRO sharding within each", 1, 65536},
        {"bucket-mb", FLAG_FLOAT, &o->bucket_mb, "gradient bucket size in MiB for the data-parallel reduction", 0, 65536, FLAG_ABOVE_MIN},
    };
    const loom_cli cli = {"train", "Train a GPT-2 model on token shards.", "loom train --train-data PATTERN [flags]",
                          flags, (int)(sizeof flags / sizeof flags[0]), 0};
    char **pos;
    int npos;
    LOOM_TRY(loom_flags_parse(&cli, argc, argv, help, &pos, &npos));
    if (*help) return LOOM_OK;
    return validate(o, world_size);
}
