//! Reaching a TPU's workers over SSH the way GCP describes them (§5.2): each worker's
//! address from the node's `networkEndpoints` (the external IP when the fleet connects
//! directly, else the internal one) and its host key from the node's `hostkeys` guest
//! attributes, pinned before the first connection — never trusted on first use. A worker
//! whose key is not published yet is a temporary failure; a key that does not match what
//! the API publishes is refused, after one fresh read (a node re-created under the same
//! name has new keys). With `ssh_transport: iap` every connection goes through an IAP TCP
//! tunnel (`gcloud compute start-iap-tunnel` as the `ProxyCommand`, to the worker's
//! instance named in its `hostname` guest attribute, as gcloud's own TPU SSH does). Adopted
//! TPUs never ran the startup script: the agent is sent to them over the same connection,
//! checked against its SHA-256 on the worker, before their first call. Wraps
//! `worker::transport::Ssh`; knows nothing of jobs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::gcp::tpu;
use crate::worker::transport::{Ssh, Target, Transport, TransportError};

/// How long a node's addresses and keys are used before they are read again.
const FRESH: Duration = Duration::from_secs(60);

/// SSH to TPU workers found through the TPU API.
pub struct TpuSsh {
    ssh: Arc<Ssh>,
    client: tpu::Client,
    /// Connect to external IPs (the fleet's `ssh_transport: direct`).
    external: bool,
    /// Take the SSH port from the endpoint's `port` (the emulator's convention; real
    /// endpoints carry the TPU runtime's port there, and SSH listens on 22).
    port_from_endpoint: bool,
    /// When each (zone, TPU) was last resolved.
    resolved: Mutex<HashMap<(String, String), Instant>>,
    /// Tunnel every connection through IAP.
    iap: Option<Iap>,
    /// How the agent reaches adopted TPUs.
    adopted: Option<AdoptedAgent>,
    /// Adopted workers (host names) whose agent was checked since their TPU was resolved.
    installed: Mutex<HashSet<String>>,
    /// The private folder of the key file the transport uses, removed with it.
    _key_dir: Option<tempfile::TempDir>,
}

/// IAP TCP forwarding through `gcloud` (the tunnel only: SSH itself stays OpenSSH with the
/// pinned keys).
#[derive(Clone, Debug)]
pub struct Iap {
    /// The `gcloud` program.
    pub gcloud: String,
    /// The project of the TPUs.
    pub project: String,
}

/// The agent on adopted TPUs: sent by the controller, since nothing installed it there.
#[derive(Clone, Debug)]
pub struct AdoptedAgent {
    /// The adopted TPUs, as (zone, name).
    pub tpus: HashSet<(String, String)>,
    /// The program to send (the controller's own binary).
    pub binary: std::path::PathBuf,
    /// Its SHA-256, hex.
    pub sha256: String,
    /// The folder on the workers (relative: in the runner user's home).
    pub dir: String,
    /// Words added to every agent call there (no readiness marker: no startup script ran).
    pub extra_args: Vec<String>,
}

impl AdoptedAgent {
    /// The agent's path on the workers: named by its digest, so a new version never
    /// replaces one a running supervisor uses.
    pub fn path(&self) -> String {
        format!(
            "{}/tpu-runner-{}",
            self.dir.trim_end_matches('/'),
            self.sha256
        )
    }
}

impl TpuSsh {
    /// Workers reached through `ssh`, found with `client`.
    pub fn new(
        ssh: Arc<Ssh>,
        client: tpu::Client,
        external: bool,
        port_from_endpoint: bool,
    ) -> TpuSsh {
        TpuSsh {
            ssh,
            client,
            external,
            port_from_endpoint,
            resolved: Mutex::default(),
            iap: None,
            adopted: None,
            installed: Mutex::default(),
            _key_dir: None,
        }
    }

    /// Keeps `dir` (the private folder of the key file) as long as the transport, and
    /// removes it with the transport.
    pub fn keeping(mut self, dir: tempfile::TempDir) -> TpuSsh {
        self._key_dir = Some(dir);
        self
    }

    /// Every connection through an IAP tunnel.
    pub fn with_iap(mut self, iap: Iap) -> TpuSsh {
        self.iap = Some(iap);
        self
    }

    /// The agent sent to adopted TPUs.
    pub fn with_adopted(mut self, adopted: AdoptedAgent) -> TpuSsh {
        self.adopted = Some(adopted);
        self
    }

    fn adopted_for(&self, target: &Target) -> Option<&AdoptedAgent> {
        self.adopted
            .as_ref()
            .filter(|a| a.tpus.contains(&(target.zone.clone(), target.tpu.clone())))
    }

    fn fail(temporary: bool, target: &Target, message: String) -> TransportError {
        TransportError {
            temporary,
            message: format!("{}: {message}", target.host()),
        }
    }

    /// Reads `target`'s TPU: every worker's address and host key, pinned.
    fn resolve(&self, target: &Target, force: bool) -> Result<(), TransportError> {
        let key = (target.zone.clone(), target.tpu.clone());
        if !force
            && self
                .resolved
                .lock()
                .expect("not poisoned")
                .get(&key)
                .is_some_and(|at| at.elapsed() < FRESH)
        {
            return Ok(());
        }
        let node = self
            .client
            .get_nodes(std::slice::from_ref(&key))
            .pop()
            .expect("one answer per node asked")
            .map_err(|e| Self::fail(true, target, format!("reading its node: {e}")))?
            .ok_or_else(|| Self::fail(false, target, "the TPU does not exist".into()))?;
        // IAP needs each worker's instance name too (`hostname`, outside `hostkeys/`).
        let path = if self.iap.is_some() { "" } else { "hostkeys/" };
        let keys = self
            .client
            .guest_attributes(
                &target.zone,
                &target.tpu,
                path,
                node.network_endpoints.len() as u32,
            )
            .map_err(|e| Self::fail(true, target, format!("reading its host keys: {e}")))?;
        for (i, endpoint) in node.network_endpoints.iter().enumerate() {
            let worker = Target {
                zone: target.zone.clone(),
                tpu: target.tpu.clone(),
                worker: i as u32,
            };
            let address = if self.external {
                endpoint.access_config.external_ip.as_str()
            } else {
                endpoint.ip_address.as_str()
            };
            if address.is_empty() {
                continue;
            }
            let port = match endpoint.port {
                p if self.port_from_endpoint && (1..=65535).contains(&p) => p as u16,
                _ => 22,
            };
            self.ssh.set_address(&worker, address, port);
            if let Some(iap) = &self.iap {
                let instance = keys
                    .iter()
                    .find(|k| k.worker_id == i as u32 && k.key == "hostname")
                    .map(|k| k.value.as_str())
                    .ok_or_else(|| {
                        Self::fail(
                            true,
                            &worker,
                            "its instance name (the `hostname` guest attribute) is not published yet: IAP cannot reach it".into(),
                        )
                    })?;
                // Anything on the VM can write its guest attributes: only an instance name
                // (RFC 1035: a letter, then letters, digits and `-`) may reach gcloud.
                if !instance_name(instance) {
                    return Err(Self::fail(
                        false,
                        &worker,
                        format!(
                            "its `hostname` guest attribute {instance:?} is not an instance name"
                        ),
                    ));
                }
                let zone = format!("--zone={}", target.zone);
                let project = format!("--project={}", iap.project);
                self.ssh.set_proxy(
                    &worker,
                    &[
                        &iap.gcloud,
                        "compute",
                        "start-iap-tunnel",
                        instance,
                        "%p",
                        "--listen-on-stdin",
                        &zone,
                        &project,
                        "--verbosity=warning",
                    ],
                )?;
            }
            if let Some(k) = keys.iter().find(|k| {
                k.worker_id == i as u32 && k.namespace == "hostkeys" && k.key == "ssh-ed25519"
            }) {
                self.ssh.pin(&worker, &format!("ssh-ed25519 {}", k.value));
            }
        }
        self.resolved
            .lock()
            .expect("not poisoned")
            .insert(key, Instant::now());
        // A fresh look may find a new incarnation (new disks): check its agent again.
        if force {
            let prefix = format!("{}-w-", target.tpu);
            self.installed
                .lock()
                .expect("not poisoned")
                .retain(|host| !host.starts_with(&prefix));
        }
        Ok(())
    }

    /// Runs the agent on `target`: on an adopted TPU the one sent there (sent first when
    /// missing), with `sudo -n` when `root`.
    fn call(
        &self,
        target: &Target,
        args: &[&str],
        stdin: &[u8],
        timeout: Duration,
        root: bool,
    ) -> Result<String, TransportError> {
        let Some(adopted) = self.adopted_for(target) else {
            if root {
                return Err(Self::fail(
                    false,
                    target,
                    "root helpers run on adopted TPUs only".into(),
                ));
            }
            return self.ssh.run(target, args, stdin, timeout);
        };
        let path = adopted.path();
        let host = target.host();
        if !self.installed.lock().expect("not poisoned").contains(&host) {
            let sent = self.ssh.install(
                target,
                &path,
                &adopted.sha256,
                || std::fs::read(&adopted.binary),
                timeout,
            )?;
            if sent {
                tracing::info!(worker = %host, agent = %path, "sent the agent to an adopted TPU");
            }
            self.installed.lock().expect("not poisoned").insert(host);
        }
        let agent: Vec<&str> = if root {
            vec!["sudo", "-n", &path]
        } else {
            vec![&path]
        };
        self.ssh
            .call(target, &agent, &adopted.extra_args, args, stdin, timeout)
    }

    /// Runs a root helper (`worker devices`) on a worker of an adopted TPU, through `sudo
    /// -n` (the TPU's owner grants it; nothing here asks for a password).
    pub fn run_as_root(
        &self,
        target: &Target,
        args: &[&str],
        timeout: Duration,
    ) -> Result<String, TransportError> {
        self.resolve(target, false)?;
        self.call(target, args, b"", timeout, true)
    }
}

impl Transport for TpuSsh {
    fn run(
        &self,
        target: &Target,
        args: &[&str],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<String, TransportError> {
        self.resolve(target, false)?;
        match self.call(target, args, stdin, timeout, false) {
            // A refused host key or no key yet: read the API once more (a node re-created
            // under this name publishes new keys), never accept what the worker offers.
            Err(e) if e.message.to_ascii_lowercase().contains("host key") => {
                self.resolve(target, true)?;
                self.call(target, args, stdin, timeout, false)
            }
            other => other,
        }
    }
}

/// A Compute Engine instance name: a lowercase letter, then up to 62 lowercase letters,
/// digits or `-`, not ending in `-`.
fn instance_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && !name.ends_with('-')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

#[cfg(test)]
mod tests {
    use super::instance_name;

    #[test]
    fn only_instance_names_reach_gcloud() {
        for good in ["t1v-n-4f2a9c1e-w-0", "a", "my-vm-12"] {
            assert!(instance_name(good), "{good}");
        }
        for bad in [
            "",
            "--impersonate-service-account=x",
            "-x",
            "Upper",
            "a%d",
            "a b",
            "ends-",
            "1starts-with-digit",
            &"a".repeat(64),
        ] {
            assert!(!instance_name(bad), "{bad}");
        }
    }
}
