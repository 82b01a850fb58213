//! `RbdStorage` against a real Ceph cluster (`scripts/ceph-cluster.sh`, one monitor and one OSD):
//! reads, writes, flushes, discards and sizes go through librbd; a second writer is refused while
//! the first holds the image's exclusive lock, read-only opens coexist with it; bad names and
//! missing images get errors, never a panic.
#![cfg(feature = "rbd")]

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sectorcrypt_storage::rbd::{CephOptions, RbdSpec, RbdStorage};
use sectorcrypt_storage::Storage;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh")
}

/// A running cluster, stopped on drop.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
}

impl Cluster {
    fn start(port: u16) -> Cluster {
        let dir =
            std::env::temp_dir().join(format!("sectorcrypt-rbd-storage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = Command::new("bash")
            .arg(script())
            .args(["start", dir.to_str().unwrap(), &port.to_string()])
            .stdin(Stdio::null())
            .output()
            .expect("run scripts/ceph-cluster.sh (scripts/install-test-deps.sh installs Ceph)");
        assert!(
            out.status.success(),
            "cluster start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster {
            conf: dir.join("ceph.conf"),
            dir,
        }
    }

    fn rbd(&self, args: &[&str]) {
        let out = Command::new("rbd")
            .arg("--conf")
            .arg(&self.conf)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rbd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["stop", self.dir.to_str().unwrap()])
            .stdin(Stdio::null())
            .output();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[test]
fn rbd_images_as_storage() {
    let cluster = Cluster::start(3392);
    cluster.rbd(&["create", "--size", "64M", "rbd/store"]);
    let ceph = CephOptions {
        conf: Some(&cluster.conf),
        id: None,
        op_timeout: None,
    };
    let spec = RbdSpec::parse("rbd:rbd/store").unwrap().unwrap();

    let w = RbdStorage::open(&spec, true, &ceph).unwrap();
    assert!(w.is_writable());
    assert_eq!(w.len().unwrap(), 64 << 20);
    assert_eq!(w.name(), "rbd:rbd/store");
    let data: Vec<u8> = (0..3 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    // Unaligned and across the 4 MiB object boundary.
    let at = (4 << 20) - 12_345;
    w.write_at(&data, at).unwrap();
    w.sync().unwrap();
    let mut back = vec![0u8; data.len()];
    w.read_at(&mut back, at).unwrap();
    assert!(back == data, "read back what was written");

    // A second writer is refused while the first holds the lock; readers coexist.
    let busy = RbdStorage::open(&spec, true, &ceph).unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::ResourceBusy, "{busy}");
    let r = RbdStorage::open(&spec, false, &ceph).unwrap();
    let mut seen = vec![0u8; data.len()];
    r.read_at(&mut seen, at).unwrap();
    assert!(seen == data, "a read-only open sees the writer's data");
    assert!(
        r.write_at(&[1; 512], 0).is_err(),
        "a read-only open cannot write"
    );

    // Discard of a whole object: it reads back as zeros. A partial one is a hint librbd may
    // skip: the range reads as zeros or as it was.
    w.discard(4 << 20, 4 << 20).unwrap();
    w.read_at(&mut back, at).unwrap();
    assert!(
        back[..12_345] == data[..12_345],
        "before the discarded object: kept"
    );
    assert!(
        back[12_345..].iter().all(|&b| b == 0),
        "the discarded object reads as zeros"
    );
    w.discard(at, 4096).unwrap();
    let mut head = vec![0u8; 4096];
    w.read_at(&mut head, at).unwrap();
    assert!(head.iter().all(|&b| b == 0) || head == data[..4096]);

    // Past the end: errors, nothing written.
    let end = 64 << 20;
    assert_eq!(
        w.write_at(&[7; 4096], end - 100).unwrap_err().kind(),
        ErrorKind::UnexpectedEof
    );
    assert_eq!(
        w.read_at(&mut [0; 10], end).unwrap_err().kind(),
        ErrorKind::UnexpectedEof
    );
    assert!(w.read_at(&mut [0; 10], u64::MAX - 3).is_err());

    // Pieces through librbd's asynchronous calls: each prepared in order just before it is
    // sent, handed over in order as it arrives, across the object boundary and with a short
    // last piece; errors from a piece's work or the range come back, and nothing hangs.
    let piece = 300_000;
    let at = (8 << 20) - 1_000_000;
    let mut buf = data.clone();
    let mut order = Vec::new();
    w.write_pieces(&mut buf, at, piece, &mut |i, p| {
        order.push((i, p.len()));
        p.iter_mut().for_each(|b| *b ^= i as u8 + 1);
        Ok(())
    })
    .unwrap();
    let pieces = data.len().div_ceil(piece);
    let expected: Vec<(usize, usize)> = (0..pieces)
        .map(|i| (i, piece.min(data.len() - i * piece)))
        .collect();
    assert_eq!(order, expected, "every piece prepared once, in order");
    let sent: Vec<u8> = data
        .iter()
        .enumerate()
        .map(|(k, b)| b ^ ((k / piece) as u8 + 1))
        .collect();
    w.read_at(&mut back, at).unwrap();
    assert!(
        back == sent,
        "each piece written as prepared, where it belongs"
    );
    let mut seen = vec![0u8; data.len()];
    let mut order = Vec::new();
    r.read_pieces(&mut seen, at, piece, &mut |i, p| {
        assert!(p[..] == sent[i * piece..i * piece + p.len()], "piece {i}");
        order.push((i, p.len()));
        Ok(())
    })
    .unwrap();
    assert_eq!(order, expected, "every piece handed over once, in order");
    assert!(seen == sent, "read_pieces fills the buffer");
    let stop = |i: usize| {
        if i == 2 {
            Err(std::io::Error::other("piece 2 refused"))
        } else {
            Ok(())
        }
    };
    let e = w
        .write_pieces(&mut buf, at, piece, &mut |i, _| stop(i))
        .unwrap_err();
    assert_eq!(e.to_string(), "piece 2 refused");
    let e = r
        .read_pieces(&mut seen, at, piece, &mut |i, _| stop(i))
        .unwrap_err();
    assert_eq!(e.to_string(), "piece 2 refused");
    let e = r
        .write_pieces(&mut buf, at, piece, &mut |_, _| Ok(()))
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::ReadOnlyFilesystem,
        "librbd refuses a read-only open's writes: {e}"
    );
    let e = w
        .read_pieces(&mut seen, (64 << 20) - 100, piece, &mut |_, _| Ok(()))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnexpectedEof);

    // The lock goes with the writer: once it is closed, a new writer gets it.
    drop(w);
    let w2 = RbdStorage::open(&spec, true, &ceph).unwrap();
    w2.write_at(&[9; 4096], 0).unwrap();
    drop(w2);

    // Missing image, pool and configuration: errors that say what.
    let missing = RbdSpec::parse("rbd:rbd/none").unwrap().unwrap();
    let e = RbdStorage::open(&missing, false, &ceph).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let nopool = RbdSpec::parse("rbd:nopool/store").unwrap().unwrap();
    let e = RbdStorage::open(&nopool, false, &ceph).unwrap_err();
    assert!(e.to_string().contains("nopool"), "{e}");
    let noconf = CephOptions {
        conf: Some(Path::new("/nonexistent/ceph.conf")),
        id: None,
        op_timeout: None,
    };
    let e = RbdStorage::open(&spec, false, &noconf).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/ceph.conf"), "{e}");
}
