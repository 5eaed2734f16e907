// JSON numbers that read back as the same double. cJSON 1.7.15 prints a number with 15
// significant digits whenever those read back within a relative 2^-52 of it (print_number's
// compare_double), which is often a neighbouring double: a step time of 0.0123...s written so
// reads back 1-2 ulps off, and its float32 (a TensorBoard scalar) then differs by an ulp in
// about 1 value of 500. Here the shortest of 15, 16 or 17 digits that strtod reads back exactly
// is written (17 always does: IEEE 754 binary64).
#pragma once
#include <cjson/cJSON.h>

// A number item of v (a null item when v is not finite: JSON has no NaN or infinity, and cJSON
// writes null for them too), or NULL when cJSON cannot allocate.
cJSON *loom_json_number(double v);
// Adds loom_json_number(v) to object under name (as cJSON_AddNumberToObject); returns the item.
cJSON *loom_json_add_number(cJSON *object, const char *name, double v);
