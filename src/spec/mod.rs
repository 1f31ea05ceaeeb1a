//! User-written specifications: the fleet (`deployment.yaml`) and job manifests (`job.yaml`),
//! their strict validation and the deterministic naming helpers. Pure: callers read files and
//! pass text in; nothing here does IO.

pub mod diagnostic;
pub mod first_seen;
pub mod fleet;
pub mod gcp;
pub mod job;
pub mod names;
pub mod policy;
pub mod prices;
pub mod value_tree;
pub mod yaml;

pub use diagnostic::{Diagnostic, SpecErrors};
pub use fleet::{EntryKind, FleetSpec, QuotaKey, TpuEntry, parse_fleet};
pub use gcp::{ProvisioningModel, TpuType};
pub use job::{Cache, JobSpec, Priority, TpuRequest, parse_jobs};
pub use names::{Name, NameMap, NameSet};
pub use policy::{EngineConfig, PolicyName, PolicySpec};

/// The error for a file that raised no diagnostic yet could not be built (a bug, reported
/// as an error rather than a panic).
fn incomplete(file: &str, source: &str) -> SpecErrors {
    SpecErrors::new(
        file,
        source,
        vec![Diagnostic {
            path: String::new(),
            line: 1,
            column: 1,
            message: "internal error: the file passed every check but could not be read; please report this".into(),
            hint: None,
        }],
    )
}
