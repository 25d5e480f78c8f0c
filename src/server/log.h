/* Logging interface the server uses: the one log sink of every room,
 * include/foliod/log.h (src/util/log.c).  foliod_log() is thread-safe:
 * worker threads may call it. */
#ifndef FOLIOD_SERVER_LOG_H
#define FOLIOD_SERVER_LOG_H

#include "foliod/log.h"

#endif /* FOLIOD_SERVER_LOG_H */
