//! The dashboard in a real browser: a store with waiting, cancelled and submitted runs, the
//! `dashboard` command serving it on loopback, and Debian's headless Chromium loading the
//! page: its structure once the script has rendered the snapshot (sections, the runs, why
//! they wait, the events), no horizontal overflow at 1400 px and at 390 px, and a
//! screenshot at each width (kept in the target folder for a person to look at). Skipped
//! without Chromium, unless `TPU_RUNNER_REQUIRE_BROWSER=1` (as `.ci/run` sets).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_tpu-runner");
const CHROMIUM: &str = "/usr/bin/chromium";

fn browser() -> bool {
    if Path::new(CHROMIUM).exists() {
        return true;
    }
    assert!(
        std::env::var("TPU_RUNNER_REQUIRE_BROWSER").as_deref() != Ok("1"),
        "TPU_RUNNER_REQUIRE_BROWSER=1 but {CHROMIUM} is missing (install Debian's chromium, as .ci/run does)"
    );
    eprintln!("no {CHROMIUM}: the dashboard's browser test is skipped (install Debian's chromium)");
    false
}

/// Headless Chromium as this machine allows it (no sandbox as root, no background network).
fn chromium(
    dir: &Path,
    width: u32,
    height: u32,
    what: &[String],
    url: &str,
) -> std::process::Output {
    let profile = tempfile::tempdir_in(dir).unwrap();
    Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={width},{height}"))
        .args(what)
        .arg(url)
        .output()
        .unwrap()
}

fn run(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The width and height a PNG file says it has.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is no PNG",
        path.display()
    );
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn the_dashboard_renders_the_queue_in_a_browser_at_desktop_and_phone_widths() {
    if !browser() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fleet = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/local/deployment.yaml");
    let objects = tpu_runner::objects::LocalDir::new(dir.join("objects"));
    objects
        .create_bucket("gs://local-stack-us-east1", "US-EAST1")
        .unwrap();
    std::fs::write(
        dir.join("job.yaml"),
        "jobs:\n  - name: sweep\n    tpu: v6e-8\n    command: python3 train.py\n    buckets: [gs://local-stack-us-east1]\n",
    )
    .unwrap();
    std::fs::write(dir.join("train.py"), "print('hi')\n").unwrap();
    let store = format!("sqlite:{}", dir.join("state.db").display());
    let objects_dir = dir.join("objects");
    let common = [
        "--fleet",
        fleet.to_str().unwrap(),
        "--store",
        &store,
        "--objects",
        objects_dir.to_str().unwrap(),
        // An emulator's address: no Cloud Run controller to start.
        "--tpu-endpoint",
        "http://127.0.0.1:9",
    ];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(common.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let mut ids = Vec::new();
    for _ in 0..3 {
        let out = run(
            dir,
            &with(&["submit", "--json"])
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        ids.push(v["job_id"].as_str().unwrap().to_owned());
    }
    run(
        dir,
        &with(&["cancel", &ids[0]])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );

    let mut server = Command::new(BIN)
        .args(with(&[
            "dashboard",
            "--listen",
            "127.0.0.1:0",
            "--refresh",
            "0.5",
        ]))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    BufReader::new(server.stderr.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    let url = said
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("the dashboard said: {said}"))
        .to_owned();
    let shots: PathBuf = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let result = std::panic::catch_unwind(|| {
        for (width, height) in [(1400, 1000), (390, 1400)] {
            let dom = chromium(dir, width, height, &["--dump-dom".into()], &url);
            let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
            assert!(
                dom.contains("data-loaded=\"1\""),
                "{width} px: never rendered:\n{dom}"
            );
            assert!(
                dom.contains("data-overflow=\"false\""),
                "{width} px: something is wider than the page:\n{dom}"
            );
            for section in [
                "Queue",
                "Latest finished runs",
                "TPUs by zone",
                "Goodput, last 24 h",
                "Latest events",
            ] {
                assert!(
                    dom.contains(&format!("<h2>{section}</h2>")),
                    "{width} px: no {section}"
                );
            }
            // The two waiting runs with why, the cancelled one in the history, the events.
            for id in &ids {
                assert!(dom.contains(id.as_str()), "{width} px: {id} is missing");
            }
            assert!(
                dom.contains("capacity"),
                "{width} px: no reason to wait shown:\n{dom}"
            );
            assert!(
                dom.contains(">cancelled<"),
                "{width} px: the cancelled run:\n{dom}"
            );
            assert!(
                dom.contains(&format!("{}: submitted", ids[2])),
                "{width} px: events"
            );
            let shot = shots.join(format!("dashboard-{width}.png"));
            let _ = std::fs::remove_file(&shot);
            let out = chromium(
                dir,
                width,
                height,
                &[format!("--screenshot={}", shot.display())],
                &url,
            );
            assert!(shot.exists(), "no screenshot: {out:?}");
            assert_eq!(png_size(&shot), (width, height), "{}", shot.display());
            eprintln!("screenshot at {width} px: {}", shot.display());
        }
    });
    let _ = server.kill();
    let _ = server.wait();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
