//! The UBI crate's tests, one binary: the on-flash structures against `ubinize` (`media`),
//! attaching, volumes and LEBs on a simulated chip with `ubinize` images and `ubi_reader` as the
//! independent readers (`device`), and power cuts at every program and erase (`crash`).

mod crash;
mod device;
mod media;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use sectorcrypt_flash::sim::{MemChip, SimNand};
use sectorcrypt_flash::{Flash, Geometry};
use sectorcrypt_testkit::{ok, output};
use sectorcrypt_ubi::media::VolType;
use sectorcrypt_ubi::{AttachOptions, NewVolume, Ubi};

/// A small SLC chip: 16 KiB PEBs of 2 KiB pages (512-byte sub-pages, NOP 4): LEBs of 14 KiB.
fn small(pebs: u32) -> Geometry {
    Geometry {
        peb_size: 16 * 1024,
        page_size: 2048,
        sub_page_size: 512,
        oob_size: 64,
        peb_count: pebs,
        nop: 4,
    }
}

/// The bytes a LEB of [`small`] holds.
const LEB: usize = 16 * 1024 - 2048;

/// A chip in memory that can be powered on again after a cut.
struct Chip(MemChip);

impl Chip {
    fn new(g: Geometry) -> (Chip, Arc<SimNand>) {
        let (chip, sim) = MemChip::create(g, &[]).unwrap();
        (Chip(chip), sim)
    }

    /// The chip as the next power-on finds it.
    fn power_on(&self) -> Arc<SimNand> {
        self.0.power_on().unwrap()
    }
}

fn attach(flash: &Arc<SimNand>) -> Ubi {
    Ubi::attach(
        Arc::clone(flash) as Arc<dyn Flash>,
        &AttachOptions::default(),
    )
    .unwrap()
}

fn dynamic(name: &str, lebs: u32) -> NewVolume {
    NewVolume {
        id: None,
        name: name.into(),
        lebs,
        vol_type: VolType::Dynamic,
        alignment: 1,
        autoresize: false,
    }
}

fn static_volume(name: &str, lebs: u32) -> NewVolume {
    NewVolume {
        vol_type: VolType::Static,
        ..dynamic(name, lebs)
    }
}

/// The whole contents of volume `id`, LEB by LEB.
fn read_volume(ubi: &Ubi, id: u32) -> Vec<u8> {
    let v = ubi.info().volumes.into_iter().find(|v| v.id == id).unwrap();
    let mut all = vec![0u8; v.lebs as usize * v.usable_leb_size as usize];
    for (lnum, chunk) in all.chunks_mut(v.usable_leb_size as usize).enumerate() {
        ubi.read(id, lnum as u32, 0, chunk).unwrap();
    }
    all
}

/// Run `ubinize` in `dir` on the config `cfg` for the [`small`] geometry.
fn ubinize(dir: &Path, cfg: &str) -> Vec<u8> {
    std::fs::write(dir.join("u.cfg"), cfg).unwrap();
    ok(
        output(
            Command::new("ubinize")
                .current_dir(dir)
                .args(["-o", "img.ubi", "-p", "16KiB", "-m", "2048", "-s", "512"])
                .arg("u.cfg"),
        ),
        "ubinize",
    );
    std::fs::read(dir.join("img.ubi")).unwrap()
}

/// The data area of every PEB of `flash`, in order (a `nanddump` without spare areas).
fn dump(flash: &dyn Flash) -> Vec<u8> {
    let g = flash.geometry();
    let mut all = vec![0u8; g.size() as usize];
    for (peb, chunk) in all.chunks_mut(g.peb_size as usize).enumerate() {
        flash.read(peb as u32, 0, chunk).unwrap();
    }
    all
}
