// Plots of a --metrics file (src/cli/metrics.h) drawn by gnuplot: four panels against the step —
// the loss (training, and validation when recorded), the learning rate, tokens/s and MFU (in %,
// when the run knew the hardware's peak; else the panel says so) — titled with the run's
// configuration record. `loom plot` draws one; `loom train --plot FILE` redraws it at each
// validation and at the end.
#pragma once
#include "core/status.h"

// Draws metrics_path's curves into out_path, a PNG (".png", 1200 x 900 pixels) or an SVG
// (".svg"): gnuplot writes a temporary beside it, renamed over out_path on success, so a failure
// leaves no partial file. Errors: LOOM_EINVAL for another extension; LOOM_EIO for a metrics file
// that cannot be read, gnuplot missing from the PATH or failing (its first line of output), an
// output that cannot be written; LOOM_EFORMAT naming file:line for a line that is not JSON or not
// a metrics record, or a file with no training steps.
loom_status cli_plot_metrics(const char *metrics_path, const char *out_path);
// Checks what cli_plot_metrics needs before a run: the extension and gnuplot on the PATH.
// Errors: LOOM_EINVAL (extension), LOOM_EIO (no gnuplot).
loom_status cli_plot_check(const char *out_path);
