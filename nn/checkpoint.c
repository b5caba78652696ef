/* Checkpoints as safetensors files: an 8-byte little-endian header length,
 * a JSON header ({"name": {"dtype", "shape", "data_offsets"}, ...,
 * "__metadata__": {string: string}}), then the raw little-endian tensors. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nn.h"

/* Checkpoints are only read or written whole; a header beyond this is not
 * one of ours (and would be an absurd allocation). */
#define MAX_HEADER ((uint64_t)64 << 20)
#define FORMAT "chorus-1"

static const char *opt_kind_name(int kind)
{
    return kind == CH_OPT_SGD ? "sgd" : kind == CH_OPT_ADAM ? "adam" : "adamw";
}

/* One tensor to write or read: its name and where it lives. */
typedef struct entry {
    char name[160];
    ch_tensor *t;
    int64_t *counter; /* instead of t: an I64 scalar (num_batches_tracked) */
    ch_dtype as;      /* a tensor's dtype in the file: f32, bf16 or f16 */
} entry;

static size_t entry_bytes(const entry *e)
{
    return e->t ? (size_t)ch_tensor_numel(e->t) * ch_dtype_size(e->as) : sizeof(int64_t);
}

/* safetensors' name of a dtype a checkpoint holds. */
static const char *st_dtype(ch_dtype d)
{
    return d == CH_BF16 ? "BF16" : d == CH_F16 ? "F16" : "F32";
}

/* Parameters, buffers, then the optimizer's existing state tensors. */
static ch_status list_entries(const ch_module *model, const ch_optimizer *opt, entry **out,
                              int *n)
{
    int np = ch_module_param_count(model), ns = opt ? ch_optimizer_state_count(opt) : 0;
    int nb = ch_module_buffer_count(model);
    entry *e = calloc((size_t)(np + nb + ns) + 1, sizeof *e);
    if (!e)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_checkpoint_save: out of memory");
    int k = 0;
    for (int i = 0; i < np; i++, k++) {
        const char *name;
        ch_module_param(model, i, &name, &e[k].t, NULL);
        snprintf(e[k].name, sizeof e[k].name, "%s", name);
    }
    for (int i = 0; i < nb; i++, k++) {
        const char *name;
        ch_module_buffer(model, i, &name, &e[k].t, &e[k].counter);
        snprintf(e[k].name, sizeof e[k].name, "%s", name);
    }
    for (int i = 0; i < ns; i++) {
        const char *sname, *pname;
        ch_tensor *t;
        ch_optimizer_state(opt, i, &sname, &t);
        if (!t)
            continue;
        ch_module_param(model, i / (ns / np), &pname, NULL, NULL);
        snprintf(e[k].name, sizeof e[k].name, "optimizer.%s.%s", pname, sname);
        e[k++].t = t;
    }
    *out = e;
    *n = k;
    return CH_OK;
}

/* jansson reports a failed allocation by returning NULL or -1 and
 * nothing else: every insertion goes through these, and one failure makes
 * the whole header fail (a header missing an entry would be a checkpoint
 * that does not load). Both take `value` over, NULL included (jansson frees
 * it when the insertion fails). */
static void put(json_t *obj, const char *key, json_t *value, int *bad)
{
    if (!obj) {
        json_decref(value);
        *bad = 1;
    } else if (json_object_set_new(obj, key, value) != 0) {
        *bad = 1;
    }
}

static void append(json_t *arr, json_t *value, int *bad)
{
    if (!arr) {
        json_decref(value);
        *bad = 1;
    } else if (json_array_append_new(arr, value) != 0) {
        *bad = 1;
    }
}

static json_t *shape_json(const ch_tensor *t, int *bad)
{
    json_t *shape = json_array();
    for (int d = 0; d < ch_tensor_ndim(t); d++)
        append(shape, json_integer(ch_tensor_dim(t, d)), bad);
    return shape;
}

static json_t *metadata_json(const ch_optimizer *opt, const ch_train_state *state,
                             int *bad)
{
    json_t *meta = json_object();
    char buf[32];
    put(meta, "format", json_string(FORMAT), bad);
    if (state) {
        const int64_t vals[3] = {state->epoch, state->batch, state->step};
        const char *keys[3] = {"epoch", "batch", "step"};
        for (int i = 0; i < 3; i++) {
            snprintf(buf, sizeof buf, "%" PRId64, vals[i]);
            put(meta, keys[i], json_string(buf), bad);
        }
        snprintf(buf, sizeof buf, "%" PRIu64, state->seed);
        put(meta, "seed", json_string(buf), bad);
        /* Nine digits: the float comes back bit for bit. */
        if (state->input_std > 0.0f) {
            snprintf(buf, sizeof buf, "%.9g", state->input_mean);
            put(meta, "input_mean", json_string(buf), bad);
            snprintf(buf, sizeof buf, "%.9g", state->input_std);
            put(meta, "input_std", json_string(buf), bad);
        }
        if (state->loss_scale > 0.0f) {
            snprintf(buf, sizeof buf, "%.9g", state->loss_scale);
            put(meta, "loss_scale", json_string(buf), bad);
            snprintf(buf, sizeof buf, "%" PRId64, state->loss_scale_clean);
            put(meta, "loss_scale_clean", json_string(buf), bad);
        }
    }
    if (opt) {
        put(meta, "optimizer", json_string(opt_kind_name(nn_optimizer_kind(opt))), bad);
        snprintf(buf, sizeof buf, "%" PRId64, ch_optimizer_steps(opt));
        put(meta, "optimizer_steps", json_string(buf), bad);
    }
    return meta;
}

/* The header text, padded with spaces to a multiple of 8 bytes. */
static ch_status build_header(const entry *e, int n, const ch_optimizer *opt,
                              const ch_train_state *state, char **text, size_t *len)
{
    int bad_ = 0, *bad = &bad_;
    json_t *root = json_object();
    uint64_t off = 0;
    for (int i = 0; root && i < n; i++) {
        json_t *obj = json_object();
        put(obj, "dtype", json_string(e[i].t ? st_dtype(e[i].as) : "I64"), bad);
        put(obj, "shape", e[i].t ? shape_json(e[i].t, bad) : json_array(), bad);
        json_t *offs = json_array();
        append(offs, json_integer((json_int_t)off), bad);
        off += entry_bytes(&e[i]);
        append(offs, json_integer((json_int_t)off), bad);
        put(obj, "data_offsets", offs, bad);
        put(root, e[i].name, obj, bad);
    }
    if (root)
        put(root, "__metadata__", metadata_json(opt, state, bad), bad);
    char *s = root && !bad_ ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    /* jansson 2.14's json_dumps can lose part of its output when an
     * allocation inside it fails and still return a string (found by
     * tests/test-fault.c): the text must read back as what was built. */
    json_t *back = s ? json_loads(s, 0, NULL) : NULL;
    int same = back && json_equal(back, root);
    json_decref(back);
    json_decref(root);
    if (!same) {
        free(s);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_checkpoint_save: cannot build the header "
                         "(out of memory)");
    }
    size_t l = strlen(s), padded = (l + 7) / 8 * 8;
    char *p = realloc(s, padded + 1);
    if (!p) {
        free(s);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_checkpoint_save: out of memory");
    }
    memset(p + l, ' ', padded - l);
    p[padded] = '\0';
    *text = p;
    *len = padded;
    return CH_OK;
}

static ch_status write_all(int fd, const void *buf, size_t n, const char *path)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return chi_error(CH_ERR_IO, "ch_checkpoint_save: writing %s: %s", path,
                             strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return CH_OK;
}

static ch_status write_tensors(int fd, const entry *e, int n, const char *path)
{
    size_t cap = 0;
    void *buf = NULL;
    ch_status st = CH_OK;
    for (int i = 0; st == CH_OK && i < n; i++) {
        size_t bytes = entry_bytes(&e[i]);
        if (!e[i].t) {
            unsigned char le[8]; /* safetensors is little endian */
            for (int b = 0; b < 8; b++)
                le[b] = (unsigned char)((uint64_t)*e[i].counter >> (8 * b));
            st = write_all(fd, le, sizeof le, path);
            continue;
        }
        if (bytes > cap) {
            void *grown = realloc(buf, bytes);
            if (!grown) {
                st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_checkpoint_save: out of memory");
                break;
            }
            buf = grown;
            cap = bytes;
        }
        if (e[i].as == CH_F32) {
            st = ch_tensor_download(e[i].t, buf, bytes);
        } else {
            /* Converted on the tensor's device, the bits of ch_cast. */
            ch_tensor *half = NULL;
            int64_t shape[CH_MAX_DIMS];
            for (int d = 0; d < ch_tensor_ndim(e[i].t); d++)
                shape[d] = ch_tensor_dim(e[i].t, d);
            st = ch_tensor_new(&half, ch_tensor_device(e[i].t), e[i].as,
                               ch_tensor_ndim(e[i].t), shape);
            if (st == CH_OK)
                st = ch_cast(half, e[i].t);
            if (st == CH_OK)
                st = ch_tensor_download(half, buf, bytes);
            ch_tensor_free(half);
        }
        if (st == CH_OK)
            st = write_all(fd, buf, bytes, path);
    }
    free(buf);
    return st;
}

/* The rename is only durable once the folder is synced too. `dir` is
 * the folder's name, copied before the rename (nothing can fail for want
 * of memory once the new file is in place). A folder that does not open
 * or sync (some file systems refuse) leaves the save as it is: the file's
 * own data is synced. */
static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return;
    (void)fsync(fd);
    close(fd);
}

static ch_status save_to(int fd, const char *tmp, const entry *e, int n,
                         const ch_optimizer *opt, const ch_train_state *state)
{
    char *header = NULL;
    size_t hlen = 0;
    TRY(build_header(e, n, opt, state, &header, &hlen));
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    ch_status st = write_all(fd, lenbuf, 8, tmp);
    if (st == CH_OK)
        st = write_all(fd, header, hlen, tmp);
    free(header);
    if (st == CH_OK)
        st = write_tensors(fd, e, n, tmp);
    if (st == CH_OK && fsync(fd) != 0)
        st = chi_error(CH_ERR_IO, "ch_checkpoint_save: fsync %s: %s", tmp, strerror(errno));
    return st;
}

ch_status ch_checkpoint_save(const char *path, const ch_module *model, const ch_optimizer *opt,
                             const ch_train_state *state)
{
    return ch_checkpoint_save_as(path, model, opt, state, CH_F32);
}

ch_status ch_checkpoint_save_as(const char *path, const ch_module *model,
                                const ch_optimizer *opt, const ch_train_state *state,
                                ch_dtype dtype)
{
    if (!path || !model)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_checkpoint_save: %s is NULL",
                         !path ? "path" : "model");
    if (dtype != CH_F32 && dtype != CH_BF16 && dtype != CH_F16)
        return chi_error(CH_ERR_DTYPE, "ch_checkpoint_save: dtype %s, expected f32, bf16 or "
                         "f16", ch_dtype_name(dtype));
    if (nn_optimizer_ranged(opt))
        return chi_error(CH_ERR_STATE,
                         "ch_checkpoint_save: the optimizer holds a part of the "
                         "state (ch_dp_options.shard_optimizer); ch_dp_optimizer_get gives the "
                         "whole");
    entry *e = NULL;
    int n = 0;
    TRY(list_entries(model, opt, &e, &n));
    for (int i = 0; i < n; i++)
        e[i].as = dtype;
    char tmp[4096], dir[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(e);
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_checkpoint_save: path too long");
    }
    char copy[4096]; /* dirname changes its argument, and may return a static "." */
    snprintf(copy, sizeof copy, "%s", path);
    snprintf(dir, sizeof dir, "%s", dirname(copy));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        free(e);
        return chi_error(CH_ERR_IO, "ch_checkpoint_save: cannot create %s: %s", tmp,
                         strerror(errno));
    }
    ch_status st = save_to(fd, tmp, e, n, opt, state);
    free(e);
    if (close(fd) != 0 && st == CH_OK)
        st = chi_error(CH_ERR_IO, "ch_checkpoint_save: closing %s: %s", tmp, strerror(errno));
    if (st == CH_OK && rename(tmp, path) != 0)
        st = chi_error(CH_ERR_IO, "ch_checkpoint_save: renaming %s to %s: %s", tmp, path,
                       strerror(errno));
    if (st != CH_OK) {
        unlink(tmp);
        return st;
    }
    sync_dir(dir);
    return CH_OK;
}

/* ---- Loading ------------------------------------------------------------------ */

typedef struct file {
    const char *path;
    FILE *f;
    json_t *header;
    uint64_t data_start, data_len;
} file;

static ch_status bad(const file *f, const char *what)
{
    return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s: %s", f->path, what);
}

static ch_status open_file(file *f)
{
    f->f = fopen(f->path, "rb");
    if (!f->f)
        return chi_error(errno == ENOENT ? CH_ERR_NOT_FOUND : CH_ERR_IO,
                         "ch_checkpoint_load: cannot open %s: %s", f->path, strerror(errno));
    unsigned char lenbuf[8];
    if (fread(lenbuf, 1, 8, f->f) != 8)
        return bad(f, "shorter than the 8-byte header length");
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)lenbuf[i] << (8 * i);
    if (fseeko(f->f, 0, SEEK_END) != 0)
        return chi_error(CH_ERR_IO, "ch_checkpoint_load: seeking in %s: %s", f->path,
                         strerror(errno));
    uint64_t size = (uint64_t)ftello(f->f);
    if (hlen > MAX_HEADER || hlen > size - 8)
        return bad(f, "the header length is larger than the file");
    char *text = malloc(hlen + 1);
    if (!text)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_checkpoint_load: out of memory");
    fseeko(f->f, 8, SEEK_SET);
    size_t got = fread(text, 1, hlen, f->f);
    text[got] = '\0';
    json_error_t jerr;
    f->header = got == hlen ? json_loadb(text, hlen, 0, &jerr) : NULL;
    free(text);
    if (!f->header || !json_is_object(f->header))
        return bad(f, "the header is not a JSON object");
    f->data_start = 8 + hlen;
    f->data_len = size - f->data_start;
    return CH_OK;
}

/* Check the header entry `name` against `t`; *offset gets its data, *as
 * its dtype in the file (F32, or BF16 or F16, widened on loading). */
static ch_status check_entry(const file *f, const char *name, const ch_tensor *t,
                             uint64_t *offset, ch_dtype *as)
{
    json_t *e = json_object_get(f->header, name);
    if (!e)
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s has no tensor \"%s\"", f->path,
                         name);
    const char *dtype = json_string_value(json_object_get(e, "dtype"));
    *as = !dtype                         ? CH_I32
          : strcmp(dtype, "F32") == 0    ? CH_F32
          : strcmp(dtype, "BF16") == 0   ? CH_BF16
          : strcmp(dtype, "F16") == 0    ? CH_F16
                                         : CH_I32;
    if (*as == CH_I32)
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s: \"%s\" is %s, expected F32, "
                         "BF16 or F16", f->path, name, dtype ? dtype : "(no dtype)");
    json_t *shape = json_object_get(e, "shape");
    int ok = json_is_array(shape) && (int)json_array_size(shape) == ch_tensor_ndim(t);
    for (int d = 0; ok && d < ch_tensor_ndim(t); d++)
        ok = json_integer_value(json_array_get(shape, (size_t)d)) == ch_tensor_dim(t, d);
    if (!ok) {
        char *s = json_dumps(shape, JSON_COMPACT);
        ch_status st = chi_error(CH_ERR_SHAPE, "ch_checkpoint_load: %s: \"%s\" has shape %s, "
                                 "the model's has %d dimensions [%lld, ...]", f->path, name,
                                 s ? s : "?", ch_tensor_ndim(t), (long long)ch_tensor_dim(t, 0));
        free(s);
        return st;
    }
    json_t *offs = json_object_get(e, "data_offsets");
    json_int_t b = json_integer_value(json_array_get(offs, 0));
    json_int_t end = json_integer_value(json_array_get(offs, 1));
    if (!json_is_array(offs) || b < 0 || end < b ||
        end - b != (json_int_t)((size_t)ch_tensor_numel(t) * ch_dtype_size(*as)) ||
        (uint64_t)end > f->data_len)
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s: \"%s\" has data offsets "
                         "outside the file or of the wrong size", f->path, name);
    *offset = f->data_start + (uint64_t)b;
    return CH_OK;
}

/* An I64 scalar (shape [] as PyTorch saves num_batches_tracked, or [1]). */
static ch_status check_counter(const file *f, const char *name, uint64_t *offset)
{
    json_t *e = json_object_get(f->header, name);
    if (!e)
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s has no tensor \"%s\"", f->path,
                         name);
    const char *dtype = json_string_value(json_object_get(e, "dtype"));
    json_t *shape = json_object_get(e, "shape");
    size_t nd = json_array_size(shape);
    if (!dtype || strcmp(dtype, "I64") != 0 || !json_is_array(shape) || nd > 1 ||
        (nd == 1 && json_integer_value(json_array_get(shape, 0)) != 1))
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s: \"%s\" is not an I64 scalar",
                         f->path, name);
    json_t *offs = json_object_get(e, "data_offsets");
    json_int_t b = json_integer_value(json_array_get(offs, 0));
    json_int_t end = json_integer_value(json_array_get(offs, 1));
    if (!json_is_array(offs) || b < 0 || end < b || end - b != 8 ||
        (uint64_t)end > f->data_len)
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s: \"%s\" has data offsets "
                         "outside the file or of the wrong size", f->path, name);
    *offset = f->data_start + (uint64_t)b;
    return CH_OK;
}

static ch_status read_counter(const file *f, int64_t *counter, uint64_t offset)
{
    unsigned char le[8];
    if (fseeko(f->f, (off_t)offset, SEEK_SET) != 0 || fread(le, 1, 8, f->f) != 8)
        return chi_error(CH_ERR_IO, "ch_checkpoint_load: reading %s: %s", f->path,
                         ferror(f->f) ? strerror(errno) : "unexpected end of file");
    uint64_t v = 0;
    for (int b = 0; b < 8; b++)
        v |= (uint64_t)le[b] << (8 * b);
    *counter = (int64_t)v;
    return CH_OK;
}

static ch_status read_into(const file *f, ch_tensor *t, uint64_t offset, ch_dtype as,
                           void *buf)
{
    size_t bytes = (size_t)ch_tensor_numel(t) * ch_dtype_size(as);
    if (fseeko(f->f, (off_t)offset, SEEK_SET) != 0 || fread(buf, 1, bytes, f->f) != bytes)
        return chi_error(CH_ERR_IO, "ch_checkpoint_load: reading %s: %s", f->path,
                         ferror(f->f) ? strerror(errno) : "unexpected end of file");
    if (as == CH_F32)
        return ch_tensor_upload(t, buf, bytes);
    /* Half in the file: widened on the tensor's device (ch_cast, exact). */
    ch_tensor *half = NULL;
    int64_t shape[CH_MAX_DIMS];
    for (int d = 0; d < ch_tensor_ndim(t); d++)
        shape[d] = ch_tensor_dim(t, d);
    ch_status st = ch_tensor_new(&half, ch_tensor_device(t), as, ch_tensor_ndim(t), shape);
    if (st == CH_OK)
        st = ch_tensor_upload(half, buf, bytes);
    if (st == CH_OK)
        st = ch_cast(t, half);
    if (st == CH_OK)
        st = ch_device_sync(ch_tensor_device(t));
    ch_tensor_free(half);
    return st;
}

static const char *meta_str(const file *f, const char *key)
{
    return json_string_value(json_object_get(json_object_get(f->header, "__metadata__"), key));
}

/* A whole number from 0 to `max` in the metadata: 0 when absent (a
 * negative step or batch would send a resumed run before its data). */
static ch_status meta_number(const file *f, const char *key, uint64_t max, uint64_t *out)
{
    const char *s = meta_str(f, key);
    *out = 0;
    if (!s)
        return CH_OK;
    char *end = NULL;
    errno = 0;
    int digit = s[0] >= '0' && s[0] <= '9';
    unsigned long long v = digit ? strtoull(s, &end, 10) : 0;
    if (!digit || errno || *end || v > max)
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s: %s is \"%s\", expected a "
                         "whole number from 0 to %llu", f->path, key, s,
                         (unsigned long long)max);
    *out = v;
    return CH_OK;
}

static ch_status meta_count(const file *f, const char *key, int64_t *out)
{
    uint64_t v;
    TRY(meta_number(f, key, INT64_MAX, &v));
    *out = (int64_t)v;
    return CH_OK;
}

/* A tensor in the file that the model does not have is a mismatch too. */
static ch_status check_extra(const file *f, const ch_module *model)
{
    const char *key;
    json_t *value;
    int np = ch_module_param_count(model);
    json_object_foreach(f->header, key, value) {
        (void)value;
        if (strcmp(key, "__metadata__") == 0 || strncmp(key, "optimizer.", 10) == 0)
            continue;
        int found = 0;
        for (int i = 0; i < np && !found; i++) {
            const char *name;
            ch_module_param(model, i, &name, NULL, NULL);
            found = strcmp(name, key) == 0;
        }
        for (int i = 0; i < ch_module_buffer_count(model) && !found; i++) {
            const char *name;
            ch_module_buffer(model, i, &name, NULL, NULL);
            found = strcmp(name, key) == 0;
        }
        if (!found)
            return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s has a tensor \"%s\" that "
                             "the model does not have", f->path, key);
    }
    return CH_OK;
}

/* Every model parameter and optimizer state in the file, checked before
 * anything is changed. offs[i] = 0: that optimizer state is not there. */
static ch_status check_all(const file *f, ch_module *model, ch_optimizer *opt, uint64_t *offs,
                           ch_dtype *as)
{
    int np = ch_module_param_count(model);
    for (int i = 0; i < np; i++) {
        const char *name;
        ch_tensor *t;
        ch_module_param(model, i, &name, &t, NULL);
        TRY(check_entry(f, name, t, &offs[i], &as[i]));
    }
    int nb = ch_module_buffer_count(model);
    for (int i = 0; i < nb; i++) {
        const char *name;
        ch_tensor *t;
        ch_module_buffer(model, i, &name, &t, NULL);
        TRY(t ? check_entry(f, name, t, &offs[np + i], &as[np + i])
              : check_counter(f, name, &offs[np + i]));
    }
    offs += nb;
    as += nb;
    TRY(check_extra(f, model));
    int ns = opt ? ch_optimizer_state_count(opt) : 0;
    for (int i = 0; i < ns; i++) {
        const char *sname, *pname;
        ch_tensor **slot, *param;
        TRY(nn_optimizer_state_slot(opt, i, &slot, &param, 0));
        ch_optimizer_state(opt, i, &sname, NULL);
        ch_module_param(model, i / (ns / np), &pname, NULL, NULL);
        char key[192];
        snprintf(key, sizeof key, "optimizer.%s.%s", pname, sname);
        offs[np + i] = 0;
        if (json_object_get(f->header, key))
            TRY(check_entry(f, key, param, &offs[np + i], &as[np + i]));
    }
    return CH_OK;
}

static ch_status check_optimizer_kind(const file *f, const ch_optimizer *opt)
{
    json_t *meta = json_object_get(f->header, "__metadata__");
    const char *kind = json_string_value(json_object_get(meta, "optimizer"));
    if (!opt || !kind)
        return CH_OK;
    const char *ours = opt_kind_name(nn_optimizer_kind(opt));
    if (strcmp(kind, ours) != 0)
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s holds %s state, the optimizer "
                         "is %s", f->path, kind, ours);
    return CH_OK;
}

/* The inputs' normalisation, when the file records one: a finite mean and
 * a std > 0, or neither. */
static ch_status check_input(const file *f, ch_idx_options *input)
{
    const char *mean = meta_str(f, "input_mean"), *std = meta_str(f, "input_std");
    if (!mean && !std)
        return CH_OK;
    char *end_mean = NULL, *end_std = NULL;
    input->mean = mean ? strtof(mean, &end_mean) : NAN;
    input->std = std ? strtof(std, &end_std) : NAN;
    if (!mean || !std || end_mean == mean || *end_mean || end_std == std || *end_std ||
        !isfinite(input->mean) || !isfinite(input->std) || !(input->std > 0.0f))
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s: the inputs' normalisation "
                         "is input_mean \"%s\", input_std \"%s\"; expected a number and "
                         "one > 0", f->path, mean ? mean : "(none)", std ? std : "(none)");
    return CH_OK;
}

/* The training state in the metadata (absent keys are 0). */
static ch_status read_state(const file *f, const ch_idx_options *input, ch_train_state *out)
{
    TRY(meta_count(f, "epoch", &out->epoch));
    TRY(meta_count(f, "batch", &out->batch));
    TRY(meta_count(f, "step", &out->step));
    TRY(meta_number(f, "seed", UINT64_MAX, &out->seed));
    out->input_mean = input->mean;
    out->input_std = input->std;
    const char *scale = meta_str(f, "loss_scale");
    char *end = NULL;
    out->loss_scale = scale ? strtof(scale, &end) : 0.0f;
    int64_t clean = 0;
    ch_status st = scale ? meta_count(f, "loss_scale_clean", &clean) : CH_OK;
    out->loss_scale_clean = clean;
    if (st != CH_OK || (scale && (end == scale || *end)) || !(out->loss_scale >= 0.0f) ||
        !isfinite(out->loss_scale))
        return chi_error(CH_ERR_FORMAT, "ch_checkpoint_load: %s: loss_scale \"%s\" with %s "
                         "clean steps, expected a positive number and a count >= 0", f->path,
                         scale, meta_str(f, "loss_scale_clean") ? meta_str(f, "loss_scale_clean")
                                                                 : "0");
    return CH_OK;
}

static ch_status load_all(const file *f, ch_module *model, ch_optimizer *opt,
                          const uint64_t *offs, const ch_dtype *as)
{
    int np = ch_module_param_count(model), ns = opt ? ch_optimizer_state_count(opt) : 0;
    size_t cap = 0;
    for (int i = 0; i < np; i++) {
        ch_tensor *t;
        ch_module_param(model, i, NULL, &t, NULL);
        cap = ch_tensor_nbytes(t) > cap ? ch_tensor_nbytes(t) : cap;
    }
    for (int i = 0; i < ch_module_buffer_count(model); i++) {
        ch_tensor *t;
        ch_module_buffer(model, i, NULL, &t, NULL);
        cap = t && ch_tensor_nbytes(t) > cap ? ch_tensor_nbytes(t) : cap;
    }
    void *buf = malloc(cap ? cap : 1);
    if (!buf)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_checkpoint_load: out of memory");
    ch_status st = CH_OK;
    for (int i = 0; st == CH_OK && i < np; i++) {
        ch_tensor *t;
        ch_module_param(model, i, NULL, &t, NULL);
        st = read_into(f, t, offs[i], as[i], buf);
    }
    int nb = ch_module_buffer_count(model);
    for (int i = 0; st == CH_OK && i < nb; i++) {
        ch_tensor *t;
        int64_t *counter;
        ch_module_buffer(model, i, NULL, &t, &counter);
        st = t ? read_into(f, t, offs[np + i], as[np + i], buf)
               : read_counter(f, counter, offs[np + i]);
    }
    offs += nb;
    as += nb;
    for (int i = 0; st == CH_OK && i < ns; i++) {
        if (offs[np + i] == 0)
            continue;
        ch_tensor *t;
        st = nn_optimizer_state_make(opt, i, &t);
        if (st == CH_OK)
            st = read_into(f, t, offs[np + i], as[np + i], buf);
    }
    free(buf);
    return st;
}

ch_status ch_checkpoint_load(const char *path, ch_module *model, ch_optimizer *opt,
                             ch_train_state *state)
{
    if (!path || !model)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_checkpoint_load: %s is NULL",
                         !path ? "path" : "model");
    if (nn_optimizer_ranged(opt))
        return chi_error(CH_ERR_STATE,
                         "ch_checkpoint_load: the optimizer holds a part of the "
                         "state (ch_dp_options.shard_optimizer); load into a whole one and give "
                         "it to ch_dp_optimizer_set");
    file f = {.path = path};
    int n = ch_module_param_count(model) + ch_module_buffer_count(model) +
            (opt ? ch_optimizer_state_count(opt) : 0);
    uint64_t *offs = calloc((size_t)n + 1, sizeof *offs);
    ch_dtype *as = calloc((size_t)n + 1, sizeof *as);
    ch_status st = offs && as ? open_file(&f)
                              : chi_error(CH_ERR_OUT_OF_MEMORY, "ch_checkpoint_load: out of "
                                          "memory");
    if (st == CH_OK)
        st = check_all(&f, model, opt, offs, as);
    if (st == CH_OK)
        st = check_optimizer_kind(&f, opt);
    ch_idx_options input = {0.0f, 0.0f};
    if (st == CH_OK)
        st = check_input(&f, &input);
    /* The metadata read and checked before anything changes too. */
    int64_t opt_steps = 0;
    ch_train_state loaded = {0};
    if (st == CH_OK && opt)
        st = meta_count(&f, "optimizer_steps", &opt_steps);
    if (st == CH_OK && state)
        st = read_state(&f, &input, &loaded);
    if (st == CH_OK)
        st = load_all(&f, model, opt, offs, as);
    if (st == CH_OK && opt)
        st = ch_optimizer_set_steps(opt, opt_steps);
    if (st == CH_OK && state)
        *state = loaded;
    if (f.f)
        fclose(f.f);
    json_decref(f.header);
    free(offs);
    free(as);
    return st;
}
