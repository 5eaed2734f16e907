// ZeRO 3's memory on the backend's byte counters, under mpirun -np N: rank 0 first builds the
// one-process trainer (ZeRO 0) of an 8-block model and measures its parameter + gradient +
// AdamW bytes (the backend's bytes in use after creation, less the activations); then every rank
// builds the ZeRO-3 trainer of the same model and trains 2 steps. Asserts: each rank's peak
// (less the same activations) is within 10% of 1/N of the one-process figure plus the units in
// flight, counted from the table: two blocks' gathered parameters and two blocks' gradients, the
// embedding and final-norm units' parameters and gradients, and one reduced piece of scratch.
// Then the memory plan against what trainers hold (test_plan).
#include "harness.h"

#include "train/trainer_test.h"

static loom_train_config config(int zero, int dp) {
    loom_train_config c = t_train_config(8, 64, dp * TRAIN_B, (loom_lr_schedule){LOOM_LR_CONSTANT, 5e-4f, 5e-4f, 0, 2});
    c.zero = zero;
    return c;
}

// Bytes of a unit's buffer: its layer's elements, padded to a multiple of W.
static size_t unit_bytes(const loom_param_table *t, int layer, int W, int64_t *piece) {
    int64_t n = 0;
    for (int i = 0; i < t->count; i++)
        if (t->params[i].layer == layer) n += t->params[i].local_numel;
    *piece = (n + W - 1) / W;
    return (size_t)(*piece * W) * sizeof(float);
}

// The plan made before allocating (train/plan.c) against what each trainer holds right after its
// creation (loom_trainer_memory), field by field, for every ZeRO stage, recomputation, each
// offload option and their combination, and ring context parallelism: equal to the byte.
static void test_plan(loom_comm *world) {
    struct {
        int zero;
        bool recompute, opt, params, acts;
        int cp;
    } cases[] = {{0, 0, 0, 0, 0, 1}, {1, 0, 0, 0, 0, 1}, {2, 1, 0, 0, 0, 1}, {3, 0, 0, 0, 0, 1},
                 {1, 0, 1, 0, 1, 1}, {3, 1, 1, 1, 0, 1}, {3, 0, 1, 1, 1, 1}, {1, 0, 0, 0, 0, 2}};
    int W = loom_comm_size(world);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        loom_train_config c = config(cases[k].zero, W / cases[k].cp);
        c.cp = cases[k].cp;
        c.recompute = cases[k].recompute ? LOOM_RECOMPUTE_FULL : LOOM_RECOMPUTE_NONE;
        c.offload_optimizer = cases[k].opt, c.offload_params = cases[k].params, c.offload_activations = cases[k].acts;
        loom_trainer *t;
        bool report;
        T_ASSERT(loom_trainer_create(&t, world, &c, &report) == LOOM_OK, "case %zu: %s", k, loom_error_message());
        loom_train_memory plan, held;
        T_ASSERT(loom_trainer_plan(t, &plan) == LOOM_OK, "plan");
        loom_trainer_memory(t, &held);
        T_ASSERT(plan.params_grads == held.params_grads && plan.activations == held.activations &&
                     plan.optimizer == held.optimizer && plan.offloaded == held.offloaded && (held.offloaded > 0) ==
                     (c.offload_optimizer || c.offload_activations),
                 "case %zu (ZeRO %d): planned %zu/%zu/%zu/%zu bytes (params+grads, activations, AdamW, offloaded), "
                 "held %zu/%zu/%zu/%zu", k, c.zero, plan.params_grads, plan.activations, plan.optimizer, plan.offloaded,
                 held.params_grads, held.activations, held.optimizer, held.offloaded);
        loom_trainer_free(t);
    }
}

int main(int argc, char **argv) {
    loom_comm *world, *solo;
    if (loom_comm_world(&argc, &argv, &world) != LOOM_OK) return 2;
    int rank = loom_comm_rank(world), W = loom_comm_size(world);
    LOOM_CHECK(loom_comm_split(world, rank, 0, &solo) == LOOM_OK);
    loom_trainer *t;
    bool report;
    double whole = 0; // the one-process parameter + gradient + AdamW bytes
    if (rank == 0) {
        loom_train_config c = config(0, 1);
        T_ASSERT(loom_trainer_create(&t, solo, &c, &report) == LOOM_OK, "one process: %s", loom_error_message());
        size_t acts = loom_gpt2_memory_bytes(t->model, NULL) - 2 * (size_t)t->model->num_elements * sizeof(float);
        whole = (double)(t->be->bytes_in_use - acts);
        loom_trainer_free(t);
    }
    loom_broadcast(world, &whole, 1, LOOM_F64, 0, NULL);
    loom_train_config c = config(3, W);
    T_ASSERT(loom_trainer_create(&t, world, &c, &report) == LOOM_OK, "ZeRO 3: %s", loom_error_message());
    for (int s = 0; s < 2; s++) {
        loom_step_result r;
        T_ASSERT(loom_train_step(t, t_random_batch, NULL, &r) == LOOM_OK, "step %d", s);
    }
    const loom_param_table *table = &t->model->table;
    int L = c.model.num_layers;
    int64_t block_piece, embed_piece, head_piece;
    size_t block = unit_bytes(table, 0, W, &block_piece), embed = unit_bytes(table, -1, W, &embed_piece),
           head = unit_bytes(table, L, W, &head_piece);
    int64_t most = block_piece > embed_piece ? block_piece : embed_piece;
    double in_flight = (double)(4 * block + 2 * embed + 2 * head) + (double)most * sizeof(float);
    double want = whole / W + in_flight, got = (double)(t->be->peak_bytes - loom_gpt2_memory_bytes(t->model, NULL));
    T_ASSERT(fabs(got - want) <= 0.10 * want, "rank %d: peak %.0f bytes of parameters, gradients and AdamW, want "
             "%.0f = %.0f / %d + %.0f in flight (within 10%%)", rank, got, want, whole, W, in_flight);
    if (rank == 0)
        printf("ZeRO 3 on %d ranks: %.0f bytes of parameters, gradients and AdamW per rank (one process: %.0f; "
               "1/%d of it + %.0f in flight = %.0f, off by %.1f%%)\n", W, got, whole, W, in_flight, want,
               100 * (got - want) / want);
    loom_trainer_free(t);
    test_plan(world);
    loom_comm_free(solo);
    int rc = t_done("fsdp memory");
    loom_comm_finalize(world);
    return rc;
}
