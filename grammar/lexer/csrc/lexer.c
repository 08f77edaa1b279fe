/* The lexer's hot path in C: hash-consed regex terms over bytes, their Brzozowski
 * derivatives, and the lazy byte DFA whose states are terms, with batched token walks.
 *
 * This is the same algebra as grammar/terms.py and grammar/automaton.py (the Python
 * reference, which stays the fallback and is tested equal): constructors normalize as they
 * build (EMPTY absorbs concatenation, EPS is its unit, alternation is flattened, sorted,
 * deduplicated and merges its byte sets), so equal ids mean equal terms; bounded repetition
 * keeps counters; a transition is the derivative of a state's term by its class's byte.
 * Built the same way, a store assigns the same ids as the Python one.
 *
 * Errors (too many terms or states, the compile deadline, nesting too deep) set `err`;
 * constructors then return EMPTY and nothing is memoized, and the Python binding raises
 * after the call. Not thread-safe: the owner serializes calls (the DFA's lock).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { K_EMPTY, K_EPS, K_SET, K_CAT, K_ALT, K_REP, K_TAG };
enum { ERR_NONE, ERR_TERMS, ERR_TIMEOUT, ERR_DEPTH, ERR_STATES, ERR_MEMORY };

#define EMPTY 0
#define EPS 1
#define DEAD 0
#define UNKNOWN (-1)
#define MAX_DEPTH 20000

typedef struct {
    uint64_t w[4];
} Mask;

static inline int mask_has(const Mask *m, int byte) { return (m->w[byte >> 6] >> (byte & 63)) & 1; }
static inline int mask_empty(const Mask *m) { return !(m->w[0] | m->w[1] | m->w[2] | m->w[3]); }
static inline int mask_eq(const Mask *x, const Mask *y) { return !memcmp(x, y, sizeof(Mask)); }
static inline void mask_or(Mask *x, const Mask *y) {
    for (int i = 0; i < 4; i++) x->w[i] |= y->w[i];
}

static inline uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* ------------------------------------------------------------------ int64 -> int32 memo */

typedef struct {
    int64_t *keys; /* -1: empty slot */
    int32_t *vals;
    int64_t cap, n;
} Memo;

static int memo_init(Memo *m, int64_t cap) {
    m->keys = malloc(cap * sizeof(int64_t));
    m->vals = malloc(cap * sizeof(int32_t));
    if (!m->keys || !m->vals) return 0;
    memset(m->keys, 0xff, cap * sizeof(int64_t));
    m->cap = cap;
    m->n = 0;
    return 1;
}

static void memo_free(Memo *m) {
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
}

static inline int memo_get(const Memo *m, int64_t key, int32_t *out) {
    int64_t i = (int64_t)(mix64((uint64_t)key) & (uint64_t)(m->cap - 1));
    while (m->keys[i] != -1) {
        if (m->keys[i] == key) {
            *out = m->vals[i];
            return 1;
        }
        i = (i + 1) & (m->cap - 1);
    }
    return 0;
}

static void memo_insert(int64_t *keys, int32_t *vals, int64_t cap, int64_t key, int32_t val) {
    int64_t i = (int64_t)(mix64((uint64_t)key) & (uint64_t)(cap - 1));
    while (keys[i] != -1 && keys[i] != key) i = (i + 1) & (cap - 1);
    keys[i] = key;
    vals[i] = val;
}

static int memo_put(Memo *m, int64_t key, int32_t val) {
    if (2 * (m->n + 1) > m->cap) {
        Memo bigger;
        if (!memo_init(&bigger, 2 * m->cap)) return 0;
        for (int64_t i = 0; i < m->cap; i++)
            if (m->keys[i] != -1) memo_insert(bigger.keys, bigger.vals, bigger.cap, m->keys[i], m->vals[i]);
        bigger.n = m->n;
        memo_free(m);
        *m = bigger;
    }
    int32_t old;
    if (!memo_get(m, key, &old)) m->n++;
    memo_insert(m->keys, m->vals, m->cap, key, val);
    return 1;
}

/* ------------------------------------------------------------------ terms */

typedef struct Store {
    int32_t n, cap;
    uint8_t *kind, *nullable, *big;
    int8_t *head_tagged; /* memo: -1 unknown */
    int32_t *a;          /* CAT head, REP body, TAG body */
    int64_t *b, *c;      /* CAT tail; REP lo, hi (-1: unbounded); ALT pool offset, count */
    Mask *first;         /* bytes with a non-empty derivative (SET: the set itself) */
    int32_t *pool;       /* ALT members, sorted */
    int64_t pool_n, pool_cap;
    int32_t *ids; /* hash-consing: term ids by structure, -1 empty */
    int64_t ids_cap, ids_n;
    Memo derivs, clips;
    struct SafeRun *runs; /* safe runs, by term (rg_safe_run); length -1: not known yet */
    int32_t runs_cap;
    int32_t clip_bound, max_terms, has_tags, err, depth;
    double deadline; /* CLOCK_MONOTONIC seconds (Python's time.monotonic), 0: none */
} Store;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t hash_fields(int kind, int32_t a, int64_t b, int64_t c) {
    uint64_t h = mix64((uint64_t)kind * 0x9e3779b97f4a7c15ULL + (uint64_t)(uint32_t)a);
    h = mix64(h ^ (uint64_t)b);
    return mix64(h ^ (uint64_t)c);
}

static uint64_t hash_mask(const Mask *m) {
    uint64_t h = 0x5bd1e995ULL;
    for (int i = 0; i < 4; i++) h = mix64(h ^ m->w[i]);
    return h;
}

static uint64_t hash_members(const int32_t *m, int64_t n) {
    uint64_t h = 0x27d4eb2f165667c5ULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) h = mix64(h ^ (uint64_t)(uint32_t)m[i]);
    return h;
}

static uint64_t term_hash(const Store *st, int32_t t) {
    switch (st->kind[t]) {
    case K_SET:
        return hash_mask(&st->first[t]);
    case K_ALT:
        return hash_members(st->pool + st->b[t], st->c[t]);
    default:
        return hash_fields(st->kind[t], st->a[t], st->b[t], st->c[t]);
    }
}

static int grow_terms(Store *st) {
    int32_t cap = st->cap * 2;
#define GROW(field, type)                                                   \
    do {                                                                    \
        type *p = realloc(st->field, (size_t)cap * sizeof(type));           \
        if (!p) return 0;                                                   \
        st->field = p;                                                      \
    } while (0)
    GROW(kind, uint8_t);
    GROW(nullable, uint8_t);
    GROW(big, uint8_t);
    GROW(head_tagged, int8_t);
    GROW(a, int32_t);
    GROW(b, int64_t);
    GROW(c, int64_t);
    GROW(first, Mask);
#undef GROW
    st->cap = cap;
    return 1;
}

static int rehash_ids(Store *st, int64_t cap) {
    int32_t *ids = malloc(cap * sizeof(int32_t));
    if (!ids) return 0;
    memset(ids, 0xff, cap * sizeof(int32_t));
    for (int32_t t = 2; t < st->n; t++) {
        int64_t i = (int64_t)(term_hash(st, t) & (uint64_t)(cap - 1));
        while (ids[i] != -1) i = (i + 1) & (cap - 1);
        ids[i] = t;
    }
    free(st->ids);
    st->ids = ids;
    st->ids_cap = cap;
    return 1;
}

static int same_term(const Store *st, int32_t t, int kind, int32_t a, int64_t b, int64_t c,
                     const Mask *set, const int32_t *members, int64_t count) {
    if (st->kind[t] != kind) return 0;
    if (kind == K_SET) return mask_eq(&st->first[t], set);
    if (kind == K_ALT)
        return st->c[t] == count && !memcmp(st->pool + st->b[t], members, (size_t)count * sizeof(int32_t));
    return st->a[t] == a && st->b[t] == b && st->c[t] == c;
}

/* The term of this structure: found, or made (with its nullable/big flags and first bytes). */
static int32_t make(Store *st, int kind, int32_t a, int64_t b, int64_t c, const Mask *set,
                    const int32_t *members, int64_t count, int nullable, int big) {
    if (st->err) return EMPTY;
    uint64_t h = kind == K_SET ? hash_mask(set) : kind == K_ALT ? hash_members(members, count)
                                                               : hash_fields(kind, a, b, c);
    int64_t i = (int64_t)(h & (uint64_t)(st->ids_cap - 1));
    while (st->ids[i] != -1) {
        int32_t t = st->ids[i];
        if (same_term(st, t, kind, a, b, c, set, members, count)) return t;
        i = (i + 1) & (st->ids_cap - 1);
    }
    int32_t t = st->n;
    if ((t & 1023) == 0) {
        if (t >= st->max_terms) {
            st->err = ERR_TERMS;
            return EMPTY;
        }
        if (st->deadline > 0 && now_s() > st->deadline) {
            st->err = ERR_TIMEOUT;
            return EMPTY;
        }
    }
    if (t >= st->cap && !grow_terms(st)) {
        st->err = ERR_MEMORY;
        return EMPTY;
    }
    Mask first = {{0, 0, 0, 0}};
    if (kind == K_SET) {
        first = *set;
    } else if (kind == K_ALT) {
        if (st->pool_n + count > st->pool_cap) {
            int64_t cap = 2 * (st->pool_cap + count);
            int32_t *p = realloc(st->pool, (size_t)cap * sizeof(int32_t));
            if (!p) {
                st->err = ERR_MEMORY;
                return EMPTY;
            }
            st->pool = p;
            st->pool_cap = cap;
        }
        memcpy(st->pool + st->pool_n, members, (size_t)count * sizeof(int32_t));
        b = st->pool_n;
        c = count;
        st->pool_n += count;
        for (int64_t k = 0; k < count; k++) mask_or(&first, &st->first[members[k]]);
    } else if (kind == K_CAT) {
        first = st->first[a];
        if (st->nullable[a]) mask_or(&first, &st->first[b]);
    } else { /* REP, TAG */
        first = st->first[a];
    }
    st->kind[t] = (uint8_t)kind;
    st->a[t] = a;
    st->b[t] = b;
    st->c[t] = c;
    st->nullable[t] = (uint8_t)nullable;
    st->big[t] = (uint8_t)big;
    st->head_tagged[t] = -1;
    st->first[t] = first;
    st->n = t + 1;
    st->ids[i] = t;
    if (2 * ++st->ids_n > st->ids_cap && !rehash_ids(st, 2 * st->ids_cap)) st->err = ERR_MEMORY;
    return t;
}

Store *rg_store_new(int32_t clip_bound, int32_t max_terms) {
    Store *st = calloc(1, sizeof(Store));
    if (!st) return NULL;
    st->cap = 1024;
    st->kind = malloc(st->cap);
    st->nullable = malloc(st->cap);
    st->big = malloc(st->cap);
    st->head_tagged = malloc(st->cap);
    st->a = malloc(st->cap * sizeof(int32_t));
    st->b = malloc(st->cap * sizeof(int64_t));
    st->c = malloc(st->cap * sizeof(int64_t));
    st->first = calloc(st->cap, sizeof(Mask));
    st->pool_cap = 1024;
    st->pool = malloc(st->pool_cap * sizeof(int32_t));
    st->ids_cap = 4096;
    st->ids = malloc(st->ids_cap * sizeof(int32_t));
    if (!st->kind || !st->nullable || !st->big || !st->head_tagged || !st->a || !st->b || !st->c ||
        !st->first || !st->pool || !st->ids || !memo_init(&st->derivs, 4096) || !memo_init(&st->clips, 256))
        return NULL; /* the process is out of memory anyway */
    memset(st->ids, 0xff, st->ids_cap * sizeof(int32_t));
    for (int t = 0; t < 2; t++) { /* EMPTY, EPS */
        st->kind[t] = (uint8_t)(t == 0 ? K_EMPTY : K_EPS);
        st->nullable[t] = (uint8_t)t;
        st->big[t] = 0;
        st->head_tagged[t] = 0;
        st->a[t] = 0;
        st->b[t] = st->c[t] = 0;
    }
    st->n = 2;
    st->clip_bound = clip_bound;
    st->max_terms = max_terms;
    return st;
}

void rg_store_free(Store *st) {
    if (!st) return;
    free(st->kind);
    free(st->nullable);
    free(st->big);
    free(st->head_tagged);
    free(st->a);
    free(st->b);
    free(st->c);
    free(st->first);
    free(st->pool);
    free(st->ids);
    memo_free(&st->derivs);
    memo_free(&st->clips);
    free(st->runs);
    free(st);
}

/* Every entry point starts here: clear the last call's error, take this call's deadline. */
static inline void begin(Store *st, double deadline) {
    st->err = ERR_NONE;
    st->depth = 0;
    st->deadline = deadline;
}

/* ... and returns through here: the result, or minus the error code. */
static inline int32_t finish(const Store *st, int32_t result) { return st->err ? -st->err : result; }

static int32_t byteset(Store *st, const Mask *m) {
    return mask_empty(m) ? EMPTY : make(st, K_SET, 0, 0, 0, m, NULL, 0, 0, 0);
}

static int32_t cat(Store *st, int32_t a, int32_t b) {
    if (a == EMPTY || b == EMPTY) return EMPTY;
    if (a == EPS) return b;
    if (b == EPS) return a;
    return make(st, K_CAT, a, b, 0, NULL, NULL, 0, st->nullable[a] && st->nullable[b], st->big[a] || st->big[b]);
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

static int32_t alt(Store *st, const int32_t *items, int64_t n) {
    int64_t live = 0, only = EMPTY;
    for (int64_t i = 0; i < n; i++)
        if (items[i] != EMPTY) {
            live++;
            only = items[i];
        }
    if (live <= 1) return (int32_t)only;
    int64_t cap = 0;
    for (int64_t i = 0; i < n; i++) cap += st->kind[items[i]] == K_ALT ? st->c[items[i]] : 1;
    int32_t *members = malloc((size_t)(cap + 1) * sizeof(int32_t));
    if (!members) {
        st->err = ERR_MEMORY;
        return EMPTY;
    }
    int64_t count = 0;
    Mask sets = {{0, 0, 0, 0}};
    for (int64_t i = 0; i < n; i++) {
        int32_t t = items[i];
        if (st->kind[t] == K_ALT) {
            const int32_t *m = st->pool + st->b[t];
            for (int64_t k = 0; k < st->c[t]; k++) {
                if (st->kind[m[k]] == K_SET)
                    mask_or(&sets, &st->first[m[k]]);
                else
                    members[count++] = m[k];
            }
        } else if (st->kind[t] == K_SET) {
            mask_or(&sets, &st->first[t]);
        } else if (t != EMPTY) {
            members[count++] = t;
        }
    }
    if (!mask_empty(&sets)) members[count++] = byteset(st, &sets);
    qsort(members, (size_t)count, sizeof(int32_t), cmp_i32);
    int64_t unique = 0;
    for (int64_t k = 0; k < count; k++)
        if (unique == 0 || members[unique - 1] != members[k]) members[unique++] = members[k];
    int32_t t;
    if (unique <= 1) {
        t = unique ? members[0] : EMPTY;
    } else {
        int nullable = 0, big = 0;
        for (int64_t k = 0; k < unique; k++) {
            nullable |= st->nullable[members[k]];
            big |= st->big[members[k]];
        }
        t = make(st, K_ALT, 0, 0, 0, NULL, members, unique, nullable, big);
    }
    free(members);
    return t;
}

static int32_t rep(Store *st, int32_t r, int64_t lo, int64_t hi) {
    if (hi == 0 || r == EPS) return EPS;
    if (r == EMPTY) return lo == 0 ? EPS : EMPTY;
    if (st->nullable[r]) lo = 0;
    if (lo == 1 && hi == 1) return r;
    int64_t bound = st->clip_bound;
    int big = lo > bound || (hi >= 0 && hi > bound) || st->big[r];
    return make(st, K_REP, r, lo, hi, NULL, NULL, 0, lo == 0, big);
}

static int32_t tag(Store *st, int32_t r) {
    if (r <= EPS || st->kind[r] == K_TAG) return r;
    st->has_tags = 1;
    return make(st, K_TAG, r, 0, 0, NULL, NULL, 0, st->nullable[r], st->big[r]);
}

static int enter(Store *st) {
    if (++st->depth > MAX_DEPTH) {
        st->err = ERR_DEPTH;
        st->depth--;
        return 0;
    }
    return 1;
}

static int32_t deriv(Store *st, int32_t t, int byte);

static int32_t derive(Store *st, int32_t t, int byte) {
    switch (st->kind[t]) {
    case K_SET:
        return EPS; /* the caller checked the byte is in the set */
    case K_CAT: {
        if (st->kind[st->a[t]] == K_SET) return (int32_t)st->b[t]; /* a byte, then the tail */
        /* Down the chain of nullable heads at once: d(h1 h2 .. t) = d(h1) h2 .. t | d(h2 .. t)
         * when h1 is nullable. One alternation of every part, not one per link: a chain of
         * n optional members (an object's optional properties) costs n, not n^2. */
        int32_t local[16];
        int32_t *parts = local;
        int64_t k = 0, cap = 16;
        int32_t cur = t;
        for (;;) {
            int32_t d;
            int last = 0;
            if (st->kind[cur] != K_CAT) {
                d = deriv(st, cur, byte);
                last = 1;
            } else if (st->kind[st->a[cur]] == K_SET) {
                d = mask_has(&st->first[st->a[cur]], byte) ? (int32_t)st->b[cur] : EMPTY;
                last = 1;
            } else {
                int32_t head = st->a[cur], tail = (int32_t)st->b[cur];
                d = cat(st, deriv(st, head, byte), tail);
                last = !st->nullable[head];
                cur = tail;
            }
            if (st->err) break;
            if (d != EMPTY) {
                if (k == cap) {
                    int32_t *grown = malloc((size_t)(2 * cap) * sizeof(int32_t));
                    if (!grown) {
                        st->err = ERR_MEMORY;
                        break;
                    }
                    memcpy(grown, parts, (size_t)k * sizeof(int32_t));
                    if (parts != local) free(parts);
                    parts = grown;
                    cap *= 2;
                }
                parts[k++] = d;
            }
            if (last) break;
        }
        int32_t d = st->err ? EMPTY : alt(st, parts, k);
        if (parts != local) free(parts);
        return d;
    }
    case K_ALT: {
        int64_t count = st->c[t];
        int32_t local[16];
        int32_t *parts = count <= 16 ? local : malloc((size_t)count * sizeof(int32_t));
        if (!parts) {
            st->err = ERR_MEMORY;
            return EMPTY;
        }
        int64_t k = 0;
        for (int64_t i = 0; i < count; i++) {
            int32_t u = st->pool[st->b[t] + i]; /* re-read: deriv may grow the pool */
            if (mask_has(&st->first[u], byte)) parts[k++] = deriv(st, u, byte);
        }
        int32_t d = alt(st, parts, k);
        if (parts != local) free(parts);
        return d;
    }
    case K_REP: {
        int32_t r = st->a[t];
        int64_t lo = st->b[t], hi = st->c[t];
        int32_t rest = rep(st, r, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
        return cat(st, deriv(st, r, byte), rest);
    }
    case K_TAG:
        return tag(st, deriv(st, st->a[t], byte));
    }
    return EMPTY;
}

static int32_t deriv(Store *st, int32_t t, int byte) {
    if (!mask_has(&st->first[t], byte) || st->err) return EMPTY;
    int64_t key = (int64_t)t * 256 + byte;
    int32_t d;
    if (memo_get(&st->derivs, key, &d)) return d;
    if (!enter(st)) return EMPTY;
    d = derive(st, t, byte);
    st->depth--;
    if (!st->err && !memo_put(&st->derivs, key, d)) st->err = ERR_MEMORY;
    return d;
}

static int32_t clip(Store *st, int32_t t, int32_t bound);

static int32_t clip_now(Store *st, int32_t t, int32_t bound) {
    switch (st->kind[t]) {
    case K_TAG:
        return tag(st, clip(st, st->a[t], bound));
    case K_CAT: {
        int32_t head = clip(st, st->a[t], bound);
        return cat(st, head, clip(st, (int32_t)st->b[t], bound));
    }
    case K_ALT: {
        int64_t count = st->c[t];
        int32_t *parts = malloc((size_t)count * sizeof(int32_t));
        if (!parts) {
            st->err = ERR_MEMORY;
            return EMPTY;
        }
        for (int64_t i = 0; i < count; i++) parts[i] = clip(st, st->pool[st->b[t] + i], bound);
        int32_t d = alt(st, parts, count);
        free(parts);
        return d;
    }
    case K_REP: {
        int64_t lo = st->b[t], hi = st->c[t];
        int32_t body = clip(st, st->a[t], bound);
        return rep(st, body, lo < bound ? lo : bound, hi < 0 ? -1 : hi < bound ? hi : bound);
    }
    }
    return t;
}

static int32_t clip(Store *st, int32_t t, int32_t bound) {
    if (!st->big[t] || st->err) return t;
    int64_t key = ((int64_t)t << 32) | (uint32_t)bound;
    int32_t c;
    if (memo_get(&st->clips, key, &c)) return c;
    if (!enter(st)) return EMPTY;
    c = clip_now(st, t, bound);
    st->depth--;
    if (!st->err && !memo_put(&st->clips, key, c)) st->err = ERR_MEMORY;
    return c;
}

static int head_tagged(Store *st, int32_t t) {
    if (st->head_tagged[t] >= 0 || st->err) return st->head_tagged[t] > 0;
    if (!enter(st)) return 0;
    int result = 0;
    switch (st->kind[t]) {
    case K_TAG:
        result = 1;
        break;
    case K_CAT: {
        int32_t head = st->a[t];
        result = head_tagged(st, head) && (!st->nullable[head] || head_tagged(st, (int32_t)st->b[t]));
        break;
    }
    case K_ALT:
        result = 1;
        for (int64_t i = 0; i < st->c[t] && result; i++) result = head_tagged(st, st->pool[st->b[t] + i]);
        break;
    }
    st->depth--;
    if (!st->err) st->head_tagged[t] = (int8_t)result;
    return result;
}

/* ---- the store's entry points (the Python binding, grammar/native_lexer.py) ---- */

int32_t rg_byteset(Store *st, const uint64_t *mask, double deadline) {
    begin(st, deadline);
    return finish(st, byteset(st, (const Mask *)mask));
}

int32_t rg_cat(Store *st, int32_t a, int32_t b, double deadline) {
    begin(st, deadline);
    return finish(st, cat(st, a, b));
}

/* TermStore.seq: items[0..n) concatenated, nested to the right (the same cat calls). */
int32_t rg_seq(Store *st, const int32_t *items, int64_t n, double deadline) {
    begin(st, deadline);
    int32_t term = EPS;
    for (int64_t i = n - 1; i >= 0 && !st->err; i--) term = cat(st, items[i], term);
    return finish(st, term);
}

/* regex.ranges_to_term: the alternation of n sequences of byte sets, sequence i being
 * lengths[i] sets of 32 bytes (bit b = byte b) read in order from `masks`; each sequence's sets
 * are made in order, then concatenated from the right, as the Python reference does. */
int32_t rg_byte_sequences(Store *st, const uint8_t *masks, const int64_t *lengths, int64_t n,
                          double deadline) {
    begin(st, deadline);
    int32_t local[32];
    int32_t *items = n <= 32 ? local : malloc((size_t)n * sizeof(int32_t));
    if (!items) return -ERR_MEMORY;
    for (int64_t i = 0; i < n && !st->err; i++) {
        int32_t sets[4], term = EPS;
        int64_t len = lengths[i] < 4 ? lengths[i] : 4; /* UTF-8: at most 4 bytes */
        for (int64_t k = 0; k < len && !st->err; k++) {
            Mask m;
            memcpy(&m, masks + 32 * k, sizeof m);
            sets[k] = byteset(st, &m);
        }
        for (int64_t k = len - 1; k >= 0 && !st->err; k--) term = cat(st, sets[k], term);
        masks += 32 * lengths[i];
        items[i] = term;
    }
    int32_t result = st->err ? EMPTY : alt(st, items, n);
    if (items != local) free(items);
    return finish(st, result);
}

/* The byte string `data`: its bytes' sets in order, then concatenated from the right (the
   calls, and so the ids, of TermStore.literal). */
static int32_t literal(Store *st, const uint8_t *data, int64_t n) {
    int32_t local[64];
    int32_t *heads = n <= 64 ? local : malloc((size_t)n * sizeof(int32_t));
    if (!heads) {
        st->err = ERR_MEMORY;
        return EMPTY;
    }
    for (int64_t i = 0; i < n && !st->err; i++) {
        Mask m = {{0, 0, 0, 0}};
        m.w[data[i] >> 6] = (uint64_t)1 << (data[i] & 63);
        heads[i] = byteset(st, &m);
    }
    int32_t term = EPS;
    for (int64_t i = n - 1; i >= 0 && !st->err; i--) term = cat(st, heads[i], term);
    if (heads != local) free(heads);
    return term;
}

int32_t rg_literal(Store *st, const uint8_t *data, int64_t n, double deadline) {
    begin(st, deadline);
    return finish(st, literal(st, data, n));
}

/* The alternation of words lo..hi-1 (sorted, distinct, sharing their first `depth` bytes;
   word i is data[offs[i] .. offs[i+1])) factored by prefix, making the terms of the Python
   reference (grammar/lexer/regex.py: _trie) in the same order. */
static int32_t trie(Store *st, const uint8_t *data, const int64_t *offs, int64_t lo, int64_t hi,
                    int64_t depth) {
    int64_t cap = hi - lo < 258 ? hi - lo : 258, n = 0;
    int32_t *options = malloc((size_t)cap * sizeof(int32_t));
    if (!options) {
        st->err = ERR_MEMORY;
        return EMPTY;
    }
    int64_t i = lo;
    if (offs[i + 1] - offs[i] == depth) {  /* the shared prefix is a word: sorted first */
        options[n++] = EPS;
        i++;
    }
    while (i < hi && !st->err) {
        uint8_t first = data[offs[i] + depth];
        int64_t j = i + 1;
        while (j < hi && data[offs[j] + depth] == first) j++;
        const uint8_t *low = data + offs[i], *high = data + offs[j - 1];
        int64_t low_len = offs[i + 1] - offs[i], high_len = offs[j] - offs[j - 1];
        if (j - i == 1) {
            options[n++] = literal(st, low + depth, low_len - depth);
        } else {
            int64_t common = depth + 1;
            while (common < low_len && common < high_len && low[common] == high[common]) common++;
            int32_t head = literal(st, low + depth, common - depth);
            int32_t tail = trie(st, data, offs, i, j, common);
            options[n++] = st->err ? EMPTY : cat(st, head, tail);
        }
        i = j;
    }
    int32_t result = st->err ? EMPTY : alt(st, options, n);
    free(options);
    return result;
}

int32_t rg_trie(Store *st, const uint8_t *data, const int64_t *offs, int64_t n, double deadline) {
    begin(st, deadline);
    return finish(st, n ? trie(st, data, offs, 0, n, 0) : EMPTY);
}

/* Start -> end (exclusive) of every parenthesized group and character class of a regex
 * given as n code points, as regex._group_and_class_spans finds them (its STRUCTURE pattern:
 * an escape, a class, a parenthesis; a '[' that never closes is a plain character). Writes
 * up to one span per '(' or '[' into starts/ends (room for that many); returns how many, or
 * -1 out of memory. */
int64_t rg_spans(const uint32_t *s, int64_t n, int64_t *starts, int64_t *ends) {
    int64_t *opens = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!opens) return -1;
    int64_t depth = 0, count = 0, i = 0;
    while (i < n) {
        uint32_t c = s[i];
        if (c == '\\') {
            i += i + 1 < n ? 2 : 1;
            continue;
        }
        if (c == '[') {
            int64_t j = i + 1, end = -1;
            if (j < n && s[j] == '^') j++;
            int64_t bracket = j < n && s[j] == ']' ? j : -1; /* a leading ']' is literal... */
            if (bracket >= 0) j++;
            while (j < n) {
                if (s[j] == '\\') {
                    if (j + 1 >= n) break;
                    j += 2;
                } else if (s[j] == ']') {
                    end = j + 1;
                    break;
                } else {
                    j++;
                }
            }
            if (end < 0 && bracket >= 0) end = bracket + 1; /* ...unless nothing else closes */
            if (end >= 0) {
                starts[count] = i;
                ends[count++] = end;
                i = end;
                continue;
            }
        } else if (c == '(') {
            opens[depth++] = i;
        } else if (c == ')' && depth > 0) {
            starts[count] = opens[--depth];
            ends[count++] = i + 1;
        }
        i++;
    }
    free(opens);
    return count;
}

int32_t rg_alt(Store *st, const int32_t *items, int64_t n, double deadline) {
    begin(st, deadline);
    return finish(st, alt(st, items, n));
}

int32_t rg_rep(Store *st, int32_t r, int64_t lo, int64_t hi, double deadline) {
    begin(st, deadline);
    return finish(st, rep(st, r, lo, hi));
}

int32_t rg_tag(Store *st, int32_t r, double deadline) {
    begin(st, deadline);
    return finish(st, tag(st, r));
}

int32_t rg_deriv(Store *st, int32_t t, int32_t byte, double deadline) {
    begin(st, deadline);
    return finish(st, deriv(st, t, byte));
}

int32_t rg_clip(Store *st, int32_t t, int32_t bound, double deadline) {
    begin(st, deadline);
    return finish(st, clip(st, t, bound < st->clip_bound ? st->clip_bound : bound));
}

int32_t rg_head_tagged(Store *st, int32_t t) {
    begin(st, 0);
    return finish(st, head_tagged(st, t));
}

/* ------------------------------------------------------------------ safe runs
 *
 * grammar/tokens/safe_runs.py's analysis (the reference, tested equal): a run (F, R, n) of a
 * term says every string whose first byte is in F, other bytes in R, and length at most n is
 * a prefix of one of its matches. A mask has 256 byte bits and one more, `utf8` ("any
 * complete non-ASCII character"). Ties between runs go to the first, as Python's max does. */

#define RUN_UNBOUNDED (INT64_C(1) << 62)
#define SAFE_RUN_MAX_DEPTH 4096 /* deeper: the caller falls back to the Python analysis */

typedef struct SafeRun {
    Mask first, rest;
    uint8_t first_utf8, rest_utf8;
    int64_t length; /* 0: no run; -1: not computed (the memo) */
} SafeRun;

static int64_t run_score(const SafeRun *r) {
    if (!r->length) return 0;
    int64_t f = r->first_utf8, o = r->rest_utf8;
    for (int i = 0; i < 4; i++) {
        f += __builtin_popcountll(r->first.w[i]);
        o += __builtin_popcountll(r->rest.w[i]);
    }
    int64_t len = r->length - 1 < 15 ? r->length - 1 : 15;
    return f + o * len;
}

static inline void run_pick(SafeRun *best, int64_t *best_score, const SafeRun *candidate) {
    int64_t score = run_score(candidate);
    if (score > *best_score) {
        *best = *candidate;
        *best_score = score;
    }
}

/* Bytes b such that t matches the one-byte string b (TermStore.single_bytes). */
static Mask single_bytes(const Store *st, int32_t t) {
    Mask none = {{0, 0, 0, 0}};
    while (st->kind[t] == K_TAG) t = st->a[t];
    if (st->kind[t] == K_SET) return st->first[t];
    if (st->kind[t] == K_ALT) {
        const int32_t *m = st->pool + st->b[t];
        for (int64_t i = 0; i < st->c[t]; i++)
            if (st->kind[m[i]] == K_SET) return st->first[m[i]];
    }
    return none;
}

/* Whether r's alternatives include every term of `non_ascii` (sorted; n = 0: never). */
static int has_non_ascii(const Store *st, int32_t r, const int32_t *non_ascii, int64_t n) {
    if (!n) return 0;
    const int32_t *m = &r;
    int64_t count = 1;
    if (st->kind[r] == K_ALT) {
        m = st->pool + st->b[r];
        count = st->c[r];
    }
    int64_t j = 0;
    for (int64_t i = 0; i < n; i++) { /* both sorted */
        while (j < count && m[j] < non_ascii[i]) j++;
        if (j == count || m[j] != non_ascii[i]) return 0;
    }
    return 1;
}

static const SafeRun *safe_run(Store *st, int32_t t, const int32_t *non_ascii, int64_t n);

static void safe_run_of(Store *st, int32_t t, const int32_t *non_ascii, int64_t n, SafeRun *out) {
    SafeRun best;
    memset(&best, 0, sizeof best);
    int64_t score = 0;
    switch (st->kind[t]) {
    case K_SET:
        best.first = st->first[t];
        best.length = 1;
        break;
    case K_CAT: {
        int32_t head = st->a[t], tail = (int32_t)st->b[t];
        const SafeRun *h = safe_run(st, head, non_ascii, n);
        if (!h) return;
        best = *h;
        score = run_score(&best);
        Mask single = single_bytes(st, head);
        int bits = 0;
        for (int i = 0; i < 4; i++) bits += __builtin_popcountll(single.w[i]);
        if (bits >= 8) {
            const SafeRun *tr = safe_run(st, tail, non_ascii, n);
            if (!tr) return;
            SafeRun joined;
            memset(&joined, 0, sizeof joined);
            joined.first = single;
            joined.rest = tr->first;
            joined.rest_utf8 = tr->first_utf8;
            if (tr->length > 1) {
                for (int i = 0; i < 4; i++) joined.rest.w[i] &= tr->rest.w[i];
                joined.rest_utf8 &= tr->rest_utf8;
            }
            if (!mask_empty(&joined.rest) || joined.rest_utf8) {
                joined.length = 1 + tr->length;
                run_pick(&best, &score, &joined);
            }
        }
        if (st->nullable[head]) {
            const SafeRun *tr = safe_run(st, tail, non_ascii, n);
            if (!tr) return;
            run_pick(&best, &score, tr);
        }
        break;
    }
    case K_ALT: {
        int64_t count = st->c[t];
        for (int64_t i = 0; i < count; i++) {
            int32_t u = st->pool[st->b[t] + i]; /* the pool does not move during this walk */
            const SafeRun *r = safe_run(st, u, non_ascii, n);
            if (!r) return;
            if (i == 0) {
                best = *r;
                score = run_score(&best);
            } else {
                run_pick(&best, &score, r);
            }
        }
        break;
    }
    case K_TAG: {
        const SafeRun *r = safe_run(st, st->a[t], non_ascii, n);
        if (!r) return;
        best = *r;
        break;
    }
    case K_REP: {
        int32_t r = st->a[t];
        const SafeRun *body = safe_run(st, r, non_ascii, n);
        if (!body) return;
        best = *body;
        score = run_score(&best);
        Mask single = single_bytes(st, r);
        if (!mask_empty(&single)) {
            SafeRun per_byte;
            per_byte.first = per_byte.rest = single;
            per_byte.first_utf8 = per_byte.rest_utf8 = (uint8_t)has_non_ascii(st, r, non_ascii, n);
            per_byte.length = st->c[t] < 0 ? RUN_UNBOUNDED : st->c[t];
            run_pick(&best, &score, &per_byte);
        }
        break;
    }
    default: /* EMPTY, EPS: no run */
        break;
    }
    *out = best;
}

/* The memoized run of t, or NULL on an error (err set). */
static const SafeRun *safe_run(Store *st, int32_t t, const int32_t *non_ascii, int64_t n) {
    if (t >= st->runs_cap) {
        int32_t cap = st->cap;
        SafeRun *runs = realloc(st->runs, (size_t)cap * sizeof(SafeRun));
        if (!runs) {
            st->err = ERR_MEMORY;
            return NULL;
        }
        for (int32_t i = st->runs_cap; i < cap; i++) runs[i].length = -1;
        st->runs = runs;
        st->runs_cap = cap;
    }
    if (st->runs[t].length >= 0) return &st->runs[t];
    if (++st->depth > SAFE_RUN_MAX_DEPTH) { /* frames are big: a thread's stack must hold them */
        st->err = ERR_DEPTH;
        st->depth--;
        return NULL;
    }
    SafeRun run;
    run.length = -1;
    safe_run_of(st, t, non_ascii, n, &run);
    st->depth--;
    if (run.length < 0) return NULL; /* an error below */
    st->runs[t] = run;
    return &st->runs[t];
}

/* The safe run of t into out: {first words 0-3, rest words 0-3, utf8 bits (first | rest << 1),
 * length}; `non_ascii`: the sorted terms of the UTF-8 sequences of every non-ASCII character
 * (n = 0: the store lacks one of them). Returns 0, or -err. */
int32_t rg_safe_run(Store *st, int32_t t, const int32_t *non_ascii, int64_t n, uint64_t *out) {
    begin(st, 0);
    const SafeRun *r = safe_run(st, t, non_ascii, n);
    if (!r) return finish(st, 0);
    memcpy(out, &r->first, sizeof(Mask));
    memcpy(out + 4, &r->rest, sizeof(Mask));
    out[8] = (uint64_t)r->first_utf8 | ((uint64_t)r->rest_utf8 << 1);
    out[9] = (uint64_t)r->length;
    return 0;
}

/* The existing SET term of `mask` or CAT term (a, b), else -1 (never creates). */
int32_t rg_find(const Store *st, int32_t kind, const uint64_t *mask, int32_t a, int32_t b) {
    uint64_t h = kind == K_SET ? hash_mask((const Mask *)mask) : hash_fields(K_CAT, a, b, 0);
    int64_t i = (int64_t)(h & (uint64_t)(st->ids_cap - 1));
    while (st->ids[i] != -1) {
        if (same_term(st, st->ids[i], kind, a, b, 0, (const Mask *)mask, NULL, 0)) return st->ids[i];
        i = (i + 1) & (st->ids_cap - 1);
    }
    return -1;
}

/* The byte classes of the store's sets (automaton.byte_classes: the coarsest partition of
 * bytes 0..255 in which every SET term's mask is a union of classes, classes numbered by
 * their first byte): class_of[256] and reps (each class's first byte); returns how many.
 * Each set splits the classes it cuts, visiting only its bytes or only the others. */
int32_t rg_byte_classes(const Store *st, int32_t *class_of, int32_t *reps) {
    int32_t cls[256], fresh[1024], next = 1;
    memset(cls, 0, sizeof cls);
    for (int32_t t = 2; t < st->n; t++) {
        if (st->kind[t] != K_SET) continue;
        const Mask *m = &st->first[t];
        int bits = 0;
        for (int i = 0; i < 4; i++) bits += __builtin_popcountll(m->w[i]);
        int inside = bits <= 128; /* move the smaller side to new classes */
        if (next + 256 > 1024) { /* renumber densely before the ids run out */
            int32_t dense[1024];
            memset(dense, 0xff, sizeof dense);
            next = 0;
            for (int b = 0; b < 256; b++) {
                if (dense[cls[b]] < 0) dense[cls[b]] = next++;
                cls[b] = dense[cls[b]];
            }
        }
        for (int32_t c = 0; c < next; c++) fresh[c] = -1;
        for (int i = 0; i < 4; i++) {
            for (uint64_t w = inside ? m->w[i] : ~m->w[i]; w; w &= w - 1) {
                int b = 64 * i + __builtin_ctzll(w);
                int32_t c = cls[b];
                if (fresh[c] < 0) fresh[c] = next++;
                cls[b] = fresh[c];
            }
        }
    }
    int32_t dense[1024], n = 0;
    memset(dense, 0xff, sizeof dense);
    for (int b = 0; b < 256; b++) {
        if (dense[cls[b]] < 0) {
            dense[cls[b]] = n;
            reps[n++] = b;
        }
        class_of[b] = dense[cls[b]];
    }
    return n;
}

/* The ids of every SET term into out (room for rg_size ids); returns how many. */
int32_t rg_set_terms(const Store *st, int32_t *out) {
    int32_t k = 0;
    for (int32_t t = 0; t < st->n; t++)
        if (st->kind[t] == K_SET) out[k++] = t;
    return k;
}

int32_t rg_size(const Store *st) { return st->n; }
int32_t rg_has_tags(const Store *st) { return st->has_tags; }

/* One term: out = {kind, nullable, big, a, b, c}; first = its 4 first-byte words. */
void rg_term(const Store *st, int32_t t, int64_t *out, uint64_t *first) {
    out[0] = st->kind[t];
    out[1] = st->nullable[t];
    out[2] = st->big[t];
    out[3] = st->a[t];
    out[4] = st->b[t];
    out[5] = st->c[t];
    memcpy(first, &st->first[t], sizeof(Mask));
}

const int32_t *rg_members(const Store *st, int32_t t) { return st->pool + st->b[t]; }
int64_t rg_pool_size(const Store *st) { return st->pool_n; }

/* Pickling: the arrays out (sizes from rg_size / rg_pool_size), and a store rebuilt from them. */
void rg_store_export(const Store *st, uint8_t *kind, uint8_t *flags, int32_t *a, int64_t *b, int64_t *c,
                     uint64_t *first, int32_t *pool) {
    memcpy(kind, st->kind, st->n);
    for (int32_t t = 0; t < st->n; t++) flags[t] = (uint8_t)(st->nullable[t] | (st->big[t] << 1));
    memcpy(a, st->a, st->n * sizeof(int32_t));
    memcpy(b, st->b, st->n * sizeof(int64_t));
    memcpy(c, st->c, st->n * sizeof(int64_t));
    memcpy(first, st->first, st->n * sizeof(Mask));
    memcpy(pool, st->pool, st->pool_n * sizeof(int32_t));
}

Store *rg_store_import(int32_t clip_bound, int32_t max_terms, int32_t has_tags, int32_t n, int64_t pool_n,
                       const uint8_t *kind, const uint8_t *flags, const int32_t *a, const int64_t *b,
                       const int64_t *c, const uint64_t *first, const int32_t *pool) {
    Store *st = rg_store_new(clip_bound, max_terms);
    if (!st) return NULL;
    while (st->cap < n)
        if (!grow_terms(st)) return NULL;
    if (pool_n > st->pool_cap) {
        free(st->pool);
        st->pool_cap = pool_n;
        if (!(st->pool = malloc(pool_n * sizeof(int32_t)))) return NULL;
    }
    memcpy(st->kind, kind, n);
    for (int32_t t = 0; t < n; t++) {
        st->nullable[t] = flags[t] & 1;
        st->big[t] = (flags[t] >> 1) & 1;
        st->head_tagged[t] = t < 2 ? 0 : -1;
    }
    memcpy(st->a, a, n * sizeof(int32_t));
    memcpy(st->b, b, n * sizeof(int64_t));
    memcpy(st->c, c, n * sizeof(int64_t));
    memcpy(st->first, first, n * sizeof(Mask));
    memcpy(st->pool, pool, pool_n * sizeof(int32_t));
    st->n = n;
    st->pool_n = pool_n;
    st->ids_n = n - 2;
    st->has_tags = has_tags;
    int64_t cap = 4096;
    while (cap < 2 * (int64_t)n + 2) cap *= 2;
    return rehash_ids(st, cap) ? st : NULL;
}

/* ------------------------------------------------------------------ the lazy DFA */

typedef struct {
    Store *st;
    int32_t num_classes, n, cap, max_states;
    int32_t class_of[256], rep[256];
    int32_t *table; /* [cap, num_classes], UNKNOWN where not computed yet */
    int32_t *terms;
    uint8_t *accepting;
    uint32_t *seen; /* [cap]: == stamp where a walk already met the state (rg_dfa_narrow_row) */
    uint32_t stamp;
    Memo state_of; /* term -> state */
} Dfa;

static int32_t dfa_state(Dfa *d, int32_t term) {
    int32_t s;
    if (memo_get(&d->state_of, term, &s)) return s;
    Store *st = d->st;
    if (st->err) return DEAD;
    s = d->n;
    if (s >= d->max_states) {
        st->err = ERR_STATES;
        return DEAD;
    }
    if ((s & 63) == 0 && st->deadline > 0 && now_s() > st->deadline) {
        st->err = ERR_TIMEOUT;
        return DEAD;
    }
    if (s >= d->cap) {
        int32_t cap = 2 * d->cap;
        int32_t *table = realloc(d->table, (size_t)cap * d->num_classes * sizeof(int32_t));
        int32_t *terms = table ? realloc(d->terms, (size_t)cap * sizeof(int32_t)) : NULL;
        uint8_t *acc = terms ? realloc(d->accepting, (size_t)cap) : NULL;
        uint32_t *seen = acc ? realloc(d->seen, (size_t)cap * sizeof(uint32_t)) : NULL;
        if (table) d->table = table;
        if (terms) d->terms = terms;
        if (acc) d->accepting = acc;
        if (!seen) {
            st->err = ERR_MEMORY;
            return DEAD;
        }
        memset(seen + d->cap, 0, (size_t)(cap - d->cap) * sizeof(uint32_t));
        d->seen = seen;
        d->cap = cap;
    }
    for (int32_t k = 0; k < d->num_classes; k++) d->table[(int64_t)s * d->num_classes + k] = UNKNOWN;
    d->terms[s] = term;
    d->accepting[s] = st->nullable[term];
    if (!memo_put(&d->state_of, term, s)) {
        st->err = ERR_MEMORY;
        return DEAD;
    }
    d->n = s + 1;
    return s;
}

static inline int32_t dfa_next(Dfa *d, int32_t s, int32_t cls) {
    int64_t cell = (int64_t)s * d->num_classes + cls;
    int32_t t = d->table[cell];
    if (t == UNKNOWN) {
        int32_t term = deriv(d->st, d->terms[s], d->rep[cls]);
        t = dfa_state(d, term);
        if (d->st->err) return DEAD;
        d->table[cell] = t;
    }
    return t;
}

Dfa *rg_dfa_new(Store *st, const int32_t *class_of, const int32_t *reps, int32_t num_classes, int32_t max_states) {
    Dfa *d = calloc(1, sizeof(Dfa));
    if (!d) return NULL;
    d->st = st;
    d->num_classes = num_classes;
    d->max_states = max_states;
    memcpy(d->class_of, class_of, sizeof(d->class_of));
    memcpy(d->rep, reps, (size_t)num_classes * sizeof(int32_t));
    d->cap = 64;
    d->table = malloc((size_t)d->cap * num_classes * sizeof(int32_t));
    d->terms = malloc((size_t)d->cap * sizeof(int32_t));
    d->accepting = malloc((size_t)d->cap);
    d->seen = calloc((size_t)d->cap, sizeof(uint32_t));
    if (!d->table || !d->terms || !d->accepting || !d->seen || !memo_init(&d->state_of, 256)) return NULL;
    begin(st, 0);
    dfa_state(d, EMPTY); /* state 0, DEAD: every transition stays there */
    for (int32_t k = 0; k < num_classes; k++) d->table[k] = DEAD;
    return d;
}

void rg_dfa_free(Dfa *d) {
    if (!d) return;
    free(d->table);
    free(d->terms);
    free(d->accepting);
    free(d->seen);
    memo_free(&d->state_of);
    free(d);
}

int32_t rg_dfa_state(Dfa *d, int32_t term, double deadline) {
    begin(d->st, deadline);
    return finish(d->st, dfa_state(d, term));
}

int32_t rg_dfa_next(Dfa *d, int32_t s, int32_t cls, double deadline) {
    begin(d->st, deadline);
    return finish(d->st, dfa_next(d, s, cls));
}

int32_t rg_dfa_walk(Dfa *d, int32_t s, const uint8_t *data, int64_t len, double deadline) {
    begin(d->st, deadline);
    for (int64_t i = 0; i < len && s != DEAD; i++) s = dfa_next(d, s, d->class_of[data[i]]);
    return finish(d->st, s);
}

/* For each i: walk token ids[i]'s bytes from the `skip`-th on, from state starts[i] (or
 * starts[0] for all when `one_start`); out[i] = the state reached, DEAD where rejected. Token
 * j's bytes are buf[offsets[j] : offsets[j + 1]]. Returns how many were not rejected (or minus
 * the error code). */
int64_t rg_dfa_walk_tokens(Dfa *d, int64_t n, const int64_t *ids, const int32_t *starts, int32_t one_start,
                           int32_t skip, const uint8_t *buf, const int64_t *offsets, int32_t *out,
                           double deadline) {
    begin(d->st, deadline);
    int64_t live = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t s = starts[one_start ? 0 : i];
        const int64_t end = offsets[ids[i] + 1];
        for (int64_t k = offsets[ids[i]] + skip; k < end && s != DEAD; k++) s = dfa_next(d, s, d->class_of[buf[k]]);
        if (d->st->err) return -d->st->err;
        out[i] = s;
        live += s != DEAD;
    }
    return live;
}

int32_t rg_dfa_size(const Dfa *d) { return d->n; }
int32_t rg_dfa_term(const Dfa *d, int32_t s) { return d->terms[s]; }
int32_t rg_dfa_accepting(const Dfa *d, int32_t s) { return d->accepting[s]; }

/* Pickling: table [n, num_classes] and terms [n] out; a DFA rebuilt from them. */
void rg_dfa_export(const Dfa *d, int32_t *table, int32_t *terms) {
    memcpy(table, d->table, (size_t)d->n * d->num_classes * sizeof(int32_t));
    memcpy(terms, d->terms, (size_t)d->n * sizeof(int32_t));
}

Dfa *rg_dfa_import(Store *st, const int32_t *class_of, const int32_t *reps, int32_t num_classes,
                   int32_t max_states, int32_t n, const int32_t *table, const int32_t *terms) {
    Dfa *d = rg_dfa_new(st, class_of, reps, num_classes, max_states);
    if (!d) return NULL;
    begin(st, 0);
    for (int32_t s = 1; s < n; s++) dfa_state(d, terms[s]);
    if (st->err || d->n != n) return NULL;
    memcpy(d->table, table, (size_t)n * num_classes * sizeof(int32_t));
    return d;
}

#define MAX_RESUME 1024

/* A walk of tokens in lexicographic order: stack[p] is the state after the last token's first
 * p bytes, for p <= valid (and p >= floor, the bytes every token of the run shares); that
 * token was rejected at byte dead_at (INT64_MAX: it was not). */
typedef struct {
    int32_t stack[MAX_RESUME + 1];
    int64_t valid, dead_at, floor;
} Resume;

static void resume_init(Resume *r, int32_t state, int64_t floor) {
    r->stack[floor] = state;
    r->valid = r->floor = floor;
    r->dead_at = INT64_MAX;
}

/* The state after `bytes` for a token sharing its first `common` bytes with the last one
 * walked (DEAD if rejected, also within those shared bytes). */
static int32_t resume_walk(Dfa *d, Resume *r, int64_t common, const uint8_t *bytes, int64_t len) {
    if (r->dead_at < common) return DEAD; /* rejected within the bytes it shares */
    int64_t p = common < r->valid ? common : r->valid;
    int32_t s = r->stack[p];
    if (len > MAX_RESUME) { /* no room to remember: walk it plainly */
        for (; p < len && s != DEAD; p++) s = dfa_next(d, s, d->class_of[bytes[p]]);
        r->valid = r->floor;
        r->dead_at = INT64_MAX;
        return s;
    }
    for (; p < len; p++) {
        s = dfa_next(d, s, d->class_of[bytes[p]]);
        if (s == DEAD) break;
        r->stack[p + 1] = s;
    }
    r->valid = p < len ? p : len;
    r->dead_at = p < len ? p : INT64_MAX;
    return s;
}

/* A narrow state's allowed tokens, grouped by their first two bytes (`pair_starts`, as
 * TokenTable keys them: b0 * 257 + b1, b1 = 256 for the one-byte token; `ids` holds each
 * group's ids in lexicographic order, `shared[k]` how many bytes id k shares with id k - 1).
 * For every first byte b0 in `firsts`: the state after it, then every group whose
 * second byte is live there. Each token resumes from the state after the bytes it shares with
 * the one before, and a token whose shared bytes were already rejected is skipped, so a group
 * costs its trie's nodes, not its bytes; token k's bytes are buf[offsets[k] : offsets[k + 1]],
 * in the order of `ids`. Writes the allowed ids and their end states (room for
 * every usable token); returns how many (or minus the error code). */
static int64_t dfa_narrow(Dfa *d, int32_t state, const uint64_t *firsts, const int64_t *pair_starts,
                      const int64_t *ids, const int32_t *shared, const uint8_t *buf,
                      const int64_t *offsets, int64_t *out_ids, int32_t *out_states, double deadline) {
    Store *st = d->st;
    begin(st, deadline);
    Resume r;
    int64_t count = 0;
    for (int b0 = 0; b0 < 256; b0++) {
        if (!mask_has((const Mask *)firsts, b0)) continue;
        int32_t after = dfa_next(d, state, d->class_of[b0]);
        if (st->err) return -st->err;
        if (after == DEAD) continue;
        const int64_t *group = pair_starts + (int64_t)b0 * 257;
        for (int b1 = 0; b1 <= 256; b1++) {
            int64_t lo = group[b1], hi = group[b1 + 1];
            if (lo == hi) continue;
            if (b1 == 256) { /* the one-byte token */
                for (int64_t k = lo; k < hi; k++) {
                    out_ids[count] = ids[k];
                    out_states[count++] = after;
                }
                continue;
            }
            if (!mask_has(&st->first[d->terms[after]], b1)) continue; /* re-read: the store grows */
            resume_init(&r, dfa_next(d, after, d->class_of[b1]), 2);
            for (int64_t k = lo; k < hi; k++) {
                int64_t common = k == lo ? 2 : shared[k]; /* within a group: at least 2 */
                int32_t s = resume_walk(d, &r, common, buf + offsets[k], offsets[k + 1] - offsets[k]);
                if (st->err) return -st->err;
                if (s != DEAD) {
                    out_ids[count] = ids[k];
                    out_states[count++] = s;
                }
            }
        }
    }
    return count;
}

#define NARROW_WIDE (-1000)

/* The allowed tokens' bits set in `row`, and their distinct end states moved to the front of
 * `out_states`; returns how many of those. */
static int64_t row_and_ends(Dfa *d, const int64_t *out_ids, int32_t *out_states, int64_t count,
                            uint32_t *row) {
    for (int64_t i = 0; i < count; i++) row[out_ids[i] >> 5] |= (uint32_t)1 << (out_ids[i] & 31);
    if (++d->stamp == 0) { /* wrapped: forget every mark */
        memset(d->seen, 0, (size_t)d->cap * sizeof(uint32_t));
        d->stamp = 1;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < count; i++) {
        int32_t s = out_states[i];
        if (d->seen[s] != d->stamp) {
            d->seen[s] = d->stamp;
            out_states[n++] = s;
        }
    }
    return n;
}

/* A narrow state's whole mask row in one call: `state`'s live first bytes that are also in
 * `usable` (bit b = byte b), when there are at most `few` of them, walked as dfa_narrow
 * does. Sets the allowed tokens' bits in `row` (uint32 words, bit j of word w = token 32w + j;
 * the caller zeroes it) and leaves the distinct end states at the front of
 * `out_states`, their number in *num_ends (`out_ids` is scratch). Returns the number of allowed
 * tokens, NARROW_WIDE when more first bytes are live (the caller's wide path), or minus the
 * error code. */
int64_t rg_dfa_narrow_row(Dfa *d, int32_t state, const uint64_t *usable, int32_t few,
                          const int64_t *pair_starts, const int64_t *ids, const int32_t *shared,
                          const uint8_t *buf, const int64_t *offsets, int64_t *out_ids,
                          int32_t *out_states, uint32_t *row, int64_t *num_ends, double deadline) {
    Mask firsts;
    const Mask *live = &d->st->first[d->terms[state]];
    int bits = 0;
    for (int k = 0; k < 4; k++) {
        firsts.w[k] = live->w[k] & usable[k];
        bits += __builtin_popcountll(firsts.w[k]);
    }
    *num_ends = 0;
    if (bits > few) return NARROW_WIDE;
    int64_t count = dfa_narrow(d, state, firsts.w, pair_starts, ids, shared, buf, offsets, out_ids,
                                  out_states, deadline);
    if (count > 0) *num_ends = row_and_ends(d, out_ids, out_states, count, row);
    return count;
}

/* The walk of rg_dfa_walk_tokens from one state, for the tokens at the sorted `places` of the
 * lexicographic order `ids`: each token resumes from the bytes it shares with the last one
 * walked (their common prefix: in that order, the least `shared` count between them), and is
 * skipped when those were rejected. Writes the allowed ids and their end states; returns how
 * many (or minus the error code). Token k's bytes are buf[offsets[k] : offsets[k + 1]], in
 * the order of `ids`. */
static int64_t walk_lex(Dfa *d, int32_t state, int64_t n, const int64_t *places, const int64_t *ids,
                        const int32_t *shared, const uint8_t *buf, const int64_t *offsets,
                        int64_t *out_ids, int32_t *out_states, double deadline) {
    (void)shared;
    Store *st = d->st;
    begin(st, deadline);
    Resume r;
    resume_init(&r, state, 0);
    int64_t count = 0;
    const uint8_t *last = buf;
    int64_t last_len = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = places[i];
        const uint8_t *bytes = buf + offsets[k];
        int64_t len = offsets[k + 1] - offsets[k], common = 0;
        int64_t most = len < last_len ? len : last_len;
        while (common < most && bytes[common] == last[common]) common++;
        int32_t s = resume_walk(d, &r, common, bytes, len);
        last = bytes;
        last_len = len;
        if (st->err) return -st->err;
        if (s != DEAD) {
            out_ids[count] = ids[k];
            out_states[count++] = s;
        }
    }
    return count;
}

/* walk_lex, with the allowed tokens' bits set in `row` (which holds the tokens allowed
 * without a walk) and their distinct end states at the front of `out_states`, their number in
 * *num_ends. Returns the number of tokens walked and allowed (or minus the error code). */
int64_t rg_dfa_wide_row(Dfa *d, int32_t state, int64_t n, const int64_t *places, const int64_t *ids,
                        const int32_t *shared, const uint8_t *buf, const int64_t *offsets,
                        int64_t *out_ids, int32_t *out_states, uint32_t *row, int64_t *num_ends,
                        double deadline) {
    *num_ends = 0;
    int64_t count =
        walk_lex(d, state, n, places, ids, shared, buf, offsets, out_ids, out_states, deadline);
    if (count > 0) *num_ends = row_and_ends(d, out_ids, out_states, count, row);
    return count;
}

/* ------------------------------------------------------------------ mask precompute */

/* The breadth-first walk of TokenIndex.precompute over narrow states, in C: a queue of likely
 * states and one of rare ones (their every continuation starts inside a tagged term), and the
 * mask keys already met. The caller computes the wide states' rows (their tokens are
 * split in numpy) and offers their successors back. */
typedef struct {
    int32_t *items;
    int64_t head, n, cap;
} Queue;

typedef struct {
    Dfa *d;
    Queue likely, later;
    Memo seen; /* mask keys met */
    int32_t bound, rare;
    double slowest; /* seconds, the slowest row */
} Pre;

enum { PRE_DONE, PRE_FULL, PRE_TIME, PRE_WIDE, PRE_ERROR, PRE_SLOW };

static int queue_push(Queue *q, int32_t s) {
    if (q->n == q->cap) {
        int64_t cap = q->cap ? 2 * q->cap : 256;
        int32_t *items = realloc(q->items, (size_t)cap * sizeof(int32_t));
        if (!items) return 0;
        q->items = items;
        q->cap = cap;
    }
    q->items[q->n++] = s;
    return 1;
}

static inline int32_t mask_key(Dfa *d, int32_t s) {
    return dfa_state(d, clip(d->st, d->terms[s], d->st->clip_bound));
}

/* Queue `s` unless its mask key was met; `likely` queues it as likely whatever its head. */
static void pre_offer(Pre *p, int32_t s, int likely) {
    Dfa *d = p->d;
    Store *st = d->st;
    int32_t key = mask_key(d, s), met;
    if (st->err || memo_get(&p->seen, key, &met)) return;
    if (!memo_put(&p->seen, key, 1)) {
        st->err = ERR_MEMORY;
        return;
    }
    int ok = 1;
    if (likely || !(st->has_tags && head_tagged(st, d->terms[s])))
        ok = queue_push(&p->likely, s);
    else if (p->rare)
        ok = queue_push(&p->later, s);
    if (!ok && !st->err) st->err = ERR_MEMORY;
}

Pre *rg_pre_new(Dfa *d, int32_t bound, int32_t rare) {
    Pre *p = calloc(1, sizeof(Pre));
    if (!p) return NULL;
    if (!memo_init(&p->seen, 256)) {
        free(p);
        return NULL;
    }
    p->d = d;
    p->bound = bound;
    p->rare = rare;
    return p;
}

void rg_pre_free(Pre *p) {
    if (!p) return;
    free(p->likely.items);
    free(p->later.items);
    memo_free(&p->seen);
    free(p);
}

double rg_pre_slowest(const Pre *p) { return p->slowest; }

/* Offer `n` states met (the start, or a wide row's successors); `likely` as for pre_offer.
 * Returns 0 or minus the error code. */
int32_t rg_pre_offer(Pre *p, const int32_t *states, int64_t n, int32_t likely, double deadline) {
    Store *st = p->d->st;
    begin(st, deadline);
    for (int64_t i = 0; i < n && !st->err; i++) pre_offer(p, states[i], likely);
    return -st->err;
}

/* Rows breadth-first, likely states first, until `max_rows` are written, the clock passes
 * `until`, the queues are empty, a wide state comes up, a row took over `slow` seconds (if
 * > 0) or an error. Each state is taken
 * clipped at `bound`; row r (uint32 [num_words] at rows + r * num_words, zeroed by the caller)
 * is computed by rg_dfa_narrow_row for the state taken[r] (as queued, unclipped), with keys[r]
 * its mask key, counts[r] its number of allowed tokens and accepting[r] whether taken[r]
 * accepts. Returns the number of rows written; status[0] says why it stopped (PRE_*),
 * status[1] is the wide state (clipped) for PRE_WIDE, the error code for PRE_ERROR. */
int64_t rg_pre_run(Pre *p, int64_t max_rows, double until, double slow, const uint64_t *usable, int32_t few,
                   const int64_t *pair_starts, const int64_t *ids, const int32_t *shared, const uint8_t *buf,
                   const int64_t *offsets, int64_t *out_ids, int32_t *out_states, uint32_t *rows,
                   int64_t num_words, int32_t *taken, int32_t *keys, int64_t *counts, uint8_t *accepting,
                   int32_t *status, double deadline) {
    Dfa *d = p->d;
    Store *st = d->st;
    int64_t r = 0;
    status[0] = PRE_FULL;
    status[1] = 0;
    while (r < max_rows) {
        Queue *q = p->likely.head < p->likely.n ? &p->likely : &p->later;
        if (q->head == q->n) {
            status[0] = PRE_DONE;
            break;
        }
        double start = now_s();
        if (start >= until) {
            status[0] = PRE_TIME;
            break;
        }
        int32_t s = q->items[q->head++];
        begin(st, deadline);
        int32_t c = dfa_state(d, clip(st, d->terms[s], p->bound));
        int64_t ends = 0;
        int64_t count = st->err ? -st->err
                                : rg_dfa_narrow_row(d, c, usable, few, pair_starts, ids, shared, buf, offsets,
                                                    out_ids, out_states, rows + r * num_words, &ends, deadline);
        if (count == NARROW_WIDE) {
            status[0] = PRE_WIDE;
            status[1] = c;
            break;
        }
        int32_t key = count < 0 ? DEAD : mask_key(d, c);
        if (count < 0 || st->err) {
            status[0] = PRE_ERROR;
            status[1] = count < 0 ? (int32_t)-count : st->err;
            break;
        }
        double took = now_s() - start;
        if (took > p->slowest) p->slowest = took;
        taken[r] = s;
        keys[r] = key;
        accepting[r] = d->accepting[s];
        counts[r++] = count;
        for (int64_t i = 0; i < ends && !st->err; i++) pre_offer(p, out_states[i], 0);
        if (st->err) {
            status[0] = PRE_ERROR;
            status[1] = st->err;
            break;
        }
        if (slow > 0 && took > slow) {
            status[0] = PRE_SLOW;
            break;
        }
    }
    return r;
}
