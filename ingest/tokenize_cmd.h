/* `slidedp-data tokenize`: a JSONL dataset to a slidedp SFT shard with the model's tokenizer. */
#ifndef SD_TOKENIZE_CMD_H
#define SD_TOKENIZE_CMD_H

#include <stdio.h>

/* argv holds the options after the word "tokenize"; returns the exit code (0, or 2 on bad input). */
int tokenize_main(int argc, char **argv);
/* The options of `slidedp-data tokenize` (its --help; slidedp-data --help prints them too). */
void tokenize_usage(FILE *f);

#endif
