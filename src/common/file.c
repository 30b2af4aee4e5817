/* Reading a whole file into memory. */
#include "common/file.h"

#include <stdio.h>
#include <stdlib.h>

char *iha__read_file(const char *path, size_t limit, size_t *length)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    char *text = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size >= 0 && (size_t)size <= limit && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)size + 1))) {
        if (fread(text, 1, (size_t)size, f) == (size_t)size) {
            text[size] = '\0';
            *length = (size_t)size;
        } else {
            free(text);
            text = NULL;
        }
    }
    fclose(f);
    return text;
}
