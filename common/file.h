/* Whole-file reading for the command-line programs and tests. */
#ifndef MR_FILE_H
#define MR_FILE_H

#include <stddef.h>

#include "common/err.h"

/* Reads the file at path into a malloc'd buffer with a NUL after the end
 * (not counted in *len).  NULL with err set ("PATH: unable to open: reason",
 * "PATH: reason") when it cannot be opened or read, or memory runs out. */
char *mr_file_read(const char *path, size_t *len, mr_err *err);
/* The same, refusing a file of more than max bytes ("PATH: larger than
 * max bytes"): for files a server rereads, which must not eat its memory. */
char *mr_file_read_max(const char *path, size_t max, size_t *len, mr_err *err);

#endif
