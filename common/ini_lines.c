/* inih over a file with line counting (see ini_lines.h). */
#include "ini_lines.h"

#include <string.h>

static char *counting_reader(char *str, int num, void *stream)
{
    struct ini_lines *l = stream;
    char *r = fgets(str, num, l->file);
    if (!r)
        return NULL;
    size_t n = strlen(r);
    l->partial = !(n && r[n - 1] == '\n');
    l->lines_done += !l->partial;
    return r;
}

int ini_lines_parse(FILE *f, struct ini_lines *lines, ini_handler handler, void *user)
{
    *lines = (struct ini_lines){.file = f};
    ini_allow_multiline = false;
    ini_use_stack = false;
    ini_allow_realloc = true;
    ini_max_line = 8192;
    return ini_parse_stream(counting_reader, lines, handler, user);
}
