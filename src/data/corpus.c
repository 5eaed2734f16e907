#include "data/corpus.h"

#include "core/fileio.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void push_doc(loom_corpus *c, char *text, size_t len) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->docs = realloc(c->docs, c->cap * sizeof *c->docs);
        LOOM_CHECK(c->docs);
    }
    c->docs[c->n++] = (loom_document){text, len};
    c->bytes += len;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static loom_status add_jsonl(loom_corpus *c, const char *path, char *data, size_t size) {
    size_t line_no = 0;
    for (char *line = data; line < data + size;) {
        char *nl = memchr(line, '\n', (size_t)(data + size - line));
        size_t len = nl ? (size_t)(nl - line) : (size_t)(data + size - line);
        line_no++;
        bool blank = true;
        for (size_t i = 0; i < len && blank; i++) blank = strchr(" \t\r", line[i]) != NULL;
        if (!blank) {
            cJSON *j = cJSON_ParseWithLength(line, len);
            cJSON *text = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "text") : NULL;
            if (!cJSON_IsString(text)) {
                cJSON_Delete(j);
                return loom_fail(LOOM_EFORMAT, "each line must be a JSON object with a \"text\" string",
                                 "%s:%zu: %s", path, line_no,
                                 j ? "no \"text\" string field" : "not valid JSON");
            }
            size_t tlen = strlen(text->valuestring);
            char *copy = loom_xmalloc(tlen + 1);
            memcpy(copy, text->valuestring, tlen + 1);
            push_doc(c, copy, tlen);
            cJSON_Delete(j);
        }
        line += len + 1;
    }
    return LOOM_OK;
}

static loom_status add_file(loom_corpus *c, const char *path, const char *format) {
    bool jsonl = strcmp(format, "jsonl") == 0 ||
                 (strcmp(format, "auto") == 0 && (ends_with(path, ".jsonl") || ends_with(path, ".json")));
    char *data;
    size_t size;
    LOOM_TRY(loom_read_file(path, &data, &size));
    c->files++;
    if (!jsonl) {
        push_doc(c, data, size);
        return LOOM_OK;
    }
    loom_status s = add_jsonl(c, path, data, size);
    free(data);
    return s;
}

static int visible(const struct dirent *e) { return e->d_name[0] != '.'; }

static loom_status add_dir(loom_corpus *c, const char *path, const char *format) {
    struct dirent **names;
    int n = scandir(path, &names, visible, alphasort);
    if (n < 0) return loom_fail(LOOM_EIO, NULL, "cannot read folder %s: %s", path, strerror(errno));
    loom_status s = LOOM_OK;
    for (int i = 0; i < n; i++) {
        char child[4096];
        snprintf(child, sizeof child, "%s/%s", path, names[i]->d_name);
        if (s == LOOM_OK) s = loom_corpus_add(c, child, format);
        free(names[i]);
    }
    free(names);
    return s;
}

loom_status loom_corpus_add(loom_corpus *c, const char *path, const char *format) {
    if (strcmp(format, "auto") != 0 && strcmp(format, "text") != 0 && strcmp(format, "jsonl") != 0)
        return loom_fail(LOOM_EINVAL, "formats are: auto, text, jsonl", "unknown input format '%s'", format);
    struct stat st;
    if (stat(path, &st) != 0)
        return errno == ENOENT ? loom_fail(LOOM_EIO, "check the input path", "input %s does not exist", path)
                               : loom_fail(LOOM_EIO, NULL, "cannot read input %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return add_dir(c, path, format);
    if (!S_ISREG(st.st_mode))
        return loom_fail(LOOM_EINVAL, "give text files, folders of them, or JSON Lines",
                         "input %s is %s, not a file or folder", path, loom_file_kind(st.st_mode));
    return add_file(c, path, format);
}

void loom_corpus_free(loom_corpus *c) {
    for (size_t i = 0; i < c->n; i++) free(c->docs[i].text);
    free(c->docs);
    *c = (loom_corpus){0};
}
