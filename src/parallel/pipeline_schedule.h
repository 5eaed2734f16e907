// Pipeline schedules as explicit per-rank action lists (torchtitan / torch.distributed.pipelining's
// design: a schedule is data, one executor runs any of them), and a simulator that checks and
// times them.
//
// The model's L blocks are cut into S = pp x V stages of L/S blocks (stage 0 also holds the
// embedding, stage S-1 the final LayerNorm, output layer and loss). Every micro-batch mb of the
// M in a step goes forward through stages 0..S-1 and backward through S-1..0. Where a stage
// lives:
//   gpipe, 1f1b, zb-h1   V = 1: stage s on rank s
//   interleaved          V >= 2 (--virtual-stages): stage s on rank s % pp (rank r holds the
//                        non-adjacent stages r, r + pp, ...; Narayanan et al. 2021)
//   zb-v, dualpipev      V = 2 in a V: stage s on rank s for s < pp, else on rank 2pp-1-s
//                        (rank 0 holds the first and the last stage)
// Schedules, with their bubble fraction with unit costs (F = I = W = 1, B = 2; M >= pp) and the
// peak (mb, stage) pairs in flight they promise on rank r:
//   gpipe        all forwards, then all backwards (Huang et al. 2019, "GPipe").
//                Bubble (pp-1)/(M+pp-1); peak M.
//   1f1b         warm-up forwards, then one forward one backward, then the remaining backwards
//                (PipeDream-Flush, Narayanan et al. 2021). Bubble (pp-1)/(M+pp-1); peak
//                min(pp-r, M).
//   interleaved  1F1B over V stages per rank in groups of pp micro-batches (Megatron-LM's
//                interleaved schedule, Narayanan et al. SC'21); M a multiple of pp. Bubble
//                (pp-1)/(VM+pp-1); peak min(2(pp-r-1) + (V-1)pp + 1, VM).
//   zb-h1        1F1B with the backward split into the input gradient (I) and the weight
//                gradient (W), rank r's W's trailing its I's by r to fill the cool-down
//                (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024). Bubble
//                (pp-1)/(3M+pp-1); peak min(pp, M) on every rank: a pending W keeps its pair in
//                flight, so every rank holds what 1F1B's rank 0 holds (the paper's "same peak
//                memory as 1F1B" is this maximum; its W's hold less than a whole pair in practice).
//   zb-v         the V-shaped zero-bubble schedule of the same paper (two stages per rank);
//                M >= pp. Bubble (pp-1)/(6M+pp-1); peak min(2pp, M + r + 1).
//   dualpipev    DeepSeek-V3's DualPipe in its V-shaped single-copy form (deepseek-ai/DualPipe,
//                dualpipev.py): forward of one micro-batch beside the backward of another,
//                zero-bubble W's in the ramps; M >= 2pp. Bubble (pp-1)/(6M+pp-1) with the
//                overlapped forward-backward as an F then a B; peak 2pp + 1.
// (zb-v and dualpipev count half-size stages: their peaks hold pairs of L/(2pp) blocks.)
//
// Actions and what the executor does (src/parallel/pipeline.c):
//   F(mb, s)    forward of stage s on micro-batch mb. Input: the tokens (s = 0), the output of
//               F(mb, s-1) when that stage is on the same rank, else the message of a RECV_F
//               posted earlier on this rank.
//   B(mb, s)    backward of stage s: input and weight gradients. Needs F(mb, s) done and
//               d(output): from the loss (s = S-1; computed with F), from B/I(mb, s+1) on the
//               same rank, or from a RECV_B posted earlier on this rank.
//   I(mb, s)    the input-gradient half of B (zero bubble); its W(mb, s) comes later.
//   W(mb, s)    the weight-gradient half, after I(mb, s).
//   SEND_F(mb, s)  after F(mb, s): its output to the rank of stage s+1 (nonblocking; the
//               executor copies it out, so a send never waits for its receiver)
//   RECV_F(mb, s)  posts the receive of stage s's input from the rank of stage s-1
//               (nonblocking; F(mb, s) waits for the data)
//   SEND_B(mb, s)  after B/I(mb, s): d(input) to the rank of stage s-1
//   RECV_B(mb, s)  posts the receive of d(output of stage s) from the rank of stage s+1, after
//               F(mb, s) on this rank; B/I(mb, s) waits for it
// SEND_F(mb, s) meets RECV_F(mb, s+1); SEND_B(mb, s) meets RECV_B(mb, s-1). Stages on the same
// rank pass data without SEND/RECV. Between each ordered pair of ranks, the order of the
// sender's SENDs is the order of the receiver's RECV posts (FIFO matching, so a transport
// without tags works). The generated lists put each SEND right after its producer and each
// RECV as late as that order allows before its consumer.
//
// An (mb, s) is "in flight" on its rank from the start of F(mb, s) to the end of its B (or W):
// its activations are held that long. Each schedule promises a peak per rank (promised[r]);
// the executor sizes its activation slots by it.
#pragma once
#include "core/status.h"

#include <stdbool.h>
#include <stdio.h>

typedef enum {
    LOOM_PP_GPIPE, LOOM_PP_1F1B, LOOM_PP_INTERLEAVED, LOOM_PP_ZB_H1, LOOM_PP_ZB_V, LOOM_PP_DUALPIPEV,
    LOOM_PP_KINDS
} loom_pp_kind;

typedef enum {
    LOOM_PP_F, LOOM_PP_B, LOOM_PP_I, LOOM_PP_W,
    LOOM_PP_SEND_F, LOOM_PP_RECV_F, LOOM_PP_SEND_B, LOOM_PP_RECV_B,
} loom_pp_op;

typedef struct {
    loom_pp_op op;
    int mb, stage; // micro-batch 0..M-1, stage 0..S-1
    int peer;      // SEND/RECV: the pp rank at the other end; else -1
} loom_pp_action;

typedef struct {
    loom_pp_kind kind;
    int pp, V, S, M;          // ranks, stages per rank, stages (pp x V), micro-batches per step
    bool v_shape;             // zb-v, dualpipev: stage s < pp on rank s, else on rank 2pp-1-s
    int *count;               // (pp) actions of each rank
    loom_pp_action **actions; // (pp) each rank's list, in order
    int *promised;            // (pp) peak (mb, stage) pairs in flight on each rank
} loom_pp_schedule;

// "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev". Errors: LOOM_EINVAL naming the
// unknown name, listing the known ones.
loom_status loom_pp_kind_parse(const char *name, loom_pp_kind *kind);
const char *loom_pp_kind_name(loom_pp_kind kind);

// The action lists of schedule `kind` over pp ranks (>= 1), M micro-batches and V stages per rank
// (0: the schedule's own, 1 or 2; interleaved needs V >= 2). Errors (LOOM_EINVAL, one line
// naming the values and the fix): V given (not 0) with a schedule other than interleaved (or
// V = 2 with zb-v / dualpipev, which is accepted); fewer micro-batches than the schedule needs
// (interleaved: M a multiple of pp; dualpipev: M >= 2 pp, as its reference asserts; zb-v: M >= pp).
loom_status loom_pp_schedule_make(loom_pp_schedule **out, loom_pp_kind kind, int pp, int M, int V);
void loom_pp_schedule_free(loom_pp_schedule *s);
// The rank that holds stage s.
int loom_pp_stage_rank(const loom_pp_schedule *s, int stage);
// The stages rank r holds, ascending (V of them) into stages[V].
void loom_pp_rank_stages(const loom_pp_schedule *s, int rank, int *stages);
// The same for any placement: pp ranks with V stages each, V-shaped (v_shape: V is 2) or looped.
void loom_pp_placement(int pp, int V, bool v_shape, int rank, int *stages);

// Durations for the simulator (any unit): F, the input-gradient half I and the weight-gradient
// half W; a whole backward B takes I + W. Messages take `comm` (0: instantaneous).
typedef struct {
    double f, i, w, comm;
} loom_pp_costs;

typedef struct {
    double start, end;
    int action; // index into the rank's action list
} loom_pp_slot_time;

// The simulated run of a schedule.
typedef struct {
    double makespan;        // end of the last action of any rank
    double *busy;           // (pp) compute time of each rank
    double bubble;          // idle fraction over all ranks: 1 - sum(busy) / (pp x makespan)
    int *peak;              // (pp) peak (mb, stage) pairs in flight measured
    int *ncompute;          // (pp) compute actions of each rank
    loom_pp_slot_time **timeline; // (pp) start and end of each compute action of each rank
} loom_pp_sim;

// Runs the action lists with the given costs: each rank executes its list in order; a compute
// action starts when the rank is free and its inputs have arrived (the matching send's time +
// comm). Checks (LOOM_EINVAL with one line naming the rank, the action and what is wrong):
// every (mb, s) has exactly one F and either one B or one I and one W, all on the stage's rank;
// F precedes B/I precedes W; an action's inputs are produced (by a local action earlier in the
// list, or by a SEND matched by a RECV posted before the use); every SEND has its RECV (same mb,
// stage, direction and peers) and vice versa; FIFO order per ordered pair of ranks; no deadlock
// (a state where no rank can make progress); the measured peak in flight equals promised[r].
loom_status loom_pp_simulate(const loom_pp_schedule *s, const loom_pp_costs *costs, loom_pp_sim *out);
void loom_pp_sim_free(loom_pp_sim *sim);

// The bubble fraction of schedule s with unit costs (F = I = W = 1, comm 0): the schedule's
// theoretical bubble. Errors: those of loom_pp_simulate.
loom_status loom_pp_theoretical_bubble(const loom_pp_schedule *s, double *bubble);

// Prints the unit-cost timeline, one row per rank as in the papers' figures (each time unit one
// cell: the op letter F, B, I or W and the micro-batch number, stages after a rank's first
// marked), a legend, the bubble fraction and each rank's peak in flight.
// Errors: those of loom_pp_simulate.
loom_status loom_pp_print_timeline(const loom_pp_schedule *s, FILE *f);
