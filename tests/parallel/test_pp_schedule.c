// Pipeline schedules (parallel/pipeline_schedule.h): every schedule over a grid of pp, M and V
// passes the simulator's checks with unit, skewed and random costs, keeps its promised peak in
// flight and meets its closed-form bubble; broken lists (a dropped RECV, an F after its B, two
// SENDs swapped, a missing W, a wrong promise, a cyclic wait, ...) are caught; bad arguments
// are refused with one line.
#include "harness.h"
#include "parallel/pipeline_schedule.h"

#include <string.h>

static const loom_pp_costs UNIT = {1, 1, 1, 0}, SKEWED = {1, 1.5, 0.7, 0.1};

// The rules of loom_pp_schedule_make: whether (kind, pp, M, V) is valid.
static bool valid(loom_pp_kind k, int pp, int M, int V) {
    if (k == LOOM_PP_INTERLEAVED) return V >= 2 && M % pp == 0;
    if (k == LOOM_PP_ZB_V) return (V == 0 || V == 2) && M >= pp;
    if (k == LOOM_PP_DUALPIPEV) return (V == 0 || V == 2) && M >= 2 * pp;
    return V == 0;
}

// The closed-form bubble with unit costs (M >= pp).
static double closed_form(loom_pp_kind k, int pp, int M, int V) {
    double p1 = pp - 1;
    switch (k) {
    case LOOM_PP_GPIPE:
    case LOOM_PP_1F1B: return p1 / (M + p1);
    case LOOM_PP_INTERLEAVED: return p1 / (V * M + p1);
    case LOOM_PP_ZB_H1: return p1 / (3 * M + p1);
    default: return p1 / (6 * M + p1); // zb-v, dualpipev: 2 stages per rank, F I W each
    }
}

static double bubble_of(loom_pp_kind k, int pp, int M, int V) {
    loom_pp_schedule *s;
    double b = -1;
    if (loom_pp_schedule_make(&s, k, pp, M, V) == LOOM_OK) {
        if (loom_pp_theoretical_bubble(s, &b) != LOOM_OK) b = -1;
        loom_pp_schedule_free(s);
    }
    return b;
}

// Simulates s with costs c: passes the checks, the measured peak is the promise, and every rank's
// compute covers each of its (mb, stage) pairs' F and backward once.
static void check_sim(const loom_pp_schedule *s, const loom_pp_costs *c, const char *what) {
    loom_pp_sim sim;
    loom_status st = loom_pp_simulate(s, c, &sim);
    T_ASSERT(st == LOOM_OK, "%s: %s", what, loom_error_message());
    if (st != LOOM_OK) return;
    double busy = 0, want = 0;
    for (int r = 0; r < s->pp; r++) {
        T_ASSERT(sim.peak[r] == s->promised[r], "%s rank %d: peak %d, promised %d", what, r, sim.peak[r], s->promised[r]);
        busy += sim.busy[r];
        for (int k = 0; k < sim.ncompute[r]; k++) {
            const loom_pp_slot_time *t = &sim.timeline[r][k];
            T_ASSERT(t->end <= sim.makespan + 1e-9 && (k == 0 || t->start >= sim.timeline[r][k - 1].end - 1e-9),
                     "%s rank %d: slot %d overlaps or ends after the makespan", what, r, k);
        }
    }
    want = (double)s->M * s->S * (c->f + c->i + c->w); // each (mb, stage): F, I and W or B = I + W
    T_ASSERT(fabs(busy - want) < 1e-6 * want, "%s: busy %g, want %g", what, busy, want);
    loom_pp_sim_free(&sim);
}

// Every schedule over pp 2..8, M pp..4pp (V 2..4 for interleaved): made when valid (refused
// otherwise), checked with unit, skewed and random costs, the closed-form bubble.
static void test_grid(void) {
    int made = 0;
    for (int k = 0; k < LOOM_PP_KINDS; k++)
        for (int V = 0; V <= (k == LOOM_PP_INTERLEAVED ? 4 : 0); V++)
            for (int pp = 2; pp <= 8; pp++)
                for (int M = pp; M <= 4 * pp; M++) {
                    char what[96];
                    snprintf(what, sizeof what, "%s pp %d M %d V %d", loom_pp_kind_name(k), pp, M, V);
                    loom_pp_schedule *s;
                    loom_status st = loom_pp_schedule_make(&s, k, pp, M, V);
                    T_ASSERT((st == LOOM_OK) == valid(k, pp, M, V), "%s: make says %s", what,
                             st == LOOM_OK ? "ok" : loom_error_message());
                    if (st != LOOM_OK) continue;
                    made++;
                    check_sim(s, &UNIT, what);
                    check_sim(s, &SKEWED, what);
                    loom_pp_costs rnd = {t_uniform(0.2f, 2), t_uniform(0.2f, 2), t_uniform(0.2f, 2), t_uniform(0, 0.5f)};
                    check_sim(s, &rnd, what);
                    double b;
                    T_ASSERT(loom_pp_theoretical_bubble(s, &b) == LOOM_OK, "%s: %s", what, loom_error_message());
                    double want = closed_form(k, pp, M, s->V);
                    T_ASSERT(fabs(b - want) < 1e-12, "%s: bubble %.12f, closed form %.12f", what, b, want);
                    loom_pp_schedule_free(s);
                }
    T_ASSERT(made > 500, "only %d schedules made", made);
}

// zb-v and dualpipev beat zb-h1 and 1f1b wherever both are valid; zb-h1 beats 1f1b.
static void test_ordering(void) {
    for (int pp = 2; pp <= 8; pp++)
        for (int M = pp; M <= 4 * pp; M++) {
            double f1b = bubble_of(LOOM_PP_1F1B, pp, M, 0), h1 = bubble_of(LOOM_PP_ZB_H1, pp, M, 0);
            T_ASSERT(h1 >= 0 && h1 < f1b, "pp %d M %d: zb-h1 %g, 1f1b %g", pp, M, h1, f1b);
            for (int k = LOOM_PP_ZB_V; k <= LOOM_PP_DUALPIPEV; k++) {
                if (!valid(k, pp, M, 0)) continue;
                double b = bubble_of(k, pp, M, 0);
                T_ASSERT(b >= 0 && b < h1 && b < f1b, "pp %d M %d: %s %g, zb-h1 %g, 1f1b %g", pp, M,
                         loom_pp_kind_name(k), b, h1, f1b);
            }
        }
}

// The promised peaks, written out for pp 4 (the formulas in pipeline_schedule.c).
static void test_promises(void) {
    struct {
        loom_pp_kind k;
        int M, V, peak[4];
    } cases[] = {
        {LOOM_PP_GPIPE, 8, 0, {8, 8, 8, 8}},       {LOOM_PP_1F1B, 8, 0, {4, 3, 2, 1}},
        {LOOM_PP_1F1B, 2, 0, {2, 2, 2, 1}},        {LOOM_PP_INTERLEAVED, 8, 2, {11, 9, 7, 5}},
        {LOOM_PP_INTERLEAVED, 4, 2, {8, 8, 7, 5}}, {LOOM_PP_ZB_H1, 8, 0, {4, 4, 4, 4}},
        {LOOM_PP_ZB_V, 8, 0, {8, 8, 8, 8}},        {LOOM_PP_ZB_V, 5, 0, {6, 7, 8, 8}},
        {LOOM_PP_DUALPIPEV, 8, 0, {9, 9, 9, 9}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        loom_pp_schedule *s;
        T_ASSERT(loom_pp_schedule_make(&s, cases[i].k, 4, cases[i].M, cases[i].V) == LOOM_OK, "%s", loom_error_message());
        for (int r = 0; r < 4; r++)
            T_ASSERT(s->promised[r] == cases[i].peak[r], "%s M %d rank %d: promised %d, want %d",
                     loom_pp_kind_name(cases[i].k), cases[i].M, r, s->promised[r], cases[i].peak[r]);
        loom_pp_schedule_free(s);
    }
}

// Where stages live: the inverse maps agree; v-shape puts the first and last stage on rank 0.
static void test_stage_map(void) {
    for (int k = 0; k < LOOM_PP_KINDS; k++) {
        loom_pp_schedule *s;
        int stages[4];
        T_ASSERT(loom_pp_schedule_make(&s, k, 4, 12, k == LOOM_PP_INTERLEAVED ? 3 : 0) == LOOM_OK, "%s",
                 loom_error_message());
        for (int r = 0; r < 4; r++) {
            loom_pp_rank_stages(s, r, stages);
            for (int c = 0; c < s->V; c++) {
                T_ASSERT(loom_pp_stage_rank(s, stages[c]) == r, "%s: stage %d", loom_pp_kind_name(k), stages[c]);
                T_ASSERT(c == 0 || stages[c] > stages[c - 1], "%s rank %d: stages not ascending", loom_pp_kind_name(k), r);
            }
        }
        if (s->v_shape)
            T_ASSERT(loom_pp_stage_rank(s, 0) == 0 && loom_pp_stage_rank(s, s->S - 1) == 0 && loom_pp_stage_rank(s, 4) == 3,
                     "%s: not a V", loom_pp_kind_name(k));
        loom_pp_schedule_free(s);
    }
}

// ---- broken lists ----

static loom_pp_schedule *copy_of(const loom_pp_schedule *s) {
    loom_pp_schedule *c = loom_xcalloc(1, sizeof *c);
    *c = *s;
    c->count = loom_xmalloc((size_t)s->pp * sizeof *c->count);
    c->promised = loom_xmalloc((size_t)s->pp * sizeof *c->promised);
    c->actions = loom_xmalloc((size_t)s->pp * sizeof *c->actions);
    memcpy(c->count, s->count, (size_t)s->pp * sizeof *c->count);
    memcpy(c->promised, s->promised, (size_t)s->pp * sizeof *c->promised);
    for (int r = 0; r < s->pp; r++) {
        c->actions[r] = loom_xmalloc((size_t)(s->count[r] + 1) * sizeof **c->actions);
        memcpy(c->actions[r], s->actions[r], (size_t)s->count[r] * sizeof **c->actions);
    }
    return c;
}

static int find(const loom_pp_schedule *s, int r, loom_pp_op op, int mb, int stage) {
    for (int i = 0; i < s->count[r]; i++) {
        const loom_pp_action *a = &s->actions[r][i];
        if (a->op == op && (mb < 0 || a->mb == mb) && (stage < 0 || a->stage == stage)) return i;
    }
    return -1;
}

static void drop(loom_pp_schedule *s, int r, int i) {
    memmove(&s->actions[r][i], &s->actions[r][i + 1], (size_t)(s->count[r] - i - 1) * sizeof **s->actions);
    s->count[r]--;
}

static void swap(loom_pp_schedule *s, int r, int i, int j) {
    loom_pp_action t = s->actions[r][i];
    s->actions[r][i] = s->actions[r][j];
    s->actions[r][j] = t;
}

// The simulator refuses s with one line that names the rank and the action.
static void expect_refused(const loom_pp_schedule *s, const char *what, const char *words) {
    loom_pp_sim sim;
    loom_status st = loom_pp_simulate(s, &UNIT, &sim);
    const char *msg = loom_error_message();
    T_ASSERT(st == LOOM_EINVAL, "%s %s: not refused", loom_pp_kind_name(s->kind), what);
    if (st == LOOM_OK) {
        loom_pp_sim_free(&sim);
        return;
    }
    T_ASSERT(strstr(msg, "rank ") && strstr(msg, "action ") && strstr(msg, words) && !strchr(msg, '\n'),
             "%s %s: message '%s' lacks '%s'", loom_pp_kind_name(s->kind), what, msg, words);
}

static void test_mutations(loom_pp_kind k, int pp, int M, int V) {
    loom_pp_schedule *s, *m;
    T_ASSERT(loom_pp_schedule_make(&s, k, pp, M, V) == LOOM_OK, "%s", loom_error_message());
    int last = loom_pp_stage_rank(s, s->S - 1), i, j;

    m = copy_of(s); // an unchanged copy passes
    check_sim(m, &UNIT, "copy");
    loom_pp_schedule_free(m);

    m = copy_of(s); // drop rank 1's first RECV
    drop(m, 1, find(m, 1, LOOM_PP_RECV_F, -1, -1));
    expect_refused(m, "without a RECV_F", "RECV");
    loom_pp_schedule_free(m);

    m = copy_of(s); // the last stage's F of micro-batch 0 after its backward
    i = find(m, last, LOOM_PP_F, 0, s->S - 1);
    j = find(m, last, LOOM_PP_B, 0, s->S - 1);
    if (j < 0) j = find(m, last, LOOM_PP_I, 0, s->S - 1);
    swap(m, last, i, j);
    expect_refused(m, "with an F after its backward", "before its F");
    loom_pp_schedule_free(m);

    m = copy_of(s); // rank 0's first two SENDs (to the same peer) swapped
    i = find(m, 0, LOOM_PP_SEND_F, -1, -1);
    for (j = i + 1; j < m->count[0]; j++)
        if ((m->actions[0][j].op == LOOM_PP_SEND_F || m->actions[0][j].op == LOOM_PP_SEND_B) &&
            m->actions[0][j].peer == m->actions[0][i].peer)
            break;
    T_ASSERT(j < m->count[0], "no second SEND");
    swap(m, 0, i, j);
    expect_refused(m, "with two SENDs swapped", "rank");
    loom_pp_schedule_free(m);

    m = copy_of(s); // rank 1 posts the RECV_F of micro-batch 1 first: every other rule holds
    i = find(m, 1, LOOM_PP_RECV_F, 1, -1);
    {
        loom_pp_action a = m->actions[1][i];
        memmove(&m->actions[1][1], &m->actions[1][0], (size_t)i * sizeof a);
        m->actions[1][0] = a;
    }
    expect_refused(m, "with RECVs out of the send order", "the orders differ");
    loom_pp_schedule_free(m);

    m = copy_of(s); // rank 0's first SEND_F (to rank 1) sent to rank 2
    m->actions[0][find(m, 0, LOOM_PP_SEND_F, -1, -1)].peer = 2;
    expect_refused(m, "with a wrong peer", "peer");
    loom_pp_schedule_free(m);

    m = copy_of(s); // a RECV_B moved before its F
    i = find(m, 0, LOOM_PP_RECV_B, -1, -1);
    if (i >= 0) {
        loom_pp_action a = m->actions[0][i];
        memmove(&m->actions[0][1], &m->actions[0][0], (size_t)i * sizeof a);
        m->actions[0][0] = a;
        expect_refused(m, "with a RECV_B first", "before F");
    }
    loom_pp_schedule_free(m);

    m = copy_of(s); // a duplicated F
    m->actions[0][m->count[0]++] = m->actions[0][find(m, 0, LOOM_PP_F, -1, -1)];
    expect_refused(m, "with an F twice", "a second F");
    loom_pp_schedule_free(m);

    i = find(s, last, LOOM_PP_W, -1, -1);
    if (i >= 0) { // zero-bubble schedules: a W removed
        m = copy_of(s);
        drop(m, last, i);
        expect_refused(m, "without a W", "no W");
        loom_pp_schedule_free(m);
    } else { // a B removed, with the SEND_B after it
        m = copy_of(s);
        i = find(m, last, LOOM_PP_B, -1, -1);
        if (m->actions[last][i + 1].op == LOOM_PP_SEND_B) drop(m, last, i + 1);
        drop(m, last, i);
        expect_refused(m, "without a B", "missing: no B or I");
        loom_pp_schedule_free(m);
    }

    for (int d = -1; d <= 1; d += 2) { // the promise off by one either way
        m = copy_of(s);
        m->promised[pp - 1] += d;
        expect_refused(m, d < 0 ? "promising one less" : "promising one more", "promises");
        loom_pp_schedule_free(m);
    }
    loom_pp_schedule_free(s);
}

// Two ranks, one micro-batch: rank 0 waits for the gradient before it sends the activation
// rank 1 waits for. Every static rule holds; only the run deadlocks. With the SEND right after
// the F, it runs.
static void test_cyclic_wait(void) {
    loom_pp_schedule *s;
    T_ASSERT(loom_pp_schedule_make(&s, LOOM_PP_1F1B, 2, 1, 0) == LOOM_OK, "%s", loom_error_message());
    const loom_pp_action r0[] = {{LOOM_PP_F, 0, 0, -1},
                                 {LOOM_PP_RECV_B, 0, 0, 1},
                                 {LOOM_PP_B, 0, 0, -1},
                                 {LOOM_PP_SEND_F, 0, 0, 1}};
    const loom_pp_action r1[] = {{LOOM_PP_RECV_F, 0, 1, 0},
                                 {LOOM_PP_F, 0, 1, -1},
                                 {LOOM_PP_B, 0, 1, -1},
                                 {LOOM_PP_SEND_B, 0, 1, 0}};
    T_ASSERT(s->count[0] == 4 && s->count[1] == 4, "1f1b pp 2 M 1: %d and %d actions", s->count[0], s->count[1]);
    memcpy(s->actions[0], r0, sizeof r0);
    memcpy(s->actions[1], r1, sizeof r1);
    expect_refused(s, "with a cyclic wait", "deadlock");
    s->actions[0][1] = r0[3]; // F, SEND_F, RECV_B, B
    s->actions[0][2] = r0[1];
    s->actions[0][3] = r0[2];
    check_sim(s, &UNIT, "the cycle broken");
    loom_pp_schedule_free(s);
}

// ---- arguments ----

static void expect_make_error(loom_pp_kind k, int pp, int M, int V, const char *words) {
    loom_pp_schedule *s = (loom_pp_schedule *)1;
    loom_status st = loom_pp_schedule_make(&s, k, pp, M, V);
    const char *msg = loom_error_message();
    T_ASSERT(st == LOOM_EINVAL && s == NULL, "%s pp %d M %d V %d: not refused", loom_pp_kind_name(k), pp, M, V);
    T_ASSERT(strstr(msg, words) && !strchr(msg, '\n') && loom_error_hint()[0], "%s pp %d M %d V %d: '%s' lacks '%s'",
             loom_pp_kind_name(k), pp, M, V, msg, words);
}

static void test_errors(void) {
    expect_make_error(LOOM_PP_1F1B, 4, 8, 2, "--virtual-stages 2 is for the interleaved schedule");
    expect_make_error(LOOM_PP_GPIPE, 4, 8, 1, "--virtual-stages 1");
    expect_make_error(LOOM_PP_ZB_V, 4, 8, 3, "has 2 stages per rank");
    expect_make_error(LOOM_PP_INTERLEAVED, 4, 8, 0, "needs --virtual-stages 2 or more, got 0");
    expect_make_error(LOOM_PP_INTERLEAVED, 4, 8, 1, "got 1");
    expect_make_error(LOOM_PP_INTERLEAVED, 4, 6, 2, "a multiple of --pp 4, got 6");
    expect_make_error(LOOM_PP_DUALPIPEV, 4, 7, 0, "at least 2 x --pp = 8 micro-batches, got 7");
    expect_make_error(LOOM_PP_ZB_V, 4, 3, 0, "at least --pp 4 micro-batches, got 3");
    expect_make_error(LOOM_PP_1F1B, 0, 8, 0, "--pp 0");
    expect_make_error(LOOM_PP_1F1B, 4, 0, 0, "0 micro-batches");
    loom_pp_kind k;
    T_ASSERT(loom_pp_kind_parse("zb-h2", &k) == LOOM_EINVAL && strstr(loom_error_message(), "'zb-h2'"),
             "unknown name: %s", loom_error_message());
    for (int i = 0; i < LOOM_PP_KINDS; i++)
        T_ASSERT(loom_pp_kind_parse(loom_pp_kind_name(i), &k) == LOOM_OK && (int)k == i, "name %d", i);
    // accepted: V 2 with the v-shaped schedules, fewer micro-batches than pp with 1f1b
    loom_pp_schedule *s;
    T_ASSERT(loom_pp_schedule_make(&s, LOOM_PP_DUALPIPEV, 4, 8, 2) == LOOM_OK, "%s", loom_error_message());
    loom_pp_schedule_free(s);
    T_ASSERT(loom_pp_schedule_make(&s, LOOM_PP_1F1B, 4, 2, 0) == LOOM_OK, "%s", loom_error_message());
    check_sim(s, &SKEWED, "1f1b pp 4 M 2");
    loom_pp_schedule_free(s);
}

// The printed timeline: one row per rank, the bubble and peaks lines.
static void test_timeline(void) {
    loom_pp_schedule *s;
    char *text = NULL;
    size_t len = 0;
    T_ASSERT(loom_pp_schedule_make(&s, LOOM_PP_1F1B, 4, 8, 0) == LOOM_OK, "%s", loom_error_message());
    FILE *f = open_memstream(&text, &len);
    T_ASSERT(loom_pp_print_timeline(s, f) == LOOM_OK, "%s", loom_error_message());
    fclose(f);
    T_ASSERT(strstr(text, "bubble: 0.272727 (36 idle of 132 rank-time units)"), "no bubble line:\n%s", text);
    T_ASSERT(strstr(text, "peak in flight per rank: 4 3 2 1\n"), "no peak line:\n%s", text);
    T_ASSERT(strstr(text, "rank 3  .  .  .  F0 B0 B0 F1 B1 B1 "), "rank 3's row:\n%s", text);
    free(text);
    loom_pp_schedule_free(s);
}

int main(void) {
    t_seed();
    test_grid();
    test_ordering();
    test_promises();
    test_stage_map();
    for (int k = 0; k < LOOM_PP_KINDS; k++) { // broken lists of pp 4 (V 2) and pp 3 (V 3)
        test_mutations(k, 4, 8, k == LOOM_PP_INTERLEAVED ? 2 : 0);
        test_mutations(k, 3, 6, k == LOOM_PP_INTERLEAVED ? 3 : 0);
    }
    test_cyclic_wait();
    test_errors();
    test_timeline();
    return t_done("test_pp_schedule");
}
