// TensorBoard event files for `loom train --tensorboard DIR`: the run's scalars (the numbers of
// the --metrics records, under the same names: "loss", "lr", "grad_norm", "tokens_per_s", "mfu",
// "val_loss", ...) as Events with a Summary of simple values (src/cli/tensorboard.proto,
// compiled by protoc-c), in TFRecord framing:
//   uint64 length, uint32 masked CRC32C of the length's 8 bytes, length bytes of the Event,
//   uint32 masked CRC32C of them (all little-endian); masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8
// (tensorflow/core/lib/io/record_writer.cc, tensorflow/tsl/lib/hash/crc32c.h). CRC32C comes from
// ISA-L (crc32_iscsi). The file is DIR/events.out.tfevents.<unix time>.<host>.<pid>; its first
// event holds file_version "brain.Event:2". A resumed run starts a new file in the same folder
// whose second event is a SessionLog START at the step after the checkpoint, so TensorBoard drops
// what the interrupted run logged from that step on (as --metrics does).
#pragma once
#include "core/status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cli_tensorboard cli_tensorboard;

// Creates DIR if missing and a new event file in it, with the file_version event and, for a run
// resumed after `resume_step` steps (0: a fresh run), the START event at resume_step + 1.
// Errors: LOOM_EIO naming the folder or file (cannot create, not writable).
loom_status cli_tensorboard_open(cli_tensorboard **out, const char *dir, int64_t resume_step);
// Appends an Event of step `step` with n scalar values tags[i] = vals[i] (stored as float) and
// flushes. Errors: LOOM_EIO (disk full, ...).
loom_status cli_tensorboard_scalars(cli_tensorboard *tb, int64_t step, const char *const *tags, const double *vals,
                                    int n);
// Closes the file (NULL: nothing). Errors: LOOM_EIO when the last writes fail at close.
loom_status cli_tensorboard_close(cli_tensorboard *tb);
// The masked CRC32C of data[0, n) that TFRecord framing stores.
uint32_t cli_tfrecord_masked_crc(const void *data, size_t n);
