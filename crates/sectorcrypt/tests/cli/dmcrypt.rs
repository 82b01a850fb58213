//! The dm-crypt interop matrix: "a volume made by either opens in the other", with the real
//! kernel's dm-crypt as the other (the kernel oracle, `scripts/kernel-oracle.sh`). Each case is
//! one cipher, mode, IV generator and key size on LUKS1 or LUKS2 with one sector size and data
//! layout, checked both ways by comparing bytes:
//!
//! - sectorcrypt formats a volume here, dm-crypt in the guest writes a MiB through it, and
//!   sectorcrypt (`serve` + nbdcopy) reads the same MiB back;
//! - cryptsetup formats a volume in the guest, sectorcrypt writes a MiB into it here, and
//!   dm-crypt reads the same MiB back.
//!
//! The whole matrix takes two guest boots (`scripts/kernel-oracle-dmcrypt.sh` is the guest's
//! side). A case the kernel cannot run is a failure unless the kernel lacks the algorithm, and
//! then the test checks that it does. `docs/DMCRYPT.md` holds the matrix's table; a test checks
//! that it lists every case with its verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sectorcrypt_testkit::{kernel_oracle, pattern};

use crate::common::{p, sc, scratch, FAST_PBKDF};
use crate::nbd::{tool, Served, MIB};

/// Where the data lives relative to the header.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// The header at the start of the image, the data after it at the default offset.
    Attached,
    /// The header in a file of its own (`--header`), the data from the image's first byte.
    Detached,
    /// The data further in than the default: cryptsetup's `--offset` (20 MiB), sectorcrypt's
    /// larger keyslots area (`--luks2-keyslots-size`, 9 MiB). LUKS2 only: sectorcrypt has no
    /// way to move a LUKS1 payload.
    Offset,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Attached => "attached",
            Layout::Detached => "detached",
            Layout::Offset => "offset",
        }
    }
}

/// What a case must do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Both directions open and the bytes agree.
    Agree,
    /// The kernel has none of these algorithms (not in `/proc/crypto` after modprobe), so
    /// dm-crypt refuses the volume whoever made it.
    KernelLacks(&'static [&'static str]),
}

struct Case {
    /// The LUKS version, 1 or 2.
    luks: u8,
    cipher: String,
    key_bits: u32,
    sector: u32,
    layout: Layout,
    expect: Expect,
}

impl Case {
    /// The kernel's names of the block cipher and the ESSIV hash the case needs.
    fn algorithms(&self) -> Vec<&str> {
        let mut names = vec![self.cipher.split('-').next().unwrap()];
        if let Some((_, hash)) = self.cipher.split_once("essiv:") {
            names.push(hash);
        }
        names
    }

    fn what(&self, id: usize) -> String {
        format!(
            "case {id} (LUKS{} {} {} bits, {}-byte sectors, {})",
            self.luks,
            self.cipher,
            self.key_bits,
            self.sector,
            self.layout.name()
        )
    }

    /// The table's verdicts: sectorcrypt's volume in dm-crypt, cryptsetup's volume here.
    fn verdicts(&self) -> (String, String) {
        match self.expect {
            Expect::Agree => ("same bytes".into(), "same bytes".into()),
            Expect::KernelLacks(names) => {
                let lacks = format!("kernel lacks {}", names.join(", "));
                (lacks.clone(), lacks)
            }
        }
    }
}

/// The matrix: every cipher the kernel has in XTS with each key size on both LUKS versions and
/// each sector size; every IV generator with AES in CBC (and the counting ones in XTS and with
/// other ciphers); ESSIV with every hash whose digest is a key of some cipher; LRW and ECB; the
/// layouts; and the ciphers and hashes the kernel lacks.
fn matrix() -> Vec<Case> {
    use Expect::*;
    use Layout::*;
    let mut cases = Vec::new();
    let mut add = |luks: u8, cipher: &str, key_bits, sector, layout, expect| {
        cases.push(Case {
            luks,
            cipher: cipher.to_string(),
            key_bits,
            sector,
            layout,
            expect,
        })
    };
    for cipher in ["aes", "serpent", "twofish", "camellia", "cast6"] {
        let xts = format!("{cipher}-xts-plain64");
        add(1, &xts, 256, 512, Attached, Agree);
        add(2, &xts, 512, 512, Attached, Agree);
        add(2, &xts, 256, 4096, Attached, Agree);
    }
    add(1, "aes-xts-plain64", 512, 512, Attached, Agree);
    add(2, "aes-xts-plain64", 384, 4096, Attached, Agree);
    for (luks, cipher, key_bits, sector, lacks) in [
        (2, "aria-xts-plain64", 256, 4096, &["aria"]),
        (1, "aria-cbc-plain64", 256, 512, &["aria"]),
        (2, "sm4-xts-plain64", 256, 512, &["sm4"]),
        (1, "lea-xts-plain64", 512, 512, &["lea"]),
    ] {
        add(luks, cipher, key_bits, sector, Attached, KernelLacks(lacks));
    }
    // Every IV generator with AES; those that count bytes or blocks (benbi, eboiv) on every
    // sector size; then with the other ciphers.
    for (luks, cipher, key_bits, sector) in [
        (1, "aes-cbc-plain", 256, 512),
        (2, "aes-cbc-plain64", 256, 4096),
        (2, "aes-cbc-plain64be", 256, 4096),
        (1, "aes-cbc-essiv:sha256", 256, 512),
        (2, "aes-cbc-essiv:sha256", 128, 4096),
        (1, "aes-cbc-benbi", 256, 512),
        (2, "aes-cbc-benbi", 192, 4096),
        (1, "aes-cbc-null", 256, 512),
        (2, "aes-cbc-null", 128, 4096),
        (1, "aes-cbc-eboiv", 128, 512),
        (2, "aes-cbc-eboiv", 256, 4096),
        (2, "aes-cbc-eboiv", 256, 1024),
        (2, "aes-cbc-benbi", 256, 2048),
        (1, "aes-xts-plain", 512, 512),
        (2, "aes-xts-plain64be", 256, 4096),
        (2, "aes-xts-benbi", 512, 4096),
        (1, "aes-xts-null", 256, 512),
        (1, "serpent-cbc-benbi", 256, 512),
        (2, "twofish-cbc-eboiv", 256, 4096),
        (2, "camellia-cbc-null", 128, 512),
        (1, "cast6-cbc-plain64be", 192, 512),
        // ESSIV's key is the hash's digest: each hash goes with a cipher that takes its length.
        (1, "serpent-cbc-essiv:sha1", 256, 512),
        (2, "cast6-cbc-essiv:sha224", 256, 4096),
        (2, "serpent-cbc-essiv:sha3-224", 128, 512),
        (1, "aes-cbc-essiv:sha3-256", 128, 512),
        (2, "serpent-cbc-essiv:rmd160", 256, 4096),
        (1, "camellia-cbc-essiv:wp256", 256, 512),
    ] {
        add(luks, cipher, key_bits, sector, Attached, Agree);
    }
    // cryptsetup hands the hash's name to the kernel as it is, and the kernel's RIPEMD-160 is
    // called rmd160 only.
    for (luks, cipher, key_bits, sector, lacks) in [
        (1, "serpent-cbc-essiv:ripemd160", 256, 512, &["ripemd160"]),
        (2, "aes-cbc-essiv:sm3", 256, 512, &["sm3"]),
        (2, "aes-cbc-essiv:blake2s-256", 256, 4096, &["blake2s-256"]),
    ] {
        add(luks, cipher, key_bits, sector, Attached, KernelLacks(lacks));
    }
    for (luks, cipher, key_bits, sector) in [
        (1, "aes-lrw-benbi", 384, 512),
        (2, "serpent-lrw-plain64", 256, 4096),
        (2, "twofish-lrw-benbi", 320, 512),
        (1, "camellia-lrw-plain64be", 256, 512),
        (1, "aes-ecb", 256, 512),
        (2, "serpent-ecb", 256, 4096),
    ] {
        add(luks, cipher, key_bits, sector, Attached, Agree);
    }
    add(2, "aes-xts-plain64", 512, 4096, Detached, Agree);
    add(1, "serpent-cbc-essiv:sha256", 256, 512, Detached, Agree);
    add(2, "aes-xts-plain64", 512, 4096, Offset, Agree);
    add(2, "twofish-xts-plain64", 256, 512, Offset, Agree);
    // loop-AES's IV generator: LUKS1 only (LUKS2 cannot encrypt a keyslot with it).
    add(1, "aes-cbc-lmk", 256, 512, Attached, Agree);
    cases
}

/// The matrix as `docs/DMCRYPT.md` shows it.
fn table(cases: &[Case]) -> String {
    let mut t = String::from(
        "| # | LUKS | cipher | key bits | sector | layout | sectorcrypt's volume, dm-crypt writes, sectorcrypt reads | cryptsetup's volume, sectorcrypt writes, dm-crypt reads |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for (i, c) in cases.iter().enumerate() {
        let (ours, theirs) = c.verdicts();
        writeln!(
            t,
            "| {} | LUKS{} | `{}` | {} | {} | {} | {ours} | {theirs} |",
            i + 1,
            c.luks,
            c.cipher,
            c.key_bits,
            c.sector,
            c.layout.name()
        )
        .unwrap();
    }
    t
}

fn doc_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/DMCRYPT.md")
}

#[test]
fn the_table_in_docs_is_the_matrix() {
    let doc = std::fs::read_to_string(doc_path()).unwrap();
    let table = table(&matrix());
    assert!(
        doc.contains(&table),
        "docs/DMCRYPT.md does not hold the matrix's table; it is now:\n{table}"
    );
}

/// What the guest script printed.
struct Report {
    /// The rest of each `STEP ID REST` line, by step and case.
    steps: BTreeMap<(String, usize), String>,
    /// The algorithms the kernel lacks, by case.
    lacks: BTreeMap<usize, BTreeSet<String>>,
}

impl Report {
    fn parse(text: &str) -> Report {
        let mut steps = BTreeMap::new();
        let mut lacks: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
        for line in text.lines() {
            let mut words = line.splitn(3, ' ');
            let (Some(step), Some(Ok(id)), rest) =
                (words.next(), words.next().map(str::parse), words.next())
            else {
                continue;
            };
            let rest = rest.unwrap_or("").to_string();
            if step == "lacks" {
                lacks.entry(id).or_default().insert(rest);
            } else {
                steps.insert((step.to_string(), id), rest);
            }
        }
        Report { steps, lacks }
    }

    /// The rest of the line of `step` for case `id` ("ok", "failed REASON", ...), or "no line".
    fn step(&self, step: &str, id: usize) -> &str {
        self.steps
            .get(&(step.to_string(), id))
            .map_or("no line", String::as_str)
    }

    fn lacks(&self, id: usize) -> BTreeSet<String> {
        self.lacks.get(&id).cloned().unwrap_or_default()
    }
}

/// Runs the guest script's `phase` over the cases in `cases_file`; the guest must get through it.
fn guest(work: &Path, phase: &str, cases_file: &Path) -> Report {
    let out = kernel_oracle::run(
        work,
        &kernel_oracle::script("kernel-oracle-dmcrypt.sh"),
        &[phase, p(cases_file)],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the guest's {phase} phase: {:?}\n{text}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    Report::parse(&text)
}

/// The image and the header file (if detached) of volume `prefix-id` in `work`.
fn volume(work: &Path, prefix: &str, id: usize, layout: Layout) -> (PathBuf, Option<PathBuf>) {
    let header = (layout == Layout::Detached).then(|| work.join(format!("{prefix}-{id}.hdr")));
    (work.join(format!("{prefix}-{id}.img")), header)
}

/// Runs `f` with the volume served (its first MiB) on a Unix socket; a panic (the server does
/// not start, nbdcopy fails) becomes an error.
fn with_served(
    work: &Path,
    image: &Path,
    header: Option<&Path>,
    key: &Path,
    f: impl FnOnce(&str),
) -> Result<(), String> {
    let mut extra = vec!["--device-size", "1048576"];
    if let Some(h) = header {
        extra.extend(["--header", p(h)]);
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let server = Served::unix(work, "s.sock", image, key, &extra);
        f(&server.uri);
        server.stop();
    }))
    .map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// The case as a line of the guest script's CASES file.
fn case_line(id: usize, case: &Case) -> String {
    format!(
        "{id} luks{} {} {} {} {} {}",
        case.luks,
        case.cipher,
        case.key_bits,
        case.sector,
        case.layout.name(),
        case.algorithms().join(",")
    )
}

/// The mapping must have the case's cipher and sector size.
fn check_table(report: &Report, step: &str, id: usize, case: &Case) -> Result<(), String> {
    let expected = format!("{} {}", case.cipher, case.sector);
    match report.step(step, id) {
        t if t == expected => Ok(()),
        t => Err(format!("dm-crypt's table is {t:?}, not {expected:?}")),
    }
}

// The matrix in two halves, each in a guest of its own, so that the two run at the same time.

#[test]
fn dm_crypt_and_sectorcrypt_agree_on_the_odd_cases() {
    agree_on("odd", 1);
}

#[test]
fn dm_crypt_and_sectorcrypt_agree_on_the_even_cases() {
    agree_on("even", 0);
}

/// Runs the cases whose number is `parity` modulo 2 both ways, and asserts that every one does
/// what the matrix expects (listing all that do not).
fn agree_on(half: &str, parity: usize) {
    let work = scratch(&format!("cli-dmcrypt-{half}"));
    let key = work.join("key");
    std::fs::write(&key, "passphrase dm-crypt").unwrap();
    // Numbered as in the table.
    let cases: Vec<(usize, Case)> = (1..)
        .zip(matrix())
        .filter(|(id, _)| id % 2 == parity)
        .collect();
    let mut failures = Vec::new();
    let mut failed = BTreeSet::new();
    let mut note = |id: usize, case: &Case, checked: Result<(), String>| {
        if let Err(why) = checked {
            failures.push(format!("{}: {why}", case.what(id)));
            failed.insert(id);
        }
    };

    let mut lines = String::new();
    for (id, case) in &cases {
        writeln!(lines, "{}", case_line(*id, case)).unwrap();
        note(*id, case, format_here(&work, &key, *id, case));
    }
    let cases_file = work.join("cases.txt");
    std::fs::write(&cases_file, &lines).unwrap();
    let written = guest(&work, "write", &cases_file);

    let mut read_lines = String::new();
    // The cases whose cryptsetup volume sectorcrypt wrote, for dm-crypt to read.
    let mut to_read = BTreeSet::new();
    for (id, case) in &cases {
        note(*id, case, check_ours(&work, &key, &written, *id, case));
        match write_theirs(&work, &key, &written, *id, case) {
            Ok(true) => {
                writeln!(read_lines, "{}", case_line(*id, case)).unwrap();
                to_read.insert(*id);
            }
            Ok(false) => {}
            Err(why) => note(*id, case, Err(why)),
        }
    }
    let read_file = work.join("read.txt");
    std::fs::write(&read_file, &read_lines).unwrap();
    let read = guest(&work, "read", &read_file);

    for (id, case) in cases.iter().filter(|(id, _)| to_read.contains(id)) {
        note(*id, case, check_theirs(&work, &read, *id, case));
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases of the dm-crypt matrix failed:\n{}",
        failed.len(),
        cases.len(),
        failures.join("\n")
    );
    std::fs::remove_dir_all(&work).unwrap();
}

/// The MiB of data one side writes into case `id`'s volume: `ours` for sectorcrypt's volume
/// (dm-crypt writes it), else for cryptsetup's (sectorcrypt writes it).
fn data(id: usize, ours: bool) -> Vec<u8> {
    pattern(MIB as usize, if ours { id } else { 1000 + id } as u64)
}

/// Before the guest: sectorcrypt formats the case's volume, and the data dm-crypt is to write
/// goes to data-ID.bin.
fn format_here(work: &Path, key: &Path, id: usize, case: &Case) -> Result<(), String> {
    std::fs::write(work.join(format!("data-{id}.bin")), data(id, true)).unwrap();
    let (image, header) = volume(work, "sc", id, case.layout);
    let size = match case.layout {
        Layout::Detached => 2 * MIB,
        _ => 24 * MIB,
    };
    std::fs::File::create(&image)
        .unwrap()
        .set_len(size)
        .unwrap();
    let bits = case.key_bits.to_string();
    let sector = case.sector.to_string();
    let luks = format!("luks{}", case.luks);
    let mut args = vec!["format", "-q", "--type", &luks, "--cipher", &case.cipher];
    args.extend(["--key-size", &bits]);
    if case.luks == 2 {
        args.extend(["--sector-size", &sector]);
    }
    args.extend(FAST_PBKDF);
    if let Some(h) = &header {
        args.extend(["--header", p(h)]);
    }
    if case.layout == Layout::Offset {
        args.extend(["--luks2-keyslots-size", "8388608"]);
    }
    args.extend(["--key-file", p(key), p(&image)]);
    let out = sc(&args);
    if !out.status.success() {
        // No image: the guest then has nothing to open.
        std::fs::remove_file(&image).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("sectorcrypt format failed: {stderr}"));
    }
    Ok(())
}

/// After the guest wrote: the kernel lacks exactly the algorithms the case says; dm-crypt wrote
/// sectorcrypt's volume with the case's cipher and sector size and sectorcrypt reads the same
/// bytes back, or dm-crypt refused it for want of an algorithm.
fn check_ours(
    work: &Path,
    key: &Path,
    written: &Report,
    id: usize,
    case: &Case,
) -> Result<(), String> {
    let expected_lacks: BTreeSet<String> = match case.expect {
        Expect::KernelLacks(names) => names.iter().map(|n| n.to_string()).collect(),
        _ => BTreeSet::new(),
    };
    if written.lacks(id) != expected_lacks {
        return Err(format!(
            "the kernel lacks {:?}, expected {expected_lacks:?}",
            written.lacks(id)
        ));
    }
    let write = written.step("write", id);
    match case.expect {
        Expect::Agree => {
            if write != "ok" {
                return Err(format!(
                    "dm-crypt did not write sectorcrypt's volume: {write}"
                ));
            }
            check_table(written, "table-sc", id, case)?;
            let (image, header) = volume(work, "sc", id, case.layout);
            let back = work.join(format!("back-{id}.bin"));
            with_served(work, &image, header.as_deref(), key, |uri| {
                tool("nbdcopy", &[uri, p(&back)]);
            })?;
            if std::fs::read(&back).unwrap() != data(id, true) {
                return Err("what dm-crypt wrote reads back differently here".into());
            }
            Ok(())
        }
        Expect::KernelLacks(_) if write.starts_with("failed open") => Ok(()),
        Expect::KernelLacks(_) => Err(format!(
            "dm-crypt did not refuse sectorcrypt's volume: {write}"
        )),
    }
}

/// After the guest formatted: sectorcrypt writes into cryptsetup's volume (true: dm-crypt is to
/// read it).
fn write_theirs(
    work: &Path,
    key: &Path,
    written: &Report,
    id: usize,
    case: &Case,
) -> Result<bool, String> {
    let (image, header) = volume(work, "cs", id, case.layout);
    let format = written.step("format", id);
    match case.expect {
        // dm-crypt lacks an algorithm that cryptsetup needed to format.
        Expect::KernelLacks(_) if format != "ok" => Ok(false),
        _ if format != "ok" => Err(format!("cryptsetup did not format: {format}")),
        Expect::Agree | Expect::KernelLacks(_) => {
            let input = work.join(format!("in-{id}.bin"));
            std::fs::write(&input, data(id, false)).unwrap();
            with_served(work, &image, header.as_deref(), key, |uri| {
                tool("nbdcopy", &["--flush", p(&input), uri]);
            })
            .map_err(|why| format!("cannot write cryptsetup's volume here: {why}"))?;
            Ok(true)
        }
    }
}

/// After the guest read: dm-crypt read cryptsetup's volume with the case's cipher and sector
/// size and got what sectorcrypt wrote, or refused it for want of an algorithm.
fn check_theirs(work: &Path, read: &Report, id: usize, case: &Case) -> Result<(), String> {
    let step = read.step("read", id);
    match case.expect {
        Expect::Agree => {
            if step != "ok" {
                return Err(format!("dm-crypt did not read cryptsetup's volume: {step}"));
            }
            check_table(read, "table-cs", id, case)?;
            let back = std::fs::read(work.join(format!("read-{id}.bin"))).unwrap();
            if back != data(id, false) {
                return Err("what sectorcrypt wrote reads back differently in dm-crypt".into());
            }
            Ok(())
        }
        _ if step.starts_with("failed open") => Ok(()),
        _ => Err(format!(
            "dm-crypt did not refuse cryptsetup's volume: {step}"
        )),
    }
}
