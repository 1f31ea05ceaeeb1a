//! The fixture corpus: every file under `tests/fixtures/{fleet,jobs}/{valid,invalid}` is run
//! through the real binary; valid files must exit 0 and their JSON is snapshotted, invalid
//! files must exit 1 and their error report is snapshotted. Update with `cargo insta review`
//! (or `INSTA_UPDATE=always cargo test`).

use std::path::Path;
use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tpu-runner"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs");
    (
        out.status.code().expect("exited normally, not by a signal"),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

fn relative(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap()
        .display()
        .to_string()
}

#[test]
fn valid_fleets() {
    insta::glob!("fixtures/fleet/valid/*.yaml", |path| {
        let (code, stdout, stderr) = run(&["validate-fleet", "--json", &relative(path)]);
        assert_eq!(code, 0, "{stderr}");
        insta::assert_snapshot!(stdout);
    });
}

#[test]
fn invalid_fleets() {
    insta::glob!("fixtures/fleet/invalid/*.yaml", |path| {
        let (code, stdout, stderr) = run(&["validate-fleet", &relative(path)]);
        assert_eq!(
            code,
            1,
            "expected exit 1 (invalid) for {}\n{stderr}",
            path.display()
        );
        assert!(stdout.is_empty());
        assert!(!stderr.contains("panicked"));
        insta::assert_snapshot!(stderr);
    });
}

#[test]
fn valid_jobs() {
    insta::glob!("fixtures/jobs/valid/*.yaml", |path| {
        let (code, stdout, stderr) = run(&["validate-jobs", "--json", &relative(path)]);
        assert_eq!(code, 0, "{stderr}");
        insta::assert_snapshot!(stdout);
    });
}

#[test]
fn invalid_jobs() {
    insta::glob!("fixtures/jobs/invalid/*.yaml", |path| {
        let (code, stdout, stderr) = run(&["validate-jobs", &relative(path)]);
        assert_eq!(
            code,
            1,
            "expected exit 1 (invalid) for {}\n{stderr}",
            path.display()
        );
        assert!(stdout.is_empty());
        insta::assert_snapshot!(stderr);
    });
}

#[test]
fn jobs_checked_against_a_fleet() {
    let fleet = "tests/fixtures/jobs/against-fleet/deployment.yaml";
    let (code, stdout, stderr) = run(&[
        "validate-jobs",
        "tests/fixtures/jobs/against-fleet/valid.yaml",
        "--fleet",
        fleet,
    ]);
    assert_eq!(code, 0, "{stderr}");
    insta::assert_snapshot!("against_fleet_valid", stdout);
    let (code, _, stderr) = run(&[
        "validate-jobs",
        "tests/fixtures/jobs/against-fleet/invalid.yaml",
        "--fleet",
        fleet,
    ]);
    assert_eq!(code, 1);
    insta::assert_snapshot!("against_fleet_invalid", stderr);
}
