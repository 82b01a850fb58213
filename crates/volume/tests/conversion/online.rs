//! Conversions served while they run ([`sectorcrypt_volume::live`]): each of the five plans runs
//! step by step under a writer that keeps writing (aligned and not) and a reader that checks what
//! it reads, and after every step the whole volume reads back as the model of what was written.
//! At the end the data is exactly the model under the final layout and key; a conversion cut
//! by a crash while requests run is the subject of the crash sweep below.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sectorcrypt_luks::luks2::Header as Luks2Header;
use sectorcrypt_storage::MemStorage;
use sectorcrypt_volume::convert;
use sectorcrypt_volume::datashift;
use sectorcrypt_volume::reencrypt::{self, run_serving, Options, Outcome};
use sectorcrypt_volume::{Volume, VolumeOptions};

use crate::common::*;
use crate::datashift::{attached_volume, encrypt_image, MOVED, SHIFT};
use crate::in_place::{init_detached, init_detached_decrypt, init_detached_reencrypt};

/// A device (or a header and a device) with a conversion recorded, and the plaintext it serves.
struct Setup {
    header: Arc<MemStorage>,
    data: Arc<MemStorage>,
    plain: Vec<u8>,
}

const DATA_LEN: u64 = 1280 << 10;

fn setup(plan: &str) -> Setup {
    let plain = pattern(DATA_LEN as usize, 31);
    let detached = || Arc::new(MemStorage::new(vec![0; HEADER_LEN as usize]));
    match plan {
        "encrypt" => {
            let header = detached();
            init_detached(&*header, DATA_LEN, 4096);
            let data = Arc::new(MemStorage::new(plain.clone()));
            Setup {
                header,
                data,
                plain,
            }
        }
        "decrypt" => {
            let header = detached();
            let key = init_detached_decrypt(&*header, DATA_LEN, 4096);
            let data = Arc::new(MemStorage::new(expected_ciphertext(&key, 4096, &plain)));
            Setup {
                header,
                data,
                plain,
            }
        }
        "reencrypt" => {
            let header = detached();
            let (old, _) = init_detached_reencrypt(&*header, DATA_LEN, 4096);
            let data = Arc::new(MemStorage::new(expected_ciphertext(&old, 512, &plain)));
            Setup {
                header,
                data,
                plain,
            }
        }
        "encrypt-shift" => {
            let device_len = DATA_LEN + 2 * SHIFT;
            let on_device = pattern(device_len as usize, 32);
            let (image, _) = encrypt_image(device_len, 4096);
            let dev = Arc::new(MemStorage::new(on_device.clone()));
            convert::start_shifted_encryption(&*dev, &image).unwrap();
            Setup {
                header: Arc::clone(&dev),
                data: dev,
                plain: on_device[..DATA_LEN as usize].to_vec(),
            }
        }
        "decrypt-shift" => {
            let (volume, _) = attached_volume(SHIFT + DATA_LEN, &plain, 4096);
            let header = Arc::new(MemStorage::new(volume[..SHIFT as usize].to_vec()));
            let data = Arc::new(MemStorage::new(volume));
            datashift::start_decrypt(&*header, &*data, PASS, MOVED, &fast_init()).unwrap();
            Setup {
                header,
                data,
                plain,
            }
        }
        _ => unreachable!("{plan}"),
    }
}

/// `len` bytes of the volume from `offset`.
fn read(volume: &Volume, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    volume.read(&mut buf, offset).unwrap();
    buf
}

/// A request: somewhere in the volume, often unaligned, up to 3 sectors of 4 KiB.
fn request(rng: &mut StdRng, size: u64) -> (u64, usize) {
    let len = if rng.gen_bool(0.5) {
        4096 * rng.gen_range(1..=3)
    } else {
        rng.gen_range(1..=9000)
    };
    let offset = if len % 4096 == 0 && rng.gen_bool(0.5) {
        rng.gen_range(0..(size - len as u64) / 4096) * 4096
    } else {
        rng.gen_range(0..size - len as u64)
    };
    (offset, len)
}

fn serve_through(plan: &str) {
    let s = setup(plan);
    let converting = reencrypt::converting(&*s.header, &*s.data, PASS).unwrap();
    let h = Luks2Header::read(&*s.header).unwrap();
    let volume = Arc::new(
        Volume::open_converting(s.data.clone(), &h, &converting, &VolumeOptions::default())
            .unwrap(),
    );
    assert_eq!(
        volume.size(),
        s.plain.len() as u64,
        "{plan}: the size served"
    );
    assert!(read(&volume, 0, s.plain.len()) == s.plain, "{plan}: before");
    // The model of the volume; a writer and a reader hold it while their request runs, so what
    // they see is what the volume must hold, while the steps run beside them.
    let model = Arc::new(Mutex::new(s.plain.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let size = volume.size();
    let clients: Vec<_> = [(41u64, true), (42, false)]
        .into_iter()
        .map(|(seed, writer)| {
            let (volume, model, stop, writes) = (
                Arc::clone(&volume),
                Arc::clone(&model),
                Arc::clone(&stop),
                Arc::clone(&writes),
            );
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed);
                while !stop.load(Ordering::Relaxed) {
                    let (offset, len) = request(&mut rng, size);
                    let mut model = model.lock().unwrap();
                    let range = offset as usize..offset as usize + len;
                    if writer {
                        let data: Vec<u8> = (0..len).map(|_| rng.gen::<u8>()).collect();
                        volume.write(&data, offset).unwrap();
                        model[range].copy_from_slice(&data);
                        writes.fetch_add(1, Ordering::Relaxed);
                    } else {
                        assert!(read(&volume, offset, len) == model[range], "a read");
                    }
                }
            })
        })
        .collect();
    let mut steps = 0;
    let outcome = run_serving(
        &*s.header,
        &*s.data,
        PASS,
        &Options {
            hotzone: 256 << 10,
            threads: 1,
        },
        &mut |_| {
            steps += 1;
            let model = model.lock().unwrap();
            assert!(
                read(&volume, 0, model.len()) == *model,
                "{plan}: after step {steps}"
            );
            true
        },
        &*volume,
    )
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(outcome, Outcome::Finished, "{plan}");
    assert!(steps >= 3, "{plan}: {steps} steps");
    assert!(writes.load(Ordering::Relaxed) > 0, "{plan}: no write ran");
    let model = model.lock().unwrap();
    assert!(
        read(&volume, 0, model.len()) == *model,
        "{plan}: at the end"
    );
    // The device as anyone opens it now: the final layout and key hold the model.
    let after = Volume::with_layout(
        s.data.clone(),
        converting.final_layout.clone(),
        converting.new_key.as_deref().unwrap_or_default(),
        &VolumeOptions::default(),
    )
    .unwrap();
    assert!(read(&after, 0, model.len()) == *model, "{plan}: reopened");
}

#[test]
fn an_encryption_in_place_is_served_throughout() {
    serve_through("encrypt");
}

#[test]
fn a_decryption_in_place_is_served_throughout() {
    serve_through("decrypt");
}

#[test]
fn a_reencryption_is_served_throughout() {
    serve_through("reencrypt");
}

#[test]
fn a_shifted_encryption_is_served_throughout() {
    serve_through("encrypt-shift");
}

#[test]
fn a_shifted_decryption_is_served_throughout() {
    serve_through("decrypt-shift");
}

/// What each 4 KiB block of the volume may read after a power cut: every content written to it
/// since the last flush, or the one before if none was flushed since.
struct Model {
    blocks: Vec<Vec<Vec<u8>>>,
}

impl Model {
    fn new(plain: &[u8]) -> Model {
        Model {
            blocks: plain.chunks(4096).map(|b| vec![b.to_vec()]).collect(),
        }
    }

    fn written(&mut self, offset: u64, data: &[u8]) {
        for (i, b) in data.chunks(4096).enumerate() {
            self.blocks[offset as usize / 4096 + i].push(b.to_vec());
        }
    }

    fn flushed(&mut self) {
        for b in &mut self.blocks {
            let last = b.pop().unwrap();
            *b = vec![last];
        }
    }
}

/// The served volume with requests arriving as each step starts (before its hotzone is held,
/// one of them into it, unflushed as often as not) and as it ends: replayed identically on
/// every run of a sweep, which needs one order of operations.
struct Busy<'a> {
    volume: &'a Volume,
    rng: Mutex<StdRng>,
    model: &'a Mutex<Model>,
}

impl Busy<'_> {
    fn requests(&self, hot: Option<(u64, u64)>) {
        let mut rng = self.rng.lock().unwrap();
        let mut model = self.model.lock().unwrap();
        let blocks = self.volume.size() / 4096;
        for i in 0..3 {
            let first = match hot {
                Some((at, len)) if i == 0 => at / 4096 + rng.gen_range(0..len / 4096),
                _ => rng.gen_range(0..blocks),
            };
            let n = rng.gen_range(1..=3).min(blocks - first);
            let data: Vec<u8> = (0..n * 4096).map(|_| rng.gen::<u8>()).collect();
            // A write cut by the power is not acknowledged, but may have landed.
            model.written(first * 4096, &data);
            if self.volume.write(&data, first * 4096).is_err() {
                return;
            }
        }
        if rng.gen_bool(0.5) && self.volume.flush().is_ok() {
            model.flushed();
        }
    }
}

impl sectorcrypt_volume::live::Serving for Busy<'_> {
    fn started(
        &self,
        header: &Luks2Header,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), sectorcrypt_volume::Error> {
        self.volume.started(header, old, new)
    }
    fn hold(&self, at: u64, len: u64) {
        self.requests(Some((at, len)));
        self.volume.hold(at, len);
    }
    fn release(
        &self,
        metadata: &sectorcrypt_luks::luks2::metadata::Metadata,
    ) -> Result<(), sectorcrypt_volume::Error> {
        let released = self.volume.release(metadata);
        self.requests(None);
        released
    }
    fn failed(&self, why: &sectorcrypt_volume::Error) {
        self.volume.failed(why);
    }
    fn is_live(&self) -> bool {
        true
    }
}

/// A conversion in place (detached header) cut after every write and sync, with requests
/// arriving around every step: after recovery and the rest of the conversion (offline), no block
/// reads anything but what the model allows: no flushed write is lost, no block mixes keys.
fn crash_sweep_served(plan: &str) {
    use sectorcrypt_luks::luks2::reencrypt::State;
    use sectorcrypt_testkit::sweep::sweep_with_atoms;
    use sectorcrypt_volume::live::Serving;
    use sectorcrypt_volume::reencrypt::run;
    use sectorcrypt_volume::Error;

    let s = setup(plan);
    let converting = reencrypt::converting(&*s.header, &*s.data, PASS).unwrap();
    let opts = Options {
        hotzone: 256 << 10,
        threads: 1,
    };
    let last_model = Mutex::new(Model::new(&s.plain));
    let report = sweep_with_atoms(
        &[s.header.contents(), s.data.contents()],
        &[512, 4096],
        |devs| {
            let (h, d) = (&devs[0], &devs[1]);
            let header = Luks2Header::read(&**h).unwrap();
            let data: Arc<dyn sectorcrypt_storage::Storage> = d.clone();
            let volume =
                Volume::open_converting(data, &header, &converting, &VolumeOptions::default())
                    .unwrap();
            let model = Mutex::new(Model::new(&s.plain));
            let busy = Busy {
                volume: &volume,
                rng: Mutex::new(StdRng::seed_from_u64(7)),
                model: &model,
            };
            let result = run_serving(&**h, &**d, PASS, &opts, &mut |_| true, &busy);
            let _ = busy.is_live();
            *last_model.lock().unwrap() = model.into_inner().unwrap();
            result
        },
        |survivor| {
            let (h, d) = (&*survivor.devices[0], &*survivor.devices[1]);
            match run(h, d, PASS, &opts, &mut |_| true) {
                Ok(Outcome::Finished) => {}
                Err(Error::Unsupported(ref why)) if why.contains("no reencryption") => {}
                other => return Err(format!("resuming gave {other:?}")),
            }
            if state_of(h) != State::None {
                return Err("the conversion is not finished".into());
            }
            let after = Volume::with_layout(
                survivor.devices[1].clone(),
                converting.final_layout.clone(),
                converting.new_key.as_deref().unwrap_or_default(),
                &VolumeOptions::default(),
            )
            .map_err(|e| e.to_string())?;
            let model = last_model.lock().unwrap();
            for (i, allowed) in model.blocks.iter().enumerate() {
                let got = read(&after, i as u64 * 4096, 4096);
                if !allowed.contains(&got) {
                    return Err(format!(
                        "block {i} reads none of the {} contents it may have",
                        allowed.len()
                    ));
                }
            }
            Ok(())
        },
    );
    assert!(report.operations > 40, "{} operations", report.operations);
    report.assert_no_loss(&format!("crash sweep of a served {plan}"));
}

#[test]
fn crash_sweep_of_a_served_reencryption_loses_no_flushed_write() {
    crash_sweep_served("reencrypt");
}

#[test]
fn crash_sweep_of_a_served_decryption_loses_no_flushed_write() {
    crash_sweep_served("decrypt");
}
