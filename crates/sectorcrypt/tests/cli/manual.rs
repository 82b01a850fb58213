//! The manual as a user meets it: man pages and shell completions generated from the command
//! line's own definitions (every command present, each page rendered by man(1) without a
//! warning), examples in every command's help, and the Ceph options only where a device is taken.

use std::process::Command;

use crate::common::{ok, p, run, sc, scratch};

/// The commands `sectorcrypt [FAMILY] --help` lists (without `help`).
fn commands(family: &[&str]) -> Vec<String> {
    let out = ok(sc(&[family, &["--help"]].concat()), "--help");
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// Every command and every command of a family: its path as words.
fn every_command() -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for c in commands(&[]) {
        let subs = commands(&[&c]);
        all.push(vec![c.clone()]);
        for s in subs {
            all.push(vec![c.clone(), s]);
        }
    }
    all
}

/// `text` without man's overstriking (bold as "X\x08X", underline as "_\x08X").
fn plain(text: &str) -> String {
    let mut out: Vec<char> = Vec::new();
    for c in text.chars() {
        if c == '\x08' {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out.into_iter().collect()
}

#[test]
fn man_pages_cover_every_command_and_render_without_warnings() {
    let dir = scratch("manual-man");
    ok(sc(&["generate", "man", p(&dir)]), "generate man");
    let all = every_command();
    assert!(all.len() > 40, "{all:?}");
    for path in std::iter::once(vec![]).chain(all) {
        let name = std::iter::once("sectorcrypt".to_string())
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join("-");
        let page = dir.join(format!("{name}.8"));
        assert!(page.is_file(), "no page {}", page.display());
        let out = run(Command::new("man")
            .args(["--warnings", "-l"])
            .arg(&page)
            .env("MANWIDTH", "80")
            .env("MAN_KEEP_FORMATTING", "0"));
        let text = plain(&String::from_utf8_lossy(&out.stdout));
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && warnings.trim().is_empty(),
            "{name}: {warnings}"
        );
        assert!(
            text.contains("NAME") && text.contains(&name),
            "{name}: {text}"
        );
        if path.len() == 1 {
            assert!(text.contains("Examples:"), "{name} has examples: {text}");
        }
    }
}

#[test]
fn completions_know_every_command_and_bash_parses_its_own() {
    let dir = scratch("manual-completions");
    ok(
        sc(&["generate", "completions", p(&dir)]),
        "generate completions",
    );
    for file in ["sectorcrypt.bash", "_sectorcrypt", "sectorcrypt.fish"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for path in every_command() {
            let last = path.last().unwrap();
            assert!(text.contains(last.as_str()), "{file} lacks {path:?}");
        }
        assert!(text.contains("disable-locks"), "{file}");
    }
    ok(
        run(Command::new("bash")
            .arg("-n")
            .arg(dir.join("sectorcrypt.bash"))),
        "bash -n",
    );
}

#[test]
fn every_command_has_examples_and_ceph_options_only_where_a_device_is_taken() {
    for c in commands(&[]) {
        let out = ok(sc(&[&c, "--help"]), "--help");
        let text = String::from_utf8_lossy(&out.stdout);
        let examples = text
            .lines()
            .skip_while(|l| *l != "Examples:")
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .count();
        assert!(
            (2..=4).contains(&examples),
            "{c}: {examples} examples: {text}"
        );
        let ceph = text.contains("--ceph-conf");
        // Families (flash, kpio, token, generate) list commands; the commands take the device.
        let takes_device = commands(&[&c]).is_empty();
        assert_eq!(ceph, takes_device, "{c}: {text}");
        assert!(!text.contains("  \n"), "{c}: trailing blanks");
    }
    for family in ["kpio", "flash", "token", "generate"] {
        for s in commands(&[family]) {
            let out = ok(sc(&[family, &s, "--help"]), "--help");
            let text = String::from_utf8_lossy(&out.stdout);
            let expected = family == "token" || (family == "kpio" && s == "serve");
            assert_eq!(text.contains("--ceph-conf"), expected, "{family} {s}");
        }
    }
}

/// The repository's Markdown files: README.md, CONTRIBUTING.md and everything under docs/.
fn markdown_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    walk(&root.join("docs"), &mut files);
    files
}

/// Every relative link of the documentation names a file that exists inside the repository, and
/// nothing points outside it (no `../shared/...` a reader of the repository does not have).
#[test]
fn documentation_links_stay_inside_the_repository_and_resolve() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let files = markdown_files(&root);
    assert!(files.len() > 10, "{files:?}");
    let mut checked = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains("../shared"),
            "{} points outside the repository",
            file.display()
        );
        // Markdown links and images: "](target)" or "](target#anchor)".
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = rest[..end].split('#').next().unwrap().trim();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let path = file.parent().unwrap().join(target);
            let resolved = path.canonicalize().unwrap_or_else(|e| {
                panic!("{}: link to {target}: {e}", file.display());
            });
            assert!(
                resolved.starts_with(&root),
                "{}: {target} is outside the repository",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} links found");
}
