//! Code invariants checked as tests: the engine and the specs stay pure (no clock, no IO, no
//! unseeded randomness, no async runtime, HTTP client or storage), every module states its
//! purpose in a `//!` line, the simulator crate knows nothing of the engine, the crate's
//! top-level modules depend on each other without a circle (`crate::` paths in code), and no
//! file of `src/` or `sim/src/` outgrows a reader.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    if dir.is_file() {
        return vec![dir.to_path_buf()];
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn engine_and_spec_are_pure() {
    let forbidden = [
        "Instant::now",
        "SystemTime::now",
        "Timestamp::now",
        "Zoned::now",
        "thread_rng",
        "rand::rng(",
        "OsRng",
        "tokio",
        "reqwest",
        "rusqlite",
        "std::fs",
        "std::net",
        "std::process",
        "std::env",
        "println!",
        "eprintln!",
    ];
    assert_absent(&["src/engine", "src/spec"], &forbidden, "a pure module");
}

#[test]
fn the_simulated_world_has_no_wall_clock_and_no_unseeded_randomness() {
    let forbidden = [
        "Instant::now",
        "SystemTime::now",
        "thread_rng",
        "rand::rng(",
        "OsRng",
        "from_entropy",
        "tokio",
        "std::thread",
    ];
    assert_absent(&["sim/src"], &forbidden, "the simulator");
}

/// The code the production controller and commands run on.
const PRODUCTION: &[&str] = &[
    "src/backend",
    "src/gcp",
    "src/store",
    "src/engine",
    "src/spec",
    "src/driver.rs",
    "src/controller.rs",
    "src/submit",
    "src/worker",
    "src/objects.rs",
];

#[test]
fn production_code_never_uses_the_emulator() {
    // The emulator serves the simulated world to tests, the harness and the `emulator`
    // command; the backends, clients, store and driver must work without it.
    assert_absent(
        PRODUCTION,
        &["emulator::", "crate::emulator"],
        "production code",
    );
}

#[test]
fn only_the_binary_knows_the_cli() {
    // The library's modules lean on each other, never on the commands that print: a table
    // or a parser the simulator needs lives below the CLI.
    let library: Vec<&str> = PRODUCTION
        .iter()
        .copied()
        .chain([
            "src/simulate",
            "src/deploy",
            "src/emulator",
            "src/table.rs",
            "src/files.rs",
        ])
        .collect();
    assert_absent(
        &library,
        &["crate::cli", "cli::"],
        "the library below the CLI",
    );
    // Nor does the simulator lean on the production loop.
    assert_absent(&["src/simulate"], &["crate::controller"], "the simulator");
}

/// Fails on the first code line (comments excluded) under `dirs` that contains a forbidden word.
fn assert_absent(dirs: &[&str], forbidden: &[&str], place: &str) {
    for dir in dirs {
        for file in rust_files(&root().join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for word in forbidden {
                    assert!(
                        !code.contains(word),
                        "{}:{}: `{word}` is not allowed in {place}:\n{line}",
                        file.display(),
                        n + 1
                    );
                }
            }
        }
    }
}

#[test]
fn every_module_says_what_it_is_for() {
    for dir in ["src", "sim/src"] {
        for file in rust_files(&root().join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                text.trim_start().starts_with("//!"),
                "{} does not open with a `//!` line",
                file.display()
            );
        }
    }
}

#[test]
fn the_simulator_does_not_know_the_engine() {
    for file in rust_files(&root().join("sim/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains("tpu_runner::"),
            "{} uses the engine",
            file.display()
        );
    }
    let manifest = std::fs::read_to_string(root().join("sim/Cargo.toml")).unwrap();
    assert!(
        !manifest.contains("tpu-runner ="),
        "sim must not depend on the main crate"
    );
}

/// The code of a source file without comments and without its unit-test module (`#[cfg(test)]`
/// followed by `mod`; tests may reach across modules).
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        code.push_str(line.split("//").next().unwrap_or(""));
        code.push('\n');
    }
    code
}

#[test]
fn top_level_modules_depend_without_a_circle() {
    use std::collections::{BTreeMap, BTreeSet};
    let src = root().join("src");
    // Each top-level module (`src/x.rs` or `src/x/`) and the modules its code names as
    // `crate::y`.
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel.iter().next().unwrap().to_str().unwrap();
        let module = first.trim_end_matches(".rs").to_owned();
        if module == "main" || module == "lib" {
            continue;
        }
        let code = code_of(&file);
        let named = deps.entry(module.clone()).or_default();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let target = &rest[..end];
            assert!(
                !target.is_empty(),
                "{}: `crate::{{` imports are not read here",
                file.display()
            );
            if target != module {
                named.insert(target.to_owned());
            }
        }
    }
    // Depth-first search for a path that comes back to where it started.
    fn visit(
        m: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(i) = path.iter().position(|p| p == m) {
            panic!("import circle: {} → {m}", path[i..].join(" → "));
        }
        if done.contains(m) {
            return;
        }
        path.push(m.to_owned());
        for next in deps.get(m).into_iter().flatten() {
            if deps.contains_key(next) {
                visit(next, deps, path, done);
            }
        }
        path.pop();
        done.insert(m.to_owned());
    }
    let mut done = BTreeSet::new();
    for m in deps.keys() {
        visit(m, &deps, &mut Vec::new(), &mut done);
    }
}

/// Split a file before a reader can no longer hold it.
const MAX_LINES: usize = 1_600;

#[test]
fn no_source_file_outgrows_a_reader() {
    for dir in ["src", "sim/src"] {
        for file in rust_files(&root().join(dir)) {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            assert!(
                lines <= MAX_LINES,
                "{} has {lines} lines (at most {MAX_LINES}): split it by what its parts do",
                file.display()
            );
        }
    }
}
