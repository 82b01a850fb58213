//! The EXAMPLES of each command's `--help` (and man page): two or three commands a user would
//! type, with what they do.

pub(crate) const BENCHMARK: &str = "Examples:
  sectorcrypt benchmark                                   # the cipher table, in memory
  sectorcrypt benchmark --cipher lea-xts-plain64 --json   # one JSON line per measurement
  sectorcrypt benchmark --device disk.img --key-file pass.txt   # timed reads of a volume";

pub(crate) const DUMP: &str = "Examples:
  sectorcrypt dump disk.img                       # the header, as cryptsetup luksDump
  sectorcrypt dump --json disk.img                # the LUKS2 JSON and binary-header fields
  sectorcrypt dump --header disk.hdr disk.img     # a detached header";

pub(crate) const IS_LUKS: &str = "Examples:
  sectorcrypt is-luks disk.img && echo encrypted
  sectorcrypt is-luks -v /dev/sdb                       # says why not";

pub(crate) const UUID: &str = "Examples:
  sectorcrypt uuid disk.img
  sectorcrypt uuid --header disk.hdr disk.img           # a detached header";

pub(crate) const TEST_PASSPHRASE: &str = "Examples:
  sectorcrypt test-passphrase disk.img                  # asks; exit 0 if it opens, 2 if not
  sectorcrypt test-passphrase --key-file pass.txt -S 1 disk.img";

pub(crate) const FORMAT: &str = "Examples:
  sectorcrypt format disk.img                           # LUKS2, aes-xts-plain64, asks twice
  sectorcrypt format --type luks1 --key-file pass.txt -q disk.img
  sectorcrypt format --header disk.hdr --cipher lea-xts-plain64 disk.img";

pub(crate) const ADD_KEY: &str = "Examples:
  sectorcrypt add-key disk.img                          # asks for an existing and a new passphrase
  sectorcrypt add-key --key-file old.txt disk.img new.txt";

pub(crate) const REMOVE_KEY: &str = "Examples:
  sectorcrypt remove-key disk.img                       # asks which passphrase to remove
  sectorcrypt remove-key --key-file old.txt disk.img";

pub(crate) const CHANGE_KEY: &str = "Examples:
  sectorcrypt change-key disk.img                       # asks for the old and the new one
  sectorcrypt change-key --key-file old.txt disk.img new.txt";

pub(crate) const KILL_SLOT: &str = "Examples:
  sectorcrypt kill-slot disk.img 3                      # asks for a passphrase that remains
  sectorcrypt kill-slot -q disk.img 3                   # without asking";

pub(crate) const ENROLL: &str = "Examples:
  sectorcrypt enroll disk.img --tpm2-device auto --tpm2-pcrs 7 --key-file pass.txt
  sectorcrypt enroll disk.img --pkcs11-token-uri auto --wipe-slot password
  sectorcrypt enroll disk.img --clevis tang http://tang.example --tang-thumbprint THP --key-file pass.txt
  sectorcrypt serve disk.img --token-only --token-pin-file pin.txt --socket /tmp/disk.sock";

pub(crate) const HEADER_BACKUP: &str = "Examples:
  sectorcrypt header-backup disk.img --header-backup-file disk.hdr.bak
  sectorcrypt header-backup rbd:rbd/vm1 --header-backup-file vm1.hdr.bak";

pub(crate) const HEADER_RESTORE: &str = "Examples:
  sectorcrypt header-restore disk.img --header-backup-file disk.hdr.bak
  sectorcrypt header-restore -q disk.img --header-backup-file disk.hdr.bak   # without asking";

pub(crate) const CONFIG: &str = "Examples:
  sectorcrypt config --label backups disk.img
  sectorcrypt config --priority prefer -S 1 disk.img";

pub(crate) const ERASE: &str = "Examples:
  sectorcrypt erase disk.img                            # every keyslot gone: the data is lost
  sectorcrypt erase -q disk.img                         # without asking";

pub(crate) const REPAIR: &str = "Examples:
  sectorcrypt repair disk.img                           # the damaged copy from the good one
  sectorcrypt repair --header disk.hdr disk.img";

pub(crate) const CONVERT: &str = "Examples:
  sectorcrypt convert --type luks2 old.img
  sectorcrypt convert --type luks1 -q disk.img";

pub(crate) const TOKEN: &str = "Examples:
  sectorcrypt token import --json-file token.json disk.img
  sectorcrypt token export --token-id 0 disk.img
  sectorcrypt token remove --token-id 0 disk.img";

pub(crate) const ENCRYPT: &str = "Examples:
  sectorcrypt encrypt --header disk.hdr disk.img                # header in a file, data in place
  sectorcrypt encrypt --reduce-device-size 32M disk.img         # header at the start of the device
  sectorcrypt encrypt --header disk.hdr disk.img                # again after a crash: resumes";

pub(crate) const DECRYPT: &str = "Examples:
  sectorcrypt decrypt --header disk.hdr disk.img                # a detached header
  sectorcrypt decrypt --header exported.hdr disk.img            # a header on the device";

pub(crate) const REENCRYPT: &str = "Examples:
  sectorcrypt reencrypt disk.img                                # a new volume key
  sectorcrypt reencrypt --cipher lea-xts-plain64 disk.img       # and a new cipher
  sectorcrypt reencrypt --resume-only disk.img                  # finish an interrupted one";

pub(crate) const SERVE: &str = "Examples:
  sectorcrypt serve disk.img --socket /run/disk.sock
  qemu-img info 'nbd+unix:///?socket=/run/disk.sock'            # any NBD client
  sectorcrypt serve --readonly rbd:rbd/vm1 --listen 127.0.0.1:10809
  sectorcrypt serve disk.img --listen 0.0.0.0:10809 --tls require --tls-certificates /etc/pki/nbd";

pub(crate) const RESIZE: &str = "Examples:
  truncate -s +1G disk.img && sectorcrypt resize disk.img   # grow to the data added (served)
  sectorcrypt resize disk.img --device-size 512M -q         # shrink what clients see
  rbd resize --size 20G pool/img && sectorcrypt resize rbd:pool/img";

pub(crate) const MOUNT: &str = "Examples:
  sectorcrypt mount disk.img /mnt/disk                          # /mnt/disk/volume
  mkfs.ext4 /mnt/disk/volume && fusermount3 -u /mnt/disk";

pub(crate) const FLASH: &str = "Examples:
  sectorcrypt flash format chip.img --size 64MiB                # a new encrypted NAND image
  sectorcrypt flash import chip.img rootfs.ubi                  # a ubinize image, encrypted
  sectorcrypt flash attach chip.img /mnt/ubi --socket-dir /run/ubi";

pub(crate) const KPIO: &str = "Examples:
  sectorcrypt kpio serve store.img --key-table keys.bin --socket /run/kpio.sock
  kill -HUP PID                                                 # reload the key table
  sectorcrypt kpio benchmark --keys 1,256,65536";

pub(crate) const GENERATE: &str = "Examples:
  sectorcrypt generate man /usr/local/share/man/man8
  sectorcrypt generate completions ~/.local/share/sectorcrypt";
