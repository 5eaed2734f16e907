// The pipeline executor; see pipeline.h.
#include "parallel/pipeline.h"

#include "core/timer.h"

#include <stdlib.h>

enum { FWD, BWD }; // a message's direction: an activation, or its gradient

typedef enum { FREE, SENDING, RECEIVING, HELD } message_state;

// A message buffer: an activation or gradient of (mb, stage) in transit or waiting for use.
typedef struct {
    void *buf;
    loom_comm_req *req;
    message_state state;
    int dir, mb, stage;
} message;

struct loom_pp {
    const loom_pp_schedule *s;
    int rank, V;
    int *stages;             // (V) the stages this rank holds, ascending
    loom_comm *comm;
    loom_backend *be;
    loom_pp_model model;
    size_t bytes;            // of one message
    int64_t elements;
    message **msgs;          // (nmsgs) each at a fixed address
    int nmsgs;
    int nslots, *slot_of;    // (M x V) the slot of (mb, chunk), -1 when none
    bool *slot_used;         // (nslots)
    loom_tensor *out;        // (nslots) the output of the forward held in each slot
    int in_flight;
    bool timed;
    loom_status error;
    loom_pp_stats stats;
};

static void keep_error(loom_pp *pp, loom_status s) {
    if (s != LOOM_OK && pp->error == LOOM_OK) pp->error = s;
}

// The rank's chunk index of stage s.
static int chunk_of(const loom_pp *pp, int stage) {
    for (int c = 0; c < pp->V; c++)
        if (pp->stages[c] == stage) return c;
    LOOM_CHECK(!"stage not on this rank");
    return -1;
}

// A new free message buffer, or NULL when the device has no room.
static message *add_message(loom_pp *pp) {
    void *buf = pp->be->alloc(pp->be, pp->bytes);
    if (!buf) return NULL;
    pp->msgs = realloc(pp->msgs, (size_t)(pp->nmsgs + 1) * sizeof *pp->msgs);
    LOOM_CHECK(pp->msgs);
    message *m = loom_xcalloc(1, sizeof *m);
    m->buf = buf;
    return pp->msgs[pp->nmsgs++] = m;
}

loom_status loom_pp_create(loom_pp **out, const loom_pp_schedule *s, int rank, loom_comm *comm, loom_backend *be,
                           int64_t message_elements, loom_pp_model model) {
    LOOM_CHECK(rank >= 0 && rank < s->pp);
    loom_pp *pp = loom_xcalloc(1, sizeof *pp);
    *pp = (loom_pp){.s = s, .rank = rank, .V = s->V, .comm = comm, .be = be, .model = model,
                    .bytes = (size_t)message_elements * loom_dtype_size(be->dtype), .elements = message_elements,
                    .nslots = s->promised[rank]};
    pp->stages = loom_xmalloc((size_t)s->V * sizeof(int));
    loom_pp_rank_stages(s, rank, pp->stages);
    pp->slot_of = loom_xmalloc((size_t)s->M * (size_t)s->V * sizeof(int));
    pp->slot_used = loom_xcalloc((size_t)pp->nslots, sizeof(bool));
    pp->out = loom_xcalloc((size_t)pp->nslots, sizeof(loom_tensor));
    for (int i = 0; i < s->M * s->V; i++) pp->slot_of[i] = -1;
    *out = pp;
    for (int i = 0; i < 2 * pp->nslots + 2; i++) // what a schedule keeps in transit; more are added if needed
        if (!add_message(pp)) {
            loom_pp_free(pp);
            *out = NULL;
            return loom_fail(LOOM_ENOMEM, "lower --batch or --seq", "cannot allocate the pipeline's message buffers");
        }
    return LOOM_OK;
}

void loom_pp_free(loom_pp *pp) {
    if (!pp) return;
    for (int i = 0; i < pp->nmsgs; i++) {
        pp->be->free(pp->be, pp->msgs[i]->buf);
        free(pp->msgs[i]);
    }
    free(pp->msgs);
    free(pp->stages);
    free(pp->slot_of);
    free(pp->slot_used);
    free(pp->out);
    free(pp);
}

const loom_pp_stats *loom_pp_last_stats(const loom_pp *pp) { return &pp->stats; }

// Completes the message's transfer (its request, if any).
static void finish(loom_pp *pp, message *m) {
    if (m->req) keep_error(pp, loom_comm_wait(m->req));
    m->req = NULL;
}

// Sends that have completed free their buffers; MPI moves transfers forward inside these calls.
static void progress(loom_pp *pp) {
    for (int i = 0; i < pp->nmsgs; i++) {
        message *m = pp->msgs[i];
        bool done = false;
        if (m->req) keep_error(pp, loom_comm_test(m->req, &done));
        if (done && m->state == SENDING) {
            finish(pp, m);
            m->state = FREE;
        }
    }
}

void loom_pp_progress(void *ctx, int layer) { progress(ctx); }

// A free message buffer for (dir, mb, stage) in `state`; a new one when all are in use.
static message *take(loom_pp *pp, int dir, int mb, int stage, message_state state) {
    message *m = NULL;
    for (int i = 0; i < pp->nmsgs && !m; i++)
        if (pp->msgs[i]->state == FREE) m = pp->msgs[i];
    if (!m) LOOM_CHECK(m = add_message(pp)); // one (Nl, C) buffer beside the slots' activations
    m->state = state, m->dir = dir, m->mb = mb, m->stage = stage, m->req = NULL;
    return m;
}

// The received or held message (dir, mb, stage), its transfer completed.
static message *find(loom_pp *pp, int dir, int mb, int stage) {
    for (int i = 0; i < pp->nmsgs; i++) {
        message *m = pp->msgs[i];
        if ((m->state == RECEIVING || m->state == HELD) && m->dir == dir && m->mb == mb && m->stage == stage) {
            finish(pp, m);
            return m;
        }
    }
    LOOM_CHECK(!"a message the schedule never received");
    return NULL;
}

static loom_tensor message_tensor(const loom_pp *pp, const message *m) {
    return loom_view_dims(m->buf, pp->be->dtype, &pp->elements, 1);
}

// Starts and ends a compute action's busy time (after its inputs arrived): on a GPU, timed,
// the device's work is waited for.
static double busy_start(loom_pp *pp) {
    if (pp->timed) pp->be->synchronize(pp->be);
    return loom_now();
}

static void busy_end(loom_pp *pp, double t0) {
    if (pp->timed) pp->be->synchronize(pp->be);
    pp->stats.busy_seconds += loom_now() - t0;
}

static int *slot_ref(loom_pp *pp, int mb, int chunk) { return &pp->slot_of[mb * pp->V + chunk]; }

static int slot_take(loom_pp *pp, int mb, int chunk) {
    for (int i = 0; i < pp->nslots; i++)
        if (!pp->slot_used[i]) {
            pp->slot_used[i] = true;
            *slot_ref(pp, mb, chunk) = i;
            if (++pp->in_flight > pp->stats.peak_in_flight) pp->stats.peak_in_flight = pp->in_flight;
            return i;
        }
    LOOM_CHECK(!"more micro-batches in flight than the schedule promised");
    return -1;
}

static void slot_release(loom_pp *pp, int mb, int chunk) {
    int *ref = slot_ref(pp, mb, chunk);
    pp->slot_used[*ref] = false;
    *ref = -1;
    pp->in_flight--;
}

static void forward(loom_pp *pp, int mb, int stage, double *loss_sum) {
    const loom_pp_schedule *s = pp->s;
    int chunk = chunk_of(pp, stage), slot = slot_take(pp, mb, chunk);
    loom_tensor input = {0};
    message *m = NULL;
    if (stage > 0 && loom_pp_stage_rank(s, stage - 1) == pp->rank)
        input = pp->out[*slot_ref(pp, mb, chunk_of(pp, stage - 1))];
    else if (stage > 0) {
        m = find(pp, FWD, mb, stage);
        input = message_tensor(pp, m);
    }
    double loss = 0, t0 = busy_start(pp);
    pp->model.load(pp->model.ctx, slot, mb, stage);
    pp->out[slot] = pp->model.forward(pp->model.ctx, slot, chunk, input, true, &loss);
    busy_end(pp, t0);
    if (m) m->state = FREE; // the forward copied it into the slot
    *loss_sum += loss;
}

static void backward(loom_pp *pp, loom_pp_op op, int mb, int stage) {
    const loom_pp_schedule *s = pp->s;
    int chunk = chunk_of(pp, stage), slot = *slot_ref(pp, mb, chunk);
    LOOM_CHECK(slot >= 0);
    message *m = op != LOOM_PP_W && stage < s->S - 1 ? find(pp, BWD, mb, stage) : NULL;
    double t0 = busy_start(pp);
    loom_tensor din = pp->model.backward(pp->model.ctx, slot, chunk, m ? message_tensor(pp, m) : (loom_tensor){0}, op);
    busy_end(pp, t0);
    if (m) m->state = FREE;
    if (op != LOOM_PP_W && stage > 0) { // d(input) for stage - 1, kept until sent or used here
        message *k = take(pp, BWD, mb, stage - 1, HELD);
        pp->be->copy(pp->be, k->buf, din.data, pp->bytes);
    }
    if (op != LOOM_PP_I) slot_release(pp, mb, chunk);
}

static void send(loom_pp *pp, const loom_pp_action *a) {
    message *m;
    if (a->op == LOOM_PP_SEND_F) {
        m = take(pp, FWD, a->mb, a->stage + 1, SENDING);
        pp->be->copy(pp->be, m->buf, pp->out[*slot_ref(pp, a->mb, chunk_of(pp, a->stage))].data, pp->bytes);
    } else {
        m = find(pp, BWD, a->mb, a->stage - 1);
        m->state = SENDING;
    }
    keep_error(pp, loom_send(pp->comm, m->buf, (size_t)pp->elements, pp->be->dtype, a->peer, m->dir, &m->req));
}

static void recv(loom_pp *pp, const loom_pp_action *a) {
    int dir = a->op == LOOM_PP_RECV_F ? FWD : BWD;
    message *m = take(pp, dir, a->mb, a->stage, RECEIVING);
    keep_error(pp, loom_recv(pp->comm, m->buf, (size_t)pp->elements, pp->be->dtype, a->peer, dir, &m->req));
}

loom_status loom_pp_run(loom_pp *pp, bool timed, double *loss_sum) {
    const loom_pp_schedule *s = pp->s;
    *loss_sum = 0;
    pp->stats = (loom_pp_stats){0};
    pp->timed = timed;
    double t0 = loom_now();
    for (int i = 0; i < s->count[pp->rank] && pp->error == LOOM_OK; i++) {
        const loom_pp_action *a = &s->actions[pp->rank][i];
        switch (a->op) {
        case LOOM_PP_F: forward(pp, a->mb, a->stage, loss_sum); break;
        case LOOM_PP_B:
        case LOOM_PP_I:
        case LOOM_PP_W: backward(pp, a->op, a->mb, a->stage); break;
        case LOOM_PP_SEND_F:
        case LOOM_PP_SEND_B: send(pp, a); break;
        case LOOM_PP_RECV_F:
        case LOOM_PP_RECV_B: recv(pp, a); break;
        }
        progress(pp);
    }
    for (int i = 0; i < pp->nmsgs; i++) {
        finish(pp, pp->msgs[i]);
        pp->msgs[i]->state = FREE;
    }
    if (timed) pp->be->synchronize(pp->be);
    pp->stats.step_seconds = loom_now() - t0;
    loom_status st = pp->error;
    pp->error = LOOM_OK;
    return st;
}

loom_status loom_pp_forward(loom_pp *pp, int mb, double *loss) {
    const loom_pp_schedule *s = pp->s;
    *loss = 0;
    loom_tensor out = {0};
    for (int c = 0; c < pp->V; c++) {
        int stage = pp->stages[c], from = stage > 0 ? loom_pp_stage_rank(s, stage - 1) : pp->rank;
        message *m = from != pp->rank ? take(pp, FWD, mb, stage, RECEIVING) : NULL;
        if (m) { // else the tokens, or the output of this rank's previous stage, still in the slot
            keep_error(pp, loom_recv(pp->comm, m->buf, (size_t)pp->elements, pp->be->dtype, from, FWD, &m->req));
            finish(pp, m);
            out = message_tensor(pp, m);
        }
        pp->model.load(pp->model.ctx, 0, mb, stage);
        out = pp->model.forward(pp->model.ctx, 0, c, out, false, loss);
        if (m) m->state = FREE;
        if (stage < s->S - 1 && loom_pp_stage_rank(s, stage + 1) != pp->rank) {
            keep_error(pp, loom_send(pp->comm, out.data, (size_t)pp->elements, pp->be->dtype,
                                     loom_pp_stage_rank(s, stage + 1), FWD, NULL));
            out = (loom_tensor){0};
        }
    }
    loom_status st = pp->error;
    pp->error = LOOM_OK;
    return st;
}
