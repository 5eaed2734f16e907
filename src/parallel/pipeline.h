// The pipeline executor: runs one rank's action list of any schedule (parallel/pipeline_schedule.h)
// over a model's stage, as torch.distributed.pipelining's executor runs its schedules' actions.
//
// Per step, for each action of this rank in order:
//   F(mb, s)     takes a free activation slot for (mb, s), loads the micro-batch's tokens and
//                targets where stage s needs them, waits for its input (a posted receive, or the
//                output of F(mb, s-1) on this rank) and runs the model's forward; the last
//                stage's loss is summed
//   B/I(mb, s)   waits for d(output) (a posted receive, B/I(mb, s+1)'s input gradient on this
//                rank, or nothing on the last stage), runs the backward (B: whole, frees the
//                slot; I: its input half) and keeps d(input) for stage s-1
//   W(mb, s)     the weight half; frees the slot
//   SEND_*       copies the tensor into a message buffer and sends it (nonblocking)
//   RECV_*       posts a receive into a message buffer (nonblocking)
// then waits for its sends. Messages are (Nl, C) activations or their gradients in the
// backend's dtype, over the pp group's device communicator (MPI on the CPU; NCCL or MPI staged
// through host memory on GPUs); message buffers are reused once their transfer completes.
//
// The model is reached through loom_pp_model, so this module knows no model: the training
// library (src/train) adapts GPT-2's stage API to it.
#pragma once
#include "backend/backend.h"
#include "comm/comm.h"
#include "parallel/pipeline_schedule.h"

typedef struct {
    void *ctx;
    // Loads micro-batch mb into slot `slot` for stage `stage` (tokens on the first, targets on
    // the last, the micro-batch's shape everywhere).
    void (*load)(void *ctx, int slot, int mb, int stage);
    // The forward of the rank's chunk `chunk` (its index among the rank's stages) on a slot:
    // returns its output (Nl,C) (empty on the last stage, which sets *loss); with `backward`
    // the last stage also starts its backward at the loss (training).
    loom_tensor (*forward)(void *ctx, int slot, int chunk, loom_tensor input, bool backward, double *loss);
    // The backward of `op` (LOOM_PP_B, _I or _W) of chunk `chunk` on a slot from dout (Nl,C):
    // returns d(input) (Nl,C) (empty on the first stage and for W).
    loom_tensor (*backward)(void *ctx, int slot, int chunk, loom_tensor dout, loom_pp_op op);
} loom_pp_model;

// Measured over the last step on this rank.
typedef struct {
    double step_seconds;  // from the first action to the last send's completion
    double busy_seconds;  // in F, B, I and W once their inputs arrived (synchronised on a GPU when timed)
    int peak_in_flight;   // the most slots held at once
} loom_pp_stats;

typedef struct loom_pp loom_pp;

// The executor of pp rank `rank` of schedule s (not owned; it must outlive the executor) over
// comm (the pp group, device buffers), with messages of `message_elements` values of be->dtype.
// The model needs s->promised[rank] activation slots. Errors: LOOM_ENOMEM.
loom_status loom_pp_create(loom_pp **out, const loom_pp_schedule *s, int rank, loom_comm *comm, loom_backend *be,
                           int64_t message_elements, loom_pp_model model);
void loom_pp_free(loom_pp *pp);
// Runs one step's actions; *loss_sum = the sum of the micro-batches' losses on the rank holding
// the last stage (0 elsewhere). `timed` synchronises the device around each compute action so
// that busy_seconds is measured. Errors: the first communication failure.
loom_status loom_pp_run(loom_pp *pp, bool timed, double *loss_sum);
// Forward only, micro-batch mb through every stage of this rank in order (evaluation), each
// stage's input received and output sent as it goes, in slot 0; *loss as loom_pp_run.
loom_status loom_pp_forward(loom_pp *pp, int mb, double *loss);
const loom_pp_stats *loom_pp_last_stats(const loom_pp *pp);
// A model hook (model/hooks.h; ctx = the executor) for LOOM_HOOK_FORWARD and _BACKWARD: moves the
// transfers in flight forward before each layer. MPI progresses a message only inside MPI
// calls, so without it a send posted before a long forward would wait for that forward's end.
void loom_pp_progress(void *ctx, int layer);
