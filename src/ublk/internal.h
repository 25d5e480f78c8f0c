/* The ublk front end's insides (see ublk.h for its contract).
 *
 * Threads: each queue has one thread (ubq_daemon in the kernel's words:
 * the only task that may issue that queue's FETCH and COMMIT commands)
 * with its own io_uring.  It answers what the cache can answer without
 * waiting (CACHE_NOWAIT, as the NBD server's loops do) and hands the rest
 * (misses, FUA, FLUSH, DISCARD, WRITE_ZEROES, large copies) to the
 * device's few workers; a worker puts its answer on the queue's done
 * list and wakes the queue through an eventfd that the ring reads, and
 * the queue thread commits it.  Lock order: set lock, then a device's
 * work lock or a queue's done lock (never both).
 */
#ifndef FOLIOD_UBLK_INTERNAL_H
#define FOLIOD_UBLK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <linux/ublk_cmd.h>

/* Debian 12's linux-libc-dev (6.1) has the commands only in their first
 * (plain number) form; a kernel built without
 * CONFIG_BLKDEV_UBLK_LEGACY_OPCODES takes only the ioctl-encoded ones
 * (Linux 6.4 and later), which foliod uses. */
#ifndef UBLK_U_CMD_ADD_DEV
#define UBLK_U_CMD_ADD_DEV     _IOWR ('u', UBLK_CMD_ADD_DEV, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_DEL_DEV     _IOWR ('u', UBLK_CMD_DEL_DEV, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_START_DEV   _IOWR ('u', UBLK_CMD_START_DEV, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_STOP_DEV    _IOWR ('u', UBLK_CMD_STOP_DEV, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_SET_PARAMS  _IOWR ('u', UBLK_CMD_SET_PARAMS, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_GET_DEV_INFO _IOR ('u', UBLK_CMD_GET_DEV_INFO, struct ublksrv_ctrl_cmd)
#define UBLK_U_IO_FETCH_REQ    _IOWR ('u', UBLK_IO_FETCH_REQ, struct ublksrv_io_cmd)
#define UBLK_U_IO_COMMIT_AND_FETCH_REQ \
  _IOWR ('u', UBLK_IO_COMMIT_AND_FETCH_REQ, struct ublksrv_io_cmd)
#endif
#ifndef UBLK_F_CMD_IOCTL_ENCODE
#define UBLK_F_CMD_IOCTL_ENCODE (1ULL << 6)
#endif
/* User recovery (Linux 6.0; foliod asks for it on 6.4 and later): a
 * device whose server dies waits (QUIESCED) for a new one, which
 * re-attaches with START_USER_RECOVERY, its fetches, END_USER_RECOVERY. */
#ifndef UBLK_F_USER_RECOVERY
#define UBLK_F_USER_RECOVERY (1ULL << 3)
#define UBLK_F_USER_RECOVERY_REISSUE (1ULL << 4)
#endif
#ifndef UBLK_U_CMD_START_USER_RECOVERY
#define UBLK_U_CMD_START_USER_RECOVERY \
  _IOWR ('u', 0x10, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_END_USER_RECOVERY \
  _IOWR ('u', 0x11, struct ublksrv_ctrl_cmd)
#endif
#ifndef UBLK_S_DEV_QUIESCED
#define UBLK_S_DEV_QUIESCED 2
#endif

#define UBLK_CONTROL_PATH  "/dev/ublk-control"
#define UBLK_QUEUE_DEPTH   64u   /* tags per queue */
#define UBLK_QUEUES_MAX    4u    /* queues (threads) per device */
#define UBLK_WORKERS       4u    /* blocking workers per device */
#define UBLK_INLINE_MAX    (1u << 20) /* larger copies: a worker */
#define UBLK_READY_WAIT_MS 10000u /* a queue thread's set-up, at most */
#define UBLK_JOIN_WARN_S 10u /* a stopping thread not gone: say so */
#define UBLK_RECOVER_WAIT_MS 10000u /* for a dead server's device to quiesce */

struct cache;
struct export;
struct ublk_dev;

/* One tag of a queue: its buffer and, while a worker has it, its link. */
struct ublk_io {
  struct ublk_queue *q;
  uint16_t tag;
  int result;                 /* bytes, or -errno: what COMMIT says */
  void *buf;                  /* max_io bytes, the kernel copies through */
  struct ublk_io *next;       /* on the work list or a done list */
};

struct ublk_queue {
  struct ublk_dev *dev;
  uint16_t id;
  pthread_t thread;
  bool started;
  int efd;                    /* eventfd: a worker finished a tag */
  struct ublksrv_io_desc *descs; /* the kernel's, read-only mapping */
  size_t descs_len;
  struct ublk_io *ios;        /* depth of them */
  void *bufs;                 /* depth * max_io bytes, one mapping */
  size_t bufs_len;
  pthread_mutex_t done_lock;
  struct ublk_io *done;       /* finished by workers, to commit */
  atomic_bool stop;           /* leave the loop; requests that arrive
                               * from now on are left to the kernel (a
                               * detach: requeued for the next server;
                               * after STOP_DEV none arrive) */
  atomic_uint at_workers;     /* the thread's count, for the log */
  atomic_uint left;           /* requests left unanswered at the stop */
  /* Set-up result for ublk_add: 0 running (every tag fetched), >0 an
   * error number; -1 not yet.  Under the device's work lock. */
  int ready;
};

struct ublk_dev {
  int id;                     /* N of /dev/ublkbN and /dev/ublkcN */
  struct export *exp;
  int cdev_fd;                /* /dev/ublkcN */
  bool recoverable;           /* the kernel took UBLK_F_USER_RECOVERY */
  unsigned nr_queues, depth;
  uint32_t max_io;            /* bytes: one request at most, a tag's buffer */
  struct ublk_queue q[UBLK_QUEUES_MAX];
  pthread_mutex_t work_lock;
  pthread_cond_t work_cond;   /* work arrived, stop, or a queue is ready */
  struct ublk_io *work, **work_tail;
  bool workers_stop;
  atomic_uint busy;           /* workers inside ublk_exec, for the log */
  pthread_t workers[UBLK_WORKERS];
  unsigned nworkers;
  struct ublk_dev *next;      /* in the set */
};

/* ctrl.c: one command to /dev/ublk-control (its own small ring; the
 * command's reply is waited for).  Returns the kernel's result: >= 0, or
 * -errno. */
int ublk_ctrl_cmd (int ctrl_fd, uint32_t op, uint32_t dev_id, void *buf,
                   uint16_t len, uint64_t data0);

/* exec.c: one request on the cache.  With nowait, only what needs no
 * waiting runs; -EAGAIN says "give it to a worker".  Returns bytes
 * done (READ, WRITE), 0 (the others), or -errno. */
int ublk_exec (struct export *e, const struct ublksrv_io_desc *iod,
               void *buf, bool nowait);

/* queue.c: start queue q's thread (it maps the descriptors, fetches every
 * tag and says so in q->ready), and its end: stop asks the thread to
 * leave once the kernel has given every tag back or aborted it, join
 * waits for it and frees what it had.  Workers: start and stop. */
int ublk_queue_start (struct ublk_dev *d, unsigned qid);
void ublk_queue_stop (struct ublk_queue *q);
void ublk_queue_join (struct ublk_queue *q);
int ublk_workers_start (struct ublk_dev *d);
void ublk_workers_stop (struct ublk_dev *d);

#endif /* FOLIOD_UBLK_INTERNAL_H */
