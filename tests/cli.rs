//! End-to-end CLI behaviour: init, exit codes, help, version, completions, that every YAML
//! example in the README and the `init` template validates, and `simulate` through the
//! binary (its table, JSON, report, exit codes, and the README's pasted output).

use std::process::Command;

fn tpu_runner(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tpu-runner"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("binary runs")
}

/// `plan` with the documented example fleet on `state` at the example's time, plus `extra`.
fn plan_example(state: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "plan",
        "--fleet",
        "docs/plan-example/deployment.yaml",
        "--state",
        state,
        "--now",
        "2026-01-01T12:00:00Z",
    ];
    args.extend_from_slice(extra);
    tpu_runner(&args, &root())
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
    // Every command a user types has an example (and the job commands their exit codes).
    for command in [
        "init",
        "validate-fleet",
        "validate-jobs",
        "plan",
        "simulate",
        "emulator",
        "state export",
        "state import",
        "submit",
        "status",
        "cancel",
        "set-priority",
        "interrupt-spot",
        "watch",
        "logs",
        "controller",
        "local up",
        "deploy",
        "completions",
    ] {
        let mut args: Vec<&str> = command.split(' ').collect();
        args.push("--help");
        let out = tpu_runner(&args, dir.path());
        assert!(out.status.success(), "{command}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Example"), "{command} --help has no example");
        if ![
            "init",
            "validate-fleet",
            "validate-jobs",
            "plan",
            "simulate",
            "emulator",
            "state export",
            "state import",
            "completions",
        ]
        .contains(&command)
        {
            assert!(
                help.contains("Exit codes:"),
                "{command} --help has no exit codes"
            );
        }
    }
    let version = tpu_runner(&["--version"], dir.path());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!("tpu-runner {}\n", env!("CARGO_PKG_VERSION"))
    );
    let completions = tpu_runner(&["completions", "bash"], dir.path());
    assert!(String::from_utf8_lossy(&completions.stdout).contains("validate-fleet"));
}

/// `validate-jobs --fleet --buckets` reads where the buckets are, as `submit` does, and
/// shows only the entries in their regions (the rule `plan` applies): a job whose only
/// bucket is in us-central2 runs on the TRC v4 there, not on the us-east1 v6e it also
/// accepts. A bucket in a region without an accepted TPU, or missing, fails the command
/// with every such job named.
#[test]
fn validate_jobs_with_buckets_applies_the_region_rule_of_plan() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = root().join("tests/fixtures/jobs/against-fleet");
    std::fs::copy(
        fixtures.join("deployment.yaml"),
        dir.path().join("deployment.yaml"),
    )
    .unwrap();
    let objects = dir.path().join("objects");
    std::fs::create_dir(&objects).unwrap();
    for (bucket, location) in [
        ("b-us-east1", "us-east1"),
        ("b-us-central2", "US-CENTRAL2"),
        ("b-eu", "europe-west4"),
    ] {
        std::fs::create_dir(objects.join(bucket)).unwrap();
        std::fs::write(objects.join(format!("{bucket}.location")), location).unwrap();
    }
    std::fs::write(
        dir.path().join("job.yaml"),
        "jobs:\n  - {id: central-only, tpu: [v6e-16, v4-32], command: x, buckets: [gs://b-us-central2]}\n  - {id: both, tpu: [v6e-16, v4-32], command: x, buckets: [gs://b-us-east1, gs://b-us-central2]}\n",
    )
    .unwrap();
    let row = |out: &str, job: &str| -> String {
        out.lines()
            .find(|l| l.trim_start().starts_with(job))
            .unwrap_or_else(|| panic!("{job} missing: {out}"))
            .split_whitespace()
            .last()
            .unwrap()
            .to_owned()
    };
    let offline = tpu_runner(&["validate-jobs", "--fleet", "deployment.yaml"], dir.path());
    assert!(offline.status.success());
    let offline = String::from_utf8_lossy(&offline.stdout);
    assert_eq!(row(&offline, "central-only"), "east,trc");
    assert!(
        offline.contains("`--buckets` reads the bucket regions"),
        "{offline}"
    );
    let with_buckets = |manifest: &str| {
        tpu_runner(
            &[
                "validate-jobs",
                manifest,
                "--fleet",
                "deployment.yaml",
                "--buckets",
                "--objects",
                "objects",
            ],
            dir.path(),
        )
    };
    let checked = with_buckets("job.yaml");
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let checked = String::from_utf8_lossy(&checked.stdout);
    assert_eq!(row(&checked, "central-only"), "trc");
    assert_eq!(row(&checked, "both"), "east,trc");
    assert!(
        checked.contains("`plan` applies the same rule"),
        "{checked}"
    );
    // Buckets the fleet cannot use: each job named, exit 1.
    std::fs::write(
        dir.path().join("bad.yaml"),
        "jobs:\n  - {id: europe, tpu: any, command: x, buckets: [gs://b-eu]}\n  - {id: nowhere, tpu: any, command: x, buckets: [gs://b-missing]}\n",
    )
    .unwrap();
    let bad = with_buckets("bad.yaml");
    assert_eq!(bad.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains(
            "job europe: none of its buckets is in a region where the fleet has a TPU it accepts"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("job nowhere:"), "{stderr}");
    // --buckets without a fleet is a usage error; the job commands' TPU_RUNNER_OBJECTS in
    // the environment is not.
    let usage = tpu_runner(&["validate-jobs", "--buckets"], dir.path());
    assert_eq!(usage.status.code(), Some(2));
    let in_env = Command::new(env!("CARGO_BIN_EXE_tpu-runner"))
        .args(["validate-jobs", "--fleet", "deployment.yaml"])
        .env("TPU_RUNNER_OBJECTS", &objects)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        in_env.status.success(),
        "{}",
        String::from_utf8_lossy(&in_env.stderr)
    );
}

/// The shipped examples validate against the local stack's fleet.
#[test]
fn examples_validate_against_the_local_fleet() {
    let root = root();
    for job in ["examples/hello/job.yaml", "examples/resume/job.yaml"] {
        let out = tpu_runner(
            &[
                "validate-jobs",
                job,
                "--fleet",
                "examples/local/deployment.yaml",
            ],
            &root,
        );
        assert!(
            out.status.success(),
            "{job}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = tpu_runner(&["validate-fleet", "examples/local/deployment.yaml"], &root);
    assert!(out.status.success());
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
    // Every waiting job's reasons come as codes too.
    assert!(
        report["waiting"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["codes"].as_array().unwrap().len() == w["reasons"].as_array().unwrap().len())
    );
    // --write-state never replaces a file, its own input least of all.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("state.json");
    std::fs::copy(root.join("docs/plan-example/state.json"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    let mut over = args.to_vec();
    let input_text = input.display().to_string();
    over[4] = &input_text;
    over.extend(["--write-state", &input_text]);
    let refused = tpu_runner(&over, root);
    assert_eq!(refused.status.code(), Some(3));
    assert!(
        refused.stdout.is_empty(),
        "nothing planned before the check"
    );
    assert_eq!(std::fs::read(&input).unwrap(), before);
    let after = dir.path().join("after.json");
    let after_text = after.display().to_string();
    over.truncate(over.len() - 2);
    over.extend(["--write-state", &after_text]);
    assert!(tpu_runner(&over, root).status.success());
    assert!(after.exists());
}

/// A state snapshot a person wrote is input: a damaged one (ownership that does not point
/// both ways, a job running on a TPU that does not exist) is refused with every problem at
/// its line and column, on stderr, and nothing is planned (no action printed).
#[test]
fn plan_refuses_a_damaged_state_and_plans_nothing() {
    let out = plan_example("tests/fixtures/plan/damaged-state.json", &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "jobs.finetune-7b.assigned_resource: no TPU record `nope` in `resources`",
        "jobs.eval-sweep.current_attempt: a cancelling job without a current attempt",
        "resources.adopted-trc-v4.owner.job_id: no active job `ghost` in `jobs`",
        "damaged-state.json:1:",
        "nothing was done",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in\n{stderr}"
        );
    }
    assert!(!stderr.contains("invariant"), "{stderr}");
}

/// The corpus of wrong snapshots (`tests/fixtures/plan/invalid`): each is refused with exit
/// 1, its messages on stderr (snapshotted) and nothing on stdout; `state import` refuses
/// the same files.
#[test]
fn wrong_state_snapshots_are_refused_with_their_field_and_position() {
    let root = root();
    insta::glob!("fixtures/plan/invalid/*.json", |path| {
        let file = path.strip_prefix(&root).unwrap().display().to_string();
        let out = plan_example(&file, &[]);
        assert_eq!(out.status.code(), Some(1), "{file}");
        assert!(
            out.stdout.is_empty(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let dir = tempfile::tempdir().unwrap();
        let store = format!("sqlite:{}", dir.path().join("s.db").display());
        let import = tpu_runner(
            &[
                "state",
                "import",
                &file,
                "--store",
                &store,
                "--fleet",
                "docs/plan-example/deployment.yaml",
            ],
            &root,
        );
        assert_eq!(import.status.code(), Some(1), "{file}");
        assert!(
            String::from_utf8_lossy(&import.stderr).contains(&file),
            "{file}"
        );
        insta::assert_snapshot!(stderr);
    });
}

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The JSON records without `wall_s` (the only field that may differ between runs).
fn records_without_wall(path: &std::path::Path) -> Vec<serde_json::Value> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut records = json["records"].as_array().unwrap().clone();
    for r in &mut records {
        r["metrics"].as_object_mut().unwrap().remove("wall_s");
    }
    records
}

#[test]
fn simulate_writes_table_json_and_report_the_same_on_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let run = |threads: &str, json: &str| {
        let json = dir.path().join(json);
        let report = dir.path().join("report");
        let out = tpu_runner(
            &[
                "simulate",
                "scenarios/smoke.yaml",
                "tests/fixtures/scenarios/notice.yaml",
                "--seeds",
                "1..=3",
                "--threads",
                threads,
                "--output",
                json.to_str().unwrap(),
                "--report",
                report.to_str().unwrap(),
            ],
            &root(),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (out, json)
    };
    let (out, one) = run("1", "one.json");
    let (_, two) = run("2", "two.json");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("  SCENARIO "), "{table}");
    assert!(
        table.contains("  smoke ") && table.contains("  notice "),
        "{table}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("simulated s and"), "{stderr}");
    let records = records_without_wall(&one);
    assert_eq!(records.len(), 6);
    assert_eq!(records, records_without_wall(&two));
    let index = std::fs::read_to_string(dir.path().join("report/index.html")).unwrap();
    assert!(index.contains(".svg"));
    // Two policies: drawn on the same axes, compared on the same seeds.
    let out = tpu_runner(
        &[
            "simulate",
            "scenarios/smoke.yaml",
            "--seeds",
            "1..=3",
            "--policy",
            "classic,frugal",
            "--report",
            dir.path().join("two").to_str().unwrap(),
        ],
        &root(),
    );
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("frugal − classic on smoke, 3 seeds paired:"),
        "{table}"
    );
    assert!(table.contains("  verdict: "), "{table}");
    let index = std::fs::read_to_string(dir.path().join("two/index.html")).unwrap();
    for plot in ["smoke-policies-chips.svg", "smoke-policies-queue.svg"] {
        assert!(index.contains(plot), "{plot}");
        let svg = std::fs::read_to_string(dir.path().join("two").join(plot)).unwrap();
        assert!(
            svg.contains("classic") && svg.contains("frugal"),
            "{plot}: both policies"
        );
    }
    assert!(index.contains("95 % confidence intervals"));
}

#[test]
fn simulate_exit_codes() {
    let fixtures = root().join("tests/fixtures/scenarios/invalid");
    let code = |args: &[&str]| tpu_runner(args, &fixtures).status.code();
    assert_eq!(code(&["simulate", "contradictions.yaml"]), Some(1));
    assert_eq!(code(&["simulate", "nothing-here.yaml"]), Some(3));
    assert_eq!(code(&["simulate", "missing-trace.yaml"]), Some(3));
    assert_eq!(
        code(&[
            "simulate",
            "../notice.yaml",
            "--seeds",
            "0..=18446744073709551615"
        ]),
        Some(2)
    );
    assert_eq!(
        code(&["simulate", "../notice.yaml", "--horizon-hours", "nan"]),
        Some(2)
    );
    // Nothing runs twice under another name, and an empty policy list is no list.
    assert_eq!(
        code(&["simulate", "../notice.yaml", "../notice.yaml"]),
        Some(2)
    );
    assert_eq!(
        code(&["simulate", "../notice.yaml", "--policy", "classic,classic"]),
        Some(2)
    );
    assert_eq!(
        code(&["simulate", "../notice.yaml", "--policy", ""]),
        Some(2)
    );
    // A variants file is read as strictly as a scenario: a list, an unknown parameter or a
    // missing file stop the command before anything runs.
    let dir = tempfile::tempdir().unwrap();
    let variants = |text: &str| {
        let path = dir.path().join("variants.yaml");
        std::fs::write(&path, text).unwrap();
        let out = tpu_runner(
            &[
                "simulate",
                "../notice.yaml",
                "--variants",
                path.to_str().unwrap(),
                "--compare",
            ],
            &fixtures,
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, err) = variants("policies: [classic]\n");
    assert_eq!(status, Some(1), "{err}");
    assert!(err.contains("expected a mapping of labels"), "{err}");
    let (status, err) = variants("policies:\n  fast: {name: frugal, race_afterr: 5m}\n");
    assert_eq!(status, Some(1), "{err}");
    assert!(err.contains("did you mean `race_after`?"), "{err}");
    let (status, out) = variants("policies:\n  fast: {name: frugal, race_after: 5m}\n");
    assert_eq!(status, Some(0), "{out}");
    assert_eq!(
        code(&["simulate", "../notice.yaml", "--variants", "absent.yaml"]),
        Some(3)
    );
    // A scenario whose data is missing is left out; the others run and are shown.
    let out = tpu_runner(
        &["simulate", "missing-trace.yaml", "../notice.yaml"],
        &fixtures,
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stdout).contains("  notice "));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--traces"));
}

#[test]
fn readme_shows_what_the_main_command_prints() {
    // Checked everywhere: the default glob needs no data beside the clone.
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let pasted = readme
        .split("```text\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README pastes the main command's output in the first text block");
    let mut files: Vec<String> = std::fs::read_dir(root().join("scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| p.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    files.sort(); // as the shell expands scenarios/*.yaml
    let mut args = vec!["simulate"];
    args.extend(files.iter().map(String::as_str));
    let out = tpu_runner(&args, &root());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every column but the last (`WALL s`); the stderr summary line by its start.
    let columns = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("  "))
            .map(|l| {
                l.trim_end()
                    .rsplit_once("  ")
                    .map_or(l, |(rest, _)| rest)
                    .trim_end()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(
        columns(pasted),
        columns(&String::from_utf8_lossy(&out.stdout))
    );
    let summary = String::from_utf8_lossy(&out.stderr);
    let start = |text: &str| -> Option<String> {
        text.lines()
            .find(|l| l.starts_with("simulated "))
            .and_then(|l| l.split(" in ").next())
            .map(str::to_owned)
    };
    assert_eq!(start(pasted), start(&summary), "{summary}");
}

#[test]
fn state_export_and_import_move_a_state_between_stores() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/plan-example");
    std::fs::copy(
        example.join("deployment.yaml"),
        dir.path().join("deployment.yaml"),
    )
    .unwrap();
    std::fs::copy(example.join("state.json"), dir.path().join("state.json")).unwrap();
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    // Reading a store that does not exist creates nothing and says so.
    let missing = tpu_runner(&["state", "export"], dir.path());
    assert_eq!(missing.status.code(), Some(5), "{}", text(&missing));
    assert!(text(&missing).contains("does not exist"));
    assert!(
        !dir.path().join(".tpu-runner").exists(),
        "a read leaves no file behind"
    );
    // Import into the default store beside the fleet, export, compare.
    let import = tpu_runner(&["state", "import", "state.json"], dir.path());
    assert!(import.status.success(), "{}", text(&import));
    assert!(dir.path().join(".tpu-runner/state.db").is_file());
    let export = tpu_runner(&["state", "export", "--output", "out.json"], dir.path());
    assert!(export.status.success(), "{}", text(&export));
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(name)).unwrap()).unwrap()
    };
    let (before, after) = (read("state.json"), read("out.json"));
    assert_eq!(
        before["jobs"].as_object().unwrap().len(),
        after["jobs"].as_object().unwrap().len()
    );
    assert_eq!(
        before["resources"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        after["resources"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>()
    );
    // The export is a state `plan` reads.
    let plan = tpu_runner(
        &[
            "plan",
            "--state",
            "out.json",
            "--now",
            "2026-01-01T12:00:00Z",
        ],
        dir.path(),
    );
    assert!(plan.status.code() == Some(0), "{}", text(&plan));
    // No flag overwrites a file; a second import is refused and writes nothing.
    let again = tpu_runner(&["state", "export", "--output", "state.json"], dir.path());
    assert_eq!(again.status.code(), Some(3));
    assert!(text(&again).contains("--force"));
    assert_eq!(read("state.json"), before);
    // --force replaces a file only once the export succeeded.
    let failed = tpu_runner(
        &[
            "state",
            "export",
            "--store",
            "sqlite:absent.db",
            "--output",
            "state.json",
            "--force",
        ],
        dir.path(),
    );
    assert_eq!(failed.status.code(), Some(5));
    assert_eq!(
        read("state.json"),
        before,
        "a failed export leaves the old file whole"
    );
    let forced = tpu_runner(
        &["state", "export", "--output", "out.json", "--force"],
        dir.path(),
    );
    assert!(forced.status.success(), "{}", text(&forced));
    assert!(
        std::fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp-"))
    );
    let twice = tpu_runner(&["state", "import", "state.json"], dir.path());
    assert_eq!(twice.status.code(), Some(5));
    assert!(text(&twice).contains("empty store"), "{}", text(&twice));
    // The store comes from --store or TPU_RUNNER_STORE; a bad URL is a usage error.
    let env = Command::new(env!("CARGO_BIN_EXE_tpu-runner"))
        .args(["state", "import", "state.json"])
        .env("TPU_RUNNER_STORE", "sqlite:other.db")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(env.status.success(), "{}", text(&env));
    assert!(dir.path().join("other.db").is_file());
    let bad = tpu_runner(&["state", "export", "--store", "mysql:x"], dir.path());
    assert_eq!(bad.status.code(), Some(2));
    std::fs::write(
        dir.path().join("junk.db"),
        "not a database at all, just text",
    )
    .unwrap();
    let junk = tpu_runner(
        &["state", "export", "--store", "sqlite:junk.db"],
        dir.path(),
    );
    assert_eq!(junk.status.code(), Some(5));
    assert!(
        text(&junk).contains("not an SQLite database"),
        "{}",
        text(&junk)
    );
}

#[test]
fn trace_scenarios_need_the_traces_folder_and_say_where_to_get_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_tpu-runner"))
        .args([
            "simulate",
            "scenarios/traces/preemption-storm.yaml",
            "--horizon-hours",
            "1",
        ])
        .env_remove("TPU_RUNNER_TRACES")
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--traces") && stderr.contains("scenarios/traces/README.md"),
        "{stderr}"
    );
    let traces = root().join("../shared/data");
    if traces.join("spot-traces").is_dir() {
        let out = tpu_runner(
            &[
                "simulate",
                "scenarios/traces/preemption-storm.yaml",
                "--horizon-hours",
                "1",
                "--traces",
                "../shared/data",
            ],
            &root(),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn no_simulate_flag_can_destroy_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let smoke = root().join("scenarios/smoke.yaml");
    let original = std::fs::read_to_string(&smoke).unwrap();
    for name in ["a.yaml", "b.yaml"] {
        std::fs::write(
            dir.path().join(name),
            original.replace("name: smoke", &format!("name: {}", &name[..1])),
        )
        .unwrap();
    }
    let run = |args: &[&str]| tpu_runner(args, dir.path());
    let unchanged = |name: &str| {
        assert_eq!(
            std::fs::read_to_string(dir.path().join(name)).unwrap(),
            original.replace("name: smoke", &format!("name: {}", &name[..1])),
            "{name} was changed"
        )
    };
    // --json is a switch: both files are simulated, neither is written.
    let out = run(&["simulate", "--json", "a.yaml", "b.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["records"].as_array().unwrap().len(), 2);
    unchanged("a.yaml");
    unchanged("b.yaml");
    // --output never names an input, and never replaces a file without --force; both are
    // refused before anything runs (nothing on stdout).
    let out = run(&["simulate", "a.yaml", "--output", "a.yaml", "--force"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    unchanged("a.yaml");
    std::fs::write(dir.path().join("old.json"), "mine").unwrap();
    let out = run(&["simulate", "a.yaml", "--output", "old.json"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty() && String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("old.json")).unwrap(),
        "mine"
    );
    let out = run(&["simulate", "a.yaml", "--output", "/nonexistent/x.json"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty(), "checked before the run");
    let out = run(&["simulate", "a.yaml", "--output", "old.json", "--force"]);
    assert!(out.status.success());
    assert!(
        std::fs::read_to_string(dir.path().join("old.json"))
            .unwrap()
            .contains("records")
    );
    // --report needs a folder, and one that is new, empty or an earlier report.
    for target in ["a.yaml", "/dev/null"] {
        let out = run(&["simulate", "b.yaml", "--report", target]);
        assert_eq!(out.status.code(), Some(3), "{target}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("needs a directory"),
            "{target}"
        );
        assert!(out.stdout.is_empty());
    }
    unchanged("a.yaml");
    std::fs::create_dir(dir.path().join("photos")).unwrap();
    std::fs::write(dir.path().join("photos/cat.svg"), "<svg/>").unwrap();
    let out = run(&["simulate", "b.yaml", "--report", "photos"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        dir.path().join("photos/cat.svg").is_file(),
        "a foreign folder is left alone"
    );
    // A reused report folder keeps no stale plot.
    let out = run(&["simulate", "a.yaml", "--report", "rep"]);
    assert!(out.status.success());
    let plots = |d: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.path().join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".svg"))
            .collect();
        v.sort();
        v
    };
    assert!(plots("rep").iter().all(|p| p.starts_with("a-")));
    let out = run(&["simulate", "b.yaml", "--report", "rep"]);
    assert!(out.status.success());
    let now = plots("rep");
    assert!(
        !now.is_empty() && now.iter().all(|p| p.starts_with("b-")),
        "{now:?}"
    );
}

#[test]
fn hostile_inputs_end_promptly_with_clear_errors() {
    let dir = root().join("tests/fixtures/hostile");
    let big = tempfile::tempdir().unwrap();
    let huge = big.path().join("huge.yaml");
    // A 17 MiB one-line YAML: over the specification limit.
    std::fs::write(&huge, format!("name: {}\n", "a".repeat(17 << 20))).unwrap();
    let huge = huge.display().to_string();
    let cases: [(&[&str], i32, &str); 13] = [
        (
            &["simulate", "fleet-dev-zero.yaml"],
            3,
            "not a regular file",
        ),
        (
            &["simulate", "trace-dev-zero.yaml"],
            3,
            "not a regular file",
        ),
        (&["validate-fleet", "/dev/zero"], 3, "not a regular file"),
        (&["validate-jobs", "/dev/zero"], 3, "not a regular file"),
        (
            &["plan", "--fleet", "/dev/zero", "--state", "/dev/zero"],
            3,
            "not a regular file",
        ),
        (&["validate-fleet", &huge], 3, "larger than 16 MiB"),
        // Every problem of a section, not the first only.
        (
            &["simulate", "chaos-every-error.yaml"],
            1,
            "chaos.crash: expected a probability from 0 to 1, found number `2.0`",
        ),
        (
            &["simulate", "chaos-every-error.yaml"],
            1,
            "chaos.stop_hours: expected hours from 0 to 1000000, found integer `-3`",
        ),
        // A number quoted back as written, not as the float it rounds to.
        (
            &["simulate", "count-u64-max.yaml"],
            1,
            "found number `18446744073709551615`",
        ),
        (
            &["simulate", "zero-timeout.yaml"],
            1,
            "expected a positive duration such as `168h`, `90m` or `3600s` (0 is not one)",
        ),
        // A negative value is a bad value, not a flag to move behind `--`.
        (
            &["simulate", "zero-timeout.yaml", "--seed", "-1"],
            2,
            "invalid value '-1' for '--seed <SEED>'",
        ),
        (
            &["watch", "x", "--interval", "-2"],
            2,
            "--interval must be a positive number",
        ),
        // Arrivals are drawn up to the horizon only.
        (&["simulate", "ten-million-jobs.yaml"], 0, "simulated 24 h"),
    ];
    for (args, code, message) in cases {
        let out = tpu_runner(args, &dir);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// A flood of problems shows the first 50 and counts the rest (100,000 jobs with one typo
/// each printed 700,001 lines); a problem on a very long line shows a window of it, not the
/// line (a 300 KB one-line file was echoed whole).
#[test]
fn floods_of_errors_and_long_lines_are_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mut manifest = String::from("jobs:\n");
    for i in 0..2000 {
        manifest.push_str(&format!(
            "  - {{id: j{i}, tpu: v6e-16, bundle: gs://lab-bucket/bundles/x.tar.gz, command: run, buckets: [gs://lab-bucket], priorty: high}}\n"
        ));
    }
    std::fs::write(dir.path().join("job.yaml"), manifest).unwrap();
    let out = tpu_runner(&["validate-jobs", "job.yaml"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("error: ").count(), 50, "{stderr}");
    assert!(
        stderr.contains("… and 1950 more (the first 50 are shown)"),
        "{stderr}"
    );
    assert!(stderr.contains("job.yaml: 2000 errors found"), "{stderr}");
    assert!(stderr.lines().count() < 500);

    let long = format!(
        "{{jobs: [{{id: a, tpu: v6e-16, bundle: gs://lab-bucket/bundles/x.tar.gz, command: \"{}\", buckets: [gs://lab-bucket], priorty: high}}]}}\n",
        "x".repeat(300_000)
    );
    std::fs::write(dir.path().join("long.yaml"), long).unwrap();
    let out = tpu_runner(&["validate-jobs", "long.yaml"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.len() < 2_000,
        "{} bytes:\n{}",
        stderr.len(),
        &stderr[..500]
    );
    assert!(
        stderr.contains('…') && stderr.contains("priorty"),
        "{stderr}"
    );
}

/// `-` is standard input for the validators (bounded like a file, named `<stdin>`).
#[test]
fn validators_read_standard_input_for_a_dash() {
    use std::io::Write;
    let run = |args: &[&str], input: &[u8]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tpu-runner"))
            .args(args)
            .current_dir(root())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    let fleet = std::fs::read(root().join("docs/plan-example/deployment.yaml")).unwrap();
    let out = run(&["validate-fleet", "-"], &fleet);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("fleet `lab` is valid"));
    let out = run(&["validate-fleet", "-"], b"tpus: 3\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--> <stdin>:1:1"));
    let out = run(&["validate-jobs", "-", "--fleet", "-"], b"");
    assert_eq!(out.status.code(), Some(2));
}

/// Long runs show their progress (simulated time ÷ horizon, elapsed, what is left) on a
/// terminal, here forced with TPU_RUNNER_PROGRESS=1; degenerate runs are flagged under the
/// table; a chaos sweep says every invariant held; `--help` explains the columns and `±`.
#[test]
fn simulate_shows_progress_flags_degenerate_runs_and_explains_its_table() {
    let out = Command::new(env!("CARGO_BIN_EXE_tpu-runner"))
        .args([
            "simulate",
            "scenarios/small-job-backlog.yaml",
            "--threads",
            "1",
            "--max-jobs",
            "1500",
            // Runs of about 0.1 s each: the sweep lasts several of the progress line's
            // half-second ticks on any machine this runs on.
            "--seeds",
            "1..=40",
        ])
        .env("TPU_RUNNER_PROGRESS", "1")
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/40 runs] small-job-backlog · classic · seed ")
            && stderr.contains(" s left"),
        "{stderr}"
    );
    // The table on stdout is untouched by it.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("runs]"));

    let out = tpu_runner(
        &[
            "simulate",
            "tests/fixtures/scenarios/no-capacity.yaml",
            "tests/fixtures/scenarios/api-down.yaml",
        ],
        &root(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("note: no-capacity · classic · seed 1: no capacity was ever allocated while 20 jobs waited"), "{stderr}");
    assert!(
        stderr.contains("note: api-down · classic · seed 1: every one of its"),
        "{stderr}"
    );

    let out = tpu_runner(
        &[
            "simulate",
            "--chaos",
            "--seeds",
            "1..=2",
            "scenarios/smoke.yaml",
        ],
        &root(),
    );
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("chaos: 2 runs with faults injected, every invariant held (")
    );

    let help = tpu_runner(&["simulate", "--help"], &root());
    let help = String::from_utf8_lossy(&help.stdout);
    for column in [
        "JOBS OK/FAIL/LEFT",
        "EFFICIENCY",
        "a ±b",
        "standard deviation",
    ] {
        assert!(help.contains(column), "{column} not explained:\n{help}");
    }
}

/// The observation example of docs/state-schema.md is one `plan --observation` reads.
#[test]
fn the_documented_observation_example_is_read_by_plan() {
    let doc = std::fs::read_to_string(root().join("docs/state-schema.md")).unwrap();
    let section = &doc[doc.find("## Observation").expect("section")..];
    let start = section.find("```json\n").expect("example") + "```json\n".len();
    let example = &section[start..start + section[start..].find("```").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("observation.json");
    std::fs::write(&path, example).unwrap();
    let out = plan_example(
        "docs/plan-example/state.json",
        &["--observation", path.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A snapshot that is valid JSON but that the YAML reader refuses (a surrogate-pair escape,
/// as Python's json.dumps writes one) still gets its problems listed, without positions.
#[test]
fn a_snapshot_the_yaml_reader_refuses_still_gets_its_problems() {
    let text =
        std::fs::read_to_string(root().join("tests/fixtures/plan/invalid/zero-workers.json"))
            .unwrap()
            .replace("python train.py", "python train.py \\ud83d\\ude00");
    assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    std::fs::write(&path, text).unwrap();
    let out = plan_example(path.to_str().unwrap(), &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("resources.lab-east-1-f66e0f01.worker_count: expected at least 1 worker"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("--> {}\n", path.display())),
        "{stderr}"
    );
}

/// The report page answers "which policy is better?" and can be read: how it was made, a
/// comparison of the policies per scenario over the seeds, a table of contents whose links
/// all land, every zone of a nine-zone scenario on the capacity plot, idle chips plotted,
/// chip limits drawn, a viewport for phones and nothing fixed wider than the page.
#[test]
fn the_report_compares_policies_and_keeps_every_zone() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let out = tpu_runner(
        &[
            "simulate",
            "tests/fixtures/scenarios/nine-zones.yaml",
            "scenarios/smoke.yaml",
            "--report",
            report.to_str().unwrap(),
        ],
        &root(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(index.contains("Made by <code>") && index.contains("nine-zones.yaml"));
    assert!(index.contains("Nine zones with one Spot v6e-8 each"));
    assert!(index.contains("<meta name=\"viewport\""));
    assert!(!index.contains("max-width:1000px"));
    // One comparison table per scenario, the policies as rows, over the seeds.
    assert_eq!(index.matches("<table class=\"compare\">").count(), 2);
    assert!(
        index
            .contains("nine-zones — policies side by side, mean ± standard deviation over 2 seeds")
    );
    for policy in ["<tr><th>classic</th>", "<tr><th>frugal</th>"] {
        assert!(index.contains(policy), "{policy}");
    }
    // Every table-of-contents link lands on a section.
    let links: Vec<&str> = index
        .split("<a href=\"#")
        .skip(1)
        .map(|s| &s[..s.find('"').unwrap()])
        .collect();
    assert_eq!(links.len(), 5, "{links:?}");
    for link in links {
        assert!(index.contains(&format!("id=\"{link}\"")), "{link}");
        for plot in ["chips", "queue", "capacity"] {
            assert!(
                report.join(format!("{link}-{plot}.svg")).is_file(),
                "{link}-{plot}"
            );
        }
    }
    let capacity =
        std::fs::read_to_string(report.join("nine-zones-classic-seed1-capacity.svg")).unwrap();
    for zone in [
        "us-east1-d",
        "us-east5-b",
        "europe-west4-a",
        "asia-northeast1-b",
    ] {
        assert!(
            capacity.contains(zone),
            "{zone} missing from the capacity plot"
        );
    }
    // The zone with a chip_limit has its level drawn.
    assert!(
        capacity
            .lines()
            .any(|l| l.trim() == "us-east1-d chip_limit 16"),
        "the chip limit is not drawn"
    );
    let chips = std::fs::read_to_string(report.join("nine-zones-classic-seed1-chips.svg")).unwrap();
    // plotters writes each legend label on a line of its own.
    assert!(
        chips.lines().any(|l| l.trim() == "idle"),
        "idle chips are not plotted"
    );
    // Nine entries of one v6e-8 each: 72 chips, the limited one holding at most its 8.
    assert!(
        chips
            .lines()
            .any(|l| l.trim() == "fleet ceiling: 72 chips under its chip limits"),
        "the fleet's ceiling is not drawn"
    );
}

/// A user's own fleet is simulated in one command, against a default cloud and workload
/// under both policies; the scenario it ran can be kept to edit, and is never written over
/// a file; a fleet file given as a scenario says what to do instead.
#[test]
fn simulate_runs_a_users_own_fleet_and_knows_a_fleet_from_a_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = root().join("docs/plan-example/deployment.yaml");
    let saved = dir.path().join("mine.yaml");
    let out = tpu_runner(
        &[
            "simulate",
            "--fleet",
            fleet.to_str().unwrap(),
            "--save-scenario",
            saved.to_str().unwrap(),
            "--json",
        ],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let policies: std::collections::BTreeSet<&str> = doc["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["classic", "frugal"].into_iter().collect());
    assert!(
        doc["records"][0]["metrics"]["jobs_submitted"]
            .as_u64()
            .unwrap()
            > 0
    );
    // The saved scenario runs on its own, the same.
    let again = tpu_runner(&["simulate", saved.to_str().unwrap(), "--json"], dir.path());
    assert!(again.status.success());
    let hashes = |v: &serde_json::Value| -> Vec<String> {
        v["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["event_hash"].to_string())
            .collect()
    };
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(hashes(&doc), hashes(&again));
    // Never over an existing file.
    let refused = tpu_runner(
        &[
            "simulate",
            "--fleet",
            fleet.to_str().unwrap(),
            "--save-scenario",
            saved.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert_eq!(
        refused.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // A fleet where a scenario is expected.
    let wrong = tpu_runner(&["simulate", fleet.to_str().unwrap()], dir.path());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        err.contains("is a fleet file") && err.contains("simulate --fleet"),
        "{err}"
    );
}

/// A state document past the limit is refused at once, before it is read (a 1 GiB document
/// once took 4.2 GiB to import): by `state import` and `plan --state` alike (issue 34 item 13).
#[test]
fn an_oversized_state_document_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.json");
    // Sparse: no disk used, the size is what counts.
    std::fs::File::create(&big)
        .unwrap()
        .set_len(tpu_runner::files::STATE_LIMIT + 1)
        .unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let fleet = root().join("docs/plan-example/deployment.yaml");
    for args in [
        vec![
            "state",
            "import",
            big.to_str().unwrap(),
            "--store",
            &store,
            "--fleet",
            fleet.to_str().unwrap(),
        ],
        vec![
            "plan",
            "--fleet",
            fleet.to_str().unwrap(),
            "--state",
            big.to_str().unwrap(),
        ],
    ] {
        let started = std::time::Instant::now();
        let out = tpu_runner(&args, dir.path());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains("larger than 512 MiB"), "{args:?}: {err}");
        assert!(
            started.elapsed().as_secs() < 10,
            "{args:?}: refused at once"
        );
    }
    assert!(!dir.path().join("s.db").exists(), "nothing was created");
}

/// The README's comparison of policies (`simulate --variants … --compare`) is what the binary
/// prints, scenario by scenario. Each scenario's table depends only on its own runs, so each
/// runs alone. An unoptimised build checks the two cheapest (the rest take minutes without
/// optimisation); an optimised one checks every scenario, the two replaying spot traces when
/// the traces are beside the checkout (`../shared/data` or `TPU_RUNNER_TRACES`).
#[test]
fn readme_comparison_of_policies_is_what_simulate_compare_prints() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let pasted = readme
        .split("<!-- simulate --compare: begin -->\n")
        .nth(1)
        .and_then(|rest| rest.split("<!-- simulate --compare: end -->").next())
        .expect("the README pastes the comparison between its markers");
    let traces = std::env::var_os("TPU_RUNNER_TRACES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root().join("../shared/data"));
    let traces = traces.join("spot-traces").is_dir().then_some(traces);
    let mut scenarios = vec!["regional-stockout.yaml", "trc-mixed.yaml"];
    if !cfg!(debug_assertions) {
        scenarios.push("philly-replay.yaml");
        if traces.is_some() {
            scenarios.extend([
                "traces/preemption-storm.yaml",
                "traces/spot-stockouts.yaml",
                "traces/spot-or-on-demand.yaml",
            ]);
        }
    }
    for file in scenarios {
        let scenario = format!("scenarios/{file}");
        let mut args = vec![
            "simulate",
            &scenario,
            "--variants",
            "scenarios/policies/comparison.yaml",
            "--seeds",
            "1..=10",
            "--compare",
        ];
        let dir;
        if let Some(t) = &traces {
            dir = t.display().to_string();
            args.extend(["--traces", &dir]);
        }
        let out = tpu_runner(&args, &root());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        let name = printed
            .lines()
            .next()
            .and_then(|l| l.split("**").nth(1))
            .expect("a table per scenario, under its name in bold");
        let shown = pasted
            .split_once(&format!("**{name}**"))
            .map(|(_, rest)| format!("**{name}**{}", rest.split("\n**").next().unwrap()))
            .unwrap_or_else(|| panic!("the README's comparison has no table for {name}"));
        assert_eq!(
            shown.trim_end(),
            printed.trim_end(),
            "the README's comparison of {name} differs from `tpu-runner {}`",
            args.join(" ")
        );
    }
}

/// A store file this user may only read, in a folder they cannot write, is read by the
/// commands that only read (`state export`, `status`): opened read-only, nothing created
/// beside it. A command that writes says the file is read-only (exit 5). Run as a second,
/// unprivileged user where the test runs as root (root may write anything).
#[test]
fn a_read_only_store_file_is_read_and_never_written() {
    use std::os::unix::fs::PermissionsExt;
    let as_other = nix::unistd::Uid::effective().is_root();
    // Where the second user can reach it (the test's own temporary folder may be private).
    let dir = if as_other {
        tempfile::Builder::new()
            .prefix("tpu-runner-ro-")
            .tempdir_in("/tmp")
            .unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let folder = dir.path().join("shared");
    std::fs::create_dir(&folder).unwrap();
    let db = folder.join("state.db");
    let store = format!("sqlite:{}", db.display());
    let fleet = root().join("docs/plan-example/deployment.yaml");
    let fleet = fleet.to_str().unwrap();
    let imported = tpu_runner(
        &[
            "state",
            "import",
            "docs/plan-example/state.json",
            "--store",
            &store,
            "--fleet",
            fleet,
        ],
        &root(),
    );
    assert!(imported.status.success(), "{imported:?}");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o555)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |args: &[&str]| {
        let mut c = if as_other {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(env!("CARGO_BIN_EXE_tpu-runner"))
                .env("TMPDIR", "/tmp");
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_tpu-runner"))
        };
        c.args(args).current_dir(&folder).output().unwrap()
    };
    let export = run(&["state", "export", "--store", &store]);
    assert!(export.status.success(), "{export:?}");
    let state: serde_json::Value = serde_json::from_slice(&export.stdout).unwrap();
    let id = state["jobs"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let status = run(&["status", "--store", &store, "--fleet", fleet]);
    assert!(status.status.success(), "{status:?}");
    let cancel = run(&["cancel", &id, "--store", &store, "--fleet", fleet]);
    assert_eq!(cancel.status.code(), Some(5), "{cancel:?}");
    assert!(
        String::from_utf8_lossy(&cancel.stderr).contains("readonly database"),
        "{cancel:?}"
    );
    let beside: Vec<_> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside, ["state.db"], "files were made beside the store");
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
}
