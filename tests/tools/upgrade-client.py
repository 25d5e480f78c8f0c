# One NBD connection that writes and reads a verified pattern without a
# pause while foliod is upgraded under it (tests/test-daemon-upgrade.sh).
#
#   upgrade-client.py SOCKET IMAGE WRITE_BYTES STOPFILE EXPECT
#
# Batches of 4 writes (into the first WRITE_BYTES of the export) and 4
# reads (anywhere) in flight at once; every read is checked against what
# was written, or IMAGE's original bytes.  Until STOPFILE exists; then
# FLUSH, read the whole export back and check it, write the expected
# image to EXPECT and print "ok OPS MAXGAP_MS INODE_SAME".  Any error
# (a failed request, a closed connection, a wrong byte) is printed and
# the exit status is 1.  The longest time between two batches is the
# stall the client saw.
import os
import random
import struct
import sys
import time

import nbd

BS = 16384
sock, image, write_bytes, stopfile, expect = sys.argv[1:6]
write_blocks = int(write_bytes) // BS
data = bytearray(open(image, "rb").read())
nblocks = len(data) // BS
seq = 0


def pattern(b, s):
    return struct.pack("<QQ", b, s) * (BS // 16)


def wait_all(h, cookies):
    # aio_command_completed retires a command: ask once per cookie.
    left = list(cookies)
    while left:
        left = [c for c in left if not h.aio_command_completed(c)]
        if left:
            h.poll(-1)


h = nbd.NBD()
h.set_export_name("disk0")
h.connect_unix(sock)
ino = os.fstat(h.aio_get_fd()).st_ino
ops = 0
maxgap = 0.0
last = time.monotonic()
rnd = random.Random(1)
# The read buffers are reused: libnbd 1.14's Python binding keeps every
# nbd.Buffer given to aio_pread alive (16 KiB a read), and 1000 upgrades
# in make check-crash make 1.6 million of them: 20 GB, OOM-killed.
rbufs = [nbd.Buffer(BS) for _ in range(4)]
try:
    while not os.path.exists(stopfile):
        wblocks = rnd.sample(range(write_blocks), 4)
        rblocks = [b for b in rnd.sample(range(nblocks), 8)
                   if b not in wblocks][:4]
        cookies, reads = [], []
        for b in wblocks:
            seq += 1
            buf = pattern(b, seq)
            data[b * BS:(b + 1) * BS] = buf
            cookies.append(h.aio_pwrite(buf, b * BS))
        for b, rb in zip(rblocks, rbufs):
            cookies.append(h.aio_pread(rb, b * BS))
            reads.append((b, rb))
        wait_all(h, cookies)
        for b, rb in reads:
            if rb.to_bytearray() != data[b * BS:(b + 1) * BS]:
                raise RuntimeError("block %d: wrong data" % b)
        ops += len(cookies)
        now = time.monotonic()
        maxgap = max(maxgap, now - last)
        last = now
    h.flush()
    for b in range(nblocks):
        if h.pread(BS, b * BS) != data[b * BS:(b + 1) * BS]:
            raise RuntimeError("final read back: block %d: wrong data" % b)
    same = os.fstat(h.aio_get_fd()).st_ino == ino
    h.shutdown()
except Exception as e:  # noqa: BLE001 - any failure is the test's verdict
    print("ERROR after %d requests: %s" % (ops, e))
    sys.exit(1)
open(expect, "wb").write(data)
print("ok %d %.1f %s" % (ops, maxgap * 1000, "same-socket" if same else
                         "OTHER-SOCKET"))
