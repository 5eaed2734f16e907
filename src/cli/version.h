// loom's version and the git commit it was built from.
#pragma once
#include <stddef.h>

// The release, from CMakeLists.txt's project(VERSION): "0.1.0".
const char *cli_version(void);
// The commit the program was built from (cmake/commit.cmake, refreshed at every build): 12 hex
// digits of HEAD, "-dirty" appended when tracked files differed from it; "" when built outside
// a git checkout.
const char *cli_commit(void);
// "loom 0.1.0 (commit 1a2b3c4d5e6f)", or "loom 0.1.0" outside a checkout.
void cli_version_line(char *out, size_t cap);
