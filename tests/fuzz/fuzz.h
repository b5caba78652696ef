/* What the harnesses under tests/fuzz/ share (tests/fuzz/README.md). Each
 * defines LLVMFuzzerInitialize and LLVMFuzzerTestOneInput; it is linked
 * either with libFuzzer (configure --enable-fuzzing, make fuzz) or with
 * tests/fuzz/driver.c, which runs a corpus once as a TAP test. */
#ifndef CHORUS_FUZZ_H
#define CHORUS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant of the code under test: abort with the message when it
 * does not hold (libFuzzer keeps the input as a crash). */
#define FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                       \
        if (!(cond))                                                           \
            fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                 \
    } while (0)

void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5), noreturn))
#endif
    ;

/* This process's own folder under $TMPDIR (else /dev/shm, else /tmp), made at the first
 * call and removed at exit with whatever is left in it. */
const char *fuzz_dir(void);

/* fuzz_dir()/name, in a static buffer of the caller's choosing. */
const char *fuzz_path(char *buf, size_t cap, const char *name);

/* Writes `len` bytes to `path` (creating or truncating it); with gz, as a
 * gzip stream (zlib). Aborts when it cannot: that is the harness's fault. */
void fuzz_write(const char *path, const uint8_t *bytes, size_t len, int gz);

/* Removes every entry of the folder `path` (files and empty folders) and,
 * with also_dir, the folder. */
void fuzz_clear(const char *path, int also_dir);

/* A failure came with a message: ch_last_error() is not empty. */
void fuzz_check_error(const char *what);

#endif
