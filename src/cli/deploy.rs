//! `deploy`: plans the fleet's project set-up (`crate::deploy`) and prints it (`--dry-run`)
//! or carries it out against GCP with Application Default Credentials. Wiring only.

use std::path::Path;

use super::exit_codes::ExitStatus;
use super::validate::load_fleet;
use super::{Failure, print_stdout};
use crate::deploy::{self, Inputs};

/// `deploy`'s arguments.
pub(crate) struct DeployArgs<'a> {
    /// The fleet file.
    pub fleet: &'a Path,
    /// Print the calls only.
    pub dry_run: bool,
    /// Job buckets to grant.
    pub job_buckets: &'a [String],
    /// The plan as JSON.
    pub json: bool,
    /// The epoch (default: a fresh one).
    pub epoch: Option<&'a str>,
}

fn fail(status: ExitStatus, message: String) -> Failure {
    Failure { message, status }
}

/// Makes an ed25519 key pair with OpenSSH's `ssh-keygen` (no passphrase, comment
/// `tpurunner`): (private, public).
fn keygen() -> Result<(Vec<u8>, Vec<u8>), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("key");
    let out = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "tpurunner", "-f"])
        .arg(&path)
        .output()
        .map_err(|e| format!("ssh-keygen: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ssh-keygen failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let private = std::fs::read(&path).map_err(|e| e.to_string())?;
    let public = std::fs::read(path.with_extension("pub")).map_err(|e| e.to_string())?;
    Ok((private, public))
}

pub(crate) fn run(args: &DeployArgs<'_>) -> Result<ExitStatus, Failure> {
    let fleet = load_fleet(args.fleet)?;
    for b in args.job_buckets {
        if !b.starts_with("gs://") || b.len() <= 5 || b[5..].contains('/') {
            return Err(fail(
                ExitStatus::Usage,
                format!("error: --job-bucket {b}: expected gs://BUCKET\n"),
            ));
        }
    }
    let epoch = args
        .epoch
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let inputs = Inputs {
        epoch,
        job_buckets: args.job_buckets.to_vec(),
    };
    let steps = deploy::plan(&fleet, &inputs);
    if args.job_buckets.is_empty() {
        eprintln!(
            "note: no --job-bucket: workers get no access to job buckets (least privilege); name each bucket your jobs use"
        );
    }
    if args.dry_run {
        if args.json {
            print_stdout(&(serde_json::to_string_pretty(&steps).expect("serialisable") + "\n"));
        } else {
            print_stdout(&deploy::render(&steps));
        }
        return Ok(ExitStatus::Ok);
    }
    let mut http = deploy::apply::Google::connect()
        .map_err(|e| fail(ExitStatus::Io, format!("error: {e}\n")))?;
    let agent = std::env::current_exe()
        .and_then(std::fs::read)
        .map_err(|e| {
            fail(
                ExitStatus::Io,
                format!("error: cannot read this binary: {e}\n"),
            )
        })?;
    // Every TPU worker downloads the agent at boot: a build with debug information is five
    // times the size of the shipped one.
    if agent.len() > 40 << 20 {
        eprintln!(
            "note: this binary is {} MB, and every TPU worker downloads it at boot: deploy from `cargo install --path . --profile dist` (about 17 MB, no debug information)",
            agent.len() >> 20
        );
    }
    let deployment =
        crate::files::read_bytes(args.fleet, crate::files::SPEC_LIMIT).map_err(|e| {
            Failure::io(
                "read",
                args.fleet,
                &std::io::Error::new(e.kind(), e.to_string()),
                None,
            )
        })?;
    let mut materials = deploy::apply::Materials {
        agent,
        deployment,
        keygen: Box::new(keygen),
        public_key: None,
    };
    let mut store = crate::store::open(
        &crate::store::StoreUrl::Firestore {
            project: Some(fleet.project.clone()),
            database: None,
        },
        &crate::store::FleetDefaults {
            runner: fleet.name.clone(),
            project: fleet.project.clone(),
        },
        true,
    )
    .map_err(|e| super::state::store_failure(&e))?;
    deploy::apply::apply(
        &steps,
        &mut http,
        &mut materials,
        store.as_mut(),
        crate::controller::wall_clock(),
        &mut |line| print_stdout(&format!("{line}\n")),
    )
    .map_err(|e| {
        fail(
            ExitStatus::Io,
            format!("error: {e}\n  = hint: deploy is idempotent: fix the cause and run it again\n"),
        )
    })?;
    print_stdout(&format!(
        "deployed {} (epoch {})\n",
        fleet.name, inputs.epoch
    ));
    Ok(ExitStatus::Ok)
}
