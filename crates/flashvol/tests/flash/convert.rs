//! In-place conversion of a plain UBI flash (a `ubinize` image flashed as `ubiformat` would) to an
//! encrypted flash and back: the volumes read the same before and after, the erase counters are
//! kept, the chip holds only ciphertext in between, and a power cut at any chip operation of
//! either direction is finished by running the conversion again.

use std::process::Command;
use std::sync::Arc;

use sectorcrypt_flash::crypt::Policy;
use sectorcrypt_flash::sim::SimNand;
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_flashvol::convert::{decrypt, encrypt, Stage};
use sectorcrypt_flashvol::{unlock, Error};
use sectorcrypt_storage::{MemStorage, Window};
use sectorcrypt_testkit::tools::ubi_reader_volumes;
use sectorcrypt_testkit::{ok, output, pattern, scratch};
use sectorcrypt_ubi::media::EC_HDR_MAGIC;
use sectorcrypt_ubi::{flash_image, AttachOptions, Ubi};

use crate::small_key;

const PASS: &[u8] = b"convert";

fn geometry() -> Geometry {
    Geometry {
        peb_count: 48,
        ..Geometry::default()
    }
}

/// A chip image in memory holding a plain UBI made by `ubinize` (a dynamic and a static
/// volume) and flashed as `ubiformat -f` would.
fn plain_chip() -> Vec<u8> {
    // Made once: the tests run in parallel and would otherwise write one scratch folder at once.
    static IMAGE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    IMAGE.get_or_init(make_plain_chip).clone()
}

fn make_plain_chip() -> Vec<u8> {
    let dir = scratch("flashvol-convert-image");
    std::fs::write(dir.join("d.bin"), pattern(600_000, 1)).unwrap();
    std::fs::write(dir.join("s.bin"), pattern(90_000, 2)).unwrap();
    std::fs::write(
        dir.join("u.cfg"),
        "[d]\nmode=ubi\nimage=d.bin\nvol_id=0\nvol_size=2MiB\nvol_type=dynamic\nvol_name=data\n\
         [s]\nmode=ubi\nimage=s.bin\nvol_id=1\nvol_type=static\nvol_name=cfg\n",
    )
    .unwrap();
    ok(
        output(Command::new("ubinize").current_dir(&dir).args([
            "-o", "img.ubi", "-p", "128KiB", "-m", "2048", "-s", "512", "u.cfg",
        ])),
        "ubinize",
    );
    let g = geometry();
    let mem = Arc::new(MemStorage::new(vec![0; SimNand::image_len(&g) as usize]));
    let len = SimNand::image_len(&g);
    let sim = SimNand::create(Window::new(Arc::clone(&mem), 0, len), g, &[]).unwrap();
    flash_image(&sim, &std::fs::read(dir.join("img.ubi")).unwrap(), None).unwrap();
    drop(sim);
    mem.contents()
}

/// A chip on a copy of `image`, and the storage it lives in.
fn chip(image: &[u8]) -> (Arc<MemStorage>, Arc<SimNand>) {
    let mem = Arc::new(MemStorage::new(image.to_vec()));
    let sim = SimNand::open(Window::new(Arc::clone(&mem), 0, image.len() as u64)).unwrap();
    (mem, Arc::new(sim))
}

/// The data of every block of `flash`.
fn read_chip(flash: &SimNand) -> Vec<u8> {
    let g = flash.geometry();
    let mut all = vec![0u8; g.size() as usize];
    for (b, block) in all.chunks_mut(g.peb_size as usize).enumerate() {
        flash.read(b as u32, 0, block).unwrap();
    }
    all
}

/// Every volume's contents, by name.
fn contents(ubi: &Ubi) -> Vec<(String, Vec<u8>)> {
    ubi.info()
        .volumes
        .iter()
        .map(|v| {
            let mut data = vec![0u8; v.data_bytes as usize];
            for (lnum, chunk) in data.chunks_mut(v.usable_leb_size as usize).enumerate() {
                ubi.read(v.id, lnum as u32, 0, chunk).unwrap();
            }
            (v.name.clone(), data)
        })
        .collect()
}

fn plain_contents(flash: Arc<dyn Flash>) -> Vec<(String, Vec<u8>)> {
    contents(&Ubi::attach(flash, &AttachOptions::default()).unwrap())
}

fn encrypted_contents(flash: Arc<dyn Flash>) -> Vec<(String, Vec<u8>)> {
    let opened = unlock(flash, PASS, None).unwrap();
    contents(&opened.attach(&AttachOptions::default()).unwrap())
}

#[test]
fn a_plain_ubi_flash_is_encrypted_in_place_and_decrypted_back() {
    let image = plain_chip();
    let (_, sim) = chip(&image);
    let before = plain_contents(sim.clone());
    assert_eq!(before.len(), 2);
    let ec_before = Ubi::attach(sim.clone(), &AttachOptions::default())
        .unwrap()
        .info()
        .erase_counters;
    let mut seen = 0;
    let erases_before = sim.erase_counts();
    let opened = encrypt(
        sim.clone(),
        &small_key(Policy::AtRest),
        PASS,
        &mut |done, all| {
            assert!(done <= all);
            seen = done;
        },
    )
    .unwrap();
    assert!(seen > 30, "progress reported every block");
    // The journal's two erases per converted block are spread over the header's journal pair
    // and the rewrite journal's two pairs: no rewrite journal block took more than a third of
    // them, give or take the erases of the start and the end (UBI moving its LEB out, the
    // journal made empty, its last erase), where one pair alone took two per block.
    let params = &opened.header.params;
    let (copy, record) = opened.header.area.journal();
    let converted = seen;
    assert!(converted > 30 && copy < record && record < params.rewrite_journal().start);
    // (The header's pair also journals every header block write: only the others are counted.)
    let journal: Vec<u32> = params.rewrite_journal().collect();
    assert_eq!(journal.len(), 4);
    let erases_after = sim.erase_counts();
    for b in journal {
        let took = erases_after[b as usize] - erases_before[b as usize];
        assert!(
            (2..=converted / 3 + 4).contains(&took),
            "journal block {b} took {took} erases for {converted} blocks"
        );
    }
    let ubi = opened.attach(&AttachOptions::default()).unwrap();
    assert_eq!(contents(&ubi), before, "the volumes, encrypted");
    let (min, _, max) = ubi.info().erase_counters;
    assert!(
        min >= ec_before.0 && max <= ec_before.2 + 2,
        "erase counters kept"
    );
    drop((ubi, opened));
    // The chip: no UBI header and no free space anywhere after the header blocks.
    let g = geometry();
    let mut raw = vec![0u8; g.peb_size as usize];
    for b in 7..g.peb_count {
        sim.read(b, 0, &mut raw).unwrap();
        let magic = EC_HDR_MAGIC.to_be_bytes();
        assert!(
            !raw.windows(4).any(|w| w == magic),
            "block {b} shows a UBI header"
        );
        assert!(
            !raw.windows(32).any(|w| w == [0xFF; 32]),
            "block {b} shows free space"
        );
    }
    // Running either again when it is done changes nothing.
    let snapshot = read_chip(&sim);
    encrypt(
        sim.clone(),
        &small_key(Policy::AtRest),
        PASS,
        &mut |_, _| {},
    )
    .unwrap();
    assert!(
        read_chip(&sim) == snapshot,
        "encrypting an encrypted flash changed it"
    );
    decrypt(sim.clone(), PASS, &mut |_, _| {}).unwrap();
    let snapshot = read_chip(&sim);
    decrypt(sim.clone(), PASS, &mut |_, _| {}).unwrap();
    assert!(
        read_chip(&sim) == snapshot,
        "decrypting a plain flash changed it"
    );
    assert_eq!(
        plain_contents(sim.clone()),
        before,
        "the volumes, plain again"
    );
    // ubi_reader reads the decrypted chip as any UBI dump.
    let dir = scratch("flashvol-convert-reader");
    let dump = dir.join("chip.bin");
    std::fs::write(&dump, read_chip(&sim)).unwrap();
    let volumes = ubi_reader_volumes(&dir, &dump);
    assert_eq!(volumes["cfg"], before[1].1);
}

#[test]
fn a_chip_without_ubi_or_with_a_conversion_in_progress_is_refused() {
    let g = geometry();
    let len = SimNand::image_len(&g);
    let mem = Arc::new(MemStorage::new(vec![0; len as usize]));
    let sim = Arc::new(SimNand::create(Window::new(Arc::clone(&mem), 0, len), g, &[]).unwrap());
    let before = mem.contents();
    assert!(matches!(
        encrypt(sim, &small_key(Policy::Thesis), PASS, &mut |_, _| {}),
        Err(Error::Unsupported(_))
    ));
    assert!(mem.contents() == before, "an erased chip is left as it was");

    // A conversion cut short among the blocks: it can be finished, nothing else.
    let image = plain_chip();
    let (_, whole) = chip(&image);
    encrypt(
        whole.clone(),
        &small_key(Policy::Thesis),
        PASS,
        &mut |_, _| {},
    )
    .unwrap();
    let (mem, sim) = chip(&image);
    sim.cut_power_at(Some(whole.operations() - 40));
    assert!(encrypt(sim, &small_key(Policy::Thesis), PASS, &mut |_, _| {}).is_err());
    let again =
        Arc::new(SimNand::open(Window::new(Arc::clone(&mem), 0, image.len() as u64)).unwrap());
    assert!(matches!(
        unlock(again.clone(), PASS, None),
        Err(Error::Converting(Stage::Encrypting))
    ));
    assert!(matches!(
        decrypt(again.clone(), PASS, &mut |_, _| {}),
        Err(Error::Converting(Stage::Encrypting))
    ));
    let snapshot = mem.contents();
    assert!(matches!(
        encrypt(
            again.clone(),
            &small_key(Policy::Thesis),
            b"wrong",
            &mut |_, _| {}
        ),
        Err(Error::Luks(_))
    ));
    assert!(
        mem.contents() == snapshot,
        "a wrong passphrase wrote nothing"
    );
    encrypt(
        again.clone(),
        &small_key(Policy::Thesis),
        PASS,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(encrypted_contents(again), plain_contents(chip(&image).1));
}

/// Cut the power at the `n`-th chip operation of `run` on a copy of `image`, for every n until
/// `run` completes; after each cut run it again without a cut and `check` the result.
fn sweep(
    image: &[u8],
    run: impl Fn(Arc<SimNand>) -> Result<(), Error>,
    check: impl Fn(Arc<SimNand>),
) -> u64 {
    for n in 1.. {
        let (mem, sim) = chip(image);
        sim.cut_power_at(Some(n));
        let result = run(sim.clone());
        if !sim.is_off() {
            result.unwrap();
            sim.cut_power_at(None);
            check(sim);
            return n - 1;
        }
        let len = image.len() as u64;
        let again = Arc::new(SimNand::open(Window::new(Arc::clone(&mem), 0, len)).unwrap());
        run(again.clone()).unwrap_or_else(|e| panic!("cut {n}: running again failed: {e}"));
        check(again);
    }
    unreachable!()
}

#[test]
fn an_encryption_cut_anywhere_finishes_when_run_again() {
    let image = plain_chip();
    let (_, sim) = chip(&image);
    let before = plain_contents(sim);
    let cuts = sweep(
        &image,
        |sim| encrypt(sim, &small_key(Policy::AtRest), PASS, &mut |_, _| {}).map(drop),
        |sim| assert_eq!(encrypted_contents(sim), before),
    );
    assert!(cuts > 200, "{cuts} cut points");
}

#[test]
fn a_decryption_cut_anywhere_finishes_when_run_again() {
    let image = plain_chip();
    let (mem, sim) = chip(&image);
    let before = plain_contents(sim.clone());
    encrypt(sim, &small_key(Policy::AtRest), PASS, &mut |_, _| {}).unwrap();
    let encrypted = mem.contents();
    let cuts = sweep(
        &encrypted,
        |sim| decrypt(sim, PASS, &mut |_, _| {}),
        |sim| assert_eq!(plain_contents(sim), before),
    );
    assert!(cuts > 100, "{cuts} cut points");
}
