#!/usr/bin/python3
"""Recording proxy for the fuzzer's seed corpus.

    nbd-record.py LISTEN TARGET OUTDIR [MAX_BYTES]

LISTEN is a Unix socket path to create, or 127.0.0.1:PORT; TARGET is the
Unix socket of a running foliod.  Every client connection is forwarded to
TARGET both ways, and the bytes the client sent (everything after the
server's greeting: client flags, options, requests, payloads) are saved as
OUTDIR/NNNN.bin, at most MAX_BYTES (default 64512) of them: the harness
(tests/fuzz/fuzz-server.c) replays such a file as one client.  A file
appears under its final name only once its connection has ended
(OUTDIR/NNNN.part until then).  Runs until killed.
"""
import os
import socket
import sys
import threading


def pump(src, dst, rec, cap):
    """Copy src to dst until EOF; rec (a file or None) gets the first cap
    bytes.  Half-closes dst at the end so that the other side sees EOF."""
    kept = 0
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if rec is not None and kept < cap:
                rec.write(data[:cap - kept])
                kept += min(len(data), cap - kept)
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def serve(client, target, path, cap):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.connect(target)
    with open(path + ".part", "wb") as rec:
        back = threading.Thread(target=pump, args=(server, client, None, cap))
        back.start()
        pump(client, server, rec, cap)
        back.join()
    os.rename(path + ".part", path + ".bin")
    client.close()
    server.close()


def listen(where):
    if ":" in where:
        host, port = where.rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
    else:
        if os.path.exists(where):
            os.unlink(where)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(where)
    s.listen(16)
    return s


def main():
    where, target, outdir = sys.argv[1:4]
    cap = int(sys.argv[4]) if len(sys.argv) > 4 else 64512
    s = listen(where)
    n = 0
    while True:
        client, _ = s.accept()
        n += 1
        path = os.path.join(outdir, "%04d" % n)
        threading.Thread(target=serve, args=(client, target, path, cap),
                         daemon=True).start()


if __name__ == "__main__":
    main()
