/* The ublk front end: an export's cache as a local block device,
 * /dev/ublkbN, through the kernel's ublk driver (ublk_drv, io_uring).
 *
 * Contract with the daemon (src/daemon/):
 *   - One struct ublk_set holds the daemon's devices.  Its calls are
 *     serialised by its own lock, so the control socket's thread and the
 *     main thread may both call them.
 *   - ublk_add and ublk_del block: they talk to /dev/ublk-control, and
 *     ublk_del waits for the kernel to drain the device's requests.
 *   - A device serves its export until ublk_del or ublk_set_free: call
 *     ublk_set_free before export_close of any export it serves.
 *   - Without the kernel driver (no /dev/ublk-control) ublk_add fails at
 *     once with a reason; nothing waits on a kernel that cannot answer.
 *   - A device outlives the process (user recovery): ublk_recover in the
 *     next foliod takes it back; ublk_set_detach lets go of all for an
 *     upgrade; ublk_del and ublk_set_free (SIGTERM) remove it.
 */
#ifndef FOLIOD_UBLK_H
#define FOLIOD_UBLK_H

#include <stdbool.h>
#include <stddef.h>

struct export;
struct ublk_set;

/* An empty set; NULL with errno when out of memory. */
struct ublk_set *ublk_set_new (void);

/* Serve e as a new /dev/ublkbN (the kernel picks N).  Returns N, or -1
 * with a one-line reason in err. */
int ublk_add (struct ublk_set *s, struct export *e, char *err, size_t errlen);

/* Re-attach the device a dead (or upgraded) foliod left for e: found by
 * the export's tag in the kernel's device list, it waits (QUIESCED) with
 * its requests; user recovery (START_USER_RECOVERY, the queues' fetches,
 * END_USER_RECOVERY) hands them to this process.  Returns N, or -1 with a
 * reason in err and errno ENOENT when no device of e waits (nor a driver
 * is loaded), another error number otherwise (a device that cannot be
 * recovered: made without user recovery, or served by a live process).
 * Waits 10 s at most for a dying server to let go. */
int ublk_recover (struct ublk_set *s, struct export *e, char *err,
                  size_t errlen);

/* Let go of every device without removing it (foliod upgrade): queue
 * threads answer what workers hold, then leave; /dev/ublkcN is closed
 * and the kernel queues I/O until a new process recovers the device.
 * false (nothing done) when a device was made without user recovery. */
bool ublk_set_detach (struct ublk_set *s);

/* Were all devices made with user recovery (can they be detached)? */
bool ublk_set_recoverable (struct ublk_set *s);

/* Remove /dev/ublkbN.  A device that is mounted or held open exclusively
 * is refused (EBUSY, said in err) unless force: then the kernel fails
 * the holder's later I/O.  What was written to it stays in the export's
 * cache either way.  0, or -1 with a reason in err. */
int ublk_del (struct ublk_set *s, int id, bool force, char *err,
              size_t errlen);

/* "ublkbN EXPORT\n" per device into buf (cut to len - 1); the length. */
size_t ublk_list (struct ublk_set *s, char *buf, size_t len);

/* Does a device serve e? */
bool ublk_serves (struct ublk_set *s, const struct export *e);

/* Remove every device (forced), then free the set.  NULL is a no-op. */
void ublk_set_free (struct ublk_set *s);

#endif /* FOLIOD_UBLK_H */
