// UTF-8 validation and replacement of invalid sequences with U+FFFD, following the WHATWG
// Encoding Standard's UTF-8 decoder (the behaviour of TextDecoder and of Node's 'utf8'
// reading): each maximal subpart of an invalid sequence becomes one U+FFFD.
#include "data/tokenizer.h"

#include <string.h>

// Length of the valid sequence starting at s[i] (1-4), or 0 if the bytes from s[i] are not
// a valid sequence; *bad is then the number of bytes the replacement covers (>= 1).
static size_t sequence_at(const unsigned char *s, size_t len, size_t i, size_t *bad) {
    unsigned char b = s[i];
    if (b < 0x80) return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b >= 0xE1 && b <= 0xEF) need = 2;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else {
        *bad = 1;
        return 0;
    }
    size_t j = i + 1;
    for (int k = 0; k < need; k++, j++) {
        if (j >= len || s[j] < (k == 0 ? lo : 0x80) || s[j] > (k == 0 ? hi : 0xBF)) {
            *bad = j - i; // the maximal subpart: the lead byte and the continuations so far
            return 0;
        }
    }
    return j - i;
}

bool loom_utf8_valid(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t bad;
    for (size_t i = 0; i < len;) {
        size_t n = sequence_at(s, len, i, &bad);
        if (!n) return false;
        i += n;
    }
    return true;
}

char *loom_utf8_sanitize(const char *str, size_t len, size_t *out_len) {
    const unsigned char *s = (const unsigned char *)str;
    char *out = loom_xmalloc(3 * len + 1), *o = out;
    size_t bad;
    for (size_t i = 0; i < len;) {
        size_t n = sequence_at(s, len, i, &bad);
        if (n) {
            memcpy(o, s + i, n);
            o += n, i += n;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3, i += bad;
        }
    }
    *o = '\0';
    *out_len = (size_t)(o - out);
    return out;
}
