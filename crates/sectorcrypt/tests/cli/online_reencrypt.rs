//! Online reencryption from the kernel side (issue 30): cryptsetup's `reencrypt` on an *active*
//! mapping, the path through the kernel (hotzone and overlay devices stacked under the mapping,
//! the `online-reencrypt-v2` requirement), run in the kernel oracle's guest
//! (`scripts/kernel-oracle-reencrypt.sh`).
//!
//! - New volume key (checksum resilience), encryption with `--reduce-device-size` (datashift),
//!   decryption with a detached header (journal) and decryption exporting the header
//!   (`--decrypt --header NEWFILE`: the data moved to the start, `online-reencrypt-v3`; the
//!   exported header kept on an ext4 image in the guest): each run is killed on entry to a
//!   seeded write and the guest's power then cut; every state left on the disk is finished here
//!   (`--resume-only`) and the data must be what was written before, the header a finished
//!   volume (or the device plain data).
//! - The other way round: sectorcrypt's own conversions killed at seeded writes are finished
//!   online in the guest (`cryptsetup open`, then `cryptsetup reencrypt --resume-only` on the
//!   active device), and the mapping must read the data written before (what is left out and
//!   why: [`left_for_cryptsetup`], [`interrupted_here_resumes_online_in_the_kernel`]).
//! - cryptsetup's end cut short write by write (on the host: the same code as online): states
//!   whose old key no longer opens, which cryptsetup cannot finish, are finished here.
//!
//! A kill lands at a count of writes, not at a time, and the verdicts hold for every moment: the
//! states reached are printed (`--nocapture`), not asserted one by one.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{cs, ok, p, scratch, FAST_PBKDF};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sectorcrypt_testkit::{
    cryptsetup_format_with_volume_key, cryptsetup_volume_key, fault, kernel_oracle, pattern,
};
use serde_json::Value;

const MIB: usize = 1 << 20;
/// The plaintext every volume holds.
const PAYLOAD: usize = 4 * MIB;
/// cryptsetup's default LUKS2 data offset (header and keyslots).
const HEADER: usize = 16 * MIB;
/// `--reduce-device-size` of the encryptions that put the header on the device: the data then
/// starts at half of it.
const REDUCE: &str = "4M";
const REDUCE_BYTES: usize = 4 * MIB;
/// Kills per direction: one guest boot runs them all (plus the counting run).
const KILLS: usize = 3;

/// What is converted, and how sectorcrypt resumes it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// A new volume key; the header on the device.
    Reencrypt,
    /// A plain device encrypted in place, the header put at its start, the data shifted.
    Encrypt,
    /// Decryption of a volume with a detached header.
    Decrypt,
    /// Decryption of a volume whose header is on the device: the header exported to a new file,
    /// the data moved to the device's start (`online-reencrypt-v3`).
    DecryptExported,
}

impl Mode {
    /// The sectorcrypt command.
    fn verb(self) -> &'static str {
        match self {
            Mode::Reencrypt => "reencrypt",
            Mode::Encrypt => "encrypt",
            Mode::Decrypt | Mode::DecryptExported => "decrypt",
        }
    }

    /// The guest script's name for it.
    fn name(self) -> &'static str {
        match self {
            Mode::DecryptExported => "decrypt-exported",
            _ => self.verb(),
        }
    }
}

/// One volume's files: `BASE.img` (the device) and, with a detached or exported header,
/// `BASE.hdr`.
struct Volume {
    img: PathBuf,
    hdr: Option<PathBuf>,
}

impl Volume {
    fn at(dir: &Path, name: &str, detached: bool) -> Volume {
        Volume {
            img: dir.join(format!("{name}.img")),
            hdr: detached.then(|| dir.join(format!("{name}.hdr"))),
        }
    }

    /// Where the LUKS header is.
    fn header(&self) -> &Path {
        self.hdr.as_deref().unwrap_or(&self.img)
    }

    fn copy_to(&self, to: &Volume) {
        std::fs::copy(&self.img, &to.img).unwrap();
        if let (Some(from), Some(to)) = (&self.hdr, &to.hdr) {
            std::fs::copy(from, to).unwrap();
        }
    }
}

/// `plain` as aes-xts-plain64 with `key` and `sector` bytes per sector, IVs in 512-byte units
/// from 0.
fn xts(key: &[u8], sector: usize, plain: &[u8]) -> Vec<u8> {
    let c = sectorcrypt_cipher::SectorCipher::new(
        sectorcrypt_cipher::CipherSpec::parse("aes-xts-plain64").unwrap(),
        key,
        &sectorcrypt_cipher::SectorOptions {
            sector_size: sector,
            ..Default::default()
        },
    )
    .unwrap();
    let mut out = plain.to_vec();
    c.encrypt(&mut out, 0).unwrap();
    out
}

/// The LUKS2 metadata host cryptsetup reads at `header`, if it reads one.
fn luks_json(header: &Path) -> Option<Value> {
    let out = cs(&["luksDump", "--dump-json-metadata", p(header)]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// The mandatory requirements the metadata lists (`online-reencrypt-v2` mid-reencryption).
fn requirements(json: &Value) -> Vec<String> {
    json["config"]["requirements"]["mandatory"]
        .as_array()
        .map(|a| a.iter().map(|r| r.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// One line on a state: its requirements, the reencrypt keyslot's resilience and the segments.
fn describe(json: Option<&Value>) -> String {
    let Some(json) = json else {
        return "no LUKS header".into();
    };
    let resilience = json["keyslots"]
        .as_object()
        .unwrap()
        .values()
        .find(|k| k["type"] == "reencrypt")
        .map(|k| k["area"]["type"].to_string())
        .unwrap_or_else(|| "none".into());
    let segments: Vec<String> = json["segments"]
        .as_object()
        .unwrap()
        .values()
        .map(|s| {
            let flags = s["flags"].as_array().into_iter().flatten();
            let flags: Vec<&str> = flags.map(|f| f.as_str().unwrap()).collect();
            format!("{}{flags:?}", s["type"].as_str().unwrap())
        })
        .collect();
    format!(
        "requirements {:?}, reencrypt keyslot {resilience}, segments {}",
        requirements(json),
        segments.join(" ")
    )
}

/// The volume holds `plain` and no conversion: a LUKS2 volume whose one data segment decrypts
/// (with the key the passphrase opens) to `plain`, or plain data (a linear segment, or no header
/// at all) equal to it.
fn assert_holds(vol: &Volume, key: &Path, plain: &[u8], what: &str) {
    let img = std::fs::read(&vol.img).unwrap();
    let Some(json) = luks_json(vol.header()) else {
        assert!(
            img[..plain.len()] == *plain,
            "{what}: the plain data differs"
        );
        return;
    };
    assert!(
        requirements(&json).is_empty(),
        "{what}: still a conversion: {}",
        describe(Some(&json))
    );
    let segments = json["segments"].as_object().unwrap();
    assert_eq!(segments.len(), 1, "{what}: {}", describe(Some(&json)));
    let segment = &segments["0"];
    let offset: usize = segment["offset"].as_str().unwrap().parse().unwrap();
    let stored = &img[offset..offset + plain.len()];
    match segment["type"].as_str().unwrap() {
        "crypt" => {
            let vk = cryptsetup_volume_key(vol.header(), key, &[]);
            let sector = segment["sector_size"].as_u64().unwrap() as usize;
            assert!(
                *stored == xts(&vk, sector, plain),
                "{what}: the data does not decrypt to what was written"
            );
        }
        "linear" => assert!(*stored == *plain, "{what}: the plain data differs"),
        other => panic!("{what}: a {other} segment"),
    }
}

/// A new volume for `mode` holding `plain` in `vol`: LUKS2 by cryptsetup (512-byte sectors, a
/// known volume key), the ciphertext written at the data offset; for encryption the plain data
/// followed by the space `--reduce-device-size` takes.
fn new_volume(mode: Mode, vol: &Volume, key: &Path, plain: &[u8]) {
    if mode == Mode::Encrypt {
        let mut img = plain.to_vec();
        img.resize(plain.len() + REDUCE_BYTES, 0);
        std::fs::write(&vol.img, img).unwrap();
        return;
    }
    let old = pattern(64, 3);
    let vk = vol.img.with_extension("vk");
    std::fs::write(&vk, &old).unwrap();
    let offset = if vol.hdr.is_some() { 0 } else { HEADER };
    std::fs::write(&vol.img, vec![0u8; offset + plain.len()]).unwrap();
    let mut extra = vec!["--sector-size", "512"];
    if let Some(hdr) = &vol.hdr {
        extra.extend_from_slice(&["--header", p(hdr)]);
    }
    cryptsetup_format_with_volume_key(&vol.img, key, &vk, &extra);
    let mut img = std::fs::read(&vol.img).unwrap();
    img[offset..].copy_from_slice(&xts(&old, 512, plain));
    std::fs::write(&vol.img, img).unwrap();
}

/// sectorcrypt's `--resume-only` of the `mode` conversion recorded on `vol`.
fn resume_here(mode: Mode, vol: &Volume, key: &Path) -> std::process::Output {
    let mut args = vec![mode.verb(), "--resume-only", "-q", "--key-file", p(key)];
    if let Some(hdr) = &vol.hdr {
        args.extend_from_slice(&["--header", p(hdr)]);
    }
    args.push(p(&vol.img));
    crate::common::sc(&args)
}

/// The guest's output, which must have run to its end.
fn guest(out: std::process::Output, what: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The test, one direction: cryptsetup's online `mode` conversion in the guest, killed
/// at [`KILLS`] seeded writes, the power cut; each state is finished here and must hold the
/// data. At least one state must be mid-conversion (the requirement set), or nothing was tested.
fn killed_in_the_kernel_resumed_here(mode: Mode, options: &str, seed: u64) {
    let dir = scratch(&format!("online-reencrypt-{}", mode.name()));
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let plain = pattern(PAYLOAD, seed);
    let detached = mode == Mode::Decrypt;
    let runs: Vec<Volume> = (0..=KILLS)
        .map(|i| Volume::at(&dir, &format!("run-{i}"), detached))
        .collect();
    new_volume(mode, &runs[0], &key, &plain);
    // The file system the guest exports a header to: ext4 without a journal, which the guest
    // mounts synchronously and debugfs reads here after the power cut.
    let fs = |i: usize| dir.join(format!("run-{i}.fs"));
    if mode == Mode::DecryptExported {
        let mkfs = Command::new("mkfs.ext4")
            .args(["-F", "-q", "-O", "^has_journal", p(&fs(0)), "24M"])
            .output()
            .unwrap();
        ok(mkfs, "mkfs.ext4");
    }
    for (i, run) in runs.iter().enumerate().skip(1) {
        runs[0].copy_to(run);
        if mode == Mode::DecryptExported {
            std::fs::copy(fs(0), fs(i)).unwrap();
        }
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let seeds: Vec<String> = (0..KILLS).map(|_| rng.gen::<u32>().to_string()).collect();
    let mut args = vec!["interrupt", mode.name(), p(&dir), p(&key), options];
    args.extend(seeds.iter().map(String::as_str));
    let text = guest(
        kernel_oracle::run(
            &dir,
            &kernel_oracle::script("kernel-oracle-reencrypt.sh"),
            &args,
        ),
        "the guest's online reencryption",
    );
    eprintln!("{text}");
    let runs: Vec<Volume> = match mode {
        Mode::DecryptExported => (0..=KILLS).map(|i| exported(&runs[i], &fs(i))).collect(),
        _ => runs,
    };
    // The uninterrupted run finished in the kernel.
    assert_holds(&runs[0], &key, &plain, "the uninterrupted online run");
    let mut mid = 0;
    for (i, run) in runs.iter().enumerate().skip(1) {
        let killed = text
            .lines()
            .find(|l| l.starts_with(&format!("run {i} killed at write ")));
        assert!(killed.is_some(), "run {i} was not killed: {text}");
        let json = luks_json(run.header());
        eprintln!(
            "{} {}: {}",
            mode.name(),
            killed.unwrap(),
            describe(json.as_ref())
        );
        if json.as_ref().is_some_and(|j| !requirements(j).is_empty()) {
            mid += 1;
            let reqs = requirements(json.as_ref().unwrap());
            assert!(
                reqs.iter().all(|r| r.starts_with("online-reencrypt")),
                "{reqs:?}"
            );
            ok(resume_here(mode, run, &key), "sectorcrypt --resume-only");
        }
        assert_holds(run, &key, &plain, &format!("run {i} resumed here"));
    }
    assert!(mid > 0, "no kill left a conversion in progress: {text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn kernel_online_reencryption_killed_at_random_writes_resumes_here() {
    killed_in_the_kernel_resumed_here(Mode::Reencrypt, "--resilience checksum", 301);
}

#[test]
fn kernel_online_encryption_with_data_shift_killed_at_random_writes_resumes_here() {
    killed_in_the_kernel_resumed_here(Mode::Encrypt, "", 302);
}

/// `run` with the header the guest exported to the file system image `fs`, if that holds a
/// LUKS header (a kill before it was written leaves the header on the device).
fn exported(run: &Volume, fs: &Path) -> Volume {
    let hdr = run.img.with_extension("hdr");
    let request = format!("dump /hdr {}", p(&hdr));
    let dump = Command::new("debugfs")
        .args(["-R", &request, p(fs)])
        .output();
    ok(dump.unwrap(), "debugfs dump");
    let hdr = (hdr.exists() && luks_json(&hdr).is_some()).then_some(hdr);
    Volume {
        img: run.img.clone(),
        hdr,
    }
}

#[test]
fn kernel_online_decryption_exporting_the_header_killed_at_random_writes_resumes_here() {
    killed_in_the_kernel_resumed_here(Mode::DecryptExported, "", 305);
}

#[test]
fn kernel_online_decryption_killed_at_random_writes_resumes_here() {
    killed_in_the_kernel_resumed_here(Mode::Decrypt, "--resilience journal", 303);
}

/// sectorcrypt's `mode` conversion of `vol` (fast key derivation for new keyslots; a new key
/// under journal resilience, the others under their defaults).
fn conversion_here(mode: Mode, vol: &Volume, key: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sectorcrypt"));
    cmd.args([
        mode.verb(),
        "-q",
        "--key-file",
        p(key),
        "--hotzone-size",
        "512K",
    ]);
    match mode {
        Mode::Reencrypt => cmd.args(FAST_PBKDF).args(["--resilience", "journal"]),
        Mode::Encrypt => cmd.args(FAST_PBKDF).args(["--reduce-device-size", REDUCE]),
        Mode::Decrypt | Mode::DecryptExported => {
            cmd.args(["--header", p(vol.hdr.as_ref().unwrap())])
        }
    };
    cmd.arg(&vol.img);
    cmd
}

/// Whether the metadata records a `mode` conversion for cryptsetup to finish; an encryption
/// that moves the data only while plain data is left (a linear data segment). Once every step is
/// done but the end not yet written, cryptsetup 2.6.1 takes the data for the whole device behind
/// the new data offset, looks for a step left and fails ("Failed to set device segments for next
/// reencryption hotzone"), on the state its own run leaves there too; sectorcrypt finishes it.
fn left_for_cryptsetup(mode: Mode, json: &Value) -> bool {
    let plain_left = json["segments"]
        .as_object()
        .unwrap()
        .values()
        .any(|s| s["type"] == "linear" && !s["flags"].to_string().contains("backup-"));
    !requirements(json).is_empty() && (mode != Mode::Encrypt || plain_left)
}

/// sectorcrypt's conversion killed (SIGKILL on entry to a seeded `pwrite64`) until the header
/// records it in progress ([`left_for_cryptsetup`]): the state the guest is to finish.
fn interrupted_here(mode: Mode, vol: &Volume, key: &Path, plain: &[u8], rng: &mut StdRng) {
    let pristine = Volume::at(
        vol.img.parent().unwrap(),
        &format!("{}-pristine", mode.name()),
        vol.hdr.is_some(),
    );
    new_volume(mode, &pristine, key, plain);
    pristine.copy_to(vol);
    let (out, writes) = fault::count_calls(&conversion_here(mode, vol, key), "pwrite64");
    ok(out, "the counted run");
    for attempt in 0..10 {
        pristine.copy_to(vol);
        let at = rng.gen_range(1..=writes);
        let out = fault::signal_at(&conversion_here(mode, vol, key), "pwrite64", at, "KILL");
        assert!(
            !out.status.success(),
            "not killed at write {at} of {writes}"
        );
        let json = luks_json(vol.header());
        eprintln!(
            "sectorcrypt {} killed at write {at} of {writes}: {}",
            mode.name(),
            describe(json.as_ref())
        );
        if json.is_some_and(|j| left_for_cryptsetup(mode, &j)) {
            return;
        }
        assert!(attempt < 9, "no kill left a conversion in progress");
    }
}

/// The reverse: sectorcrypt's interrupted conversions (new key under journal resilience,
/// encryption with data shift, decryption with a detached header under checksums) finished
/// online by cryptsetup in the guest; the mapping (or, once a decryption has removed it, the
/// device) reads the data written before, and the header is then a finished volume. Not the
/// decryption that exports the header: cryptsetup 2.6.1 resuming one, its own states included,
/// fails with the first chunk no longer the plaintext, or, once every chunk is converted, reports
/// success with none of the data the plaintext any more.
#[test]
fn interrupted_here_resumes_online_in_the_kernel() {
    let dir = scratch("online-reencrypt-reverse");
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let mut rng = StdRng::seed_from_u64(304);
    let modes = [Mode::Reencrypt, Mode::Encrypt, Mode::Decrypt];
    let mut jobs = Vec::new();
    let mut volumes = Vec::new();
    for (i, mode) in modes.into_iter().enumerate() {
        let plain = pattern(PAYLOAD, 310 + i as u64);
        let vol = Volume::at(&dir, mode.name(), mode == Mode::Decrypt);
        interrupted_here(mode, &vol, &key, &plain, &mut rng);
        jobs.push(format!("{}:{}", mode.name(), mode.name()));
        volumes.push((mode, vol, plain));
    }
    let mut args = vec!["resume", p(&dir), p(&key)];
    args.extend(jobs.iter().map(String::as_str));
    let text = guest(
        kernel_oracle::run(
            &dir,
            &kernel_oracle::script("kernel-oracle-reencrypt.sh"),
            &args,
        ),
        "cryptsetup's online resume",
    );
    eprintln!("{text}");
    for (mode, vol, plain) in &volumes {
        let name = mode.name();
        assert!(
            text.lines()
                .any(|l| l == format!("{name}: resumed ({name})")
                    || l == format!("{name}: finished by open ({name})")),
            "{name}: {text}"
        );
        let mapped = std::fs::read(vol.img.with_extension("out")).unwrap();
        // A mapping opened mid-encryption may be longer than the data (the shift's room).
        assert!(
            mapped.len() >= plain.len() && mapped[..plain.len()] == **plain,
            "{name}: the kernel's mapping does not read the data written before"
        );
        assert_holds(vol, &key, plain, &format!("{name} finished by the kernel"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// cryptsetup's end of a new key or a decryption (the same code online and offline) destroys
/// the old key's keyslots one header write at a time, the area wiped first, before it drops the
/// requirement: a crash there leaves all data converted and an old key that no longer opens,
/// which cryptsetup 2.6.1 then cannot open, resume or repair. sectorcrypt ends those
/// conversions with the keys that still open (the kernel runs above reach such states only by
/// chance; here the end is cut write by write, offline, on the host).
#[test]
fn cryptsetup_cut_short_while_ending_is_finished_here() {
    let dir = scratch("online-reencrypt-ending");
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let mut keyless = 0;
    for mode in [Mode::Reencrypt, Mode::Decrypt] {
        let plain = pattern(PAYLOAD, 320);
        let pristine = Volume::at(
            &dir,
            &format!("{}-pristine", mode.name()),
            mode == Mode::Decrypt,
        );
        new_volume(mode, &pristine, &key, &plain);
        let vol = Volume::at(&dir, mode.name(), mode == Mode::Decrypt);
        let mut cmd = Command::new("cryptsetup");
        cmd.args([
            "reencrypt",
            "-q",
            "--force-offline-reencrypt",
            "--key-file",
            p(&key),
        ]);
        cmd.args(["--hotzone-size", "512K"]).args(FAST_PBKDF);
        if mode == Mode::Decrypt {
            cmd.args(["--decrypt", "--header", p(vol.header())]);
        }
        cmd.arg(&vol.img);
        pristine.copy_to(&vol);
        let (out, writes) = fault::count_calls(&cmd, "write");
        ok(out, "cryptsetup reencrypt");
        // The end's writes are the last ones (13 with cryptsetup 2.6.1 here: the old keyslot's
        // area, its removal, the requirement's): cut at every other one of the last 14.
        for at in (writes.saturating_sub(14).max(1)..=writes).step_by(2) {
            pristine.copy_to(&vol);
            let out = fault::signal_at(&cmd, "write", at, "KILL");
            assert!(!out.status.success(), "cryptsetup not killed at write {at}");
            let json = luks_json(vol.header());
            if json.as_ref().is_some_and(|j| !requirements(j).is_empty()) {
                let mut test = vec!["open", "--test-passphrase", "--key-file", p(&key)];
                if let Some(hdr) = &vol.hdr {
                    test.extend_from_slice(&["--header", p(hdr)]);
                }
                test.push(p(&vol.img));
                if !cs(&test).status.success() {
                    keyless += 1;
                }
                let resumed = resume_here(mode, &vol, &key);
                ok(
                    resumed,
                    &format!("{} --resume-only after write {at}", mode.name()),
                );
            }
            assert_holds(
                &vol,
                &key,
                &plain,
                &format!("{} cut at write {at}", mode.name()),
            );
        }
    }
    assert!(keyless > 0, "no cut left keys that cryptsetup cannot open");
    std::fs::remove_dir_all(&dir).unwrap();
}
