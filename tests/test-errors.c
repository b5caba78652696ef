/* Bad arguments to every public function: each gives a status and a message
 * naming the function and the problem, never a crash. Messages follow
 * "<function>: <argument> <problem> (<got>, expected <want>)"; the checks look
 * for the function's name and one key word, not whole sentences.
 *
 * Decisions this file pins down: NaN or infinite hyper-parameters are
 * CH_ERR_INVALID_ARGUMENT; an unknown device name is CH_ERR_NOT_FOUND; a
 * byte count that disagrees with the tensor is CH_ERR_SHAPE, like a reshape
 * to another element count; a window larger than the padded input is
 * CH_ERR_SHAPE, a stride or window of 0 CH_ERR_INVALID_ARGUMENT. */
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* `word` as a whole word of `text`: "a" matches "op(a) has" but not "has". */
static int has_word(const char *text, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
        int left = p == text || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        int right = !(isalnum((unsigned char)p[n]) || p[n] == '_');
        if (left && right)
            return 1;
    }
    return 0;
}

/* One claim: `got` is `want` and the message names `fn` and `word`. */
static int expect(ch_status got, ch_status want, const char *fn, const char *word,
                  const char *what)
{
    const char *err = ch_last_error();
    int ok = got == want && strstr(err, fn) != NULL && (!word || has_word(err, word));
    if (ok)
        return tap_ok(1, "%s: %s -> %s", fn, what, ch_status_str(want));
    return tap_ok(0, "%s: %s: got %s \"%s\", want %s naming \"%s\"%s%s%s", fn, what,
                  ch_status_str(got), err, ch_status_str(want), fn, word ? " and \"" : "",
                  word ? word : "", word ? "\"" : "");
}

/* The error is cleared first so that a stale message cannot pass. */
#define EXPECT(call, want, fn, word, what) \
    (ch_clear_error(), expect((call), (want), (fn), (word), (what)))

static int64_t s1[] = {4}, s2[] = {4, 4}, s3[] = {3, 4}, s4[] = {2, 3, 5, 5};

/* ---- Before ch_init ------------------------------------------------------ */

static void test_before_init(void)
{
    ch_device *d = NULL;
    ch_tensor *t = NULL;
    ch_stream *s = NULL;
    ch_device *list[4];
    ch_backend_info bi;
    ch_hidden_device hd;
    ch_memory_stats ms;
    int n = 0;
    tap_ok(ch_device_count() == 0, "ch_device_count is 0 before ch_init (got %d)",
           ch_device_count());
    tap_ok(ch_backend_count() == 0, "ch_backend_count is 0 before ch_init (got %d)",
           ch_backend_count());
    tap_ok(ch_hidden_device_count() == 0, "ch_hidden_device_count is 0 before ch_init (got %d)",
           ch_hidden_device_count());
    tap_ok(ch_last_error()[0] == '\0', "ch_last_error is \"\" before any failure (got \"%s\")",
           ch_last_error());
    EXPECT(ch_device_get(&d, 0), CH_ERR_STATE, "ch_device_get", "ch_init", "before ch_init");
    EXPECT(ch_device_by_name(&d, "host"), CH_ERR_STATE, "ch_device_by_name", "ch_init",
           "before ch_init");
    EXPECT(ch_device_list_parse(list, 4, &n, "all"), CH_ERR_STATE, "ch_device_list_parse",
           "ch_init", "before ch_init");
    EXPECT(ch_device_list_parse_replicas(list, 4, &n, "host,host"), CH_ERR_STATE,
           "ch_device_list_parse_replicas", "ch_init", "before ch_init");
    EXPECT(ch_backend_get_info(0, &bi), CH_ERR_STATE, "ch_backend_get_info", "ch_init",
           "before ch_init");
    EXPECT(ch_hidden_device_get(0, &hd), CH_ERR_STATE, "ch_hidden_device_get", "ch_init",
           "before ch_init");
    EXPECT(ch_tensor_new(&t, NULL, CH_F32, 1, s1), CH_ERR_STATE, "ch_tensor_new", "ch_init",
           "before ch_init");
    EXPECT(ch_stream_new(&s, NULL), CH_ERR_STATE, "ch_stream_new", "ch_init", "before ch_init");
    EXPECT(ch_device_sync(NULL), CH_ERR_STATE, "ch_device_sync", "ch_init", "before ch_init");
    EXPECT(ch_device_memory_stats(NULL, &ms), CH_ERR_STATE, "ch_device_memory_stats", "ch_init",
           "before ch_init");
    EXPECT(ch_device_reset_peak(NULL), CH_ERR_STATE, "ch_device_reset_peak", "ch_init",
           "before ch_init");
    ch_device_counters dc;
    EXPECT(ch_device_counters_start(NULL, 0), CH_ERR_STATE, "ch_device_counters_start", "ch_init",
           "before ch_init");
    EXPECT(ch_device_counters_read(NULL, &dc), CH_ERR_STATE, "ch_device_counters_read", "ch_init",
           "before ch_init");
    EXPECT(ch_device_set_memory_limit(NULL, 1 << 20), CH_ERR_STATE, "ch_device_set_memory_limit",
           "ch_init", "before ch_init");
    ch_transfer_stats ts;
    EXPECT(ch_device_transfer_stats(NULL, &ts), CH_ERR_STATE, "ch_device_transfer_stats",
           "ch_init", "before ch_init");
    EXPECT(ch_fill(NULL, 1.0), CH_ERR_STATE, "ch_fill", "ch_init", "before ch_init");
    EXPECT(ch_copy(NULL, NULL), CH_ERR_STATE, "ch_copy", "ch_init", "before ch_init");
    EXPECT(ch_gemm(NULL, 0, 0, 1.0f, NULL, NULL, 0.0f), CH_ERR_STATE, "ch_gemm", "ch_init",
           "before ch_init");
    EXPECT(ch_rand_uniform(NULL, 1, 0, 0.0f, 1.0f), CH_ERR_STATE, "ch_rand_uniform", "ch_init",
           "before ch_init");
    EXPECT(ch_add_layernorm(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1e-5f), CH_ERR_STATE,
           "ch_add_layernorm", "ch_init", "before ch_init");
    EXPECT(ch_layernorm_backward_add(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
           CH_ERR_STATE, "ch_layernorm_backward_add", "ch_init", "before ch_init");
}

/* ---- Status strings, the thread-local message, the version --------------- */

static const ch_status all_codes[] = {
    CH_OK, CH_ERR_INVALID_ARGUMENT, CH_ERR_SHAPE, CH_ERR_DTYPE, CH_ERR_DEVICE_MISMATCH,
    CH_ERR_NOT_FOUND, CH_ERR_STATE, CH_ERR_OUT_OF_MEMORY, CH_ERR_DEVICE_OUT_OF_MEMORY,
    CH_ERR_LIMIT, CH_ERR_DRIVER, CH_ERR_UNAVAILABLE, CH_ERR_IO, CH_ERR_FORMAT,
    CH_ERR_UNSUPPORTED, CH_ERR_INTERNAL,
};

static void test_status_strings(void)
{
    for (size_t i = 0; i < ARRAY_LEN(all_codes); i++) {
        const char *s = ch_status_str(all_codes[i]);
        int dup = -1;
        for (size_t j = 0; s && j < ARRAY_LEN(all_codes); j++) {
            const char *o = ch_status_str(all_codes[j]);
            if (j != i && o && strcmp(s, o) == 0)
                dup = (int)all_codes[j];
        }
        tap_ok(s && s[0] && dup < 0, "ch_status_str(%d) is \"%s\", non-empty and unique%s%d",
               (int)all_codes[i], s ? s : "(null)", dup < 0 ? "" : ": same as ", dup);
    }
    const char *unknown = ch_status_str((ch_status)12345);
    tap_ok(unknown && unknown[0], "ch_status_str of an unknown code is \"%s\"",
           unknown ? unknown : "(null)");
}

typedef struct thread_seen {
    char before[256]; /* the thread's message before it failed itself */
    char after[256];
} thread_seen;

static void *fail_in_thread(void *arg)
{
    thread_seen *seen = arg;
    ch_device *d;
    snprintf(seen->before, sizeof seen->before, "%s", ch_last_error());
    ch_device_by_name(&d, "opencl:77");
    snprintf(seen->after, sizeof seen->after, "%s", ch_last_error());
    return NULL;
}

static void test_thread_local_error(void)
{
    ch_device *d;
    thread_seen seen = {{0}, {0}};
    pthread_t th;
    ch_device_by_name(&d, "cuda:98");
    if (pthread_create(&th, NULL, fail_in_thread, &seen) != 0) {
        tap_ok(0, "pthread_create failed: cannot check ch_last_error is thread-local");
        return;
    }
    pthread_join(th, NULL);
    tap_ok(seen.before[0] == '\0',
           "ch_last_error is thread-local: a new thread sees \"\" (got \"%s\")", seen.before);
    tap_ok(strstr(seen.after, "opencl:77") != NULL,
           "ch_last_error: the thread sees its own failure (got \"%s\")", seen.after);
    tap_ok(strstr(ch_last_error(), "cuda:98") != NULL,
           "ch_last_error: the main thread keeps its message (got \"%s\")", ch_last_error());
    ch_clear_error();
    tap_ok(ch_last_error()[0] == '\0', "ch_clear_error empties the message (got \"%s\")",
           ch_last_error());
}

static void test_version(void)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", CHORUS_VERSION_MAJOR, CHORUS_VERSION_MINOR,
             CHORUS_VERSION_PATCH);
    const char *v = ch_version();
    tap_ok(v && strcmp(v, want) == 0, "ch_version is \"%s\", want \"%s\"", v ? v : "(null)",
           want);
}

/* ---- Devices and backends ------------------------------------------------ */

static void test_device_names(void)
{
    static const char *unknown[] = {"cuda:99", "gpu", "opencl:", "", "HOST", "host ", "cuda:-1"};
    ch_device *d = NULL;
    char what[64], word[64];
    EXPECT(ch_device_by_name(NULL, "host"), CH_ERR_INVALID_ARGUMENT, "ch_device_by_name", "out",
           "out NULL");
    EXPECT(ch_device_by_name(&d, NULL), CH_ERR_INVALID_ARGUMENT, "ch_device_by_name", "name",
           "name NULL");
    for (size_t i = 0; i < ARRAY_LEN(unknown); i++) {
        snprintf(what, sizeof what, "unknown name \"%s\"", unknown[i]);
        snprintf(word, sizeof word, "\"%s\"", unknown[i]);
        ch_clear_error();
        ch_status st = ch_device_by_name(&d, unknown[i]);
        int named = strstr(ch_last_error(), word) != NULL;
        expect(st, CH_ERR_NOT_FOUND, "ch_device_by_name", NULL, what);
        tap_ok(named, "ch_device_by_name: the message quotes %s (got \"%s\")", word,
               ch_last_error());
    }
    EXPECT(ch_device_get(NULL, 0), CH_ERR_INVALID_ARGUMENT, "ch_device_get", "out", "out NULL");
    EXPECT(ch_device_get(&d, -1), CH_ERR_NOT_FOUND, "ch_device_get", "index", "index -1");
    EXPECT(ch_device_get(&d, ch_device_count()), CH_ERR_NOT_FOUND, "ch_device_get", "index",
           "index = count");
}

static void test_device_lists(void)
{
    ch_device *list[8];
    int n = -1;
    EXPECT(ch_device_list_parse(NULL, 8, &n, "host"), CH_ERR_INVALID_ARGUMENT,
           "ch_device_list_parse", "out", "out NULL");
    EXPECT(ch_device_list_parse(list, 8, NULL, "host"), CH_ERR_INVALID_ARGUMENT,
           "ch_device_list_parse", "n", "n NULL");
    EXPECT(ch_device_list_parse(list, 8, &n, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_device_list_parse", "list", "list NULL");
    EXPECT(ch_device_list_parse(list, 8, &n, ""), CH_ERR_INVALID_ARGUMENT,
           "ch_device_list_parse", "empty", "empty list");
    EXPECT(ch_device_list_parse(list, 8, &n, "host,,host"), CH_ERR_INVALID_ARGUMENT,
           "ch_device_list_parse", "empty", "empty name between commas");
    EXPECT(ch_device_list_parse(list, 8, &n, "host,host"), CH_ERR_INVALID_ARGUMENT,
           "ch_device_list_parse", "host", "\"host,host\" (duplicate)");
    EXPECT(ch_device_list_parse(list, 8, &n, "host,cuda:99"), CH_ERR_NOT_FOUND,
           "ch_device_list_parse", "cuda:99", "\"host,cuda:99\" (unknown)");
    EXPECT(ch_device_list_parse(list, 8, &n, "gpu"), CH_ERR_NOT_FOUND, "ch_device_list_parse",
           "gpu", "\"gpu\" (unknown)");
    EXPECT(ch_device_list_parse(list, 0, &n, "host"), CH_ERR_INVALID_ARGUMENT,
           "ch_device_list_parse", "capacity", "capacity 0");
    tap_ok(n == 0, "ch_device_list_parse: n is 0 after a failure (got %d)", n);
    EXPECT(ch_device_list_parse_replicas(NULL, 8, &n, "host"), CH_ERR_INVALID_ARGUMENT,
           "ch_device_list_parse_replicas", "out", "out NULL");
    EXPECT(ch_device_list_parse_replicas(list, 8, &n, "host,,host"), CH_ERR_INVALID_ARGUMENT,
           "ch_device_list_parse_replicas", "empty", "empty name between commas");
    EXPECT(ch_device_list_parse_replicas(list, 2, &n, "host,host,host"), CH_ERR_LIMIT,
           "ch_device_list_parse_replicas", "capacity 2", "three replicas, capacity 2");
    EXPECT(ch_device_list_parse_replicas(list, 8, &n, "host,cuda:99"), CH_ERR_NOT_FOUND,
           "ch_device_list_parse_replicas", "cuda:99", "\"host,cuda:99\" (unknown)");
    tap_ok(n == 0, "ch_device_list_parse_replicas: n is 0 after a failure (got %d)", n);
    ch_status st = ch_device_list_parse(list, 8, &n, "host");
    tap_ok(st == CH_OK && n == 1 && strcmp(ch_device_id(list[0]), "host") == 0,
           "ch_device_list_parse(\"host\") gives host alone (status %s, n %d)",
           ch_status_str(st), n);
}

static void test_device_queries(ch_device *host)
{
    ch_device_info info;
    ch_memory_stats ms;
    ch_backend_info bi;
    ch_hidden_device hd;
    uint64_t fb, tb;
    EXPECT(ch_device_get_info(NULL, &info), CH_ERR_INVALID_ARGUMENT, "ch_device_get_info", "dev",
           "dev NULL");
    EXPECT(ch_device_get_info(host, NULL), CH_ERR_INVALID_ARGUMENT, "ch_device_get_info",
           "info", "info NULL");
    EXPECT(ch_device_memory(NULL, &fb, &tb), CH_ERR_INVALID_ARGUMENT, "ch_device_memory", "dev",
           "dev NULL");
    EXPECT(ch_device_memory(host, NULL, &tb), CH_ERR_INVALID_ARGUMENT, "ch_device_memory",
           "free_bytes", "free_bytes NULL");
    EXPECT(ch_device_memory(host, &fb, NULL), CH_ERR_INVALID_ARGUMENT, "ch_device_memory",
           "total_bytes", "total_bytes NULL");
    EXPECT(ch_device_sync(NULL), CH_ERR_INVALID_ARGUMENT, "ch_device_sync", "dev", "dev NULL");
    EXPECT(ch_device_memory_stats(NULL, &ms), CH_ERR_INVALID_ARGUMENT, "ch_device_memory_stats",
           "dev", "dev NULL");
    EXPECT(ch_device_memory_stats(host, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_device_memory_stats", "stats", "stats NULL");
    EXPECT(ch_device_reset_peak(NULL), CH_ERR_INVALID_ARGUMENT, "ch_device_reset_peak", "dev",
           "dev NULL");
    ch_device_counters dc;
    EXPECT(ch_device_counters_start(NULL, 1), CH_ERR_INVALID_ARGUMENT, "ch_device_counters_start",
           "dev", "dev NULL");
    EXPECT(ch_device_counters_read(NULL, &dc), CH_ERR_INVALID_ARGUMENT, "ch_device_counters_read",
           "dev", "dev NULL");
    EXPECT(ch_device_counters_read(host, NULL), CH_ERR_INVALID_ARGUMENT, "ch_device_counters_read",
           "out", "out NULL");
    /* The host counts nothing: said, not zeros. */
    EXPECT(ch_device_counters_start(host, 0), CH_ERR_UNSUPPORTED, "ch_device_counters_start",
           "does not count", "on the host");
    EXPECT(ch_device_counters_read(host, &dc), CH_ERR_UNSUPPORTED, "ch_device_counters_read",
           "does not count", "on the host");
    EXPECT(ch_device_set_memory_limit(NULL, 1 << 20), CH_ERR_INVALID_ARGUMENT,
           "ch_device_set_memory_limit", "dev", "dev NULL");
    ch_transfer_stats ts;
    EXPECT(ch_device_transfer_stats(NULL, &ts), CH_ERR_INVALID_ARGUMENT,
           "ch_device_transfer_stats", "dev", "dev NULL");
    EXPECT(ch_device_transfer_stats(host, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_device_transfer_stats", "stats", "stats NULL");
    EXPECT(ch_device_empty_cache(NULL), CH_ERR_INVALID_ARGUMENT, "ch_device_empty_cache", "dev",
           "dev NULL");
    EXPECT(ch_backend_get_info(0, NULL), CH_ERR_INVALID_ARGUMENT, "ch_backend_get_info", "info",
           "info NULL");
    EXPECT(ch_backend_get_info(-1, &bi), CH_ERR_INVALID_ARGUMENT, "ch_backend_get_info", "index",
           "index -1");
    EXPECT(ch_backend_get_info(ch_backend_count(), &bi), CH_ERR_INVALID_ARGUMENT,
           "ch_backend_get_info", "index", "index = count");
    EXPECT(ch_hidden_device_get(0, NULL), CH_ERR_INVALID_ARGUMENT, "ch_hidden_device_get", "out",
           "out NULL");
    EXPECT(ch_hidden_device_get(-1, &hd), CH_ERR_INVALID_ARGUMENT, "ch_hidden_device_get",
           "index", "index -1");
    EXPECT(ch_hidden_device_get(ch_hidden_device_count(), &hd), CH_ERR_INVALID_ARGUMENT,
           "ch_hidden_device_get", "index", "index = count");
    tap_ok(ch_device_id(NULL) != NULL, "ch_device_id(NULL) does not crash and is not NULL");
    tap_ok(ch_device_can_peer(NULL, host) == 0 && ch_device_can_peer(host, NULL) == 0,
           "ch_device_can_peer with a NULL device is 0");
}

/* ---- Streams, events, host buffers --------------------------------------- */

static void test_streams(ch_device *host)
{
    ch_stream *s = NULL, *def = NULL;
    ch_event *e = NULL, *e2 = NULL;
    ch_host_buffer *hb = NULL;
    if (!tap_status_ok(ch_device_default_stream(&def, host), "ch_device_default_stream(host)") ||
        !tap_status_ok(ch_event_new(&e, host), "ch_event_new(host)"))
        return;
    EXPECT(ch_stream_new(NULL, host), CH_ERR_INVALID_ARGUMENT, "ch_stream_new", "out",
           "out NULL");
    EXPECT(ch_stream_new(&s, NULL), CH_ERR_INVALID_ARGUMENT, "ch_stream_new", "dev", "dev NULL");
    EXPECT(ch_stream_sync(NULL), CH_ERR_INVALID_ARGUMENT, "ch_stream_sync", "stream",
           "stream NULL");
    EXPECT(ch_device_default_stream(NULL, host), CH_ERR_INVALID_ARGUMENT,
           "ch_device_default_stream", "out", "out NULL");
    EXPECT(ch_device_default_stream(&s, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_device_default_stream", "dev", "dev NULL");
    EXPECT(ch_stream_set_current(NULL), CH_ERR_INVALID_ARGUMENT, "ch_stream_set_current",
           "stream", "stream NULL");
    EXPECT(ch_stream_reset_current(NULL), CH_ERR_INVALID_ARGUMENT, "ch_stream_reset_current",
           "dev", "dev NULL");
    EXPECT(ch_stream_get_current(NULL, host), CH_ERR_INVALID_ARGUMENT, "ch_stream_get_current",
           "out", "out NULL");
    EXPECT(ch_stream_get_current(&s, NULL), CH_ERR_INVALID_ARGUMENT, "ch_stream_get_current",
           "dev", "dev NULL");
    EXPECT(ch_event_new(NULL, host), CH_ERR_INVALID_ARGUMENT, "ch_event_new", "out", "out NULL");
    EXPECT(ch_event_new(&e2, NULL), CH_ERR_INVALID_ARGUMENT, "ch_event_new", "dev", "dev NULL");
    EXPECT(ch_event_record(NULL, def), CH_ERR_INVALID_ARGUMENT, "ch_event_record", "event",
           "event NULL");
    EXPECT(ch_event_record(e, NULL), CH_ERR_INVALID_ARGUMENT, "ch_event_record", "stream",
           "stream NULL");
    EXPECT(ch_event_wait(NULL, e), CH_ERR_INVALID_ARGUMENT, "ch_event_wait", "stream",
           "stream NULL");
    EXPECT(ch_event_wait(def, NULL), CH_ERR_INVALID_ARGUMENT, "ch_event_wait", "event",
           "event NULL");
    EXPECT(ch_event_sync(NULL), CH_ERR_INVALID_ARGUMENT, "ch_event_sync", "event", "event NULL");
    EXPECT(ch_host_buffer_new(NULL, host, 64), CH_ERR_INVALID_ARGUMENT, "ch_host_buffer_new",
           "out", "out NULL");
    EXPECT(ch_host_buffer_new(&hb, NULL, 64), CH_ERR_INVALID_ARGUMENT, "ch_host_buffer_new",
           "dev", "dev NULL");
    EXPECT(ch_host_buffer_new(&hb, host, 0), CH_ERR_INVALID_ARGUMENT, "ch_host_buffer_new",
           "bytes", "bytes 0");
    tap_ok(ch_stream_device(NULL) == NULL, "ch_stream_device(NULL) is NULL");
    tap_ok(ch_host_buffer_data(NULL) == NULL, "ch_host_buffer_data(NULL) is NULL");
    tap_ok(ch_host_buffer_size(NULL) == 0, "ch_host_buffer_size(NULL) is 0");
    ch_event_free(e);
}

static void test_free_null(void)
{
    ch_tensor_free(NULL);
    ch_stream_free(NULL);
    ch_event_free(NULL);
    ch_host_buffer_free(NULL);
    tap_ok(1, "ch_tensor_free, ch_stream_free, ch_event_free, ch_host_buffer_free of NULL "
              "are no-ops");
}

/* ---- Tensors -------------------------------------------------------------- */

static void test_tensor_new(ch_device *host)
{
    ch_tensor *t = NULL;
    int64_t zero[] = {3, 0}, negative[] = {-2}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int64_t overflow[] = {INT64_MAX / 2, 4}, huge[] = {(int64_t)1 << 40};
    EXPECT(ch_tensor_new(NULL, host, CH_F32, 1, s1), CH_ERR_INVALID_ARGUMENT, "ch_tensor_new",
           "out", "out NULL");
    EXPECT(ch_tensor_new(&t, NULL, CH_F32, 1, s1), CH_ERR_INVALID_ARGUMENT, "ch_tensor_new",
           "dev", "dev NULL");
    EXPECT(ch_tensor_new(&t, host, CH_F32, 1, NULL), CH_ERR_INVALID_ARGUMENT, "ch_tensor_new",
           "shape", "shape NULL");
    EXPECT(ch_tensor_new(&t, host, CH_F32, 0, s1), CH_ERR_INVALID_ARGUMENT, "ch_tensor_new",
           "ndim", "ndim 0");
    EXPECT(ch_tensor_new(&t, host, CH_F32, 9, nine), CH_ERR_INVALID_ARGUMENT, "ch_tensor_new",
           "ndim", "ndim 9");
    EXPECT(ch_tensor_new(&t, host, CH_F32, -1, s1), CH_ERR_INVALID_ARGUMENT, "ch_tensor_new",
           "ndim", "ndim -1");
    EXPECT(ch_tensor_new(&t, host, CH_F32, 2, zero), CH_ERR_INVALID_ARGUMENT, "ch_tensor_new",
           "shape", "a dimension of 0 (zero-size)");
    EXPECT(ch_tensor_new(&t, host, CH_F32, 1, negative), CH_ERR_INVALID_ARGUMENT,
           "ch_tensor_new", "shape", "a negative dimension");
    EXPECT(ch_tensor_new(&t, host, CH_F32, 2, overflow), CH_ERR_INVALID_ARGUMENT,
           "ch_tensor_new", "overflows", "a size that overflows");
    EXPECT(ch_tensor_new(&t, host, (ch_dtype)99, 1, s1), CH_ERR_DTYPE, "ch_tensor_new", "dtype",
           "dtype 99");
    ch_clear_error();
    ch_status st = ch_tensor_new(&t, host, CH_F32, 1, huge);
    tap_ok(st == CH_ERR_LIMIT || st == CH_ERR_DEVICE_OUT_OF_MEMORY || st == CH_ERR_OUT_OF_MEMORY,
           "ch_tensor_new: 4 TiB on host -> a memory status (got %s \"%s\")", ch_status_str(st),
           ch_last_error());
    if (st == CH_OK)
        ch_tensor_free(t);
    tap_ok(ch_dtype_size((ch_dtype)99) == 0, "ch_dtype_size of an unknown dtype is 0 (got %zu)",
           ch_dtype_size((ch_dtype)99));
    tap_ok(ch_dtype_size(CH_F32) == 4 && ch_dtype_size(CH_I32) == 4,
           "ch_dtype_size of f32 and i32 is 4");
    tap_ok(ch_dtype_name((ch_dtype)99) != NULL, "ch_dtype_name of an unknown dtype is not NULL");
}

static void test_tensor_access(ch_tensor *t)
{
    tap_ok(ch_tensor_device(NULL) == NULL, "ch_tensor_device(NULL) is NULL");
    tap_ok(ch_tensor_ndim(NULL) == 0, "ch_tensor_ndim(NULL) is 0");
    tap_ok(ch_tensor_numel(NULL) == 0, "ch_tensor_numel(NULL) is 0");
    tap_ok(ch_tensor_nbytes(NULL) == 0, "ch_tensor_nbytes(NULL) is 0");
    tap_ok(ch_tensor_dim(NULL, 0) == 0, "ch_tensor_dim(NULL, 0) is 0");
    tap_ok(ch_tensor_dim(t, 2) == 0 && ch_tensor_dim(t, -3) == 0,
           "ch_tensor_dim out of range is 0 (got %lld and %lld)", (long long)ch_tensor_dim(t, 2),
           (long long)ch_tensor_dim(t, -3));
    tap_ok(ch_tensor_dim(t, -1) == 4, "ch_tensor_dim(t, -1) is the last dimension (got %lld)",
           (long long)ch_tensor_dim(t, -1));
}

static void test_tensor_transfers(ch_device *host, ch_tensor *t)
{
    float buf[16] = {0};
    ch_tensor *o = NULL;
    ch_host_buffer *hb = NULL;
    EXPECT(ch_tensor_upload(NULL, buf, sizeof buf), CH_ERR_INVALID_ARGUMENT, "ch_tensor_upload",
           "t", "t NULL");
    EXPECT(ch_tensor_upload(t, NULL, sizeof buf), CH_ERR_INVALID_ARGUMENT, "ch_tensor_upload",
           "src", "src NULL");
    EXPECT(ch_tensor_upload(t, buf, sizeof buf - 4), CH_ERR_SHAPE, "ch_tensor_upload", "bytes",
           "bytes one float short");
    EXPECT(ch_tensor_upload(t, buf, sizeof buf + 4), CH_ERR_SHAPE, "ch_tensor_upload", "bytes",
           "bytes one float long");
    EXPECT(ch_tensor_download(NULL, buf, sizeof buf), CH_ERR_INVALID_ARGUMENT,
           "ch_tensor_download", "t", "t NULL");
    EXPECT(ch_tensor_download(t, NULL, sizeof buf), CH_ERR_INVALID_ARGUMENT,
           "ch_tensor_download", "dst", "dst NULL");
    EXPECT(ch_tensor_download(t, buf, 0), CH_ERR_SHAPE, "ch_tensor_download", "bytes",
           "bytes 0");
    if (tap_status_ok(ch_host_buffer_new(&hb, host, 80), "ch_host_buffer_new(host, 80)")) {
        EXPECT(ch_tensor_upload_async(NULL, hb, 0), CH_ERR_INVALID_ARGUMENT,
               "ch_tensor_upload_async", "t", "t NULL");
        EXPECT(ch_tensor_upload_async(t, NULL, 0), CH_ERR_INVALID_ARGUMENT,
               "ch_tensor_upload_async", "src", "src NULL");
        EXPECT(ch_tensor_upload_async(t, hb, 32), CH_ERR_INVALID_ARGUMENT,
               "ch_tensor_upload_async", "src", "offset past the end of the buffer");
        EXPECT(ch_tensor_download_async(NULL, hb, 0), CH_ERR_INVALID_ARGUMENT,
               "ch_tensor_download_async", "t", "t NULL");
        EXPECT(ch_tensor_download_async(t, NULL, 0), CH_ERR_INVALID_ARGUMENT,
               "ch_tensor_download_async", "dst", "dst NULL");
        EXPECT(ch_tensor_download_async(t, hb, 17), CH_ERR_INVALID_ARGUMENT,
               "ch_tensor_download_async", "dst", "offset past the end of the buffer");
        ch_host_buffer_free(hb);
    }
    EXPECT(ch_tensor_to(NULL, t, host), CH_ERR_INVALID_ARGUMENT, "ch_tensor_to", "out",
           "out NULL");
    EXPECT(ch_tensor_to(&o, NULL, host), CH_ERR_INVALID_ARGUMENT, "ch_tensor_to", "src",
           "src NULL");
    EXPECT(ch_tensor_to(&o, t, NULL), CH_ERR_INVALID_ARGUMENT, "ch_tensor_to", "dev",
           "dev NULL");
}

static void test_tensor_views(ch_tensor *t)
{
    ch_tensor *v = NULL;
    int64_t other[] = {5, 3}, same[] = {2, 8}, bad[] = {16, -1}, nine[9] = {1};
    EXPECT(ch_tensor_view(NULL, t, 0, 1), CH_ERR_INVALID_ARGUMENT, "ch_tensor_view", "out",
           "out NULL");
    EXPECT(ch_tensor_view(&v, NULL, 0, 1), CH_ERR_INVALID_ARGUMENT, "ch_tensor_view", "src",
           "src NULL");
    EXPECT(ch_tensor_view(&v, t, -1, 2), CH_ERR_INVALID_ARGUMENT, "ch_tensor_view", "range",
           "start -1");
    EXPECT(ch_tensor_view(&v, t, 0, 0), CH_ERR_INVALID_ARGUMENT, "ch_tensor_view", "range",
           "count 0");
    EXPECT(ch_tensor_view(&v, t, 2, 3), CH_ERR_INVALID_ARGUMENT, "ch_tensor_view", "range",
           "rows [2, 5) of 4");
    EXPECT(ch_tensor_view(&v, t, INT64_MAX, 2), CH_ERR_INVALID_ARGUMENT, "ch_tensor_view",
           "range", "start near INT64_MAX");
    EXPECT(ch_tensor_reshape(NULL, t, 2, same), CH_ERR_INVALID_ARGUMENT, "ch_tensor_reshape",
           "out", "out NULL");
    EXPECT(ch_tensor_reshape(&v, NULL, 2, same), CH_ERR_INVALID_ARGUMENT, "ch_tensor_reshape",
           "src", "src NULL");
    EXPECT(ch_tensor_reshape(&v, t, 2, other), CH_ERR_SHAPE, "ch_tensor_reshape", "elements",
           "16 elements to [5, 3]");
    EXPECT(ch_tensor_reshape(&v, t, 2, bad), CH_ERR_INVALID_ARGUMENT, "ch_tensor_reshape",
           "shape", "a negative dimension");
    EXPECT(ch_tensor_reshape(&v, t, 0, same), CH_ERR_INVALID_ARGUMENT, "ch_tensor_reshape",
           "ndim", "ndim 0");
    EXPECT(ch_tensor_reshape(&v, t, 9, nine), CH_ERR_INVALID_ARGUMENT, "ch_tensor_reshape",
           "ndim", "ndim 9");
}

/* ---- Ops ------------------------------------------------------------------ */

/* The tensors the op checks use, all on one device. */
typedef struct op_args {
    ch_tensor *f4;    /* f32 [4, 4] */
    ch_tensor *g4;    /* f32 [4, 4] */
    ch_tensor *h4;    /* f32 [4, 4] */
    ch_tensor *k4;    /* f32 [4, 4] */
    ch_tensor *f34;   /* f32 [3, 4] */
    ch_tensor *f1;    /* f32 [1] */
    ch_tensor *i4;    /* i32 [4, 4] */
    ch_tensor *l4;    /* i32 [4] labels */
    ch_tensor *l3;    /* i32 [3] */
    ch_tensor *v4;    /* f32 [4] */
    ch_tensor *x4d;   /* f32 [2, 3, 5, 5] */
    ch_tensor *row0;  /* rows [0, 3) of f4 */
    ch_tensor *row1;  /* rows [1, 4) of f4 */
} op_args;

static ch_status new_tensor(ch_tensor **t, ch_device *dev, ch_dtype dt, int ndim,
                            const int64_t *shape)
{
    ch_status st = ch_tensor_new(t, dev, dt, ndim, shape);
    if (st == CH_OK)
        st = dt == CH_F32 || dt == CH_I32 ? ch_fill(*t, 0.0) : CH_OK;
    return st;
}

static int op_args_new(op_args *a, ch_device *dev)
{
    int64_t one[] = {1}, three[] = {3};
    memset(a, 0, sizeof *a);
    ch_status st = new_tensor(&a->f4, dev, CH_F32, 2, s2);
    if (st == CH_OK) st = new_tensor(&a->g4, dev, CH_F32, 2, s2);
    if (st == CH_OK) st = new_tensor(&a->h4, dev, CH_F32, 2, s2);
    if (st == CH_OK) st = new_tensor(&a->k4, dev, CH_F32, 2, s2);
    if (st == CH_OK) st = new_tensor(&a->f34, dev, CH_F32, 2, s3);
    if (st == CH_OK) st = new_tensor(&a->f1, dev, CH_F32, 1, one);
    if (st == CH_OK) st = new_tensor(&a->i4, dev, CH_I32, 2, s2);
    if (st == CH_OK) st = new_tensor(&a->l4, dev, CH_I32, 1, s1);
    if (st == CH_OK) st = new_tensor(&a->l3, dev, CH_I32, 1, three);
    if (st == CH_OK) st = new_tensor(&a->v4, dev, CH_F32, 1, s1);
    if (st == CH_OK) st = new_tensor(&a->x4d, dev, CH_F32, 4, s4);
    if (st == CH_OK) st = ch_tensor_view(&a->row0, a->f4, 0, 3);
    if (st == CH_OK) st = ch_tensor_view(&a->row1, a->f4, 1, 3);
    return tap_status_ok(st, "tensors for the op checks on %s", ch_device_id(dev));
}

static void op_args_free(op_args *a)
{
    ch_tensor *all[] = {a->row0, a->row1, a->f4, a->g4, a->h4, a->k4, a->f34,
                        a->f1, a->i4, a->l4, a->l3, a->v4, a->x4d};
    for (size_t i = 0; i < ARRAY_LEN(all); i++)
        ch_tensor_free(all[i]);
}

static void test_data_ops(const op_args *a)
{
    EXPECT(ch_fill(NULL, 1.0), CH_ERR_INVALID_ARGUMENT, "ch_fill", "y", "y NULL");
    EXPECT(ch_fill(a->i4, 0.5), CH_ERR_INVALID_ARGUMENT, "ch_fill", "value",
           "0.5 into an i32 tensor");
    EXPECT(ch_fill(a->i4, 3e9), CH_ERR_INVALID_ARGUMENT, "ch_fill", "value",
           "3e9 into an i32 tensor");
    EXPECT(ch_copy(NULL, a->f4), CH_ERR_INVALID_ARGUMENT, "ch_copy", "y", "y NULL");
    EXPECT(ch_copy(a->f4, NULL), CH_ERR_INVALID_ARGUMENT, "ch_copy", "x", "x NULL");
    EXPECT(ch_copy(a->f4, a->i4), CH_ERR_DTYPE, "ch_copy", "x", "f32 <- i32");
    EXPECT(ch_copy(a->f4, a->f34), CH_ERR_SHAPE, "ch_copy", "x", "16 <- 12 elements");
    EXPECT(ch_copy(a->row0, a->row1), CH_ERR_INVALID_ARGUMENT, "ch_copy", "overlaps",
           "overlapping views");
    EXPECT(ch_transpose01(NULL, a->f4), CH_ERR_INVALID_ARGUMENT, "ch_transpose01", "y",
           "y NULL");
    EXPECT(ch_transpose01(a->f4, NULL), CH_ERR_INVALID_ARGUMENT, "ch_transpose01", "x",
           "x NULL");
    EXPECT(ch_transpose01(a->v4, a->v4), CH_ERR_SHAPE, "ch_transpose01", "x", "1-D x");
    EXPECT(ch_transpose01(a->f34, a->f34), CH_ERR_SHAPE, "ch_transpose01", "y",
           "y [3,4] for x [3,4]");
    EXPECT(ch_transpose01(a->f4, a->f4), CH_ERR_INVALID_ARGUMENT, "ch_transpose01", "y",
           "y is x");
    EXPECT(ch_transpose01(a->f4, a->i4), CH_ERR_DTYPE, "ch_transpose01", "x", "f32 <- i32");
}

static void test_gemm_args(const op_args *a)
{
    EXPECT(ch_gemm(NULL, 0, 0, 1.0f, a->f4, a->g4, 0.0f), CH_ERR_INVALID_ARGUMENT, "ch_gemm",
           "c", "c NULL");
    EXPECT(ch_gemm(a->f4, 0, 0, 1.0f, NULL, a->g4, 0.0f), CH_ERR_INVALID_ARGUMENT, "ch_gemm",
           "a", "a NULL");
    EXPECT(ch_gemm(a->f4, 0, 0, 1.0f, a->g4, NULL, 0.0f), CH_ERR_INVALID_ARGUMENT, "ch_gemm",
           "b", "b NULL");
    EXPECT(ch_gemm(a->f34, 0, 0, 1.0f, a->f34, a->f34, 0.0f), CH_ERR_SHAPE, "ch_gemm", "b",
           "a [3,4] @ b [3,4]");
    EXPECT(ch_gemm(a->f34, 0, 0, 1.0f, a->f4, a->g4, 0.0f), CH_ERR_SHAPE, "ch_gemm", "c",
           "c [3,4] for [4,4] @ [4,4]");
    EXPECT(ch_gemm(a->f4, 0, 0, 1.0f, a->v4, a->g4, 0.0f), CH_ERR_SHAPE, "ch_gemm", "a",
           "1-D a");
    EXPECT(ch_gemm(a->f4, 0, 0, 1.0f, a->x4d, a->g4, 0.0f), CH_ERR_SHAPE, "ch_gemm", "a",
           "4-D a");
    EXPECT(ch_gemm(a->f4, 0, 0, 1.0f, a->i4, a->g4, 0.0f), CH_ERR_DTYPE, "ch_gemm", "a",
           "i32 a");
    EXPECT(ch_gemm(a->f4, 0, 0, NAN, a->f4, a->g4, 0.0f), CH_ERR_INVALID_ARGUMENT, "ch_gemm",
           "alpha", "alpha NaN");
    EXPECT(ch_gemm(a->f4, 0, 0, 1.0f, a->g4, a->g4, INFINITY), CH_ERR_INVALID_ARGUMENT,
           "ch_gemm", "beta", "beta infinite");
    EXPECT(ch_gemm(a->f4, 0, 0, 1.0f, a->f4, a->g4, 0.0f), CH_ERR_INVALID_ARGUMENT, "ch_gemm",
           "c", "c is a");
    EXPECT(ch_gemm_bias(NULL, 0, 0, 1.0f, a->f4, a->g4, a->v4), CH_ERR_INVALID_ARGUMENT,
           "ch_gemm_bias", "c", "ch_gemm_bias: c NULL");
    EXPECT(ch_gemm_bias(a->f4, 0, 0, 1.0f, a->g4, a->h4, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_gemm_bias", "bias", "ch_gemm_bias: bias NULL");
    EXPECT(ch_gemm_bias(a->f4, 0, 0, 1.0f, a->g4, a->h4, a->l4), CH_ERR_DTYPE, "ch_gemm_bias",
           "bias", "ch_gemm_bias: i32 bias");
    EXPECT(ch_gemm_bias(a->f4, 0, 0, 1.0f, a->g4, a->h4, a->f1), CH_ERR_SHAPE, "ch_gemm_bias",
           "bias has 1 dimensions (1, ...), expected [4]", "ch_gemm_bias: bias [1] for 4 columns");
    EXPECT(ch_gemm_bias(a->f4, 0, 0, 1.0f, a->g4, a->h4, a->g4), CH_ERR_SHAPE, "ch_gemm_bias",
           "bias has 2 dimensions", "ch_gemm_bias: 2-D bias");
    EXPECT(ch_gemm_bias(a->f34, 0, 0, 1.0f, a->f4, a->g4, a->v4), CH_ERR_SHAPE, "ch_gemm_bias", "c",
           "ch_gemm_bias: c [3,4] for [4,4] @ [4,4]");
    EXPECT(ch_gemm_bias(a->f4, 0, 0, INFINITY, a->g4, a->h4, a->v4), CH_ERR_INVALID_ARGUMENT,
           "ch_gemm_bias", "alpha", "ch_gemm_bias: alpha infinite");
    EXPECT(ch_gemm_bias(a->row0, 0, 0, 1.0f, a->f34, a->g4, a->row1), CH_ERR_SHAPE, "ch_gemm_bias",
           "bias", "ch_gemm_bias: a view of 2-D rows as the bias");
    EXPECT(ch_gemm_bias(a->f4, 0, 0, 1.0f, a->g4, a->h4, a->row0), CH_ERR_SHAPE, "ch_gemm_bias",
           "bias", "ch_gemm_bias: bias [3, 4]");
    /* a bias in c's memory: the first 4 of f4's 16 floats */
    int64_t all = 16;
    ch_tensor *flat = NULL, *head = NULL;
    ch_status st = ch_tensor_reshape(&flat, a->f4, 1, &all);
    if (st == CH_OK)
        st = ch_tensor_view(&head, flat, 0, 4);
    if (tap_status_ok(st, "a 1-D view of f4's first row"))
        EXPECT(ch_gemm_bias(a->f4, 0, 0, 1.0f, a->g4, a->h4, head), CH_ERR_INVALID_ARGUMENT,
               "ch_gemm_bias", "overlaps", "ch_gemm_bias: bias in c's memory");
    ch_tensor_free(head);
    ch_tensor_free(flat);
}

/* ch_gemm_bias_act: ch_gemm_bias's checks, then act's, then pre's. */
static void test_gemm_bias_act_args(const op_args *a)
{
    EXPECT(ch_gemm_bias_act(NULL, NULL, 0, 0, 1.0f, a->f4, a->g4, a->v4, CH_ACT_GELU_TANH),
           CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "c", "ch_gemm_bias_act: c NULL");
    EXPECT(ch_gemm_bias_act(a->f4, NULL, 0, 0, 1.0f, a->g4, a->h4, NULL, CH_ACT_RELU),
           CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "bias", "ch_gemm_bias_act: bias NULL");
    EXPECT(ch_gemm_bias_act(a->f4, NULL, 0, 0, 1.0f, a->g4, a->h4, a->l4, CH_ACT_RELU),
           CH_ERR_DTYPE, "ch_gemm_bias_act", "bias", "ch_gemm_bias_act: i32 bias");
    EXPECT(ch_gemm_bias_act(a->f4, NULL, 0, 0, 1.0f, a->g4, a->h4, a->f1, CH_ACT_RELU),
           CH_ERR_SHAPE, "ch_gemm_bias_act", "bias", "ch_gemm_bias_act: bias [1] for 4 columns");
    EXPECT(ch_gemm_bias_act(a->f34, NULL, 0, 0, 1.0f, a->f4, a->g4, a->v4, CH_ACT_RELU),
           CH_ERR_SHAPE, "ch_gemm_bias_act", "c", "ch_gemm_bias_act: c [3,4] for [4,4] @ [4,4]");
    EXPECT(ch_gemm_bias_act(a->f4, NULL, 0, 0, NAN, a->g4, a->h4, a->v4, CH_ACT_RELU),
           CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "alpha", "ch_gemm_bias_act: alpha NaN");
    EXPECT(ch_gemm_bias_act(a->f4, NULL, 0, 0, 1.0f, a->f4, a->h4, a->v4, CH_ACT_RELU),
           CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "overlaps", "ch_gemm_bias_act: c is a");
    EXPECT(ch_gemm_bias_act(a->f4, NULL, 0, 0, 1.0f, a->g4, a->h4, a->v4, CH_ACT_COUNT),
           CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "act",
           "ch_gemm_bias_act: act CH_ACT_COUNT");
    EXPECT(ch_gemm_bias_act(a->f4, NULL, 0, 0, 1.0f, a->g4, a->h4, a->v4, (ch_activation)-1),
           CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "act", "ch_gemm_bias_act: act -1");
    EXPECT(ch_gemm_bias_act(a->f4, a->f34, 0, 0, 1.0f, a->g4, a->h4, a->v4, CH_ACT_RELU),
           CH_ERR_SHAPE, "ch_gemm_bias_act", "pre", "ch_gemm_bias_act: pre [3,4] for c [4,4]");
    EXPECT(ch_gemm_bias_act(a->f4, a->i4, 0, 0, 1.0f, a->g4, a->h4, a->v4, CH_ACT_RELU),
           CH_ERR_DTYPE, "ch_gemm_bias_act", "pre", "ch_gemm_bias_act: i32 pre for f32 c");
    EXPECT(ch_gemm_bias_act(a->f4, a->f4, 0, 0, 1.0f, a->g4, a->h4, a->v4, CH_ACT_GELU),
           CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "pre overlaps c",
           "ch_gemm_bias_act: pre is c");
    EXPECT(ch_gemm_bias_act(a->f4, a->g4, 0, 0, 1.0f, a->g4, a->h4, a->v4, CH_ACT_GELU),
           CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "pre overlaps a",
           "ch_gemm_bias_act: pre is a");
    EXPECT(ch_gemm_bias_act(a->f4, a->h4, 0, 0, 1.0f, a->g4, a->h4, a->v4, CH_ACT_GELU),
           CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "pre overlaps b",
           "ch_gemm_bias_act: pre is b");
    /* a bias in pre's memory: the first 4 of k4's 16 floats */
    int64_t all = 16;
    ch_tensor *flat = NULL, *head = NULL;
    ch_status st = ch_tensor_reshape(&flat, a->k4, 1, &all);
    if (st == CH_OK)
        st = ch_tensor_view(&head, flat, 0, 4);
    if (tap_status_ok(st, "a 1-D view of k4's first row"))
        EXPECT(ch_gemm_bias_act(a->f4, a->k4, 0, 0, 1.0f, a->g4, a->h4, head, CH_ACT_TANH),
               CH_ERR_INVALID_ARGUMENT, "ch_gemm_bias_act", "pre overlaps bias",
               "ch_gemm_bias_act: bias in pre's memory");
    ch_tensor_free(head);
    ch_tensor_free(flat);
}

static void test_elementwise_args(const op_args *a)
{
    static const char *names[] = {"ch_add", "ch_sub", "ch_mul"};
    ch_status (*const fns[])(ch_tensor *, const ch_tensor *, const ch_tensor *) = {
        ch_add, ch_sub, ch_mul};
    for (int i = 0; i < 3; i++) {
        EXPECT(fns[i](NULL, a->f4, a->g4), CH_ERR_INVALID_ARGUMENT, names[i], "y", "y NULL");
        EXPECT(fns[i](a->f4, NULL, a->g4), CH_ERR_INVALID_ARGUMENT, names[i], "a", "a NULL");
        EXPECT(fns[i](a->f4, a->g4, NULL), CH_ERR_INVALID_ARGUMENT, names[i], "b", "b NULL");
        EXPECT(fns[i](a->f4, a->g4, a->f34), CH_ERR_SHAPE, names[i], "b", "16 and 12 elements");
        EXPECT(fns[i](a->f4, a->i4, a->g4), CH_ERR_DTYPE, names[i], "a", "i32 a");
        EXPECT(fns[i](a->row0, a->row1, a->row1), CH_ERR_INVALID_ARGUMENT, names[i], "y",
               "y partly overlaps a");
    }
    EXPECT(ch_scale(NULL, a->f4, 2.0f), CH_ERR_INVALID_ARGUMENT, "ch_scale", "y", "y NULL");
    EXPECT(ch_scale(a->f4, NULL, 2.0f), CH_ERR_INVALID_ARGUMENT, "ch_scale", "x", "x NULL");
    EXPECT(ch_scale(a->f4, a->f34, 2.0f), CH_ERR_SHAPE, "ch_scale", "x", "16 and 12 elements");
    EXPECT(ch_scale(a->f4, a->g4, NAN), CH_ERR_INVALID_ARGUMENT, "ch_scale", "alpha",
           "alpha NaN");
    EXPECT(ch_scale(a->i4, a->i4, 2.0f), CH_ERR_DTYPE, "ch_scale", "y", "i32");
    EXPECT(ch_axpy(NULL, 1.0f, a->f4), CH_ERR_INVALID_ARGUMENT, "ch_axpy", "y", "y NULL");
    EXPECT(ch_axpy(a->f4, 1.0f, NULL), CH_ERR_INVALID_ARGUMENT, "ch_axpy", "x", "x NULL");
    EXPECT(ch_axpy(a->f4, 1.0f, a->v4), CH_ERR_SHAPE, "ch_axpy", "x", "16 and 4 elements");
    EXPECT(ch_axpy(a->f4, INFINITY, a->g4), CH_ERR_INVALID_ARGUMENT, "ch_axpy", "alpha",
           "alpha infinite");
}

static void test_activation_args(const op_args *a)
{
    EXPECT(ch_activation_forward(NULL, a->f4, CH_ACT_RELU), CH_ERR_INVALID_ARGUMENT,
           "ch_activation_forward", "y", "y NULL");
    EXPECT(ch_activation_forward(a->f4, NULL, CH_ACT_RELU), CH_ERR_INVALID_ARGUMENT,
           "ch_activation_forward", "x", "x NULL");
    EXPECT(ch_activation_forward(a->f4, a->f34, CH_ACT_TANH), CH_ERR_SHAPE,
           "ch_activation_forward", "x", "16 and 12 elements");
    EXPECT(ch_activation_forward(a->f4, a->g4, (ch_activation)9), CH_ERR_INVALID_ARGUMENT,
           "ch_activation_forward", "act", "act 9");
    EXPECT(ch_activation_forward(a->f4, a->g4, CH_ACT_COUNT), CH_ERR_INVALID_ARGUMENT,
           "ch_activation_forward", "act", "act CH_ACT_COUNT");
    EXPECT(ch_activation_backward(a->f4, a->g4, a->g4, a->g4, CH_ACT_COUNT),
           CH_ERR_INVALID_ARGUMENT, "ch_activation_backward", "act", "act CH_ACT_COUNT");
    EXPECT(ch_activation_forward(a->i4, a->i4, CH_ACT_RELU), CH_ERR_DTYPE,
           "ch_activation_forward", "y", "i32");
    EXPECT(ch_activation_backward(NULL, a->f4, a->g4, NULL, CH_ACT_RELU),
           CH_ERR_INVALID_ARGUMENT, "ch_activation_backward", "dx", "dx NULL");
    EXPECT(ch_activation_backward(a->f4, NULL, a->g4, NULL, CH_ACT_GELU),
           CH_ERR_INVALID_ARGUMENT, "ch_activation_backward", "dy", "dy NULL");
    EXPECT(ch_activation_backward(a->f4, a->g4, NULL, a->g4, CH_ACT_RELU),
           CH_ERR_INVALID_ARGUMENT, "ch_activation_backward", "x", "relu without x");
    EXPECT(ch_activation_backward(a->f4, a->g4, a->g4, NULL, CH_ACT_SIGMOID),
           CH_ERR_INVALID_ARGUMENT, "ch_activation_backward", "y", "sigmoid without y");
    EXPECT(ch_activation_backward(a->f4, a->g4, NULL, a->f34, CH_ACT_TANH), CH_ERR_SHAPE,
           "ch_activation_backward", "y", "y 12 elements for dx 16");
    EXPECT(ch_activation_backward(a->f4, a->g4, a->g4, NULL, (ch_activation)-1),
           CH_ERR_INVALID_ARGUMENT, "ch_activation_backward", "act", "act -1");
}

static void test_bias_args(const op_args *a)
{
    EXPECT(ch_bias_add(NULL, a->f4, a->v4, 1), CH_ERR_INVALID_ARGUMENT, "ch_bias_add", "y",
           "y NULL");
    EXPECT(ch_bias_add(a->f4, NULL, a->v4, 1), CH_ERR_INVALID_ARGUMENT, "ch_bias_add", "x",
           "x NULL");
    EXPECT(ch_bias_add(a->f4, a->g4, NULL, 1), CH_ERR_INVALID_ARGUMENT, "ch_bias_add", "bias",
           "bias NULL");
    EXPECT(ch_bias_add(a->f4, a->g4, a->v4, 2), CH_ERR_INVALID_ARGUMENT, "ch_bias_add", "axis",
           "axis 2 of a 2-D x");
    EXPECT(ch_bias_add(a->f4, a->g4, a->v4, -3), CH_ERR_INVALID_ARGUMENT, "ch_bias_add",
           "axis", "axis -3 of a 2-D x");
    EXPECT(ch_bias_add(a->f34, a->f34, a->f1, 1), CH_ERR_SHAPE, "ch_bias_add", "bias",
           "1 bias for 4 features");
    EXPECT(ch_bias_add(a->f4, a->f34, a->v4, 1), CH_ERR_SHAPE, "ch_bias_add", "x",
           "y 16 and x 12 elements");
    EXPECT(ch_bias_add(a->f4, a->g4, a->l4, 1), CH_ERR_DTYPE, "ch_bias_add", "bias",
           "i32 bias");
    EXPECT(ch_bias_grad(NULL, a->f4, 1, 0.0f), CH_ERR_INVALID_ARGUMENT, "ch_bias_grad", "db",
           "db NULL");
    EXPECT(ch_bias_grad(a->v4, NULL, 1, 0.0f), CH_ERR_INVALID_ARGUMENT, "ch_bias_grad", "dy",
           "dy NULL");
    EXPECT(ch_bias_grad(a->v4, a->f4, 2, 0.0f), CH_ERR_INVALID_ARGUMENT, "ch_bias_grad", "axis",
           "axis 2 of a 2-D dy");
    EXPECT(ch_bias_grad(a->f1, a->f4, 1, 0.0f), CH_ERR_SHAPE, "ch_bias_grad", "db",
           "db of 1 for 4 features");
    EXPECT(ch_bias_grad(a->v4, a->f4, 1, NAN), CH_ERR_INVALID_ARGUMENT, "ch_bias_grad", "beta",
           "beta NaN");
}

static void test_loss_args(const op_args *a)
{
    EXPECT(ch_softmax_xent(NULL, a->f4, a->g4, a->l4), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent", "loss", "loss NULL");
    EXPECT(ch_softmax_xent(a->f1, NULL, a->g4, a->l4), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent", "probs", "probs NULL");
    EXPECT(ch_softmax_xent(a->f1, a->f4, NULL, a->l4), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent", "logits", "logits NULL");
    EXPECT(ch_softmax_xent(a->f1, a->f4, a->g4, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent", "labels", "labels NULL");
    EXPECT(ch_softmax_xent(a->f1, a->f4, a->g4, a->l3), CH_ERR_SHAPE, "ch_softmax_xent",
           "labels", "3 labels for 4 rows");
    EXPECT(ch_softmax_xent(a->f1, a->f4, a->g4, a->v4), CH_ERR_DTYPE, "ch_softmax_xent",
           "labels", "f32 labels");
    EXPECT(ch_softmax_xent(a->v4, a->f4, a->g4, a->l4), CH_ERR_SHAPE, "ch_softmax_xent", "loss",
           "loss of 4 elements");
    EXPECT(ch_softmax_xent(a->f1, a->f34, a->g4, a->l4), CH_ERR_SHAPE, "ch_softmax_xent",
           "probs", "probs [3,4] for logits [4,4]");
    EXPECT(ch_softmax_xent(a->f1, a->v4, a->v4, a->l4), CH_ERR_SHAPE, "ch_softmax_xent",
           "logits", "1-D logits");
    EXPECT(ch_softmax_xent_backward(NULL, a->f4, a->l4, 1.0f), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent_backward", "dlogits", "dlogits NULL");
    EXPECT(ch_softmax_xent_backward(a->f4, NULL, a->l4, 1.0f), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent_backward", "probs", "probs NULL");
    EXPECT(ch_softmax_xent_backward(a->f4, a->g4, NULL, 1.0f), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent_backward", "labels", "labels NULL");
    EXPECT(ch_softmax_xent_backward(a->f4, a->g4, a->l3, 1.0f), CH_ERR_SHAPE,
           "ch_softmax_xent_backward", "labels", "3 labels for 4 rows");
    EXPECT(ch_softmax_xent_backward(a->f34, a->g4, a->l4, 1.0f), CH_ERR_SHAPE,
           "ch_softmax_xent_backward", "dlogits", "dlogits [3,4] for probs [4,4]");
    EXPECT(ch_softmax_xent_backward(a->f4, a->g4, a->l4, NAN), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent_backward", "scale", "scale NaN");
    EXPECT(ch_softmax_xent_fused(NULL, a->f4, a->l4, 1.0f), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent_fused", "loss", "loss NULL");
    EXPECT(ch_softmax_xent_fused(a->f1, NULL, a->l4, 1.0f), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent_fused", "logits", "logits NULL");
    EXPECT(ch_softmax_xent_fused(a->f1, a->f4, NULL, 1.0f), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent_fused", "labels", "labels NULL");
    EXPECT(ch_softmax_xent_fused(a->f1, a->i4, a->l4, 1.0f), CH_ERR_DTYPE, "ch_softmax_xent_fused",
           "logits", "i32 logits");
    EXPECT(ch_softmax_xent_fused(a->f1, a->f4, a->v4, 1.0f), CH_ERR_DTYPE, "ch_softmax_xent_fused",
           "labels", "f32 labels");
    EXPECT(ch_softmax_xent_fused(a->f1, a->f4, a->l3, 1.0f), CH_ERR_SHAPE, "ch_softmax_xent_fused",
           "labels", "3 labels for 4 rows");
    EXPECT(ch_softmax_xent_fused(a->f1, a->v4, a->l4, 1.0f), CH_ERR_SHAPE, "ch_softmax_xent_fused",
           "logits", "1-D logits");
    EXPECT(ch_softmax_xent_fused(a->v4, a->f4, a->l4, 1.0f), CH_ERR_SHAPE, "ch_softmax_xent_fused",
           "loss", "loss of 4 elements");
    EXPECT(ch_softmax_xent_fused(a->f1, a->f4, a->l4, INFINITY), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent_fused", "scale", "scale infinite");
    /* The loss in the logits' memory: one element of them. */
    ch_tensor *flat = NULL, *one = NULL;
    int64_t n16 = 16;
    if (tap_status_ok(ch_tensor_reshape(&flat, a->f4, 1, &n16), "f4 as 16 elements") &&
        tap_status_ok(ch_tensor_view(&one, flat, 5, 1), "its sixth element"))
        EXPECT(ch_softmax_xent_fused(one, a->f4, a->l4, 1.0f), CH_ERR_INVALID_ARGUMENT,
               "ch_softmax_xent_fused", "overlaps", "loss inside the logits");
    ch_tensor_free(one);
    ch_tensor_free(flat);
}

/* A label out of range is an error, named in the message (test-ops checks
 * every device, forward and backward). */
static void test_label_range_host(const op_args *a)
{
    int32_t labels[4] = {0, 1, 4, 2};
    if (!tap_status_ok(ch_tensor_upload(a->l4, labels, sizeof labels), "upload labels"))
        return;
    EXPECT(ch_softmax_xent(a->f1, a->f4, a->g4, a->l4), CH_ERR_INVALID_ARGUMENT, "softmax",
           "labels", "host: label 4 of 4 classes");
    labels[2] = -1;
    if (!tap_status_ok(ch_tensor_upload(a->l4, labels, sizeof labels), "upload labels"))
        return;
    EXPECT(ch_softmax_xent(a->f1, a->f4, a->g4, a->l4), CH_ERR_INVALID_ARGUMENT, "softmax",
           "labels", "host: label -1");
    labels[2] = 3;
    tap_status_ok(ch_tensor_upload(a->l4, labels, sizeof labels), "upload labels");
}

/* ch_conv2d and its backward: x4d [2, 3, 5, 5] by w [4, 3, 3, 3] into
 * y [2, 4, 5, 5]. */
static void test_conv2d_args(const op_args *a)
{
    ch_device *dev = ch_tensor_device(a->x4d);
    ch_window2d ok = {3, 3, 1, 1, 1, 1}, k2 = {2, 2, 1, 1, 1, 1}, stride0 = {3, 3, 0, 1, 0, 0};
    ch_window2d big = {8, 8, 1, 1, 1, 1};
    int64_t ws[] = {4, 3, 3, 3}, ws2[] = {4, 2, 3, 3}, w3s[] = {3, 3, 3, 3};
    int64_t ys[] = {2, 4, 5, 5}, ybs[] = {2, 4, 4, 5};
    ch_tensor *w = NULL, *w2 = NULL, *w3 = NULL, *y = NULL, *yb = NULL, *dw = NULL, *dx = NULL;
    ch_status st = new_tensor(&w, dev, CH_F32, 4, ws);
    if (st == CH_OK) st = new_tensor(&w2, dev, CH_F32, 4, ws2);
    if (st == CH_OK) st = new_tensor(&w3, dev, CH_F32, 4, w3s);
    if (st == CH_OK) st = new_tensor(&y, dev, CH_F32, 4, ys);
    if (st == CH_OK) st = new_tensor(&yb, dev, CH_F32, 4, ybs);
    if (st == CH_OK) st = new_tensor(&dw, dev, CH_F32, 4, ws);
    if (st == CH_OK) st = new_tensor(&dx, dev, CH_F32, 4, (int64_t[]){2, 3, 5, 5});
    if (tap_status_ok(st, "tensors for the conv2d checks")) {
        EXPECT(ch_conv2d(NULL, a->x4d, w, &ok), CH_ERR_INVALID_ARGUMENT, "ch_conv2d", "y",
               "y NULL");
        EXPECT(ch_conv2d(y, NULL, w, &ok), CH_ERR_INVALID_ARGUMENT, "ch_conv2d", "x", "x NULL");
        EXPECT(ch_conv2d(y, a->x4d, NULL, &ok), CH_ERR_INVALID_ARGUMENT, "ch_conv2d", "w",
               "w NULL");
        EXPECT(ch_conv2d(y, a->x4d, w, NULL), CH_ERR_INVALID_ARGUMENT, "ch_conv2d", "win",
               "win NULL");
        EXPECT(ch_conv2d(y, a->x4d, a->i4, &ok), CH_ERR_DTYPE, "ch_conv2d", "w", "i32 w");
        EXPECT(ch_conv2d(y, a->f4, w, &ok), CH_ERR_SHAPE, "ch_conv2d", "x", "2-D x");
        EXPECT(ch_conv2d(y, a->x4d, w, &stride0), CH_ERR_INVALID_ARGUMENT, "ch_conv2d",
               "stride", "stride 0");
        EXPECT(ch_conv2d(y, a->x4d, w, &big), CH_ERR_SHAPE, "ch_conv2d", "window",
               "window 8x8 on a 5x5 input padded to 7x7");
        EXPECT(ch_conv2d(y, a->x4d, w, &k2), CH_ERR_SHAPE, "ch_conv2d", "w must be",
               "a 3x3 w with a 2x2 window");
        EXPECT(ch_conv2d(y, a->x4d, w2, &ok), CH_ERR_SHAPE, "ch_conv2d", "w must be",
               "w for 2 channels on 3");
        EXPECT(ch_conv2d(a->f4, a->x4d, w, &ok), CH_ERR_SHAPE, "ch_conv2d", "y must be",
               "2-D y");
        EXPECT(ch_conv2d(yb, a->x4d, w, &ok), CH_ERR_SHAPE, "ch_conv2d", "[2, 4, 5, 5]",
               "y [2,4,4,5] instead of [2,4,5,5]");
        EXPECT(ch_conv2d(a->x4d, a->x4d, w3, &ok), CH_ERR_INVALID_ARGUMENT, "ch_conv2d", "y",
               "y is x");
        EXPECT(ch_conv2d_backward(NULL, NULL, y, a->x4d, w, &ok, 1.0f), CH_ERR_INVALID_ARGUMENT,
               "ch_conv2d_backward", "dx and dw", "neither dx nor dw");
        EXPECT(ch_conv2d_backward(dx, dw, NULL, a->x4d, w, &ok, 1.0f), CH_ERR_INVALID_ARGUMENT,
               "ch_conv2d_backward", "dy", "dy NULL");
        EXPECT(ch_conv2d_backward(dx, dw, y, NULL, w, &ok, 1.0f), CH_ERR_INVALID_ARGUMENT,
               "ch_conv2d_backward", "x", "x NULL");
        EXPECT(ch_conv2d_backward(dx, dw, y, a->x4d, NULL, &ok, 1.0f), CH_ERR_INVALID_ARGUMENT,
               "ch_conv2d_backward", "w", "w NULL");
        EXPECT(ch_conv2d_backward(dx, dw, y, a->x4d, w, NULL, 1.0f), CH_ERR_INVALID_ARGUMENT,
               "ch_conv2d_backward", "win", "win NULL");
        EXPECT(ch_conv2d_backward(NULL, dw, y, a->x4d, w, &ok, NAN), CH_ERR_INVALID_ARGUMENT,
               "ch_conv2d_backward", "beta", "beta NaN");
        EXPECT(ch_conv2d_backward(a->i4, NULL, y, a->x4d, w, &ok, 1.0f), CH_ERR_DTYPE,
               "ch_conv2d_backward", "dx", "i32 dx");
        EXPECT(ch_conv2d_backward(a->f4, NULL, y, a->x4d, w, &ok, 1.0f), CH_ERR_SHAPE,
               "ch_conv2d_backward", "dx", "dx [4,4] for x [2,3,5,5]");
        EXPECT(ch_conv2d_backward(NULL, w2, y, a->x4d, w, &ok, 1.0f), CH_ERR_SHAPE,
               "ch_conv2d_backward", "dw", "dw [4,2,3,3] for w [4,3,3,3]");
        EXPECT(ch_conv2d_backward(NULL, dw, yb, a->x4d, w, &ok, 1.0f), CH_ERR_SHAPE,
               "ch_conv2d_backward", "dy", "dy [2,4,4,5]");
        EXPECT(ch_conv2d_backward(NULL, w, y, a->x4d, w, &ok, 1.0f), CH_ERR_INVALID_ARGUMENT,
               "ch_conv2d_backward", "dw", "dw is w");
        EXPECT(ch_conv2d_backward(a->x4d, NULL, y, a->x4d, w, &ok, 1.0f),
               CH_ERR_INVALID_ARGUMENT, "ch_conv2d_backward", "dx", "dx is x");
    }
    ch_tensor *all[] = {w, w2, w3, y, yb, dw, dx};
    for (size_t i = 0; i < ARRAY_LEN(all); i++)
        ch_tensor_free(all[i]);
}

static void test_conv_args(const op_args *a)
{
    ch_window2d ok = {3, 3, 1, 1, 1, 1}, stride0 = {3, 3, 0, 1, 0, 0}, k0 = {0, 3, 1, 1, 0, 0};
    ch_window2d pad_neg = {3, 3, 1, 1, -1, 0}, big = {8, 8, 1, 1, 1, 1};
    ch_window2d pool = {2, 2, 2, 2, 0, 0}, pool_pad = {2, 2, 2, 2, 2, 2};
    EXPECT(ch_im2col(NULL, a->x4d, &ok), CH_ERR_INVALID_ARGUMENT, "ch_im2col", "col",
           "col NULL");
    EXPECT(ch_im2col(a->f4, NULL, &ok), CH_ERR_INVALID_ARGUMENT, "ch_im2col", "x", "x NULL");
    EXPECT(ch_im2col(a->f4, a->x4d, NULL), CH_ERR_INVALID_ARGUMENT, "ch_im2col", "w",
           "w NULL");
    EXPECT(ch_im2col(a->f4, a->f4, &ok), CH_ERR_SHAPE, "ch_im2col", "x", "2-D x");
    EXPECT(ch_im2col(a->f4, a->x4d, &stride0), CH_ERR_INVALID_ARGUMENT, "ch_im2col", "stride",
           "stride 0");
    EXPECT(ch_im2col(a->f4, a->x4d, &k0), CH_ERR_INVALID_ARGUMENT, "ch_im2col", "window",
           "window 0x3");
    EXPECT(ch_im2col(a->f4, a->x4d, &pad_neg), CH_ERR_INVALID_ARGUMENT, "ch_im2col", "padding",
           "padding -1");
    EXPECT(ch_im2col(a->f4, a->x4d, &big), CH_ERR_SHAPE, "ch_im2col", "window",
           "window 8x8 on a 5x5 input padded to 7x7");
    EXPECT(ch_im2col(a->f4, a->x4d, &ok), CH_ERR_SHAPE, "ch_im2col", "col",
           "col [4,4] instead of [27,50]");
    EXPECT(ch_col2im(NULL, a->f4, &ok), CH_ERR_INVALID_ARGUMENT, "ch_col2im", "dx", "dx NULL");
    EXPECT(ch_col2im(a->x4d, NULL, &ok), CH_ERR_INVALID_ARGUMENT, "ch_col2im", "col",
           "col NULL");
    EXPECT(ch_col2im(a->x4d, a->f4, &stride0), CH_ERR_INVALID_ARGUMENT, "ch_col2im", "stride",
           "stride 0");
    EXPECT(ch_col2im(a->x4d, a->f4, &big), CH_ERR_SHAPE, "ch_col2im", "window",
           "window larger than the padded input");
    EXPECT(ch_col2im(a->x4d, a->f4, &ok), CH_ERR_SHAPE, "ch_col2im", "col",
           "col [4,4] instead of [27,50]");
    EXPECT(ch_maxpool2d(NULL, a->i4, a->x4d, &pool), CH_ERR_INVALID_ARGUMENT, "ch_maxpool2d",
           "y", "y NULL");
    EXPECT(ch_maxpool2d(a->f4, NULL, a->x4d, &pool), CH_ERR_INVALID_ARGUMENT, "ch_maxpool2d",
           "idx", "idx NULL");
    EXPECT(ch_maxpool2d(a->f4, a->i4, NULL, &pool), CH_ERR_INVALID_ARGUMENT, "ch_maxpool2d",
           "x", "x NULL");
    EXPECT(ch_maxpool2d(a->f4, a->g4, a->x4d, &pool), CH_ERR_DTYPE, "ch_maxpool2d", "idx",
           "f32 idx");
    EXPECT(ch_maxpool2d(a->f4, a->i4, a->x4d, &pool), CH_ERR_SHAPE, "ch_maxpool2d", "y",
           "y [4,4] instead of [2,3,2,2]");
    EXPECT(ch_maxpool2d(a->f4, a->i4, a->x4d, &stride0), CH_ERR_INVALID_ARGUMENT,
           "ch_maxpool2d", "stride", "stride 0");
    EXPECT(ch_maxpool2d(a->f4, a->i4, a->x4d, &pool_pad), CH_ERR_INVALID_ARGUMENT,
           "ch_maxpool2d", "padding", "padding 2 for a window of 2");
    EXPECT(ch_maxpool2d(a->f4, a->i4, a->x4d, &big), CH_ERR_SHAPE, "ch_maxpool2d", "window",
           "window larger than the padded input");
    EXPECT(ch_maxpool2d_backward(NULL, a->f4, a->i4, &pool), CH_ERR_INVALID_ARGUMENT,
           "ch_maxpool2d_backward", "dx", "dx NULL");
    EXPECT(ch_maxpool2d_backward(a->x4d, NULL, a->i4, &pool), CH_ERR_INVALID_ARGUMENT,
           "ch_maxpool2d_backward", "dy", "dy NULL");
    EXPECT(ch_maxpool2d_backward(a->x4d, a->f4, NULL, &pool), CH_ERR_INVALID_ARGUMENT,
           "ch_maxpool2d_backward", "idx", "idx NULL");
    EXPECT(ch_maxpool2d_backward(a->x4d, a->f4, a->g4, &pool), CH_ERR_DTYPE,
           "ch_maxpool2d_backward", "idx", "f32 idx");
    EXPECT(ch_maxpool2d_backward(a->x4d, a->f4, a->i4, &pool), CH_ERR_SHAPE,
           "ch_maxpool2d_backward", "dy", "dy [4,4] instead of [2,3,2,2]");
    EXPECT(ch_maxpool2d_backward(a->x4d, a->f4, a->i4, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_maxpool2d_backward", "w", "w NULL");
}

static void test_reduction_args(const op_args *a)
{
    static const char *names[] = {"ch_sum", "ch_mean"};
    ch_status (*const fns[])(ch_tensor *, const ch_tensor *, int) = {ch_sum, ch_mean};
    for (int i = 0; i < 2; i++) {
        EXPECT(fns[i](NULL, a->f4, 0), CH_ERR_INVALID_ARGUMENT, names[i], "y", "y NULL");
        EXPECT(fns[i](a->v4, NULL, 0), CH_ERR_INVALID_ARGUMENT, names[i], "x", "x NULL");
        EXPECT(fns[i](a->v4, a->f4, 2), CH_ERR_INVALID_ARGUMENT, names[i], "axis",
               "axis 2 of a 2-D x");
        EXPECT(fns[i](a->v4, a->f4, -3), CH_ERR_INVALID_ARGUMENT, names[i], "axis",
               "axis -3 of a 2-D x");
        EXPECT(fns[i](a->f1, a->f4, 0), CH_ERR_SHAPE, names[i], "y", "y of 1 element, want 4");
        EXPECT(fns[i](a->l4, a->f4, 0), CH_ERR_DTYPE, names[i], "y", "i32 y");
        EXPECT(fns[i](a->v4, a->i4, 0), CH_ERR_DTYPE, names[i], "x", "i32 x");
    }
    EXPECT(ch_argmax(NULL, a->f4, 0), CH_ERR_INVALID_ARGUMENT, "ch_argmax", "y", "y NULL");
    EXPECT(ch_argmax(a->l4, NULL, 0), CH_ERR_INVALID_ARGUMENT, "ch_argmax", "x", "x NULL");
    EXPECT(ch_argmax(a->l4, a->f4, 5), CH_ERR_INVALID_ARGUMENT, "ch_argmax", "axis",
           "axis 5 of a 2-D x");
    EXPECT(ch_argmax(a->l3, a->f4, 1), CH_ERR_SHAPE, "ch_argmax", "y", "y of 3, want 4");
    EXPECT(ch_argmax(a->v4, a->f4, 1), CH_ERR_DTYPE, "ch_argmax", "y", "f32 y");
}

/* The residual stream's add beside LayerNorm, rows 4 of D 4: the [4, 4]
 * tensors as sum, y, a, b (forward) and dx, dy, dres, x (backward), four
 * more of [4] (mean, rstd, gamma, beta; dgamma, dbeta) and one bf16. */
static void test_residual_norm_args(const op_args *a)
{
    static const char fw[] = "ch_add_layernorm", bw[] = "ch_layernorm_backward_add";
    ch_device *dev = ch_tensor_device(a->f4);
    /* v: five [4]; w: [3] twice and [3, 4] (rows 3, for a->row0 and
     * row1); head: f4's first 4 elements as [4] */
    ch_tensor *v[5] = {NULL}, *w[3] = {NULL}, *half = NULL, *flat = NULL, *head = NULL;
    int64_t three[] = {3}, all = 16;
    ch_status st = CH_OK;
    for (int i = 0; i < 5 && st == CH_OK; i++)
        st = new_tensor(&v[i], dev, CH_F32, 1, s1);
    for (int i = 0; i < 2 && st == CH_OK; i++)
        st = new_tensor(&w[i], dev, CH_F32, 1, three);
    if (st == CH_OK)
        st = new_tensor(&w[2], dev, CH_F32, 2, s3);
    if (st == CH_OK)
        st = new_tensor(&half, dev, CH_BF16, 1, s1);
    if (st == CH_OK)
        st = ch_tensor_reshape(&flat, a->f4, 1, &all);
    if (st == CH_OK)
        st = ch_tensor_view(&head, flat, 0, 4);
    ch_tensor *owned[] = {v[0], v[1], v[2], v[3], v[4], w[0], w[1], w[2], half, head, flat};
    if (!tap_status_ok(st, "tensors for the residual LayerNorm checks")) {
        for (size_t i = 0; i < ARRAY_LEN(owned); i++)
            ch_tensor_free(owned[i]);
        return;
    }
    ch_tensor *m3 = w[0], *r3 = w[1], *y34 = w[2];
    ch_tensor *sum = a->f4, *y = a->g4, *x1 = a->h4, *x2 = a->k4;
    ch_tensor *m = v[0], *r = v[1], *g = v[2], *b = v[3], *g2 = v[4];
    const float eps = 1e-5f;
    /* ch_add_layernorm(sum, y, mean, rstd, a, b, gamma, beta, eps) */
    ch_tensor *const fargs[] = {sum, y, m, r, x1, x2, g, b};
    static const char *const fnames[] = {"sum", "y", "mean", "rstd", "a", "b", "gamma", "beta"};
    for (int i = 0; i < 8; i++) {
        ch_tensor *t[8];
        char what[32];
        memcpy(t, fargs, sizeof t);
        t[i] = NULL;
        snprintf(what, sizeof what, "%s NULL", fnames[i]);
        EXPECT(ch_add_layernorm(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], eps),
               CH_ERR_INVALID_ARGUMENT, fw, fnames[i], what);
    }
    EXPECT(ch_add_layernorm(sum, y, m, r, a->i4, x2, g, b, eps), CH_ERR_DTYPE, fw, "a", "i32 a");
    EXPECT(ch_add_layernorm(a->i4, y, m, r, x1, x2, g, b, eps), CH_ERR_DTYPE, fw, "sum", "i32 sum");
    EXPECT(ch_add_layernorm(sum, y, m, r, x1, x2, half, b, eps), CH_ERR_DTYPE, fw, "gamma",
           "bf16 gamma (f32 only)");
    EXPECT(ch_add_layernorm(sum, y, a->l4, r, x1, x2, g, b, eps), CH_ERR_DTYPE, fw, "mean",
           "i32 mean");
    EXPECT(ch_add_layernorm(sum, y, m, r, x1, x2, g, b, -1.0f), CH_ERR_INVALID_ARGUMENT, fw, "eps",
           "eps -1");
    EXPECT(ch_add_layernorm(sum, y, m, r, x1, x2, g, b, NAN), CH_ERR_INVALID_ARGUMENT, fw, "eps",
           "eps NaN");
    EXPECT(ch_add_layernorm(sum, y, m, r, a->f34, x2, g, b, eps), CH_ERR_SHAPE, fw, "a",
           "a of 12 elements, sum of 16");
    EXPECT(ch_add_layernorm(sum, y, m, r, x1, a->f34, g, b, eps), CH_ERR_SHAPE, fw, "b",
           "b of 12 elements, sum of 16");
    EXPECT(ch_add_layernorm(sum, a->f34, m, r, x1, x2, g, b, eps), CH_ERR_SHAPE, fw, "y",
           "y of 12 elements, sum of 16");
    EXPECT(ch_add_layernorm(sum, y, a->f1, r, x1, x2, g, b, eps), CH_ERR_SHAPE, fw, "mean",
           "mean of 1 for 4 rows");
    EXPECT(ch_add_layernorm(sum, y, m, r, x1, x2, g, a->f1, eps), CH_ERR_SHAPE, fw, "beta",
           "beta of 1 for D 4");
    EXPECT(ch_add_layernorm(a->row1, y34, m3, r3, a->row0, a->f34, g, b, eps),
           CH_ERR_INVALID_ARGUMENT, fw, "partly", "sum partly over a");
    EXPECT(ch_add_layernorm(a->row0, y34, m3, r3, a->f34, a->row1, g, b, eps),
           CH_ERR_INVALID_ARGUMENT, fw, "partly", "sum partly over b");
    EXPECT(ch_add_layernorm(sum, sum, m, r, x1, x2, g, b, eps), CH_ERR_INVALID_ARGUMENT, fw,
           "overlaps", "y is sum");
    EXPECT(ch_add_layernorm(sum, y, m, r, x1, x2, head, b, eps), CH_ERR_INVALID_ARGUMENT, fw,
           "gamma", "gamma in sum's memory");
    EXPECT(ch_add_layernorm(sum, x1, m, r, x1, x2, g, b, eps), CH_ERR_INVALID_ARGUMENT, fw,
           "overlaps", "y is a");
    EXPECT(ch_add_layernorm(sum, y, m, m, x1, x2, g, b, eps), CH_ERR_INVALID_ARGUMENT, fw,
           "overlaps", "mean is rstd");
    EXPECT(ch_add_layernorm(sum, y, m, r, x1, x2, g, m, eps), CH_ERR_INVALID_ARGUMENT, fw,
           "overlaps", "mean is beta");
    tap_status_ok(ch_add_layernorm(x1, y, m, r, x1, x2, g, b, eps),
                  "%s: sum is a (in place) is allowed", fw);
    tap_status_ok(ch_add_layernorm(x2, y, m, r, x1, x2, g, b, eps),
                  "%s: sum is b (in place) is allowed", fw);
    tap_status_ok(ch_add_layernorm(sum, y, m, r, x1, x1, g, g, eps),
                  "%s: a is b and gamma is beta (inputs may share)", fw);
    /* ch_layernorm_backward_add(dx, dgamma, dbeta, dy, dres, x, mean, rstd, gamma) */
    ch_tensor *dx = a->f4, *dy = a->g4, *dres = a->h4, *x = a->k4, *dg = g2, *db = b;
    ch_tensor *const bargs[] = {dx, dg, db, dy, dres, x, m, r, g};
    static const char *const bnames[] = {"dx", "dgamma", "dbeta", "dy",   "dres",
                                         "x",  "mean",   "rstd",  "gamma"};
    for (int i = 0; i < 9; i++) {
        ch_tensor *t[9];
        char what[32];
        if (i == 4)
            continue; /* dres NULL: none, below */
        memcpy(t, bargs, sizeof t);
        t[i] = NULL;
        snprintf(what, sizeof what, "%s NULL", bnames[i]);
        EXPECT(ch_layernorm_backward_add(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]),
               CH_ERR_INVALID_ARGUMENT, bw, bnames[i], what);
    }
    EXPECT(ch_layernorm_backward_add(a->i4, dg, db, dy, dres, x, m, r, g), CH_ERR_DTYPE, bw, "dx",
           "i32 dx");
    EXPECT(ch_layernorm_backward_add(dx, dg, db, dy, a->i4, x, m, r, g), CH_ERR_DTYPE, bw, "dres",
           "i32 dres");
    EXPECT(ch_layernorm_backward_add(dx, half, db, dy, dres, x, m, r, g), CH_ERR_DTYPE, bw,
           "dgamma", "bf16 dgamma (f32 only)");
    EXPECT(ch_layernorm_backward_add(dx, dg, db, a->f34, dres, x, m, r, g), CH_ERR_SHAPE, bw, "dy",
           "dy of 12 elements, x of 16");
    EXPECT(ch_layernorm_backward_add(a->f34, dg, db, dy, dres, x, m, r, g), CH_ERR_SHAPE, bw, "dx",
           "dx of 12 elements, x of 16");
    EXPECT(ch_layernorm_backward_add(dx, dg, db, dy, a->f34, x, m, r, g), CH_ERR_SHAPE, bw, "dres",
           "dres of 12 elements, x of 16");
    EXPECT(ch_layernorm_backward_add(dx, dg, db, dy, dres, x, m, a->f1, g), CH_ERR_SHAPE, bw,
           "rstd", "rstd of 1 for 4 rows");
    EXPECT(ch_layernorm_backward_add(dx, a->f1, db, dy, dres, x, m, r, g), CH_ERR_SHAPE, bw,
           "dgamma", "dgamma of 1 for D 4");
    EXPECT(ch_layernorm_backward_add(a->row1, dg, db, a->f34, a->row0, y34, m3, r3, g),
           CH_ERR_INVALID_ARGUMENT, bw, "partly", "dx partly over dres");
    EXPECT(ch_layernorm_backward_add(x1, head, db, dy, a->f4, x, m, r, g), CH_ERR_INVALID_ARGUMENT,
           bw, "dres", "dgamma in dres's memory");
    EXPECT(ch_layernorm_backward_add(x1, dg, head, dy, a->f4, x, m, r, g), CH_ERR_INVALID_ARGUMENT,
           bw, "dres", "dbeta in dres's memory");
    EXPECT(ch_layernorm_backward_add(dy, dg, db, dy, dres, x, m, r, g), CH_ERR_INVALID_ARGUMENT, bw,
           "overlaps", "dx is dy");
    EXPECT(ch_layernorm_backward_add(dx, dg, db, dy, dres, dx, m, r, g), CH_ERR_INVALID_ARGUMENT,
           bw, "overlaps", "dx is x");
    EXPECT(ch_layernorm_backward_add(dx, dg, dg, dy, dres, x, m, r, g), CH_ERR_INVALID_ARGUMENT, bw,
           "overlaps", "dgamma is dbeta");
    EXPECT(ch_layernorm_backward_add(dx, dg, db, dy, dres, x, m, r, dg), CH_ERR_INVALID_ARGUMENT,
           bw, "overlaps", "dgamma is gamma");
    tap_status_ok(ch_layernorm_backward_add(dx, dg, db, dy, NULL, x, m, r, g),
                  "%s: dres NULL is allowed", bw);
    tap_status_ok(ch_layernorm_backward_add(dres, dg, db, dy, dres, x, m, r, g),
                  "%s: dres is dx (in place) is allowed", bw);
    for (size_t i = 0; i < ARRAY_LEN(owned); i++)
        ch_tensor_free(owned[i]);
}

static void test_optimizer_args(const op_args *a)
{
    ch_sgd_params sgd = {.lr = 0.1f, .momentum = 0.9f};
    ch_sgd_params bad = sgd;
    EXPECT(ch_sgd_step(a->f4, a->g4, a->f34, NULL, 0), CH_ERR_INVALID_ARGUMENT, "ch_sgd_step",
           "params", "params NULL");
    EXPECT(ch_sgd_step(NULL, a->g4, a->f34, &sgd, 0), CH_ERR_INVALID_ARGUMENT, "ch_sgd_step",
           "p", "p NULL");
    EXPECT(ch_sgd_step(a->f34, NULL, a->f34, &sgd, 0), CH_ERR_INVALID_ARGUMENT, "ch_sgd_step",
           "m", "m NULL with momentum 0.9");
    EXPECT(ch_sgd_step(a->f4, a->g4, NULL, &sgd, 0), CH_ERR_INVALID_ARGUMENT, "ch_sgd_step",
           "g", "g NULL");
    EXPECT(ch_sgd_step(a->f4, a->g4, a->f34, &sgd, 0), CH_ERR_SHAPE, "ch_sgd_step", "g",
           "g of 12 for p of 16");
    EXPECT(ch_sgd_step(a->f4, a->i4, a->g4, &sgd, 0), CH_ERR_DTYPE, "ch_sgd_step", "m",
           "i32 m");
    bad.lr = NAN;
    EXPECT(ch_sgd_step(a->f4, a->g4, a->h4, &bad, 0), CH_ERR_INVALID_ARGUMENT, "ch_sgd_step",
           "lr", "lr NaN");
    bad = sgd;
    bad.momentum = NAN;
    EXPECT(ch_sgd_step(a->f4, a->g4, a->h4, &bad, 0), CH_ERR_INVALID_ARGUMENT, "ch_sgd_step",
           "momentum", "momentum NaN");
    bad = sgd;
    bad.weight_decay = INFINITY;
    EXPECT(ch_sgd_step(a->f4, a->g4, a->h4, &bad, 0), CH_ERR_INVALID_ARGUMENT, "ch_sgd_step",
           "weight_decay", "weight_decay infinite");
    bad = sgd;
    bad.dampening = NAN;
    EXPECT(ch_sgd_step(a->f4, a->g4, a->h4, &bad, 0), CH_ERR_INVALID_ARGUMENT, "ch_sgd_step",
           "dampening", "dampening NaN");
    bad = sgd;
    bad.lr = -0.1f;
    EXPECT(ch_sgd_step(a->f4, a->g4, a->h4, &bad, 0), CH_ERR_INVALID_ARGUMENT, "ch_sgd_step",
           "lr", "lr -0.1");

    ch_adam_params adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 1};
    ch_adam_params bada = adam;
    EXPECT(ch_adam_step(a->f4, a->g4, a->row0, a->f34, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_adam_step", "params", "params NULL");
    EXPECT(ch_adam_step(a->f34, NULL, a->f34, a->f34, &adam), CH_ERR_INVALID_ARGUMENT,
           "ch_adam_step", "m", "m NULL");
    EXPECT(ch_adam_step(a->f34, a->f34, NULL, a->f34, &adam), CH_ERR_INVALID_ARGUMENT,
           "ch_adam_step", "v", "v NULL");
    EXPECT(ch_adam_step(a->f4, a->g4, a->f34, a->v4, &adam), CH_ERR_SHAPE, "ch_adam_step", "v",
           "v of 12 for p of 16");
    bada.lr = NAN;
    EXPECT(ch_adam_step(a->f4, a->g4, a->h4, a->k4, &bada), CH_ERR_INVALID_ARGUMENT,
           "ch_adam_step", "lr", "lr NaN");
    bada = adam;
    bada.beta1 = 1.0f;
    EXPECT(ch_adam_step(a->f4, a->g4, a->h4, a->k4, &bada), CH_ERR_INVALID_ARGUMENT,
           "ch_adam_step", "beta1", "beta1 1");
    bada = adam;
    bada.beta2 = NAN;
    EXPECT(ch_adam_step(a->f4, a->g4, a->h4, a->k4, &bada), CH_ERR_INVALID_ARGUMENT,
           "ch_adam_step", "beta2", "beta2 NaN");
    bada = adam;
    bada.eps = 0.0f;
    EXPECT(ch_adam_step(a->f4, a->g4, a->h4, a->k4, &bada), CH_ERR_INVALID_ARGUMENT,
           "ch_adam_step", "eps", "eps 0");
    bada = adam;
    bada.weight_decay = NAN;
    EXPECT(ch_adam_step(a->f4, a->g4, a->h4, a->k4, &bada), CH_ERR_INVALID_ARGUMENT,
           "ch_adam_step", "weight_decay", "weight_decay NaN");
    bada = adam;
    bada.step = 0;
    EXPECT(ch_adam_step(a->f4, a->g4, a->h4, a->k4, &bada), CH_ERR_INVALID_ARGUMENT,
           "ch_adam_step", "step", "step 0");
}

static void test_random_args(const op_args *a)
{
    EXPECT(ch_rand_uniform(NULL, 1, 0, 0.0f, 1.0f), CH_ERR_INVALID_ARGUMENT, "ch_rand_uniform",
           "y", "y NULL");
    EXPECT(ch_rand_uniform(a->i4, 1, 0, 0.0f, 1.0f), CH_ERR_DTYPE, "ch_rand_uniform", "y",
           "i32 y");
    EXPECT(ch_rand_uniform(a->f4, 1, 0, NAN, 1.0f), CH_ERR_INVALID_ARGUMENT, "ch_rand_uniform",
           "lo", "lo NaN");
    EXPECT(ch_rand_uniform(a->f4, 1, 0, 0.0f, INFINITY), CH_ERR_INVALID_ARGUMENT,
           "ch_rand_uniform", "hi", "hi infinite");
    EXPECT(ch_rand_uniform(a->f4, 1, 0, 2.0f, 1.0f), CH_ERR_INVALID_ARGUMENT, "ch_rand_uniform",
           "lo", "lo 2 above hi 1");
    EXPECT(ch_rand_normal(NULL, 1, 0, 0.0f, 1.0f), CH_ERR_INVALID_ARGUMENT, "ch_rand_normal",
           "y", "y NULL");
    EXPECT(ch_rand_normal(a->f4, 1, 0, NAN, 1.0f), CH_ERR_INVALID_ARGUMENT, "ch_rand_normal",
           "mean", "mean NaN");
    EXPECT(ch_rand_normal(a->f4, 1, 0, 0.0f, NAN), CH_ERR_INVALID_ARGUMENT, "ch_rand_normal",
           "std", "std NaN");
    EXPECT(ch_rand_normal(a->f4, 1, 0, 0.0f, -1.0f), CH_ERR_INVALID_ARGUMENT, "ch_rand_normal",
           "std", "std -1");
    EXPECT(ch_dropout_mask(NULL, 1, 0, 0.5f), CH_ERR_INVALID_ARGUMENT, "ch_dropout_mask", "y",
           "y NULL");
    EXPECT(ch_dropout_mask(a->f4, 1, 0, 1.0f), CH_ERR_INVALID_ARGUMENT, "ch_dropout_mask", "p",
           "p 1");
    EXPECT(ch_dropout_mask(a->f4, 1, 0, -0.1f), CH_ERR_INVALID_ARGUMENT, "ch_dropout_mask", "p",
           "p -0.1");
    EXPECT(ch_dropout_mask(a->f4, 1, 0, NAN), CH_ERR_INVALID_ARGUMENT, "ch_dropout_mask", "p",
           "p NaN");
    EXPECT(ch_dropout_mask(a->l4, 1, 0, 0.5f), CH_ERR_DTYPE, "ch_dropout_mask", "y", "i32 y");
}

/* ch_gemm_bias and ch_gemm_bias_act with half inputs (t, [4, 4] in dt):
 * c f32 or dt, pre of c's dtype, bias f32; the other half format for c,
 * pre or bias is refused. */
static void test_gemm_bias_half(ch_device *host, ch_dtype dt, ch_tensor *t, const op_args *a)
{
    ch_dtype other = dt == CH_BF16 ? CH_F16 : CH_BF16;
    const char *name = ch_dtype_name(dt), *oname = ch_dtype_name(other);
    ch_tensor *b = NULL, *c = NULL, *pre = NULL, *co = NULL, *bo = NULL;
    ch_status st = ch_tensor_new(&b, host, dt, 2, s2);
    if (st == CH_OK)
        st = ch_tensor_new(&c, host, dt, 2, s2);
    if (st == CH_OK)
        st = ch_tensor_new(&pre, host, dt, 2, s2);
    if (st == CH_OK)
        st = ch_tensor_new(&co, host, other, 2, s2);
    if (st == CH_OK)
        st = ch_tensor_new(&bo, host, other, 1, s1);
    /* zeros: the same bits in either format */
    if (st == CH_OK)
        st = ch_cast(t, a->g4);
    if (st == CH_OK)
        st = ch_cast(b, a->g4);
    char c_other[64], bias_other[64], pre_other[64];
    snprintf(c_other, sizeof c_other, "c %s for %s inputs", oname, name);
    snprintf(bias_other, sizeof bias_other, "bias %s", oname);
    snprintf(pre_other, sizeof pre_other, "pre %s for a %s c", oname, name);
    if (tap_status_ok(st, "%s tensors for ch_gemm_bias's and ch_gemm_bias_act's checks", name)) {
        EXPECT(ch_gemm_bias(co, 0, 0, 1.0f, t, b, a->v4), CH_ERR_DTYPE, "ch_gemm_bias", "c",
               c_other);
        EXPECT(ch_gemm_bias(c, 0, 0, 1.0f, t, b, bo), CH_ERR_DTYPE, "ch_gemm_bias", "bias",
               bias_other);
        EXPECT(ch_gemm_bias_act(co, NULL, 0, 0, 1.0f, t, b, a->v4, CH_ACT_GELU_TANH), CH_ERR_DTYPE,
               "ch_gemm_bias_act", "c", c_other);
        EXPECT(ch_gemm_bias_act(c, NULL, 0, 0, 1.0f, t, b, bo, CH_ACT_GELU_TANH), CH_ERR_DTYPE,
               "ch_gemm_bias_act", "bias", bias_other);
        EXPECT(ch_gemm_bias_act(c, co, 0, 0, 1.0f, t, b, a->v4, CH_ACT_GELU_TANH), CH_ERR_DTYPE,
               "ch_gemm_bias_act", "pre", pre_other);
        EXPECT(ch_gemm_bias_act(c, a->f4, 0, 0, 1.0f, t, b, a->v4, CH_ACT_GELU_TANH), CH_ERR_DTYPE,
               "ch_gemm_bias_act", "pre", "f32 pre for a half c");
        tap_status_ok(ch_gemm_bias(c, 0, 0, 1.0f, t, b, a->v4),
                      "ch_gemm_bias takes a %s c with %s inputs and an f32 bias", name, name);
        tap_status_ok(ch_gemm_bias_act(c, pre, 0, 0, 1.0f, t, b, a->v4, CH_ACT_GELU_TANH),
                      "ch_gemm_bias_act takes %s c and pre with %s inputs", name, name);
        tap_status_ok(ch_gemm_bias_act(a->f4, a->k4, 0, 0, 1.0f, t, b, a->v4, CH_ACT_GELU),
                      "ch_gemm_bias_act takes f32 c and pre with %s inputs", name);
    }
    ch_tensor_free(b);
    ch_tensor_free(c);
    ch_tensor_free(pre);
    ch_tensor_free(co);
    ch_tensor_free(bo);
}

/* bf16 and f16 go where they are accepted (the float ops, ch_gemm with
 * both inputs alike: test-half checks their values) and nowhere else: the
 * fills, random numbers, argmax, copies across dtypes and mixed GEMM
 * inputs are refused, naming the argument. */
static void test_half_dtype(ch_device *host, ch_dtype dt, const op_args *a)
{
    ch_tensor *t = NULL;
    const char *name = ch_dtype_name(dt);
    ch_clear_error();
    ch_status st = ch_tensor_new(&t, host, dt, 2, s2);
    if (!tap_status_ok(st, "ch_tensor_new of a %s tensor", name))
        return;
    EXPECT(ch_fill(t, 1.0), CH_ERR_DTYPE, "ch_fill", "y", name);
    EXPECT(ch_gemm(a->f4, 0, 0, 1.0f, t, a->g4, 0.0f), CH_ERR_DTYPE, "ch_gemm", "a", name);
    EXPECT(ch_rand_uniform(t, 1, 0, 0.0f, 1.0f), CH_ERR_DTYPE, "ch_rand_uniform", "y", name);
    EXPECT(ch_argmax(a->l4, t, 1), CH_ERR_DTYPE, "ch_argmax", "x", name);
    EXPECT(ch_copy(a->f4, t), CH_ERR_DTYPE, "ch_copy", "x", name);
    tap_status_ok(ch_add(a->f4, t, a->g4), "ch_add takes a %s a beside f32 y and b", name);
    tap_status_ok(ch_activation_forward(t, t, CH_ACT_RELU),
                  "ch_activation_forward takes %s in place", name);
    test_gemm_bias_half(host, dt, t, a);
    ch_tensor_free(t);
}

/* ---- Tensors on two devices ---------------------------------------------- */

static void test_device_mismatch(const op_args *h, const op_args *o, ch_device *other)
{
    const char *id = ch_device_id(other);
    ch_stream *s = NULL;
    ch_event *e = NULL;
    ch_sgd_params sgd = {.lr = 0.1f};
    ch_window2d pool = {2, 2, 2, 2, 0, 0};
    EXPECT(ch_add(h->f4, o->f4, h->g4), CH_ERR_DEVICE_MISMATCH, "ch_add", id, "a on the other");
    EXPECT(ch_mul(o->f4, h->f4, h->g4), CH_ERR_DEVICE_MISMATCH, "ch_mul", id, "y on the other");
    EXPECT(ch_gemm(h->f4, 0, 0, 1.0f, h->g4, o->g4, 0.0f), CH_ERR_DEVICE_MISMATCH, "ch_gemm", id,
           "b on the other");
    EXPECT(ch_gemm_bias_act(h->f4, o->k4, 0, 0, 1.0f, h->g4, h->h4, h->v4, CH_ACT_RELU),
           CH_ERR_DEVICE_MISMATCH, "ch_gemm_bias_act", id, "pre on the other");
    EXPECT(ch_axpy(h->f4, 1.0f, o->g4), CH_ERR_DEVICE_MISMATCH, "ch_axpy", id,
           "x on the other");
    EXPECT(ch_bias_add(h->f4, h->g4, o->v4, 1), CH_ERR_DEVICE_MISMATCH, "ch_bias_add", id,
           "bias on the other");
    EXPECT(ch_softmax_xent(h->f1, h->f4, h->g4, o->l4), CH_ERR_DEVICE_MISMATCH,
           "ch_softmax_xent", id, "labels on the other");
    EXPECT(ch_maxpool2d(h->f4, o->i4, h->x4d, &pool), CH_ERR_DEVICE_MISMATCH, "ch_maxpool2d", id,
           "idx on the other");
    EXPECT(ch_sgd_step(h->f4, NULL, o->g4, &sgd, 0), CH_ERR_DEVICE_MISMATCH, "ch_sgd_step", id,
           "g on the other");
    EXPECT(ch_sum(o->v4, h->f4, 0), CH_ERR_DEVICE_MISMATCH, "ch_sum", id, "y on the other");
    EXPECT(ch_add_layernorm(h->f4, h->g4, h->v4, h->v4, h->h4, o->k4, h->v4, h->v4, 1e-5f),
           CH_ERR_DEVICE_MISMATCH, "ch_add_layernorm", id, "b on the other");
    EXPECT(ch_layernorm_backward_add(h->f4, h->v4, h->v4, h->g4, o->h4, h->k4, h->v4, h->v4, h->v4),
           CH_ERR_DEVICE_MISMATCH, "ch_layernorm_backward_add", id, "dres on the other");
    tap_status_ok(ch_copy(o->f4, h->g4), "ch_copy from host to %s is allowed", id);
    if (ch_device_default_stream(&s, other) == CH_OK &&
        ch_event_new(&e, ch_tensor_device(h->f4)) == CH_OK)
        EXPECT(ch_event_record(e, s), CH_ERR_DEVICE_MISMATCH, "ch_event_record", id,
               "event on host, stream on the other");
    ch_event_free(e);
}

/* On a device too, a label out of range is an error naming it (ops.h),
 * from the call or, where the device defers the check, its next wait. */
static void test_label_range_device(const op_args *o, ch_device *other)
{
    int32_t labels[4] = {0, 1, 7, 2};
    char what[64];
    snprintf(what, sizeof what, "%s: label 7 of 4 classes", ch_device_id(other));
    if (!tap_status_ok(ch_tensor_upload(o->l4, labels, sizeof labels), "upload labels"))
        return;
    EXPECT(tap_settled(ch_softmax_xent(o->f1, o->f4, o->g4, o->l4), o->f1), CH_ERR_INVALID_ARGUMENT,
           "ch_softmax_xent", "labels", what);
    EXPECT(tap_settled(ch_softmax_xent_backward(o->f4, o->g4, o->l4, 1.0f), o->f4),
           CH_ERR_INVALID_ARGUMENT, "ch_softmax_xent_backward", "labels", what);
    labels[2] = 3;
    tap_status_ok(ch_tensor_upload(o->l4, labels, sizeof labels), "upload labels");
}

static void test_two_devices(const op_args *h)
{
    ch_device *other = NULL;
    op_args o;
    if (ch_device_by_name(&other, "opencl:0") != CH_OK) {
        tap_skip("tensors on different devices: no opencl:0 (%s)", ch_last_error());
        return;
    }
    if (!op_args_new(&o, other))
        return;
    test_device_mismatch(h, &o, other);
    test_label_range_device(&o, other);
    op_args_free(&o);
}

static void test_ops(ch_device *host)
{
    op_args a;
    if (!op_args_new(&a, host))
        return;
    test_data_ops(&a);
    test_gemm_args(&a);
    test_gemm_bias_act_args(&a);
    test_elementwise_args(&a);
    test_activation_args(&a);
    test_bias_args(&a);
    test_loss_args(&a);
    test_label_range_host(&a);
    test_conv_args(&a);
    test_conv2d_args(&a);
    test_reduction_args(&a);
    test_residual_norm_args(&a);
    test_optimizer_args(&a);
    test_random_args(&a);
    test_half_dtype(host, CH_BF16, &a);
    test_half_dtype(host, CH_F16, &a);
    test_two_devices(&a);
    op_args_free(&a);
}

static void test_tensors(ch_device *host)
{
    ch_tensor *t = NULL;
    test_tensor_new(host);
    if (!tap_status_ok(ch_tensor_new(&t, host, CH_F32, 2, s2), "ch_tensor_new(host, [4, 4])"))
        return;
    test_tensor_access(t);
    test_tensor_transfers(host, t);
    test_tensor_views(t);
    ch_tensor_free(t);
}

int main(void)
{
    ch_device *host = NULL;
    test_before_init();
    if (!tap_status_ok(ch_init(), "ch_init") || !tap_status_ok(ch_init(), "ch_init again"))
        return tap_done();
    test_status_strings();
    test_thread_local_error();
    test_version();
    if (!tap_status_ok(ch_device_by_name(&host, "host"), "ch_device_by_name(\"host\")"))
        return tap_done();
    test_device_names();
    test_device_lists();
    test_device_queries(host);
    test_streams(host);
    test_free_null();
    test_tensors(host);
    test_ops(host);
    ch_shutdown();
    EXPECT(ch_device_by_name(&host, "host"), CH_ERR_STATE, "ch_device_by_name", "ch_init",
           "after ch_shutdown");
    return tap_done();
}
