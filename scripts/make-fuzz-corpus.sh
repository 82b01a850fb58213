#!/usr/bin/env bash
# Make the fuzz seeds (fuzz/corpus/TARGET/) again from the real tools: cryptsetup for LUKS,
# ubinize for UBI, `sectorcrypt flash format` for encrypted flashes, NBD clients (nbdinfo,
# qemu-img, nbdcopy, and a raw client for the rarer paths) recorded through a relay in front
# of `sectorcrypt serve`, data/flash-traces/ for traces. Random bytes (salts, keys, UUIDs)
# differ from run to run; the committed seeds are what the replay test and the fuzz runs use.
#
#   scripts/make-fuzz-corpus.sh [OUT]   (default: fuzz/corpus; needs cryptsetup-bin,
#                                        mtd-utils, qemu-utils, libnbd-bin, python3)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
out="$(realpath -m "${1:-fuzz/corpus}")"
cargo build -q -p sectorcrypt
sc="$root/target/debug/sectorcrypt"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
mkdir -p "$out"/{luks_header,luks2_json,luks1,ubi_attach,flash_metadata,nbd_session,kpio_keytable,nanddump_device,flash_trace,token_wire,integrity_device}
printf fuzz >pw
printf other >pw2
truncate -s 4M data.img

# LUKS2 detached headers: small areas, PBKDF2 at 1000 iterations so the seeds stay small and cheap.
small=(--luks2-metadata-size 16k --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-size 256)
format() { cryptsetup luksFormat -q --key-file pw "$@" 2>/dev/null; }
format --type luks2 --header basic.hdr "${small[@]}" --luks2-keyslots-size 128k \
    --label fuzzlabel --subsystem fuzzsub data.img
format --type luks2 --header tokens.hdr "${small[@]}" --luks2-keyslots-size 128k data.img
echo '{"type":"sectorcrypt-test","keyslots":["0"],"note":"imported","n":[1,2,3]}' |
    cryptsetup token import --header tokens.hdr data.img
cryptsetup token add --header tokens.hdr --key-description fuzz:key --token-id 5 data.img
format --type luks2 --header argon.hdr --luks2-metadata-size 32k --luks2-keyslots-size 1m \
    --pbkdf argon2id --pbkdf-memory 64 --pbkdf-force-iterations 4 --key-size 512 --sector-size 512 data.img
cryptsetup luksAddKey -q --header argon.hdr --key-file pw --pbkdf pbkdf2 \
    --pbkdf-force-iterations 1000 --key-slot 7 data.img pw2
cryptsetup config --header argon.hdr --priority prefer --key-slot 7 data.img
format --type luks2 --header reencrypt.hdr "${small[@]}" --luks2-keyslots-size 512k data.img
cryptsetup reencrypt -q --init-only --header reencrypt.hdr --key-file pw --pbkdf pbkdf2 \
    --pbkdf-force-iterations 1000 --resilience checksum data.img
format --type luks2 --header decrypt.hdr "${small[@]}" --luks2-keyslots-size 512k data.img
cryptsetup reencrypt -q --decrypt --init-only --force-offline-reencrypt --header decrypt.hdr \
    --key-file pw data.img
truncate -s 4M plain.img
cryptsetup reencrypt -q --encrypt --init-only --header encrypt.hdr --key-file pw "${small[@]}" \
    --luks2-keyslots-size 512k plain.img </dev/null 2>/dev/null
truncate -s 8M shift.img
cryptsetup reencrypt -q --encrypt --init-only --reduce-device-size 4M --key-file pw "${small[@]}" \
    --luks2-keyslots-size 512k --resilience journal shift.img 2>/dev/null
for h in basic tokens reencrypt; do cp "$h.hdr" "$out/luks_header/l2-$h"; done
python3 - "$out/luks2_json" <<'PY'
import sys
names = {"basic.hdr": "l2-basic", "tokens.hdr": "l2-tokens", "argon.hdr": "l2-argon",
         "reencrypt.hdr": "l2-reencrypt", "decrypt.hdr": "l2-decrypt",
         "encrypt.hdr": "l2-encrypt", "shift.img": "l2-encrypt-datashift"}
for src, name in names.items():
    b = open(src, "rb").read()
    open(f"{sys.argv[1]}/{name}.json", "wb").write(b[4096:b.index(b"\0", 4096)])
PY

# LUKS1: the header and the keyslot areas that are in use.
truncate -s 4M l1.img l1e.img
format --type luks1 --pbkdf-force-iterations 1000 --key-size 256 l1.img
format --type luks1 --pbkdf-force-iterations 1000 --key-size 256 --cipher aes-cbc-essiv:sha256 \
    --hash sha1 l1e.img
cryptsetup luksAddKey -q --key-file pw --pbkdf-force-iterations 1000 l1e.img pw2
head -c 132096 l1.img >"$out/luks1/l1-xts-one-slot"
head -c 263168 l1e.img >"$out/luks1/l1-cbc-essiv-two-slots"
head -c 132096 l1.img >"$out/luks_header/l1-xts"

# UBI images for a small-page chip (the ubi_attach target's geometry).
head -c 20000 /dev/urandom >static.bin
head -c 3000 "$root/README.md" >dyn.bin
cat >a.ini <<'INI'
[data]
mode=ubi
image=dyn.bin
vol_id=0
vol_size=64KiB
vol_type=dynamic
vol_name=data
vol_flags=autoresize
INI
cat >b.ini <<'INI'
[config]
mode=ubi
image=static.bin
vol_id=3
vol_type=static
vol_name=firmware
vol_alignment=1
[rootfs]
mode=ubi
image=dyn.bin
vol_id=7
vol_size=48KiB
vol_type=dynamic
vol_name=rootfs
[empty]
mode=ubi
vol_id=9
vol_size=16KiB
vol_type=dynamic
vol_name=empty
INI
ubinize -o "$out/ubi_attach/ubinize-dynamic-autoresize.ubi" -p 16KiB -m 512 -s 512 -e 3 -Q 1234 a.ini
ubinize -o "$out/ubi_attach/ubinize-static-dynamic-empty.ubi" -p 16KiB -m 512 -s 512 b.ini 2>/dev/null

# Encrypted flashes on a 2 MiB raw dump of the flash_metadata target's geometry: the first four
# eraseblocks (the header area's journal and both LUKS2 copies with the flash token); and, made
# with the identity cipher so that the journal's records read, the rewrite journal after a
# volume was created and written, moved to the blocks the target looks at without a header.
geom='peb=16K&page=512&subpage=512&oob=16'
fmt_flash=(flash format -q --key-file pw --pbkdf pbkdf2 --pbkdf-force-iterations 1000)
for policy in at-rest visible; do
    python3 -c "open('chip-$policy.bin','wb').write(b'\xff' * (2 << 20))"
    "$sc" "${fmt_flash[@]}" --key-size 256 --policy "$policy" "nanddump:chip-$policy.bin?$geom"
    head -c $((4 * 16384)) "chip-$policy.bin" >"$out/flash_metadata/header-area-$policy-aes-xts"
done
python3 -c "open('chip-null.bin','wb').write(b'\xff' * (2 << 20))"
"$sc" "${fmt_flash[@]}" --cipher cipher_null-ecb "nanddump:chip-null.bin?$geom"
"$sc" flash mkvol --key-file pw -N data -s 64K "nanddump:chip-null.bin?$geom" >/dev/null
head -c 20000 "$root/README.md" >vol.bin
"$sc" flash update --key-file pw --name data "nanddump:chip-null.bin?$geom" vol.bin
head -c $((4 * 16384)) chip-null.bin >"$out/flash_metadata/header-area-cipher-null"
python3 - "$out/flash_metadata/rewrite-journal-cipher-null-relocated" <<'PY'
import sys
P = 16384
b = open("chip-null.bin", "rb").read()
# Blocks 67..70 hold the rewrite journal and UBI starts at 71 on this chip (`sectorcrypt flash info`).
seed = b"\xff" * (4 * P) + b[67 * P:71 * P] + b[71 * P:80 * P]
open(sys.argv[1], "wb").write(seed.rstrip(b"\xff"))
PY

# NBD sessions: what clients send, recorded by a relay in front of `sectorcrypt serve`.
truncate -s 8M vol.img
format --type luks2 "${small[@]}" --luks2-keyslots-size 128k vol.img
"$sc" serve vol.img --key-file pw --allow-discards --socket "$work/server.sock" 2>/dev/null &
python3 "$root/scripts/nbd-record.py" "$work/server.sock" "$work/relay.sock" "$work/rec" &
for _ in $(seq 50); do [ -S "$work/relay.sock" ] && [ -S "$work/server.sock" ] && break; sleep 0.1; done
uri="nbd+unix:///?socket=$work/relay.sock"
head -c 65536 /dev/urandom >small.bin
nbdinfo "$uri" >/dev/null
nbdinfo --list "$uri" >/dev/null
qemu-img info "$uri" >/dev/null
qemu-img convert -n -f raw -O raw small.bin "$uri"
qemu-img convert -f raw -O raw "$uri" back.bin
nbdcopy --connections=1 small.bin "$uri"
nbdcopy --connections=1 "$uri" - >/dev/null
python3 "$root/scripts/nbd-record.py" --client "$work/relay.sock" structured
python3 "$root/scripts/nbd-record.py" --client "$work/relay.sock" exportname
sleep 1
i=1
for name in nbdinfo nbdinfo-list qemu-img-info qemu-img-convert-in qemu-img-convert-out \
    nbdcopy-in nbdcopy-out raw-client-structured raw-client-export-name; do
    cp "rec/conn-$(printf %03d $i)" "$out/nbd_session/$name"
    i=$((i + 1))
done

# kpio key tables: the first byte picks the cipher and key size (see the target), the rest is
# the file as a key manager writes it: random keys, all zeros for an empty tag.
python3 - "$out/kpio_keytable" <<'PY'
import os, sys
d, r = sys.argv[1], os.urandom
open(f"{d}/xts512-three-keys-one-empty", "wb").write(bytes([0]) + r(64) + bytes(64) + r(64) + r(64))
open(f"{d}/xts256-eight-keys", "wb").write(bytes([1]) + b"".join(r(32) for _ in range(8)))
open(f"{d}/essiv-one-key", "wb").write(bytes([2]) + r(32))
open(f"{d}/serpent-sixteen-keys-some-empty", "wb").write(
    bytes([3]) + b"".join(r(64) if i % 3 else bytes(64) for i in range(16)))
PY

# nanddump: device names as users write them.
printf 'nanddump:chip.bin' >"$out/nanddump_device/default-slc"
printf 'nanddump:/var/tmp/mtd0.dump?peb=16KiB&page=512&subpage=512&oob=16&layout=oob' \
    >"$out/nanddump_device/small-page-with-oob"
printf 'nanddump:dump.bin?peb=256K&page=4096&subpage=4096&oob=224&layout=data' \
    >"$out/nanddump_device/mlc-4k-pages"
printf 'nanddump:a?b=c.bin?peb=128K&page=2048' >"$out/nanddump_device/question-marks-in-name"
printf 'nanddump:x?peb=64M&page=65536&subpage=512&oob=8192&layout=oob' \
    >"$out/nanddump_device/largest-geometry"

# Traces: a whole compressed one, the head of another, and the operations on the first eight
# eraseblocks of a third on a chip of eight (small enough to replay), with syncs added.
traces="$root/data/flash-traces"
cp "$traces/C-iozone.trace.xz" "$out/flash_trace/C-iozone.trace.xz"
# (head closes the pipe early: xz is ended by SIGPIPE, which is expected)
xz -dc "$traces/A-write-rewrite.trace.xz" | head -300 >"$out/flash_trace/A-write-rewrite-head.trace" || true
xz -dc "$traces/C-iozone.trace.xz" | python3 -c '
import sys
out, n = [], 0
for l in sys.stdin.read().splitlines():
    if l.startswith("# peb_size"):
        out.append(l.replace("peb_count 512", "peb_count 8"))
    elif l.startswith("#"):
        if "workload starts" in l or l.startswith("# ubitrace"):
            out.append(l)
    elif int(l.split()[1]) < 8 and n < 400:
        out.append(l)
        n += 1
        if n % 50 == 0:
            out.append("S")
print("\n".join(out))' >"$out/flash_trace/C-iozone-first-8-pebs-with-syncs.trace"

# token_wire: the token types' wire formats, the first byte naming the parser (0 CBOR, 1 CTAPHID
# reports, 2 HTTP replies, 3 FIDO2 authenticator data, 4 TPM structures, 5 JSON): CBOR made by
# python-fido2, tang's advertisement as the token crate's tests keep it, systemd's token shapes.
python3 - "$out/token_wire" "$root" <<'PYEOF'
import base64, json, os, struct, sys
from fido2 import cbor
out, root = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
def put(name, which, body):
    open(os.path.join(out, name), "wb").write(bytes([which]) + body)
# 0: a getInfo answer as a FIDO2 key gives it (versions, extensions, AAGUID, options, PIN protocols).
info = {1: ["FIDO_2_0", "FIDO_2_1"], 2: ["credProtect", "hmac-secret"], 3: bytes(range(16)),
        4: {"rk": True, "up": True, "clientPin": True, "uv": False}, 5: 1200, 6: [2, 1]}
put("cbor-getinfo", 0, cbor.encode(info))
# 1: that answer as CTAPHID reports on channel 01020304 (status byte first).
msg = b"\x00" + cbor.encode(info)
frames = [bytes([1, 2, 3, 4, 0x90]) + struct.pack(">H", len(msg)) + msg[:57]]
rest, seq = msg[57:], 0
while rest:
    frames.append(bytes([1, 2, 3, 4, seq]) + rest[:59]); rest, seq = rest[59:], seq + 1
put("ctaphid-getinfo", 1, b"".join(f.ljust(64, b"\0") for f in frames))
# 2: tang's answer to GET /adv (the advertisement the token crate's tests keep).
adv = open(os.path.join(root, "crates/token/tests/data/tang-adv.json"), "rb").read()
put("http-adv", 2, b"HTTP/1.1 200 OK\r\nContent-Type: application/jose+json\r\nContent-Length: %d\r\n\r\n" % len(adv) + adv)
put("http-chunked", 2, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n")
# 3: authenticator data with a credential, its COSE key and the hmac-secret extension.
cose = cbor.encode({1: 2, 3: -7, -1: 1, -2: bytes(32), -3: bytes(range(32))})
auth = bytes(32) + b"\xc1" + struct.pack(">I", 9) + bytes(16) + struct.pack(">H", 64) + bytes(range(64)) + cose + cbor.encode({"hmac-secret": bytes(48)})
put("authdata", 3, auth)
# 4: a systemd-tpm2 blob (TPM2B_PRIVATE || TPM2B_PUBLIC) systemd-cryptenroll 252 wrote.
blob = base64.b64decode("AJ4AIK8gft/kByPKMW0WEj3jix0FV5ENpNPb8mpcJSdTLDMqABAFuMAmPj1kCHRZPE7y/eGhYyk/wF4MDG5E1kEZStRBFcZJ0P4lKpZgjkKM8Jy2RCsLjw+BXgzUZIqkEAT77MV2Ran7Mnm36QD9Oc6Usp4KHW+OXrTMFJEu5b8NnuEHpZOJyM4L825caa06dlIek5Cb0rLs7QjtlahY/QBOAAgACwAAABIAIItWgtgbKUNdCNeSeBUGEdx+WSOy/vzOaEoJV3tAEwqLABAAIONUkKea0KOtBfwE25wyEieDncX1Jt3IV0SUBIorOfH8")
put("tpm2-blob", 4, blob)
# 5: JSON: the tang advertisement (a JWS), and tokens in systemd's and clevis' shapes.
put("json-adv", 5, adv)
put("json-tpm2-token", 5, json.dumps({"type": "systemd-tpm2", "keyslots": ["1"], "tpm2-blob": base64.b64encode(blob).decode(),
    "tpm2-pcrs": [7], "tpm2-pcr-bank": "sha256", "tpm2-primary-alg": "ecc",
    "tpm2-policy-hash": "8b5682d81b29435d08d79278150611dc7e5923b2fefcce684a09577b40130a8b", "tpm2-pin": False}).encode())
put("json-fido2-token", 5, json.dumps({"type": "systemd-fido2", "keyslots": ["1"], "fido2-credential": base64.b64encode(bytes(64)).decode(),
    "fido2-salt": base64.b64encode(bytes(32)).decode(), "fido2-rp": "io.systemd.cryptsetup",
    "fido2-clientPin-required": True, "fido2-up-required": True, "fido2-uv-required": False}).encode())
hdr = base64.urlsafe_b64encode(json.dumps({"alg": "dir", "enc": "A256GCM", "clevis": {"pin": "tpm2", "tpm2": {"hash": "sha256", "key": "ecc", "jwk_pub": "AA", "jwk_priv": "AA"}}}).encode()).rstrip(b"=").decode()
put("json-clevis-jwe", 5, json.dumps({"protected": hdr, "encrypted_key": "", "iv": "AAAAAAAAAAAAAAAA", "ciphertext": "AAAA", "tag": "AAAAAAAAAAAAAAAAAAAAAA"}).encode())
PYEOF
# integrity_device: small devices formatted and written by the integrity crate, as the kernel
# would have them.
(cd "$root" && cargo run -q -p sectorcrypt-fuzzing --example integrity-seeds -- "$out/integrity_device")
echo "seeds written to $out"
