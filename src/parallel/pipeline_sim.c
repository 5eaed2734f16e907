// The simulator of pipeline schedules (pipeline_schedule.h): checks an action list against the
// rules, then runs it event by event (each rank in list order; a compute starts when its rank
// is free and its message has arrived), and prints the unit-cost timeline.
#include "parallel/pipeline_schedule.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *OP_NAMES[] = {"F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};

static const char *op_name(loom_pp_op op) {
    return op >= LOOM_PP_F && op <= LOOM_PP_RECV_B ? OP_NAMES[op] : "?";
}

// One error line: "pipeline schedule KIND: rank R action I (OP mb MB stage S): WHAT".
static loom_status sim_fail(const loom_pp_schedule *s, int r, int i, const loom_pp_action *x, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static loom_status sim_fail(const loom_pp_schedule *s, int r, int i, const loom_pp_action *x, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_EINVAL, "the action lists break a rule of parallel/pipeline_schedule.h",
                     "pipeline schedule %s: rank %d action %d (%s mb %d stage %d): %s", loom_pp_kind_name(s->kind), r,
                     i, op_name(x->op), x->mb, x->stage, what);
}

// Where each (mb, stage)'s actions sit in its rank's list (-1: not yet).
typedef struct {
    int f, b, i, w, recv_f, recv_b, send_f, send_b;
} pair_state;

typedef struct {
    const loom_pp_schedule *s;
    pair_state *st;     // (M, S)
    int **match_rank;   // RECV: the sending rank; else -1
    int **match_action; // RECV: the SEND's index in that rank's list
    double **sent_at;   // SEND: when it ran (-1: not yet)
    bool *pair_checked; // (pp, pp) FIFO order checked between the two ranks
} sim_ctx;

static pair_state *state_of(const sim_ctx *c, int mb, int stage) { return &c->st[mb * c->s->S + stage]; }

static bool is_compute(loom_pp_op op) { return op <= LOOM_PP_W; }

// The peer a SEND/RECV must name, or -1 when the stage has no such neighbour.
static int expected_peer(const loom_pp_schedule *s, const loom_pp_action *x) {
    int to = x->op == LOOM_PP_SEND_F || x->op == LOOM_PP_RECV_B ? x->stage + 1 : x->stage - 1;
    return to >= 0 && to < s->S ? loom_pp_stage_rank(s, to) : -1;
}

// The fields of action i of rank r, and its inputs (a local action earlier in the list or a
// RECV posted earlier); records it in the pair state and the in-flight count.
static loom_status check_action(sim_ctx *c, int r, int i, int *inflight, int *peak) {
    const loom_pp_schedule *s = c->s;
    const loom_pp_action *x = &s->actions[r][i];
    if (x->op < LOOM_PP_F || x->op > LOOM_PP_RECV_B) return sim_fail(s, r, i, x, "unknown op %d", (int)x->op);
    if (x->mb < 0 || x->mb >= s->M || x->stage < 0 || x->stage >= s->S)
        return sim_fail(s, r, i, x, "out of range (%d micro-batches, %d stages)", s->M, s->S);
    if (loom_pp_stage_rank(s, x->stage) != r)
        return sim_fail(s, r, i, x, "stage %d is on rank %d", x->stage, loom_pp_stage_rank(s, x->stage));
    if (!is_compute(x->op)) {
        int peer = expected_peer(s, x);
        if (peer < 0) return sim_fail(s, r, i, x, "no neighbouring stage in that direction");
        if (peer == r) return sim_fail(s, r, i, x, "the neighbouring stage is on the same rank: nothing to send");
        if (x->peer != peer) return sim_fail(s, r, i, x, "peer %d, but the neighbouring stage is on rank %d", x->peer, peer);
    }
    pair_state *p = state_of(c, x->mb, x->stage);
    bool up_local = x->stage > 0 && loom_pp_stage_rank(s, x->stage - 1) == r;
    bool down_local = x->stage < s->S - 1 && loom_pp_stage_rank(s, x->stage + 1) == r;
    switch (x->op) {
    case LOOM_PP_F:
        if (p->f >= 0) return sim_fail(s, r, i, x, "a second F (the first is action %d)", p->f);
        if (up_local && state_of(c, x->mb, x->stage - 1)->f < 0)
            return sim_fail(s, r, i, x, "its input, F of stage %d on this rank, has not run", x->stage - 1);
        if (x->stage > 0 && !up_local && p->recv_f < 0) return sim_fail(s, r, i, x, "no RECV_F posted before it");
        p->f = i;
        if (++*inflight > *peak) *peak = *inflight;
        return LOOM_OK;
    case LOOM_PP_B:
    case LOOM_PP_I: {
        if (p->f < 0) return sim_fail(s, r, i, x, "before its F");
        if (p->b >= 0 || p->i >= 0) return sim_fail(s, r, i, x, "a second backward (action %d)", p->b >= 0 ? p->b : p->i);
        const pair_state *q = x->stage < s->S - 1 ? state_of(c, x->mb, x->stage + 1) : NULL;
        if (down_local && q->b < 0 && q->i < 0)
            return sim_fail(s, r, i, x, "its output gradient, the backward of stage %d on this rank, has not run",
                            x->stage + 1);
        if (q && !down_local && p->recv_b < 0) return sim_fail(s, r, i, x, "no RECV_B posted before it");
        if (x->op == LOOM_PP_B) {
            p->b = i;
            --*inflight;
        } else {
            p->i = i;
        }
        return LOOM_OK;
    }
    case LOOM_PP_W:
        if (p->i < 0) return sim_fail(s, r, i, x, p->b >= 0 ? "after a full B" : "before its I");
        if (p->w >= 0) return sim_fail(s, r, i, x, "a second W (action %d)", p->w);
        p->w = i;
        --*inflight;
        return LOOM_OK;
    case LOOM_PP_SEND_F:
        if (p->f < 0) return sim_fail(s, r, i, x, "before its F");
        if (p->send_f >= 0) return sim_fail(s, r, i, x, "sent twice (action %d)", p->send_f);
        p->send_f = i;
        return LOOM_OK;
    case LOOM_PP_SEND_B:
        if (p->b < 0 && p->i < 0) return sim_fail(s, r, i, x, "before its B or I");
        if (p->send_b >= 0) return sim_fail(s, r, i, x, "sent twice (action %d)", p->send_b);
        p->send_b = i;
        return LOOM_OK;
    case LOOM_PP_RECV_F:
        if (p->recv_f >= 0) return sim_fail(s, r, i, x, "posted twice (action %d)", p->recv_f);
        p->recv_f = i;
        return LOOM_OK;
    default: // RECV_B
        if (p->f < 0) return sim_fail(s, r, i, x, "posted before F of the same micro-batch and stage");
        if (p->recv_b >= 0) return sim_fail(s, r, i, x, "posted twice (action %d)", p->recv_b);
        p->recv_b = i;
        return LOOM_OK;
    }
}

// Every (mb, stage) has its F and one B, or one I and one W.
static loom_status check_complete(const sim_ctx *c) {
    const loom_pp_schedule *s = c->s;
    for (int mb = 0; mb < s->M; mb++)
        for (int st = 0; st < s->S; st++) {
            const pair_state *p = state_of(c, mb, st);
            int r = loom_pp_stage_rank(s, st), end = s->count[r];
            loom_pp_action x = {LOOM_PP_F, mb, st, -1};
            if (p->f < 0) return sim_fail(s, r, end, &x, "missing: the list ends without it");
            x.op = LOOM_PP_B;
            if (p->b < 0 && p->i < 0) return sim_fail(s, r, end, &x, "missing: no B or I");
            x.op = LOOM_PP_W;
            if (p->i >= 0 && p->w < 0) return sim_fail(s, r, end, &x, "missing: the I at action %d has no W", p->i);
        }
    return LOOM_OK;
}

// The k-th SEND from a to b meets the k-th RECV that b posts from a (FIFO): same micro-batch,
// direction and stage pair. Records the matches.
static loom_status check_fifo(sim_ctx *c, int a, int b) {
    const loom_pp_schedule *s = c->s;
    const loom_pp_action *sa = s->actions[a], *rb = s->actions[b];
    int i = 0, j = 0;
    for (;;) {
        while (i < s->count[a] && !((sa[i].op == LOOM_PP_SEND_F || sa[i].op == LOOM_PP_SEND_B) && sa[i].peer == b)) i++;
        while (j < s->count[b] && !((rb[j].op == LOOM_PP_RECV_F || rb[j].op == LOOM_PP_RECV_B) && rb[j].peer == a)) j++;
        if (i == s->count[a] && j == s->count[b]) return LOOM_OK;
        if (j == s->count[b]) return sim_fail(s, a, i, &sa[i], "rank %d posts no RECV for it", b);
        if (i == s->count[a]) return sim_fail(s, b, j, &rb[j], "rank %d sends nothing more to match it", a);
        bool fwd = sa[i].op == LOOM_PP_SEND_F;
        loom_pp_action want = {fwd ? LOOM_PP_RECV_F : LOOM_PP_RECV_B, sa[i].mb, sa[i].stage + (fwd ? 1 : -1), a};
        if (rb[j].op != want.op || rb[j].mb != want.mb || rb[j].stage != want.stage)
            return sim_fail(s, b, j, &rb[j], "FIFO-matches rank %d's %s mb %d stage %d (action %d): the orders differ", a,
                            op_name(sa[i].op), sa[i].mb, sa[i].stage, i);
        c->match_rank[b][j] = a;
        c->match_action[b][j] = i;
        i++;
        j++;
    }
}

// The index of the RECV that compute action x on rank r waits for, or -1 (local input).
static int waits_on(const sim_ctx *c, int r, const loom_pp_action *x) {
    const loom_pp_schedule *s = c->s;
    const pair_state *p = state_of(c, x->mb, x->stage);
    if (x->op == LOOM_PP_F && x->stage > 0 && loom_pp_stage_rank(s, x->stage - 1) != r) return p->recv_f;
    if ((x->op == LOOM_PP_B || x->op == LOOM_PP_I) && x->stage < s->S - 1 && loom_pp_stage_rank(s, x->stage + 1) != r)
        return p->recv_b;
    return -1;
}

static double duration(const loom_pp_costs *k, loom_pp_op op) {
    return op == LOOM_PP_F ? k->f : op == LOOM_PP_B ? k->i + k->w : op == LOOM_PP_I ? k->i : k->w;
}

// Runs the lists: each rank goes as far as it can; a round in which none moves is a deadlock.
static loom_status run(sim_ctx *c, const loom_pp_costs *k, loom_pp_sim *out) {
    const loom_pp_schedule *s = c->s;
    int *pc = loom_xcalloc((size_t)s->pp, sizeof *pc);
    double *clock = loom_xcalloc((size_t)s->pp, sizeof *clock);
    loom_status st = LOOM_OK;
    for (bool done = false; !done && st == LOOM_OK;) {
        bool moved = false;
        done = true;
        for (int r = 0; r < s->pp; r++) {
            for (; pc[r] < s->count[r]; pc[r]++, moved = true) {
                const loom_pp_action *x = &s->actions[r][pc[r]];
                if (x->op == LOOM_PP_SEND_F || x->op == LOOM_PP_SEND_B) c->sent_at[r][pc[r]] = clock[r];
                if (!is_compute(x->op)) continue;
                double start = clock[r];
                int j = waits_on(c, r, x);
                if (j >= 0) {
                    double sent = c->sent_at[c->match_rank[r][j]][c->match_action[r][j]];
                    if (sent < 0) break;
                    if (sent + k->comm > start) start = sent + k->comm;
                }
                double d = duration(k, x->op);
                out->timeline[r][out->ncompute[r]++] = (loom_pp_slot_time){start, start + d, pc[r]};
                out->busy[r] += d;
                clock[r] = start + d;
            }
            done = done && pc[r] == s->count[r];
        }
        if (!done && !moved)
            for (int r = 0; r < s->pp && st == LOOM_OK; r++) {
                if (pc[r] == s->count[r]) continue;
                const loom_pp_action *x = &s->actions[r][pc[r]];
                int j = waits_on(c, r, x), a = c->match_rank[r][j], i = c->match_action[r][j];
                st = sim_fail(s, r, pc[r], x, "waits for rank %d's %s mb %d stage %d (action %d), which never runs: deadlock",
                              a, op_name(s->actions[a][i].op), s->actions[a][i].mb, s->actions[a][i].stage, i);
            }
    }
    for (int r = 0; r < s->pp; r++)
        if (clock[r] > out->makespan) out->makespan = clock[r];
    free(pc);
    free(clock);
    return st;
}

static loom_status simulate(sim_ctx *c, const loom_pp_costs *k, loom_pp_sim *out) {
    const loom_pp_schedule *s = c->s;
    for (int r = 0; r < s->pp; r++) {
        int inflight = 0;
        for (int i = 0; i < s->count[r]; i++) LOOM_TRY(check_action(c, r, i, &inflight, &out->peak[r]));
    }
    LOOM_TRY(check_complete(c));
    // messages only pass between ranks of neighbouring stages (check_action checked each peer)
    for (int st = 0; st + 1 < s->S; st++) {
        int a = loom_pp_stage_rank(s, st), b = loom_pp_stage_rank(s, st + 1);
        if (a != b && !c->pair_checked[a * s->pp + b]) {
            c->pair_checked[a * s->pp + b] = c->pair_checked[b * s->pp + a] = true;
            LOOM_TRY(check_fifo(c, a, b));
            LOOM_TRY(check_fifo(c, b, a));
        }
    }
    LOOM_TRY(run(c, k, out));
    for (int r = 0; r < s->pp; r++) {
        if (out->peak[r] == s->promised[r]) continue;
        // name the F where the count first passes the promise, or where it peaks below it
        int at = out->peak[r] > s->promised[r] ? s->promised[r] + 1 : out->peak[r];
        for (int i = 0, n = 0; i < s->count[r]; i++) {
            const loom_pp_action *y = &s->actions[r][i];
            n += y->op == LOOM_PP_F ? 1 : y->op == LOOM_PP_B || y->op == LOOM_PP_W ? -1 : 0;
            if (y->op == LOOM_PP_F && n == at)
                return sim_fail(s, r, i, y, "%d (mb, stage) pairs in flight at the peak, but the schedule promises %d",
                                out->peak[r], s->promised[r]);
        }
    }
    double busy = 0;
    for (int r = 0; r < s->pp; r++) busy += out->busy[r];
    out->bubble = out->makespan > 0 ? 1 - busy / (s->pp * out->makespan) : 0;
    return LOOM_OK;
}

loom_status loom_pp_simulate(const loom_pp_schedule *s, const loom_pp_costs *costs, loom_pp_sim *out) {
    memset(out, 0, sizeof *out);
    if (!(costs->f > 0 && costs->i > 0 && costs->w > 0 && costs->comm >= 0))
        return loom_fail(LOOM_EINVAL, "durations are positive, comm 0 or more",
                         "pipeline costs f %g i %g w %g comm %g", costs->f, costs->i, costs->w, costs->comm);
    int pp = s->pp;
    sim_ctx c = {.s = s};
    c.st = loom_xmalloc((size_t)s->M * s->S * sizeof *c.st);
    memset(c.st, 0xff, (size_t)s->M * s->S * sizeof *c.st); // every index -1
    c.match_rank = loom_xcalloc((size_t)pp, sizeof *c.match_rank);
    c.match_action = loom_xcalloc((size_t)pp, sizeof *c.match_action);
    c.sent_at = loom_xcalloc((size_t)pp, sizeof *c.sent_at);
    c.pair_checked = loom_xcalloc((size_t)pp * pp, sizeof *c.pair_checked);
    out->busy = loom_xcalloc((size_t)pp, sizeof *out->busy);
    out->peak = loom_xcalloc((size_t)pp, sizeof *out->peak);
    out->ncompute = loom_xcalloc((size_t)pp, sizeof *out->ncompute);
    out->timeline = loom_xcalloc((size_t)pp, sizeof *out->timeline);
    size_t total = 0;
    for (int r = 0; r < pp; r++) total += (size_t)s->count[r];
    out->timeline[0] = loom_xmalloc(total * sizeof(loom_pp_slot_time)); // one block; see loom_pp_sim_free
    for (int r = 0; r < pp; r++) {
        size_t n = (size_t)s->count[r];
        if (r > 0) out->timeline[r] = out->timeline[r - 1] + s->count[r - 1];
        c.match_rank[r] = loom_xmalloc(n * sizeof(int));
        c.match_action[r] = loom_xmalloc(n * sizeof(int));
        c.sent_at[r] = loom_xmalloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) {
            c.match_rank[r][i] = c.match_action[r][i] = -1;
            c.sent_at[r][i] = -1;
        }
    }
    loom_status st = simulate(&c, costs, out);
    for (int r = 0; r < pp; r++) {
        free(c.match_rank[r]);
        free(c.match_action[r]);
        free(c.sent_at[r]);
    }
    free(c.match_rank);
    free(c.match_action);
    free(c.sent_at);
    free(c.pair_checked);
    free(c.st);
    if (st != LOOM_OK) loom_pp_sim_free(out);
    return st;
}

void loom_pp_sim_free(loom_pp_sim *sim) {
    if (sim->timeline) free(sim->timeline[0]);
    free(sim->timeline);
    free(sim->busy);
    free(sim->peak);
    free(sim->ncompute);
    memset(sim, 0, sizeof *sim);
}

loom_status loom_pp_theoretical_bubble(const loom_pp_schedule *s, double *bubble) {
    loom_pp_sim sim;
    LOOM_TRY(loom_pp_simulate(s, &(loom_pp_costs){1, 1, 1, 0}, &sim));
    *bubble = sim.bubble;
    loom_pp_sim_free(&sim);
    return LOOM_OK;
}

// ---- the timeline ----

// "F3", "b12" (a rank's later stage), "f3/2" (interleaved chunk 2 of V > 2).
static void cell_label(const loom_pp_schedule *s, const loom_pp_action *x, char *out, size_t cap) {
    int chunk = s->v_shape ? x->stage >= s->pp : x->stage / s->pp;
    char letter = "FBIW"[x->op];
    if (chunk > 0) letter = (char)(letter - 'A' + 'a');
    if (chunk > 0 && s->V > 2)
        snprintf(out, cap, "%c%d/%d", letter, x->mb, chunk);
    else
        snprintf(out, cap, "%c%d", letter, x->mb);
}

loom_status loom_pp_print_timeline(const loom_pp_schedule *s, FILE *f) {
    loom_pp_sim sim;
    LOOM_TRY(loom_pp_simulate(s, &(loom_pp_costs){1, 1, 1, 0}, &sim));
    int T = (int)lround(sim.makespan), width = 3;
    char label[32];
    for (int r = 0; r < s->pp; r++)
        for (int k = 0; k < sim.ncompute[r]; k++) {
            cell_label(s, &s->actions[r][sim.timeline[r][k].action], label, sizeof label);
            if ((int)strlen(label) + 1 > width) width = (int)strlen(label) + 1;
        }
    fprintf(f, "pipeline schedule %s: pp %d, %d micro-batches, %d stages (%d per rank)\n", loom_pp_kind_name(s->kind),
            s->pp, s->M, s->S, s->V);
    fprintf(f, "%-8s", "time");
    for (int t = 0; t < T; t += 5) fprintf(f, "%-*d", t + 5 <= T ? 5 * width : (T - t) * width, t);
    fprintf(f, "\n");
    double idle = 0;
    for (int r = 0; r < s->pp; r++) {
        fprintf(f, "rank %-3d", r);
        int t = 0;
        for (int k = 0; k < sim.ncompute[r]; k++) {
            const loom_pp_slot_time *slot = &sim.timeline[r][k];
            for (; t < (int)lround(slot->start); t++) fprintf(f, "%-*s", width, ".");
            cell_label(s, &s->actions[r][slot->action], label, sizeof label);
            for (; t < (int)lround(slot->end); t++) fprintf(f, "%-*s", width, label);
        }
        for (; t < T; t++) fprintf(f, "%-*s", width, ".");
        fprintf(f, "\n");
        idle += sim.makespan - sim.busy[r];
    }
    fprintf(f, "legend: F forward, B backward (I + W, 2 cells), I input gradient, W weight gradient, then the "
               "micro-batch; . idle\n");
    if (s->v_shape)
        fprintf(f, "        lowercase: the rank's second stage (rank r holds stages r and %d-r)\n", 2 * s->pp - 1);
    else if (s->V > 1)
        fprintf(f, "        lowercase: the rank's later stages (rank r holds stages r + c x %d%s)\n", s->pp,
                s->V > 2 ? "; /c: chunk c" : "");
    fprintf(f, "bubble: %.6f (%.0f idle of %.0f rank-time units)\n", sim.bubble, idle, s->pp * sim.makespan);
    fprintf(f, "peak in flight per rank:");
    for (int r = 0; r < s->pp; r++) fprintf(f, " %d", sim.peak[r]);
    fprintf(f, "\n");
    loom_pp_sim_free(&sim);
    return LOOM_OK;
}
