#!/usr/bin/env python3
"""Independent dm-crypt sector encryption with OpenSSL (via the `cryptography` package).

Reads jobs from stdin, one per line:  SPEC KEY_HEX SECTOR_SIZE FIRST_SECTOR DIRECTION DATA_HEX
and prints the result as hex, one line per job. IVs follow dm-crypt for LUKS2: the IV counts
512-byte units; plain64 = little-endian 64-bit, plain = low 32 bits, plain64be = big-endian in the
last 8 bytes, benbi = (n * 32 + 1) big-endian in the last 8 bytes, null = zero, eboiv = the
little-endian byte offset (n * sector size) encrypted with AES under the data key, essiv:HASH = the
plain64 IV encrypted with AES keyed by HASH(key). Written from the dm-crypt documentation, sharing
no code with sectorcrypt.
"""
import hashlib
import struct
import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def aes_ecb(key, block):
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return enc.update(block) + enc.finalize()


ESSIV_HASHES = {"sha256": "sha256", "sha3-256": "sha3_256", "blake2s-256": "blake2s"}


def iv_for(ivgen, key, n, sector_size):
    if ivgen == "plain64":
        return struct.pack("<Q", n) + bytes(8)
    if ivgen == "plain":
        return struct.pack("<I", n & 0xFFFFFFFF) + bytes(12)
    if ivgen == "plain64be":
        return bytes(8) + struct.pack(">Q", n)
    if ivgen == "benbi":
        return bytes(8) + struct.pack(">Q", ((n << 5) + 1) & 0xFFFFFFFFFFFFFFFF)
    if ivgen == "null":
        return bytes(16)
    if ivgen == "eboiv":
        return aes_ecb(key, struct.pack("<Q", (n * sector_size) & 0xFFFFFFFFFFFFFFFF) + bytes(8))
    if ivgen.startswith("essiv:") and ivgen[6:] in ESSIV_HASHES:
        salt = hashlib.new(ESSIV_HASHES[ivgen[6:]], key).digest()
        return aes_ecb(salt, struct.pack("<Q", n) + bytes(8))
    raise SystemExit(f"unsupported IV generator {ivgen}")


def gf_mul(a, b):
    """GF(2^128) product of 128-bit integers whose bit i is the coefficient of x^i, reduced by
    x^128 + x^7 + x^2 + x + 1 (LRW's convention)."""
    r = 0
    for i in range(128):
        if (b >> i) & 1:
            r ^= a
        a = ((a << 1) ^ (0x87 if a >> 127 else 0)) & ((1 << 128) - 1)
    return r


def lrw(key, iv, sector, encrypt):
    """LRW: block j is E_K1(P ^ T) ^ T with T = K2 * (I + j), I the IV as a big-endian index."""
    k1, k2 = key[:-16], int.from_bytes(key[-16:], "big")
    index = int.from_bytes(iv, "big")
    c = Cipher(algorithms.AES(k1), modes.ECB())
    op = c.encryptor() if encrypt else c.decryptor()
    out = bytearray()
    for j in range(0, len(sector), 16):
        t = gf_mul(k2, (index + j // 16) % (1 << 128)).to_bytes(16, "big")
        x = bytes(p ^ q for p, q in zip(sector[j : j + 16], t))
        y = op.update(x)
        out += bytes(p ^ q for p, q in zip(y, t))
    return bytes(out)


def run(spec, key, sector_size, first, direction, data):
    cipher, mode, ivgen = (spec.split("-", 2) + [""])[:3]
    assert cipher == "aes", spec
    out = bytearray()
    for i in range(0, len(data), sector_size):
        sector = data[i : i + sector_size]
        n = (first + i // sector_size) * (sector_size // 512)
        if mode == "lrw":
            out += lrw(key, iv_for(ivgen, key, n, sector_size), sector, direction == "encrypt")
            continue
        if mode == "xts":
            m = modes.XTS(iv_for(ivgen, key, n, sector_size))
        elif mode == "cbc":
            m = modes.CBC(iv_for(ivgen, key, n, sector_size))
        elif mode == "ecb":
            m = modes.ECB()
        else:
            raise SystemExit(f"unsupported mode {mode}")
        c = Cipher(algorithms.AES(key), m)
        op = c.encryptor() if direction == "encrypt" else c.decryptor()
        out += op.update(sector) + op.finalize()
    return bytes(out)


for line in sys.stdin:
    spec, key, ss, first, direction, data = line.split()
    print(run(spec, bytes.fromhex(key), int(ss), int(first), direction, bytes.fromhex(data)).hex(), flush=True)
