/* Fuzz target: the safetensors parser must refuse any malformed input without crashing or reading
 * out of bounds (libFuzzer; replayed over the committed corpus by `make test`). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a private copy: st_parse keeps pointers into the buffer */
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    struct st_file f;
    if (st_parse(buf, size, "fuzz", &f) == 0) {
        for (int i = 0; i < f.num_tensors; i++) {
            const struct st_tensor *t = &f.tensors[i];
            /* every accepted tensor lies inside the buffer: touch its first and last byte */
            if (t->nbytes) {
                volatile uint8_t first = ((const uint8_t *)t->data)[0];
                volatile uint8_t last = ((const uint8_t *)t->data)[t->nbytes - 1];
                (void)first, (void)last;
            }
            if (st_find(&f, t->name) == NULL)
                abort();
        }
        st_close(&f);
    }
    free(buf);
    return 0;
}
