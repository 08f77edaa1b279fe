/* Token walks over a transition table that the caller fills lazily (the Earley column
 * automaton of grammar/cfg/earley.py, whose transitions Python computes).
 *
 * t->table[uid * num_classes + cls] is the state after byte class cls from state uid: DEAD (0),
 * UNKNOWN (-1: not computed yet), or a state. A walk moves each selected token byte by byte;
 * where it meets an UNKNOWN transition it asks t->step(uid, cls) (a Python callback) for it, then
 * re-reads t->table and t->open, which the callback may have moved (the table grows). Tokens
 * come in lexicographic order, each sharing shared[q] bytes with the one before it, so a token
 * restarts from the state after the bytes it shares with the last token walked, and one whose
 * shared bytes were already rejected is settled without walking: most of the vocabulary costs
 * a comparison or two.
 *
 * Outcomes per selected token: status 1 accepted (every byte walked to a live state), 0
 * rejected; opened says whether it passed an open state (t->open[uid] != 0) after its first
 * byte. */

#include <stdint.h>

#define DEAD 0
#define UNKNOWN (-1)
#define MAX_PATH 1024

typedef struct {
    const int32_t *table;   /* [states][num_classes], may move during step() */
    const uint8_t *open;    /* [states], likewise */
    int32_t (*step)(int32_t uid, int32_t cls); /* the unknown transition; < -1 on failure */
    int64_t num_classes;
} Table;

/* One token from state *s after *p bytes: walks to its end or DEAD, recording the states on the
 * way in path[p+1..] and whether any was open in open_upto[] (when `path` is given). Returns 1
 * accepted, 0 rejected, -1 if step() failed. */
static int walk_from(Table *t, const int64_t *class_of, const uint8_t *bytes, int64_t len,
                     int32_t *s_io, int64_t *p_io, uint8_t *opened, int32_t *path,
                     uint8_t *open_upto) {
    int32_t s = *s_io;
    int64_t p = *p_io;
    uint8_t open = *opened;
    int result = 1;
    while (p < len) {
        const int64_t cls = class_of[bytes[p]];
        int32_t next = t->table[(int64_t)s * t->num_classes + cls];
        if (next == UNKNOWN) {
            next = t->step(s, (int32_t)cls);
            if (next < DEAD) {
                result = -1;
                break;
            }
        }
        if (next == DEAD) {
            result = 0;
            break;
        }
        s = next;
        p++;
        open |= t->open[s];
        if (path && p <= MAX_PATH) {
            path[p] = s;
            open_upto[p] = open;
        }
    }
    *s_io = result == 1 ? s : DEAD;
    *p_io = p;
    *opened = open;
    return result;
}

/* Walks the tokens at lexicographic positions positions[0..n) (ascending) from `start`. Token
 * at position q has bytes buf[offsets[q] .. offsets[q + 1]) and shares shared[q] bytes with the
 * token at q - 1. Fills status/opened for each of the n tokens; returns how many were accepted,
 * or -1 if a step failed (the callback keeps the error). */
int64_t rg_table_walk(Table *t, const int64_t *class_of, int32_t start, int64_t n,
                      const int64_t *positions, const int32_t *shared, const uint8_t *buf,
                      const int64_t *offsets, uint8_t *status, uint8_t *opened) {
    int32_t path[MAX_PATH + 1];
    uint8_t open_upto[MAX_PATH + 1];
    int64_t valid = 0;         /* path[0..valid] holds the last walked token's states */
    int64_t dead = INT64_MAX;  /* where that token was rejected (INT64_MAX: it was not) */
    int64_t accepted = 0, last = -1;
    path[0] = start;
    open_upto[0] = 0;
    for (int64_t k = 0; k < n; k++) {
        const int64_t q = positions[k];
        int64_t common = 0;
        if (last >= 0) { /* bytes shared with the last token walked: the least over the gap */
            common = INT64_MAX;
            for (int64_t i = last + 1; i <= q; i++)
                if (shared[i] < common) common = shared[i];
        }
        last = q;
        const uint8_t *bytes = buf + offsets[q];
        const int64_t len = offsets[q + 1] - offsets[q];
        if (dead < common) { /* rejected within the bytes it shares with the last token */
            status[k] = 0;
            opened[k] = open_upto[dead];
            continue;
        }
        int64_t p = common < valid ? common : valid;
        if (p > len) p = len;
        int32_t s = path[p];
        uint8_t open = open_upto[p];
        int kind;
        if (len > MAX_PATH) { /* no room to remember its states: walk it alone */
            kind = walk_from(t, class_of, bytes, len, &s, &p, &open, 0, 0);
            valid = 0;
            dead = INT64_MAX;
        } else {
            kind = walk_from(t, class_of, bytes, len, &s, &p, &open, path, open_upto);
            valid = p;
            dead = kind == 0 ? p : INT64_MAX;
        }
        if (kind < 0) return -1;
        status[k] = (uint8_t)kind;
        opened[k] = open;
        accepted += kind;
    }
    return accepted;
}
