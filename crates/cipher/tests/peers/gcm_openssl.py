#!/usr/bin/env python3
"""Independent AES-GCM with OpenSSL (via the `cryptography` package).

Reads jobs from stdin, one per line:  KEY_HEX NONCE_HEX AAD_HEX DATA_HEX  (an empty field is "-")
and prints the ciphertext followed by the 16-byte tag, as hex, one line per job.
"""
import sys

from cryptography.hazmat.primitives.ciphers.aead import AESGCM


def field(s):
    return b"" if s == "-" else bytes.fromhex(s)


for line in sys.stdin:
    key, nonce, aad, data = (field(s) for s in line.split())
    print(AESGCM(key).encrypt(nonce, data, aad).hex() or "-")
