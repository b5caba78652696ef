/* chorus-info: what Chorus sees on this machine. A table of the devices, the
 * backends (and why one did not load), which devices can copy to each other
 * directly, and the devices discovery hid; or the devices as JSON. Under
 * mpirun every process lists its own, and rank 0 prints them in rank order. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chorus.h>

static const char *prog = "chorus-info";

static void die(const char *what)
{
    fprintf(stderr, "%s: %s\n", prog, what);
    exit(1);
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: %s [--json]\n"
            "List the devices Chorus can train on: backend, platform, name, vendor, memory,\n"
            "compute units, PCI bus id, NUMA node and local CPUs; the backends and\n"
            "why one is unavailable; peer access between devices; and the devices\n"
            "hidden because another backend already shows them or no driver runs them.\n"
            "\n"
            "  --json     print the devices as one JSON array\n"
            "  --help     print this help\n"
            "  --version  print the Chorus version\n"
            "\n"
            "Under mpirun (or srun), every process lists its own devices and rank 0\n"
            "prints them in rank order, each under a line naming the rank, its local\n"
            "rank and its machine (with --json: one JSON array of an object per\n"
            "process, {\"rank\", \"ranks\", \"local_rank\", \"host\", \"devices\"}).\n"
            "\n"
            "Environment: CHORUS_DEVICES (only these devices), CHORUS_BACKEND_PATH\n"
            "(where backend modules are looked for first), HWLOC_XMLFILE (a topology\n"
            "to use instead of this machine's).\n",
            prog);
}

/* ---- a text table with columns as wide as their widest cell ---- */

typedef struct table {
    int ncols, nrows, cap;
    char **cells;
} table;

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (!d)
        die("out of memory");
    memcpy(d, s, n);
    return d;
}

static void table_add(table *t, const char *const *row)
{
    if (t->nrows == t->cap) {
        int cap = t->cap ? 2 * t->cap : 8;
        char **cells = realloc(t->cells, (size_t)cap * (size_t)t->ncols * sizeof *cells);
        if (!cells)
            die("out of memory");
        t->cells = cells;
        t->cap = cap;
    }
    for (int c = 0; c < t->ncols; c++)
        t->cells[t->nrows * t->ncols + c] = dup_str(row[c]);
    t->nrows++;
}

static size_t column_width(const table *t, int c)
{
    size_t width = 0;
    for (int r = 0; r < t->nrows; r++) {
        size_t n = strlen(t->cells[r * t->ncols + c]);
        width = n > width ? n : width;
    }
    return width;
}

/* Prints and frees the table. */
static void table_print(table *t)
{
    for (int r = 0; r < t->nrows; r++) {
        char **row = &t->cells[r * t->ncols];
        int last = t->ncols - 1;
        /* No trailing blanks: stop at the last cell that says something. */
        while (last > 0 && row[last][0] == '\0')
            last--;
        fputs("  ", stdout);
        for (int c = 0; c < last; c++)
            printf("%-*s  ", (int)column_width(t, c), row[c]);
        printf("%s\n", row[last]);
    }
    for (int i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
}

/* ---- device facts as text ---- */

static const char *kind_name(ch_device_kind kind)
{
    switch (kind) {
    case CH_DEVICE_CPU: return "cpu";
    case CH_DEVICE_GPU: return "gpu";
    case CH_DEVICE_ACCELERATOR: return "accelerator";
    }
    return "unknown";
}

static const char *or_dash(const char *s)
{
    return s[0] ? s : "-";
}

static void get_info(int index, ch_device **dev, ch_device_info *info)
{
    char msg[1200];
    ch_status st = ch_device_get(dev, index);
    if (st == CH_OK)
        st = ch_device_get_info(*dev, info);
    if (st != CH_OK) {
        snprintf(msg, sizeof msg, "device %d: %s: %s", index, ch_status_str(st),
                 ch_last_error());
        die(msg);
    }
}

static void print_devices(void)
{
    table t = {13, 0, 0, NULL};
    const char *head[13] = {"id", "backend", "platform", "kind", "name", "vendor", "memory",
                            "CUs", "PCI bus id", "NUMA", "cpuset", "all?", "note"};
    table_add(&t, head);
    for (int i = 0; i < ch_device_count(); i++) {
        ch_device *dev;
        ch_device_info in;
        char mem[32], cus[16], numa[16];
        get_info(i, &dev, &in);
        snprintf(mem, sizeof mem, "%.1f GiB", (double)in.memory_bytes / (1024.0 * 1024 * 1024));
        snprintf(cus, sizeof cus, "%d", in.compute_units);
        snprintf(numa, sizeof numa, "%d", in.numa_node);
        const char *row[13] = {in.id, in.backend, or_dash(in.platform), kind_name(in.kind),
                               in.name,
                               or_dash(in.vendor), in.memory_bytes ? mem : "-", cus,
                               or_dash(in.pci_bus_id), in.numa_node >= 0 ? numa : "-",
                               or_dash(in.cpuset), in.in_all ? "yes" : "no", in.note};
        table_add(&t, row);
    }
    printf("Devices (%d)\n", ch_device_count());
    table_print(&t);
}

static void print_backends(void)
{
    table t = {3, 0, 0, NULL};
    for (int i = 0; i < ch_backend_count(); i++) {
        ch_backend_info b;
        char detail[600];
        if (ch_backend_get_info(i, &b) != CH_OK)
            die(ch_last_error());
        if (b.available)
            snprintf(detail, sizeof detail, "%s (%d device%s)", b.detail, b.device_count,
                     b.device_count == 1 ? "" : "s");
        else
            snprintf(detail, sizeof detail, "%s", b.detail);
        const char *row[3] = {b.name, b.available ? "loaded" : "unavailable", detail};
        table_add(&t, row);
    }
    printf("\nBackends\n");
    table_print(&t);
}

static void print_peers(void)
{
    int n = ch_device_count();
    table t = {n + 1, 0, 0, NULL};
    const char **row = malloc((size_t)(n + 1) * sizeof *row);
    ch_device **devs = malloc((size_t)(n > 0 ? n : 1) * sizeof *devs);
    if (!row || !devs)
        die("out of memory");
    row[0] = "from \\ to";
    for (int i = 0; i < n; i++) {
        ch_device_info in;
        get_info(i, &devs[i], &in);
        row[i + 1] = ch_device_id(devs[i]);
    }
    table_add(&t, row);
    for (int i = 0; i < n; i++) {
        row[0] = ch_device_id(devs[i]);
        for (int j = 0; j < n; j++)
            row[j + 1] = i == j ? "-" : ch_device_can_peer(devs[i], devs[j]) ? "yes" : "no";
        table_add(&t, row);
    }
    printf("\nPeer access (device to device copies without host staging)\n");
    table_print(&t);
    free(row);
    free(devs);
}

static void print_hidden(void)
{
    table t = {4, 0, 0, NULL};
    const char *head[4] = {"id", "name", "PCI bus id", "why hidden"};
    int n = ch_hidden_device_count();
    printf("\nHidden devices (%d)\n", n);
    if (n == 0)
        return;
    table_add(&t, head);
    for (int i = 0; i < n; i++) {
        ch_hidden_device h;
        if (ch_hidden_device_get(i, &h) != CH_OK)
            die(ch_last_error());
        const char *row[4] = {h.id, or_dash(h.name), or_dash(h.pci_bus_id), h.reason};
        table_add(&t, row);
    }
    table_print(&t);
}

/* ---- JSON ---- */

/* Length of the valid UTF-8 sequence at s, 0 if it is not one. */
static int utf8_len(const unsigned char *s)
{
    int n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf)
        n = 2;
    else if (s[0] >= 0xe0 && s[0] <= 0xef)
        n = 3;
    else if (s[0] >= 0xf0 && s[0] <= 0xf4)
        n = 4;
    else
        return 0;
    /* No overlong forms, no surrogates, nothing past U+10FFFF. */
    if (s[0] == 0xe0)
        lo = 0xa0;
    else if (s[0] == 0xed)
        hi = 0x9f;
    else if (s[0] == 0xf0)
        lo = 0x90;
    else if (s[0] == 0xf4)
        hi = 0x8f;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

/* A JSON string; bytes that are not UTF-8 (a driver's name in Latin-1)
 * become U+FFFD so that the output always parses. */
static void json_string(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    putchar('"');
    while (*s) {
        int n = utf8_len(s);
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", stdout);
        else if (*s == '\t')
            fputs("\\t", stdout);
        else if (*s == '\r')
            fputs("\\r", stdout);
        else if (*s < 0x20)
            printf("\\u%04x", *s);
        else if (n == 0)
            fputs("\\ufffd", stdout);
        else
            fwrite(s, 1, (size_t)n, stdout);
        s += n ? n : 1;
    }
    putchar('"');
}

static void json_key_string(const char *key, const char *value, int null_if_empty)
{
    printf(", \"%s\": ", key);
    if (null_if_empty && value[0] == '\0')
        fputs("null", stdout);
    else
        json_string(value);
}

static void json_device(const ch_device_info *in)
{
    fputs("  {\"id\": ", stdout);
    json_string(in->id);
    json_key_string("backend", in->backend, 0);
    json_key_string("kind", kind_name(in->kind), 0);
    json_key_string("name", in->name, 0);
    json_key_string("vendor", in->vendor, 0);
    json_key_string("platform", in->platform, 0);
    printf(", \"memory_bytes\": %" PRIu64 ", \"max_alloc_bytes\": %" PRIu64
           ", \"compute_units\": %d",
           in->memory_bytes, in->max_alloc_bytes, in->compute_units);
    json_key_string("pci_bus_id", in->pci_bus_id, 1);
    if (in->numa_node >= 0)
        printf(", \"numa_node\": %d", in->numa_node);
    else
        fputs(", \"numa_node\": null", stdout);
    json_key_string("cpuset", in->cpuset, 1);
    printf(", \"in_all\": %s", in->in_all ? "true" : "false");
    json_key_string("note", in->note, 0);
    putchar('}');
}

static void print_json(void)
{
    int n = ch_device_count();
    fputs("[\n", stdout);
    for (int i = 0; i < n; i++) {
        ch_device *dev;
        ch_device_info in;
        get_info(i, &dev, &in);
        json_device(&in);
        fputs(i + 1 < n ? ",\n" : "\n", stdout);
    }
    fputs("]\n", stdout);
}

/* What this process printed, under a heading, to rank 0, which prints
 * every process's in rank order: each rank in turn broadcasts who it is
 * and the length of its text, then the text. */
static int gather_print(ch_dist *world, const char *text, size_t len, int json)
{
    int rank = ch_dist_rank(world), ranks = ch_dist_size(world);
    struct rank_info {
        uint64_t len;
        int32_t local_rank, local_size;
        char host[256];
    } mine = {len, ch_dist_local_rank(world), ch_dist_local_size(world), "?"};
    if (gethostname(mine.host, sizeof mine.host) != 0)
        snprintf(mine.host, sizeof mine.host, "?");
    mine.host[sizeof mine.host - 1] = '\0';
    for (int k = 0; k < ranks; k++) {
        struct rank_info who = mine;
        if (ch_dist_broadcast(world, &who, sizeof who, k) != CH_OK)
            return 1;
        char *buf = malloc(who.len + 1);
        if (!buf)
            die("out of memory");
        if (k == rank)
            memcpy(buf, text, who.len);
        if (ch_dist_broadcast(world, buf, who.len, k) != CH_OK) {
            free(buf);
            return 1;
        }
        size_t bytes = who.len;
        buf[bytes] = '\0';
        if (rank == 0 && json) {
            /* The devices' array without its line end, inside an object. */
            while (bytes > 0 && buf[bytes - 1] == '\n')
                buf[--bytes] = '\0';
            printf("%s{\"rank\":%d,\"ranks\":%d,\"local_rank\":%d,\"host\":\"%s\","
                   "\"devices\":%s}%s\n", k ? "" : "[", k, ranks, who.local_rank, who.host,
                   buf, k + 1 < ranks ? "," : "]");
        } else if (rank == 0) {
            printf("%s== rank %d of %d (local rank %d of %d) on %s ==\n%s", k ? "\n" : "", k,
                   ranks, who.local_rank, who.local_size, who.host, buf);
        }
        free(buf);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int json = 0;
    ch_status st;
    ch_dist *world = NULL;
    if (ch_dist_launched()) {
        st = ch_dist_init(&argc, &argv);
        if (st != CH_OK) {
            fprintf(stderr, "%s: cannot join the MPI job: %s\n", prog, ch_last_error());
            return 1;
        }
        world = ch_dist_world();
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("%s (Chorus) %s\n", prog, ch_version());
            return 0;
        } else {
            fprintf(stderr, "%s: unknown option '%s' (try --help)\n", prog, argv[i]);
            return 2;
        }
    }
    st = ch_init();
    if (st != CH_OK) {
        fprintf(stderr, "%s: ch_init failed: %s: %s\n", prog, ch_status_str(st),
                ch_last_error());
        return 1;
    }
    /* Under mpirun the listing goes to memory first, then to rank 0. */
    char *text = NULL;
    size_t len = 0;
    FILE *out = stdout;
    if (ch_dist_size(world) > 1) {
        stdout = open_memstream(&text, &len);
        if (!stdout)
            die("out of memory");
    }
    if (json) {
        print_json();
    } else {
        print_devices();
        print_backends();
        print_peers();
        print_hidden();
    }
    if (ch_dist_size(world) > 1) {
        fclose(stdout);
        stdout = out;
        int bad = gather_print(world, text, len, json);
        free(text);
        if (bad) {
            fprintf(stderr, "%s: rank %d: %s\n", prog, ch_dist_rank(world), ch_last_error());
            return 1;
        }
    }
    ch_shutdown();
    ch_dist_finalize();
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s: writing the output failed\n", prog);
        return 1;
    }
    return 0;
}
