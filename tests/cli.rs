//! End-to-end CLI behaviour: init, exit codes, help, version, completions, and that every
//! YAML example in the README and the `init` template validates.

use std::process::Command;

fn tpu_runner(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tpu-runner"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("binary runs")
}

#[test]
fn init_writes_a_valid_example_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let out = tpu_runner(&["init"], dir.path());
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "wrote deployment.yaml\n"
    );
    let validate = tpu_runner(&["validate-fleet"], dir.path());
    assert!(
        validate.status.success(),
        "{}",
        String::from_utf8_lossy(&validate.stderr)
    );

    std::fs::write(dir.path().join("deployment.yaml"), "mine").unwrap();
    let again = tpu_runner(&["init"], dir.path());
    assert_eq!(again.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&again.stderr).contains("never overwrites"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("deployment.yaml")).unwrap(),
        "mine"
    );
}

#[test]
fn missing_file_is_an_io_error_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let out = tpu_runner(&["validate-fleet"], dir.path());
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read `deployment.yaml`") && stderr.contains("tpu-runner init"),
        "{stderr}"
    );
}

#[test]
fn non_utf8_file_is_rejected_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("job.yaml"), b"jobs:\n  - \xff\xfe\n").unwrap();
    let out = tpu_runner(&["validate-jobs"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not UTF-8"));
}

#[test]
fn usage_errors_exit_2_and_help_has_examples() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        tpu_runner(&["no-such-command"], dir.path()).status.code(),
        Some(2)
    );
    for command in [
        "init",
        "validate-fleet",
        "validate-jobs",
        "plan",
        "completions",
    ] {
        let out = tpu_runner(&[command, "--help"], dir.path());
        assert!(out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Example:"),
            "{command} --help has no example"
        );
    }
    let version = tpu_runner(&["--version"], dir.path());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!("tpu-runner {}\n", env!("CARGO_PKG_VERSION"))
    );
    let completions = tpu_runner(&["completions", "bash"], dir.path());
    assert!(String::from_utf8_lossy(&completions.stdout).contains("validate-fleet"));
}

/// Every ```yaml block of the README is a fleet (has `tpus:`), a job manifest (`jobs:`) or a
/// scenario, and must validate. Job manifests are checked against the README's fleet.
#[test]
fn readme_examples_validate() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let blocks: Vec<&str> = readme
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert!(
        blocks.len() >= 2,
        "the README should show a fleet and a job manifest"
    );
    let dir = tempfile::tempdir().unwrap();
    let fleet = blocks
        .iter()
        .find(|b| b.contains("\ntpus:"))
        .expect("a fleet example");
    std::fs::write(dir.path().join("deployment.yaml"), fleet).unwrap();
    let mut checked = 0;
    for (i, block) in blocks.iter().enumerate() {
        let name = format!("example-{i}.yaml");
        std::fs::write(dir.path().join(&name), block).unwrap();
        let out = if block.starts_with("jobs:") || block.contains("\njobs:") {
            tpu_runner(
                &["validate-jobs", &name, "--fleet", "deployment.yaml"],
                dir.path(),
            )
        } else if block.contains("\ntpus:") {
            tpu_runner(&["validate-fleet", &name], dir.path())
        } else {
            continue;
        };
        assert!(
            out.status.success(),
            "README example {i} is invalid:\n{block}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 2);
}

#[test]
fn plan_on_the_documented_example() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let args = [
        "plan",
        "--fleet",
        "docs/plan-example/deployment.yaml",
        "--state",
        "docs/plan-example/state.json",
        "--now",
        "2026-01-01T12:00:00Z",
    ];
    let out = tpu_runner(&args, root);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    insta::assert_snapshot!("plan_example", String::from_utf8_lossy(&out.stdout));
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = tpu_runner(&json_args, root);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["schema_version"], 1);
    assert_eq!(report["waiting"].as_array().unwrap().len(), 2);
    let bad = tpu_runner(
        &[
            "plan",
            "--fleet",
            "docs/plan-example/deployment.yaml",
            "--state",
            "Cargo.toml",
        ],
        root,
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("Cargo.toml:1:"));
}

/// A damaged state (ownership that does not point both ways) is reported and repaired, never
/// a panic: the TPU is released, the running job requeued, the cancelling one deactivated.
#[test]
fn plan_repairs_and_reports_a_damaged_state() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let args = [
        "plan",
        "--fleet",
        "docs/plan-example/deployment.yaml",
        "--state",
        "tests/fixtures/plan/damaged-state.json",
        "--now",
        "2026-01-01T12:00:00Z",
    ];
    let out = tpu_runner(&args, root);
    assert_eq!(out.status.code(), Some(1), "violations exit 1");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "TPU adopted-trc-v4 was owned by ghost/a which does not run on it; released",
        "running job finetune-7b had no TPU owning it; requeued",
        "cancelling job eval-sweep had no TPU owning it; deactivated",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in\n{stdout}"
        );
    }
}
