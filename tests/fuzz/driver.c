/* A main for the harnesses in builds without libFuzzer: runs
 * LLVMFuzzerTestOneInput once on every file named on the command line
 * (folders: every file under them, in name order), or without arguments on
 * the harness's committed corpus (FUZZ_CORPUS, compiled in), and prints
 * TAP: "ok N - FILE" for each input that returned. An input that breaks an
 * invariant aborts, which the TAP harness reports as the failure (the last
 * line printed names the input that ran before it). */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int count;

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("not ok %d - %s: cannot open: %s\n", ++count, path, strerror(errno));
        return 1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *data = malloc(cap);
    size_t n;
    while (data && (n = fread(data + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            uint8_t *bigger = realloc(data, cap *= 2);
            if (!bigger) {
                free(data);
                data = NULL;
                break;
            }
            data = bigger;
        }
    }
    int bad = ferror(f) || !data;
    fclose(f);
    if (bad) {
        free(data);
        printf("not ok %d - %s: cannot read it\n", ++count, path);
        return 1;
    }
    /* Announced first, so that a crash names its input. */
    printf("# %s (%zu bytes)\n", path, len);
    fflush(stdout);
    /* A copy of exactly `len` bytes: ASan sees a read past the input. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(data);
        printf("not ok %d - %s: out of memory\n", ++count, path);
        return 1;
    }
    memcpy(exact, data, len);
    free(data);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    printf("ok %d - %s\n", ++count, path);
    fflush(stdout);
    return 0;
}

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("not ok %d - %s: %s\n", ++count, path, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(st.st_mode))
        return run_file(path);
    DIR *d = opendir(path);
    if (!d) {
        printf("not ok %d - %s: cannot open: %s\n", ++count, path, strerror(errno));
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int failed = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            char **v = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *v);
            if (!v)
                abort();
            names = v;
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len)))
            abort();
        snprintf(names[n++], len, "%s/%s", path, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        failed |= run_path(names[i]);
        free(names[i]);
    }
    free(names);
    return failed;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    int failed = 0;
    if (argc < 2) {
#ifdef FUZZ_CORPUS
        failed = run_path(FUZZ_CORPUS);
#else
        fprintf(stderr, "usage: %s FILE|FOLDER...\n", argv[0]);
        return 2;
#endif
    }
    for (int i = 1; i < argc; i++)
        failed |= run_path(argv[i]);
    printf("1..%d\n", count);
    return failed;
}
