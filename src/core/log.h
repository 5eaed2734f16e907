// Rank-aware logging: loom_info prints on rank 0 only (stdout), loom_warn on every rank
// (stderr, prefixed with the rank when the world size is above 1). Single-process runs are rank 0.
#pragma once
#include <stddef.h>

void loom_log_set_rank(int rank, int world_size);
int loom_log_rank(void);
void loom_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void loom_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Prints the error recorded by loom_fail as one line on stderr (every rank):
//   loom: error: <message> (hint: <hint>)
void loom_print_error(void);
// "s" unless n is 1, for a message's plural: "%d rank%s", n, loom_plural(n)
static inline const char *loom_plural(long long n) { return n == 1 ? "" : "s"; }
// bytes as "1.23 GiB" (gib_decimals digits after the point) from 1 GiB up, else "45.6 MiB",
// into out (cap bytes)
void loom_format_bytes(char *out, size_t cap, double bytes, int gib_decimals);
