//! Every cipher and hash a cryptsetup user may have, against the real cryptsetup 2.6 wherever its
//! crypto backend here (OpenSSL, with no kernel crypto API in these sandboxes) has them: volumes
//! whose keyslots use other PBKDF2/AF hashes and ciphers open both ways with the same volume key,
//! and data that cryptsetup's offline `reencrypt` encrypted with other ciphers and IV generators
//! decrypts here byte for byte, and the other way round. The ciphers that only the kernel offers
//! to cryptsetup (Serpent, Twofish, XTS over Camellia, ...) are checked against Crypto++ in the
//! cipher crate's tests.

use crate::common::{cryptsetup_volume_key, cs, ok, our_volume_key, p, sc, scratch, FAST_PBKDF};
use sectorcrypt_testkit::pattern;

#[test]
fn luks_hashes_and_keyslot_ciphers_open_both_ways_with_cryptsetup() {
    let dir = scratch("ciphers_cli-hashes");
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let mut cases: Vec<(&str, &str, &str)> = Vec::new();
    for hash in [
        "sha224",
        "sha384",
        "sha3-256",
        "sha3-512",
        "ripemd160",
        "whirlpool",
        "sm3",
        "blake2b-512",
        "blake2s-256",
    ] {
        cases.push(("luks1", hash, "aes-xts-plain64"));
        cases.push(("luks2", hash, "aes-xts-plain64"));
    }
    // LUKS1 keyslots are encrypted with the data cipher.
    cases.push(("luks1", "whirlpool", "camellia-cbc-essiv:sha256"));
    cases.push(("luks1", "sha256", "aes-cbc-eboiv"));
    cases.push(("luks2", "sm3", "camellia-cbc-essiv:sm3"));
    for (i, (kind, hash, cipher)) in cases.into_iter().enumerate() {
        let what = format!("{kind} --hash {hash} --cipher {cipher}");
        let key_size = if cipher.contains("xts") { "512" } else { "256" };
        let args = |img: &std::path::Path| -> Vec<String> {
            let mut a: Vec<String> = ["luksFormat", "-q", "--type", kind, "--hash", hash]
                .iter()
                .chain(["--cipher", cipher, "--key-size", key_size].iter())
                .chain(FAST_PBKDF.iter())
                .map(|s| s.to_string())
                .collect();
            a.extend(["--key-file".into(), p(&key).into(), p(img).into()]);
            a
        };
        // Made by cryptsetup, opened here.
        let theirs = dir.join(format!("theirs-{i}.img"));
        std::fs::File::create(&theirs)
            .unwrap()
            .set_len(20 << 20)
            .unwrap();
        let a = args(&theirs);
        ok(cs(&a.iter().map(String::as_str).collect::<Vec<_>>()), &what);
        assert_eq!(
            our_volume_key(&theirs, &key),
            cryptsetup_volume_key(&theirs, &key),
            "{what}: made by cryptsetup"
        );
        // Made here, opened by cryptsetup.
        let ours = dir.join(format!("ours-{i}.img"));
        std::fs::File::create(&ours)
            .unwrap()
            .set_len(20 << 20)
            .unwrap();
        let a = args(&ours);
        ok(sc(&a.iter().map(String::as_str).collect::<Vec<_>>()), &what);
        let dump = String::from_utf8(ok(cs(&["luksDump", p(&ours)]), &what).stdout).unwrap();
        assert!(
            dump.contains(hash),
            "{what}: cryptsetup's dump names the hash:\n{dump}"
        );
        assert_eq!(
            cryptsetup_volume_key(&ours, &key),
            our_volume_key(&ours, &key),
            "{what}: made by sectorcrypt"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn data_encrypted_by_cryptsetup_with_other_ciphers_decrypts_here_and_back() {
    let dir = scratch("ciphers_cli-data");
    let key = dir.join("pass");
    std::fs::write(&key, "passphrase").unwrap();
    let data = dir.join("data.img");
    let cases = [
        ("camellia-cbc-essiv:sm3", "256", "4096"),
        ("camellia-ecb", "128", "512"),
        ("aes-cbc-eboiv", "256", "4096"),
        ("aes-cbc-eboiv", "128", "512"),
        ("aes-cbc-benbi", "192", "512"),
        ("aes-xts-benbi", "512", "4096"),
        ("aes-cbc-null", "256", "512"),
        ("aes-cbc-essiv:sha3-256", "256", "1024"),
    ];
    for (i, (cipher, key_size, sector_size)) in cases.into_iter().enumerate() {
        let what = format!("{cipher} {key_size} bits, {sector_size}-byte sectors");
        let plain = pattern(2 << 20, i as u64);
        std::fs::write(&data, &plain).unwrap();
        let conversion = |verb: &str, hdr: &std::path::Path| -> Vec<String> {
            let mut a: Vec<String> = vec!["--header".into(), p(hdr).into()];
            if verb == "--encrypt" || verb == "encrypt" {
                a.extend(
                    ["--cipher", cipher, "--key-size", key_size]
                        .iter()
                        .chain(["--sector-size", sector_size].iter())
                        .chain(FAST_PBKDF.iter())
                        .map(|s| s.to_string()),
                );
            }
            a.extend(["--key-file".into(), p(&key).into(), p(&data).into()]);
            a
        };
        let run_cs = |verb: &str, hdr: &std::path::Path| {
            let mut a: Vec<String> = vec!["reencrypt".into(), verb.into(), "--type".into()];
            a.push("luks2".into());
            a.extend(["--force-offline-reencrypt".into(), "--batch-mode".into()]);
            a.extend(conversion(verb, hdr));
            if verb == "--decrypt" {
                a.retain(|s| s != "--type" && s != "luks2");
            }
            ok(cs(&a.iter().map(String::as_str).collect::<Vec<_>>()), &what);
        };
        let run_sc = |verb: &str, hdr: &std::path::Path| {
            let mut a: Vec<String> = vec![verb.into(), "-q".into()];
            a.extend(conversion(verb, hdr));
            ok(sc(&a.iter().map(String::as_str).collect::<Vec<_>>()), &what);
        };
        // cryptsetup encrypts, sectorcrypt decrypts.
        let hdr = dir.join(format!("cs-{i}.hdr"));
        run_cs("--encrypt", &hdr);
        assert!(
            std::fs::read(&data).unwrap() != plain,
            "{what}: not encrypted"
        );
        run_sc("decrypt", &hdr);
        assert!(
            std::fs::read(&data).unwrap() == plain,
            "{what}: our decryption differs"
        );
        // sectorcrypt encrypts, cryptsetup decrypts.
        let hdr = dir.join(format!("sc-{i}.hdr"));
        run_sc("encrypt", &hdr);
        assert!(
            std::fs::read(&data).unwrap() != plain,
            "{what}: not encrypted here"
        );
        run_cs("--decrypt", &hdr);
        assert!(
            std::fs::read(&data).unwrap() == plain,
            "{what}: cryptsetup's decryption differs"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
