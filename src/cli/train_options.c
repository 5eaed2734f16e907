#include "cli/train_options.h"

#include "cli/common.h"
#include "cli/flags.h"

#include <string.h>

static loom_status check_positive(const char *flag, int64_t v) {
    if (v >= 1) return LOOM_OK;
    return loom_fail(LOOM_EINVAL, "use a value of 1 or more", "--%s must be >= 1, got %lld", flag,
                     (long long)v);
}

static loom_status check_nonneg(const char *flag, int64_t v) {
    if (v >= 0) return LOOM_OK;
    return loom_fail(LOOM_EINVAL, "use 0 to turn it off", "--%s must be >= 0, got %lld", flag,
                     (long long)v);
}

static loom_status validate(train_options *o, int world_size) {
    if (!o->train_data)
        return loom_fail(LOOM_EINVAL, "give the training shards, e.g. --train-data 'data/x_train_*.bin'",
                         "--train-data is required");
    LOOM_TRY(check_positive("batch", o->batch));
    LOOM_TRY(check_positive("steps", o->steps));
    LOOM_TRY(check_nonneg("seq", o->seq));
    LOOM_TRY(check_nonneg("warmup", o->warmup));
    LOOM_TRY(check_nonneg("val-every", o->val_every));
    LOOM_TRY(check_positive("val-batches", o->val_batches));
    LOOM_TRY(check_nonneg("sample-every", o->sample_every));
    LOOM_TRY(check_positive("sample-tokens", o->sample_tokens));
    LOOM_TRY(check_nonneg("ckpt-every", o->ckpt_every));
    LOOM_TRY(check_nonneg("threads", o->threads));
    if (o->global_batch == 0) o->global_batch = o->batch * world_size;
    if (o->global_batch < 0 || o->global_batch % (o->batch * world_size) != 0) {
        if (world_size == 1)
            return loom_fail(LOOM_EINVAL, "make --global-batch a multiple of --batch",
                             "--global-batch %d is not a positive multiple of --batch %d",
                             o->global_batch, o->batch);
        return loom_fail(LOOM_EINVAL, "make --global-batch a multiple of ranks x --batch",
                         "--global-batch %d is not a positive multiple of %d ranks x --batch %d",
                         o->global_batch, world_size, o->batch);
    }
    o->grad_accum = o->global_batch / (o->batch * world_size);
    const loom_adamw_config *a = &o->adamw;
    if (!(a->lr > 0)) return loom_fail(LOOM_EINVAL, "e.g. --lr 6e-4", "--lr must be > 0, got %g", (double)a->lr);
    if (!(a->beta1 >= 0 && a->beta1 < 1) || !(a->beta2 >= 0 && a->beta2 < 1))
        return loom_fail(LOOM_EINVAL, "betas lie in [0, 1)", "--beta1 %g / --beta2 %g out of range",
                         (double)a->beta1, (double)a->beta2);
    if (!(a->eps > 0)) return loom_fail(LOOM_EINVAL, NULL, "--eps must be > 0, got %g", (double)a->eps);
    if (a->weight_decay < 0 || a->grad_clip < 0)
        return loom_fail(LOOM_EINVAL, "use 0 to turn it off",
                         "--weight-decay %g and --grad-clip %g must be >= 0", (double)a->weight_decay,
                         (double)a->grad_clip);
    if (o->min_lr < 0) o->min_lr = a->lr * 0.1f;
    if (o->min_lr > a->lr)
        return loom_fail(LOOM_EINVAL, "the floor must not exceed --lr", "--min-lr %g exceeds --lr %g",
                         (double)o->min_lr, (double)a->lr);
    o->lr = (loom_lr_schedule){.max_lr = a->lr, .min_lr = o->min_lr, .warmup = o->warmup, .total = o->steps};
    LOOM_TRY(loom_lr_kind_parse(o->schedule, &o->lr.kind));
    if ((o->resume || o->ckpt_every) && !o->ckpt_dir)
        return loom_fail(LOOM_EINVAL, "give --ckpt-dir DIR", "--resume and --ckpt-every need --ckpt-dir");
    return LOOM_OK;
}

loom_status train_options_parse(train_options *o, int argc, char **argv, int world_size, bool *help) {
    *o = (train_options){.model = "gpt2-mini", .batch = 8, .seq = 0, .steps = 100,
                         .adamw = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                   .weight_decay = 0.1f, .grad_clip = 1.0f},
                         .schedule = "cosine", .min_lr = -1, .seed = 1337, .val_batches = 20,
                         .sample_tokens = 64, .device = "auto", .precision = "auto", .bucket_mb = 25,
                         .recompute = "none"};
    const loom_flag flags[] = {
        {"model", FLAG_STR, &o->model, "named config: gpt2-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl"},
        {"init", FLAG_STR, &o->init, "start from this llm.c model file instead of random weights"},
        {"layers", FLAG_INT, &o->layers, "override the config's layers L"},
        {"heads", FLAG_INT, &o->heads, "override the config's heads NH"},
        {"channels", FLAG_INT, &o->channels, "override the config's channels C"},
        {"max-seq", FLAG_INT, &o->max_seq, "override the config's maximum sequence length"},
        {"train-data", FLAG_STR, &o->train_data, "training token shards (file or glob)"},
        {"val-data", FLAG_STR, &o->val_data, "validation token shards (file or glob)"},
        {"batch", FLAG_INT, &o->batch, "micro-batch size B (sequences)"},
        {"seq", FLAG_INT, &o->seq, "sequence length T (0: the model's maximum)"},
        {"global-batch", FLAG_INT, &o->global_batch, "sequences per optimizer step over all ranks (0: ranks x batch); accumulation = global-batch / (ranks x batch)"},
        {"shuffle", FLAG_BOOL, &o->shuffle, "shuffle shards and micro-batch order per epoch (from --seed)"},
        {"steps", FLAG_I64, &o->steps, "optimizer steps"},
        {"lr", FLAG_FLOAT, &o->adamw.lr, "peak learning rate"},
        {"min-lr", FLAG_FLOAT, &o->min_lr, "learning-rate floor of the cosine decay (-1: lr/10)"},
        {"schedule", FLAG_STR, &o->schedule, "cosine or constant (after warmup)"},
        {"warmup", FLAG_INT, &o->warmup, "linear warmup steps"},
        {"beta1", FLAG_FLOAT, &o->adamw.beta1, "AdamW beta1"},
        {"beta2", FLAG_FLOAT, &o->adamw.beta2, "AdamW beta2"},
        {"eps", FLAG_FLOAT, &o->adamw.eps, "AdamW epsilon"},
        {"weight-decay", FLAG_FLOAT, &o->adamw.weight_decay, "decoupled weight decay (matrices and embeddings)"},
        {"grad-clip", FLAG_FLOAT, &o->adamw.grad_clip, "clip the global gradient norm to this (0: off)"},
        {"stochastic-rounding", FLAG_BOOL, &o->adamw.stochastic_rounding, "bf16: round the parameters from the fp32 master weights stochastically (unbiased) instead of to nearest"},
        {"seed", FLAG_I64, &o->seed, "seed of initialisation, shuffling and sampling"},
        {"val-every", FLAG_INT, &o->val_every, "validation every N steps (0: only at the end)"},
        {"val-batches", FLAG_INT, &o->val_batches, "micro-batches per validation"},
        {"sample-every", FLAG_INT, &o->sample_every, "print a sample every N steps (0: off)"},
        {"sample-tokens", FLAG_INT, &o->sample_tokens, "tokens per sample"},
        {"ckpt-every", FLAG_INT, &o->ckpt_every, "checkpoint every N steps (0: only at the end)"},
        {"ckpt-dir", FLAG_STR, &o->ckpt_dir, "checkpoint folder (created if missing)"},
        {"resume", FLAG_BOOL, &o->resume, "continue from the newest checkpoint in --ckpt-dir"},
        {"metrics", FLAG_STR, &o->metrics, "append per-step metrics to this JSON Lines file"},
        {"device", FLAG_STR, &o->device, CLI_DEVICE_HELP},
        {"precision", FLAG_STR, &o->precision, CLI_PRECISION_HELP},
        {"threads", FLAG_INT, &o->threads, "CPU threads per rank (0: the cores shared among this host's ranks)"},
        {"recompute", FLAG_STR, &o->recompute, "activations backward recomputes: none, gelu (the GELU output), full (whole blocks)"},
        {"zero", FLAG_INT, &o->zero, "ZeRO stage across data-parallel ranks: 0 (DDP), 1 (shard optimizer state), 2 (and gradients)"},
        {"bucket-mb", FLAG_FLOAT, &o->bucket_mb, "gradient bucket size in MiB for the data-parallel reduction"},
    };
    const loom_cli cli = {"train", "Train a GPT-2 model on token shards.", "loom train --train-data PATTERN [flags]",
                          flags, (int)(sizeof flags / sizeof flags[0]), 0};
    char **pos;
    int npos;
    LOOM_TRY(loom_flags_parse(&cli, argc, argv, help, &pos, &npos));
    if (*help) return LOOM_OK;
    o->adamw.seed = (uint64_t)o->seed;
    return validate(o, world_size);
}
