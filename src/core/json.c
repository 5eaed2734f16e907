#include "core/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

cJSON *loom_json_number(double v) {
    if (!isfinite(v)) return cJSON_CreateNull();
    char text[32];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, v);
        if (strtod(text, NULL) == v) break;
    }
    return cJSON_CreateRaw(text);
}

cJSON *loom_json_add_number(cJSON *object, const char *name, double v) {
    cJSON *item = loom_json_number(v);
    return cJSON_AddItemToObject(object, name, item) ? item : NULL;
}
