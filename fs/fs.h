/* The FUSE tree of atlas (DESIGN §2): session directories, ctl/ and README,
 * served through the low-level libfuse3 API on top of the engine's public API.
 *
 * Lifetime, as atlasd drives it:
 *
 *     atlas_fs_open        sessions s1..sN, the waker thread, the engine's notify hook
 *     atlas_fs_mount       the FUSE session and the mount
 *     atlas_fs_loop        serve until unmounted or a signal ends the session
 *     atlas_fs_stop        end parked reads, close every engine session
 *     atlas_fs_unmount
 *     atlas_engine_close   (the engine may still call the notify hook until here)
 *     atlas_fs_free
 */
#ifndef ATLAS_FS_FS_H
#define ATLAS_FS_FS_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"

struct atlas_engine;
struct atlas_fs;
struct fuse_args;
struct fuse_cmdline_opts;
struct fuse_session;

/* Serve engine e with the effective configuration cfg (copied: ctl/config
 * and README show it). Opens the session directories s1..s<cfg->sessions>. */
int atlas_fs_open(struct atlas_engine *e, const struct atlas_config *cfg, struct atlas_fs **out,
		  char *err, size_t errlen);

/* Create the FUSE session from args (FUSE's own options; allow_other and
 * default_permissions are added from the config) and mount it. */
int atlas_fs_mount(struct atlas_fs *fs, struct fuse_args *args, const char *mountpoint,
		   char *err, size_t errlen);

/* The FUSE session, for fuse_set_signal_handlers(); NULL before the mount. */
struct fuse_session *atlas_fs_fuse_session(struct atlas_fs *fs);

/* Serve requests until the filesystem is unmounted or the session exits (a
 * signal), as fuse_parse_cmdline's options say: -s serves from the calling
 * thread, else worker threads (max_threads, max_idle_threads, clone_fd).
 * A lazy unmount (umount -l) ends it too, even while files of the mount are
 * open: a watcher thread then sends SIGTERM to the calling thread, whose
 * handler must be libfuse's (fuse_set_signal_handlers). Returns 0 on a
 * clean end, a negative errno otherwise. */
int atlas_fs_loop(struct atlas_fs *fs, const struct fuse_cmdline_opts *opts);

/* After the loop: answer parked reads (ECANCELED), stop the waker thread and
 * close every engine session, so that the engine can be closed. */
void atlas_fs_stop(struct atlas_fs *fs);

/* After atlas_fs_stop: unmount. A mount that an outside or lazy unmount
 * removed is served a while longer instead (the close of its open files
 * waits for this process) and is not unmounted again. */
void atlas_fs_unmount(struct atlas_fs *fs);

/* Free everything; the engine must be closed (it calls back into fs). */
void atlas_fs_free(struct atlas_fs *fs);

#endif
