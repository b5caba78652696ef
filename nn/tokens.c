/* Token data sets (include/chorus/data.h): llm.c token shards and texts.
 * Files are mapped, not read: shards run to gigabytes, and a split holds
 * only its pieces (a mapped range of one file each) with the index of each
 * piece's first token, so a window that crosses from one file into the next
 * reads as one sequence. A text split into training and validation maps
 * each of its ranges on its own, so the two handles share nothing. */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chorus.h>
#include "error.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (4 * SHARD_HEADER_INTS)

typedef struct piece {
    void *map;           /* what munmap releases */
    size_t map_len;
    const uint8_t *data; /* the piece's first token, inside the map */
    int64_t first;       /* that token's index in the split */
    int64_t count;
} piece;

struct ch_tokens {
    char *source;      /* the path opened, for messages */
    const char *split; /* "training" or "validation" */
    int width;         /* bytes a token: 1 (text) or 2 (shards) */
    int32_t vocab;
    int64_t count;
    piece *pieces;
    int npieces, cap;
};

/* A file to read: its path and size, as listed. */
typedef struct file_entry {
    char *path;
    int64_t size;
} file_entry;

typedef struct file_list {
    file_entry *v;
    size_t n, cap;
} file_list;

static void files_free(file_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].path);
    free(l->v);
    *l = (file_list){0};
}

/* Appends dir/name (or name alone when dir is NULL). */
static ch_status files_add(file_list *l, const char *dir, const char *name, int64_t size)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        file_entry *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_tokens_open: out of memory listing %s",
                             dir ? dir : name);
        l->v = v;
        l->cap = cap;
    }
    size_t len = (dir ? strlen(dir) + 1 : 0) + strlen(name) + 1;
    char *path = malloc(len);
    if (!path)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_tokens_open: out of memory listing %s",
                         dir ? dir : name);
    if (dir)
        snprintf(path, len, "%s/%s", dir, name);
    else
        memcpy(path, name, len);
    l->v[l->n++] = (file_entry){path, size};
    return CH_OK;
}

static int by_path(const void *a, const void *b)
{
    return strcmp(((const file_entry *)a)->path, ((const file_entry *)b)->path);
}

/* ---- Splits ------------------------------------------------------------- */

static ch_status tokens_new(ch_tokens **out, const char *source, const char *split, int width)
{
    ch_tokens *t = calloc(1, sizeof *t);
    char *copy = malloc(strlen(source) + 1);
    if (!t || !copy) {
        free(t);
        free(copy);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_tokens_open: out of memory");
    }
    memcpy(copy, source, strlen(source) + 1);
    t->source = copy;
    t->split = split;
    t->width = width;
    t->vocab = width == 1 ? 256 : 0;
    *out = t;
    return CH_OK;
}

void ch_tokens_free(ch_tokens *t)
{
    if (!t)
        return;
    /* munmap fails only for a range that is not mapped (EINVAL): each piece
     * releases exactly the map it made. */
    for (int i = 0; i < t->npieces; i++)
        munmap(t->pieces[i].map, t->pieces[i].map_len);
    free(t->pieces);
    free(t->source);
    free(t);
}

/* Maps `len` bytes (> 0) of the open file from `offset` as the split's next
 * piece. mmap wants an offset on a page boundary: the map starts at the
 * page that holds `offset`. */
static ch_status map_piece(ch_tokens *t, int fd, const char *path, int64_t offset, int64_t len)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        return chi_error(CH_ERR_INTERNAL, "%s: sysconf(_SC_PAGESIZE) returned %ld", path, page);
    if (t->npieces == t->cap) {
        int cap = t->cap ? 2 * t->cap : 8;
        piece *v = realloc(t->pieces, (size_t)cap * sizeof *v);
        if (!v)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_tokens_open: out of memory");
        t->pieces = v;
        t->cap = cap;
    }
    size_t skip = (size_t)offset % (size_t)page;
    if ((uint64_t)len > SIZE_MAX - skip)
        return chi_error(CH_ERR_LIMIT, "%s: %lld bytes cannot be mapped here", path,
                         (long long)len);
    size_t map_len = skip + (size_t)len;
    void *map = mmap(NULL, map_len, PROT_READ, MAP_PRIVATE, fd, (off_t)(offset - (int64_t)skip));
    if (map == MAP_FAILED)
        return chi_error(errno == ENOMEM ? CH_ERR_OUT_OF_MEMORY : CH_ERR_IO,
                         "%s: mmap of %zu bytes: %s", path, map_len, strerror(errno));
    int64_t count = len / t->width;
    t->pieces[t->npieces++] = (piece){map, map_len, (const uint8_t *)map + skip, t->count, count};
    t->count += count;
    return CH_OK;
}

static ch_status open_file(const char *path, int *fd, int64_t *size)
{
    *fd = open(path, O_RDONLY);
    if (*fd < 0)
        return chi_error(CH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(*fd, &st) != 0) {
        ch_status s = chi_error(CH_ERR_IO, "%s: fstat: %s", path, strerror(errno));
        close(*fd);
        return s;
    }
    if (!S_ISREG(st.st_mode)) {
        close(*fd);
        return chi_error(CH_ERR_FORMAT, "%s: not a regular file", path);
    }
    *size = (int64_t)st.st_size;
    return CH_OK;
}

/* Closes fd; `st` is the status so far, which wins over a failed close. */
static ch_status close_file(int fd, const char *path, ch_status st)
{
    if (close(fd) != 0 && st == CH_OK)
        return chi_error(CH_ERR_IO, "%s: close: %s", path, strerror(errno));
    return st;
}

static int32_t token_at(const ch_tokens *t, const piece *p, int64_t k)
{
    if (t->width == 1)
        return p->data[k];
    const uint8_t *b = p->data + 2 * k;
    return (int32_t)(b[0] | b[1] << 8);
}

static int32_t max_token(const ch_tokens *t)
{
    int32_t top = -1;
    for (int i = 0; i < t->npieces; i++)
        for (int64_t k = 0; k < t->pieces[i].count; k++) {
            int32_t v = token_at(t, &t->pieces[i], k);
            if (v > top)
                top = v;
        }
    return top;
}

/* ---- Texts -------------------------------------------------------------- */

/* Maps the bytes [lo, hi) of the concatenation of `files` into t. */
static ch_status text_map(ch_tokens *t, const file_list *files, int64_t lo, int64_t hi)
{
    int64_t at = 0;
    for (size_t i = 0; i < files->n && at < hi; i++) {
        const file_entry *f = &files->v[i];
        int64_t from = lo > at ? lo - at : 0, to = hi < at + f->size ? hi - at : f->size;
        at += f->size;
        if (from >= to)
            continue;
        int fd;
        int64_t size;
        TRY(open_file(f->path, &fd, &size));
        ch_status st = CH_OK;
        if (size < to)
            st = chi_error(CH_ERR_IO, "%s: changed while being opened: %lld bytes, was %lld",
                           f->path, (long long)size, (long long)f->size);
        if (st == CH_OK)
            st = map_piece(t, fd, f->path, from, to - from);
        TRY(close_file(fd, f->path, st));
    }
    return CH_OK;
}

static ch_status text_open(ch_tokens **train, ch_tokens **val, const char *source,
                           const file_list *files)
{
    int64_t n = 0;
    for (size_t i = 0; i < files->n; i++)
        n += files->v[i].size;
    if (n == 0)
        return chi_error(CH_ERR_FORMAT, "%s: empty text (%zu %s, 0 bytes)", source, files->n,
                         files->n == 1 ? "file" : "files");
    if (n < 10)
        return chi_error(CH_ERR_FORMAT, "%s: a text of %lld bytes is too short to split: "
                         "its validation split (the last tenth) would be empty",
                         source, (long long)n);
    int64_t n_train = n - n / 10;
    TRY(tokens_new(train, source, "training", 1));
    TRY(text_map(*train, files, 0, n_train));
    TRY(tokens_new(val, source, "validation", 1));
    return text_map(*val, files, n_train, n);
}

/* ---- Shards ------------------------------------------------------------- */

static int32_t le32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static ch_status read_header(int fd, const char *path, uint8_t *h)
{
    size_t got = 0;
    while (got < SHARD_HEADER_BYTES) {
        ssize_t n = pread(fd, h + got, SHARD_HEADER_BYTES - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return chi_error(CH_ERR_IO, "%s: read: %s", path, strerror(errno));
        if (n == 0)
            return chi_error(CH_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the "
                             "%d-byte header", path, got, SHARD_HEADER_BYTES);
        got += (size_t)n;
    }
    return CH_OK;
}

/* The token count of a shard whose file has `size` bytes. */
static ch_status check_header(const uint8_t *h, const char *path, int64_t size, int32_t *count)
{
    int32_t magic = le32(h), version = le32(h + 4), n = le32(h + 8);
    if (magic != SHARD_MAGIC)
        return chi_error(CH_ERR_FORMAT, "%s: wrong magic %d, expected %d (llm.c token shard)",
                         path, magic, SHARD_MAGIC);
    if (version != SHARD_VERSION)
        return chi_error(CH_ERR_FORMAT, "%s: version %d, expected %d (uint16 tokens)", path,
                         version, SHARD_VERSION);
    if (n < 0)
        return chi_error(CH_ERR_FORMAT, "%s: header says %d tokens", path, n);
    int64_t want = SHARD_HEADER_BYTES + 2 * (int64_t)n;
    if (size != want)
        return chi_error(CH_ERR_FORMAT, "%s: %s: header says %d tokens (%lld bytes), file has %lld",
                         path, size < want ? "truncated" : "trailing bytes", n,
                         (long long)want, (long long)size);
    *count = n;
    return CH_OK;
}

static ch_status shard_map(ch_tokens *t, const char *path)
{
    int fd;
    int64_t size;
    TRY(open_file(path, &fd, &size));
    uint8_t header[SHARD_HEADER_BYTES];
    int32_t count = 0;
    ch_status st = read_header(fd, path, header);
    if (st == CH_OK)
        st = check_header(header, path, size, &count);
    if (st == CH_OK && count > 0)
        st = map_piece(t, fd, path, SHARD_HEADER_BYTES, 2 * (int64_t)count);
    return close_file(fd, path, st);
}

static ch_status shards_group(ch_tokens **out, const char *dir, const char *split,
                              const file_list *shards)
{
    TRY(tokens_new(out, dir, split, 2));
    for (size_t i = 0; i < shards->n; i++)
        TRY(shard_map(*out, shards->v[i].path));
    if ((*out)->count == 0)
        return chi_error(CH_ERR_FORMAT, "%s: the %s shards (%zu) hold no tokens", dir, split,
                         shards->n);
    return CH_OK;
}

static ch_status shards_open(ch_tokens **train, ch_tokens **val, const char *dir,
                             const file_list *train_shards, const file_list *val_shards)
{
    if (val_shards->n == 0)
        return chi_error(CH_ERR_FORMAT, "%s: no validation shards (*_val*.bin) beside the "
                         "training shards (%zu)", dir, train_shards->n);
    if (train_shards->n == 0)
        return chi_error(CH_ERR_FORMAT, "%s: no training shards (*_train*.bin) beside the "
                         "validation shards (%zu)", dir, val_shards->n);
    TRY(shards_group(train, dir, "training", train_shards));
    TRY(shards_group(val, dir, "validation", val_shards));
    int32_t a = max_token(*train), b = max_token(*val);
    (*train)->vocab = (*val)->vocab = (a > b ? a : b) + 1;
    return CH_OK;
}

/* ---- Folders ------------------------------------------------------------ */

/* The folder's names, less "." and the hidden ones, sorted bytewise. */
static ch_status list_folder(file_list *names, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return chi_error(CH_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
    ch_status st = CH_OK;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno != 0)
                st = chi_error(CH_ERR_IO, "%s: readdir: %s", dir, strerror(errno));
            break;
        }
        if (e->d_name[0] != '.' && (st = files_add(names, NULL, e->d_name, 0)) != CH_OK)
            break;
    }
    if (closedir(d) != 0 && st == CH_OK)
        st = chi_error(CH_ERR_IO, "%s: closedir: %s", dir, strerror(errno));
    if (st == CH_OK && names->n > 1)
        qsort(names->v, names->n, sizeof *names->v, by_path);
    return st;
}

/* name is *<infix>*.bin */
static int shard_name(const char *name, const char *infix)
{
    size_t n = strlen(name);
    if (n < 4 || strcmp(name + n - 4, ".bin") != 0)
        return 0;
    const char *at = strstr(name, infix);
    return at && (size_t)(at - name) + strlen(infix) <= n - 4;
}

static int ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && strcmp(name + n - k, suffix) == 0;
}

/* The regular files of the folder (not links, not *.dat) with their sizes. */
static ch_status text_files(file_list *out, const char *dir, const file_list *names)
{
    for (size_t i = 0; i < names->n; i++) {
        if (ends_with(names->v[i].path, ".dat"))
            continue;
        TRY(files_add(out, dir, names->v[i].path, 0));
        struct stat st;
        if (lstat(out->v[out->n - 1].path, &st) != 0)
            return chi_error(CH_ERR_IO, "%s: lstat: %s", out->v[out->n - 1].path,
                             strerror(errno));
        if (S_ISREG(st.st_mode))
            out->v[out->n - 1].size = (int64_t)st.st_size;
        else
            free(out->v[--out->n].path);
    }
    return CH_OK;
}

/* Sorts the names into the two shard groups; a name in both is an error. */
static ch_status shard_groups(file_list *train, file_list *val, const char *dir,
                              const file_list *names)
{
    for (size_t i = 0; i < names->n; i++) {
        const char *name = names->v[i].path;
        int is_train = shard_name(name, "_train"), is_val = shard_name(name, "_val");
        if (is_train && is_val)
            return chi_error(CH_ERR_FORMAT, "%s/%s: the name matches both *_train*.bin and "
                             "*_val*.bin", dir, name);
        if (is_train || is_val)
            TRY(files_add(is_train ? train : val, dir, name, 0));
    }
    return CH_OK;
}

static ch_status folder_open(ch_tokens **train, ch_tokens **val, const char *dir)
{
    file_list names = {0}, a = {0}, b = {0};
    ch_status st = list_folder(&names, dir);
    if (st == CH_OK)
        st = shard_groups(&a, &b, dir, &names);
    if (st == CH_OK && a.n + b.n > 0)
        st = shards_open(train, val, dir, &a, &b);
    else if (st == CH_OK && (st = text_files(&a, dir, &names)) == CH_OK)
        st = text_open(train, val, dir, &a);
    files_free(&names);
    files_free(&a);
    files_free(&b);
    return st;
}

static ch_status tokens_open(ch_tokens **train, ch_tokens **val, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return chi_error(CH_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return folder_open(train, val, path);
    if (!S_ISREG(st.st_mode))
        return chi_error(CH_ERR_FORMAT, "%s: neither a regular file nor a folder", path);
    file_list one = {0};
    ch_status s = files_add(&one, NULL, path, (int64_t)st.st_size);
    if (s == CH_OK)
        s = text_open(train, val, path, &one);
    files_free(&one);
    return s;
}

ch_status ch_tokens_open(ch_tokens **train, ch_tokens **val, const char *path)
{
    if (!train || !val)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tokens_open: %s is NULL",
                         !train ? "train" : "val");
    *train = *val = NULL;
    if (!path)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tokens_open: path is NULL");
    ch_status st = tokens_open(train, val, path);
    if (st != CH_OK) {
        ch_tokens_free(*train);
        ch_tokens_free(*val);
        *train = *val = NULL;
    }
    return st;
}

/* ---- Windows ------------------------------------------------------------ */

int64_t ch_tokens_count(const ch_tokens *t) { return t ? t->count : 0; }

int32_t ch_tokens_vocab(const ch_tokens *t) { return t ? t->vocab : 0; }

int ch_tokens_bytes(const ch_tokens *t) { return t && t->width == 1; }

/* The split holds a window of `context` tokens (plus the last target). */
static ch_status check_context(const ch_tokens *t, const char *fn, int context)
{
    if (!t)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: t is NULL", fn);
    if (context < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: context is %d, expected >= 1", fn,
                         context);
    if (t->count - 1 < context)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s (%s split): %lld tokens, too few "
                         "for one window of context %d (%lld tokens)", fn, t->source, t->split,
                         (long long)t->count, context, (long long)context + 1);
    return CH_OK;
}

int64_t ch_tokens_windows(const ch_tokens *t, int context)
{
    if (check_context(t, "ch_tokens_windows", context) != CH_OK)
        return 0;
    return (t->count - 1) / context;
}

/* The tokens [first, first + n) of the split, across pieces. */
static void read_tokens(const ch_tokens *t, int32_t *dst, int64_t first, int64_t n)
{
    int lo = 0, hi = t->npieces - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (t->pieces[mid].first <= first)
            lo = mid;
        else
            hi = mid - 1;
    }
    for (int i = lo; n > 0; i++) {
        const piece *p = &t->pieces[i];
        int64_t k = first - p->first;
        for (; k < p->count && n > 0; k++, n--, first++)
            *dst++ = token_at(t, p, k);
    }
}

static ch_status check_window(const ch_tokens *t, const char *fn, const int32_t *inputs,
                              const int32_t *targets, int64_t index, int context)
{
    TRY(check_context(t, fn, context));
    if (!inputs || !targets)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         !inputs ? "inputs" : "targets");
    int64_t windows = (t->count - 1) / context;
    if (index < 0 || index >= windows)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: index is %lld, expected 0 to %lld "
                         "(the windows of context %d in the %s split)", fn, (long long)index,
                         (long long)windows - 1, context, t->split);
    return CH_OK;
}

static void copy_window(const ch_tokens *t, int32_t *inputs, int32_t *targets, int64_t offset,
                        int context)
{
    read_tokens(t, inputs, offset, context);
    read_tokens(t, targets, offset + 1, context);
}

ch_status ch_tokens_window(const ch_tokens *t, int32_t *inputs, int32_t *targets,
                           uint64_t seed, int64_t epoch, int64_t index, int context)
{
    TRY(check_window(t, "ch_tokens_window", inputs, targets, index, context));
    if (epoch < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tokens_window: epoch is %lld, expected >= 0",
                         (long long)epoch);
    uint64_t i = (uint64_t)index, e = (uint64_t)epoch;
    uint32_t ctr[4] = {(uint32_t)i, (uint32_t)(i >> 32), (uint32_t)e, (uint32_t)(e >> 32)};
    ch_philox4x32(ctr, seed);
    uint64_t draw = (uint64_t)ctr[0] << 32 | ctr[1];
    copy_window(t, inputs, targets, (int64_t)(draw % (uint64_t)(t->count - context)), context);
    return CH_OK;
}

ch_status ch_tokens_eval_window(const ch_tokens *t, int32_t *inputs, int32_t *targets,
                                int64_t i, int context)
{
    TRY(check_window(t, "ch_tokens_eval_window", inputs, targets, i, context));
    copy_window(t, inputs, targets, i * context, context);
    return CH_OK;
}
