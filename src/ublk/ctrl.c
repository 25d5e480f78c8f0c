/* Commands to /dev/ublk-control: ADD_DEV, SET_PARAMS, START_DEV,
 * STOP_DEV, DEL_DEV.  Each is an io_uring URING_CMD whose 32-byte
 * argument (struct ublksrv_ctrl_cmd) needs 128-byte SQEs; the control
 * path is rare, so each command gets a ring of its own and waits for its
 * one completion.  The kernel runs these commands in the submitting
 * call: START_DEV returns once every queue has fetched its tags (the
 * caller makes sure they have), DEL_DEV once nobody holds /dev/ublkcN.
 */
#include <errno.h>
#include <string.h>

#include <liburing.h>

#include "ublk/internal.h"

int
ublk_ctrl_cmd (int ctrl_fd, uint32_t op, uint32_t dev_id, void *buf,
               uint16_t len, uint64_t data0)
{
  struct io_uring ring;
  struct io_uring_sqe *sqe;
  struct io_uring_cqe *cqe;
  struct ublksrv_ctrl_cmd *cmd;
  int r;

  r = io_uring_queue_init (4, &ring, IORING_SETUP_SQE128);
  if (r < 0)
    return r;
  sqe = io_uring_get_sqe (&ring);
  if (sqe == NULL) {            /* a fresh ring of 4: never */
    io_uring_queue_exit (&ring);
    return -EBUSY;
  }
  memset (sqe, 0, 2 * sizeof *sqe); /* the 128-byte SQE */
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = ctrl_fd;
  sqe->cmd_op = op;
  cmd = (struct ublksrv_ctrl_cmd *) sqe->cmd;
  cmd->dev_id = dev_id;
  cmd->queue_id = (uint16_t) -1;
  cmd->addr = (uint64_t) (uintptr_t) buf;
  cmd->len = len;
  cmd->data[0] = data0;
  r = io_uring_submit (&ring);
  if (r >= 0) {
    do
      r = io_uring_wait_cqe (&ring, &cqe);
    while (r == -EINTR);
    if (r == 0) {
      r = cqe->res;
      io_uring_cqe_seen (&ring, cqe);
    }
  }
  io_uring_queue_exit (&ring);
  return r;
}
