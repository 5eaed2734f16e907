// `loom schedule`: draws a pipeline schedule as the papers do — its action lists run by the
// simulator with unit costs (F = I = W = 1, B = 2), one row per rank — with its bubble
// fraction and each rank's peak of micro-batches in flight (parallel/pipeline_schedule.h).
// No training and no MPI.
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/log.h"
#include "model/gpt2_params.h"
#include "parallel/pipeline_schedule.h"

int loom_cmd_schedule(int argc, char **argv) {
    const char *kind_name = "1f1b";
    int pp = 4, M = 8, V = 0;
    const loom_flag flags[] = {
        {"pp", FLAG_INT, &pp, "pipeline ranks", 1, 64},
        {"micro-batches", FLAG_INT, &M, "micro-batches per step", 1, 1024},
        {"pp-schedule", FLAG_STR, &kind_name, "gpipe, 1f1b, interleaved, zb-h1, zb-v or dualpipev"},
        {"virtual-stages", FLAG_INT, &V, "stages per rank of the interleaved schedule (0: the schedule's own)", 0, LOOM_MAX_CHUNKS},
    };
    const loom_cli cli = {"schedule", "Draw a pipeline schedule's timeline, bubble and memory (unit costs).",
                          "loom schedule --pp P --micro-batches M --pp-schedule S [--virtual-stages V]", flags,
                          (int)(sizeof flags / sizeof flags[0]), 0};
    bool help;
    char **pos;
    int npos;
    loom_pp_kind kind;
    loom_pp_schedule *sched = NULL;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    if (s == LOOM_OK && help) return 0;
    if (s == LOOM_OK) s = loom_pp_kind_parse(kind_name, &kind);
    if (s == LOOM_OK) s = loom_pp_schedule_make(&sched, kind, pp, M, V);
    if (s == LOOM_OK) s = loom_pp_print_timeline(sched, stdout);
    if (s != LOOM_OK) loom_print_error();
    loom_pp_schedule_free(sched);
    return s == LOOM_OK ? 0 : 1;
}
