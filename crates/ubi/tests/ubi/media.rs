//! The headers and volume table `ubinize` (mtd-utils) writes parse here, and re-serialise to
//! the same bytes.

use std::process::Command;

use sectorcrypt_testkit::{ok, output, pattern, scratch};
use sectorcrypt_ubi::media::{
    crc, EcHdr, Header, Layout, VidHdr, VolType, VtblRecord, LAYOUT_VOLUME_ID, VTBL_AUTORESIZE_FLG,
    VTBL_RECORD_SIZE,
};

const PEB: usize = 128 * 1024;

#[test]
fn ubinize_images_parse_and_reserialise_bit_for_bit() {
    let dir = scratch("ubi-ubinize-media");
    let dynamic = pattern(300_000, 1);
    let stat = pattern(5000, 2);
    std::fs::write(dir.join("d.bin"), &dynamic).unwrap();
    std::fs::write(dir.join("s.bin"), &stat).unwrap();
    std::fs::write(
        dir.join("u.cfg"),
        "[data]\nmode=ubi\nimage=d.bin\nvol_id=0\nvol_size=1MiB\nvol_type=dynamic\nvol_name=data\n\
         [cfg]\nmode=ubi\nimage=s.bin\nvol_id=1\nvol_type=static\nvol_name=cfg\n\
         [empty]\nmode=ubi\nvol_id=2\nvol_size=512KiB\nvol_type=dynamic\nvol_name=spare\n\
         vol_flags=autoresize\n",
    )
    .unwrap();
    ok(
        output(
            Command::new("ubinize")
                .current_dir(&dir)
                .args(["-o", "img.ubi", "-p", "128KiB", "-m", "2048", "-s", "512"])
                .args(["-Q", "0x1234", "u.cfg"]),
        ),
        "ubinize",
    );
    let img = std::fs::read(dir.join("img.ubi")).unwrap();
    let layout = Layout::new(PEB as u32, 2048, 512, None).unwrap();
    assert_eq!(img.len() % PEB, 0);
    let mut lebs = Vec::new();
    for (pnum, peb) in img.chunks(PEB).enumerate() {
        let Header::Valid(ec) = EcHdr::parse(peb) else {
            panic!("PEB {pnum}: no valid EC header")
        };
        assert_eq!(
            (ec.image_seq, ec.vid_hdr_offset, ec.data_offset),
            (0x1234, 512, 2048)
        );
        assert_eq!(ec.to_bytes()[..], peb[..64], "PEB {pnum}: EC header bytes");
        let vid_bytes = &peb[512..576];
        let Header::Valid(vid) = VidHdr::parse(vid_bytes, layout.leb_size) else {
            panic!("PEB {pnum}: no valid VID header")
        };
        assert_eq!(
            vid.to_bytes()[..],
            vid_bytes[..],
            "PEB {pnum}: VID header bytes"
        );
        lebs.push((vid, &peb[2048..]));
    }
    // The volume table, twice, in the layout volume's two LEBs.
    let copies: Vec<_> = lebs
        .iter()
        .filter(|(v, _)| v.vol_id == LAYOUT_VOLUME_ID)
        .collect();
    assert_eq!(copies.len(), 2);
    assert_eq!(
        copies[0].1[..layout.vtbl_size as usize],
        copies[1].1[..layout.vtbl_size as usize]
    );
    let table = copies[0].1;
    let records: Vec<Option<VtblRecord>> = (0..layout.vtbl_slots as usize)
        .map(|i| VtblRecord::parse(&table[i * VTBL_RECORD_SIZE..], i).unwrap())
        .collect();
    for (i, r) in records.iter().enumerate() {
        assert_eq!(
            VtblRecord::to_bytes(r.as_ref())[..],
            table[i * VTBL_RECORD_SIZE..(i + 1) * VTBL_RECORD_SIZE],
            "slot {i} bytes"
        );
    }
    let vol = |i: usize| records[i].as_ref().unwrap();
    assert_eq!(
        (vol(0).name.as_slice(), vol(0).reserved_pebs),
        (&b"data"[..], 9)
    );
    assert_eq!(
        (vol(1).vol_type, vol(1).reserved_pebs),
        (VolType::Static, 1)
    );
    assert_eq!(vol(2).flags, VTBL_AUTORESIZE_FLG);
    assert!(records[3..].iter().all(Option::is_none));
    // The static LEB: its CRC and size describe exactly the data.
    let (svid, sdata) = lebs.iter().find(|(v, _)| v.vol_id == 1).unwrap();
    assert_eq!((svid.data_size, svid.used_ebs), (5000, 1));
    assert_eq!(svid.data_crc, crc(&sdata[..5000]));
    assert_eq!(&sdata[..5000], &stat[..]);
    // The dynamic volume's data, LEB by LEB.
    let mut data: Vec<_> = lebs.iter().filter(|(v, _)| v.vol_id == 0).collect();
    data.sort_by_key(|(v, _)| v.lnum);
    let joined: Vec<u8> = data.iter().flat_map(|(_, d)| d.iter().copied()).collect();
    assert_eq!(&joined[..dynamic.len()], &dynamic[..]);
}
