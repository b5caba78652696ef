/* Token data sets: llm.c shards, a text file and a folder of texts written
 * here read back token for token; training windows follow the documented
 * Philox formula, recomputed here; evaluation windows cover a split; every
 * corrupt input is a clear error naming the file and the problem; Debian's
 * fortunes texts when the package is installed. */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idxgen.h"
#include "tap.h"

#define MAGIC 20240520
#define TRAIN_A 3000 /* tokens in the first training shard */
#define TRAIN_N 5500 /* in both */
#define VAL_N 1200
#define VAL_TOP 50256 /* the largest id, in the validation split alone */
#define TEXT_N 12345
#define SEED 0x5eed1234abcdULL
#define FORTUNES_DIR "/usr/share/games/fortunes"

static const char *tmp;

/* tmp/<the formatted name>, in one of 8 rotating buffers. */
static const char *path_in(const char *fmt, ...) TAP_PRINTF(1, 2);
static const char *path_in(const char *fmt, ...)
{
    static char paths[8][4096];
    static int next;
    char *p = paths[next++ % 8];
    int n = snprintf(p, 4096, "%s/", tmp);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p + n, 4096 - (size_t)n, fmt, ap);
    va_end(ap);
    return p;
}

static void write_bytes(const char *path, const void *bytes, size_t len)
{
    if (idxgen_write(path, bytes, len, 0) != 0)
        tap_diag("could not write %s", path);
}

static void make_dir(const char *path)
{
    if (mkdir(path, 0700) != 0)
        tap_diag("could not create %s", path);
}

/* The generated token streams: id g of the training and validation splits. */
static int32_t train_token(int64_t g) { return (int32_t)((g * 2654435761u >> 7) % 40000u); }

static int32_t val_token(int64_t g)
{
    return g == 700 ? VAL_TOP : (int32_t)((g * 40503u + 17) % 50000u);
}

static uint8_t text_byte(int64_t g) { return (uint8_t)(g * 131 + g / 7); }

static void put_le32(uint8_t *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(u >> 8 * i);
}

/* A shard: its header says (magic, version, count) and it holds tokens
 * first .. first + n - 1 of `token`, then `extra` zero bytes; `cut` bytes
 * are taken off the end. */
typedef struct shard_spec {
    int32_t magic, version, count;
    int64_t first, n;
    int32_t (*token)(int64_t);
    size_t extra, cut;
} shard_spec;

static void write_shard(const char *path, shard_spec s)
{
    size_t len = 1024 + 2 * (size_t)s.n + s.extra;
    uint8_t *b = calloc(1, len);
    put_le32(b, s.magic);
    put_le32(b + 4, s.version);
    put_le32(b + 8, s.count);
    for (int64_t k = 0; k < s.n; k++) {
        int32_t v = s.token(s.first + k);
        b[1024 + 2 * k] = (uint8_t)v;
        b[1024 + 2 * k + 1] = (uint8_t)(v >> 8);
    }
    write_bytes(path, b, len - s.cut);
    free(b);
}

static shard_spec good_shard(int64_t first, int64_t n, int32_t (*token)(int64_t))
{
    return (shard_spec){MAGIC, 1, (int32_t)n, first, n, token, 0, 0};
}

/* ---- Reading whole splits ----------------------------------------------- */

/* Every token of the split, through the evaluation windows of context 1
 * (window i: input token i, target token i + 1). NULL after a failing line. */
static int32_t *read_all(const ch_tokens *t, const char *what)
{
    int64_t n = ch_tokens_count(t);
    int32_t *all = malloc((size_t)n * sizeof *all);
    for (int64_t i = 0; i + 1 < n; i++) {
        int32_t in, tg;
        ch_status st = ch_tokens_eval_window(t, &in, &tg, i, 1);
        if (st != CH_OK) {
            tap_ok(0, "%s: eval window %lld of context 1: %s", what, (long long)i, ch_last_error());
            free(all);
            return NULL;
        }
        all[i] = in;
        all[i + 1] = tg;
    }
    return all;
}

/* The split holds exactly `want` (n tokens). */
static void check_tokens(const ch_tokens *t, const int32_t *want, int64_t n, const char *what)
{
    if (!tap_ok(ch_tokens_count(t) == n, "%s: %lld tokens, want %lld", what,
                (long long)ch_tokens_count(t), (long long)n))
        return;
    int32_t *got = read_all(t, what);
    if (!got)
        return;
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (got[i] != want[i])
            bad = i;
    if (bad >= 0)
        tap_ok(0, "%s: token %lld is %d, want %d", what, (long long)bad, got[bad], want[bad]);
    else
        tap_ok(1, "%s: all %lld tokens read back in order", what, (long long)n);
    free(got);
}

static int32_t *generated(int32_t (*token)(int64_t), int64_t n)
{
    int32_t *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = token(i);
    return v;
}

/* ---- Formats ------------------------------------------------------------ */

/* Two training shards written out of order with an empty one between them
 * (by name), one validation shard, and files that are not shards. */
static const char *write_shard_folder(void)
{
    const char *dir = path_in("%s", "shards");
    make_dir(dir);
    write_shard(path_in("shards/%s", "d_train_000001.bin"),
                good_shard(TRAIN_A, TRAIN_N - TRAIN_A, train_token));
    write_shard(path_in("shards/%s", "d_train_000000a.bin"), good_shard(0, 0, train_token));
    write_shard(path_in("shards/%s", "d_train_000000.bin"), good_shard(0, TRAIN_A, train_token));
    write_shard(path_in("shards/%s", "d_val_000000.bin"), good_shard(0, VAL_N, val_token));
    write_bytes(path_in("shards/%s", "README"), "not a shard\n", 12);
    write_bytes(path_in("shards/%s", "._d_train_000000.bin"), "resource fork", 13);
    return dir;
}

static void test_shards(const char *dir)
{
    ch_tokens *train = NULL, *val = NULL;
    if (!tap_status_ok(ch_tokens_open(&train, &val, dir), "shards: open %s", dir))
        return;
    tap_ok(ch_tokens_vocab(train) == VAL_TOP + 1 && ch_tokens_vocab(val) == VAL_TOP + 1,
           "shards: vocab %d (train) and %d (val), want %d: the largest id of either split + 1",
           ch_tokens_vocab(train), ch_tokens_vocab(val), VAL_TOP + 1);
    tap_ok(!ch_tokens_bytes(train) && !ch_tokens_bytes(val), "shards: tokens are not bytes");
    int32_t *want = generated(train_token, TRAIN_N);
    check_tokens(train, want, TRAIN_N,
                 "shards train: shards in name order, the empty one and hidden files skipped");
    free(want);
    want = generated(val_token, VAL_N);
    check_tokens(val, want, VAL_N, "shards val");
    free(want);
    ch_tokens_free(train);
    ch_tokens_free(val);
}

static void test_text_file(void)
{
    uint8_t *text = malloc(TEXT_N);
    int32_t *want = malloc(TEXT_N * sizeof *want);
    for (int64_t i = 0; i < TEXT_N; i++)
        want[i] = text[i] = text_byte(i);
    const char *p = path_in("%s", "text.txt");
    write_bytes(p, text, TEXT_N);
    ch_tokens *train = NULL, *val = NULL;
    if (tap_status_ok(ch_tokens_open(&train, &val, p), "text: open %s", p)) {
        tap_ok(ch_tokens_vocab(train) == 256 && ch_tokens_vocab(val) == 256,
               "text: vocab %d and %d, want 256", ch_tokens_vocab(train), ch_tokens_vocab(val));
        tap_ok(ch_tokens_bytes(train) && ch_tokens_bytes(val), "text: tokens are bytes");
        int64_t n_val = TEXT_N / 10;
        check_tokens(train, want, TEXT_N - n_val, "text train: the first 11111 bytes");
        check_tokens(val, want + TEXT_N - n_val, n_val, "text val: the last 1234 bytes");
    }
    ch_tokens_free(train);
    ch_tokens_free(val);
    free(text);
    free(want);
}

/* A folder laid out as Debian's fortunes: texts, their .dat indexes, .u8
 * links to the texts; and a sub-folder, a hidden file, an empty file. */
static void test_text_folder(void)
{
    static const char *names[] = {"c", "a", "b-b", "e"};
    static const char *texts[] = {"third text.\n%\n", "first, with a \xc3\xa9.\n%\n",
                                  "second\n%\nmore of it\n%\n", ""};
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path_in("%s", "texts"));
    make_dir(dir);
    for (int i = 0; i < 4; i++) {
        write_bytes(path_in("texts/%s", names[i]), texts[i], strlen(texts[i]));
        write_bytes(path_in("texts/%s.dat", names[i]), "\0\0\0\2index", 9);
        if (symlink(names[i], path_in("texts/%s.u8", names[i])) != 0)
            tap_diag("could not link texts/%s.u8", names[i]);
    }
    make_dir(path_in("%s", "texts/sub"));
    write_bytes(path_in("%s", "texts/sub/inner"), "inside a sub-folder\n", 20);
    write_bytes(path_in("%s", "texts/.hidden"), "hidden\n", 7);
    const char *whole = "first, with a \xc3\xa9.\n%\nsecond\n%\nmore of it\n%\nthird text.\n%\n";
    int64_t n = (int64_t)strlen(whole), n_val = n / 10;
    int32_t want[128];
    for (int64_t i = 0; i < n; i++)
        want[i] = (uint8_t)whole[i];
    ch_tokens *train = NULL, *val = NULL;
    if (tap_status_ok(ch_tokens_open(&train, &val, dir), "text folder: open %s", dir)) {
        check_tokens(train, want, n - n_val,
                     "text folder train: a, b-b, c in name order; no .dat, link, folder or hidden file");
        check_tokens(val, want + n - n_val, n_val, "text folder val: the last tenth");
    }
    ch_tokens_free(train);
    ch_tokens_free(val);
    unlink(path_in("%s", "texts/sub/inner"));
    rmdir(path_in("%s", "texts/sub"));
}

/* ---- Windows ------------------------------------------------------------ */

/* The documented offset of training sample (seed, epoch, index). */
static int64_t want_offset(int64_t count, int context, uint64_t seed, int64_t epoch,
                           int64_t index)
{
    uint64_t i = (uint64_t)index, e = (uint64_t)epoch;
    uint32_t ctr[4] = {(uint32_t)i, (uint32_t)(i >> 32), (uint32_t)e, (uint32_t)(e >> 32)};
    ch_philox4x32(ctr, seed);
    return (int64_t)((((uint64_t)ctr[0] << 32) | ctr[1]) % (uint64_t)(count - context));
}

/* Every training window of epochs 0 and 1 at the documented offset, in
 * range, targets the inputs shifted by one. */
static void check_formula(const ch_tokens *t, const int32_t *tokens, int context,
                          const char *what)
{
    int64_t count = ch_tokens_count(t), windows = ch_tokens_windows(t, context);
    tap_ok(windows == (count - 1) / context, "%s: %lld windows of context %d, want %lld", what,
           (long long)windows, context, (long long)(count - 1) / context);
    int32_t *in = malloc((size_t)context * sizeof *in), *tg = malloc((size_t)context * sizeof *tg);
    int64_t checked = 0, shift_bad = -1, range_bad = -1, formula_bad = -1;
    for (int64_t epoch = 0; epoch < 2; epoch++)
        for (int64_t i = 0; i < windows; i++, checked++) {
            if (ch_tokens_window(t, in, tg, SEED, epoch, i, context) != CH_OK) {
                tap_ok(0, "%s: window %lld of epoch %lld: %s", what, (long long)i,
                       (long long)epoch, ch_last_error());
                goto out;
            }
            int64_t off = want_offset(count, context, SEED, epoch, i);
            for (int k = 0; k < context; k++) {
                if (k + 1 < context && tg[k] != in[k + 1] && shift_bad < 0)
                    shift_bad = checked;
                if ((in[k] < 0 || in[k] >= ch_tokens_vocab(t) || tg[k] < 0 ||
                     tg[k] >= ch_tokens_vocab(t)) && range_bad < 0)
                    range_bad = checked;
                if ((in[k] != tokens[off + k] || tg[k] != tokens[off + k + 1]) &&
                    formula_bad < 0)
                    formula_bad = checked;
            }
        }
    tap_ok(shift_bad < 0, "%s: targets are the inputs shifted by one (first failure: window %lld)",
           what, (long long)shift_bad);
    tap_ok(range_bad < 0, "%s: every token of every window below the vocab %d (first failure: "
           "window %lld)", what, ch_tokens_vocab(t), (long long)range_bad);
    tap_ok(formula_bad < 0, "%s: all %lld windows of epochs 0 and 1 at offset philox(index, "
           "epoch; seed) %% (count - context) (first failure: window %lld)", what,
           (long long)checked, (long long)formula_bad);
out:
    free(in);
    free(tg);
}

/* The same (seed, epoch, index) gives the same window in any order, from
 * another handle, split over "devices" as a global batch; another seed or
 * epoch gives other windows. */
static void check_independence(const ch_tokens *t, const char *path, int context)
{
    enum { B = 12 };
    int32_t ref[B][64], got[B][64], tg[64];
    for (int i = 0; i < B; i++)
        ch_tokens_window(t, ref[i], tg, SEED, 3, 40 + i, context);
    for (int i = B - 1; i >= 0; i--) {
        ch_tokens_window(t, got[i], tg, SEED + 1, 3, 40 + i, context);
        ch_tokens_window(t, got[i], tg, SEED, 3, 40 + i, context);
    }
    tap_ok(memcmp(ref, got, sizeof ref) == 0,
           "the same windows drawn in reverse order, other draws in between");
    ch_tokens *a = NULL, *b = NULL;
    if (tap_status_ok(ch_tokens_open(&a, &b, path), "a second handle on %s", path)) {
        /* A global batch of 12 split 5 + 7 over two "replicas", each of
         * which draws its own share by global index. */
        for (int i = 0; i < B; i++)
            ch_tokens_window(i < 5 ? a : t, got[i], tg, SEED, 3, 40 + i, context);
        tap_ok(memcmp(ref, got, sizeof ref) == 0,
               "a batch of 12 split 5 + 7 over two handles gives the windows of one");
    }
    ch_tokens_free(a);
    ch_tokens_free(b);
    int same_seed = 0, same_epoch = 0;
    for (int i = 0; i < B; i++) {
        ch_tokens_window(t, got[i], tg, SEED + 1, 3, 40 + i, context);
        same_seed += memcmp(ref[i], got[i], sizeof ref[i]) == 0;
        ch_tokens_window(t, got[i], tg, SEED, 4, 40 + i, context);
        same_epoch += memcmp(ref[i], got[i], sizeof ref[i]) == 0;
    }
    tap_ok(same_seed == 0 && same_epoch == 0,
           "another seed or epoch draws other windows (%d and %d of 12 the same, want 0)",
           same_seed, same_epoch);
}

/* Evaluation windows follow each other from offset 0 and leave less than
 * one window of targets uncovered at the end. */
static void check_eval(const ch_tokens *t, const int32_t *tokens, int context, const char *what)
{
    int64_t count = ch_tokens_count(t), windows = ch_tokens_windows(t, context);
    int32_t *in = malloc((size_t)context * sizeof *in), *tg = malloc((size_t)context * sizeof *tg);
    int64_t covered = 0, bad = -1;
    for (int64_t i = 0; i < windows && bad < 0; i++) {
        if (ch_tokens_eval_window(t, in, tg, i, context) != CH_OK) {
            bad = i;
            break;
        }
        for (int k = 0; k < context; k++)
            if (in[k] != tokens[covered + k] || tg[k] != tokens[covered + k + 1])
                bad = i;
        covered += context;
    }
    tap_ok(bad < 0, "%s: eval window i of context %d is tokens [i * %d, i * %d + %d] (first "
           "failure: %lld)", what, context, context, context, context, (long long)bad);
    tap_ok(covered + 1 <= count && count - 1 - covered < context,
           "%s: the %lld eval windows cover targets 1 to %lld of %lld tokens, leaving %lld < %d",
           what, (long long)windows, (long long)covered, (long long)count,
           (long long)(count - 1 - covered), context);
    free(in);
    free(tg);
}

static void test_windows(const char *shard_dir)
{
    ch_tokens *train = NULL, *val = NULL;
    if (!tap_status_ok(ch_tokens_open(&train, &val, shard_dir), "windows: open the shards"))
        return;
    int32_t *tokens = generated(train_token, TRAIN_N), *vtokens = generated(val_token, VAL_N);
    check_formula(train, tokens, 64, "shards train, context 64");
    check_formula(val, vtokens, 7, "shards val, context 7");
    check_independence(train, shard_dir, 64);
    check_eval(train, tokens, 64, "shards train");
    check_eval(val, vtokens, 7, "shards val");
    int32_t in[64], tg[64];
    /* Offset 2990 crosses from the first shard into the second. */
    tap_ok(ch_tokens_eval_window(train, in, tg, 2990 / 10, 10) == CH_OK &&
               in[9] == tokens[TRAIN_A - 1] && tg[9] == tokens[TRAIN_A] && tg[8] == in[9],
           "a window across two shards reads them as one sequence");
    free(tokens);
    free(vtokens);
    ch_tokens_free(train);
    ch_tokens_free(val);
}

/* 21 distinct training bytes, context 4: 17 offsets, each drawn 1000 times
 * on average over 17000 draws (5 a epoch, 3400 epochs). */
static void test_uniform(void)
{
    char text[24] = "ABCDEFGHIJKLMNOPQRSTUvw";
    const char *p = path_in("%s", "tiny.txt");
    write_bytes(p, text, 23);
    ch_tokens *train = NULL, *val = NULL;
    if (!tap_status_ok(ch_tokens_open(&train, &val, p), "uniform: open 23 bytes")) {
        return;
    }
    int hist[17] = {0}, stray = 0;
    int64_t windows = ch_tokens_windows(train, 4);
    tap_ok(ch_tokens_count(train) == 21 && windows == 5,
           "uniform: 21 training bytes, 5 windows of context 4 (got %lld, %lld)",
           (long long)ch_tokens_count(train), (long long)windows);
    for (int64_t e = 0; e < 3400; e++)
        for (int64_t i = 0; i < windows; i++) {
            int32_t in[4], tg[4];
            ch_tokens_window(train, in, tg, SEED, e, i, 4);
            int off = in[0] - 'A';
            if (off >= 0 && off < 17)
                hist[off]++;
            else
                stray++;
        }
    int lo = hist[0], hi = hist[0];
    for (int k = 1; k < 17; k++) {
        lo = hist[k] < lo ? hist[k] : lo;
        hi = hist[k] > hi ? hist[k] : hi;
    }
    /* sd = sqrt(17000 * 1/17 * 16/17) = 30.7: 5 sd is 154. */
    tap_ok(stray == 0 && lo >= 1000 - 154 && hi <= 1000 + 154,
           "uniform: each of the 17 offsets drawn %d to %d times in 17000, want 1000 +- 154 "
           "(%d outside)", lo, hi, stray);
    ch_tokens_free(train);
    ch_tokens_free(val);
}

/* ---- Errors ------------------------------------------------------------- */

/* ch_tokens_open must fail with `want` and a message naming `named` and
 * `problem`, and leave both handles NULL. */
static void open_fails(const char *path, ch_status want, const char *named, const char *problem,
                       const char *what)
{
    ch_tokens *train = (ch_tokens *)&train, *val = (ch_tokens *)&val;
    ch_status got = ch_tokens_open(&train, &val, path);
    const char *msg = ch_last_error();
    if (got == want && strstr(msg, named) && strstr(msg, problem))
        tap_ok(1, "%s: %s \"%s\"", what, ch_status_str(got), msg);
    else
        tap_ok(0, "%s: got %s \"%s\", want %s naming %s and \"%s\"", what, ch_status_str(got),
               msg, ch_status_str(want), named, problem);
    tap_ok(train == NULL && val == NULL, "%s: both handles NULL after the failure", what);
}

/* A folder `name` with a good validation shard and the training shard
 * `spec`; fails naming the training shard and `problem`. */
static void bad_shard(const char *name, shard_spec spec, const char *problem, const char *what)
{
    const char *dir = path_in("%s", name);
    make_dir(dir);
    char shard[4096];
    snprintf(shard, sizeof shard, "%s/x_train.bin", dir);
    write_shard(shard, spec);
    write_shard(path_in("%s/x_val.bin", name), good_shard(0, 50, val_token));
    open_fails(dir, CH_ERR_FORMAT, shard, problem, what);
}

static void test_shard_errors(void)
{
    shard_spec s = good_shard(0, 100, train_token);
    s.magic = 20240326;
    bad_shard("e-magic", s, "wrong magic 20240326, expected 20240520", "a shard with a wrong magic");
    s = good_shard(0, 100, train_token);
    s.version = 2;
    bad_shard("e-version", s, "version 2, expected 1", "a shard of version 2");
    s = good_shard(0, 100, train_token);
    s.cut = 4;
    bad_shard("e-trunc", s, "truncated: header says 100 tokens (1224 bytes), file has 1220",
              "a shard cut 4 bytes short");
    s = good_shard(0, 100, train_token);
    s.extra = 2;
    bad_shard("e-trailing", s, "trailing bytes: header says 100 tokens (1224 bytes), file has 1226",
              "a shard with 2 bytes past its tokens");
    s = good_shard(0, 100, train_token);
    s.count = 101;
    bad_shard("e-count", s, "truncated: header says 101 tokens (1226 bytes), file has 1224",
              "a shard whose count is one more than it holds");
    s = good_shard(0, 0, train_token);
    s.cut = 524;
    bad_shard("e-header", s, "truncated: 500 bytes, shorter than the 1024-byte header",
              "a shard shorter than its header");
    s.cut = 1024;
    bad_shard("e-empty", s, "truncated: 0 bytes, shorter than the 1024-byte header",
              "an empty shard file");
    s = good_shard(0, 0, train_token);
    s.count = -5;
    bad_shard("e-negative", s, "header says -5 tokens", "a shard with a negative count");
    const char *dir = path_in("%s", "e-dir");
    make_dir(dir);
    make_dir(path_in("%s", "e-dir/x_train.bin"));
    write_shard(path_in("%s", "e-dir/x_val.bin"), good_shard(0, 50, val_token));
    open_fails(dir, CH_ERR_FORMAT, path_in("%s", "e-dir/x_train.bin"), "not a regular file",
               "a folder named as a training shard");
    rmdir(path_in("%s", "e-dir/x_train.bin"));
}

static void test_group_errors(void)
{
    const char *dir = path_in("%s", "e-noval");
    make_dir(dir);
    write_shard(path_in("%s", "e-noval/x_train.bin"), good_shard(0, 50, train_token));
    write_shard(path_in("%s", "e-noval/x_valid.txt"), good_shard(0, 50, train_token));
    open_fails(dir, CH_ERR_FORMAT, dir, "no validation shards (*_val*.bin) beside the training shards (1)",
               "training shards without validation shards");
    dir = path_in("%s", "e-notrain");
    make_dir(dir);
    write_shard(path_in("%s", "e-notrain/x_val_0.bin"), good_shard(0, 50, val_token));
    write_shard(path_in("%s", "e-notrain/x_val_1.bin"), good_shard(0, 50, val_token));
    open_fails(dir, CH_ERR_FORMAT, dir, "no training shards (*_train*.bin) beside the validation shards (2)",
               "validation shards without training shards");
    dir = path_in("%s", "e-both");
    make_dir(dir);
    write_shard(path_in("%s", "e-both/x_train_val.bin"), good_shard(0, 50, val_token));
    open_fails(dir, CH_ERR_FORMAT, path_in("%s", "e-both/x_train_val.bin"),
               "matches both *_train*.bin and *_val*.bin", "a shard named as both groups");
    dir = path_in("%s", "e-notokens");
    make_dir(dir);
    write_shard(path_in("%s", "e-notokens/x_train.bin"), good_shard(0, 50, train_token));
    write_shard(path_in("%s", "e-notokens/x_val.bin"), good_shard(0, 0, val_token));
    open_fails(dir, CH_ERR_FORMAT, dir, "the validation shards (1) hold no tokens",
               "validation shards holding 0 tokens");
}

static void test_text_errors(void)
{
    const char *p = path_in("%s", "empty.txt");
    write_bytes(p, "", 0);
    open_fails(p, CH_ERR_FORMAT, p, "empty text (1 file, 0 bytes)", "an empty text file");
    p = path_in("%s", "nine.txt");
    write_bytes(p, "123456789", 9);
    open_fails(p, CH_ERR_FORMAT, p, "a text of 9 bytes is too short to split",
               "a text of 9 bytes (no validation byte)");
    const char *dir = path_in("%s", "e-notext");
    make_dir(dir);
    write_bytes(path_in("%s", "e-notext/a.dat"), "\0\0\0\2", 4);
    write_bytes(path_in("%s", "e-notext/b"), "", 0);
    if (symlink("../text.txt", path_in("%s", "e-notext/c.u8")) != 0)
        tap_diag("could not make a link in %s", dir);
    open_fails(dir, CH_ERR_FORMAT, dir, "empty text (1 file, 0 bytes)",
               "a folder of an empty file, a .dat file and a link");
    p = path_in("%s", "no-such-file");
    open_fails(p, CH_ERR_IO, p, "cannot open: No such file or directory", "a missing path");
    open_fails("/dev/null", CH_ERR_FORMAT, "/dev/null", "neither a regular file nor a folder",
               "a character device");
}

/* Permissions do not stop root: those checks need another user. */
static void test_permission_errors(void)
{
    const char *p = path_in("%s", "locked.txt"), *dir = path_in("%s", "locked-dir");
    if (geteuid() == 0) {
        tap_skip("running as root, which reads unreadable files: no check of a locked file");
        tap_skip("running as root, which reads unreadable files: no check of a locked file");
        tap_skip("running as root, which reads unreadable folders: no check of a locked folder");
        tap_skip("running as root, which reads unreadable folders: no check of a locked folder");
        return;
    }
    write_bytes(p, "some text that no one may read", 30);
    make_dir(dir);
    if (chmod(p, 0) != 0 || chmod(dir, 0) != 0)
        tap_diag("chmod failed");
    open_fails(p, CH_ERR_IO, p, "cannot open: Permission denied", "an unreadable text file");
    open_fails(dir, CH_ERR_IO, dir, "cannot open: Permission denied", "an unreadable folder");
    if (chmod(dir, 0700) != 0)
        tap_diag("chmod failed");
}

static void test_bad_arguments(void)
{
    const char *p = path_in("%s", "text.txt");
    ch_tokens *train = NULL, *val = NULL;
    tap_status_is(ch_tokens_open(NULL, &val, p), CH_ERR_INVALID_ARGUMENT, "train is NULL",
                  "open: train NULL");
    tap_status_is(ch_tokens_open(&train, NULL, p), CH_ERR_INVALID_ARGUMENT, "val is NULL",
                  "open: val NULL");
    tap_status_is(ch_tokens_open(&train, &val, NULL), CH_ERR_INVALID_ARGUMENT, "path is NULL",
                  "open: path NULL");
    if (!tap_status_ok(ch_tokens_open(&train, &val, p), "open %s for the argument checks", p))
        return;
    int32_t in[2000], tg[2000];
    int64_t w = ch_tokens_windows(train, 16);
    tap_status_is(ch_tokens_window(train, in, tg, 1, 0, w, 16), CH_ERR_INVALID_ARGUMENT,
                  "index is 694, expected 0 to 693", "window: index past the epoch");
    tap_status_is(ch_tokens_window(train, in, tg, 1, 0, -1, 16), CH_ERR_INVALID_ARGUMENT,
                  "index is -1", "window: negative index");
    tap_status_is(ch_tokens_window(train, in, tg, 1, -1, 0, 16), CH_ERR_INVALID_ARGUMENT,
                  "epoch is -1, expected >= 0", "window: negative epoch");
    tap_status_is(ch_tokens_window(train, NULL, tg, 1, 0, 0, 16), CH_ERR_INVALID_ARGUMENT,
                  "inputs is NULL", "window: inputs NULL");
    tap_status_is(ch_tokens_window(train, in, NULL, 1, 0, 0, 16), CH_ERR_INVALID_ARGUMENT,
                  "targets is NULL", "window: targets NULL");
    tap_status_is(ch_tokens_window(NULL, in, tg, 1, 0, 0, 16), CH_ERR_INVALID_ARGUMENT,
                  "t is NULL", "window: t NULL");
    tap_status_is(ch_tokens_window(train, in, tg, 1, 0, 0, 0), CH_ERR_INVALID_ARGUMENT,
                  "context is 0, expected >= 1", "window: context 0");
    tap_status_is(ch_tokens_eval_window(train, in, tg, ch_tokens_windows(train, 16), 16),
                  CH_ERR_INVALID_ARGUMENT, "index is 694, expected 0 to 693",
                  "eval window: index past the split");
    tap_status_is(ch_tokens_eval_window(train, in, NULL, 0, 16), CH_ERR_INVALID_ARGUMENT,
                  "targets is NULL", "eval window: targets NULL");
    tap_ok(ch_tokens_windows(train, 0) == 0 && strstr(ch_last_error(), "context is 0"),
           "windows of context 0: 0, \"%s\"", ch_last_error());
    /* 1234 validation bytes: context 1233 fits once, 1234 not at all. */
    tap_ok(ch_tokens_windows(val, 1233) == 1, "windows: 1 window of context 1233 in 1234 tokens");
    tap_ok(ch_tokens_windows(val, 1234) == 0 && strstr(ch_last_error(), p) &&
               strstr(ch_last_error(), "(validation split): 1234 tokens, too few for one "
                                       "window of context 1234 (1235 tokens)"),
           "windows: a split too short for context 1234: 0, \"%s\"", ch_last_error());
    tap_status_is(ch_tokens_window(val, in, tg, 1, 0, 0, 1500), CH_ERR_INVALID_ARGUMENT,
                  "(validation split): 1234 tokens, too few for one window of context 1500",
                  "window: a split too short for the context");
    tap_status_is(ch_tokens_eval_window(val, in, tg, 0, 1500), CH_ERR_INVALID_ARGUMENT,
                  "(validation split): 1234 tokens, too few for one window of context 1500",
                  "eval window: a split too short for the context");
    tap_ok(ch_tokens_count(NULL) == 0 && ch_tokens_vocab(NULL) == 0 && !ch_tokens_bytes(NULL),
           "queries on NULL give 0");
    ch_tokens_free(NULL);
    tap_ok(1, "ch_tokens_free(NULL) is a no-op");
    ch_tokens_free(train);
    ch_tokens_free(val);
}

/* ---- Debian's fortunes -------------------------------------------------- */

/* The bytes of the files not named *.dat nor *.u8, listed here without
 * the library's rule; -1 when the folder cannot be read. */
static int64_t fortunes_bytes(int *files)
{
    DIR *d = opendir(FORTUNES_DIR);
    if (!d)
        return -1;
    int64_t total = 0;
    struct dirent *e;
    *files = 0;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (e->d_name[0] == '.' || (n > 4 && strcmp(e->d_name + n - 4, ".dat") == 0) ||
            (n > 3 && strcmp(e->d_name + n - 3, ".u8") == 0))
            continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", FORTUNES_DIR, e->d_name);
        if (stat(path, &st) == 0) {
            total += (int64_t)st.st_size;
            ++*files;
        }
    }
    closedir(d);
    return total;
}

static int64_t nul_bytes(const ch_tokens *t)
{
    int32_t *all = read_all(t, "fortunes");
    int64_t nul = 0;
    for (int64_t i = 0; all && i < ch_tokens_count(t); i++)
        nul += all[i] == 0;
    free(all);
    return all ? nul : -1;
}

static void test_fortunes(void)
{
    if (access(FORTUNES_DIR, R_OK) != 0) {
        tap_skip("%s is not installed (Debian package fortunes; ./bootstrap installs it)",
                 FORTUNES_DIR);
        return;
    }
    ch_tokens *train = NULL, *val = NULL;
    if (!tap_status_ok(ch_tokens_open(&train, &val, FORTUNES_DIR), "fortunes: open %s",
                       FORTUNES_DIR))
        return;
    int64_t nt = ch_tokens_count(train), nv = ch_tokens_count(val);
    int files = 0;
    int64_t want = fortunes_bytes(&files);
    tap_ok(nt + nv == want && nt + nv > 1000000 && nv == want / 10,
           "fortunes: %lld training and %lld validation bytes, want %lld (> 1 MB) in all from "
           "its %d texts (no .dat, no .u8), the last tenth for validation", (long long)nt,
           (long long)nv, (long long)want, files);
    int64_t nul = nul_bytes(train);
    tap_ok(nul == 0, "fortunes: no NUL byte in the training text (a .dat index has them): %lld",
           (long long)nul);
    ch_tokens_free(train);
    ch_tokens_free(val);
}

int main(void)
{
    tmp = idxgen_tmpdir();
    if (!tmp)
        tap_skip_all("cannot create a temporary folder");
    const char *shards = write_shard_folder();
    char shard_dir[4096];
    snprintf(shard_dir, sizeof shard_dir, "%s", shards);
    test_shards(shard_dir);
    test_text_file();
    test_text_folder();
    test_windows(shard_dir);
    test_uniform();
    test_shard_errors();
    test_group_errors();
    test_text_errors();
    test_permission_errors();
    test_bad_arguments();
    test_fortunes();
    static const char *dirs[] = {"shards", "texts", "e-magic", "e-version", "e-trunc",
                                 "e-trailing", "e-count", "e-header", "e-empty", "e-negative",
                                 "e-dir", "e-noval", "e-notrain", "e-both", "e-notokens",
                                 "e-notext", "locked-dir"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        idxgen_cleanup(path_in("%s", dirs[i]));
    idxgen_cleanup(tmp);
    return tap_done();
}
