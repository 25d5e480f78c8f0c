#!/usr/bin/python3
"""Randomized mixed cached/direct I/O against a reference (issue 6).

usage: mixed-io.py URI BACKING_FILE [--seed N] [--rounds N] [--conns N]
                   [--threshold BYTES] [--block BYTES] [--no-trim]

Several connections to the same export.  Each round picks a handful of
requests whose byte ranges do not overlap (so the result is defined) but
may share folios and blocks: writes small and large (below and above the
direct threshold), aligned and not, sometimes with FUA; reads; zeroes;
trims.  Every connection sends its share asynchronously, all connections at
once (one thread each), so cached and direct requests really interleave on
neighbouring bytes.  Every read must equal the reference.  Every few rounds
a FLUSH on one connection, then the BACKING FILE (read directly, not through
the server) must equal the reference, and a whole-export read through one
of the connections (small or large requests) too.  With --through the
backing file must equal the reference after every round, flush or not.

Trim: the server trims whole blocks only (--block) and the backing file
punches holes, so the reference zeroes the whole blocks inside the range.

Exit 0 on success; on a mismatch prints the seed, the round and the first
differing offset, and exits 1.
"""
import argparse
import os
import random
import sys
import threading

import nbd


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("uri")
    p.add_argument("backing")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--conns", type=int, default=4)
    p.add_argument("--threshold", type=int, default=65536)
    p.add_argument("--block", type=int, default=4096)
    p.add_argument("--flush-every", type=int, default=15)
    p.add_argument("--no-trim", action="store_true")
    p.add_argument("--through", action="store_true",
                   help="writes reach the backing before the reply: check "
                        "the backing file after every round, not only "
                        "after flushes (cache=writethrough, cache=none)")
    return p.parse_args()


class Mismatch(Exception):
    pass


def first_diff(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Run:
    def __init__(self, a):
        self.a = a
        self.seed = a.seed if a.seed is not None else random.randrange(1 << 48)
        self.rng = random.Random(self.seed)
        self.handles = []
        for _ in range(a.conns):
            h = nbd.NBD()
            h.connect_uri(a.uri)
            self.handles.append(h)
        h0 = self.handles[0]
        self.size = h0.get_size()
        self.can_trim = h0.can_trim() and not a.no_trim
        self.can_fua = h0.can_fua()
        self.max_req = min(h0.get_block_size(nbd.SIZE_MAXIMUM) or (1 << 20),
                           4 * a.threshold, 1 << 20)
        with open(a.backing, "rb") as f:
            self.ref = bytearray(f.read())
        if len(self.ref) != self.size:
            raise SystemExit("backing is %d bytes, export %d"
                             % (len(self.ref), self.size))
        self.round = 0
        self.counts = {}
        self.nchecks = 0

    def say(self, msg):
        print("mixed-io: seed %d round %d: %s" % (self.seed, self.round, msg),
              file=sys.stderr)

    # ---- request generation -------------------------------------------
    def pick_len(self):
        r = self.rng
        t, blk = self.a.threshold, self.a.block
        kind = r.randrange(6)
        if kind == 0:                         # tiny, unaligned
            n = r.randint(1, 2 * blk)
        elif kind == 1:                       # whole blocks, cached
            n = blk * r.randint(1, max(1, t // blk - 1))
        elif kind == 2:                       # just below the threshold
            n = t - r.randint(1, blk)
        elif kind == 3:                       # exactly the threshold
            n = t
        elif kind == 4:                       # direct, aligned
            n = blk * r.randint(t // blk, self.max_req // blk)
        else:                                 # direct, unaligned
            n = r.randint(t, self.max_req)
        return max(1, min(n, self.max_req, self.size))

    def pick_off(self, n):
        r = self.rng
        blk = self.a.block
        choice = r.randrange(5)
        if choice == 0:                       # ends exactly at the export end
            return self.size - n
        off = r.randrange(0, self.size - n + 1)
        if choice <= 2:                       # block aligned
            off -= off % blk
        return off

    def make_round(self):
        """Non-overlapping requests, each given to a random connection."""
        taken = []
        reqs = []
        for _ in range(self.rng.randint(2, 8)):
            for _try in range(10):
                n = self.pick_len()
                off = self.pick_off(n)
                if all(off + n <= s or off >= e for s, e in taken):
                    break
            else:
                continue
            taken.append((off, off + n))
            kind = self.rng.choices(["write", "read", "zero", "trim"],
                                    [50, 35, 10, 5])[0]
            if kind == "trim" and not self.can_trim:
                kind = "zero"
            flags = 0
            if kind in ("write", "zero") and self.can_fua and \
               self.rng.random() < 0.2:
                flags = nbd.CMD_FLAG_FUA
            data = self.rng.randbytes(n) if kind == "write" else None
            reqs.append((self.rng.randrange(len(self.handles)), kind, off, n,
                         flags, data))
        return reqs

    # ---- execution ----------------------------------------------------
    def issue(self, h, reqs, results, errors):
        try:
            pending = []
            for i, (kind, off, n, flags, data) in reqs:
                if kind == "write":
                    buf = nbd.Buffer.from_bytearray(bytearray(data))
                    c = h.aio_pwrite(buf, off, flags=flags)
                elif kind == "read":
                    buf = nbd.Buffer(n)
                    c = h.aio_pread(buf, off)
                elif kind == "zero":
                    buf = None
                    c = h.aio_zero(n, off, flags=flags)
                else:
                    buf = None
                    c = h.aio_trim(n, off)
                pending.append((i, kind, c, buf))   # buf must outlive c
            while h.aio_in_flight() > 0:
                h.poll(-1)
            for i, kind, c, buf in pending:
                h.aio_command_completed(c)    # raises on a failed command
                if kind == "read":
                    results[i] = buf.to_bytearray()
        except Exception as e:                # reported by the main thread
            errors.append(e)

    def run_round(self):
        reqs = self.make_round()
        per = [[] for _ in self.handles]
        for i, (hi, kind, off, n, flags, data) in enumerate(reqs):
            per[hi].append((i, (kind, off, n, flags, data)))
            self.counts[kind] = self.counts.get(kind, 0) + 1
        results, errors = {}, []
        threads = [threading.Thread(target=self.issue,
                                    args=(self.handles[hi], per[hi], results,
                                          errors))
                   for hi in range(len(self.handles)) if per[hi]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.say("request failed: %s" % errors[0])
            raise Mismatch()
        # Reads saw the state before this round's writes (no overlap).
        for i, (hi, kind, off, n, flags, data) in enumerate(reqs):
            if kind == "read":
                got, want = results[i], self.ref[off:off + n]
                if got != want:
                    d = first_diff(got, want)
                    self.say("read of %d at %d (conn %d) differs at byte %d "
                             "(offset %d): got %#x want %#x"
                             % (n, off, hi, d, off + d, got[d], want[d]))
                    raise Mismatch()
        for hi, kind, off, n, flags, data in reqs:
            if kind == "write":
                self.ref[off:off + n] = data
            elif kind == "zero":
                self.ref[off:off + n] = bytes(n)
            elif kind == "trim":
                blk = self.a.block
                s = (off + blk - 1) // blk * blk
                e = off + n if off + n == self.size else (off + n) // blk * blk
                if s < e:
                    self.ref[s:e] = bytes(e - s)

    def check_backing(self):
        with open(self.a.backing, "rb") as f:
            disk = f.read()
        if disk != self.ref:
            d = first_diff(disk, self.ref)
            self.say("after flush the backing file differs at offset %d: "
                     "file %#x reference %#x"
                     % (d, disk[d] if d < len(disk) else -1,
                        self.ref[d] if d < len(self.ref) else -1))
            raise Mismatch()

    def check_reads(self):
        """Read everything back through one connection (a different one
        each time), in chunks below or above the threshold, aligned or not."""
        self.nchecks += 1
        hi = self.nchecks % len(self.handles)
        h = self.handles[hi]
        chunk = [self.a.threshold - 512, self.a.threshold,
                 self.a.threshold * 2 + 7, 3 * self.a.block][self.nchecks % 4]
        off = 0
        while off < self.size:
            n = min(chunk, self.size - off)
            got = h.pread(n, off)
            if got != self.ref[off:off + n]:
                d = first_diff(got, self.ref[off:off + n])
                self.say("whole read (conn %d, %d-byte reads) differs at "
                         "offset %d" % (hi, chunk, off + d))
                raise Mismatch()
            off += n

    def flush_and_check(self):
        self.handles[self.rng.randrange(len(self.handles))].flush()
        self.check_backing()
        self.check_reads()

    def main(self):
        for self.round in range(1, self.a.rounds + 1):
            self.run_round()
            if self.a.through:
                self.check_backing()
            if self.round % self.a.flush_every == 0:
                self.flush_and_check()
        self.flush_and_check()
        for h in self.handles:
            h.shutdown()
        print("mixed-io: seed %d, %d rounds, %s: ok" % (
            self.seed, self.a.rounds,
            " ".join("%s=%d" % kv for kv in sorted(self.counts.items()))))


if __name__ == "__main__":
    args = parse()
    run = Run(args)
    try:
        run.main()
    except Mismatch:
        sys.exit(1)
