// `loom plot METRICS.jsonl --out FILE.png|svg`: a training run's curves (src/cli/plot.h).
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/plot.h"
#include "core/log.h"

int loom_cmd_plot(int argc, char **argv) {
    const char *out = "loss.png";
    const loom_flag flags[] = {
        {"out", FLAG_STR, &out, "the image: FILE.png (1200 x 900) or FILE.svg"},
    };
    const loom_cli cli = {"plot",
                          "Draw a metrics file of 'loom train --metrics' with gnuplot: loss (train and validation), "
                          "learning rate,\ntokens/s and MFU against the step.",
                          "loom plot METRICS.jsonl [--out loss.png|loss.svg]", flags, 1, 1};
    bool help;
    char **pos;
    int npos = 0;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    if (s == LOOM_OK && help) return 0;
    if (s == LOOM_OK && npos != 1)
        s = loom_fail(LOOM_EINVAL, "e.g. loom plot run/metrics.jsonl --out loss.png", "loom plot needs a metrics file");
    if (s == LOOM_OK) s = cli_plot_metrics(pos[0], out);
    if (s != LOOM_OK) {
        loom_print_error();
        return 1;
    }
    loom_info("plot %s -> %s\n", pos[0], out);
    return 0;
}
