#!/bin/bash
# systemd's side of the TPM2 token tests (crates/sectorcrypt/tests/cli/tokens.rs), run as root
# inside the kernel oracle's guest (scripts/kernel-oracle.sh with SECTORCRYPT_ORACLE_TPM), whose
# kernel drives the test's swtpm as /dev/tpmrm0 exactly as it drives a chip:
#
#   kernel-oracle-tpm2.sh IMAGE PASSFILE PINFILE TOKENS... -- PCRS
#       for each token number in TOKENS: `cryptsetup open --test-passphrase --token-only
#       --token-id N` through systemd's TPM2 token plugin (the PIN, if it asks, from PINFILE),
#       one line `open N ok|failed STATUS`; then `systemd-cryptenroll --tpm2-device=auto
#       --tpm2-pcrs=PCRS` (no PIN) unlocked by PASSFILE: `enroll ok|failed STATUS`; then PCR 23
#       is extended (tpm2-tools) and the first token tried again: `changed N ok|failed STATUS`.
set -u
image=$1 pass=$2 pin=$3
shift 3
modprobe loop || exit 2
[ -c /dev/tpmrm0 ] || { echo "no /dev/tpmrm0 in the guest"; exit 3; }
# On the 9p share the image goes to cryptsetup as a loop device (its direct I/O fails there).
dev=$(losetup -f --show "$image") || exit 2
first=$1
while [ "$1" != "--" ]; do
  status=0
  cryptsetup open --test-passphrase --token-only --token-id "$1" -v "$dev" <"$pin" || status=$?
  if [ "$status" = 0 ]; then echo "open $1 ok"; else echo "open $1 failed $status"; fi
  shift
done
pcrs=$2
status=0
systemd-cryptenroll --unlock-key-file="$pass" --tpm2-device=auto --tpm2-pcrs="$pcrs" "$dev" || status=$?
if [ "$status" = 0 ]; then echo "enroll ok"; else echo "enroll failed $status"; fi
status=0
TPM2TOOLS_TCTI=device:/dev/tpmrm0 tpm2_pcrextend \
  23:sha256=0000000000000000000000000000000000000000000000000000000000000001 || status=$?
[ "$status" = 0 ] || echo "extend failed $status"
status=0
cryptsetup open --test-passphrase --token-only --token-id "$first" -v "$dev" <"$pin" || status=$?
if [ "$status" = 0 ]; then echo "changed $first ok"; else echo "changed $first failed $status"; fi
sync
losetup -d "$dev"
