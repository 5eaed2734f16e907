// Pipeline schedules as per-rank action lists; see pipeline_schedule.h. Each schedule is first
// generated as each rank's compute actions in order (F, B, I, W); add_comms then inserts the
// SENDs right after their producers and the RECVs before their consumers, posted in the order
// the sender sends (FIFO per ordered pair of ranks). The simulator is in pipeline_sim.c.
#include "parallel/pipeline_schedule.h"

#include <stdlib.h>
#include <string.h>

static const char *KIND_NAMES[LOOM_PP_KINDS] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"};

loom_status loom_pp_kind_parse(const char *name, loom_pp_kind *kind) {
    for (int k = 0; k < LOOM_PP_KINDS; k++)
        if (strcmp(name, KIND_NAMES[k]) == 0) {
            *kind = (loom_pp_kind)k;
            return LOOM_OK;
        }
    return loom_fail(LOOM_EINVAL, "gpipe, 1f1b, interleaved, zb-h1, zb-v or dualpipev",
                     "unknown pipeline schedule '%s'", name);
}

const char *loom_pp_kind_name(loom_pp_kind kind) {
    return kind >= 0 && kind < LOOM_PP_KINDS ? KIND_NAMES[kind] : "unknown";
}

int loom_pp_stage_rank(const loom_pp_schedule *s, int stage) {
    if (s->v_shape) return stage < s->pp ? stage : 2 * s->pp - 1 - stage;
    return stage % s->pp;
}

void loom_pp_placement(int pp, int V, bool v_shape, int rank, int *stages) {
    if (v_shape) {
        stages[0] = rank;
        stages[1] = 2 * pp - 1 - rank;
        return;
    }
    for (int c = 0; c < V; c++) stages[c] = c * pp + rank;
}

void loom_pp_rank_stages(const loom_pp_schedule *s, int rank, int *stages) {
    loom_pp_placement(s->pp, s->V, s->v_shape, rank, stages);
}

// ---- a growing action list ----
typedef struct {
    loom_pp_action *a;
    int n, cap;
} action_list;

static void push(action_list *l, loom_pp_op op, int mb, int stage, int peer) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->a = realloc(l->a, (size_t)l->cap * sizeof *l->a);
        LOOM_CHECK(l->a);
    }
    l->a[l->n++] = (loom_pp_action){op, mb, stage, peer};
}

static void compute(action_list *l, loom_pp_op op, int mb, int stage) { push(l, op, mb, stage, -1); }

static int imin(int a, int b) { return a < b ? a : b; }

// ---- compute lists of each schedule (rank r) ----

// GPipe: every forward, then every backward. Peak: M.
static void gen_gpipe(const loom_pp_schedule *s, int r, action_list *l) {
    for (int mb = 0; mb < s->M; mb++) compute(l, LOOM_PP_F, mb, r);
    for (int mb = 0; mb < s->M; mb++) compute(l, LOOM_PP_B, mb, r);
}

// PipeDream-Flush 1F1B: min(pp-r-1, M) warm-up forwards, then one forward one backward, then
// the remaining backwards. Peak: min(pp - r, M).
static void gen_1f1b(const loom_pp_schedule *s, int r, action_list *l) {
    int M = s->M, warm = imin(s->pp - r - 1, M);
    for (int mb = 0; mb < warm; mb++) compute(l, LOOM_PP_F, mb, r);
    for (int k = 0; k < M - warm; k++) {
        compute(l, LOOM_PP_F, warm + k, r);
        compute(l, LOOM_PP_B, k, r);
    }
    for (int mb = M - warm; mb < M; mb++) compute(l, LOOM_PP_B, mb, r);
}

// Megatron-LM's interleaved 1F1B: the i-th forward of a rank runs chunk (i / pp) % V on
// micro-batch (i / (pp V)) pp + i % pp, the i-th backward the same with the chunks reversed;
// warm-up min(2 (pp-r-1) + (V-1) pp, M V) forwards. Peak: min(2 (pp-r-1) + (V-1) pp + 1, M V).
static void interleaved_op(const loom_pp_schedule *s, int r, int i, loom_pp_op op, action_list *l) {
    int pp = s->pp, chunk = (i / pp) % s->V;
    if (op != LOOM_PP_F) chunk = s->V - 1 - chunk;
    compute(l, op, (i / (pp * s->V)) * pp + i % pp, chunk * pp + r);
}

static void gen_interleaved(const loom_pp_schedule *s, int r, action_list *l) {
    int total = s->M * s->V, warm = imin(2 * (s->pp - r - 1) + (s->V - 1) * s->pp, total);
    for (int i = 0; i < warm; i++) interleaved_op(s, r, i, LOOM_PP_F, l);
    for (int k = 0; k < total - warm; k++) {
        interleaved_op(s, r, warm + k, LOOM_PP_F, l);
        interleaved_op(s, r, k, LOOM_PP_B, l);
    }
    for (int k = total - warm; k < total; k++) interleaved_op(s, r, k, LOOM_PP_B, l);
}

// ZB-H1 (Qi et al. 2024, as torch.distributed.pipelining's zero-bubble 1F1B builds it): 1F1B
// with each backward an I, and rank r's W's trailing its I's by r (after I(k) comes W(k-r)), the
// rest after the last I. The I's then reach rank 0 as fast as they can and the W's fill the
// cool-down: bubble (pp-1)/(3M+pp-1) with unit costs (trailing by r-1 falls short of it).
// A pending W keeps its (mb, stage) in flight: peak min(pp, M) on every rank.
static void gen_zbh1(const loom_pp_schedule *s, int r, action_list *l) {
    int M = s->M, warm = imin(s->pp - r - 1, M), nw = 0;
    for (int mb = 0; mb < warm; mb++) compute(l, LOOM_PP_F, mb, r);
    for (int k = 0; k < M; k++) {
        if (warm + k < M) compute(l, LOOM_PP_F, warm + k, r);
        compute(l, LOOM_PP_I, k, r);
        if (k >= r) compute(l, LOOM_PP_W, nw++, r);
    }
    while (nw < M) compute(l, LOOM_PP_W, nw++, r);
}

// ZB-V (Qi et al. 2024, section 6; the construction of torch's ScheduleZBVZeroBubble): rank r
// holds stages r (chunk 0) and 2pp-1-r (chunk 1). Built for n = max(M, 2pp-1) micro-batches,
// the actions of micro-batches >= M then dropped:
//   2(pp-r)-1 F0; r x (F1 F0); pp-r x (F1 I1 W1); while forwards remain: F0 I0 W0 F1 I1 W1;
//   r x (I0 I1); pp-r x (I0 W0); the remaining W1's, then W0's.
// One change for M < 2pp-1: in the rounds whose forwards were all dropped, the W1 moves to the
// end (torch's order leaves idle time there and ties zb-h1 at M = pp). Bubble with unit costs:
// (pp-1)/(6M+pp-1), every M >= pp. Peak: min(2pp, M + r + 1).
static void zbv_emit(action_list *l, int M, loom_pp_op op, int *mb, int stage) {
    if (*mb < M) compute(l, op, *mb, stage);
    (*mb)++;
}

static void gen_zbv(const loom_pp_schedule *s, int r, action_list *l) {
    int pp = s->pp, M = s->M, n = M > 2 * pp - 1 ? M : 2 * pp - 1;
    int s0 = r, s1 = 2 * pp - 1 - r;
    int f0 = 0, f1 = 0, i0 = 0, i1 = 0, w0 = 0, w1 = 0;
    for (int k = 0; k < 2 * (pp - r) - 1; k++) zbv_emit(l, M, LOOM_PP_F, &f0, s0);
    for (int k = 0; k < r; k++) {
        zbv_emit(l, M, LOOM_PP_F, &f1, s1);
        zbv_emit(l, M, LOOM_PP_F, &f0, s0);
    }
    for (int k = 0; k < pp - r; k++) {
        zbv_emit(l, M, LOOM_PP_F, &f1, s1);
        zbv_emit(l, M, LOOM_PP_I, &i1, s1);
        zbv_emit(l, M, LOOM_PP_W, &w1, s1);
    }
    while (f1 < f0 || f0 < n) {
        bool past = f1 >= M; // a round of dropped forwards: its W1 waits for the end
        if (f0 < n) zbv_emit(l, M, LOOM_PP_F, &f0, s0);
        zbv_emit(l, M, LOOM_PP_I, &i0, s0);
        zbv_emit(l, M, LOOM_PP_W, &w0, s0);
        zbv_emit(l, M, LOOM_PP_F, &f1, s1);
        zbv_emit(l, M, LOOM_PP_I, &i1, s1);
        if (!past) zbv_emit(l, M, LOOM_PP_W, &w1, s1);
    }
    for (int k = 0; k < r; k++) {
        zbv_emit(l, M, LOOM_PP_I, &i0, s0);
        zbv_emit(l, M, LOOM_PP_I, &i1, s1);
    }
    for (int k = 0; k < pp - r; k++) {
        zbv_emit(l, M, LOOM_PP_I, &i0, s0);
        zbv_emit(l, M, LOOM_PP_W, &w0, s0);
    }
    while (w1 < i1) zbv_emit(l, M, LOOM_PP_W, &w1, s1);
    while (w0 < i0) zbv_emit(l, M, LOOM_PP_W, &w0, s0);
}

// DualPipeV (deepseek-ai/DualPipe, dualpipev.py): rank r holds chunk 0 = stage r and chunk 1 =
// stage 2pp-1-r; each chunk runs its micro-batches in order. A zero-bubble backward is an I
// whose W joins a FIFO queue, popped by the W steps; an overlapped forward-backward is the F
// then the B here. Needs M >= 2pp (the reference's assertion). Bubble with unit costs:
// (pp-1)/(6M+pp-1). Peak: 2pp + 1 on every rank.
typedef struct {
    action_list *l;
    int stage[2], f[2], b[2];  // each chunk's stage and next forward and backward micro-batch
    loom_pp_action *wq;        // the W's of the zero-bubble backwards, oldest at wq_head
    int wq_head, wq_tail;
} dpv_state;

static void dpv_f(dpv_state *d, int c) { compute(d->l, LOOM_PP_F, d->f[c]++, d->stage[c]); }

static void dpv_b(dpv_state *d, int c, bool zb) {
    int mb = d->b[c]++;
    compute(d->l, zb ? LOOM_PP_I : LOOM_PP_B, mb, d->stage[c]);
    if (zb) d->wq[d->wq_tail++] = (loom_pp_action){LOOM_PP_W, mb, d->stage[c], -1};
}

static void dpv_w(dpv_state *d) {
    LOOM_CHECK(d->wq_head < d->wq_tail);
    const loom_pp_action *w = &d->wq[d->wq_head++];
    compute(d->l, LOOM_PP_W, w->mb, w->stage);
}

static void gen_dualpipev(const loom_pp_schedule *s, int r, action_list *l) {
    int pp = s->pp, M = s->M;
    dpv_state d = {.l = l, .stage = {r, 2 * pp - 1 - r}};
    d.wq = loom_xmalloc((size_t)2 * M * sizeof *d.wq);
    for (int i = 0; i < 2 * (pp - r - 1); i++) dpv_f(&d, 0); // 1: nF0
    for (int i = 0; i < r + 1; i++) {                        // 2: nF0F1
        dpv_f(&d, 0);
        dpv_f(&d, 1);
    }
    for (int i = 0; i < pp - r - 1; i++) { // 3: nB1W1F1, zero bubble
        dpv_b(&d, 1, true);
        dpv_w(&d);
        dpv_f(&d, 1);
    }
    for (int i = 0; i < M - 2 * pp + r + 1; i++) { // 4: nF0B1F1B0
        dpv_f(&d, 0);
        dpv_b(&d, 1, false);
        dpv_f(&d, 1);
        dpv_b(&d, 0, false);
    }
    for (int i = 0; i < pp - r - 1; i++) { // 5: nB1F1B0
        dpv_b(&d, 1, false);
        dpv_f(&d, 1);
        dpv_b(&d, 0, false);
    }
    bool zb = false;
    for (int i = 0; i < r + 1; i++) { // 6: nB1B0, the second half zero bubble
        if (i == (r + 1) / 2 && r % 2 == 1) zb = true;
        dpv_b(&d, 1, zb);
        if (i == (r + 1) / 2 && r % 2 == 0) zb = true;
        dpv_b(&d, 0, zb);
    }
    for (int i = 0; i < pp - r - 1; i++) { // 7: nWB0, zero bubble
        dpv_w(&d);
        dpv_b(&d, 0, true);
    }
    for (int i = 0; i < r + 1; i++) dpv_w(&d); // 8: nW
    LOOM_CHECK(d.wq_head == d.wq_tail);
    free(d.wq);
}

// ---- communication ----

// The RECV (op, mb, stage on the receiver) that the message of compute action x on rank a
// needs, with the receiving rank; false when x sends nothing (a stage's neighbour on the same
// rank, or the pipeline's ends).
static bool message_of(const loom_pp_schedule *s, int a, const loom_pp_action *x, loom_pp_action *recv) {
    int to;
    if (x->op == LOOM_PP_F && x->stage < s->S - 1) {
        to = loom_pp_stage_rank(s, x->stage + 1);
        *recv = (loom_pp_action){LOOM_PP_RECV_F, x->mb, x->stage + 1, a};
    } else if ((x->op == LOOM_PP_B || x->op == LOOM_PP_I) && x->stage > 0) {
        to = loom_pp_stage_rank(s, x->stage - 1);
        *recv = (loom_pp_action){LOOM_PP_RECV_B, x->mb, x->stage - 1, a};
    } else {
        return false;
    }
    return to != a;
}

typedef struct {
    int pos, peer, seq; // posted before compute action pos; seq: the sender's send order
    loom_pp_action a;
} recv_slot;

static int recv_slot_cmp(const void *x, const void *y) {
    const recv_slot *p = x, *q = y;
    if (p->pos != q->pos) return p->pos < q->pos ? -1 : 1;
    if (p->peer != q->peer) return p->peer < q->peer ? -1 : 1;
    return (p->seq > q->seq) - (p->seq < q->seq);
}

// Rank b's final list from the compute lists: each SEND right after its producer; each RECV
// before its consumer, moved earlier where needed so that the RECVs from a peer are posted in
// the order that peer sends (idx: each (mb, stage)'s F and B/I index in its rank's list).
static void add_comms(loom_pp_schedule *s, const action_list *comp, const int *idx_f, const int *idx_b,
                      int b) {
    int n = 0;
    recv_slot *slots = loom_xmalloc((size_t)2 * s->M * s->S * sizeof *slots); // one per F and B/I at most
    for (int a = 0; a < s->pp; a++) {
        if (a == b) continue;
        int first = n;
        for (int k = 0; k < comp[a].n; k++) {
            loom_pp_action r;
            if (!message_of(s, a, &comp[a].a[k], &r) || loom_pp_stage_rank(s, r.stage) != b) continue;
            const int *idx = r.op == LOOM_PP_RECV_F ? idx_f : idx_b;
            slots[n] = (recv_slot){idx[r.mb * s->S + r.stage], a, n - first, r};
            n++;
        }
        for (int k = n - 2; k >= first; k--)
            if (slots[k].pos > slots[k + 1].pos) slots[k].pos = slots[k + 1].pos;
    }
    if (n) qsort(slots, (size_t)n, sizeof *slots, recv_slot_cmp);
    action_list out = {0};
    for (int i = 0, j = 0; i < comp[b].n; i++) {
        for (; j < n && slots[j].pos == i; j++) push(&out, slots[j].a.op, slots[j].a.mb, slots[j].a.stage, slots[j].peer);
        const loom_pp_action *x = &comp[b].a[i];
        push(&out, x->op, x->mb, x->stage, -1);
        loom_pp_action r;
        if (message_of(s, b, x, &r))
            push(&out, r.op == LOOM_PP_RECV_F ? LOOM_PP_SEND_F : LOOM_PP_SEND_B, x->mb, x->stage,
                 loom_pp_stage_rank(s, r.stage));
    }
    free(slots);
    s->actions[b] = out.a;
    s->count[b] = out.n;
}

// ---- the schedule ----

// The promised peak of (mb, stage) pairs in flight on rank r (the formulas beside each
// generator).
static int promise(const loom_pp_schedule *s, int r) {
    int pp = s->pp, M = s->M;
    switch (s->kind) {
    case LOOM_PP_GPIPE: return M;
    case LOOM_PP_1F1B: return imin(pp - r, M);
    case LOOM_PP_INTERLEAVED: return imin(2 * (pp - r - 1) + (s->V - 1) * pp + 1, M * s->V);
    case LOOM_PP_ZB_H1: return imin(pp, M);
    case LOOM_PP_ZB_V: return imin(2 * pp, M + r + 1);
    default: return 2 * pp + 1; // dualpipev
    }
}

static loom_status check_args(loom_pp_kind kind, int pp, int M, int V) {
    const char *name = loom_pp_kind_name(kind);
    if (kind < 0 || kind >= LOOM_PP_KINDS)
        return loom_fail(LOOM_EINVAL, "gpipe, 1f1b, interleaved, zb-h1, zb-v or dualpipev",
                         "unknown pipeline schedule %d", (int)kind);
    if (pp < 1) return loom_fail(LOOM_EINVAL, "use --pp 1 or more", "--pp-schedule %s: --pp %d", name, pp);
    if (M < 1)
        return loom_fail(LOOM_EINVAL, "use 1 or more micro-batches", "--pp-schedule %s: %d micro-batches", name, M);
    bool v_shape = kind == LOOM_PP_ZB_V || kind == LOOM_PP_DUALPIPEV;
    if (kind == LOOM_PP_INTERLEAVED && V < 2)
        return loom_fail(LOOM_EINVAL, "use --virtual-stages 2 or more",
                         "--pp-schedule interleaved needs --virtual-stages 2 or more, got %d", V);
    if (v_shape && V != 0 && V != 2)
        return loom_fail(LOOM_EINVAL, "leave --virtual-stages out",
                         "--pp-schedule %s has 2 stages per rank, not --virtual-stages %d", name, V);
    if (!v_shape && kind != LOOM_PP_INTERLEAVED && V != 0)
        return loom_fail(LOOM_EINVAL, "leave --virtual-stages out, or use --pp-schedule interleaved",
                         "--virtual-stages %d is for the interleaved schedule, not --pp-schedule %s", V, name);
    if (kind == LOOM_PP_INTERLEAVED && M % pp != 0)
        return loom_fail(LOOM_EINVAL, "use a multiple of --pp micro-batches",
                         "--pp-schedule interleaved needs the micro-batches to be a multiple of --pp %d, got %d", pp, M);
    if (kind == LOOM_PP_ZB_V && M < pp)
        return loom_fail(LOOM_EINVAL, "use --pp micro-batches or more",
                         "--pp-schedule zb-v needs at least --pp %d micro-batches, got %d", pp, M);
    if (kind == LOOM_PP_DUALPIPEV && M < 2 * pp)
        return loom_fail(LOOM_EINVAL, "use 2 x --pp micro-batches or more",
                         "--pp-schedule dualpipev needs at least 2 x --pp = %d micro-batches, got %d", 2 * pp, M);
    return LOOM_OK;
}

loom_status loom_pp_schedule_make(loom_pp_schedule **out, loom_pp_kind kind, int pp, int M, int V) {
    *out = NULL;
    LOOM_TRY(check_args(kind, pp, M, V));
    loom_pp_schedule *s = loom_xcalloc(1, sizeof *s);
    s->kind = kind;
    s->pp = pp;
    s->M = M;
    s->v_shape = kind == LOOM_PP_ZB_V || kind == LOOM_PP_DUALPIPEV;
    s->V = kind == LOOM_PP_INTERLEAVED ? V : s->v_shape ? 2 : 1;
    s->S = pp * s->V;
    s->count = loom_xcalloc((size_t)pp, sizeof *s->count);
    s->actions = loom_xcalloc((size_t)pp, sizeof *s->actions);
    s->promised = loom_xcalloc((size_t)pp, sizeof *s->promised);
    action_list *comp = loom_xcalloc((size_t)pp, sizeof *comp);
    int *idx_f = loom_xmalloc((size_t)M * s->S * sizeof(int)), *idx_b = loom_xmalloc((size_t)M * s->S * sizeof(int));
    for (int r = 0; r < pp; r++) {
        switch (kind) {
        case LOOM_PP_GPIPE: gen_gpipe(s, r, &comp[r]); break;
        case LOOM_PP_1F1B: gen_1f1b(s, r, &comp[r]); break;
        case LOOM_PP_INTERLEAVED: gen_interleaved(s, r, &comp[r]); break;
        case LOOM_PP_ZB_H1: gen_zbh1(s, r, &comp[r]); break;
        case LOOM_PP_ZB_V: gen_zbv(s, r, &comp[r]); break;
        default: gen_dualpipev(s, r, &comp[r]); break;
        }
        for (int i = 0; i < comp[r].n; i++) {
            const loom_pp_action *x = &comp[r].a[i];
            if (x->op == LOOM_PP_F) idx_f[x->mb * s->S + x->stage] = i;
            if (x->op == LOOM_PP_B || x->op == LOOM_PP_I) idx_b[x->mb * s->S + x->stage] = i;
        }
        s->promised[r] = promise(s, r);
    }
    for (int r = 0; r < pp; r++) add_comms(s, comp, idx_f, idx_b, r);
    for (int r = 0; r < pp; r++) free(comp[r].a);
    free(comp);
    free(idx_f);
    free(idx_b);
    *out = s;
    return LOOM_OK;
}

void loom_pp_schedule_free(loom_pp_schedule *s) {
    if (!s) return;
    for (int r = 0; r < s->pp; r++) free(s->actions[r]);
    free(s->actions);
    free(s->count);
    free(s->promised);
    free(s);
}
