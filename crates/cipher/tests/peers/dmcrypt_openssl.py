#!/usr/bin/env python3
"""Independent dm-crypt sector encryption with OpenSSL (via the `cryptography` package).

Reads jobs from stdin, one per line:  SPEC KEY_HEX SECTOR_SIZE FIRST_SECTOR DIRECTION DATA_HEX
and prints the result as hex, one line per job. IVs follow dm-crypt for LUKS2: the IV counts
512-byte units; plain64 = little-endian 64-bit, plain = low 32 bits, plain64be = big-endian in the
last 8 bytes, benbi = (n * 32 + 1) big-endian in the last 8 bytes, null = zero, eboiv = the
little-endian byte offset (n * sector size) encrypted with AES under the data key, essiv:HASH = the
plain64 IV encrypted with AES keyed by HASH(key), lmk = loop-AES's IV from the plaintext (see
lmk_iv; 512-byte sectors). Written from the dm-crypt documentation, sharing no code with
sectorcrypt.
"""
import hashlib
import math
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


MASK32 = 0xFFFFFFFF
MD5_SHIFTS = [7, 12, 17, 22] * 4 + [5, 9, 14, 20] * 4 + [4, 11, 16, 23] * 4 + [6, 10, 15, 21] * 4
MD5_SINES = [int(abs(math.sin(i + 1)) * 2**32) & MASK32 for i in range(64)]
MD5_INITIAL_STATE = (0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476)


def md5_compress(state, block):
    """MD5's compression function on one 64-byte block (RFC 1321, section 3.4)."""
    words = struct.unpack("<16I", block)
    a, b, c, d = state
    for i in range(64):
        if i < 16:
            f, g = (b & c) | (~b & d), i
        elif i < 32:
            f, g = (d & b) | (~d & c), (5 * i + 1) % 16
        elif i < 48:
            f, g = b ^ c ^ d, (3 * i + 5) % 16
        else:
            f, g = c ^ (b | ~d), (7 * i) % 16
        f = (f + a + MD5_SINES[i] + words[g]) & MASK32
        a, d, c = d, c, b
        b = (b + ((f << MD5_SHIFTS[i]) | (f >> (32 - MD5_SHIFTS[i])))) & MASK32
    return tuple((x + y) & MASK32 for x, y in zip(state, (a, b, c, d)))


# The compression function checked against hashlib: MD5 of the empty message is one padding block.
EMPTY_MESSAGE_BLOCK = b"\x80" + bytes(63)
assert struct.pack("<4I", *md5_compress(MD5_INITIAL_STATE, EMPTY_MESSAGE_BLOCK)) == hashlib.md5().digest()


def lmk_iv(plaintext, n):
    """dm-crypt's lmk (no seed): MD5's state, unpadded, after plaintext blocks 1 to 31 and the
    sector number (56 bits, tagged), its words little endian."""
    trailer = struct.pack("<4I", n & MASK32, ((n >> 32) & 0xFFFFFF) | 0x80000000, 4024, 0)
    message = plaintext[16:512] + trailer
    state = MD5_INITIAL_STATE
    for j in range(0, len(message), 64):
        state = md5_compress(state, message[j : j + 64])
    return struct.pack("<4I", *state)


def lmk(key, n, sector, encrypt):
    """CBC whose IV is lmk_iv of the plaintext; decryption recovers blocks 1 to 31 first."""
    if encrypt:
        enc = Cipher(algorithms.AES(key), modes.CBC(lmk_iv(sector, n))).encryptor()
        return enc.update(sector) + enc.finalize()
    dec = Cipher(algorithms.AES(key), modes.CBC(bytes(16))).decryptor()
    plain = dec.update(sector) + dec.finalize()
    first = bytes(p ^ q for p, q in zip(plain[:16], lmk_iv(plain, n)))
    return first + plain[16:]


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
        if ivgen == "lmk":
            assert mode == "cbc" and sector_size == 512, spec
            out += lmk(key, n, sector, direction == "encrypt")
            continue
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
