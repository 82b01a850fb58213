use super::*;
use serde_json::json;

/// The §6.A example of the research note: encrypt + datashift init, 205-byte blob.
#[test]
fn blob_layout_matches_cryptsetup_serialiser() {
    let text = r#"{"keyslots":{"1":{"area":{"offset":"290816","size":"4096","type":"datashift","shift_size":"16777216"},"type":"reencrypt","key_size":1,"mode":"encrypt","direction":"backward","priority":0}},"tokens":{},"segments":{"0":{"type":"linear","offset":"50331648","size":"16777216"},"1":{"type":"linear","offset":"16777216","size":"16777216"},"2":{"type":"linear","offset":"50331648","size":"16777216","flags":["backup-moved-segment"]},"3":{"type":"linear","offset":"0","size":"33554432","flags":["backup-previous"]},"4":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":[],"segments":["4"],"hash":"sha256","iterations":1000,"salt":"AAAA","digest":"AAAA"}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#;
    let md = Metadata::from_json(serde_json::from_str(text).unwrap()).unwrap();
    let vk = [0x11u8; 64];
    let blob = reencrypt_digest_blob(&md, None, Some(&vk)).unwrap();
    assert_eq!(blob.len(), 205);
    let mut want = b"v2".to_vec();
    want.extend_from_slice(&vk);
    want.extend_from_slice(b"encryptbackwarddatashift");
    want.extend_from_slice(&290816u64.to_be_bytes());
    want.extend_from_slice(&4096u64.to_be_bytes());
    want.extend_from_slice(&16777216u64.to_be_bytes());
    want.extend_from_slice(b"linear");
    want.extend_from_slice(&0u64.to_be_bytes());
    want.extend_from_slice(&33554432u64.to_be_bytes());
    want.extend_from_slice(b"crypt");
    want.extend_from_slice(&16777216u64.to_be_bytes());
    want.extend_from_slice(b"dynamic");
    want.extend_from_slice(&0u64.to_be_bytes());
    want.extend_from_slice(b"aes-xts-plain64");
    want.extend_from_slice(&512u32.to_be_bytes());
    want.extend_from_slice(b"linear");
    want.extend_from_slice(&50331648u64.to_be_bytes());
    want.extend_from_slice(&16777216u64.to_be_bytes());
    assert_eq!(&blob[..], &want[..]);
    // The new key is needed; an old one is not asked for.
    assert!(matches!(
        reencrypt_digest_blob(&md, Some(&vk), None),
        Err(Error::Unsupported(_))
    ));
    let r = parse(&md).unwrap().unwrap();
    assert_eq!(r.state(), State::Clean);
    assert_eq!(state(&md), State::Clean);
    assert_eq!(r.backup_moved.as_ref().unwrap().id, 2);
    assert_eq!(r.segments.len(), 2);
    assert_eq!(
        r.keyslot.resilience,
        Resilience::Datashift {
            shift_size: 16 << 20
        }
    );
    assert_eq!(r.digest_new, Some(0));
    assert_eq!(r.digest_old, None);
    assert_eq!(r.digest, None);
    // The keyslot JSON round-trips in cryptsetup's order.
    let (_, ks) = reencrypt_keyslot(&md).unwrap();
    assert_eq!(
        serde_json::to_string(&r.keyslot).unwrap(),
        serde_json::to_string(ks).unwrap()
    );
}

#[test]
fn mistyped_fields_are_refused_not_panicked_on() {
    let base: Value = serde_json::from_str(r#"{"keyslots":{"1":{"area":{"offset":"290816","size":"16486400","type":"checksum","hash":"sha256","sector_size":4096},"type":"reencrypt","key_size":1,"mode":"encrypt","direction":"forward","priority":0}},"tokens":{},"segments":{"0":{"type":"linear","offset":"0","size":"dynamic"},"1":{"type":"linear","offset":"0","size":"dynamic","flags":["backup-previous"]},"2":{"type":"crypt","offset":"0","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":[],"segments":["2"],"hash":"sha256","iterations":1000,"salt":"AAAA","digest":"AAAA"}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#).unwrap();
    let vk = [7u8; 64];
    let ok = Metadata::from_json(base.clone()).unwrap();
    assert!(reencrypt_digest_blob(&ok, None, Some(&vk)).is_ok());
    for (ptr, bad) in [
        ("/keyslots/1/area/sector_size", json!("4096")),
        ("/keyslots/1/area/offset", json!(290816)),
        ("/keyslots/1/mode", json!("")),
        ("/keyslots/1/area/hash", json!("x".repeat(65))),
    ] {
        let mut v = base.clone();
        *v.pointer_mut(ptr).unwrap() = bad;
        let md = Metadata::from_json(v).unwrap();
        assert!(
            matches!(
                reencrypt_digest_blob(&md, None, Some(&vk)),
                Err(Error::Corrupt(_))
            ),
            "{ptr}"
        );
    }
    // Segments are typed when read: a mistyped one never reaches the digest.
    let mut v = base.clone();
    v["segments"]["1"]["size"] = json!(5);
    let e = Metadata::from_json(v).unwrap_err();
    assert!(e.contains("segment 1"), "{e}");
    let mut v = base.clone();
    v["segments"]["0"]["flags"] = json!(["in-reencryption"]);
    assert_eq!(state(&Metadata::from_json(v).unwrap()), State::Crash);
    let mut v = base;
    v["config"].as_object_mut().unwrap().remove("requirements");
    let md = Metadata::from_json(v).unwrap();
    assert_eq!(state(&md), State::None);
    assert!(parse(&md).unwrap().is_none());
}

/// States cryptsetup 2.6.1 leaves when cut short while ending (its old keyslot already
/// removed): a decryption and a new key, all converted; the same with a step left, or in flight,
/// are not.
#[test]
fn all_converted_tells_the_end_from_a_step_left() {
    let decrypted: Value = serde_json::from_str(r#"{"keyslots":{"1":{"area":{"offset":"290816","size":"16486400","type":"checksum","hash":"sha256","sector_size":4096},"type":"reencrypt","key_size":1,"mode":"decrypt","direction":"backward","priority":0}},"tokens":{},"segments":{"0":{"type":"linear","offset":"0","size":"dynamic"},"1":{"type":"crypt","offset":"0","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096,"flags":["backup-previous"]},"2":{"type":"linear","offset":"0","size":"dynamic","flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":[],"segments":["1"],"hash":"sha256","iterations":1000,"salt":"gaDCiqdhml/DWmT8O2JwKV8QWrTaVGd+tcbAL0B3BN8=","digest":"Lc83c3Ti0jSCvDDYA5I1rVN0sAlpzEJzTCyt2CtVyaM="},"1":{"type":"pbkdf2","keyslots":["1"],"segments":[],"hash":"sha256","iterations":94160,"salt":"Yt3juP7YcN7O91vAUpUgfUzLo8wSg00jpr4nr+cAvks=","digest":"j2wijsF7nn/XUCmScfd3JRPk8DtKkdbhAmLpLnhHsYU="}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#).unwrap();
    let rekeyed: Value = serde_json::from_str(r#"{"keyslots":{"1":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"290816","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":"vVe4yoSdmPRpnCTDHEHaLaMqrxG0QYFrHI4xMtmIqCU="}},"2":{"area":{"offset":"548864","size":"16228352","type":"checksum","hash":"sha256","sector_size":4096},"type":"reencrypt","key_size":1,"mode":"reencrypt","direction":"forward","priority":0}},"tokens":{},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096},"1":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096,"flags":["backup-previous"]},"2":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096,"flags":["backup-final"]}},"digests":{"0":{"type":"pbkdf2","keyslots":[],"segments":["1"],"hash":"sha256","iterations":1000,"salt":"FXGkkXpJa48f+wfiM+uH8QWov2pRdnkeR3+Axrjcp9Q=","digest":"4yfKeXxCdh1+J0yRC9iFXvOvCKZghjk5JYglR37eUfY="},"1":{"type":"pbkdf2","keyslots":["1"],"segments":["0","2"],"hash":"sha256","iterations":1000,"salt":"xjMx1Wv2D4tZlKPsneZ5sPlEK4oAQ0W9nogntoryMUM=","digest":"noBQRMinSdmP8x/SIJ38rqqUtQqo797IZ1Y72e2S+xA="},"2":{"type":"pbkdf2","keyslots":["2"],"segments":[],"hash":"sha256","iterations":1000,"salt":"0hLULL3YfAfSlPxv/enXdY7DAW7/wv6UndrGNu+iIPE=","digest":"/pvBxkLf4S1gyukrddkivSnRniqbun0GeODieTtINT4="}},"config":{"json_size":"12288","keyslots_size":"16744448","requirements":{"mandatory":["online-reencrypt-v2"]}}}"#).unwrap();
    let converted = |v: &Value| {
        let md = Metadata::from_json(v.clone()).unwrap();
        let r = parse(&md).unwrap().unwrap();
        all_converted(&md, &r)
    };
    assert!(converted(&decrypted));
    assert!(converted(&rekeyed));
    // Ciphertext left at the start of the decryption.
    let mut v = decrypted.clone();
    v["segments"]["0"] = json!({"type":"crypt","offset":"0","size":"1048576","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":4096});
    v["segments"]["3"] = json!({"type":"linear","offset":"1048576","size":"dynamic"});
    v["digests"]["0"]["segments"] = json!(["0", "1"]);
    assert!(!converted(&v));
    // The new key's segment in flight.
    let mut v = rekeyed.clone();
    v["segments"]["0"]["flags"] = json!(["in-reencryption"]);
    assert!(!converted(&v));
    // The data still under the old key.
    let mut v = rekeyed;
    v["digests"]["0"]["segments"] = json!(["0", "1"]);
    v["digests"]["1"]["segments"] = json!(["2"]);
    assert!(!converted(&v));
}
