/* The token readers, ch_tokens_open (nn/tokens.c): a text file, a folder
 * of texts, a folder of llm.c token shards (a 1024-byte header, then
 * uint16 tokens).
 *
 * Input: byte 0 bit 0 clear: the rest is one text file. Set: a folder,
 * the rest a list of files, each [n][len: 2 bytes, little-endian][len
 * bytes]: n & 15 picks the name (names[] below: shards of both splits,
 * texts, names that are neither, a hidden file, a folder named as a
 * shard), n & 0x80 puts a valid shard header before the bytes (count
 * len / 2), n & 0x40 adds to that count the signed byte that follows len.
 * Bits 1-6 of byte 0 give a context length for the windows (1 to 64).
 *
 * Checked: a failure has a message and leaves no handles; an opened data
 * set holds exactly the tokens the harness expects from the files it wrote
 * (the text split 9:1, or the shards of each split in name order), every
 * one below the vocabulary (256 for text, the largest token + 1 for
 * shards), read through the evaluation windows of context 1 and of the
 * input's context, and training windows are contiguous runs of tokens. */
#include "config.h"

#include <chorus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

#define NNAMES 16
#define FOLDER_NAME 15 /* a folder, not a file */
static const char *const names[NNAMES] = {
    "d_train_000000.bin", "d_train_000001.bin", "d_val_000000.bin", "d_val_000001.bin",
    "a.txt",              "b.txt",              "notes.dat",        ".hidden",
    "x_train_val.bin",    "_train.bin",         "d_train_000000a.bin", "README",
    "_val.bin",           "d_val.binx",         "c",                "e_train_dir.bin"};
/* What the loader makes of each name: a training shard (1), a validation
 * shard (2), both (3), a text (4), neither (0). */
static const int kind[NNAMES] = {1, 1, 2, 2, 4, 4, 0, 0, 3, 1, 1, 4, 2, 4, 4, 1};

static char text_path[4096], dir_path[4096];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_path(text_path, sizeof text_path, "text");
    fuzz_path(dir_path, sizeof dir_path, "folder");
    return 0;
}

typedef struct file {
    int present;
    uint8_t *bytes;
    size_t len;
} file;

typedef struct tokens {
    int32_t *v;
    int64_t n, cap;
} tokens;

static void push(tokens *t, int32_t v)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->v = realloc(t->v, (size_t)t->cap * sizeof *t->v);
        FUZZ_CHECK(t->v != NULL, "out of memory");
    }
    t->v[t->n++] = v;
}

static void put32(uint8_t *p, int32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)((uint32_t)v >> (8 * i));
}

static int32_t le32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

/* Every token of `t`, through the evaluation windows of `context`, is
 * want's; training windows are runs of tokens below the vocabulary. */
static void check_split(const ch_tokens *t, const tokens *want, int32_t vocab, int context,
                        const char *split)
{
    int64_t n = ch_tokens_count(t);
    FUZZ_CHECK(n == want->n, "the %s split has %lld tokens, expected %lld", split,
               (long long)n, (long long)want->n);
    FUZZ_CHECK(ch_tokens_vocab(t) == vocab, "the %s split's vocabulary is %d, expected %d",
               split, ch_tokens_vocab(t), vocab);
    for (int64_t i = 0; i < n; i++)
        FUZZ_CHECK(want->v[i] >= 0 && want->v[i] < vocab, "token %lld is %d, vocabulary %d",
                   (long long)i, want->v[i], vocab);
    int32_t *in = malloc(((size_t)context + 1) * sizeof *in);
    int32_t *out = malloc(((size_t)context + 1) * sizeof *out);
    FUZZ_CHECK(in && out, "out of memory");
    int contexts[2] = {1, context};
    for (int c = 0; c < 2; c++) {
        int ctx = contexts[c];
        int64_t windows = ch_tokens_windows(t, ctx);
        FUZZ_CHECK(windows == (n - 1 >= ctx ? (n - 1) / ctx : 0),
                   "%lld windows of context %d in %lld tokens", (long long)windows, ctx,
                   (long long)n);
        if (windows == 0) {
            fuzz_check_error("ch_tokens_windows");
            FUZZ_CHECK(ch_tokens_eval_window(t, in, out, 0, ctx) == CH_ERR_INVALID_ARGUMENT,
                       "an evaluation window where there is none");
            continue;
        }
        for (int64_t w = 0; w < windows; w++) {
            ch_status st = ch_tokens_eval_window(t, in, out, w, ctx);
            FUZZ_CHECK(st == CH_OK, "evaluation window %lld of context %d: %s", (long long)w,
                       ctx, ch_last_error());
            for (int k = 0; k < ctx; k++) {
                FUZZ_CHECK(in[k] == want->v[w * ctx + k] && out[k] == want->v[w * ctx + k + 1],
                           "the %s split's evaluation window %lld of context %d differs at %d",
                           split, (long long)w, ctx, k);
            }
        }
        FUZZ_CHECK(ch_tokens_eval_window(t, in, out, windows, ctx) == CH_ERR_INVALID_ARGUMENT,
                   "evaluation window %lld of %lld", (long long)windows, (long long)windows);
        for (int64_t w = 0; w < windows && w < 8; w++) {
            ch_status st = ch_tokens_window(t, in, out, 7, w, windows - 1 - w, ctx);
            FUZZ_CHECK(st == CH_OK, "training window: %s", ch_last_error());
            for (int k = 0; k < ctx; k++)
                FUZZ_CHECK(in[k] >= 0 && in[k] < vocab && (k == 0 || out[k - 1] == in[k]) &&
                               out[k] >= 0 && out[k] < vocab,
                           "a training window is not a run of tokens");
        }
    }
    free(in);
    free(out);
}

static void check_open(const char *path, const tokens *train, const tokens *val, int32_t vocab,
                       int bytes, int context)
{
    ch_tokens *a = NULL, *b = NULL;
    ch_status st = ch_tokens_open(&a, &b, path);
    if (st != CH_OK) {
        fuzz_check_error("ch_tokens_open");
        FUZZ_CHECK(!a && !b, "a failed open left handles");
        return;
    }
    FUZZ_CHECK(a && b, "opened without both splits");
    FUZZ_CHECK(ch_tokens_bytes(a) == bytes && ch_tokens_bytes(b) == bytes,
               "ch_tokens_bytes: %d, %d, expected %d", ch_tokens_bytes(a), ch_tokens_bytes(b),
               bytes);
    FUZZ_CHECK(train && val, "opened what the harness expected to fail");
    check_split(a, train, vocab, context, "training");
    check_split(b, val, vocab, context, "validation");
    ch_tokens_free(a);
    ch_tokens_free(b);
}

/* One text file: 9 tenths for training, the rest for validation. */
static void one_text(const uint8_t *data, size_t size, int context)
{
    fuzz_write(text_path, data, size, 0);
    tokens train = {0}, val = {0};
    int64_t n_train = (int64_t)size - (int64_t)size / 10;
    for (size_t i = 0; i < size; i++)
        push((int64_t)i < n_train ? &train : &val, data[i]);
    int ok = size >= 10;
    check_open(text_path, ok ? &train : NULL, ok ? &val : NULL, 256, 1, context);
    free(train.v);
    free(val.v);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(names[*(const int *)a], names[*(const int *)b]);
}

static void folder(const uint8_t *data, size_t size, int context)
{
    file files[NNAMES] = {{0}};
    fuzz_clear(dir_path, 1);
    FUZZ_CHECK(mkdir(dir_path, 0700) == 0, "cannot make %s", dir_path);
    while (size >= 3) {
        int n = data[0], id = n & 15;
        size_t len = (size_t)data[1] | (size_t)data[2] << 8;
        data += 3;
        size -= 3;
        int delta = 0;
        if ((n & 0x40) && size > 0) {
            delta = (int8_t)data[0];
            data++;
            size--;
        }
        if (len > size)
            len = size;
        file *f = &files[id];
        free(f->bytes);
        size_t head = n & 0x80 ? 1024 : 0;
        f->len = head + len;
        f->bytes = calloc(f->len ? f->len : 1, 1);
        FUZZ_CHECK(f->bytes != NULL, "out of memory");
        if (head) {
            put32(f->bytes, 20240520);
            put32(f->bytes + 4, 1);
            put32(f->bytes + 8, (int32_t)(len / 2) + delta);
        }
        memcpy(f->bytes + head, data, len);
        f->present = 1;
        data += len;
        size -= len;
    }
    /* Sorted by name, as the loader lists them. */
    int order[NNAMES], nfiles = 0, shards = 0, both = 0;
    for (int i = 0; i < NNAMES; i++)
        if (files[i].present) {
            order[nfiles++] = i;
            shards |= kind[i] & 3;
            both |= kind[i] == 3;
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir_path, names[i]);
            if (i == FOLDER_NAME)
                FUZZ_CHECK(mkdir(path, 0700) == 0, "cannot make %s", path);
            else
                fuzz_write(path, files[i].bytes, files[i].len, 0);
        }
    qsort(order, (size_t)nfiles, sizeof *order, by_name);

    tokens train = {0}, val = {0};
    int ok = 1, bytes = 0;
    int32_t vocab = 256;
    if (shards) {
        /* Every shard whole and valid, each split holding tokens. */
        int32_t top = -1;
        ok = !both && (shards & 1) && (shards & 2) && !files[FOLDER_NAME].present;
        for (int k = 0; ok && k < nfiles; k++) {
            const file *f = &files[order[k]];
            if (!(kind[order[k]] & 3))
                continue;
            int32_t count = f->len >= 1024 ? le32(f->bytes + 8) : -1;
            ok = f->len >= 1024 && le32(f->bytes) == 20240520 && le32(f->bytes + 4) == 1 &&
                 count >= 0 && (int64_t)f->len == 1024 + 2 * (int64_t)count;
            for (int32_t i = 0; ok && i < count; i++) {
                int32_t v = f->bytes[1024 + 2 * i] | f->bytes[1024 + 2 * i + 1] << 8;
                push(kind[order[k]] == 1 ? &train : &val, v);
                top = v > top ? v : top;
            }
        }
        ok = ok && train.n > 0 && val.n > 0;
        vocab = top + 1;
    } else {
        /* The texts, end to end. */
        tokens all = {0};
        for (int k = 0; k < nfiles; k++)
            if (kind[order[k]] == 4)
                for (size_t i = 0; i < files[order[k]].len; i++)
                    push(&all, files[order[k]].bytes[i]);
        int64_t n_train = all.n - all.n / 10;
        for (int64_t i = 0; i < all.n; i++)
            push(i < n_train ? &train : &val, all.v[i]);
        ok = all.n >= 10;
        bytes = 1;
        free(all.v);
    }
    check_open(dir_path, ok ? &train : NULL, ok ? &val : NULL, vocab, bytes, context);
    free(train.v);
    free(val.v);
    for (int i = 0; i < NNAMES; i++)
        free(files[i].bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int context = 1 + (data[0] >> 1) % 64;
    if (data[0] & 1)
        folder(data + 1, size - 1, context);
    else
        one_text(data + 1, size - 1, context);
    return 0;
}
