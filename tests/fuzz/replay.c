/* Replays fuzz corpora through a fuzz target without libFuzzer (the regression run in `make test`):
 * usage: fuzz-replay-X DIR... ; every file of each DIR is fed to LLVMFuzzerTestOneInput. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    long files = 0;
    for (int i = 1; i < argc; i++) {
        DIR *d = opendir(argv[i]);
        if (!d) {
            fprintf(stderr, "cannot open corpus %s\n", argv[i]);
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            FILE *f = fopen(path, "rb");
            if (!f)
                continue;
            fseek(f, 0, SEEK_END);
            long n = ftell(f);
            fseek(f, 0, SEEK_SET);
            uint8_t *buf = malloc((size_t)n + 1);
            size_t got = fread(buf, 1, (size_t)n, f);
            fclose(f);
            LLVMFuzzerTestOneInput(buf, got);
            free(buf);
            files++;
        }
        closedir(d);
    }
    printf("replayed %ld inputs without a crash\n", files);
    return files > 0 ? 0 : 1;
}
