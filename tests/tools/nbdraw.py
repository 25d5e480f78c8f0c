# A raw NBD client for the tests that need to misbehave in ways libnbd
# will not: pipeline requests without reading replies, send requests over
# the advertised maximum, bind to a chosen source address, idle.
#
#   import sys; sys.path.insert(0, TOP + "/tests/tools"); import nbdraw
#   s = nbdraw.connect("/tmp/sock", "disk0")          # Unix socket
#   s = nbdraw.connect(("127.0.0.1", 10809), "disk0", bind="127.0.0.2")
#   nbdraw.send_req(s, nbdraw.CMD_READ, cookie=1, offset=0, length=4096)
#   err, data = nbdraw.simple_reply(s, 4096)
#
# Simple replies only (no structured replies are negotiated).
import socket
import struct

CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH = 0, 1, 2, 3
OPT_GO, REP_ACK, REP_INFO = 7, 1, 3
INFO_BLOCK_SIZE = 3
IHAVEOPT = 0x49484156454F5054
REQ_MAGIC, SIMPLE_MAGIC = 0x25609513, 0x67446698


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        k = s.recv(min(n - len(buf), 1 << 20))
        if not k:
            raise EOFError("server closed the connection")
        buf += k
    return bytes(buf)


class Sock(socket.socket):
    """A socket that can carry block_max."""


def connect(addr, export, bind=None, timeout=30):
    """Connect, handshake with NBD_OPT_GO, return the socket in
    transmission.  s.block_max is the advertised maximum block size."""
    fam = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
    s = Sock(fam, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if bind:
        s.bind((bind, 0))
    s.connect(addr)
    hs = recv_exact(s, 18)
    if hs[:8] != b"NBDMAGIC":
        raise ValueError("not an NBD server")
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    name = export.encode()
    data = struct.pack(">I", len(name)) + name + struct.pack(">HH", 1,
                                                           INFO_BLOCK_SIZE)
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, len(data)) + data)
    s.block_max = None
    while True:
        _, _, rtype, rlen = struct.unpack(">QIII", recv_exact(s, 20))
        body = recv_exact(s, rlen)
        if rtype == REP_ACK:
            return s
        if rtype & 0x80000000:
            raise ValueError("NBD_OPT_GO refused: 0x%x" % rtype)
        if rtype == REP_INFO and struct.unpack(">H", body[:2])[0] == \
                INFO_BLOCK_SIZE:
            s.block_max = struct.unpack(">III", body[2:14])[2]


def send_req(s, cmd, cookie, offset, length, payload=None):
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, cmd, cookie, offset,
                          length))
    if payload is not None:
        s.sendall(payload)


def simple_reply(s, datalen):
    """(error, data) of the next simple reply; data is read only when the
    reply has no error (datalen bytes, for a read)."""
    magic, err, cookie = struct.unpack(">IIQ", recv_exact(s, 16))
    if magic != SIMPLE_MAGIC:
        raise ValueError("bad reply magic 0x%x" % magic)
    data = recv_exact(s, datalen) if err == 0 and datalen else b""
    return err, data
