//! Which SIMD backends this machine runs, as cfgs for the tests (`cpu_aesni`, `cpu_vaes256`,
//! `cpu_vaes512`, `cpu_avx2`, `cpu_avx512f`, `cpu_avx512bw`, `cpu_avx512vbmi`): a backend's tests are `#[ignore]`d with the reason
//! where the CPU lacks its features, so that a test run says what it skipped instead of passing
//! tests that did not run. The library itself detects features at run time and uses no cfg.
//!
//! The build machine is the test machine (`cargo test`); `/proc/cpuinfo` changes with every boot,
//! so a build moved to another machine is redone.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=/proc/cpuinfo");
    let backends: [(&str, &[&str]); 7] = [
        ("cpu_aesni", &["aes", "sse4.1"]),
        (
            "cpu_vaes256",
            &["vaes", "vpclmulqdq", "avx2", "aes", "sse4.1"],
        ),
        (
            "cpu_vaes512",
            &[
                "vaes",
                "vpclmulqdq",
                "avx512f",
                "avx512bw",
                "avx512vl",
                "aes",
            ],
        ),
        ("cpu_avx2", &["avx2"]),
        ("cpu_avx512f", &["avx512f"]),
        ("cpu_avx512bw", &["avx512f", "avx512bw"]),
        ("cpu_avx512vbmi", &["avx512f", "avx512bw", "avx512vbmi"]),
    ];
    for (cfg, features) in backends {
        println!("cargo:rustc-check-cfg=cfg({cfg})");
        if features.iter().all(|f| has(f)) {
            println!("cargo:rustc-cfg={cfg}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has(feature: &str) -> bool {
    match feature {
        "aes" => std::is_x86_feature_detected!("aes"),
        "sse4.1" => std::is_x86_feature_detected!("sse4.1"),
        "avx2" => std::is_x86_feature_detected!("avx2"),
        "vaes" => std::is_x86_feature_detected!("vaes"),
        "vpclmulqdq" => std::is_x86_feature_detected!("vpclmulqdq"),
        "avx512f" => std::is_x86_feature_detected!("avx512f"),
        "avx512bw" => std::is_x86_feature_detected!("avx512bw"),
        "avx512vl" => std::is_x86_feature_detected!("avx512vl"),
        "avx512vbmi" => std::is_x86_feature_detected!("avx512vbmi"),
        _ => false,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn has(_: &str) -> bool {
    false
}
