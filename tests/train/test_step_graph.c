// The step --cuda-graphs records (train/step_graph.c) against the step launched op by op, on the
// CPU backend: a backend without graphs issues the recorded step's ops each step instead of
// replaying them, so everything but the recording itself is checked here — each micro-batch's
// tokens through its host_alloc slot (2 micro-batches a step), the losses left on the backend and
// read back after the step, the gradient's sum of squares added up on the backend, the clipping
// factor and skip flag of step_scalars, AdamW reading its per-step values from backend memory,
// and the host's bookkeeping after it. Two trainers of one configuration, one of them with the
// step graph attached, run the same steps: every loss, norm, learning rate and skip, the
// parameters, AdamW's moments and step count, and the trainer's step and data position must be
// the same to the bit. The learning rate is then raised to 1e30, which makes the steps after the
// next one not finite: both skip them alike.
#include "harness.h"

#include "train/trainer_internal.h"
#include "train/trainer_test.h"

#include <string.h>

static bool same(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

int main(int argc, char **argv) {
    loom_comm *world;
    if (loom_comm_world(&argc, &argv, &world) != LOOM_OK) return 2;
    loom_train_config c = t_train_config(2, 32, 2 * TRAIN_B, (loom_lr_schedule){LOOM_LR_COSINE, 1e-2f, 1e-3f, 2, 10});
    loom_trainer *ops, *rec;
    bool report;
    T_ASSERT(loom_trainer_create(&ops, world, &c, &report) == LOOM_OK, "op by op: %s", loom_error_message());
    T_ASSERT(loom_trainer_create(&rec, world, &c, &report) == LOOM_OK, "recorded: %s", loom_error_message());
    T_ASSERT(loom_step_graph_create(&rec->graph, rec) == LOOM_OK, "step graph: %s", loom_error_message());
    int64_t n = ops->model->num_elements, sn = ops->opt->n, skipped = 0;
    for (int s = 0; s < 8; s++) {
        if (s == 4) ops->cfg.lr.max_lr = rec->cfg.lr.max_lr = 1e30f; // step 5 applied, then not finite
        loom_step_result ro, rr;
        T_ASSERT(loom_train_step(ops, t_random_batch, NULL, &ro) == LOOM_OK, "step %d op by op", s);
        T_ASSERT(loom_train_step(rec, t_random_batch, NULL, &rr) == LOOM_OK, "step %d recorded", s);
        skipped += ro.skipped;
        T_ASSERT(same(&ro.loss, &rr.loss, sizeof ro.loss) && same(&ro.norm, &rr.norm, sizeof ro.norm) &&
                     ro.lr == rr.lr && ro.skipped == rr.skipped,
                 "step %d: loss %.17g vs %.17g, norm %.17g vs %.17g, lr %g vs %g, skipped %d vs %d", s, ro.loss, rr.loss,
                 ro.norm, rr.norm, ro.lr, rr.lr, ro.skipped, rr.skipped);
        T_ASSERT(same(ops->model->params, rec->model->params, (size_t)n * sizeof(float)) &&
                     same(ops->opt->m, rec->opt->m, (size_t)sn * sizeof(float)) &&
                     same(ops->opt->v, rec->opt->v, (size_t)sn * sizeof(float)),
                 "step %d: the parameters or moments differ", s);
        T_ASSERT(ops->opt->t == rec->opt->t && ops->opt->t == s + 1 && ops->st.step == rec->st.step &&
                     ops->st.data_position == rec->st.data_position &&
                     same(&ops->st.train_loss, &rec->st.train_loss, sizeof ops->st.train_loss),
                 "step %d: optimizer step %lld vs %lld, trainer step %lld vs %lld", s, (long long)ops->opt->t,
                 (long long)rec->opt->t, (long long)ops->st.step, (long long)rec->st.step);
        printf("step %d: loss %.6f norm %.6g lr %.3g%s\n", s + 1, ro.loss, ro.norm, ro.lr, ro.skipped ? " (skipped)" : "");
    }
    T_ASSERT(skipped >= 2, "%lld steps skipped: the raised learning rate should make the last ones not finite",
             (long long)skipped);
    loom_trainer_free(ops);
    loom_trainer_free(rec);
    int rc = t_done("step_graph");
    loom_comm_finalize(world);
    return rc;
}
