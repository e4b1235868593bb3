#include "gateway/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.h"

bool mr_tenant_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > MR_TENANT_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
              c == '_' || c == '.'))
            return false;
    }
    return true;
}

static int unhex(const char *s, uint8_t *out, size_t n)
{
    if (strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < 2 * n; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return -1;
        if (i % 2 == 0)
            out[i / 2] = (uint8_t)(v << 4);
        else
            out[i / 2] |= (uint8_t)v;
    }
    return 0;
}

static void tohex(const uint8_t *p, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[p[i] >> 4];
        out[2 * i + 1] = hx[p[i] & 15];
    }
    out[2 * n] = 0;
}

void mr_keyring_free(mr_keyring *kr)
{
    free(kr->keys);
    memset(kr, 0, sizeof *kr);
}

void mr_keyring_stat(const char *path, mr_keyring *kr)
{
    struct stat st;
    if (stat(path, &st) == 0) {
        kr->mtime = st.st_mtim.tv_sec;
        kr->mtime_ns = st.st_mtim.tv_nsec;
        kr->size = st.st_size;
        kr->ino = st.st_ino;
    }
}

bool mr_keyring_changed(const char *path, const mr_keyring *kr)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return false; /* a missing file keeps the old ring */
    return st.st_mtim.tv_sec != kr->mtime || st.st_mtim.tv_nsec != kr->mtime_ns || st.st_size != kr->size ||
           st.st_ino != kr->ino;
}

/* Why entry e cannot be key k (NULL when it can); fills k. */
static const char *key_from_json(json_t *e, mr_key *k)
{
    if (!json_is_object(e))
        return "entry is not an object";
    const char *id = json_string_value(json_object_get(e, "id"));
    const char *hash = json_string_value(json_object_get(e, "sha256"));
    const char *tenant = json_string_value(json_object_get(e, "tenant"));
    json_t *en = json_object_get(e, "enabled");
    json_t *mc = json_object_get(e, "max_concurrency");
    json_t *cr = json_object_get(e, "created");
    if (!id || strlen(id) >= sizeof k->id || !*id)
        return "\"id\" must be a string of 1..31 chars";
    if (!hash || unhex(hash, k->hash, 32))
        return "\"sha256\" must be 64 lowercase hex digits";
    if (!tenant || !mr_tenant_valid(tenant))
        return "\"tenant\" must be 1..64 of [A-Za-z0-9._-]";
    if (en && !json_is_boolean(en))
        return "\"enabled\" must be a boolean";
    if (mc && !json_is_null(mc) &&
        (!json_is_integer(mc) || json_integer_value(mc) < 1 || json_integer_value(mc) > 1000000))
        return "\"max_concurrency\" must be an integer >= 1";
    if (cr && !json_is_integer(cr))
        return "\"created\" must be an integer";
    strcpy(k->id, id);
    strcpy(k->tenant, tenant);
    k->enabled = en ? json_is_true(en) : true;
    k->max_concurrency = json_is_integer(mc) ? (int)json_integer_value(mc) : 0;
    k->created = cr ? json_integer_value(cr) : 0;
    return NULL;
}

/* The entries of root ({"keys": [...]}) into kr->keys; name is for messages. */
static int keys_from_json(json_t *root, const char *name, mr_keyring *kr, mr_err *err)
{
    json_t *keys = json_object_get(root, "keys");
    if (!json_is_object(root) || !json_is_array(keys))
        return mr_errf(err, "keyring %s: expected {\"keys\": [...]}", name);
    size_t n = json_array_size(keys);
    kr->keys = calloc(n ? n : 1, sizeof *kr->keys);
    if (!kr->keys)
        return mr_errf(err, "keyring %s: out of memory", name);
    size_t i;
    json_t *e;
    json_array_foreach(keys, i, e)
    {
        mr_key *k = &kr->keys[i];
        const char *bad = key_from_json(e, k);
        if (bad)
            return mr_errf(err, "keyring %s: key %zu: %s", name, i, bad);
        for (size_t j = 0; j < i; j++)
            if (!memcmp(kr->keys[j].hash, k->hash, 32) || !strcmp(kr->keys[j].id, k->id))
                return mr_errf(err, "keyring %s: key %zu duplicates key %zu", name, i, j);
    }
    kr->n = n;
    return 0;
}

int mr_keyring_parse(const char *text, size_t len, const char *name, mr_keyring *out, mr_err *err)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return mr_errf(err, "keyring %s: line %d: %s", name, je.line, je.text);
    mr_keyring kr = {0};
    int rc = keys_from_json(root, name, &kr, err);
    json_decref(root);
    if (rc) {
        mr_keyring_free(&kr);
        return rc;
    }
    *out = kr;
    return 0;
}

int mr_keyring_load(const char *path, mr_keyring *out, mr_err *err)
{
    memset(out, 0, sizeof *out);
    mr_keyring kr = {0};
    mr_keyring_stat(path, &kr);
    /* bounded as the config is: the gateway rereads the keyring whenever it changes */
    size_t len;
    char *text = mr_file_read_max(path, 16u << 20, &len, err);
    if (!text)
        return mr_err_wrap(err, "keyring");
    mr_keyring parsed = {0};
    int rc = mr_keyring_parse(text, len, path, &parsed, err);
    free(text);
    if (rc)
        return rc;
    kr.keys = parsed.keys;
    kr.n = parsed.n;
    *out = kr;
    return 0;
}

/* The file's object for entry k, or NULL (out of memory). */
static json_t *key_to_json(const mr_key *k)
{
    char hx[65];
    tohex(k->hash, 32, hx);
    json_t *e = json_pack("{s:s, s:s, s:s, s:b, s:I}", "id", k->id, "sha256", hx, "tenant", k->tenant, "enabled",
                          k->enabled, "created", (json_int_t)k->created);
    if (e && k->max_concurrency && json_object_set_new(e, "max_concurrency", json_integer(k->max_concurrency))) {
        json_decref(e);
        return NULL;
    }
    return e;
}

char *mr_keyring_dumps(const mr_keyring *kr)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < kr->n; i++) {
        /* an entry that cannot be written must not silently vanish from the file */
        json_t *e = key_to_json(&kr->keys[i]);
        if (!e || json_array_append_new(arr, e)) {
            json_decref(arr);
            arr = NULL;
        }
    }
    json_t *root = arr ? json_pack("{s:o}", "keys", arr) : NULL;
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return NULL;
    /* the file ends with a newline */
    size_t len = strlen(text);
    char *out = malloc(len + 2);
    if (out) {
        memcpy(out, text, len);
        memcpy(out + len, "\n", 2);
    }
    free(text);
    return out;
}

int mr_keyring_save(const char *path, const mr_keyring *kr, mr_err *err)
{
    char *text = mr_keyring_dumps(kr);
    if (!text)
        return mr_errf(err, "keyring: out of memory");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        free(text);
        return mr_errf(err, "keyring: create %s: %s", tmp, strerror(errno));
    }
    size_t len = strlen(text), off = 0;
    int rc = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            rc = mr_errf(err, "keyring: write %s: %s", tmp, strerror(errno));
            break;
        }
        off += (size_t)w;
    }
    if (!rc && fsync(fd) != 0)
        rc = mr_errf(err, "keyring: fsync %s: %s", tmp, strerror(errno));
    close(fd);
    free(text);
    if (!rc && rename(tmp, path) != 0)
        rc = mr_errf(err, "keyring: rename %s -> %s: %s", tmp, path, strerror(errno));
    if (rc) {
        unlink(tmp);
        return rc;
    }
    /* make the rename itself durable */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = 0;
    else
        strcpy(dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

const mr_key *mr_keyring_find(const mr_keyring *kr, const char *key, size_t len)
{
    uint8_t h[32];
    SHA256((const unsigned char *)key, len, h);
    const mr_key *hit = NULL;
    /* every entry is compared, so the time does not tell where a match is */
    for (size_t i = 0; i < kr->n; i++) {
        int eq = CRYPTO_memcmp(h, kr->keys[i].hash, 32) == 0;
        if (eq)
            hit = &kr->keys[i];
    }
    return hit;
}

int mr_keyring_add(mr_keyring *kr, const char *tenant, int max_concurrency, char key_out[64], char id_out[32],
                   mr_err *err)
{
    if (!mr_tenant_valid(tenant))
        return mr_errf(err, "tenant \"%s\": must be 1..64 of [A-Za-z0-9._-]", tenant);
    if (max_concurrency < 0)
        return mr_errf(err, "max_concurrency must be >= 0");
    uint8_t rnd[24];
    if (RAND_bytes(rnd, sizeof rnd) != 1)
        return mr_errf(err, "no randomness available");
    char hx[49];
    tohex(rnd, sizeof rnd, hx);
    snprintf(key_out, 64, "mk-%s", hx);
    mr_key *keys = realloc(kr->keys, (kr->n + 1) * sizeof *keys);
    if (!keys)
        return mr_errf(err, "out of memory");
    kr->keys = keys;
    mr_key *k = &keys[kr->n];
    memset(k, 0, sizeof *k);
    SHA256((const unsigned char *)key_out, strlen(key_out), k->hash);
    char hh[65];
    tohex(k->hash, 32, hh);
    snprintf(k->id, sizeof k->id, "k-%.12s", hh);
    snprintf(k->tenant, sizeof k->tenant, "%s", tenant);
    k->enabled = true;
    k->max_concurrency = max_concurrency;
    k->created = (int64_t)time(NULL);
    kr->n++;
    snprintf(id_out, 32, "%s", k->id);
    return 0;
}

int mr_keyring_disable(mr_keyring *kr, const char *which, mr_err *err)
{
    mr_key *k = (mr_key *)mr_keyring_find(kr, which, strlen(which));
    for (size_t i = 0; !k && i < kr->n; i++)
        if (!strcmp(kr->keys[i].id, which))
            k = &kr->keys[i];
    if (!k)
        return mr_errf(err, "no key with id (or value) \"%s\"", which);
    k->enabled = false;
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: memra-gateway keys add --keyring FILE --tenant NAME [--max-concurrency N]\n"
                    "       memra-gateway keys disable --keyring FILE ID\n"
                    "       memra-gateway keys list --keyring FILE\n");
    return 2;
}

int mr_keys_cli(int argc, char **argv)
{
    /* argv[0] = "keys", argv[1] = action */
    if (argc < 2)
        return usage();
    const char *action = argv[1], *path = NULL, *tenant = NULL, *which = NULL;
    int maxc = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--keyring") && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--tenant") && i + 1 < argc)
            tenant = argv[++i];
        else if (!strcmp(argv[i], "--max-concurrency") && i + 1 < argc)
            maxc = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !which)
            which = argv[i];
        else
            return usage();
    }
    if (!path)
        return usage();
    mr_keyring kr = {0};
    mr_err err;
    bool exists = access(path, F_OK) == 0;
    if (exists && mr_keyring_load(path, &kr, &err)) {
        fprintf(stderr, "memra-gateway keys: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (!strcmp(action, "list")) {
        printf("%-16s %-24s %-8s %s\n", "ID", "TENANT", "ENABLED", "MAX_CONCURRENCY");
        for (size_t i = 0; i < kr.n; i++)
            printf("%-16s %-24s %-8s %d\n", kr.keys[i].id, kr.keys[i].tenant, kr.keys[i].enabled ? "yes" : "no",
                   kr.keys[i].max_concurrency);
    } else if (!strcmp(action, "add")) {
        char key[64], id[32];
        if (!tenant) {
            mr_keyring_free(&kr);
            return usage();
        }
        if (mr_keyring_add(&kr, tenant, maxc, key, id, &err) || mr_keyring_save(path, &kr, &err)) {
            fprintf(stderr, "memra-gateway keys: %s\n", err.msg);
            rc = 1;
        } else {
            /* the only time the key is ever shown */
            printf("%s\n", key);
            fprintf(stderr, "added key %s for tenant %s (store it now: it is not kept)\n", id, tenant);
        }
    } else if (!strcmp(action, "disable")) {
        if (!which) {
            mr_keyring_free(&kr);
            return usage();
        }
        if (mr_keyring_disable(&kr, which, &err) || mr_keyring_save(path, &kr, &err)) {
            fprintf(stderr, "memra-gateway keys: %s\n", err.msg);
            rc = 1;
        }
    } else {
        rc = usage();
    }
    mr_keyring_free(&kr);
    return rc;
}
