#include "idxgen.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

uint8_t idxgen_pixel(int64_t i, int64_t k) { return (uint8_t)((i * 31 + k * 7 + i / 256) % 256); }

uint8_t idxgen_label(int64_t i, int classes) { return (uint8_t)((i * 7 + 3) % classes); }

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

uint8_t *idxgen_images(uint32_t n, uint32_t rows, uint32_t cols, size_t *len)
{
    size_t numel = (size_t)rows * cols;
    *len = 16 + (size_t)n * numel;
    uint8_t *b = malloc(*len);
    if (!b)
        return NULL;
    put32(b, IDXGEN_IMAGES_MAGIC);
    put32(b + 4, n);
    put32(b + 8, rows);
    put32(b + 12, cols);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < numel; k++)
            b[16 + i * numel + k] = idxgen_pixel((int64_t)i, (int64_t)k);
    return b;
}

uint8_t *idxgen_labels(uint32_t n, int classes, size_t *len)
{
    *len = 8 + (size_t)n;
    uint8_t *b = malloc(*len);
    if (!b)
        return NULL;
    put32(b, IDXGEN_LABELS_MAGIC);
    put32(b + 4, n);
    for (size_t i = 0; i < n; i++)
        b[8 + i] = idxgen_label((int64_t)i, classes);
    return b;
}

static int write_gz(const char *path, const uint8_t *bytes, size_t len)
{
    gzFile f = gzopen(path, "wb");
    if (!f)
        return -1;
    int ok = len == 0 || gzwrite(f, bytes, (unsigned)len) == (int)len;
    return gzclose(f) == Z_OK && ok ? 0 : -1;
}

int idxgen_write(const char *path, const uint8_t *bytes, size_t len, int gz)
{
    if (gz)
        return write_gz(path, bytes, len);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = len == 0 || fwrite(bytes, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

uint8_t *idxgen_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint8_t *b = NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size > 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)size)) != NULL &&
        fread(b, 1, (size_t)size, f) != (size_t)size) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = b ? (size_t)size : 0;
    return b;
}

const char *idxgen_tmpdir(void)
{
    static char dir[4096];
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/chorus-idx-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(dir);
}

void idxgen_cleanup(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[8192];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0)
            rmdir(path);
    }
    closedir(d);
    rmdir(dir);
}
