/* grammar/lexer/regex.py's parser in C: regex source (as code points) -> terms of a C store.
 *
 * It makes the same constructor calls in the same order as the Python parser (the reference,
 * tested equal on the corpora and on fuzzed patterns), so a store gets the same ids either
 * way. It builds with the store's exported constructors (lexer.c). Anything it does not
 * handle exactly as Python does (an error to report, a rule call, a backslash or a brace
 * body with a non-ASCII character, nesting past MAX_NEST) returns PARSE_BAIL: the caller then
 * runs the Python parser, which raises the error with its message or parses it. A store error
 * (too many terms, the deadline) returns minus its code, as the constructors do.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct Store Store;
int32_t rg_literal(Store *st, const uint8_t *data, int64_t n, double deadline);
int32_t rg_cat(Store *st, int32_t a, int32_t b, double deadline);
int32_t rg_seq(Store *st, const int32_t *items, int64_t n, double deadline);
int32_t rg_alt(Store *st, const int32_t *items, int64_t n, double deadline);
int32_t rg_rep(Store *st, int32_t r, int64_t lo, int64_t hi, double deadline);
int32_t rg_tag(Store *st, int32_t r, double deadline);
int32_t rg_byte_sequences(Store *st, const uint8_t *masks, const int64_t *lengths, int64_t n,
                          double deadline);
int32_t rg_trie(Store *st, const uint8_t *data, const int64_t *offs, int64_t n, double deadline);
int64_t rg_spans(const uint32_t *s, int64_t n, int64_t *starts, int64_t *ends);

#define EMPTY 0
#define EPS 1
#define PARSE_BAIL (-100)
#define MAX_NEST 2000
#define MEMO_MIN_LEN 256
#define TRIE_MIN 64
#define TRIE_MAX_LEN 512
#define MAX_REPEAT (INT64_C(1) << 32)
#define COUNTER_MAX (INT64_C(1) << 62)
#define MAX_CODE_POINT 0x10FFFF

/* ------------------------------------------------------------------ growable arrays */

typedef struct {
    uint8_t *data;
    int64_t n, cap;
} Bytes;

static int bytes_put(Bytes *b, const uint8_t *data, int64_t n) {
    if (b->n + n > b->cap) {
        int64_t cap = b->cap ? 2 * b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        uint8_t *grown = realloc(b->data, (size_t)cap);
        if (!grown) return 0;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->n, data, (size_t)n);
    b->n += n;
    return 1;
}

/* A code point as UTF-8 into out (room for 4); returns the length. */
static int utf8_encode(uint32_t c, uint8_t *out) {
    if (c < 0x80) {
        out[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (uint8_t)(0xC0 | (c >> 6));
        out[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (c >> 12));
        out[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (c >> 18));
    out[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* A sequence item or an alternation branch: a term, or literal bytes not made into one yet. */
typedef struct {
    int32_t term; /* -1: the bytes */
    Bytes bytes;
} Item;

typedef struct {
    Item *items;
    int64_t n, cap;
} Items;

static Item *items_add(Items *v) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 8;
        Item *grown = realloc(v->items, (size_t)cap * sizeof(Item));
        if (!grown) return NULL;
        v->items = grown;
        v->cap = cap;
    }
    Item *item = &v->items[v->n++];
    memset(item, 0, sizeof *item);
    item->term = -1;
    return item;
}

static void items_free(Items *v) {
    for (int64_t i = 0; i < v->n; i++) free(v->items[i].bytes.data);
    free(v->items);
}

typedef struct {
    uint32_t lo, hi;
} Range;

typedef struct {
    Range *r;
    int64_t n, cap;
} Ranges;

static int ranges_add(Ranges *v, uint32_t lo, uint32_t hi) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 16;
        Range *grown = realloc(v->r, (size_t)cap * sizeof(Range));
        if (!grown) return 0;
        v->r = grown;
        v->cap = cap;
    }
    v->r[v->n].lo = lo;
    v->r[v->n++].hi = hi;
    return 1;
}

/* ------------------------------------------------------------------ the parser */

typedef struct {
    const uint32_t *src;
    int64_t len, pos, end; /* end: where the pattern stops (before a final '$') */
    Store *st;
    double deadline;
    int32_t err; /* 0, PARSE_BAIL, or minus a store error */
    int32_t nest;
    int64_t *span_end; /* [len]: the end of the group or class opening there, or -1 */
    /* groups and classes parsed already, by their source text (open addressing) */
    int64_t *memo_start, *memo_end;
    int32_t *memo_term;
    int64_t memo_cap, memo_n;
    const uint32_t *tags; /* the tagged groups' texts, concatenated */
    const int64_t *tag_offs;
    int64_t num_tags;
} Parser;

static int32_t fail(Parser *p, int32_t why) {
    if (!p->err) p->err = why;
    return EMPTY;
}

/* A constructor's result, or EMPTY with the error kept. */
static int32_t made(Parser *p, int32_t t) {
    if (t < 0) return fail(p, t);
    return t;
}

static inline int32_t peek(const Parser *p) { return p->pos < p->end ? (int32_t)p->src[p->pos] : -1; }

static int is_word(uint32_t c) { /* Python's \w, ASCII part */
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static int is_space(uint32_t c) { /* Python's \s and str.isspace, ASCII part */
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
}

static int is_digit(uint32_t c) { return c >= '0' && c <= '9'; }
static int is_alnum(uint32_t c) { return is_word(c) && c != '_'; }
static int is_special(uint32_t c) { return c && strchr("\\[](){}|*+?.^$", (int)c) != NULL; }

static int32_t alternation(Parser *p);

static int32_t literal(Parser *p, const Bytes *b) {
    return made(p, rg_literal(p->st, b->data, b->n, p->deadline));
}

static int32_t rep(Parser *p, int32_t t, int64_t lo, int64_t hi) {
    lo = lo < COUNTER_MAX ? lo : COUNTER_MAX;
    hi = hi < 0 ? -1 : hi < COUNTER_MAX ? hi : COUNTER_MAX;
    return made(p, rg_rep(p->st, t, lo, hi, p->deadline));
}

/* ------------------------------------------------------------------ character classes */

static int cmp_range(const void *x, const void *y) {
    const Range *a = x, *b = y;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    return a->hi < b->hi ? -1 : a->hi > b->hi;
}

/* utf8.normalize, in place: sorted, merged, non-overlapping. */
static void normalize(Ranges *v) {
    if (!v->n) return;
    qsort(v->r, (size_t)v->n, sizeof(Range), cmp_range);
    int64_t k = 0;
    for (int64_t i = 1; i < v->n; i++) {
        if (v->r[i].lo <= v->r[k].hi + 1) {
            if (v->r[i].hi > v->r[k].hi) v->r[k].hi = v->r[i].hi;
        } else {
            v->r[++k] = v->r[i];
        }
    }
    v->n = k + 1;
}

/* utf8.complement, in place. */
static int complement(Ranges *v) {
    normalize(v);
    Ranges out = {0};
    uint32_t start = 0;
    for (int64_t i = 0; i < v->n; i++) {
        if (v->r[i].lo > start && !ranges_add(&out, start, v->r[i].lo - 1)) return 0;
        start = v->r[i].hi + 1;
    }
    if (start <= MAX_CODE_POINT && !ranges_add(&out, start, MAX_CODE_POINT)) return 0;
    free(v->r);
    *v = out;
    return 1;
}

/* utf8._split_same_length: the byte-range sequences of lo..hi (one encoded length), appended
 * to masks (32 bytes per byte set) and lengths. */
static int split_same_length(uint32_t lo, uint32_t hi, Bytes *masks, Bytes *lengths) {
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t low_bits = ((uint32_t)1 << (6 * i)) - 1;
        if ((lo & ~low_bits) != (hi & ~low_bits)) {
            if (lo & low_bits)
                return split_same_length(lo, lo | low_bits, masks, lengths) &&
                       split_same_length((lo | low_bits) + 1, hi, masks, lengths);
            if ((hi & low_bits) != low_bits)
                return split_same_length(lo, (hi & ~low_bits) - 1, masks, lengths) &&
                       split_same_length(hi & ~low_bits, hi, masks, lengths);
        }
    }
    utf8_encode(hi, b);
    for (int k = 0; k < n; k++) {
        uint8_t m[32] = {0};
        for (int byte = a[k]; byte <= b[k]; byte++) m[byte >> 3] |= (uint8_t)(1 << (byte & 7));
        if (!bytes_put(masks, m, 32)) return 0;
    }
    int64_t len = n;
    return bytes_put(lengths, (const uint8_t *)&len, sizeof len);
}

/* utf8.utf8_sequences(lo, hi), appended. */
static int utf8_sequences(uint32_t lo, uint32_t hi, Bytes *masks, Bytes *lengths) {
    static const uint32_t limits[4] = {0x7F, 0x7FF, 0xFFFF, MAX_CODE_POINT};
    uint32_t parts[2][2];
    int num_parts = 0;
    if (hi < 0xD800 || lo > 0xDFFF) { /* without the surrogates */
        parts[num_parts][0] = lo;
        parts[num_parts++][1] = hi;
    } else {
        if (lo < 0xD800) {
            parts[num_parts][0] = lo;
            parts[num_parts++][1] = 0xD7FF;
        }
        if (hi > 0xDFFF) {
            parts[num_parts][0] = 0xE000;
            parts[num_parts++][1] = hi;
        }
    }
    for (int k = 0; k < num_parts; k++) {
        uint32_t start = parts[k][0], part_hi = parts[k][1];
        for (int i = 0; i < 4 && start <= part_hi; i++) {
            if (start <= limits[i]) {
                uint32_t end = part_hi < limits[i] ? part_hi : limits[i];
                if (!split_same_length(start, end, masks, lengths)) return 0;
                start = end + 1;
            }
        }
    }
    return 1;
}

/* regex.ranges_to_term (EMPTY for no ranges); consumes v. */
static int32_t class_term(Parser *p, Ranges *v) {
    int32_t term = EMPTY;
    if (v->n) {
        normalize(v);
        Bytes masks = {0}, lengths = {0};
        int ok = 1;
        for (int64_t i = 0; i < v->n && ok; i++) ok = utf8_sequences(v->r[i].lo, v->r[i].hi, &masks, &lengths);
        if (!ok)
            fail(p, PARSE_BAIL);
        else
            term = made(p, rg_byte_sequences(p->st, masks.data, (const int64_t *)lengths.data,
                                             lengths.n / (int64_t)sizeof(int64_t), p->deadline));
        free(masks.data);
        free(lengths.data);
    }
    free(v->r);
    v->r = NULL;
    return term;
}

static int shorthand(uint32_t c, Ranges *out) {
    switch (c | 0x20) {
    case 'd':
        return ranges_add(out, '0', '9');
    case 'w':
        return ranges_add(out, '0', '9') && ranges_add(out, 'A', 'Z') && ranges_add(out, '_', '_') &&
               ranges_add(out, 'a', 'z');
    default: /* 's' */
        return ranges_add(out, 0x09, 0x0D) && ranges_add(out, 0x20, 0x20);
    }
}

static int hex_value(uint32_t c) {
    if (c >= '0' && c <= '9') return (int)(c - '0');
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (int)((c | 0x20) - 'a' + 10);
    return -1;
}

/* regex._Parser._escape, after the backslash: the ranges it stands for into out. */
static void escape(Parser *p, int in_class, Ranges *out) {
    int32_t ch = peek(p);
    if (ch < 0 || ch >= 0x80) { /* an error, or a non-ASCII escape (Unicode classes) */
        fail(p, PARSE_BAIL);
        return;
    }
    p->pos++;
    if (strchr("dwsDWS", ch) && ch) {
        if (!shorthand((uint32_t)ch, out) || ((ch < 'a') && !complement(out))) fail(p, PARSE_BAIL);
        return;
    }
    int32_t following = peek(p);
    const char *controls = "ntrfva0";
    const uint32_t codes[] = {'\n', '\t', '\r', '\f', '\v', '\a', 0};
    const char *at = ch ? strchr(controls, ch) : NULL;
    if (at && ch == '0' && following >= 0x80) {
        fail(p, PARSE_BAIL);
        return;
    }
    if (at && !(ch == '0' && following >= 0 && is_digit((uint32_t)following))) {
        uint32_t code = codes[at - controls];
        if (!ranges_add(out, code, code)) fail(p, PARSE_BAIL);
        return;
    }
    int digits = ch == 'x' ? 2 : ch == 'u' ? 4 : ch == 'U' ? 8 : 0;
    if (digits) {
        uint64_t code = 0;
        for (int i = 0; i < digits; i++) {
            int v = p->pos + i < p->len ? hex_value(p->src[p->pos + i]) : -1;
            if (v < 0) {
                fail(p, PARSE_BAIL);
                return;
            }
            code = code * 16 + (uint64_t)v;
        }
        p->pos += digits;
        if (code > MAX_CODE_POINT || !ranges_add(out, (uint32_t)code, (uint32_t)code)) fail(p, PARSE_BAIL);
        return;
    }
    if (ch == 'b' && in_class) {
        if (!ranges_add(out, 0x08, 0x08)) fail(p, PARSE_BAIL);
        return;
    }
    if (strchr("bBAZzG", ch) || is_digit((uint32_t)ch) || is_alnum((uint32_t)ch)) {
        fail(p, PARSE_BAIL); /* anchors, backreferences, bad escapes: errors */
        return;
    }
    if (!ranges_add(out, (uint32_t)ch, (uint32_t)ch)) fail(p, PARSE_BAIL);
}

/* regex._Parser._class_item. */
static void class_item(Parser *p, Ranges *out) {
    uint32_t ch = p->src[p->pos++];
    if (ch == '\\') {
        escape(p, 1, out);
        return;
    }
    if (ch == '[' && peek(p) == ':') {
        fail(p, PARSE_BAIL);
        return;
    }
    if (!ranges_add(out, ch, ch)) fail(p, PARSE_BAIL);
}

/* regex._Parser._class, after the '[': its ranges, normalized, into out. */
static void char_class(Parser *p, Ranges *out) {
    int negated = peek(p) == '^', first = 1;
    if (negated) p->pos++;
    while (!p->err) {
        int32_t ch = peek(p);
        if (ch < 0) {
            fail(p, PARSE_BAIL);
            return;
        }
        if (ch == ']' && !first) {
            p->pos++;
            break;
        }
        first = 0;
        Ranges low = {0};
        class_item(p, &low);
        if (!p->err && peek(p) == '-' && p->pos + 1 < p->end && p->src[p->pos + 1] != ']') {
            p->pos++;
            Ranges high = {0};
            class_item(p, &high);
            if (!p->err && (low.n != 1 || high.n != 1 || low.r[0].lo != low.r[0].hi ||
                            high.r[0].lo != high.r[0].hi || high.r[0].lo < low.r[0].lo))
                fail(p, PARSE_BAIL);
            if (!p->err && !ranges_add(out, low.r[0].lo, high.r[0].lo)) fail(p, PARSE_BAIL);
            free(high.r);
        } else {
            for (int64_t i = 0; i < low.n && !p->err; i++)
                if (!ranges_add(out, low.r[i].lo, low.r[i].hi)) fail(p, PARSE_BAIL);
        }
        free(low.r);
    }
    if (p->err) return;
    if (negated) {
        if (!complement(out)) fail(p, PARSE_BAIL);
    } else {
        normalize(out);
    }
}

/* ------------------------------------------------------------------ groups and the memo */

static uint64_t text_hash(const uint32_t *s, int64_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int64_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ULL;
    return h ^ (uint64_t)n;
}

static int same_text(const Parser *p, int64_t a, int64_t a_end, const uint32_t *b, int64_t b_n) {
    return a_end - a == b_n && !memcmp(p->src + a, b, (size_t)b_n * sizeof(uint32_t));
}

/* The memo slot of src[start:end]: its entry, or the empty slot where it would go. */
static int64_t memo_slot(const Parser *p, int64_t start, int64_t end) {
    uint64_t mask = (uint64_t)p->memo_cap - 1;
    int64_t i = (int64_t)(text_hash(p->src + start, end - start) & mask);
    while (p->memo_start[i] >= 0 &&
           !same_text(p, p->memo_start[i], p->memo_end[i], p->src + start, end - start))
        i = (int64_t)(((uint64_t)i + 1) & mask);
    return i;
}

static int memo_grow(Parser *p) {
    int64_t old_cap = p->memo_cap, *old_start = p->memo_start, *old_end = p->memo_end;
    int32_t *old_term = p->memo_term;
    p->memo_cap = old_cap ? 2 * old_cap : 64;
    p->memo_start = malloc((size_t)p->memo_cap * sizeof(int64_t));
    p->memo_end = malloc((size_t)p->memo_cap * sizeof(int64_t));
    p->memo_term = malloc((size_t)p->memo_cap * sizeof(int32_t));
    if (!p->memo_start || !p->memo_end || !p->memo_term) return 0;
    memset(p->memo_start, 0xff, (size_t)p->memo_cap * sizeof(int64_t));
    for (int64_t i = 0; i < old_cap; i++) {
        if (old_start[i] < 0) continue;
        int64_t j = memo_slot(p, old_start[i], old_end[i]);
        p->memo_start[j] = old_start[i];
        p->memo_end[j] = old_end[i];
        p->memo_term[j] = old_term[i];
    }
    free(old_start);
    free(old_end);
    free(old_term);
    return 1;
}

static int is_tagged(const Parser *p, int64_t start, int64_t end) {
    for (int64_t k = 0; k < p->num_tags; k++)
        if (same_text(p, start, end, p->tags + p->tag_offs[k], p->tag_offs[k + 1] - p->tag_offs[k]))
            return 1;
    return 0;
}

static int32_t group(Parser *p);
static int32_t class_atom(Parser *p);

/* regex._Parser._memoized: the group (or class) opening at pos - 1, reusing an identical
 * earlier one whose parse ended where its span does. */
static int32_t memoized(Parser *p, int is_group) {
    int64_t start = p->pos - 1, end = p->span_end ? p->span_end[start] : -1;
    if (end < 0) return is_group ? group(p) : class_atom(p);
    if (2 * (p->memo_n + 1) > p->memo_cap && !memo_grow(p)) return fail(p, PARSE_BAIL);
    int64_t slot = memo_slot(p, start, end);
    if (p->memo_start[slot] >= 0) {
        p->pos = end;
        return p->memo_term[slot];
    }
    int32_t term = is_group ? group(p) : class_atom(p);
    if (!p->err && p->pos == end) {
        if (is_tagged(p, start, end)) term = made(p, rg_tag(p->st, term, p->deadline));
        if (2 * (p->memo_n + 1) > p->memo_cap && !memo_grow(p)) return fail(p, PARSE_BAIL);
        slot = memo_slot(p, start, end); /* the parse inside may have added entries */
        p->memo_start[slot] = start;
        p->memo_end[slot] = end;
        p->memo_term[slot] = term;
        p->memo_n++;
    }
    return term;
}

static int starts_with(const Parser *p, int64_t at, const char *text) {
    for (int64_t i = 0; text[i]; i++)
        if (at + i >= p->len || p->src[at + i] != (uint8_t)text[i]) return 0;
    return 1;
}

/* regex._Parser._group, after the '('. */
static int32_t group(Parser *p) {
    if (starts_with(p, p->pos, "?")) {
        if (starts_with(p, p->pos, "?:")) {
            p->pos += 2;
        } else if ((starts_with(p, p->pos, "?P<") || starts_with(p, p->pos, "?<")) &&
                   !starts_with(p, p->pos, "?<=") && !starts_with(p, p->pos, "?<!")) {
            int64_t close = p->pos;
            while (close < p->len && p->src[close] != '>') close++;
            if (close == p->len) return fail(p, PARSE_BAIL);
            p->pos = close + 1;
        } else {
            return fail(p, PARSE_BAIL); /* rule calls, lookaround, flags: Python says */
        }
    }
    if (++p->nest > MAX_NEST) return fail(p, PARSE_BAIL);
    int32_t term = alternation(p);
    p->nest--;
    if (p->err) return EMPTY;
    if (peek(p) != ')') return fail(p, PARSE_BAIL);
    p->pos++;
    return term;
}

static int32_t class_atom(Parser *p) {
    Ranges v = {0};
    char_class(p, &v);
    if (p->err) {
        free(v.r);
        return EMPTY;
    }
    return class_term(p, &v);
}

/* ------------------------------------------------------------------ quantifiers and atoms */

/* regex._Parser._braces at pos ('{'): 1 and the bounds (hi -1: none) if it is a quantifier,
 * moving past it; 0 (a literal '{') if not. */
static int braces(Parser *p, int64_t *lo, int64_t *hi) {
    int64_t close = p->pos;
    while (close < p->end && p->src[close] != '}') close++;
    if (close >= p->end) return 0;
    int64_t comma = -1;
    for (int64_t i = p->pos + 1; i < close; i++) {
        uint32_t c = p->src[i];
        if (c >= 0x80) { /* Unicode digits count in Python */
            fail(p, PARSE_BAIL);
            return 0;
        }
        if (c == ',' && comma < 0) comma = i;
    }
    int64_t lo_end = comma < 0 ? close : comma;
    int64_t lo_n = lo_end - p->pos - 1, hi_n = comma < 0 ? 0 : close - comma - 1;
    uint64_t values[2] = {0, 0};
    const int64_t begins[2] = {p->pos + 1, comma + 1}, counts[2] = {lo_n, hi_n};
    for (int k = 0; k < 2; k++) {
        for (int64_t i = 0; i < counts[k]; i++) {
            uint32_t c = p->src[begins[k] + i];
            if (!is_digit(c)) return 0;
            values[k] = values[k] * 10 + (c - '0');
            if (values[k] > (uint64_t)MAX_REPEAT) values[k] = (uint64_t)MAX_REPEAT; /* too large */
        }
    }
    if (!lo_n && comma < 0) return 0;
    *lo = (int64_t)values[0];
    *hi = comma < 0 ? *lo : hi_n ? (int64_t)values[1] : -1;
    if ((*hi >= 0 && *hi < *lo) || *lo >= MAX_REPEAT || *hi >= MAX_REPEAT) {
        fail(p, PARSE_BAIL);
        return 0;
    }
    p->pos = close + 1;
    return 1;
}

/* regex._Parser._quantified. */
static int32_t quantified(Parser *p, int32_t term) {
    while (!p->err) {
        int32_t ch = peek(p);
        int64_t lo, hi;
        if (ch == '*' || ch == '+' || ch == '?') {
            p->pos++;
            lo = ch == '+';
            hi = ch == '?' ? 1 : -1;
        } else if (ch == '{' && braces(p, &lo, &hi)) {
        } else {
            return term;
        }
        if (peek(p) == '?')
            p->pos++;
        else if (peek(p) == '+')
            return fail(p, PARSE_BAIL); /* possessive */
        term = rep(p, term, lo, hi);
    }
    return EMPTY;
}

/* regex._Parser._atom. */
static int32_t atom(Parser *p) {
    uint32_t ch = p->src[p->pos];
    int64_t lo, hi;
    if (ch == '*' || ch == '+' || ch == '?') return fail(p, PARSE_BAIL);
    if (ch == '{' && braces(p, &lo, &hi)) return fail(p, PARSE_BAIL);
    if (p->err) return EMPTY;
    p->pos++;
    if (ch == '(') return memoized(p, 1);
    if (ch == '[') return memoized(p, 0);
    if (ch == '.' || ch == '\\') {
        Ranges v = {0};
        if (ch == '.') {
            if (!ranges_add(&v, 0x0A, 0x0A) || !complement(&v)) fail(p, PARSE_BAIL);
        } else {
            escape(p, 0, &v);
        }
        if (p->err) {
            free(v.r);
            return EMPTY;
        }
        return class_term(p, &v);
    }
    if (ch == '^' || ch == '$') return fail(p, PARSE_BAIL);
    uint8_t data[4];
    Bytes b = {data, utf8_encode(ch, data), 4};
    return literal(p, &b);
}

/* ------------------------------------------------------------------ sequences */

/* The end of the run of literal characters (regex._RUN) starting at pos: plain characters
 * and escaped punctuation. */
static int64_t run_end(const Parser *p) {
    int64_t i = p->pos;
    while (i < p->end) {
        uint32_t c = p->src[i];
        if (c == '\\') {
            if (i + 1 >= p->end) break;
            uint32_t next = p->src[i + 1];
            if (next >= 0x80 || is_word(next) || is_space(next)) break;
            i += 2;
        } else if (is_special(c)) {
            break;
        } else {
            i++;
        }
    }
    return i;
}

/* Append the run src[a:b] unescaped, as UTF-8. */
static int put_run(const Parser *p, int64_t a, int64_t b, Bytes *out) {
    for (int64_t i = a; i < b; i++) {
        uint32_t c = p->src[i];
        if (c == '\\') c = p->src[++i];
        uint8_t buf[4];
        if (!bytes_put(out, buf, utf8_encode(c, buf))) return 0;
    }
    return 1;
}

/* regex._Parser._sequence: its term into *term, or its bytes into *bytes (returns 1) when it
 * is one literal run. */
static int sequence(Parser *p, int32_t *term, Bytes *bytes) {
    Items items = {0};
    int32_t ch;
    while (!p->err && (ch = peek(p)) >= 0 && ch != '|' && ch != ')') {
        int64_t end = run_end(p);
        if (end > p->pos) {
            if (end < p->end && strchr("*+?{", (int)p->src[end])) { /* its last character is quantified */
                int64_t back = 0; /* backslashes before the last character */
                while (end - 2 - back >= p->pos && p->src[end - 2 - back] == '\\') back++;
                end -= back % 2 ? 2 : 1;
            }
            if (end > p->pos) {
                Item *last = items.n ? &items.items[items.n - 1] : NULL;
                Item *item = last && last->term < 0 ? last : items_add(&items); /* _join_runs */
                if (!item || !put_run(p, p->pos, end, &item->bytes)) {
                    fail(p, PARSE_BAIL);
                    break;
                }
                p->pos = end;
                continue;
            }
        }
        int32_t t = quantified(p, atom(p));
        Item *item = items_add(&items);
        if (!item) {
            fail(p, PARSE_BAIL);
            break;
        }
        item->term = t;
    }
    int is_bytes = 0;
    if (p->err) {
    } else if (!items.n) {
        is_bytes = 1;
    } else if (items.n == 1 && items.items[0].term < 0) {
        is_bytes = bytes_put(bytes, items.items[0].bytes.data, items.items[0].bytes.n);
        if (!is_bytes) fail(p, PARSE_BAIL);
    } else {
        int32_t *ids = malloc((size_t)items.n * sizeof(int32_t));
        if (!ids) {
            fail(p, PARSE_BAIL);
        } else {
            for (int64_t i = 0; i < items.n && !p->err; i++)
                ids[i] = items.items[i].term >= 0 ? items.items[i].term : literal(p, &items.items[i].bytes);
            if (!p->err) {
                int32_t t = items.n == 1   ? ids[0]
                            : items.n == 2 ? rg_cat(p->st, ids[0], ids[1], p->deadline)
                                           : rg_seq(p->st, ids, items.n, p->deadline);
                *term = made(p, t);
            }
            free(ids);
        }
    }
    items_free(&items);
    return is_bytes;
}

/* ------------------------------------------------------------------ alternations */

typedef struct {
    const uint8_t *data;
    int64_t n;
} Word;

static int cmp_word(const void *x, const void *y) {
    const Word *a = x, *b = y;
    int64_t n = a->n < b->n ? a->n : b->n;
    int c = memcmp(a->data, b->data, (size_t)n);
    if (c) return c;
    return (a->n > b->n) - (a->n < b->n);
}

/* regex._trie over n words (sorting them, dropping repeats), or -2 when one is longer than
 * TRIE_MAX_LEN (the caller does otherwise). */
static int32_t trie(Parser *p, Word *words, int64_t n) {
    qsort(words, (size_t)n, sizeof(Word), cmp_word);
    int64_t k = 0, total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (words[i].n > TRIE_MAX_LEN) return -2;
        if (k && !cmp_word(&words[k - 1], &words[i])) continue;
        words[k++] = words[i];
    }
    for (int64_t i = 0; i < k; i++) total += words[i].n;
    uint8_t *data = malloc((size_t)(total ? total : 1));
    int64_t *offs = malloc((size_t)(k + 1) * sizeof(int64_t));
    int32_t term = EMPTY;
    if (!data || !offs) {
        fail(p, PARSE_BAIL);
    } else {
        offs[0] = 0;
        for (int64_t i = 0; i < k; i++) {
            memcpy(data + offs[i], words[i].data, (size_t)words[i].n);
            offs[i + 1] = offs[i] + words[i].n;
        }
        term = made(p, rg_trie(p->st, data, offs, k, p->deadline));
    }
    free(data);
    free(offs);
    return term;
}

/* regex._Parser._literal_alternation: a big alternation of plain literals starting at pos,
 * built as a trie (moving past it); -1 if it is anything else. */
static int32_t literal_alternation(Parser *p) {
    int64_t start = p->pos, stop = start, bars = 0;
    while (stop < p->end) { /* the first special character not escaped */
        uint32_t c = p->src[stop];
        if (c == '\\') {
            bars += stop + 1 < p->end && p->src[stop + 1] == '|'; /* Python counts these too */
            stop += 2;
            continue;
        }
        if (c == '|') bars++;
        if (c != '|' && is_special(c)) break;
        stop++;
    }
    if (stop > p->end) return -1; /* a lone backslash at the end: Python's way */
    if (stop < p->end && p->src[stop] != ')') return -1;
    if (bars + 1 < TRIE_MIN) return -1;
    Bytes data = {0};
    int64_t cap = bars + 1, n = 0;
    int64_t *ends = malloc((size_t)cap * sizeof(int64_t));
    if (!ends) return fail(p, PARSE_BAIL);
    for (int64_t i = start; i < stop && !p->err; i++) {
        uint32_t c = p->src[i];
        if (c == '|') {
            ends[n++] = data.n;
            continue;
        }
        if (c == '\\') {
            c = p->src[++i];
            if (c >= 0x80 || is_alnum(c) || c == '_' || c == ' ' || (c >= 0x09 && c <= 0x0D)) {
                free(ends);
                free(data.data);
                return -1; /* \d, \n, \x41...: not a literal character */
            }
        }
        uint8_t buf[4];
        if (!bytes_put(&data, buf, utf8_encode(c, buf))) fail(p, PARSE_BAIL);
    }
    ends[n++] = data.n;
    int32_t term = EMPTY;
    Word *words = p->err ? NULL : malloc((size_t)n * sizeof(Word));
    if (words) {
        for (int64_t i = 0; i < n; i++) {
            int64_t a = i ? ends[i - 1] : 0;
            words[i].data = data.data ? data.data + a : (const uint8_t *)"";
            words[i].n = ends[i] - a;
        }
        term = trie(p, words, n);
        if (term == -2) {
            term = -1; /* a word too long: not this way */
        } else {
            p->pos = stop;
        }
    } else {
        fail(p, PARSE_BAIL);
    }
    free(words);
    free(ends);
    free(data.data);
    return term;
}

/* regex._Parser._alternation. */
static int32_t alternation(Parser *p) {
    int32_t words = literal_alternation(p);
    if (p->err) return EMPTY;
    if (words >= 0) return words;
    Items branches = {0};
    int all_bytes = 1;
    do {
        if (branches.n) p->pos++; /* the '|' */
        Item *b = items_add(&branches);
        if (!b) {
            fail(p, PARSE_BAIL);
            break;
        }
        int32_t t = EMPTY;
        if (!sequence(p, &t, &b->bytes)) {
            b->term = t;
            all_bytes = 0;
        }
    } while (!p->err && peek(p) == '|');
    int32_t term = EMPTY;
    if (!p->err && branches.n >= TRIE_MIN && all_bytes) {
        Word *words = malloc((size_t)branches.n * sizeof(Word));
        if (!words) {
            fail(p, PARSE_BAIL);
        } else {
            for (int64_t i = 0; i < branches.n; i++) {
                words[i].data = branches.items[i].bytes.data ? branches.items[i].bytes.data : (const uint8_t *)"";
                words[i].n = branches.items[i].bytes.n;
            }
            term = trie(p, words, branches.n);
            free(words);
            if (term != -2) {
                items_free(&branches);
                return term;
            }
            term = EMPTY;
        }
    }
    if (!p->err) {
        int32_t *ids = malloc((size_t)branches.n * sizeof(int32_t));
        if (!ids) {
            fail(p, PARSE_BAIL);
        } else {
            for (int64_t i = 0; i < branches.n && !p->err; i++)
                ids[i] = branches.items[i].term >= 0 ? branches.items[i].term
                                                     : literal(p, &branches.items[i].bytes);
            if (!p->err) term = made(p, rg_alt(p->st, ids, branches.n, p->deadline));
            free(ids);
        }
    }
    items_free(&branches);
    return term;
}

/* ------------------------------------------------------------------ entry */

/* regex_to_term(pattern, store, tag=...) for a pattern of n code points; `tags` holds the
 * tagged groups' texts (num_tags of them, text k being tags[tag_offs[k]:tag_offs[k + 1]]).
 * Returns the term, PARSE_BAIL (the Python parser must do it), or minus a store error. */
int32_t rg_parse_regex(Store *st, const uint32_t *src, int64_t n, const uint32_t *tags,
                       const int64_t *tag_offs, int64_t num_tags, double deadline) {
    Parser p = {0};
    p.src = src;
    p.len = p.end = n;
    p.st = st;
    p.deadline = deadline;
    p.tags = tags;
    p.tag_offs = tag_offs;
    p.num_tags = num_tags;
    if (n > MEMO_MIN_LEN || num_tags) {
        int64_t *starts = malloc((size_t)(n + 1) * sizeof(int64_t));
        int64_t *ends = malloc((size_t)(n + 1) * sizeof(int64_t));
        p.span_end = malloc((size_t)(n + 1) * sizeof(int64_t));
        int64_t count = starts && ends && p.span_end ? rg_spans(src, n, starts, ends) : -1;
        if (count < 0) {
            p.err = PARSE_BAIL;
        } else {
            memset(p.span_end, 0xff, (size_t)(n + 1) * sizeof(int64_t));
            for (int64_t i = 0; i < count; i++) p.span_end[starts[i]] = ends[i];
        }
        free(starts);
        free(ends);
    }
    int32_t term = EMPTY;
    if (!p.err) {
        if (n && src[0] == '^') p.pos = 1;
        if (n && src[n - 1] == '$' && n > p.pos) {
            int64_t back = 0;
            while (n - 2 - back >= 0 && src[n - 2 - back] == '\\') back++;
            if (back % 2 == 0) p.end = n - 1; /* an unescaped final '$' */
        }
        term = alternation(&p);
        if (!p.err && p.pos < p.end) p.err = PARSE_BAIL; /* a stray ')' */
    }
    free(p.span_end);
    free(p.memo_start);
    free(p.memo_end);
    free(p.memo_term);
    return p.err ? p.err : term;
}
