/* Opening the files atlas reads (a model's weights, JSON and templates, the
 * config file) without blocking on what is not a file: open(2) of a FIFO
 * waits for a writer forever, so a FIFO or a device named where a file
 * belongs would hang a load. These open without blocking, refuse anything
 * but a regular file (symbolic links to one are followed) and then read as
 * usual.
 */
#ifndef ATLAS_COMMON_FILE_H
#define ATLAS_COMMON_FILE_H

#include <stddef.h>
#include <stdio.h>

/* A descriptor of the regular file at path, opened read-only (O_CLOEXEC),
 * or a negative errno: -EINVAL for a file that is not regular, with the
 * reason in err. */
int file_open_regular(const char *path, char *err, size_t errlen);

/* The same as a stdio stream ("r"), or NULL with errno set and err filled. */
FILE *file_fopen_regular(const char *path, char *err, size_t errlen);

#endif
