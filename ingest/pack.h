/* Best-fit packing of documents into fixed windows, for `slidedp-data tokenize --pack N --pack-fit`
 * (ingest/tokenize_cmd.c; greedy packing, in input order, stays there). */
#ifndef SD_PACK_H
#define SD_PACK_H

#include <stdbool.h>
#include <stdint.h>

/* The largest window best-fit packing takes (its free-room index has one bit per token count). */
#define PACK_BEST_FIT_MAX_WINDOW (1 << 22)

/* Lays n documents of len[i] tokens (1 <= len[i] <= window) into windows of `window` tokens, each
 * document into the open window with the least room that still holds it, else a new window.
 * decreasing: documents are taken longest first (best-fit decreasing: the least padding; input
 * order is lost); else in input order, so each window holds its documents in input order and the
 * windows come in the order of their first documents. order[n] receives the documents in output
 * order and window_of[n] the window (from 0, non-decreasing) of each entry of order. Returns the
 * number of windows, or -1 (with sd_err) when out of memory or a length is out of range. */
int64_t pack_best_fit(const int64_t *len, int64_t n, int64_t window, bool decreasing, int64_t *order,
                      int64_t *window_of);

#endif
