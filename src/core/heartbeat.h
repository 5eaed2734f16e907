// A rank's progress, shared with `loom launch` for its watchdog and hang diagnosis. With
// LOOM_HEARTBEAT_DIR in the environment (the launcher sets it to a folder of its own), each
// process maps DIR/rank-<R> (LOOM_HEARTBEAT_PREFIX; one loom_heartbeat record, MAP_SHARED) and
// stores into it as it goes: the training loop's phase and step, and every collective it issues
// (in src/comm's entry points). A store is a few memory writes, no system call, so it costs
// nothing beside a step. The launcher reads the same files: when no rank has stored anything for
// --hang-timeout seconds the job counts as hung, and the records say where each rank stopped (a
// rank at an earlier step, or with fewer collectives issued, is one the others wait for), as
// PyTorch's NCCL flight recorder does with its per-rank collective sequence numbers. Without the
// variable every call is a no-op.
#pragma once
#include <stdint.h>

#define LOOM_HEARTBEAT_MAGIC 0x6c6f6f6d68625631ull // "loomhbV1"
#define LOOM_HEARTBEAT_PREFIX "rank-"              // a record's file name: the prefix, then the rank

typedef struct {
    uint64_t magic;       // LOOM_HEARTBEAT_MAGIC once the record is filled
    int32_t rank, pid;    // the world rank, the process id
    int64_t step;         // the step being taken or last taken (1-based; 0 before the first)
    uint64_t collectives; // collectives and point-to-point operations issued so far
    double updated;       // CLOCK_MONOTONIC seconds (one clock for all processes of a host)
    char phase[16];       // "start", "step" (in it), "stepped" (after it), "validate", "sample", "save"
    char op[16];          // the last collective issued: "allreduce", "send", ...
} loom_heartbeat;

// Maps this process's record as rank `rank` when LOOM_HEARTBEAT_DIR is set (once; a later call
// changes nothing). A folder that cannot be written leaves the heartbeat off with a warning on
// stderr: the run itself does not depend on it.
void loom_heartbeat_open(int rank);
// Records the training loop's phase (a string literal, at most 15 characters) and step.
void loom_heartbeat_phase(const char *phase, int64_t step);
// Counts one collective or point-to-point operation `op` issued by this process.
void loom_heartbeat_collective(const char *op);
