//! `nanddump`-layout dumps: a `ubinize` image is a data-only dump, survives a round trip through
//! the layout with spare areas, and what comes back is still read by ubi_reader.

use std::process::Command;

use sectorcrypt_flash::dump::{DumpFlash, Layout};
use sectorcrypt_flash::{Error, Flash, Geometry};
use sectorcrypt_storage::{FileStorage, MemStorage, Storage};
use sectorcrypt_testkit::{ok, output, p, pattern, scratch};

use crate::small;

/// The chip `ubinize -p 128KiB -m 2048 -s 512` targets (a common 2 KiB-page SLC chip).
fn slc() -> Geometry {
    Geometry::default()
}

fn ubinize(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::write(dir.join("d.bin"), pattern(200_000, 1)).unwrap();
    std::fs::write(
        dir.join("u.cfg"),
        "[data]\nmode=ubi\nimage=d.bin\nvol_id=0\nvol_size=1MiB\nvol_type=dynamic\nvol_name=data\n\
         [spare]\nmode=ubi\nvol_id=1\nvol_size=256KiB\nvol_type=dynamic\nvol_name=spare\n",
    )
    .unwrap();
    ok(
        output(Command::new("ubinize").current_dir(dir).args([
            "-o", "img.ubi", "-p", "128KiB", "-m", "2048", "-s", "512", "u.cfg",
        ])),
        "ubinize",
    );
    dir.join("img.ubi")
}

fn file(path: &std::path::Path) -> Box<dyn Storage> {
    Box::new(FileStorage::open(path).unwrap())
}

/// Copy every block of `from` onto `to` (erased first), as a flasher would.
fn copy(from: &dyn Flash, to: &dyn Flash) {
    let g = from.geometry();
    let mut block = vec![0u8; g.peb_size as usize];
    for peb in 0..g.peb_count {
        from.read(peb, 0, &mut block).unwrap();
        to.erase(peb).unwrap();
        to.program(peb, 0, &block).unwrap();
    }
}

#[test]
fn a_ubinize_image_round_trips_through_both_layouts_and_ubi_reader_reads_it() {
    let dir = scratch("flash-dump-ubinize");
    let img = ubinize(&dir);
    let original = std::fs::read(&img).unwrap();
    let plain = DumpFlash::open(file(&img), slc(), Layout::DataOnly).unwrap();
    let g = plain.geometry();
    assert_eq!(u64::from(g.peb_count) * 128 * 1024, original.len() as u64);

    let oob_path = dir.join("with-oob.bin");
    // An erased chip's dump: a zero spare byte would be a bad-block marker.
    let erased = vec![0xFF; DumpFlash::image_len(&g, Layout::WithOob) as usize];
    std::fs::write(&oob_path, erased).unwrap();
    let with_oob = DumpFlash::open(file(&oob_path), slc(), Layout::WithOob).unwrap();
    copy(&plain, &with_oob);
    // nanddump --oob layout: 2048 data bytes, then 64 spare bytes (erased: 0xFF), page by page.
    let raw = std::fs::read(&oob_path).unwrap();
    for (i, page) in raw.chunks(2048 + 64).enumerate() {
        assert_eq!(page[..2048], original[i * 2048..(i + 1) * 2048], "page {i}");
        assert!(page[2048..].iter().all(|&b| b == 0xFF), "spare of page {i}");
    }

    let back_path = dir.join("back.bin");
    std::fs::write(&back_path, vec![0u8; original.len()]).unwrap();
    let back = DumpFlash::open(file(&back_path), slc(), Layout::DataOnly).unwrap();
    copy(&with_oob, &back);
    assert_eq!(std::fs::read(&back_path).unwrap(), original);

    let info = ok(
        output(Command::new("ubireader_display_info").args(["-p", "131072", p(&back_path)])),
        "ubireader_display_info",
    );
    let text = String::from_utf8_lossy(&info.stdout);
    for name in ["data", "spare"] {
        assert!(
            text.contains(&format!("Volume Name:{name}")),
            "{name} not in:\n{text}"
        );
    }
}

#[test]
fn a_dump_keeps_the_rules_its_bytes_can_show() {
    let g = small();
    for layout in [Layout::DataOnly, Layout::WithOob] {
        let mem = MemStorage::new(vec![0xFF; DumpFlash::image_len(&g, layout) as usize]);
        let f = DumpFlash::open(Box::new(mem), g, layout).unwrap();
        assert_eq!(f.geometry(), g);
        let a = pattern(2048, 2);
        f.program(1, 2048, &a).unwrap();
        let mut got = vec![0u8; 2048];
        f.read(1, 2048, &mut got).unwrap();
        assert_eq!(got, a, "{layout:?}");
        // Programs only clear bits.
        let b = pattern(2048, 3);
        f.program(1, 2048, &b).unwrap();
        f.read(1, 2048, &mut got).unwrap();
        let anded: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x & y).collect();
        assert_eq!(got, anded, "{layout:?}");
        assert!(matches!(
            f.program(1, 100, &a[..512]),
            Err(Error::Unaligned(_))
        ));
        f.erase(1).unwrap();
        f.read(1, 2048, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0xFF), "{layout:?}: erased");
        match layout {
            Layout::DataOnly => {
                assert!(!f.is_bad(2).unwrap());
                assert!(matches!(f.mark_bad(2), Err(Error::Format(_))));
                assert!(f.read_oob(2, 0, &mut [0u8; 4]).is_err());
            }
            Layout::WithOob => {
                f.mark_bad(2).unwrap();
                assert!(f.is_bad(2).unwrap());
                assert!(matches!(f.erase(2), Err(Error::BadBlock(2))));
                assert!(matches!(f.program(2, 0, &a), Err(Error::BadBlock(2))));
                assert!(!f.is_bad(3).unwrap());
            }
        }
    }
    // A length that is not whole eraseblocks is refused.
    let mem = MemStorage::new(vec![0xFF; 16 * 1024 + 1]);
    assert!(matches!(
        DumpFlash::open(Box::new(mem), g, Layout::DataOnly),
        Err(Error::Geometry(_))
    ));
}
