// Tensor (and sequence) parallelism against the one-process run, through the training library,
// under mpirun -np N:
//   test_tp TP SP ZERO FIXTURES [DEVICE]
// DEVICE (default cpu) runs the mesh there in fp32 (cuda: the ranks share the GPUs, their
// collectives staged through host memory over MPI); the one-process run is on the CPU.
// The mesh is N/TP data-parallel replicas of TP tensor-parallel ranks; micro-batches of B=2
// sequences of T=16 tokens, a global batch of 2 x dp x B (2 micro-batches accumulated per rank),
// 10 steps of AdamW with warmup, cosine decay and clipping from the fixture model. Rank 0 first
// trains the same model with the same global batch in one process (a group of its own).
// Asserts: the loss at every step within 1e-5 relative of the one-process run's; the step-1
// gradients, gathered over the tp ranks into the model file's order (data-parallel averaged:
// ZeRO 0 leaves the whole gradient in the model's buffer; ZeRO 1/2 are checked by the losses),
// within 1e-5 relative norm error, and their norm within 1e-5.
#include "harness.h"

#include "core/rng.h"
#include "train/trainer.h"

#include <string.h>

enum { B = 2, T = 16, STEPS = 10 };

static void random_batch(void *ctx, uint64_t index, int32_t *inputs, int32_t *targets) {
    const int *V = ctx;
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int32_t)loom_rng_below(99, 1, index * B * T + (uint64_t)i, (uint64_t)*V);
        targets[i] = (int32_t)loom_rng_below(99, 2, index * B * T + (uint64_t)i, (uint64_t)*V);
    }
}

static loom_train_config config(const char *init, int tp, bool sp, int zero, int dp, const char *device) {
    return (loom_train_config){.init = init, .batch = B, .seq = T, .global_batch = 2 * dp * B, .tp = tp, .pp = 1,
                               .cp = 1, .sp = sp, .zero = zero, .bucket_mb = 0.01, .seed = 7,
                               .adamw = {.lr = 5e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                         .weight_decay = 0.1f, .grad_clip = 1.0f, .seed = 7},
                               .lr = {LOOM_LR_COSINE, 5e-4f, 5e-5f, 2, STEPS},
                               .device = device, .precision = "fp32", .device_comm = "mpi", .threads = 1};
}

// Step-1 gradients in the model file's order on rank 0 (every tp group gathers its own).
static float *gather_grads(loom_trainer *t) {
    const loom_gpt2 *m = t->model;
    loom_comm *tp = t->mesh->host[LOOM_GROUP_TP];
    int P = loom_comm_size(tp);
    size_t n = (size_t)m->num_elements;
    float *local = malloc(n * sizeof(float)), *all = malloc(n * (size_t)P * sizeof(float));
    float *file = calloc((size_t)m->table.file_elements, sizeof(float));
    loom_gpt2_download(m, m->grads, local);
    T_ASSERT(loom_allgather(tp, local, all, n, LOOM_F32, NULL) == LOOM_OK, "gather gradients");
    for (int r = 0; r < P; r++) loom_param_table_copy(&m->table, r, all + (size_t)r * n, file, true);
    free(local);
    free(all);
    return file;
}

// Trains STEPS steps; losses[STEPS], and on the first step the gradients (file order) and norm.
static void train(loom_comm *world, const loom_train_config *c, double *losses, float **grads, double *norm, int V) {
    loom_trainer *t;
    bool report;
    loom_status s = loom_trainer_create(&t, world, c, &report);
    T_ASSERT(s == LOOM_OK, "trainer: %s", loom_error_message());
    if (s != LOOM_OK) exit(t_done("tp"));
    for (int step = 0; step < STEPS; step++) {
        loom_step_result r;
        T_ASSERT(loom_train_backward(t, random_batch, &V, &r) == LOOM_OK, "backward");
        if (step == 0) {
            *norm = r.norm;
            *grads = c->zero == 0 ? gather_grads(t) : NULL;
        }
        T_ASSERT(loom_train_update(t, &r) == LOOM_OK, "update");
        losses[step] = r.loss;
    }
    loom_trainer_free(t);
}

int main(int argc, char **argv) {
    loom_comm *world, *solo;
    if (loom_comm_world(&argc, &argv, &world) != LOOM_OK || argc < 5) return 2;
    const char *device = argc > 5 ? argv[5] : "cpu";
    int tp = atoi(argv[1]), zero = atoi(argv[3]), rank = loom_comm_rank(world), W = loom_comm_size(world);
    bool sp = atoi(argv[2]) != 0;
    char init[4200];
    snprintf(init, sizeof init, "%s/gpt2_tiny.bin", argv[4]);
    int V = 200; // the fixture's vocabulary
    LOOM_CHECK(loom_comm_split(world, rank, 0, &solo) == LOOM_OK);
    double ref[STEPS], got[STEPS], ref_norm = 0, norm = 0;
    float *ref_grads = NULL, *grads = NULL;
    if (rank == 0) {
        loom_train_config one = config(init, 1, false, 0, W / tp, "cpu");
        one.global_batch = 2 * (W / tp) * B; // the same global batch, accumulated in one process
        train(solo, &one, ref, &ref_grads, &ref_norm, V);
    }
    loom_train_config c = config(init, tp, sp, zero, W / tp, device);
    train(world, &c, got, &grads, &norm, V);
    if (rank == 0) {
        double worst = 0;
        for (int s = 0; s < STEPS; s++) {
            double e = fabs(got[s] - ref[s]) / fabs(ref[s]);
            T_ASSERT(e < 1e-5, "step %d loss %.8f vs one process %.8f (rel %.2g)", s + 1, got[s], ref[s], e);
            worst = e > worst ? e : worst;
        }
        T_ASSERT(fabs(norm - ref_norm) < 1e-5 * ref_norm, "step-1 norm %.8f vs %.8f", norm, ref_norm);
        double dd = 0, bb = 0;
        if (grads) {
            loom_gpt2_config cfg = {.max_seq_len = 80, .vocab_size = V, .padded_vocab_size = 256, .num_layers = 2,
                                    .num_heads = 4, .channels = 32};
            size_t n = (size_t)loom_gpt2_file_elements(&cfg);
            for (size_t i = 0; i < n; i++) dd += pow((double)grads[i] - ref_grads[i], 2), bb += pow(ref_grads[i], 2);
            T_ASSERT(sqrt(dd / bb) < 1e-5, "step-1 gradients: relative norm error %.3g", sqrt(dd / bb));
        }
        printf("%s: tp %d%s x dp %d, ZeRO %d: %d steps, worst loss rel err %.2g", device, tp, sp ? " (sp)" : "", W / tp,
               zero, STEPS, worst);
        if (grads) printf(", step-1 gradient rel err %.2g", sqrt(dd / bb));
        printf("\n");
    }
    free(ref_grads);
    free(grads);
    loom_comm_free(solo);
    int rc = t_done("tp");
    loom_comm_finalize(world);
    return rc;
}
