// `loom train`'s state, shared by its set-up (train_setup.c: world, backend, model, data
// parallelism, optimizer, data, checkpoints) and its loop (cmd_train.c).
#pragma once
#include "ckpt/checkpoint.h"
#include "cli/train_options.h"
#include "comm/comm.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/gpt2.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"

#include <stdio.h>

typedef struct {
    train_options o;
    loom_comm *world;          // the data-parallel group: every rank of the run (host values)
    loom_comm *device_world;   // the same ranks for GPU buffers (NCCL), or NULL: world serves
    int rank, world_size;
    loom_backend *be;
    loom_gpt2 *model;
    loom_dp *dp;
    loom_adamw *opt;           // over this rank's state (the whole model, or its ZeRO shard)
    loom_loader *train, *val;
    loom_tokenizer *tok;       // only when sampling
    FILE *metrics;             // rank 0
    loom_train_state st;       // step, data position, seed, batch and parallel layout
    int32_t *inputs, *targets; // (B,T) host
} trainer;

// Everything before the first step: a fresh run or --resume from the newest checkpoint.
// Errors: whatever failed on this rank (callers agree across ranks before going on).
loom_status train_setup(trainer *t);
// The run's configuration as a table (rank 0).
void train_print_config(const trainer *t);
// Saves step t->st.step on every rank; the metadata last, once all ranks saved. Errors: agreed
// across ranks (*report is true on the one rank that should print).
loom_status train_checkpoint(trainer *t, bool *report);
void train_teardown(trainer *t);
