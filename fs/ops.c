/* The FUSE operation table of the tree: every request the kernel can send
 * and the handler that answers it (declared in fs/internal.h), in one
 * constant table, and the connection settings negotiated at init.
 *
 * Operations left out get libfuse's default answer (ENOSYS, which the
 * kernel then stops asking for): no extended attributes, locks or
 * fallocate; a name that cannot be made is refused by the handlers below
 * with EACCES rather than ENOSYS. */
#include "fs/internal.h"

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	/* Every file is generated or streamed: the kernel must neither cache
	 * writes nor split a read of `out` into parallel requests. */
	conn->want &= ~(unsigned)(FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_ASYNC_DIO);
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
}

static const struct fuse_lowlevel_ops fs_ops = {
	.init = op_init,
	/* names, inodes and directories (nodes.c) */
	.lookup = fs_op_lookup,
	.forget = fs_op_forget,
	.forget_multi = fs_op_forget_multi,
	.getattr = fs_op_getattr,
	.setattr = fs_op_setattr,
	.opendir = fs_op_opendir,
	.readdir = fs_op_readdir,
	.releasedir = fs_op_releasedir,
	.access = fs_op_access,
	.mkdir = fs_op_mkdir,
	.rmdir = fs_op_rmdir,
	.unlink = fs_op_unlink,
	.create = fs_op_create,
	.mknod = fs_op_mknod,
	.symlink = fs_op_symlink,
	.link = fs_op_link,
	.rename = fs_op_rename,
	/* open files (files.c) */
	.open = fs_op_open,
	.read = fs_op_read,
	.write = fs_op_write,
	.flush = fs_op_flush,
	.release = fs_op_release,
	.poll = fs_op_poll,
};

struct fuse_session *fs_fuse_session_new(struct atlas_fs *fs, struct fuse_args *args)
{
	return fuse_session_new(args, &fs_ops, sizeof fs_ops, fs);
}
