// `loom launch [flags] -- COMMAND...`: runs a training job and restarts it from its last
// checkpoint when it fails or hangs (src/runtime/launch.h). The flags come before `--`, the job
// after it, as it would be run alone.
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/log.h"
#include "runtime/launch.h"

#include <string.h>

// A `loom train` job that would start over on a restart: it lacks --resume. Errors: LOOM_EINVAL.
static loom_status check_resumes(char **cmd, int n) {
    bool train = false, resume = false, every = false;
    for (int i = 0; i < n; i++) {
        train |= strcmp(cmd[i], "train") == 0;
        resume |= strcmp(cmd[i], "--resume") == 0;
        every |= strncmp(cmd[i], "--ckpt-every", 12) == 0;
    }
    if (!train) return LOOM_OK;
    if (!resume)
        return loom_fail(LOOM_EINVAL, "add --resume --ckpt-dir DIR --ckpt-every N to the loom train command",
                         "the job has no --resume, so each restart would train from step 0 again");
    if (!every)
        fprintf(stderr, "loom launch: note: the job has no --ckpt-every, so it checkpoints only at the end and a "
                        "restart starts from step 0\n");
    return LOOM_OK;
}

int loom_cmd_launch(int argc, char **argv) {
    loom_launch_options o = {.max_restarts = 3};
    float hang_timeout = 0, grace = 10;
    int dashes = 1;
    while (dashes < argc && strcmp(argv[dashes], "--") != 0) dashes++;
    const loom_flag flags[] = {
        {"max-restarts", FLAG_INT, &o.max_restarts, "restarts after a failed or hung attempt", 0, 1000000},
        {"hang-timeout", FLAG_FLOAT, &hang_timeout,
         "seconds without progress from any rank (a step, a collective) before the job counts as hung; "
         "0: no watchdog", 0, 1e7},
        {"grace", FLAG_FLOAT, &grace, "seconds from SIGTERM to SIGKILL when stopping a job", 0, 3600},
    };
    const loom_cli cli = {"launch",
                          "Run a training job; when it fails or hangs, stop all of it and run it again, so that its "
                          "--resume\ncontinues from the last checkpoint. The job comes after '--', as it would be "
                          "run alone.",
                          "loom launch [flags] -- mpirun -np N loom train ... --ckpt-dir DIR --ckpt-every K --resume",
                          flags, 3, 0};
    bool help;
    char **pos;
    int npos;
    loom_status s = loom_flags_parse(&cli, dashes, argv, &help, &pos, &npos);
    if (s == LOOM_OK && help) return 0;
    o.hang_timeout = hang_timeout, o.grace = grace;
    if (s == LOOM_OK && dashes + 1 >= argc)
        s = loom_fail(LOOM_EINVAL, "e.g. loom launch --max-restarts 3 -- mpirun -np 2 loom train ... --resume",
                      "loom launch needs the job after '--'");
    if (s == LOOM_OK) s = check_resumes(argv + dashes + 1, argc - dashes - 1);
    if (s == LOOM_OK) s = loom_launch_run(&o, argv + dashes + 1);
    if (s != LOOM_OK) {
        loom_print_error();
        return 1;
    }
    return 0;
}
