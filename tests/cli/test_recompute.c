// --recompute's values (src/cli/common.h, cli_recompute_parse): auto is selective under --precision
// fp8 (whose backward reads neither the GELU output nor the LayerNorm outputs whose FP8 copies it
// kept) and none under every other precision; the named modes pass through whatever the
// precision; an unknown one is refused with the modes listed.
#include "cli/common.h"
#include "core/status.h"
#include "harness.h"

#include <string.h>

int main(void) {
    static const char *const precisions[] = {"auto", "fp32", "bf16", "fp8"};
    static const char *const names[] = {"none", "gelu", "selective", "full"};
    for (int p = 0; p < 4; p++) {
        loom_recompute r = LOOM_RECOMPUTE_FULL;
        T_ASSERT(cli_recompute_parse("auto", precisions[p], &r) == LOOM_OK, "auto under %s", precisions[p]);
        loom_recompute want = p == 3 ? LOOM_RECOMPUTE_SELECTIVE : LOOM_RECOMPUTE_NONE;
        T_ASSERT(r == want, "auto under %s: %s, want %s", precisions[p], loom_recompute_name(r), loom_recompute_name(want));
        for (int m = 0; m < 4; m++) {
            T_ASSERT(cli_recompute_parse(names[m], precisions[p], &r) == LOOM_OK && r == (loom_recompute)m &&
                         strcmp(loom_recompute_name(r), names[m]) == 0,
                     "%s under %s", names[m], precisions[p]);
        }
    }
    loom_recompute r;
    T_ASSERT(cli_recompute_parse("some", "fp8", &r) == LOOM_EINVAL, "an unknown mode");
    T_ASSERT(strstr(loom_error_message(), "'some'") && strstr(loom_error_hint(), "auto, none, gelu, selective, full"),
             "the message names the mode and its hint lists the modes: %s (%s)", loom_error_message(),
             loom_error_hint());
    return t_done("cli_recompute");
}
