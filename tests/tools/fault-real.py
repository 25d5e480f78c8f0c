#!/usr/bin/python3
"""Client and checker of tests/test-fault-file-real.sh (issue 33).

usage: fault-real.py init  --img FILE --blocks N
       fault-real.py run   --uri URI --model JSON --blocks N --seed S --ops N
                           [--operator FOLIOD,CONTROL-SOCKET,EXPORT[,losses]
                                       [,network=DIR]]
                           [--final-flushes N] [--flush-pause S]
       fault-real.py check --uri URI --model JSON --blocks N --save FILE
       fault-real.py same  --model JSON --img FILE --save FILE

Every 512-byte sector of 4 KiB block b at version v names b, v and its
index and is filled from them, so a sector read back tells which write it
came from, and a version older than another is detectable.  init writes
version 0 of every block (the content before the run: a client wrote it).

run: one connection, synchronous requests: 4 KiB writes (some FUA, some
of a small hot set of blocks, so blocks get many versions), zeroes of a
block, reads, FLUSHes.  The model (JSON) keeps, per block, the versions
issued (each write and zero, whether it succeeded or not: a failed write
may have landed) and the version acknowledged durable: the last write
that succeeded before a FLUSH that succeeded, or a FUA write that
succeeded.  A FLUSH that fails is tried again at once; "lost" is true
when the last FLUSH of the run failed (the loss reported, every later
FLUSH failed), and "zeroed" lists the blocks zeroed since the last good
FLUSH: a zero is a passthrough write, whose loss foliod reports that way
(docs/internals.md, Durability ledger).  A read during the run must give,
per sector, a version issued for that block no older than the one
acknowledged.  The connection may die (the fault layer's power cut kills
foliod): the run stops there, the request in flight unacknowledged.

--operator: the run also plays the operator of foliod(8)'s "Writes in
doubt", for a test whose remote goes away by dying (a power cut kills
it: no write it had can land later), or see ",network" below.  When a FLUSH fails (or
a write: with flush=store, FLUSH is the store's, and a doubt holds the
backing's flush back until the cache has no room) and foliod stats
count writes in doubt or passthrough writes lost, it says
`foliod clear-doubt EXPORT` (and tries the FLUSH again).  The clear is also
the operator's word that a lost passthrough write is known lost: the
blocks zeroed since the last good FLUSH are "excused" up to their newest
version issued (the backing may keep what it had before them) until a
newer version of theirs is acknowledged.
With ",losses" the operator clears only a passthrough loss (clear-doubt
--lost-only), never a doubt: for a backing whose abandoned writes may
still land (they end by themselves).
With ",network=DIR" foliod reaches its remote through
tests/tools/reset-proxy.py (state in DIR), whose connections it ended
may still land writes: before a clear the operator quiets that network
(DIR/calm) and waits until no such connection is left at the remote
(DIR/pending is 0), as an operator checks that the old connections are
gone before saying the doubt is over.
--final-flushes N: after the ops, up to N more tries of a FLUSH (with the
operator's clears) so that the run ends with everything acknowledged.
--flush-pause S: S seconds between two of those final tries (for a
backing whose abandoned writes end by themselves, later).

check: reads the whole export after the restart (no faults) and holds
each sector to the property: a version a client issued for that block
(zeroes only if a zero was issued), no older than the version
acknowledged -- except, when the run's last FLUSH failed, in a block
zeroed since the last good FLUSH.  Saves what it read.
same: after foliod's clean stop, the file holds exactly what was read.
Exit 0 if all holds; else prints each bad sector and exits 1.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

BLOCK = 4096
SECT = 512
ZERO = bytes(SECT)


PATTERN = bytes(range(256)) * 3


def sector(b, v, s):
    head = b"FLT b=%08d v=%08d s=%d\n" % (b, v, s)
    k = (b * 131 + v * 7 + s * 13) & 255
    return head + PATTERN[k:k + SECT - len(head)]


def block(b, v):
    return b"".join(sector(b, v, s) for s in range(BLOCK // SECT))


def parse(data):
    """(b, v, s) a sector names if it is one of ours intact, "zero", or
    None (data no client wrote)."""
    if data == ZERO:
        return "zero"
    try:
        f = data[:SECT].split(b"\n", 1)[0].split()
        b, v, s = (int(x.split(b"=")[1]) for x in f[1:4])
    except (IndexError, ValueError):
        return None
    return (b, v, s) if data == sector(b, v, s) else None


def judge(data, b, m):
    """Problems of block b's content against model m (a list of text)."""
    issued = m["issued"][b]                 # [[version, is_zero], ...]
    acked = m["acked"][b]
    strict = not (m["lost"] and b in m["zeroed"]) and \
        acked > m.get("excused", {}).get(str(b), -1)
    bad = []
    for s in range(BLOCK // SECT):
        got = parse(data[s * SECT:(s + 1) * SECT])
        if got == "zero":
            ok = any(z and (v >= acked or not strict) for v, z in issued)
            what = "zeroes"
        elif got is None or got[0] != b or got[2] != s:
            ok, what = False, "data no client wrote there (%r)" % (got,)
        else:
            v = got[1]
            ok = [v, False] in issued and (v >= acked or not strict)
            what = "version %d" % v
        if not ok:
            bad.append("block %d sector %d: %s; acknowledged version %d, "
                       "issued %s" % (b, s, what, acked,
                                      [v if not z else "zero@%d" % v
                                       for v, z in issued][-8:]))
    return bad


def do_init(a):
    with open(a.img, "wb") as f:
        for b in range(a.blocks):
            f.write(block(b, 0))


def new_model(n):
    return {"issued": [[[0, False]] for _ in range(n)], "acked": [0] * n,
            "lost": False, "zeroed": [], "counts": {}}


def do_run(a):
    import nbd
    rng = random.Random(a.seed)
    m = new_model(a.blocks)
    nextv = [1] * a.blocks
    last_ok = [0] * a.blocks        # last version a request succeeded with
    counts = m["counts"]
    hot = rng.sample(range(a.blocks), 16)

    def count(k):
        counts[k] = counts.get(k, 0) + 1

    def stat(name):
        """A counter of foliod stats; 0 if foliod is gone (a power cut
        killed it: the next request finds the connection dead)."""
        out = subprocess.run([op[0], "stats", "--control", op[1],
                              "--prometheus"], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) == 2 and f[0] in (name, '%s{export="%s"}' %
                                        (name, op[2])):
                return int(float(f[1]))
        return 0

    def network_quiet():
        """Quiet the network (no new cuts) and wait until no connection
        it ended is left at the remote; False if that takes over 60 s."""
        open(os.path.join(network, "calm"), "w").close()
        for _ in range(600):
            with open(os.path.join(network, "pending")) as f:
                if int(f.read()) == 0:
                    count("network-waits")
                    return True
            time.sleep(0.1)
        return False

    def operator():
        """foliod(8)'s operator: clear a doubt or a known passthrough loss
        (every remote that could land an abandoned write is dead, or its
        connections with foliod are gone).  True if there was one to
        clear."""
        if not op or counts.get("clear-doubt", 0) >= 50:
            return False
        if losses_only:
            if not stat("foliod_passthrough_lost_writes"):
                return False
        elif not (stat("foliod_backing_writes_in_doubt") or
                  stat("foliod_passthrough_lost_writes")):
            return False
        try:
            if network and not network_quiet():
                return False
            if subprocess.run([op[0], "clear-doubt", op[2], "--control",
                               op[1]] +
                              (["--lost-only"] if losses_only else []),
                              capture_output=True).returncode != 0:
                return False    # foliod is gone: nothing was cleared
        finally:
            if network:
                try:
                    os.unlink(os.path.join(network, "calm"))
                except FileNotFoundError:
                    pass
        ex = m.setdefault("excused", {})
        for b in m["zeroed"]:
            ex[str(b)] = nextv[b] - 1
        count("clear-doubt")
        return True

    def flush():
        h.flush()
        for b in range(a.blocks):
            m["acked"][b] = max(m["acked"][b], last_ok[b])
        m["lost"] = False
        m["zeroed"] = []
        count("flush-ok")

    class Dead(Exception):
        pass

    def failed(e, what):
        """A request failed: foliod said so, or it is gone (Dead)."""
        if h.aio_is_dead() or h.aio_is_closed():
            raise Dead(str(e))
        count(what)

    def try_flush(tries, pause=0):
        """A FLUSH, a failed one tried again (after the operator's clear,
        if there was one to say; else after pause seconds)."""
        while tries > 0:
            try:
                flush()
                return
            except nbd.Error as e:
                failed(e, "flush-failed")
                m["lost"] = True
            if not operator():
                tries -= 1
                if tries and pause:
                    time.sleep(pause)

    op = a.operator.split(",") if a.operator else None
    losses_only = bool(op) and "losses" in op[3:]
    network = next((o[8:] for o in (op or [])[3:]
                    if o.startswith("network=")), None)
    h = nbd.NBD()
    h.connect_uri(a.uri)
    try:
        for _ in range(a.ops):
            b = rng.choice(hot) if rng.random() < 0.5 else \
                rng.randrange(a.blocks)
            r = rng.random()
            if r < 0.12:
                try_flush(2)
                continue
            if r < 0.20:
                try:
                    data = h.pread(BLOCK, b * BLOCK)
                except nbd.Error as e:
                    failed(e, "read-failed")
                    continue
                bad = judge(data, b, m)
                if bad:
                    print("during the run, a read of", "\n  ".join(bad))
                    m["bad_read"] = bad
                count("read")
                continue
            v = nextv[b]
            nextv[b] += 1
            zero = r < 0.23
            fua = rng.random() < 0.15
            m["issued"][b].append([v, zero])
            if zero and b not in m["zeroed"]:
                m["zeroed"].append(b)
            flags = nbd.CMD_FLAG_FUA if fua else 0
            try:
                if zero:
                    h.zero(BLOCK, b * BLOCK, flags)
                else:
                    h.pwrite(block(b, v), b * BLOCK, flags)
            except nbd.Error as e:
                failed(e, "write-failed")
                operator()      # writeback held back by a doubt: no room
                continue
            last_ok[b] = v
            if fua:
                m["acked"][b] = max(m["acked"][b], v)
            count("zero" if zero else "write")
            if fua:
                count("fua")
        try_flush(a.final_flushes, a.flush_pause)
    except Dead as e:
        count("connection-lost")
        print("run stopped: %s" % e)
    with open(a.model, "w") as f:
        json.dump(m, f)
    print("run:", " ".join("%s %d" % kv for kv in sorted(counts.items())),
          "(last FLUSH failed)" if m["lost"] else "")
    return 1 if "bad_read" in m else 0


def do_check(a):
    import nbd
    m = json.load(open(a.model))
    h = nbd.NBD()
    h.connect_uri(a.uri)
    data = bytearray()
    for off in range(0, a.blocks * BLOCK, 1 << 20):
        data += h.pread(min(1 << 20, a.blocks * BLOCK - off), off)
    h.shutdown()
    open(a.save, "wb").write(data)
    bad = []
    held = 0
    for b in range(a.blocks):
        bad += judge(data[b * BLOCK:(b + 1) * BLOCK], b, m)
        held += m["acked"][b] > 0
    for line in bad[:20]:
        print("FAIL:", line)
    print("check: %d blocks, %d with an acknowledged write, %s: %s" %
          (a.blocks, held, "held to it" if not m["lost"] else
           "held to it but %d (the last FLUSH failed: zeroed since the "
           "last good FLUSH)" % len(m["zeroed"]),
           "%d bad sectors" % len(bad) if bad else "ok"))
    return 1 if bad else 0


def do_same(a):
    if open(a.img, "rb").read() != open(a.save, "rb").read():
        print("FAIL: after the clean stop the file differs from what "
              "foliod served")
        return 1
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["init", "run", "check", "same"])
    p.add_argument("--img")
    p.add_argument("--uri")
    p.add_argument("--model")
    p.add_argument("--save")
    p.add_argument("--blocks", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ops", type=int, default=200)
    p.add_argument("--operator")
    p.add_argument("--final-flushes", type=int, default=0)
    p.add_argument("--flush-pause", type=float, default=0)
    a = p.parse_args()
    return {"init": do_init, "run": do_run, "check": do_check,
            "same": do_same}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
