// `loom launch`: runs a training job (`mpirun -np N loom train ... --ckpt-dir D --ckpt-every K
// --resume`, or one process), watches it, and when it fails or hangs stops all of it and starts
// it again, so that `--resume` continues from the last checkpoint; as torchrun's elastic agent
// (torch.distributed.elastic) restarts a PyTorch job's worker group, with the MPI launcher as the
// group. Resuming is exact (loss for loss, bit for bit), so a job that survives a failure ends
// with the model of an uninterrupted run.
// The watchdog reads each local rank's heartbeat record (core/heartbeat.h, in a folder the
// launcher makes and names in LOOM_HEARTBEAT_DIR): when no rank has made progress (a phase of the
// training loop, a collective issued) for hang_timeout seconds, the job counts as hung; the
// launcher prints where every rank stopped, naming the ranks behind the others, and stops it.
// SIGUSR1 to the launcher prints the same report of a running job and lets it go on.
// Stopping a job: SIGTERM to the command (mpirun stops its ranks), SIGKILL to every process of
// the job's session after `grace` seconds, then the launcher waits until they are all gone (it is
// their subreaper), so the next attempt finds the checkpoint folder's lock free. A launcher that
// dies, even by SIGKILL, has the command sent SIGTERM (PR_SET_PDEATHSIG).
#pragma once
#include "core/status.h"

typedef struct {
    int max_restarts;    // attempts after the first that fail or hang (0: run once)
    double hang_timeout; // seconds without progress from any rank before the job counts as hung (0: off)
    double grace;        // seconds from SIGTERM to SIGKILL when the launcher stops a job
} loom_launch_options;

// Runs the command argv (NULL-terminated, argv[0] found on PATH) until an attempt exits with
// status 0, restarting it up to o->max_restarts times; SIGINT or SIGTERM to the launcher stops
// the job and ends it without a restart. The launcher's lines go to stderr, "loom launch: ...".
// Errors: LOOM_EINVAL when the command cannot be started (not found, not executable); LOOM_EIO
// when the last attempt failed or hung with no restart left, or on SIGINT/SIGTERM (the message
// names the last failure: exit status, signal, or the hang).
loom_status loom_launch_run(const loom_launch_options *o, char **argv);
