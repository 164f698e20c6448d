/* inih with line numbers: runs ini_parse_stream over a file while counting lines, so a handler
 * can name the line it is called for. Used by the job.ini and topology parsers. */
#ifndef SD_INI_LINES_H
#define SD_INI_LINES_H

#include <ini.h>
#include <stdbool.h>
#include <stdio.h>

struct ini_lines {
    FILE *file;
    int lines_done; /* complete lines read */
    bool partial;   /* the last read ended inside a line */
};

/* Parses f with inih (no multi-line values, lines up to 8 KiB); returns what ini_parse_stream
 * returns: 0, the first malformed line, or -1. lines must stay valid while handler runs. */
int ini_lines_parse(FILE *f, struct ini_lines *lines, ini_handler handler, void *user);

/* The line the handler is being called for. */
static inline int ini_lines_current(const struct ini_lines *lines)
{
    return lines->lines_done + (lines->partial ? 1 : 0);
}

#endif
