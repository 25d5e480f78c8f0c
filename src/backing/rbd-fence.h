/* The rbd backing's watch over its image (rbd-fence.c): does this foliod
 * still own the image as it opened it?  Private to src/backing/rbd*.c. */
#ifndef FOLIOD_BACKING_RBD_FENCE_H
#define FOLIOD_BACKING_RBD_FENCE_H

#include <rbd/librbd.h>
#include <stdbool.h>
#include <stdint.h>

struct rbd_fence;

/* Watch image (open, its exclusive lock ours), named name in messages
 * (kept, not copied).  NULL with errno when it cannot (no thread). */
struct rbd_fence *rbd_fence_start (rbd_image_t image, const char *name,
                                   unsigned request_timeout_ms);
/* Why the image is no longer ours (sticky), or NULL. */
const char *rbd_fence_lost (struct rbd_fence *f);
/* 0 when ownership was confirmed within the lease (waiting for a check
 * after a stall, up to request-timeout); -1 with errno EIO (lost) or
 * ETIMEDOUT. */
int rbd_fence_confirm (struct rbd_fence *f);
/* A request ended with errno value err (ESHUTDOWN: librbd's
 * EBLOCKLISTED, this client was blocklisted). */
void rbd_fence_note_error (struct rbd_fence *f, int err);
/* foliod release gives the lock up on purpose (released), or failed to
 * and keeps it (!released): no checks while released. */
void rbd_fence_released (struct rbd_fence *f, bool released);
/* Stop watching, waiting for the check under way until end_ms
 * (now_ms()): 0 when stopped and freed; -1 when its check still waits
 * for the cluster (then it is left running, with the image: the caller
 * must not close the image). */
int rbd_fence_stop (struct rbd_fence *f, uint64_t end_ms);

#endif
