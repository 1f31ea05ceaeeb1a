//! A researcher's day on the local stack, from a project folder outside the clone: submit
//! the same manifest twice (two runs), watch by name (every state change with its time, why
//! it waits, an interruption and the requeue), follow the logs, look at the queue and the
//! history, cancel by name; and what each command says when it cannot go on (the stack
//! stopped, a typo, a missing manifest). Real processes: `local up`, its emulator, its
//! controller and its worker agents.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tpu-runner");

/// A `local up` in its own state folder, and a project folder elsewhere.
struct Day {
    _tmp: tempfile::TempDir,
    home: PathBuf,
    project: PathBuf,
    stack: Option<Child>,
}

impl Day {
    fn new() -> Day {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("state");
        let project = tmp.path().join("my-project");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(
            project.join("job.yaml"),
            "jobs:\n  - name: train\n    tpu: v6e-8\n    command: bash train.sh\n    buckets: [gs://local-stack-us-east1, gs://local-stack-us-central1]\n",
        )
        .unwrap();
        std::fs::write(
            project.join("train.sh"),
            "echo \"lr=${LR:-none}\"\nfor i in $(seq 1 ${STEPS:-3}); do echo \"step $i\"; sleep 0.2; done\n",
        )
        .unwrap();
        Day {
            _tmp: tmp,
            home,
            project,
            stack: None,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(&self.project)
            .env("TPU_RUNNER_HOME", &self.home)
            .env_remove("TPU_RUNNER_DEPLOYMENT")
            .env_remove("TPU_RUNNER_STORE")
            .env_remove("TPU_RUNNER_TPU_ENDPOINT")
            .env_remove("TPU_RUNNER_OBJECTS");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn up(&mut self) {
        let mut child = self
            .command(&["local", "up", "--speed", "50", "--interval", "0.5"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Up once it says where it registered.
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut said = String::new();
        let until = Instant::now() + Duration::from_secs(60);
        while !said.contains("registered in") {
            assert!(Instant::now() < until, "local up said: {said}");
            let mut line = String::new();
            if err.read_line(&mut line).unwrap() == 0 {
                panic!("local up ended: {said}");
            }
            said.push_str(&line);
        }
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        self.stack = Some(child);
    }

    fn down(&mut self) {
        if let Some(mut child) = self.stack.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGINT,
            );
            let _ = child.wait();
        }
    }

    fn submit(&self, extra: &[&str]) -> String {
        let mut args = vec!["submit", "--json"];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let first: Value = serde_json::from_str(text(&out.stdout).lines().next().unwrap()).unwrap();
        first["job_id"].as_str().unwrap().to_owned()
    }

    fn status(&self, extra: &[&str]) -> Value {
        let mut args = vec!["status", "--json"];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The local stack's TPU API emulator (its registry says where).
    fn tpu_endpoint(&self) -> String {
        let registry: Value =
            serde_json::from_slice(&std::fs::read(self.home.join("local-stack.json")).unwrap())
                .unwrap();
        registry["tpu_endpoint"].as_str().unwrap().to_owned()
    }

    fn wait_for(&self, what: &str, mut done: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(120);
        while !done() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Day {
    fn drop(&mut self) {
        self.down();
        tpu_runner::worker::transport::Local::stop_all(&self.home.join("local/workers"));
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn status_of(v: &Value, id: &str) -> Option<String> {
    for list in [&v["queue"]["items"], &v["history"]["items"]] {
        if let Some(r) = list
            .as_array()
            .and_then(|a| a.iter().find(|r| r["job_id"] == id))
        {
            return r["status"].as_str().map(str::to_owned);
        }
    }
    None
}

#[test]
fn a_day_from_a_project_folder() {
    let mut day = Day::new();
    // Before the stack: every command says what is missing, and how to start it.
    let before = day.run(&["status"]);
    assert_eq!(before.status.code(), Some(3));
    assert!(
        text(&before.stderr)
            .contains("the local stack is not running (start it with `tpu-runner local up`)"),
        "{}",
        text(&before.stderr)
    );
    day.up();

    // The same manifest twice: two runs of one job, each with its own id.
    let first = day.submit(&[]);
    let second = day.submit(&["--env", "LR=3e-4", "--env", "STEPS=5"]);
    assert_ne!(first, second);
    for id in [&first, &second] {
        assert!(
            id.starts_with("train-") && id.len() == "train-".len() + 6,
            "{id}"
        );
    }
    // `submit DIR` reads DIR/job.yaml; a missing manifest is a file that cannot be read.
    let from_dir = day.run(&["submit", ".", "--json"]);
    assert!(from_dir.status.success(), "{}", text(&from_dir.stderr));
    let third: Value = serde_json::from_slice(&from_dir.stdout).unwrap();
    let third = third["job_id"].as_str().unwrap().to_owned();
    let missing = day.run(&["submit", "nothere.yaml"]);
    assert_eq!(missing.status.code(), Some(3), "{}", text(&missing.stderr));

    // The queue right away: queue order, each waiting run with why.
    let queue = day.status(&[]);
    let items = queue["queue"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{queue}");
    assert!(
        items
            .iter()
            .filter(|r| r["status"] == "pending")
            .all(|r| !r["waiting"].as_array().unwrap().is_empty()),
        "a waiting run without a reason: {queue}"
    );

    // `watch` by name follows the latest run: each line timed, its output, its end.
    let watch = day.run(&["watch", "train"]);
    assert!(watch.status.success(), "{}", text(&watch.stderr));
    let out = text(&watch.stdout);
    assert!(out.contains(&format!("{third}: submitted")), "{out}");
    assert!(out.contains("step 3"), "{out}");
    assert!(out.contains(&format!("{third}: succeeded")), "{out}");
    for line in out.lines().filter(|l| l.contains(&format!("{third}: "))) {
        assert!(
            line.starts_with("20") && line.as_bytes().get(19) == Some(&b'Z'),
            "a state line without its time: {line}"
        );
    }
    // The second run got its variables.
    day.wait_for("the second run to end", || {
        status_of(&day.status(&["--all"]), &second).as_deref() == Some("succeeded")
    });
    let logs = day.run(&["logs", &second]);
    assert!(
        text(&logs.stdout).contains("lr=3e-4"),
        "{}",
        text(&logs.stdout)
    );
    assert!(
        text(&logs.stdout).contains("step 5"),
        "{}",
        text(&logs.stdout)
    );

    // A long run: followed, interrupted as a Spot preemption would, requeued, cancelled.
    let long = day.submit(&["--env", "STEPS=400", "--command", "bash train.sh"]);
    let watcher = day
        .command(&["watch", "train", "--interval", "0.5"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let follower = day
        .command(&["logs", "train", "--follow"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    day.wait_for("the long run to start", || {
        text(&day.run(&["logs", "train"]).stdout).contains("step 2")
    });
    let interrupt = day.run(&["interrupt-spot", "train"]);
    assert!(interrupt.status.success(), "{}", text(&interrupt.stderr));
    day.wait_for("the long run's second attempt", || {
        day.status(&[])["queue"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["job_id"] == long.as_str() && r["attempts"] == 2 && r["status"] == "running")
    });
    // A typo gets a suggestion, and changes nothing.
    let typo = day.run(&["cancel", "trian"]);
    assert_eq!(typo.status.code(), Some(1));
    assert!(
        text(&typo.stdout).contains("did you mean `train`?"),
        "{}",
        text(&typo.stdout)
    );
    let cancel = day.run(&["cancel", "train"]);
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
    assert!(
        text(&cancel.stdout).contains(&format!("{long}: cancelling")),
        "{}",
        text(&cancel.stdout)
    );
    let watched = watcher.wait_with_output().unwrap();
    assert_eq!(
        watched.status.code(),
        Some(1),
        "a cancelled run is not a success"
    );
    let watched = text(&watched.stdout);
    for said in [
        "interrupted (interrupt-spot); requeued in its region",
        "started",
        "cancelled",
    ] {
        assert!(
            watched.contains(said),
            "watch never said `{said}`:\n{watched}"
        );
    }
    let followed = follower.wait_with_output().unwrap();
    assert!(followed.status.success());
    let followed = text(&followed.stdout);
    assert!(followed.contains("step 1"), "{followed}");
    assert_eq!(
        followed.lines().filter(|l| l.ends_with("] step 1")).count(),
        2,
        "both attempts' output, once each:\n{followed}"
    );

    // The history: every run, latest first, with how it ended.
    let all = day.status(&["--all"]);
    let history = all["history"]["items"].as_array().unwrap();
    let ids: Vec<&str> = history
        .iter()
        .map(|r| r["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 4, "{all}");
    assert_eq!(ids[0], long, "latest first: {ids:?}");
    assert_eq!(status_of(&all, &long).as_deref(), Some("cancelled"));
    assert!(history.iter().all(|r| r["name"] == "train"));
    let table = text(&day.run(&["status", "--all"]).stdout);
    assert!(
        table.contains("cancelled") && table.contains("succeeded"),
        "{table}"
    );

    // `state export` reads the stack's store from here too.
    let export = day.run(&["state", "export"]);
    assert!(export.status.success(), "{}", text(&export.stderr));

    // Once the stack stops, commands say so (not "run init").
    day.down();
    for args in [&["status"][..], &["watch", "train"][..], &["submit"][..]] {
        let out = day.run(args);
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        assert!(
            text(&out.stderr).contains("the local stack is not running"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

/// A manifest `id:` is used once and refused again before anything is uploaded; the hint
/// says how to launch again.
#[test]
fn a_fixed_id_is_refused_again_with_a_way_out() {
    let mut day = Day::new();
    std::fs::write(
        day.project.join("fixed.yaml"),
        "jobs:\n  - id: once\n    tpu: v6e-8\n    command: 'true'\n    buckets: [gs://local-stack-us-east1]\n",
    )
    .unwrap();
    day.up();
    assert_eq!(day.submit(&["fixed.yaml"]), "once");
    let again = day.run(&["submit", "fixed.yaml"]);
    assert_eq!(again.status.code(), Some(2));
    let said = text(&again.stderr);
    assert!(
        said.contains("once") && said.contains("write `name:` instead"),
        "{said}"
    );
    assert!(
        !said.contains("uploading"),
        "uploaded before refusing: {said}"
    );
}

/// With a GCP fleet and no credentials, the message names the cause once.
#[test]
fn no_credentials_is_said_once() {
    let day = Day::new();
    let fleet = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/local/deployment.yaml");
    let out = day
        .command(&["submit", "--fleet", fleet.to_str().unwrap()])
        .env_remove("STORAGE_EMULATOR_HOST")
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env("HOME", day.home.join("no-home"))
        .env("GCE_METADATA_HOST", "127.0.0.1:9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let said = text(&out.stderr);
    assert!(said.contains("error: Cloud Storage: "), "{said}");
    assert!(!said.contains("Cloud Storage: Cloud Storage"), "{said}");
}

/// A request the cloud leaves waiting for capacity (a stockout) is shown as such, with how
/// long it has waited, not as `provisioning`; when capacity comes back the run starts.
#[test]
fn a_stocked_out_request_is_shown_waiting_for_capacity() {
    let mut day = Day::new();
    day.up();
    let endpoint = day.tpu_endpoint();
    let stockout = |zone: &str, on: bool| {
        let out = Command::new("curl")
            .args(["-sf", "-X", "POST", "-H", "content-type: application/json"])
            .args(["-d", &format!("{{\"on\": {on}}}")])
            .arg(format!("{endpoint}/emulator/v1/zones/{zone}/stockout"))
            .output()
            .unwrap();
        assert!(out.status.success(), "stockout {zone}: {out:?}");
    };
    for zone in ["us-east1-d", "us-central1-b"] {
        stockout(zone, true);
    }
    let run = day.submit(&[]);
    day.wait_for("a request waiting for capacity", || {
        day.status(&[])["resources"]["counts"]["waiting-for-capacity"]
            .as_u64()
            .is_some_and(|n| n > 0)
    });
    let table = text(&day.run(&["status"]).stdout);
    assert!(table.contains("waiting for capacity ("), "{table}");
    let v = day.status(&[]);
    let waiting = v["resources"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["status"] == "provisioning")
        .unwrap_or_else(|| panic!("no provisioning TPU: {v}"));
    assert!(waiting["capacity_wait_since"].is_string(), "{waiting}");
    for zone in ["us-east1-d", "us-central1-b"] {
        stockout(zone, false);
    }
    day.wait_for("the run to end once capacity is back", || {
        status_of(&day.status(&["--all"]), &run).as_deref() == Some("succeeded")
    });
    let after = day.status(&[]);
    assert!(
        after["resources"]["counts"]["waiting-for-capacity"].is_null(),
        "{after}"
    );
}

/// The chip limit counts TPUs this runner did not create: another team's TPU in the zone
/// leaves room for three of ours under `chip_limit: 32`, not four, and the waiting run says
/// the limit is why (on the old code the fourth was created: 40 chips).
#[test]
fn the_chip_limit_counts_another_teams_tpus() {
    let mut day = Day::new();
    day.up();
    let endpoint = day.tpu_endpoint();
    let east = format!("{endpoint}/v2/projects/local-project/locations/us-east1-d");
    let curl = |args: &[&str]| -> Value {
        let out = Command::new("curl").arg("-sf").args(args).output().unwrap();
        assert!(out.status.success(), "curl {args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let post = |url: &str, body: &str| {
        curl(&[
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-d",
            body,
            url,
        ])
    };
    // Every run goes east: the other zone has no capacity.
    post(
        &format!("{endpoint}/emulator/v1/zones/us-central1-b/stockout"),
        r#"{"on": true}"#,
    );
    // Another team's request in the zone (labelled for no runner).
    post(
        &format!("{east}/queuedResources?queuedResourceId=their-qr"),
        r#"{"tpu": {"nodeSpec": [{"parent": "projects/local-project/locations/us-east1-d",
        "nodeId": "their-tpu", "node": {"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e",
        "labels": {"team": "vision"}}}]}, "spot": {}}"#,
    );
    day.wait_for("their TPU to be ready", || {
        let out = Command::new("curl")
            .args(["-sf", &format!("{east}/nodes/their-tpu")])
            .output()
            .unwrap();
        out.status.success()
            && serde_json::from_slice::<Value>(&out.stdout).unwrap()["state"] == "READY"
    });
    // Live v6e-8 chips in the zone, whoever created them.
    let live_chips = || {
        let nodes = curl(&[&format!("{east}/nodes")]);
        nodes["nodes"].as_array().map_or(0, |nodes| {
            nodes
                .iter()
                .filter(|n| matches!(n["state"].as_str(), Some("CREATING" | "READY")))
                .count()
                * 8
        })
    };
    let runs: Vec<String> = (0..4)
        .map(|_| day.submit(&["--env", "STEPS=2000"]))
        .collect();
    day.wait_for(
        "three runs running and the fourth held by the chip limit",
        || {
            let v = day.status(&[]);
            let running = runs
                .iter()
                .filter(|r| status_of(&v, r).as_deref() == Some("running"))
                .count();
            assert!(live_chips() <= 32, "past the chip limit: {v}");
            running == 3 && v.to_string().contains("chip limit reached")
        },
    );
    // It stays there: the fourth run is not given a TPU past the limit.
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(250));
        assert!(live_chips() <= 32, "past the chip limit");
    }
    let v = day.status(&[]);
    let pending = runs
        .iter()
        .filter(|r| status_of(&v, r).as_deref() == Some("pending"))
        .count();
    assert_eq!(pending, 1, "{v}");
    // `status` plans from the stored state as the controller does, others' TPU included: the
    // waiting run is held by the chip limit, with three of four requested in the zone.
    let waiting = v["queue"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["status"] == "pending")
        .unwrap()
        .to_string();
    assert!(
        waiting.contains("chip limit reached: entry=east; chip_limit=32; available_chips=0"),
        "{waiting}"
    );
    assert!(waiting.contains("v6e-8 east, 3/4 requested"), "{waiting}");
}

/// A store with runs but no controller: what `status` and `watch` say about the queue.
struct Queue {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    common: Vec<String>,
}

impl Queue {
    fn new(manifest: &str) -> Queue {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let objects = tpu_runner::objects::LocalDir::new(dir.join("objects"));
        objects
            .create_bucket("gs://local-stack-us-east1", "US-EAST1")
            .unwrap();
        std::fs::write(dir.join("job.yaml"), manifest).unwrap();
        let fleet = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/local/deployment.yaml");
        let common = vec![
            "--fleet".to_owned(),
            fleet.display().to_string(),
            "--store".to_owned(),
            format!("sqlite:{}", dir.join("state.db").display()),
            "--objects".to_owned(),
            dir.join("objects").display().to_string(),
            // An emulator's address: no Cloud Run controller to start.
            "--tpu-endpoint".to_owned(),
            "http://127.0.0.1:9".to_owned(),
        ];
        Queue {
            _tmp: tmp,
            dir,
            common,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args).args(&self.common).current_dir(&self.dir);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }
}

/// `status` lists runs in the order the controller serves them (priority first), not by
/// id, and says why each waits; `watch` says it too, with its time, while the run waits.
#[test]
fn the_queue_is_in_service_order_and_says_why_each_run_waits() {
    let q = Queue::new(
        "jobs:\n  - name: a-normal\n    tpu: v6e-8\n    command: 'true'\n    buckets: [gs://local-stack-us-east1]\n  - name: b-high\n    tpu: v6e-8\n    priority: high\n    command: 'true'\n    buckets: [gs://local-stack-us-east1]\n  - name: c-low\n    tpu: v6e-8\n    priority: low\n    command: 'true'\n    buckets: [gs://local-stack-us-east1]\n",
    );
    let submitted = q.run(&["submit"]);
    assert!(submitted.status.success(), "{}", text(&submitted.stderr));
    let status = q.run(&["status", "--json"]);
    let v: Value = serde_json::from_slice(&status.stdout).unwrap();
    let items = v["queue"]["items"].as_array().unwrap();
    let order: Vec<(&str, u64)> = items
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["position"].as_u64().unwrap()))
        .collect();
    assert_eq!(order, [("b-high", 1), ("a-normal", 2), ("c-low", 3)]);
    for r in items {
        let why = r["waiting"][0].as_str().unwrap_or_default();
        assert!(why.contains("capacity"), "{r}");
        assert!(r["codes"].as_array().is_some_and(|c| !c.is_empty()), "{r}");
    }
    let table = text(&q.run(&["status"]).stdout);
    let rows: Vec<&str> = table.lines().filter(|l| l.contains("pending")).collect();
    assert!(
        rows.len() == 3 && rows[0].contains("b-high") && rows[2].contains("c-low"),
        "{table}"
    );
    assert!(table.contains("WAITING BECAUSE"), "{table}");
    // `--state`, `--name`, `--priority` filter; a bad state is a usage error.
    let only = q.run(&["status", "--json", "--priority", "low"]);
    let v: Value = serde_json::from_slice(&only.stdout).unwrap();
    assert_eq!(v["queue"]["items"].as_array().unwrap().len(), 1);
    assert_eq!(
        q.run(&["status", "--state", "runing"]).status.code(),
        Some(2)
    );

    // `watch` of a waiting run says why, with the time, and keeps waiting.
    let mut watch = q
        .command(&["watch", "a-normal", "--interval", "0.2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let _ = watch.kill();
    let out = text(&watch.wait_with_output().unwrap().stdout);
    let waiting = out
        .lines()
        .find(|l| l.contains(": waiting: "))
        .unwrap_or_else(|| panic!("watch never said why it waits:\n{out}"));
    assert!(
        waiting.starts_with("20") && waiting.contains("capacity"),
        "{waiting}"
    );
}

/// The help and the docs say what the commands do now: no exit code 0 "the file is valid"
/// for every command, and the resume example uses `interrupt-spot`, which the README names.
#[test]
fn help_and_examples_say_what_the_commands_do() {
    let help = text(&Command::new(BIN).arg("--help").output().unwrap().stdout);
    assert!(!help.contains("the file is valid"), "{help}");
    assert!(help.contains("3  a file could not be read"), "{help}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let resume = std::fs::read_to_string(root.join("examples/resume/job.yaml")).unwrap();
    assert!(
        resume.contains("tpu-runner interrupt-spot resume"),
        "{resume}"
    );
    assert!(!resume.contains("TPU_RUNNER_TPU_ENDPOINT"), "{resume}");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(readme.contains("tpu-runner interrupt-spot resume"));
    assert!(readme.contains("cargo install --path ."));
}

/// What the worker would refuse is refused at submit, before anything is queued: a `gs://`
/// bundle that does not exist, a file that is not an archive (a process's environment),
/// a bundle outside the manifest's folder by a relative name.
#[test]
fn a_bundle_the_worker_would_refuse_is_refused_at_submit() {
    for (bundle, said) in [
        (
            "gs://local-stack-us-east1/bundles/missing.tar.gz",
            "does not exist",
        ),
        ("/proc/self/environ", "is not a tar or tar.gz archive"),
        ("..", "outside the manifest's folder"),
    ] {
        let q = Queue::new(&format!(
            "jobs:\n  - name: x\n    tpu: v6e-8\n    bundle: {bundle}\n    command: 'true'\n    buckets: [gs://local-stack-us-east1]\n"
        ));
        let out = q.run(&["submit"]);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{bundle}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(said),
            "{bundle}: {}",
            text(&out.stderr)
        );
        let status = q.run(&["status", "--json", "--all"]);
        let v: Value = serde_json::from_slice(&status.stdout).unwrap();
        assert!(
            v["queue"]["items"].as_array().unwrap().is_empty(),
            "{bundle}: queued"
        );
    }
}
