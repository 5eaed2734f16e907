#include "cli/version.h"

#include "loom_commit.h" // generated in the build folder: #define LOOM_COMMIT "..."

#include <stdio.h>

const char *cli_version(void) { return LOOM_VERSION; }

const char *cli_commit(void) { return LOOM_COMMIT; }

void cli_version_line(char *out, size_t cap) {
    if (LOOM_COMMIT[0]) snprintf(out, cap, "loom %s (commit %s)", LOOM_VERSION, LOOM_COMMIT);
    else snprintf(out, cap, "loom %s", LOOM_VERSION);
}
