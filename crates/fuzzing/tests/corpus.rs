//! Every committed fuzz input through its target, on stable, in the test command: the seeds
//! (`fuzz/corpus/TARGET/`, real inputs) and the inputs that once crashed, hung or over-allocated
//! (`fuzz/regressions/TARGET/`, each fixed since). A target must return on each without
//! panicking; each target must have seeds; the cargo-fuzz package must have a binary for each.

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use sectorcrypt_fuzzing::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `dir`, sorted; none if it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a corpus directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_seed_and_regression_input_passes_its_target() {
    let fuzz = fuzz_dir();
    let mut failures = Vec::new();
    for &(name, target) in TARGETS {
        let seeds = inputs(&fuzz.join("corpus").join(name));
        assert!(!seeds.is_empty(), "fuzz/corpus/{name}/ has no seeds");
        let regressions = inputs(&fuzz.join("regressions").join(name));
        for file in seeds.iter().chain(&regressions) {
            let data = fs::read(file).expect("a corpus file reads");
            if catch_unwind(AssertUnwindSafe(|| target(&data))).is_err() {
                failures.push(file.display().to_string());
            }
        }
    }
    assert!(failures.is_empty(), "targets panicked on: {failures:#?}");
}

#[test]
fn corpus_directories_and_fuzz_binaries_match_the_targets() {
    let fuzz = fuzz_dir();
    let names: Vec<&str> = TARGETS.iter().map(|&(n, _)| n).collect();
    for kind in ["corpus", "regressions"] {
        for dir in fs::read_dir(fuzz.join(kind)).into_iter().flatten() {
            let dir = dir.expect("a directory entry").file_name();
            let dir = dir.to_string_lossy();
            assert!(names.contains(&&*dir), "fuzz/{kind}/{dir} is no target's");
        }
    }
    let manifest = fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml reads");
    for name in &names {
        assert!(
            manifest.contains(&format!("name = \"{name}\""))
                && fuzz
                    .join("fuzz_targets")
                    .join(format!("{name}.rs"))
                    .is_file(),
            "fuzz/ has no binary for the target {name}"
        );
    }
}
