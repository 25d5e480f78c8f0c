#!/usr/bin/python3
"""The "network" of tests/test-fault-nbd-real.sh (issue 33, item 2): a
Unix-socket proxy between foliod and its nbd remote that now and then
ends foliod's connection and delivers the requests it was carrying LATER,
to a remote that is still alive: foliod cannot know whether they landed.

usage: reset-proxy.py --listen SOCKET --remote SOCKET --state DIR
                      --seed S [--cut-permille N] [--hold-ms MS]
                      [--late-ms MS]

Each connection foliod opens gets its own connection to the remote, and
bytes are copied both ways.  Every read of foliod's side that starts with
a write request starts a cut with probability N/1000 (20): the proxy
stops forwarding, keeps reading what foliod sends for up to --hold-ms
(300), then closes foliod's side (to foliod, a connection the network
ended).  After a random delay from a quarter of --late-ms (4000) to all
of it, it sends what it held to the remote -- whole requests are carried
out, a trailing partial one is dropped by the remote -- and ends its
side of that connection: the remote finishes the requests, answers into
the void, and closes.  No cut starts while DIR/calm exists.

DIR/pending holds the number of connections whose foliod side is closed
and whose remote side is not yet: writes that may still land.  The
operator (fault-real.py --operator ...,network=DIR) makes DIR/calm, waits
for 0 there, then clears foliod's doubt -- what an operator of a real
network does when the old connections are gone at the remote.
DIR/log gets a line per cut: the bytes held, the whole writes among them
(OFFSET+LENGTH) and the delay; and "orphan N", "done N" when connection
N's foliod side ends first, and then its remote side.
"""
import argparse
import os
import random
import socket
import struct
import threading
import time

from nbdraw import CMD_WRITE, REQ_MAGIC

lock = threading.RLock()
pending = 0


def set_pending(state, delta):
    global pending
    with lock:
        pending += delta
        tmp = os.path.join(state, "pending.tmp")
        with open(tmp, "w") as f:
            f.write("%d\n" % pending)
        os.replace(tmp, os.path.join(state, "pending"))


def log(state, line):
    with lock, open(os.path.join(state, "log"), "a") as f:
        f.write(line + "\n")


def recv(s):
    """What s has to read; b"" at its end or on an error."""
    try:
        return s.recv(65536)
    except OSError:
        return b""


def close(s):
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


def requests(data):
    """The (type, offset, length) of the whole requests at the start of
    data, read as compact request headers (foliod's remotes here do not
    negotiate extended headers)."""
    out = []
    i = 0
    while i + 28 <= len(data):
        magic, _, typ, _, off, ln = struct.unpack_from(">IHHQQI", data, i)
        if magic != REQ_MAGIC:
            break
        i += 28 + (ln if typ == CMD_WRITE else 0)
        if i > len(data):
            break
        out.append((typ, off, ln))
    return out


def is_write(data):
    """Does data (one read of foliod's side) start with a write request?"""
    if len(data) < 28:
        return False
    magic, _, typ = struct.unpack_from(">IHH", data)
    return magic == REQ_MAGIC and typ == CMD_WRITE


def serve(a, n, client):
    rng = random.Random(a.seed * 100003 + n)
    remote = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        remote.connect(a.remote)
    except OSError:
        close(client)           # the remote is away: foliod retries
        remote.close()
        return
    # orphan: foliod's side is closed and the remote's is not (counted in
    # pending); done: the remote's side is closed.
    st = {"orphan": False, "done": False}

    def orphan():
        """foliod's side is over: no more answers go there (a send to a
        foliod that keeps its end open unread would block the answers'
        thread, and with it the end of the remote's side)."""
        with lock:
            if not st["done"] and not st["orphan"]:
                st["orphan"] = True
                set_pending(a.state, 1)
                log(a.state, "orphan %d" % n)
        try:
            client.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def down():
        """The remote's answers to foliod, while foliod's side is open."""
        while True:
            data = recv(remote)
            if not data:
                break
            if not st["orphan"]:
                try:
                    client.sendall(data)
                except OSError:
                    pass
        # The remote ended the connection (it died, or it finished what
        # a closed connection had sent).
        with lock:
            st["done"] = True
            if st["orphan"]:
                set_pending(a.state, -1)
                log(a.state, "done %d" % n)
        close(client)
        remote.close()

    t = threading.Thread(target=down, daemon=True)
    t.start()
    calm = os.path.join(a.state, "calm")
    while True:
        data = recv(client)
        if not data:
            # foliod (or the remote's death) ended it: the remote gets
            # the end too, and finishes what it has.
            orphan()
            try:
                remote.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        if is_write(data) and rng.random() * 1000 < a.cut_permille and \
           not os.path.exists(calm):
            break
        try:
            remote.sendall(data)
        except OSError:
            close(client)
            return
    # A cut: hold what foliod sends for a moment, then end its side.
    held = [data]
    end = time.monotonic() + rng.uniform(0, a.hold_ms) / 1000
    client.settimeout(0.01)
    while time.monotonic() < end:
        try:
            more = client.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not more:
            break
        held.append(more)
    orphan()
    close(client)
    late = rng.uniform(a.late_ms / 4, a.late_ms)
    time.sleep(late / 1000)
    data = b"".join(held)
    writes = [r for r in requests(data) if r[0] == CMD_WRITE]
    log(a.state, "cut %d held %d bytes, %d writes (%s), late %d ms" %
        (n, len(data), len(writes),
         ",".join("%d+%d" % (o, ln) for _, o, ln in writes), late))
    try:
        remote.sendall(data)
        remote.shutdown(socket.SHUT_WR)
    except OSError:
        pass                    # the remote died meanwhile: nothing lands


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--remote", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cut-permille", type=float, default=20)
    p.add_argument("--hold-ms", type=float, default=300)
    p.add_argument("--late-ms", type=float, default=4000)
    a = p.parse_args()
    set_pending(a.state, 0)
    try:
        os.unlink(a.listen)
    except FileNotFoundError:
        pass
    # Listening before the name appears: a client that sees the socket
    # can connect.
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(a.listen + ".new")
    srv.listen(16)
    os.rename(a.listen + ".new", a.listen)
    n = 0
    while True:
        client, _ = srv.accept()
        n += 1
        threading.Thread(target=serve, args=(a, n, client),
                         daemon=True).start()


if __name__ == "__main__":
    main()
