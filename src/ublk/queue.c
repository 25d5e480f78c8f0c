/* A ublk queue's thread and the device's workers.
 *
 * The queue thread owns its io_uring: it alone may issue the queue's
 * FETCH_REQ and COMMIT_AND_FETCH_REQ (the kernel checks the task).  At
 * start it fetches every tag, each with its buffer; a completion with
 * UBLK_IO_RES_OK is a request whose descriptor (descs[tag]) the kernel
 * filled and, for a write, whose data it copied into the tag's buffer.
 * The answer goes back with COMMIT_AND_FETCH_REQ, which also fetches the
 * tag's next request; for a read the kernel copies the buffer out then.
 * UBLK_IO_RES_ABORT says the device is going: the tag is not fetched
 * again.  One extra read on the eventfd (user_data EVENT_TAG) wakes the
 * thread for the workers' answers and for ublk_queue_stop.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <liburing.h>

#include "foliod/export.h"
#include "foliod/lock.h"
#include "foliod/log.h"
#include "foliod/util.h"
#include "ublk/internal.h"

#define EVENT_TAG ((uint64_t) 1 << 32)

/* The thread's view: its ring and what it counts. */
struct qrun {
  struct ublk_queue *q;
  struct io_uring ring;
  uint64_t efd_val;           /* the eventfd read's target */
  unsigned fetched;           /* tags the kernel holds a FETCH of */
  unsigned at_workers;        /* tags a worker has */
};

/* The next SQE, submitting what is queued when the ring is full (it holds
 * depth + 1 commands at most, one per tag and the eventfd read, so one
 * submit always makes room). */
static struct io_uring_sqe *
q_sqe (struct qrun *qr)
{
  struct io_uring_sqe *sqe = io_uring_get_sqe (&qr->ring);

  if (sqe == NULL) {
    io_uring_submit (&qr->ring);
    sqe = io_uring_get_sqe (&qr->ring);
  }
  if (sqe == NULL)
    abort ();                   /* more commands than tags + 1: a bug */
  return sqe;
}

static void
q_io_cmd (struct qrun *qr, uint32_t op, struct ublk_io *io)
{
  struct io_uring_sqe *sqe = q_sqe (qr);
  struct ublksrv_io_cmd *cmd;

  memset (sqe, 0, 2 * sizeof *sqe);
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = qr->q->dev->cdev_fd;
  sqe->cmd_op = op;
  cmd = (struct ublksrv_io_cmd *) sqe->cmd;
  cmd->q_id = qr->q->id;
  cmd->tag = io->tag;
  cmd->result = io->result;
  cmd->addr = (uint64_t) (uintptr_t) io->buf;
  io_uring_sqe_set_data64 (sqe, io->tag);
  qr->fetched++;
}

static void
q_arm_event (struct qrun *qr)
{
  struct io_uring_sqe *sqe = q_sqe (qr);

  io_uring_prep_read (sqe, qr->q->efd, &qr->efd_val, sizeof qr->efd_val, 0);
  io_uring_sqe_set_data64 (sqe, EVENT_TAG);
}

/* Hand io to the device's workers. */
static void
q_to_worker (struct qrun *qr, struct ublk_io *io)
{
  struct ublk_dev *d = qr->q->dev;

  qr->at_workers++;
  io->next = NULL;
  lock_or_die (&d->work_lock);
  *d->work_tail = io;
  d->work_tail = &io->next;
  pthread_cond_signal (&d->work_cond);
  unlock_or_die (&d->work_lock);
}

/* A request arrived on io's tag: answer it here or give it away. */
static void
q_request (struct qrun *qr, struct ublk_io *io)
{
  struct ublk_dev *d = qr->q->dev;
  const struct ublksrv_io_desc *iod = &qr->q->descs[io->tag];
  int r = ublk_exec (d->exp, iod, io->buf, true);

  if (r == -EAGAIN) {
    q_to_worker (qr, io);
    return;
  }
  io->result = r;
  q_io_cmd (qr, UBLK_U_IO_COMMIT_AND_FETCH_REQ, io);
}

/* Commit what the workers finished. */
static void
q_take_done (struct qrun *qr)
{
  struct ublk_queue *q = qr->q;
  struct ublk_io *io;

  lock_or_die (&q->done_lock);
  io = q->done;
  q->done = NULL;
  unlock_or_die (&q->done_lock);
  while (io) {
    struct ublk_io *next = io->next;
    qr->at_workers--;
    q_io_cmd (qr, UBLK_U_IO_COMMIT_AND_FETCH_REQ, io);
    io = next;
  }
}

static void
q_cqe (struct qrun *qr, const struct io_uring_cqe *cqe)
{
  uint64_t tag = io_uring_cqe_get_data64 (cqe);

  if (tag == EVENT_TAG) {
    q_take_done (qr);
    /* Stopping, the thread still waits for what workers hold: their
     * answers come through the eventfd. */
    if (!atomic_load (&qr->q->stop) || qr->at_workers > 0)
      q_arm_event (qr);
    return;
  }
  qr->fetched--;
  if (cqe->res == UBLK_IO_RES_OK && atomic_load (&qr->q->stop)) {
    /* Stopping: not taken.  Its tag goes unanswered; when the ring
     * closes the kernel requeues the request (REISSUE) for the next
     * server.  Taking it would let a steady writer keep this thread
     * (and a detach waiting for it) busy for as long as it writes. */
    atomic_fetch_add (&qr->q->left, 1);
    return;
  }
  if (cqe->res == UBLK_IO_RES_OK) {
    q_request (qr, &qr->q->ios[tag]);
    return;
  }
  if (cqe->res != UBLK_IO_RES_ABORT)
    log_error ("ublk%d queue %u tag %u: %s", qr->q->dev->id, qr->q->id,
               (unsigned) tag, strerror (-cqe->res));
}

/* Map the descriptors, fetch every tag, arm the eventfd.  0 or an error
 * number. */
static int
q_setup (struct qrun *qr)
{
  struct ublk_queue *q = qr->q;
  struct ublk_dev *d = q->dev;
  size_t page = (size_t) sysconf (_SC_PAGESIZE);
  off_t off = UBLKSRV_CMD_BUF_OFFSET +
    (off_t) q->id * UBLK_MAX_QUEUE_DEPTH * sizeof (struct ublksrv_io_desc);
  int r;

  q->descs_len = (d->depth * sizeof (struct ublksrv_io_desc) + page - 1)
    & ~(page - 1);
  q->descs = mmap (NULL, q->descs_len, PROT_READ, MAP_SHARED | MAP_POPULATE,
                   d->cdev_fd, off);
  if (q->descs == MAP_FAILED) {
    q->descs = NULL;
    return errno;
  }
  r = io_uring_queue_init (d->depth + 1, &qr->ring, IORING_SETUP_SQE128);
  if (r < 0)
    return -r;
  for (unsigned t = 0; t < d->depth; t++) {
    q->ios[t].result = 0;
    q_io_cmd (qr, UBLK_U_IO_FETCH_REQ, &q->ios[t]);
  }
  q_arm_event (qr);
  r = io_uring_submit (&qr->ring);
  if (r < 0) {
    io_uring_queue_exit (&qr->ring);
    return -r;
  }
  return 0;
}

static void
q_set_ready (struct ublk_queue *q, int ready)
{
  lock_or_die (&q->dev->work_lock);
  q->ready = ready;
  pthread_cond_broadcast (&q->dev->work_cond);
  unlock_or_die (&q->dev->work_lock);
}

static void *
q_thread (void *arg)
{
  struct qrun qr = { .q = arg };
  struct ublk_queue *q = qr.q;
  int err = q_setup (&qr);

  q_set_ready (q, err);
  if (err)
    return NULL;
  /* Leave when stopped and no worker holds a tag (its answer would be
   * lost: the kernel drained the device before STOP_DEV returned, so
   * none should), or when the kernel holds no tag any more. */
  while (!(atomic_load (&q->stop) && qr.at_workers == 0) &&
         (qr.fetched > 0 || qr.at_workers > 0)) {
    struct io_uring_cqe *cqe;
    unsigned head, n = 0;
    int r = io_uring_submit_and_wait (&qr.ring, 1);

    if (r < 0 && r != -EINTR && r != -EBUSY) {
      log_error ("ublk%d queue %u: io_uring: %s", q->dev->id, q->id,
                 strerror (-r));
      break;
    }
    io_uring_for_each_cqe (&qr.ring, head, cqe) {
      q_cqe (&qr, cqe);
      n++;
    }
    io_uring_cq_advance (&qr.ring, n);
    atomic_store (&q->at_workers, qr.at_workers);
  }
  /* The answers of the last tags the workers gave back, then: closing
   * the ring cancels the fetches the kernel still holds. */
  io_uring_submit (&qr.ring);
  io_uring_queue_exit (&qr.ring);
  return NULL;
}

int
ublk_queue_start (struct ublk_dev *d, unsigned qid)
{
  struct ublk_queue *q = &d->q[qid];
  int err;

  q->dev = d;
  q->id = (uint16_t) qid;
  q->ready = -1;
  q->efd = eventfd (0, EFD_CLOEXEC);
  if (q->efd < 0)
    return errno;
  pthread_mutex_init (&q->done_lock, NULL);
  q->ios = calloc (d->depth, sizeof *q->ios);
  q->bufs_len = (size_t) d->depth * d->max_io;
  /* Touched only as far as requests go: large but mostly never backed. */
  q->bufs = mmap (NULL, q->bufs_len, PROT_READ | PROT_WRITE,
                  // cppcheck-suppress invalidFunctionArg ; MAP_ANONYMOUS: fd -1
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (q->ios == NULL || q->bufs == MAP_FAILED) {
    q->bufs = q->bufs == MAP_FAILED ? NULL : q->bufs;
    return ENOMEM;
  }
  for (unsigned t = 0; t < d->depth; t++) {
    q->ios[t].q = q;
    q->ios[t].tag = (uint16_t) t;
    q->ios[t].buf = (char *) q->bufs + (size_t) t * d->max_io;
  }
  err = thread_start (&q->thread, q_thread, q, "ublk%d/q%u", d->id, qid);
  q->started = err == 0;
  return err;
}

void
ublk_queue_stop (struct ublk_queue *q)
{
  uint64_t one = 1;

  if (!q->started)
    return;
  atomic_store (&q->stop, true);
  if (write (q->efd, &one, sizeof one) != sizeof one)
    log_warn ("ublk%d queue %u: cannot wake: %m", q->dev->id, q->id);
}

/* pthread_join, saying every UBLK_JOIN_WARN_S what it waits for: a
 * thread that does not stop holds up a stop, a ublk del or an upgrade,
 * and the log must say which. */
static void
join_watched (pthread_t t, int dev, const char *what, unsigned n,
              const atomic_uint *busy)
{
  struct timespec ts;
  unsigned waited = 0;

  for (;;) {
    clock_gettime (CLOCK_REALTIME, &ts);
    ts.tv_sec += UBLK_JOIN_WARN_S;
    if (pthread_timedjoin_np (t, NULL, &ts) != ETIMEDOUT)
      return;
    waited += UBLK_JOIN_WARN_S;
    log_warn ("ublk%d: %s %u has not stopped after %u s (%u request%s "
              "at its workers)", dev, what, n, waited, atomic_load (busy),
              atomic_load (busy) == 1 ? "" : "s");
  }
}

void
ublk_queue_join (struct ublk_queue *q)
{
  if (q->started)
    join_watched (q->thread, q->dev->id, "queue", q->id, &q->at_workers);
  q->started = false;
  if (q->descs)
    munmap (q->descs, q->descs_len);
  if (q->bufs)
    munmap (q->bufs, q->bufs_len);
  if (q->efd >= 0)
    close (q->efd);
  free (q->ios);
  q->descs = q->bufs = NULL;
  q->ios = NULL;
  q->efd = -1;
}

/* ---- workers ----------------------------------------------------------- */

static void
worker_done (struct ublk_io *io)
{
  struct ublk_queue *q = io->q;
  uint64_t one = 1;

  lock_or_die (&q->done_lock);
  io->next = q->done;
  q->done = io;
  unlock_or_die (&q->done_lock);
  if (write (q->efd, &one, sizeof one) != sizeof one)
    log_error ("ublk%d queue %u: cannot wake: %m", q->dev->id, q->id);
}

static void *
worker_thread (void *arg)
{
  struct ublk_dev *d = arg;

  lock_or_die (&d->work_lock);
  for (;;) {
    struct ublk_io *io = d->work;
    if (io == NULL) {
      if (d->workers_stop)
        break;
      pthread_cond_wait (&d->work_cond, &d->work_lock);
      continue;
    }
    d->work = io->next;
    if (d->work == NULL)
      d->work_tail = &d->work;
    unlock_or_die (&d->work_lock);
    atomic_fetch_add (&d->busy, 1);
    io->result = ublk_exec (d->exp, &io->q->descs[io->tag], io->buf, false);
    atomic_fetch_sub (&d->busy, 1);
    worker_done (io);
    lock_or_die (&d->work_lock);
  }
  unlock_or_die (&d->work_lock);
  return NULL;
}

int
ublk_workers_start (struct ublk_dev *d)
{
  d->work = NULL;
  d->work_tail = &d->work;
  for (; d->nworkers < UBLK_WORKERS; d->nworkers++) {
    int err = thread_start (&d->workers[d->nworkers], worker_thread, d,
                            "ublk%d/w%u", d->id, d->nworkers);
    if (err)
      return err;
  }
  return 0;
}

void
ublk_workers_stop (struct ublk_dev *d)
{
  lock_or_die (&d->work_lock);
  d->workers_stop = true;
  pthread_cond_broadcast (&d->work_cond);
  unlock_or_die (&d->work_lock);
  for (unsigned i = 0; i < d->nworkers; i++)
    join_watched (d->workers[i], d->id, "worker", i, &d->busy);
  d->nworkers = 0;
}
