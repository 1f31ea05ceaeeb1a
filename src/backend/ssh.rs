//! Reaching a TPU's workers over SSH the way GCP describes them (§5.2): each worker's
//! address from the node's `networkEndpoints` (the external IP when the fleet connects
//! directly, else the internal one) and its host key from the node's `hostkeys` guest
//! attributes, pinned before the first connection — never trusted on first use. A worker
//! whose key is not published yet is a temporary failure; a key that does not match what
//! the API publishes is refused, after one fresh read (a node re-created under the same
//! name has new keys). Wraps `worker::transport::Ssh`; knows nothing of jobs.

use std::collections::HashMap;
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
        }
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
        let keys = self
            .client
            .guest_attributes(&target.zone, &target.tpu, "hostkeys/")
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
            if let Some(k) = keys.iter().find(|k| {
                k.worker_id == i.to_string() && k.namespace == "hostkeys" && k.key == "ssh-ed25519"
            }) {
                self.ssh.pin(&worker, &format!("ssh-ed25519 {}", k.value));
            }
        }
        self.resolved
            .lock()
            .expect("not poisoned")
            .insert(key, Instant::now());
        Ok(())
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
        match self.ssh.run(target, args, stdin, timeout) {
            // A refused host key or no key yet: read the API once more (a node re-created
            // under this name publishes new keys), never accept what the worker offers.
            Err(e) if e.message.to_ascii_lowercase().contains("host key") => {
                self.resolve(target, true)?;
                self.ssh.run(target, args, stdin, timeout)
            }
            other => other,
        }
    }
}
