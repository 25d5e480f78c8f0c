#!/usr/bin/python3
"""kill -9 loop: acknowledged writes survive foliod's death (issue 14).

usage: pmem-kill.py (--foliod PATH --export SPEC | --nbdkit-file)
                    --socket PATH --backing FILE
                    [--rounds N] [--seed N] [--log FILE] [--tscale N]
                    [--min-ms N] [--max-ms N] [--vary ,KEY=VALUE...]
                    [--before-start CMD] [--backing-cmd CMD]

Runs FOLIOD --foreground --unix SOCKET --export SPEC (export disk0 on
BACKING FILE, its store given in SPEC) and, per round: 2-4 libnbd clients
write random unaligned ranges (512 B - 256 KiB, log-uniform; some
4 KiB aligned), each at its own queue depth, some with FUA, some followed
by a FLUSH; after a random moment (--min-ms..--max-ms) foliod gets
SIGKILL; it is started again on the same store and the whole export is
read back and checked against the model:

  byte b may hold the data of a write W covering b unless an acknowledged
  write covering b was issued after W was acknowledged (W is then
  overwritten for sure); a write still in flight at the kill is never
  overwritten for sure (it may land later than anything); the content
  from before the round is allowed only when no acknowledged write covers
  b.  Anything else -- an acknowledged write missing, an overwritten one
  back, data never written to b -- is a failure.

With --flushed-only (a store that keeps only what FLUSH or FUA made
durable, as store=ssd: does; its memory dies with the process), read
"acknowledged" above as "durable": acknowledged with FUA, or acknowledged
before a FLUSH (on any connection) was issued whose reply came back.

"Issued" is taken before the request is handed to libnbd and
"acknowledged" when the reply has been read, so "issued after
acknowledged" in the driver implies it on the wire.  Write data are
slices of one seeded random pool at random positions, so that a block in
the wrong place or from the wrong write does not match.  What was read
back is the next round's "before".  After the last round foliod gets
SIGTERM, must exit 0, and the backing file must equal the model exactly.

Exit 0 on success; on a failure prints the seed, the round, the offset,
the bytes read and what was allowed there, and exits 1.  --seed replays
the random choices (round lengths, clients, ranges, data); the timing of
the threads is not reproducible.

A backing that is not a file (rbd:): --backing-cmd is a shell command
that copies its contents into FILE, run before FILE is read (at the start
and after SIGTERM); --before-start is one run before each start of foliod
(rbd: breaking the lock the killed foliod left behind).
"""
import argparse
import ctypes
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time

import nbd

POOL = 8 << 20                 # random data the writes are cut from
MIN_LEN, MAX_LEN = 512, 256 << 10
READ_CHUNK = 1 << 20

# Event order across threads: next() on a count is atomic under the GIL.
SEQ = itertools.count(1)


class Failure(Exception):
    pass


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--foliod")
    p.add_argument("--nbdkit-file", action="store_true",
                   help="serve BACKING with nbdkit's file plugin instead "
                        "(writes reach the page cache before the reply: "
                        "a control run of the model, it must pass)")
    p.add_argument("--socket", required=True)
    p.add_argument("--export", help="foliod's disk0=...,store=...")
    p.add_argument("--backing", required=True)
    p.add_argument("--vary", default="",
                   help="options appended to --export at about half of the "
                        "starts (chosen by the seed), e.g. a dirty-limit")
    p.add_argument("--flushed-only", action="store_true",
                   help="only FLUSHed and FUA writes must survive a kill")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--log", default=None, help="foliod's output (appended)")
    p.add_argument("--tscale", type=int, default=1, help="timeout factor")
    p.add_argument("--before-start", default=None)
    p.add_argument("--backing-cmd", default=None)
    p.add_argument("--min-ms", type=int, default=150)
    p.add_argument("--max-ms", type=int, default=700)
    return p.parse_args()


class Write:
    __slots__ = ("wid", "client", "off", "len", "pos", "fua",
                 "issue", "ack", "err", "err_seq")

    def __init__(self, wid, client, off, n, pos, fua):
        self.wid, self.client, self.off, self.len = wid, client, off, n
        self.pos, self.fua = pos, fua
        self.issue = next(SEQ)
        self.ack = None          # seq of the reply; None: no reply
        self.err = None          # errno of an error reply
        self.err_seq = None

    @property
    def end(self):
        return self.off + self.len

    def describe(self):
        if self.ack is not None:
            state = "acked at %d" % self.ack
        elif self.err is not None:
            state = "failed (errno %d) at %d" % (self.err, self.err_seq)
        else:
            state = "no reply"
        return ("write #%d (client %d%s) [%d, %d) issued at %d, %s"
                % (self.wid, self.client, ", FUA" if self.fua else "",
                   self.off, self.end, self.issue, state))


class Client(threading.Thread):
    """One connection writing until told to stop (or the server dies)."""

    def __init__(self, run, idx, h, rng):
        super().__init__(daemon=True)
        self.run_, self.idx, self.h, self.rng = run, idx, h, rng
        self.qd = rng.choice([1, 1, 2, 4, 8])
        self.flush_p = rng.choice([0.0, 0.05, 0.25])
        self.fua_p = rng.choice([0.0, 0.1]) if run.can_fua else 0.0
        self.inflight = 0
        self.writes = []
        self.flushes = []        # [issue, ack, err, err_seq]
        self.exc = None

    def pick(self):
        r, size = self.rng, self.run_.size
        n = int(MIN_LEN * 2 ** (r.random() * 9))   # 512 B .. 256 KiB
        n = min(max(n, MIN_LEN), MAX_LEN, size)
        off = r.randrange(0, size - n + 1)
        if r.random() < 0.25:                     # whole 4 KiB blocks
            off -= off % 4096
            n = max(4096, n - n % 4096)
            n = min(n, size - off)
        return off, n

    def write_done(self, w, err):
        if err.value:
            w.err, w.err_seq = err.value, next(SEQ)
        else:
            w.ack = next(SEQ)
        self.inflight -= 1
        return 1

    def flush_done(self, f, err):
        if err.value:
            f[2], f[3] = err.value, next(SEQ)
        else:
            f[1] = next(SEQ)
        self.inflight -= 1
        return 1

    def issue_write(self):
        r = self.rng
        off, n = self.pick()
        pos = r.randrange(0, POOL - n + 1)
        fua = r.random() < self.fua_p
        w = Write(self.run_.next_wid(), self.idx, off, n, pos, fua)
        self.writes.append(w)          # before it can reach the server
        self.inflight += 1
        try:
            self.h.aio_pwrite(self.run_.pool_mv[pos:pos + n], off,
                              completion=lambda err, w=w: self.write_done(w, err),
                              flags=nbd.CMD_FLAG_FUA if fua else 0)
        except nbd.Error:
            self.writes.pop()          # libnbd refused it: never sent
            self.inflight -= 1
            raise
        if r.random() < self.flush_p:
            f = [next(SEQ), None, None, None]
            self.flushes.append(f)
            self.inflight += 1
            try:
                self.h.aio_flush(completion=lambda err, f=f: self.flush_done(f, err))
            except nbd.Error:
                self.flushes.pop()
                self.inflight -= 1
                raise

    def run(self):
        stop = self.run_.stop
        try:
            while not stop.is_set():
                while self.inflight < self.qd and not stop.is_set():
                    self.issue_write()
                self.h.poll(50)
        except nbd.Error as e:
            if not (self.h.aio_is_dead() or self.h.aio_is_closed()):
                self.exc = e           # refused by libnbd: a driver bug
        except Exception as e:         # a bug in the driver
            self.exc = e


class Run:
    def __init__(self, a):
        self.a = a
        self.seed = a.seed if a.seed is not None else random.randrange(1 << 48)
        self.rng = random.Random(self.seed)
        self.pool = random.Random(self.seed ^ 0x5eed).randbytes(POOL)
        self.pool_mv = memoryview(self.pool)
        self.refresh_backing()
        with open(a.backing, "rb") as f:
            self.model = f.read()      # what each byte holds before a round
        self.size = len(self.model)
        self.proc = None
        self.round = 0
        self.last_flush = 0
        self.wid = itertools.count(1)
        self.stop = threading.Event()
        self.can_fua = False
        self.totals = dict(acked=0, unflushed=0, inflight=0, flushes=0,
                           fua=0, bytes=0)
        self.deadline = None
        self.log = open(a.log, "ab") if a.log else subprocess.DEVNULL

    def next_wid(self):
        return next(self.wid)

    def say(self, msg):
        print("pmem-kill: seed %d round %d: %s" % (self.seed, self.round, msg),
              flush=True)

    # ---- foliod ---------------------------------------------------------
    def start(self):
        a = self.a
        try:
            os.unlink(a.socket)
        except FileNotFoundError:
            pass
        libc = ctypes.CDLL(None, use_errno=True)
        if a.before_start:
            subprocess.run(a.before_start, shell=True, check=True)
        t0 = time.monotonic()
        # PR_SET_PDEATHSIG: foliod dies with the driver (a timeout
        # killing the driver must not leave it behind).
        if a.nbdkit_file:
            cmd = ["nbdkit", "-f", "-U", a.socket, "file", a.backing]
        else:
            spec = a.export
            if a.vary and self.rng.random() < 0.5:
                spec += a.vary
            cmd = [a.foliod, "--foreground", "--unix", a.socket,
                   "--export", spec]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))
        limit = t0 + 20 * a.tscale
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise Failure("foliod exited with status %d during start-up"
                              % rc)
            h = self.try_connect()
            if h is not None:
                return h, time.monotonic() - t0
            if time.monotonic() > limit:
                raise Failure("foliod does not answer after %d s"
                              % (20 * a.tscale))
            time.sleep(0.01)

    def try_connect(self):
        h = nbd.NBD()
        try:
            h.connect_uri("nbd+unix:///disk0?socket=%s" % self.a.socket)
            return h
        except nbd.Error:
            return None

    def connect(self):
        h = self.try_connect()
        if h is None:
            raise Failure("cannot connect to foliod")
        return h

    def kill(self):
        self.proc.kill()
        try:
            self.proc.wait(timeout=10 * self.a.tscale)
        except subprocess.TimeoutExpired:
            raise Failure("foliod still there 10 s after SIGKILL")

    def terminate(self):
        self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=60 * self.a.tscale)
        except subprocess.TimeoutExpired:
            raise Failure("foliod still running 60 s after SIGTERM")
        if rc != 0:
            raise Failure("foliod exited with status %d after SIGTERM" % rc)

    # ---- one round ------------------------------------------------------
    def writers(self):
        rng = self.rng
        clients = []
        for i in range(rng.randint(2, 4)):
            h = self.connect()
            self.can_fua = h.can_fua()
            clients.append(Client(self, i, h, random.Random(rng.getrandbits(64))))
        return clients

    def one_round(self):
        rng = self.rng
        kill_after = rng.uniform(self.a.min_ms, self.a.max_ms) / 1000
        clients = self.writers()
        self.stop.clear()
        for c in clients:
            c.start()
        time.sleep(kill_after)
        kill_seq = next(SEQ)
        if self.proc.poll() is not None:
            raise Failure("foliod died on its own (status %d) before the kill"
                          % self.proc.returncode)
        self.kill()
        self.stop.set()
        for c in clients:
            c.join(10 * self.a.tscale)
            if c.is_alive():
                raise Failure("client %d still running 10 s after the kill"
                              % c.idx)
            if c.exc is not None:
                raise c.exc
            c.h = None                 # closes the handle (refcount)
        writes = [w for c in clients for w in c.writes]
        self.last_flush = max((f[0] for c in clients for f in c.flushes
                               if f[1] is not None), default=0)
        self.check_errors(clients, kill_seq)
        h, took = self.start()
        data = self.read_all(h)
        del h
        self.verify(data, writes)
        self.count(clients, writes)
        self.say("%d clients, killed after %d ms, %d writes acked, %d in "
                 "flight; up again in %d ms; ok"
                 % (len(clients), kill_after * 1000,
                    sum(w.ack is not None for w in writes),
                    sum(w.ack is None for w in writes), took * 1000))
        self.model = data

    def check_errors(self, clients, kill_seq):
        """An error reply read before the kill is a failure (after it, the
        connection's death answers what was in flight)."""
        for c in clients:
            for w in c.writes:
                if w.err is not None and w.err_seq < kill_seq:
                    raise Failure("%s before the kill" % w.describe())
            for f in c.flushes:
                if f[2] is not None and f[3] < kill_seq:
                    raise Failure("client %d: FLUSH failed (errno %d) before "
                                  "the kill" % (c.idx, f[2]))

    def count(self, clients, writes):
        t = self.totals
        for c in clients:
            last_flush = max((f[0] for f in c.flushes if f[1]), default=0)
            for w in c.writes:
                if w.ack is None:
                    t["inflight"] += 1
                    continue
                t["acked"] += 1
                t["bytes"] += w.len
                t["fua"] += w.fua
                # Acknowledged, no FUA, no FLUSH issued after its reply
                # came back: only a persistent store keeps it.
                t["unflushed"] += not w.fua and w.ack > last_flush
            t["flushes"] += sum(1 for f in c.flushes if f[1])

    def read_all(self, h):
        out = bytearray(self.size)
        for off in range(0, self.size, READ_CHUNK):
            n = min(READ_CHUNK, self.size - off)
            out[off:off + n] = h.pread(n, off)
        return bytes(out)

    # ---- the model ------------------------------------------------------
    def verify(self, data, writes):
        """Sweep the export by segments over which the covering writes do
        not change; each segment must match the allowed candidates."""
        bounds = {0, self.size}
        for w in writes:
            bounds.add(w.off)
            bounds.add(w.end)
        bounds = sorted(bounds)
        by_off = sorted(writes, key=lambda w: w.off)
        active, nxt = [], 0
        for a, b in zip(bounds, bounds[1:]):
            active = [w for w in active if w.end > a]
            while nxt < len(by_off) and by_off[nxt].off <= a:
                if by_off[nxt].end > a:
                    active.append(by_off[nxt])
                nxt += 1
            self.verify_segment(data, a, b, active)

    def sure(self, w):
        """Must w survive the kill?"""
        if w.ack is None:
            return False
        return not self.a.flushed_only or w.fua or self.last_flush > w.ack

    def candidates(self, a, active):
        """(label, source bytes, offset in source of byte a) per value the
        segment starting at a may hold."""
        acked = [w for w in active if self.sure(w)]
        newest_issue = max((w.issue for w in acked), default=-1)
        cands = [] if acked else [("before the round", self.model, a)]
        for w in active:
            # No reply, or failed after the kill (the dying connection
            # fails what was in flight): may have landed or not.
            if w.ack is None or w.ack > newest_issue:
                cands.append((w.describe(), self.pool, w.pos + a - w.off))
        return cands

    def verify_segment(self, data, a, b, active):
        cands = self.candidates(a, active)
        got = data[a:b]
        n = b - a
        if any(src[s:s + n] == got for _, src, s in cands):
            return
        # Mixed: each 512-byte piece from one candidate, else byte by byte.
        p = a
        while p < b:
            q = min(b, (p // 512 + 1) * 512)
            piece = data[p:q]
            if not any(src[s + p - a:s + q - a] == piece for _, src, s in cands):
                for i in range(p, q):
                    if not any(src[s + i - a] == data[i] for _, src, s in cands):
                        self.mismatch(data, i, a, b, cands, active)
            p = q

    def mismatch(self, data, i, a, b, cands, active):
        lines = ["byte %d (in [%d, %d)) reads 0x%02x; allowed:" % (i, a, b, data[i])]
        for label, src, s in cands:
            lines.append("  0x%02x from %s" % (src[s + i - a], label))
        got = data[i:min(b, i + 16)]
        where = "data never written there"
        if got == self.model[i:i + len(got)]:
            where = "its content from before the round (an acknowledged write lost)"
        elif got == bytes(len(got)):
            where = "zeros"
        else:
            for w in active:
                s = w.pos + i - w.off
                if self.pool[s:s + len(got)] == got:
                    where = "the data of %s" % w.describe()
        lines.append("  the bytes from %d hold %s" % (i, where))
        lines.append("  covering writes: %d acknowledged, %d not"
                     % (sum(w.ack is not None for w in active),
                        sum(w.ack is None for w in active)))
        raise Failure("\n".join(lines))

    # ---- whole run ------------------------------------------------------
    def watchdog(self):
        """Every wait is bounded: a round stuck in libnbd (a hung server)
        ends the run."""
        while True:
            time.sleep(1)
            if self.deadline and time.monotonic() > self.deadline:
                print("pmem-kill: seed %d round %d: FAIL: round stuck for "
                      "%d s" % (self.seed, self.round, 60 * self.a.tscale),
                      flush=True)
                os._exit(1)

    def main(self):
        self.say("start: %d rounds, export %d bytes, %s"
                 % (self.a.rounds, self.size,
                    "nbdkit file" if self.a.nbdkit_file else self.a.export))
        threading.Thread(target=self.watchdog, daemon=True).start()
        self.deadline = time.monotonic() + 60 * self.a.tscale
        self.start()
        for self.round in range(1, self.a.rounds + 1):
            self.deadline = time.monotonic() + 60 * self.a.tscale
            self.one_round()
        self.deadline = time.monotonic() + 90 * self.a.tscale
        self.terminate()
        self.check_backing()
        t = self.totals
        self.say("all rounds ok: %d writes acknowledged (%d MiB; %d with FUA, "
                 "%d neither FUA nor flushed after), %d flushes, %d writes in "
                 "flight at a kill; backing file equals the model after SIGTERM"
                 % (t["acked"], t["bytes"] >> 20, t["fua"], t["unflushed"],
                    t["flushes"], t["inflight"]))

    def refresh_backing(self):
        if self.a.backing_cmd:
            subprocess.run(self.a.backing_cmd, shell=True, check=True)

    def check_backing(self):
        self.refresh_backing()
        with open(self.a.backing, "rb") as f:
            disk = f.read()
        if disk != self.model:
            n = min(len(disk), len(self.model))
            i = next((k for k in range(n) if disk[k] != self.model[k]), n)
            raise Failure("after SIGTERM the backing file differs from the "
                          "model at byte %d (%d bytes, model %d)"
                          % (i, len(disk), len(self.model)))


def main():
    run = Run(parse())
    try:
        run.main()
    except Failure as e:
        run.say("FAIL: %s" % e)
        if run.proc is not None and run.proc.poll() is None:
            run.proc.kill()
        sys.exit(1)


if __name__ == "__main__":
    main()
