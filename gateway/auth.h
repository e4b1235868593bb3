/* API keys: a keyring file (JSON) holds the SHA-256 of each key, never the
 * key itself, with its tenant, enabled flag and optional concurrency cap.
 *
 *   {"keys": [{"id": "k-3f2a9c1d7e4b", "sha256": "<64 hex>", "tenant": "acme",
 *              "enabled": true, "max_concurrency": 4, "created": 1767225600}]}
 *
 * Lookups hash the presented key and compare it with every entry in
 * constant time.  Rewrites are atomic (temp file, fsync, rename). */
#ifndef MR_AUTH_H
#define MR_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "common/err.h"

#define MR_TENANT_MAX 64

typedef struct mr_key {
    char id[32];
    uint8_t hash[32];
    char tenant[MR_TENANT_MAX + 1];
    bool enabled;
    int max_concurrency; /* 0 = no per-key cap */
    int64_t created;
} mr_key;

typedef struct mr_keyring {
    mr_key *keys;
    size_t n;
    /* identity of the file this was read from, to notice rewrites */
    time_t mtime;
    long mtime_ns;
    off_t size;
    ino_t ino;
} mr_keyring;

bool mr_tenant_valid(const char *s);

/* Reads and validates a keyring (every entry, duplicates refused). */
int mr_keyring_load(const char *path, mr_keyring *kr, mr_err *err);
/* Validates keyring text as mr_keyring_load does; name stands for the file in messages. */
int mr_keyring_parse(const char *text, size_t len, const char *name, mr_keyring *out, mr_err *err);
/* The text mr_keyring_save writes (malloc'd, ends with a newline), or NULL when out of memory. */
char *mr_keyring_dumps(const mr_keyring *kr);
int mr_keyring_save(const char *path, const mr_keyring *kr, mr_err *err);
void mr_keyring_free(mr_keyring *kr);
/* Records the identity (mtime, size, inode) of the file at path in kr. */
void mr_keyring_stat(const char *path, mr_keyring *kr);
/* True when the file at path differs (mtime, size or inode) from kr. */
bool mr_keyring_changed(const char *path, const mr_keyring *kr);

/* The entry whose hash matches key, or NULL. Constant time in the key. */
const mr_key *mr_keyring_find(const mr_keyring *kr, const char *key, size_t len);

/* Adds a fresh random key for tenant; writes the plaintext (NUL-terminated,
 * at most 63 chars) to key_out and the new entry's id to id_out. */
int mr_keyring_add(mr_keyring *kr, const char *tenant, int max_concurrency, char key_out[64], char id_out[32],
                   mr_err *err);
/* Disables the entry whose id is `which` (or whose key is `which`). */
int mr_keyring_disable(mr_keyring *kr, const char *which, mr_err *err);

/* `memra-gateway keys add|disable|list --keyring FILE ...`; returns the exit code. */
int mr_keys_cli(int argc, char **argv);

#endif
