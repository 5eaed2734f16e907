#include "cli/flags.h"

#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The type's own limit: a range that reaches it has no upper end to print.
static double type_max(loom_flag_type t) {
    return t == FLAG_INT ? INT_MAX : t == FLAG_I64 ? (double)INT64_MAX : FLT_MAX;
}

// A numeric flag's range in words: "in [0, 1024]", "in [0, 1)", ">= 1", "> 0".
static void range_text(const loom_flag *f, char *out, size_t cap) {
    if (f->max >= type_max(f->type))
        snprintf(out, cap, "%s %.15g", f->open & FLAG_ABOVE_MIN ? ">" : ">=", f->min);
    else
        snprintf(out, cap, "in %c%.15g, %.15g%c", f->open & FLAG_ABOVE_MIN ? '(' : '[', f->min, f->max,
                 f->open & FLAG_BELOW_MAX ? ')' : ']');
}

// The value against the flag's range. Errors: LOOM_EINVAL "--threads must be in [0, 1024], got 100000".
static loom_status check_range(const loom_cli *cli, const loom_flag *f, double v, const char *text) {
    bool above = f->open & FLAG_ABOVE_MIN ? v > f->min : v >= f->min;
    bool below = f->open & FLAG_BELOW_MAX ? v < f->max : v <= f->max;
    if (above && below) return LOOM_OK;
    char range[80], hint[160];
    range_text(f, range, sizeof range);
    snprintf(hint, sizeof hint, "run 'loom %s --help' for the flags and their ranges", cli->command);
    return loom_fail(LOOM_EINVAL, hint, "--%s must be %s, got %s", f->name, range, text);
}

static loom_status parse_value(const loom_cli *cli, const loom_flag *f, const char *text) {
    char hint[160];
    snprintf(hint, sizeof hint, "run 'loom %s --help' for the flags", cli->command);
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case FLAG_INT:
    case FLAG_I64: {
        long long v = strtoll(text, &end, 10);
        if (end == text || *end != '\0' || errno == ERANGE ||
            (f->type == FLAG_INT && (v < INT_MIN || v > INT_MAX)))
            return loom_fail(LOOM_EINVAL, hint, "flag --%s: '%s' is not an integer", f->name, text);
        LOOM_TRY(check_range(cli, f, (double)v, text));
        if (f->type == FLAG_INT)
            *(int *)f->dst = (int)v;
        else
            *(int64_t *)f->dst = (int64_t)v;
        return LOOM_OK;
    }
    case FLAG_FLOAT: {
        double v = strtod(text, &end);
        if (end == text || *end != '\0' || errno == ERANGE || !isfinite(v))
            return loom_fail(LOOM_EINVAL, hint, "flag --%s: '%s' is not a finite number", f->name,
                             text);
        // a float holds magnitudes up to FLT_MAX (beyond: inf) and down to FLT_TRUE_MIN (below: 0)
        if (fabs(v) > FLT_MAX || (v != 0 && fabs(v) < FLT_TRUE_MIN))
            return loom_fail(LOOM_EINVAL, hint, "flag --%s: '%s' is outside the range of a float (%g to %g)",
                             f->name, text, (double)FLT_TRUE_MIN, (double)FLT_MAX);
        // the range holds for the value as stored: .99999999991 is 1 as a float
        float fv = (float)v;
        char shown[96];
        if ((double)fv == v) snprintf(shown, sizeof shown, "%s", text);
        else snprintf(shown, sizeof shown, "%.48s (%.9g as a float)", text, (double)fv);
        LOOM_TRY(check_range(cli, f, fv, shown));
        *(float *)f->dst = fv;
        return LOOM_OK;
    }
    case FLAG_STR: *(const char **)f->dst = text; return LOOM_OK;
    case FLAG_BOOL: *(bool *)f->dst = true; return LOOM_OK;
    }
    return LOOM_OK;
}

loom_status loom_flags_parse(const loom_cli *cli, int argc, char **argv, bool *help, char ***pos,
                             int *npos) {
    char hint[160];
    snprintf(hint, sizeof hint, "run 'loom %s --help' for the flags", cli->command);
    *help = false;
    struct option *opts = calloc((size_t)cli->nflags + 2, sizeof *opts);
    for (int i = 0; i < cli->nflags; i++) {
        LOOM_CHECK(cli->flags[i].type >= FLAG_STR || cli->flags[i].min < cli->flags[i].max); // a range each
        opts[i].name = cli->flags[i].name;
        opts[i].has_arg = cli->flags[i].type == FLAG_BOOL ? no_argument : required_argument;
        opts[i].val = 256 + i;
    }
    opts[cli->nflags] = (struct option){"help", no_argument, NULL, 'h'};
    opterr = 0;
    // 0, not 1: glibc then resets all of getopt's state, including the position inside a
    // cluster of short options ("-hx") that an earlier call left (and whose argv may be gone)
    optind = 0;
    loom_status st = LOOM_OK;
    for (;;) {
        int li = -1;
        int c = getopt_long(argc, argv, ":h", opts, &li);
        if (c == -1) break;
        if (c == 'h') {
            loom_flags_usage(cli, stdout);
            *help = true;
            break;
        }
        if (c == '?') { // optopt: the unknown letter of a short option, which may sit in a cluster ("-xq")
            char letter[3] = {'-', (char)optopt, '\0'};
            st = loom_fail(LOOM_EINVAL, hint, "unknown flag '%s' for 'loom %s'",
                           optopt ? letter : argv[optind - 1], cli->command);
            break;
        }
        if (c == ':') {
            st = loom_fail(LOOM_EINVAL, hint, "flag '%s' needs a value", argv[optind - 1]);
            break;
        }
        if ((st = parse_value(cli, &cli->flags[c - 256], optarg)) != LOOM_OK) break;
    }
    free(opts);
    if (st != LOOM_OK || *help) return st;
    *pos = argv + optind;
    *npos = argc - optind;
    if (*npos > cli->max_positional)
        return loom_fail(LOOM_EINVAL, hint, "unexpected argument '%s' for 'loom %s'",
                         argv[optind + cli->max_positional], cli->command);
    return LOOM_OK;
}

void loom_flags_usage(const loom_cli *cli, FILE *f) {
    fprintf(f, "%s\n\nusage: %s\n\nflags:\n", cli->summary, cli->usage);
    for (int i = 0; i < cli->nflags; i++) {
        const loom_flag *fl = &cli->flags[i];
        char def[64] = "";
        switch (fl->type) {
        case FLAG_INT: snprintf(def, sizeof def, "%d", *(int *)fl->dst); break;
        case FLAG_I64: snprintf(def, sizeof def, "%lld", (long long)*(int64_t *)fl->dst); break;
        case FLAG_FLOAT: snprintf(def, sizeof def, "%g", (double)*(float *)fl->dst); break;
        case FLAG_STR:
            snprintf(def, sizeof def, "%s", *(const char **)fl->dst ? *(const char **)fl->dst : "");
            break;
        case FLAG_BOOL: break;
        }
        char left[48], range[80] = "";
        snprintf(left, sizeof left, "--%s%s", fl->name, fl->type == FLAG_BOOL ? "" : " X");
        if (fl->type < FLAG_STR) {
            range[0] = ',', range[1] = ' ';
            range_text(fl, range + 2, sizeof range - 2);
        }
        if (def[0])
            fprintf(f, "  %-22s %s (default %s%s)\n", left, fl->help, def, range);
        else
            fprintf(f, "  %-22s %s\n", left, fl->help);
    }
}
