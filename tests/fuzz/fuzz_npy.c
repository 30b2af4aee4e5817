/*
 * fuzz_npy.c - libFuzzer target for the .npy reader of the iha tool (tools/common/npy.c).
 * Each input is a whole file. The in-memory parser and the file reader (which reads the header
 * in pieces and the data in chunks) must give the same verdict, and on success the same header
 * and the same floats bit for bit; every failure has a printable message and owns no memory.
 * ASan and UBSan watch every access.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One file per process, rewritten for each input and removed at exit. */
static char scratch[256];

static void remove_scratch(void) { unlink(scratch); }

static const char *scratch_path(void)
{
    if (!scratch[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(scratch, sizeof scratch, "%s/iha-fuzz-npy-%ld.npy", tmp && tmp[0] ? tmp : "/tmp", (long)getpid());
        atexit(remove_scratch);
    }
    return scratch;
}

static void write_scratch(const uint8_t *data, size_t size)
{
    FILE *f = fopen(scratch_path(), "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort(); /* the harness itself failed: /tmp full or unwritable */
}

/* A failure has a message, printable ASCII only (header bytes are quoted as \xNN), and no memory. */
static void check_failure(int rc, const npy_array *a, const char *err)
{
    if (rc != -1 || a->data != NULL || err[0] == '\0')
        abort();
    for (const unsigned char *p = (const unsigned char *)err; *p; p++)
        if (*p < 0x20 || *p >= 0x7f)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    npy_array mem, file;
    char err_mem[256] = "", err_file[256] = "";
    const int rc_mem = npy_parse(data, size, &mem, err_mem, sizeof err_mem);
    write_scratch(data, size);
    const int rc_file = npy_read(scratch_path(), &file, err_file, sizeof err_file);
    if (rc_mem != rc_file) {
        fprintf(stderr, "npy_parse says %d (%s), npy_read says %d (%s)\n", rc_mem, err_mem, rc_file, err_file);
        abort();
    }
    if (rc_mem != 0) {
        check_failure(rc_mem, &mem, err_mem);
        check_failure(rc_file, &file, err_file);
        return 0;
    }
    const npy_header *h = &mem.header;
    if (memcmp(h, &file.header, sizeof *h) != 0 || h->data_offset + h->data_bytes != size ||
        h->data_bytes != h->count * (size_t)h->dtype || (h->count && !mem.data) ||
        (h->count && memcmp(mem.data, file.data, h->count * sizeof(float)) != 0))
        abort();
    /* The shape printer on every parsed shape, into a buffer too small for most. */
    char shape[16];
    npy_format_shape(h->shape, h->ndim, shape, sizeof shape);
    if (memchr(shape, '\0', sizeof shape) == NULL)
        abort();
    npy_free(&mem);
    npy_free(&file);
    return 0;
}
