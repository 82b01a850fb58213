//! LUKS2 reencryption metadata against the real cryptsetup 2.6, both ways:
//!
//! - what `cryptsetup reencrypt --init-only` writes (encrypt with a detached header, encrypt with
//!   a data shift, reencrypt, decrypt with a detached header), and what interrupted (SIGINT) and
//!   crashed (SIGKILL) runs leave, reads here with the right state, keyslot and backup segments,
//!   and its reencryption digest verifies with the volume keys; a tampered field makes it fail;
//! - the builders make, from the same starting header, the JSON cryptsetup makes (salts and
//!   digest values aside), and cryptsetup accepts a header written from them, resumes the
//!   operation to the end, and the data is then what it should be.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::luks2_support::*;
use sectorcrypt_cipher::spec::CipherSpec;
use sectorcrypt_cipher::{SectorCipher, SectorOptions};
use sectorcrypt_luks::hash::Hash;
use sectorcrypt_luks::luks2::reencrypt::{
    self, Direction, InitOptions, Mode, Resilience, ResilienceKind, SegmentKind, State, Target,
};
use sectorcrypt_luks::luks2::Header;
use sectorcrypt_luks::Error;
use sectorcrypt_storage::FileStorage;
use sectorcrypt_testkit::fault;
use sectorcrypt_testkit::{pattern, Scratch};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const PASS: &str = "reencrypt passphrase";
const CIPHER: &str = "aes-xts-plain64";

/// A scratch directory with a key file and two known volume keys.
struct Fixture {
    dir: Scratch,
    key: PathBuf,
    vk1: Vec<u8>,
    vk1_file: PathBuf,
    vk2: Vec<u8>,
    vk2_file: PathBuf,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        let dir = scratch(&format!("reencrypt-{name}"));
        let key = key_file(&dir, "pass", PASS);
        let vk1 = pattern(64, 1);
        let vk2 = pattern(64, 2);
        let vk1_file = dir.join("vk1.bin");
        let vk2_file = dir.join("vk2.bin");
        std::fs::write(&vk1_file, &vk1).unwrap();
        std::fs::write(&vk2_file, &vk2).unwrap();
        Fixture {
            dir,
            key,
            vk1,
            vk1_file,
            vk2,
            vk2_file,
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `cryptsetup luksFormat --type luks2 EXTRA... DEV` holding the first volume key.
    fn format(&self, dev: &Path, extra: &[&str]) {
        let mut args = vec!["luksFormat", "--type", "luks2"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--volume-key-file", path(&self.vk1_file), path(dev)]);
        self.cs(&args);
    }

    /// `cryptsetup luksFormat` of `dev` with the data at `offset` (bytes) and `sector_size`,
    /// holding the first volume key.
    fn format_attached(&self, dev: &Path, offset: u64, sector_size: u32) {
        let offset = (offset / 512).to_string();
        self.format(
            dev,
            &[
                "--offset",
                &offset,
                "--sector-size",
                &sector_size.to_string(),
            ],
        );
    }

    /// `cryptsetup reencrypt ARGS... --force-offline-reencrypt --init-only DEV`: the operation
    /// recorded in the header, nothing converted.
    fn init_only(&self, args: &[&str], dev: &Path) {
        let mut all = vec!["reencrypt"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--force-offline-reencrypt", "--init-only", path(dev)]);
        self.cs(&all);
    }

    /// [`Fixture::init_only`] of an encryption of `dev` to the first volume key.
    fn init_encrypt(&self, extra: &[&str], dev: &Path) {
        let mut args = vec!["--encrypt", "--type", "luks2"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--volume-key-file", path(&self.vk1_file)]);
        self.init_only(&args, dev);
    }

    /// `cryptsetup ARGS... --batch-mode --key-file K` with the fast PBKDF2, insisting on success.
    fn cs(&self, args: &[&str]) -> String {
        let mut all: Vec<&str> = args.to_vec();
        // cryptsetup refuses PBKDF options for actions that make no keyslot or digest.
        if matches!(args[0], "luksFormat" | "luksAddKey" | "reencrypt") {
            all.extend_from_slice(FAST_PBKDF2);
        }
        all.extend_from_slice(&["--batch-mode", "--key-file", path(&self.key)]);
        cryptsetup_ok(&all)
    }
}

fn read_header(p: &Path) -> Header {
    Header::read(&FileStorage::open_read_only(p).unwrap()).unwrap()
}

/// The header at `p`, which must record no operation any more.
fn finished(p: &Path) -> Header {
    let h = read_header(p);
    assert_eq!(reencrypt::state(h.metadata()), State::None);
    h
}

/// The volume keys the reencryption header `h` (read from the file `p`) opens with [`PASS`].
fn unlock_keys(h: &Header, p: &Path) -> reencrypt::VolumeKeys {
    let dev = FileStorage::open_read_only(p).unwrap();
    reencrypt::unlock_volume_keys(h, &dev, PASS.as_bytes()).unwrap()
}

/// Replace every salt and digest value (random) by a placeholder.
fn mask(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "salt" || k == "digest" {
                    *x = json!("*");
                } else {
                    mask(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(mask),
        _ => {}
    }
}

/// Encrypt or decrypt `buf` in place as a segment does: `logical` is the byte offset of `buf`
/// inside the segment (IVs count 512-byte units from the segment's start).
fn crypt_data(vk: &[u8], sector_size: usize, buf: &mut [u8], logical: u64, encrypt: bool) {
    let opts = SectorOptions {
        sector_size,
        ..SectorOptions::default()
    };
    let c = SectorCipher::new(CipherSpec::parse(CIPHER).unwrap(), vk, &opts).unwrap();
    let first = logical / sector_size as u64;
    if encrypt {
        c.encrypt(buf, first).unwrap();
    } else {
        c.decrypt(buf, first).unwrap();
    }
}

fn read_range(p: &Path, offset: u64, len: u64) -> Vec<u8> {
    let all = std::fs::read(p).unwrap();
    all[offset as usize..(offset + len) as usize].to_vec()
}

/// Run `cryptsetup reencrypt --resume-only` (checksum resilience given again, so that cryptsetup
/// does not rewrite the keyslot and its digest) until it finishes.
fn resume(f: &Fixture, hdr: Option<&Path>, data: &Path, extra: &[&str]) {
    let mut args = vec![
        "reencrypt",
        "--resume-only",
        "--force-offline-reencrypt",
        "--hotzone-size",
        "4M",
    ];
    if let Some(h) = hdr {
        args.extend_from_slice(&["--header", path(h)]);
    }
    args.extend_from_slice(extra);
    args.push(path(data));
    f.cs(&args);
}

/// The checks every cryptsetup-written in-progress header must pass here.
struct Expect {
    mode: Mode,
    direction: Direction,
    area_type: &'static str,
    version: u8,
    moved: bool,
}

/// What `reencrypt --encrypt --header` records: checksum resilience, forward.
const DETACHED_ENCRYPTION: Expect = Expect {
    mode: Mode::Encrypt,
    direction: Direction::Forward,
    area_type: "checksum",
    version: 2,
    moved: false,
};

fn check_parsed(h: &Header, e: &Expect) -> reencrypt::Reencryption {
    let r = reencrypt::parse(h.metadata())
        .unwrap()
        .expect("a reencryption");
    assert_eq!(r.keyslot.mode, e.mode);
    assert_eq!(r.keyslot.direction, e.direction);
    assert_eq!(r.keyslot.resilience.area_type(), e.area_type);
    assert_eq!(r.version, e.version);
    assert_eq!(r.backup_moved.is_some(), e.moved);
    assert!(r.backup_previous.has_flag("backup-previous"));
    assert!(r.backup_final.has_flag("backup-final"));
    assert!(r.digest.is_some(), "cryptsetup always writes the digest");
    let linear_prev = r.backup_previous.kind == SegmentKind::Linear;
    let linear_final = r.backup_final.kind == SegmentKind::Linear;
    assert_eq!(r.digest_old.is_none(), linear_prev);
    assert_eq!(r.digest_new.is_none(), linear_final);
    assert!(!r.segments.is_empty());
    assert!(r
        .segments
        .iter()
        .all(|s| !s.flags.iter().any(|f| f.starts_with("backup-"))));
    assert_eq!(r.state(), reencrypt::state(h.metadata()));
    r
}

/// Header bytes with `edit` applied to both JSON copies (resealed).
fn tampered(hdr: &Path, edit: impl Fn(&mut Value)) -> Header {
    let mut bytes = std::fs::read(hdr).unwrap();
    edit_json(&mut bytes, edit);
    let p = hdr.with_extension("tampered");
    std::fs::write(&p, &bytes).unwrap();
    read_header(&p)
}

/// `theirs` with the iterations of the reencryption digest set to the count the builders are
/// given: cryptsetup benchmarks that digest.
fn with_forced_digest_iterations(mut theirs: Value) -> Value {
    let slot = reencrypt_keyslot(&theirs);
    for d in theirs["digests"].as_object_mut().unwrap().values_mut() {
        if d["keyslots"] == json!([slot]) {
            d["iterations"] = json!(1000);
        }
    }
    theirs
}

/// A change to the JSON metadata.
type Edit = Box<dyn Fn(&mut Value)>;

/// Each tampering of a digest-covered field makes the digest check fail (with the right keys);
/// a change of the regular segments does not.
fn assert_tampering_detected(hdr: &Path, old: Option<&[u8]>, new: Option<&[u8]>) {
    let v = json_at(&std::fs::read(hdr).unwrap(), 0);
    let ks = reencrypt_keyslot(&v);
    let prev = find_flag(&v, "backup-previous");
    let edits: Vec<(&str, Edit)> = vec![
        (
            "direction",
            Box::new({
                let ks = ks.clone();
                move |v: &mut Value| {
                    let d = &mut v["keyslots"][&ks]["direction"];
                    *d = json!(if d == "forward" {
                        "backward"
                    } else {
                        "forward"
                    });
                }
            }),
        ),
        (
            "area size or offset",
            Box::new({
                let ks = ks.clone();
                move |v: &mut Value| {
                    let a = &mut v["keyslots"][&ks]["area"];
                    let o: u64 = a["offset"].as_str().unwrap().parse().unwrap();
                    let s: u64 = a["size"].as_str().unwrap().parse().unwrap();
                    // Stay inside the keyslots area and off other keyslots.
                    if s > 4096 {
                        a["size"] = json!((s - 4096).to_string());
                    } else {
                        a["offset"] = json!((o + 4096).to_string());
                    }
                }
            }),
        ),
        (
            "backup-previous offset",
            Box::new(move |v: &mut Value| {
                let seg = &mut v["segments"][&prev];
                let o: u64 = seg["offset"].as_str().unwrap().parse().unwrap();
                seg["offset"] = json!((o + 4096).to_string());
            }),
        ),
    ];
    for (what, edit) in edits {
        let h = tampered(hdr, edit);
        assert!(
            !reencrypt::verify_reencrypt_digest(&h, old, new).unwrap(),
            "tampered {what} must not verify"
        );
    }
    // The same copy-and-reseal without a change still verifies, so the failures above come
    // from the changed fields.
    let h = tampered(hdr, |_| {});
    assert!(reencrypt::verify_reencrypt_digest(&h, old, new).unwrap());
}

fn find_flag(v: &Value, flag: &str) -> String {
    v["segments"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, s)| {
            s["flags"]
                .as_array()
                .is_some_and(|a| a.iter().any(|f| f == flag))
        })
        .map(|(n, _)| n.clone())
        .unwrap()
}

fn fast_opts() -> InitOptions {
    InitOptions {
        resilience: ResilienceKind::Checksum(Hash::Sha256),
        block_size: 4096,
        digest_hash: Hash::Sha256,
        digest_iterations: Some(1000),
    }
}

/// Write metadata built here onto the header file `hdr` with the crate's writer.
fn write_built(hdr: &Path, md: &sectorcrypt_luks::luks2::metadata::Metadata) -> Header {
    let dev = FileStorage::open(hdr).unwrap();
    let h = Header::read(&dev).unwrap();
    reencrypt::write_metadata(&dev, &h, md).unwrap()
}

/// Compare the JSON built here with cryptsetup's, salts and digest values aside.
fn assert_same_json(mut ours: Value, mut theirs: Value, what: &str) {
    mask(&mut ours);
    mask(&mut theirs);
    assert_eq!(
        serde_json::to_string_pretty(&ours).unwrap(),
        serde_json::to_string_pretty(&theirs).unwrap(),
        "{what}: built metadata differs from cryptsetup's"
    );
}

/// `--open --test-passphrase` checks the keys and the reencryption digest.
fn cryptsetup_accepts(f: &Fixture, hdr: Option<&Path>, data: &Path) {
    let mut args = vec!["open", "--test-passphrase"];
    if let Some(h) = hdr {
        args.extend_from_slice(&["--header", path(h)]);
    }
    args.push(path(data));
    f.cs(&args);
}

// ---- encrypt, detached header ----

/// `--encrypt --header`: the init state reads as CLEAN with checksum/forward, its digest verifies
/// with the new key (and the keys open here), tampering is caught, the builder makes the same
/// JSON from a header formatted the same way, and cryptsetup finishes what the builder started.
#[test]
fn encrypt_detached_header() {
    let f = Fixture::new("enc-detached");
    let data = f.file("data.img");
    let plain = pattern((32 * MIB) as usize, 7);
    std::fs::write(&data, &plain).unwrap();
    // The header cryptsetup formats before the init, kept to build from (the same format as
    // the encrypt path: detached, sector size 512, the given volume key).
    let fresh = f.file("fresh.hdr");
    f.format(&data, &["--header", path(&fresh), "--sector-size", "512"]);
    let hdr = f.file("cs.hdr");
    f.init_encrypt(&["--header", path(&hdr)], &data);
    let h = read_header(&hdr);
    assert_eq!(reencrypt::state(h.metadata()), State::Clean);
    let r = check_parsed(&h, &DETACHED_ENCRYPTION);
    assert_eq!(
        r.keyslot.resilience,
        Resilience::Checksum {
            hash: "sha256".into(),
            sector_size: 4096
        }
    );
    assert_eq!(
        (r.keyslot.area_offset, r.keyslot.area_size),
        (290816, 16486400)
    );
    assert_eq!(r.segments.len(), 1);
    assert_eq!(r.segments[0].kind, SegmentKind::Linear);
    assert!(reencrypt::verify_reencrypt_digest(&h, None, Some(&f.vk1)).unwrap());
    let keys = unlock_keys(&h, &hdr);
    assert!(keys.old.is_none());
    assert_eq!(&keys.new.unwrap().volume_key[..], &f.vk1[..]);
    assert!(matches!(
        reencrypt::verify_reencrypt_digest(&h, None, Some(&f.vk2)),
        Err(Error::WrongPassphrase)
    ));
    assert!(matches!(
        reencrypt::verify_reencrypt_digest(&h, None, None),
        Err(Error::Unsupported(_))
    ));
    assert_tampering_detected(&hdr, None, Some(&f.vk1));

    // The builder, from the header cryptsetup formatted, makes what cryptsetup made.
    let base = read_header(&fresh);
    let md = reencrypt::init_encrypt(&base, &f.vk1, &fast_opts()).unwrap();
    assert!(reencrypt::verify_metadata_digest(&md, None, Some(&f.vk1)).unwrap());
    assert_same_json(md.to_json(), cryptsetup_json(&hdr), "encrypt --header");

    // Written with our writer, cryptsetup accepts it and finishes the encryption.
    let ours = f.file("ours.hdr");
    std::fs::copy(&fresh, &ours).unwrap();
    let written = write_built(&ours, &md);
    assert_eq!(reencrypt::state(written.metadata()), State::Clean);
    cryptsetup_accepts(&f, Some(&ours), &data);
    resume(&f, Some(&ours), &data, &["--resilience", "checksum"]);
    let done = finished(&ours);
    let seg = done.data_segment().unwrap();
    assert_eq!((seg.offset, seg.size, seg.sector_size), (0, None, 512));
    let mut buf = std::fs::read(&data).unwrap();
    assert_ne!(buf, plain);
    crypt_data(&f.vk1, 512, &mut buf, 0, false);
    assert!(
        buf == plain,
        "the data cryptsetup encrypted decrypts to the plaintext"
    );
}

/// Run `cryptsetup reencrypt --resume-only` with `signal` delivered on entry to its `n`-th
/// `write` (strace's fault injection: a point in its I/O, the same on every machine, never a
/// moment in time). cryptsetup 2.6 writes 14 times a 1 MiB step: the checksums, two header
/// copies of three writes each, the data, two header copies again.
fn signalled_run(f: &Fixture, signal: &str, n: u64, hdr: &Path, data: &Path) {
    let mut cmd = Command::new("cryptsetup");
    cmd.args([
        "reencrypt",
        "--resume-only",
        "--force-offline-reencrypt",
        "--hotzone-size",
        "1M",
        "--resilience",
        "checksum",
        "--header",
        path(hdr),
        "--batch-mode",
        "--key-file",
        path(&f.key),
        path(data),
    ]);
    fault::signal_at(&cmd, "write", n, signal);
}

/// Interrupted (SIGINT: CLEAN with a done and a pending segment) and crashed (SIGKILL: CRASH, a
/// segment `in-reencryption`) runs of an encryption: the state reads right, the digest still
/// verifies (steps do not touch what it covers), and cryptsetup then recovers and finishes with
/// the right data. The signal goes at successive writes of the second step until one leaves the
/// wanted state (a SIGKILL between two header writes leaves a CLEAN one).
#[test]
fn interrupted_and_crashed_encryption() {
    let f = Fixture::new("enc-signals");
    let plain = pattern((48 * MIB) as usize, 11);
    let data = f.file("data.img");
    std::fs::write(&data, &plain).unwrap();
    let init = f.file("init.hdr");
    f.init_encrypt(&["--header", path(&init)], &data);
    for (signal, want) in [("INT", State::Clean), ("KILL", State::Crash)] {
        let mut seen = false;
        for n in 16..=30 {
            let hdr = f.file(&format!("run-{signal}.hdr"));
            std::fs::copy(&init, &hdr).unwrap();
            std::fs::write(&data, &plain).unwrap();
            signalled_run(&f, signal, n, &hdr, &data);
            let h = read_header(&hdr);
            let st = reencrypt::state(h.metadata());
            if st != want {
                continue;
            }
            let r = check_parsed(&h, &DETACHED_ENCRYPTION);
            if want == State::Clean && r.segments.len() < 2 {
                continue; // interrupted before the first step
            }
            if want == State::Crash {
                let hot = r.in_reencryption().expect("the hotzone segment");
                assert!(matches!(hot.kind, SegmentKind::Crypt { .. }));
            } else {
                assert!(r.in_reencryption().is_none());
                assert!(matches!(r.segments[0].kind, SegmentKind::Crypt { .. }));
                assert_eq!(r.segments.last().unwrap().kind, SegmentKind::Linear);
            }
            assert!(reencrypt::verify_reencrypt_digest(&h, None, Some(&f.vk1)).unwrap());
            if want == State::Crash {
                f.cs(&["repair", "--header", path(&hdr), path(&data)]);
            }
            if reencrypt::state(read_header(&hdr).metadata()) != State::None {
                resume(&f, Some(&hdr), &data, &["--resilience", "checksum"]);
            }
            finished(&hdr);
            let mut buf = std::fs::read(&data).unwrap();
            crypt_data(&f.vk1, 512, &mut buf, 0, false);
            assert!(
                buf == plain,
                "{signal}: recovered data decrypts to the plaintext"
            );
            seen = true;
            break;
        }
        assert!(
            seen,
            "SIG{signal} at writes 16 to 30 never left the {want:?} state"
        );
    }
}

// ---- encrypt with a data shift (attached header) ----

/// `--encrypt --reduce-device-size 32M` on 64 MiB: datashift/backward with a moved segment; the
/// builder, from a header formatted with data offset 16 MiB, makes the same JSON; with the first
/// 16 MiB copied to the end (the engine's job) and our header written, cryptsetup finishes and
/// the first 32 MiB of plaintext end up encrypted at 16 MiB.
#[test]
fn encrypt_with_datashift() {
    let f = Fixture::new("enc-shift");
    let size = 64 * MIB;
    let shift = 16 * MIB;
    let plain = pattern(size as usize, 3);
    let dev = f.file("dev.img");
    std::fs::write(&dev, &plain).unwrap();
    f.init_encrypt(&["--reduce-device-size", "32M"], &dev);
    let h = read_header(&dev);
    assert_eq!(reencrypt::state(h.metadata()), State::Clean);
    let r = check_parsed(
        &h,
        &Expect {
            mode: Mode::Encrypt,
            direction: Direction::Backward,
            area_type: "datashift",
            version: 2,
            moved: true,
        },
    );
    assert_eq!(
        r.keyslot.resilience,
        Resilience::Datashift { shift_size: shift }
    );
    assert_eq!(r.keyslot.area_size, 4096);
    assert_eq!(r.backup_moved.as_ref().unwrap().offset, size - shift);
    assert!(reencrypt::verify_reencrypt_digest(&h, None, Some(&f.vk1)).unwrap());
    assert_tampering_detected(&dev, None, Some(&f.vk1));
    let theirs = cryptsetup_json(&dev);

    // Our side: plaintext, its first S bytes copied to D - S, a header with data offset S.
    let ours = f.file("ours.img");
    let mut img = plain.clone();
    img.copy_within(0..shift as usize, (size - shift) as usize);
    std::fs::write(&ours, &img).unwrap();
    f.format_attached(&ours, shift, 512);
    let base = read_header(&ours);
    let md = reencrypt::init_encrypt_datashift(&base, &f.vk1, size, &fast_opts()).unwrap();
    assert_same_json(md.to_json(), theirs, "encrypt --reduce-device-size");
    write_built(&ours, &md);
    cryptsetup_accepts(&f, None, &ours);
    resume(&f, None, &ours, &[]);
    let done = finished(&ours);
    let seg = done.data_segment().unwrap();
    assert_eq!((seg.offset, seg.size), (shift, None));
    let logical = size - 2 * shift;
    let mut buf = read_range(&ours, shift, logical);
    crypt_data(&f.vk1, 512, &mut buf, 0, false);
    assert!(
        buf[..] == plain[..logical as usize],
        "the shifted, encrypted data decrypts to the original first 32 MiB"
    );
}

// ---- reencrypt (new volume key) ----

/// Plain `reencrypt`: checksum/forward, both keys in the digest; the keys open here with one
/// passphrase; the builder, from the volume with an unbound keyslot for the new key (what the
/// CLI adds first), makes the same JSON, and cryptsetup finishes it: the data is then under the
/// new key.
#[test]
fn reencrypt_to_a_new_key() {
    let f = Fixture::new("reenc");
    let size = 48 * MIB;
    let offset = 16 * MIB;
    let start = f.file("start.img");
    std::fs::File::create(&start)
        .unwrap()
        .set_len(size)
        .unwrap();
    f.format(&start, &["--sector-size", "4096"]);
    let plain = pattern((size - offset) as usize, 5);
    let mut ct = plain.clone();
    crypt_data(&f.vk1, 4096, &mut ct, 0, true);
    let mut img = std::fs::read(&start).unwrap();
    img[offset as usize..].copy_from_slice(&ct);
    std::fs::write(&start, &img).unwrap();

    let cs_img = f.file("cs.img");
    std::fs::copy(&start, &cs_img).unwrap();
    f.init_only(&["--volume-key-file", path(&f.vk2_file)], &cs_img);
    let h = read_header(&cs_img);
    let r = check_parsed(
        &h,
        &Expect {
            mode: Mode::Reencrypt,
            direction: Direction::Forward,
            area_type: "checksum",
            version: 2,
            moved: false,
        },
    );
    assert_ne!(r.digest_old, r.digest_new);
    assert_eq!((r.keyslot.slot, r.keyslot.area_offset), (2, 548864));
    assert!(reencrypt::verify_reencrypt_digest(&h, Some(&f.vk1), Some(&f.vk2)).unwrap());
    assert!(matches!(
        reencrypt::verify_reencrypt_digest(&h, Some(&f.vk2), Some(&f.vk1)),
        Err(Error::WrongPassphrase)
    ));
    let keys = unlock_keys(&h, &cs_img);
    assert_eq!(&keys.old.unwrap().volume_key[..], &f.vk1[..]);
    assert_eq!(&keys.new.unwrap().volume_key[..], &f.vk2[..]);
    assert_tampering_detected(&cs_img, Some(&f.vk1), Some(&f.vk2));

    // The CLI's first step, done with cryptsetup: an unbound keyslot for the new key.
    let ours = f.file("ours.img");
    std::fs::copy(&start, &ours).unwrap();
    f.cs(&[
        "luksAddKey",
        "--unbound",
        "--key-size",
        "512",
        "--volume-key-file",
        path(&f.vk2_file),
        path(&ours),
        path(&f.key),
    ]);
    let base = read_header(&ours);
    let target = Target {
        cipher: CIPHER.into(),
        sector_size: 4096,
    };
    let md = reencrypt::init_reencrypt(&base, &f.vk1, &f.vk2, &target, &fast_opts()).unwrap();
    assert_same_json(md.to_json(), cryptsetup_json(&cs_img), "reencrypt");
    write_built(&ours, &md);
    cryptsetup_accepts(&f, None, &ours);
    resume(&f, None, &ours, &["--resilience", "checksum"]);
    let done = finished(&ours);
    let u = done
        .unlock(
            &FileStorage::open_read_only(&ours).unwrap(),
            PASS.as_bytes(),
            None,
        )
        .unwrap();
    assert_eq!(&u.volume_key[..], &f.vk2[..]);
    let mut buf = read_range(&ours, offset, size - offset);
    crypt_data(&f.vk2, 4096, &mut buf, 0, false);
    assert!(buf == plain, "reencrypted data decrypts with the new key");
}

// ---- decrypt, detached header ----

/// `--decrypt --header` on a detached-header volume: checksum/backward, only the old key in the
/// digest; the builder makes the same JSON; cryptsetup finishes what the builder started and
/// leaves the plaintext.
#[test]
fn decrypt_detached_header() {
    let f = Fixture::new("dec-detached");
    let size = 32 * MIB;
    let plain = pattern(size as usize, 9);
    let data = f.file("data.img");
    std::fs::File::create(&data).unwrap().set_len(size).unwrap();
    let fresh = f.file("fresh.hdr");
    f.format(&data, &["--header", path(&fresh), "--sector-size", "4096"]);
    let mut ct = plain.clone();
    crypt_data(&f.vk1, 4096, &mut ct, 0, true);
    std::fs::write(&data, &ct).unwrap();

    let hdr = f.file("cs.hdr");
    std::fs::copy(&fresh, &hdr).unwrap();
    f.init_only(&["--decrypt", "--header", path(&hdr)], &data);
    let h = read_header(&hdr);
    assert_eq!(reencrypt::state(h.metadata()), State::Clean);
    check_parsed(
        &h,
        &Expect {
            mode: Mode::Decrypt,
            direction: Direction::Backward,
            area_type: "checksum",
            version: 2,
            moved: false,
        },
    );
    assert!(reencrypt::verify_reencrypt_digest(&h, Some(&f.vk1), None).unwrap());
    let keys = unlock_keys(&h, &hdr);
    assert_eq!(&keys.old.unwrap().volume_key[..], &f.vk1[..]);
    assert!(keys.new.is_none());
    assert_tampering_detected(&hdr, Some(&f.vk1), None);

    let base = read_header(&fresh);
    let md = reencrypt::init_decrypt(&base, &f.vk1, &fast_opts()).unwrap();
    let theirs = with_forced_digest_iterations(cryptsetup_json(&hdr));
    assert_same_json(md.to_json(), theirs, "decrypt --header");

    let ours = f.file("ours.hdr");
    std::fs::copy(&fresh, &ours).unwrap();
    write_built(&ours, &md);
    cryptsetup_accepts(&f, Some(&ours), &data);
    resume(&f, Some(&ours), &data, &["--resilience", "checksum"]);
    let done = finished(&ours);
    assert!(done.metadata().keyslots.is_empty());
    assert!(
        std::fs::read(&data).unwrap() == plain,
        "the data is plaintext again"
    );
}

// ---- decrypt, header on the device (exported, data shifted back) ----

/// `--decrypt --header NEWFILE` of a volume whose header is on the device: the v3 init state
/// reads as forward / datashift-checksum with a moved segment, its digest verifies with the old
/// key; the builder, from the exported header, makes the same JSON; the per-step builders make
/// the segment sets cryptsetup 2.6.1 was seen to write (`docs/LUKS2-REENCRYPT.md` §6.D); and
/// cryptsetup finishes what the builder started (after the first chunk is moved, as the engine
/// does) with the plaintext back at offset 0.
#[test]
fn decrypt_with_datashift() {
    let f = Fixture::new("dec-shift");
    let shift = 8 * MIB;
    let size = 40 * MIB;
    let data_size = size - shift;
    let plain = pattern(data_size as usize, 10);
    let dev = f.file("dev.img");
    std::fs::File::create(&dev).unwrap().set_len(size).unwrap();
    f.format_attached(&dev, shift, 4096);
    let mut image = std::fs::read(&dev).unwrap();
    let mut ct = plain.clone();
    crypt_data(&f.vk1, 4096, &mut ct, 0, true);
    image[shift as usize..].copy_from_slice(&ct);
    std::fs::write(&dev, &image).unwrap();
    let fresh = image[..shift as usize].to_vec();

    let theirs_dev = f.file("theirs.img");
    std::fs::write(&theirs_dev, &image).unwrap();
    let hdr = f.file("theirs.hdr");
    f.init_only(&["--decrypt", "--header", path(&hdr)], &theirs_dev);
    let h = read_header(&hdr);
    let r = check_parsed(
        &h,
        &Expect {
            mode: Mode::Decrypt,
            direction: Direction::Forward,
            area_type: "datashift-checksum",
            version: 3,
            moved: true,
        },
    );
    assert_eq!(r.keyslot.resilience.shift_size(), Some(shift));
    assert!(reencrypt::verify_reencrypt_digest(&h, Some(&f.vk1), None).unwrap());
    assert_tampering_detected(&hdr, Some(&f.vk1), None);
    // cryptsetup moved the first chunk (all of S here, under its 20 MiB default) to 0.
    assert!(read_range(&theirs_dev, 0, shift) == ct[..shift as usize]);

    let ours = f.file("ours.hdr");
    std::fs::write(&ours, &fresh).unwrap();
    let base = read_header(&ours);
    let md =
        reencrypt::init_decrypt_datashift(&base, &f.vk1, size, 20 * MIB, &fast_opts()).unwrap();
    let theirs = with_forced_digest_iterations(cryptsetup_json(&hdr));
    assert_same_json(md.to_json(), theirs, "decrypt --header NEWFILE (v3)");

    // The step shapes of §6.D, scaled: S = M = 8 MiB, 32 MiB of data.
    let r = reencrypt::parse(&md).unwrap().unwrap();
    let shape = |md: &sectorcrypt_luks::luks2::metadata::Metadata| -> Vec<String> {
        reencrypt::parse(md)
            .unwrap()
            .unwrap()
            .segments
            .iter()
            .map(|s| {
                let kind = match &s.kind {
                    SegmentKind::Crypt { iv_tweak, .. } => format!("crypt/iv{iv_tweak}"),
                    _ => "lin".to_string(),
                };
                let size = s.size.map_or("dyn".to_string(), |n| (n / MIB).to_string());
                let hot = if s.has_flag("in-reencryption") {
                    "/hot"
                } else {
                    ""
                };
                format!("{kind}({},{size}){hot}", s.offset / MIB)
            })
            .collect()
    };
    let step = |at: u64, len: u64, hot: bool| {
        shape(&reencrypt::decrypt_datashift_progress(&md, &r, at, len, hot, data_size).unwrap())
    };
    let iv = |mib: u64| mib * MIB / 512;
    assert_eq!(
        step(16 * MIB, 8 * MIB, true),
        [
            "crypt/iv0(0,8)".to_string(),
            "lin(8,8)".into(),
            "lin(16,8)/hot".into(),
            format!("crypt/iv{}(32,dyn)", iv(24)),
        ]
    );
    assert_eq!(
        step(24 * MIB, 8 * MIB, false),
        ["crypt/iv0(0,8)", "lin(8,dyn)"]
    );
    assert_eq!(step(0, 8 * MIB, true), ["lin(0,8)/hot", "lin(8,dyn)"]);
    assert_eq!(step(0, 8 * MIB, false), ["lin(0,dyn)"]);

    // Written over the exported header (the device's first chunk moved first, as the engine
    // does), cryptsetup accepts it and finishes the decryption.
    let ours_dev = f.file("ours.img");
    let mut moved = image.clone();
    moved.copy_within(shift as usize..2 * shift as usize, 0);
    std::fs::write(&ours_dev, &moved).unwrap();
    write_built(&ours, &md);
    cryptsetup_accepts(&f, Some(&ours), &ours_dev);
    resume(&f, Some(&ours), &ours_dev, &[]);
    assert!(
        read_range(&ours_dev, 0, data_size) == plain,
        "cryptsetup finished the decryption the builder started"
    );
}

/// The segment sets of a shifted encryption's steps are cryptsetup's (§6.A: a 256 MiB device,
/// S = 16 MiB, interrupted and crashed states).
#[test]
fn shifted_encryption_steps_match_cryptsetups_states() {
    let f = Fixture::new("enc-shift-steps");
    let size = 256 * MIB;
    let shift = 16 * MIB;
    let dev = f.file("dev.img");
    std::fs::File::create(&dev).unwrap().set_len(size).unwrap();
    f.format_attached(&dev, shift, 512);
    let base = read_header(&dev);
    let md = reencrypt::init_encrypt_datashift(&base, &f.vk1, size, &fast_opts()).unwrap();
    let r = reencrypt::parse(&md).unwrap().unwrap();
    let total = size - 2 * shift;
    let segs = |at: u64, len: u64, hot: bool| -> Vec<(u64, Option<u64>, bool, bool)> {
        let md = reencrypt::encrypt_datashift_progress(&md, &r, at, len, hot, total).unwrap();
        reencrypt::parse(&md)
            .unwrap()
            .unwrap()
            .segments
            .iter()
            .map(|s| {
                (
                    s.offset,
                    s.size,
                    matches!(s.kind, SegmentKind::Crypt { .. }),
                    s.has_flag("in-reencryption"),
                )
            })
            .collect()
    };
    // Crashed (seq 27): lin(240M,16M) | lin(16M,16M) | crypt(48M,16M,hot) | crypt(64M,176M).
    assert_eq!(
        segs(32 * MIB, 16 * MIB, true),
        [
            (240 * MIB, Some(16 * MIB), false, false),
            (16 * MIB, Some(16 * MIB), false, false),
            (48 * MIB, Some(16 * MIB), true, true),
            (64 * MIB, Some(176 * MIB), true, false),
        ]
    );
    // Interrupted (seq 26): lin(240M,16M) | lin(16M,32M) | crypt(64M,176M).
    assert_eq!(
        segs(48 * MIB, 16 * MIB, false),
        [
            (240 * MIB, Some(16 * MIB), false, false),
            (16 * MIB, Some(32 * MIB), false, false),
            (64 * MIB, Some(176 * MIB), true, false),
        ]
    );
    // The last step done: one crypt segment at S, dynamic.
    assert_eq!(segs(0, 16 * MIB, false), [(16 * MIB, None, true, false)]);
}
