#!/usr/bin/env python3
"""Record what NBD clients send, for the nbd_session fuzz seeds (scripts/make-fuzz-corpus.sh).

    nbd-record.py SERVER_SOCKET RELAY_SOCKET OUT_DIR
        Relay every connection made to RELAY_SOCKET to SERVER_SOCKET, writing what each client
        sends to OUT_DIR/conn-NNN (the server's replies pass through unrecorded).
    nbd-record.py --client SOCKET structured|exportname
        A hand-written client for the paths common clients leave out: structured replies, an
        empty meta-context list, NBD_OPT_INFO, STARTTLS refused, NBD_OPT_GO, an unaligned FUA
        write, an unaligned read, write-zeroes, trim, flush, a read past the end, an empty
        read, then a clean disconnect; or the old NBD_OPT_EXPORT_NAME path with the same
        requests.
"""
import os
import socket
import struct
import sys
import threading


def relay(server, listen, out):
    os.makedirs(out, exist_ok=True)
    lst = socket.socket(socket.AF_UNIX)
    lst.bind(listen)
    lst.listen(16)
    n = 0

    def pump(src, dst, record):
        try:
            while data := src.recv(65536):
                if record:
                    record.write(data)
                    record.flush()
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    while True:
        client, _ = lst.accept()
        n += 1
        upstream = socket.socket(socket.AF_UNIX)
        upstream.connect(server)
        record = open(f"{out}/conn-{n:03d}", "wb")
        threading.Thread(target=pump, args=(client, upstream, record), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client, None), daemon=True).start()


def client(path, mode):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)

    def recvn(n):
        b = b""
        while len(b) < n:
            d = s.recv(n - len(b))
            if not d:
                raise EOFError
            b += d
        return b

    recvn(18)
    ihaveopt = 0x49484156454F5054
    s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes

    def option(o, data=b""):
        s.sendall(struct.pack(">QII", ihaveopt, o, len(data)) + data)
        while True:
            _, _, kind, length = struct.unpack(">QIII", recvn(20))
            recvn(length)
            if kind == 1 or kind >= 0x80000000:
                return

    if mode == "exportname":
        s.sendall(struct.pack(">QII", ihaveopt, 1, 0))
        recvn(10)
    else:
        option(8)  # structured replies
        option(10, struct.pack(">IH", 0, 0))  # list meta contexts: none offered
        info = struct.pack(">I", 0) + struct.pack(">HHHH", 3, 0, 1, 2)
        option(6, info)  # INFO
        option(5, b"x")  # STARTTLS, refused
        option(7, info)  # GO
    cookie = 0

    def request(kind, offset, length, flags=0, payload=b""):
        nonlocal cookie
        cookie += 1
        s.sendall(struct.pack(">IHHQQI", 0x25609513, flags, kind, cookie, offset, length) + payload)
        if struct.unpack(">I", recvn(4))[0] == 0x67446698:
            error, _ = struct.unpack(">IQ", recvn(12))
            if kind == 0 and error == 0:
                recvn(length)
            return
        while True:
            chunk_flags, _, _, chunk_len = struct.unpack(">HHQI", recvn(16))
            recvn(chunk_len)
            if chunk_flags & 1:
                return
            recvn(4)

    request(1, 4097, 1000, 1, b"x" * 1000)  # unaligned write, FUA
    request(0, 600, 511)  # unaligned read
    request(6, 8192, 12288)  # write zeroes
    request(4, 4096, 4096)  # trim
    request(3, 0, 0)  # flush
    request(0, 7340032 - 512, 1024)  # past the end of the 7 MiB volume
    request(0, 0, 0)  # empty read
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 2, 99, 0, 0))  # disconnect
    s.close()


if __name__ == "__main__":
    if sys.argv[1] == "--client":
        client(sys.argv[2], sys.argv[3])
    else:
        relay(sys.argv[1], sys.argv[2], sys.argv[3])
