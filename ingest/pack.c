/* Best-fit packing (see pack.h): open windows sit in buckets by their free room, and a two-level
 * bitset over room sizes finds the smallest room that holds a document in a few word scans. */
#include "pack.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* Which room sizes have an open window: bit r of words[], and bit w of summary[] when words[w] is
 * not zero. */
struct room_index {
    uint64_t *words, *summary;
    int64_t nwords;
};

static void room_set(struct room_index *x, int64_t r, bool on)
{
    uint64_t bit = 1ull << (r & 63);
    int64_t w = r >> 6;
    x->words[w] = on ? x->words[w] | bit : x->words[w] & ~bit;
    uint64_t sbit = 1ull << (w & 63);
    x->summary[w >> 6] = x->words[w] ? x->summary[w >> 6] | sbit : x->summary[w >> 6] & ~sbit;
}

/* The smallest room size >= r that has an open window, or -1. */
static int64_t room_find(const struct room_index *x, int64_t r)
{
    int64_t w = r >> 6;
    uint64_t m = x->words[w] & (~0ull << (r & 63));
    if (m)
        return (w << 6) + __builtin_ctzll(m);
    int64_t nsum = (x->nwords + 63) >> 6;
    for (int64_t s = (w + 1) >> 6; s < nsum; s++) {
        /* in the first summary word, only the words after w */
        uint64_t sm = x->summary[s] & (s == (w + 1) >> 6 ? ~0ull << ((w + 1) & 63) : ~0ull);
        if (sm) {
            int64_t ww = (s << 6) + __builtin_ctzll(sm);
            return (ww << 6) + __builtin_ctzll(x->words[ww]);
        }
    }
    return -1;
}

static const int64_t *sort_len; /* qsort has no context argument */

/* Longest first; equal lengths keep input order. */
static int cmp_longest(const void *a, const void *b)
{
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    if (sort_len[i] != sort_len[j])
        return sort_len[i] > sort_len[j] ? -1 : 1;
    return (i > j) - (i < j);
}

int64_t pack_best_fit(const int64_t *len, int64_t n, int64_t window, bool decreasing, int64_t *order,
                      int64_t *window_of)
{
    if (window < 1 || window > PACK_BEST_FIT_MAX_WINDOW)
        return sd_err("best-fit packing takes windows of 1 to %d tokens, not %lld", PACK_BEST_FIT_MAX_WINDOW,
                      (long long)window);
    for (int64_t i = 0; i < n; i++)
        if (len[i] < 1 || len[i] > window)
            return sd_err("document %lld has %lld tokens: a window holds 1 to %lld", (long long)i,
                          (long long)len[i], (long long)window);
    struct room_index x = {.nwords = (window >> 6) + 1};
    x.words = calloc((size_t)x.nwords, sizeof *x.words);
    x.summary = calloc((size_t)((x.nwords + 63) >> 6), sizeof *x.summary);
    int64_t *head = malloc(((size_t)window + 1) * sizeof *head); /* per room size: a stack of windows */
    int64_t *next = malloc((size_t)(n > 0 ? n : 1) * sizeof *next), *room = malloc((size_t)(n > 0 ? n : 1) * sizeof *room);
    int64_t *taken = malloc((size_t)(n > 0 ? n : 1) * sizeof *taken), *count = calloc((size_t)n + 1, sizeof *count);
    int64_t nwin = -1;
    if (!x.words || !x.summary || !head || !next || !room || !taken || !count) {
        sd_err("out of memory packing %lld documents", (long long)n);
        goto out;
    }
    for (int64_t r = 0; r <= window; r++)
        head[r] = -1;
    for (int64_t i = 0; i < n; i++)
        taken[i] = i;
    if (decreasing) {
        sort_len = len;
        qsort(taken, (size_t)n, sizeof *taken, cmp_longest);
    }
    nwin = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t d = taken[k], r = room_find(&x, len[d]), w;
        if (r >= 0) { /* take the window off its bucket */
            w = head[r];
            head[r] = next[w];
            if (head[r] < 0)
                room_set(&x, r, false);
        } else {
            w = nwin++;
            room[w] = window;
        }
        room[w] -= len[d];
        window_of[k] = w; /* for now: the window of the k-th document taken */
        count[w + 1]++;
        if (room[w] > 0) {
            next[w] = head[room[w]];
            head[room[w]] = w;
            room_set(&x, room[w], true);
        }
    }
    /* output order: by window, each window's documents in the order they were taken */
    for (int64_t w = 0; w < nwin; w++)
        count[w + 1] += count[w];
    for (int64_t k = 0; k < n; k++)
        order[count[window_of[k]]++] = taken[k];
    for (int64_t w = 0, k = 0; w < nwin; w++)
        for (; k < count[w]; k++)
            window_of[k] = w;
out:
    free(x.words), free(x.summary), free(head), free(next), free(room), free(taken), free(count);
    return nwin;
}
