// Training checkpoints: everything `loom train --resume` needs to continue a run so that its
// losses and final weights are bit-identical to an uninterrupted run (same mesh). For step S,
// in the checkpoint folder:
//   model_S.bin          the whole model, an llm.c model file (version 3, fp32), written by rank 0
//                        (gathered from the tensor-parallel shards and pipeline stages) — usable
//                        alone with `loom eval` / `loom sample` / `train --init`; its CRC-32 is in
//                        the metadata
//   state_S_R.bin        optimizer state of rank R over its shard of the parameters (its tensor-
//                        parallel shard, and under ZeRO 1/2 its data-parallel piece of that;
//                        with ZeRO 0 only the ranks of data-parallel replica 0 save): header of 32
//                        int64 (magic 20241122, version 4, rank, world size, step, elements, data
//                        position, seed, ZeRO stage, master weights present, CRC-32 of the
//                        payload, values of FP8 scaling state), then the AdamW first and second
//                        moments (fp32 each), in mixed precision (header[9] = 1) the fp32 master
//                        weights, and under FP8 delayed scaling the backend's scaling state
//                        (header[11] fp32 values, each finite and >= 0: backend.h's fp8_save).
//                        Versions 2 (no CRC) and 3 (no FP8 state) are read too.
//   ckpt_S.json          metadata (format "loom-checkpoint", version 4; step, mesh, ZeRO stage,
//                        bucket size, files, the model file's CRC-32, model config, the
//                        parameter table's tensors with their shard specs, batch layout, seed,
//                        data position, the schedule's horizon), written LAST by rank 0 after
//                        every rank has saved: its presence marks the checkpoint complete
// (S as 8 digits, R as 5). Every file is written atomically (core/fileio.h), so a kill during a
// save leaves the previous checkpoint loadable; resume takes the newest step with metadata.
// Readers refuse what a save cannot have written: fields out of range or inconsistent with each
// other or with the files, NaN or infinite values, a negative second moment, a wrong checksum.
// The folder itself (its lock and the leftovers of an interrupted save) is ckpt/folder.h's.
#pragma once
#include "model/gpt2_config.h"
#include "model/param_table.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { LOOM_STATE_MAGIC = 20241122, LOOM_STATE_VERSION = 4, LOOM_META_VERSION = 4 };

typedef struct {
    int64_t step;          // optimizer steps completed
    int64_t data_position; // micro-batches of the training stream consumed (all ranks)
    uint64_t seed;         // run seed (initialisation, shuffle, sampling)
    int micro_batch, seq_len, grad_accum; // B, T, micro-batches per rank and step
    int world_size, zero, state_files;    // ranks, ZeRO stage, state files (ranks 0..state_files-1)
    int tp, pp, cp, sp;                   // the mesh (dp = world_size / (tp pp cp)); sp: sequence parallelism
    int dp_replicate;                     // hybrid sharding's replicas (1: none)
    int virtual_stages, v_shape;          // the pipeline's stages per rank, and whether they lie in a V
                                          // (zb-v, dualpipev): which blocks each rank's state covers
    int64_t bucket_elements;              // gradient bucket length (ZeRO shards follow it)
    double train_loss;                    // loss of the last step
    int64_t lr_total_steps;               // the learning-rate schedule's horizon when saved (0: not recorded)
    int64_t model_crc32;                  // CRC-32 of model_S.bin (-1: not recorded, older checkpoints)
} loom_train_state;

typedef enum { LOOM_CKPT_MODEL, LOOM_CKPT_STATE, LOOM_CKPT_META } loom_ckpt_file;

// The path of a checkpoint file: DIR/model_S.bin, DIR/state_S_R.bin (`rank` R), DIR/ckpt_S.json;
// with dir NULL the file name alone.
void loom_ckpt_path(char *out, size_t cap, const char *dir, loom_ckpt_file kind, int64_t step, int rank);

// Rank 0: the model file of step st->step; its CRC-32 goes to st->model_crc32 (for the
// metadata). Errors: LOOM_EIO naming the file.
loom_status loom_ckpt_save_model(const char *dir, loom_train_state *st, const loom_gpt2_config *cfg,
                                 const float *params, int64_t n);
// Rank `rank`'s optimizer state (n elements of m, v and master; master NULL in fp32 runs) and
// its FP8 scaling state (fp8_n values of fp8; 0: none). Errors: LOOM_EIO naming the file.
loom_status loom_ckpt_save_state(const char *dir, const loom_train_state *st, int rank, const float *m,
                                 const float *v, const float *master, int64_t n, const float *fp8, int64_t fp8_n);
// Rank 0, after every rank saved: the metadata that completes the checkpoint, with the
// tensors of rank 0's parameter table. Errors: LOOM_EIO.
loom_status loom_ckpt_save_meta(const char *dir, const loom_train_state *st, const loom_gpt2_config *cfg,
                                const loom_param_table *table);

// Newest complete checkpoint in `dir`; *step = -1 when there is none. Errors: LOOM_EIO when
// `dir` cannot be read.
loom_status loom_ckpt_latest(const char *dir, int64_t *step);
// The metadata of step `step`, validated: format and version, every number in its range, the
// seed, the step against the file name, the mesh, state files and data position against each
// other, the file names, and the model file present. Errors: LOOM_EIO / LOOM_EFORMAT naming the
// file and the field.
loom_status loom_ckpt_load_meta(const char *dir, int64_t step, loom_train_state *st);
// The parameters of step st->step (malloc'ed, *n elements), their checksum checked against
// st->model_crc32 (when recorded). Errors as loom_llmc_read; LOOM_EFORMAT for a checksum mismatch.
loom_status loom_ckpt_load_model(const char *dir, const loom_train_state *st, loom_gpt2_config *cfg,
                                 float **params, int64_t *n);
// State file `rank` of step st->step into m, v (n elements each, checked against the header)
// and, when master is not NULL and the file has them, the master weights (*has_master says);
// its FP8 scaling state into *fp8 (malloc'ed, *fp8_n values; NULL and 0 when it has none) when
// fp8 is not NULL. Errors: LOOM_EIO / LOOM_EFORMAT naming the file and the disagreement: header,
// size, checksum, a value that is NaN or infinite, a negative second moment or scaling value.
loom_status loom_ckpt_load_state(const char *dir, const loom_train_state *st, int rank, float *m, float *v,
                                 float *master, bool *has_master, int64_t n, float **fp8, int64_t *fp8_n);
