#!/bin/bash
# The kill -9 loop of tests/test-pmem-kill.sh on the SSD log store
# (store=ssd:PATH, issue 25): every write that a FLUSH or FUA made durable
# reads back after each kill, and the backing equals the model after the
# last SIGTERM.  SSD_KILL_ROUNDS rounds (100; make check-crash: ROUNDS,
# 1000), PMEM_KILL_SEED=N replays a seed.
STORE=ssd PMEM_KILL_ROUNDS=${SSD_KILL_ROUNDS:-100} \
  exec "$(dirname "$0")/test-pmem-kill.sh"
