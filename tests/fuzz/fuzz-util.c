/* Helpers of the harnesses (fuzz.h). */
#include "fuzz.h"

#include <chorus.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s:%d: invariant failed: %s: ", file, line, cond);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    abort();
}

static char dir[4096];

static void remove_dir(void)
{
    if (dir[0])
        fuzz_clear(dir, 1);
}

const char *fuzz_dir(void)
{
    if (dir[0])
        return dir;
    /* $TMPDIR, else memory (/dev/shm) when there is one: checkpoints are
     * synced to their disk on every save. */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/chorus-fuzz.XXXXXX", tmp);
    if (!mkdtemp(dir)) {
        fprintf(stderr, "fuzz: mkdtemp %s: %s\n", dir, strerror(errno));
        abort();
    }
    atexit(remove_dir);
    return dir;
}

const char *fuzz_path(char *buf, size_t cap, const char *name)
{
    if ((size_t)snprintf(buf, cap, "%s/%s", fuzz_dir(), name) >= cap) {
        fprintf(stderr, "fuzz: path too long: %s/%s\n", fuzz_dir(), name);
        abort();
    }
    return buf;
}

void fuzz_write(const char *path, const uint8_t *bytes, size_t len, int gz)
{
    int ok;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ok = f != NULL;
        if (ok && len > 0)
            ok = gzwrite(f, bytes, (unsigned)len) == (int)len;
        if (f)
            ok = gzclose(f) == Z_OK && ok;
    } else {
        FILE *f = fopen(path, "wb");
        ok = f != NULL;
        if (ok && len > 0)
            ok = fwrite(bytes, 1, len, f) == len;
        if (f)
            ok = fclose(f) == 0 && ok;
    }
    if (!ok) {
        fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
        abort();
    }
}

void fuzz_clear(const char *path, int also_dir)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char name[8192];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(name, sizeof name, "%s/%s", path, e->d_name);
            if (unlink(name) != 0)
                rmdir(name); /* an empty folder */
        }
        closedir(d);
    }
    if (also_dir)
        rmdir(path);
}

void fuzz_check_error(const char *what)
{
    const char *msg = ch_last_error();
    FUZZ_CHECK(msg && msg[0], "%s failed without a message in ch_last_error()", what);
}
