//! How the controller reaches the agent on a worker: run `tpu-runner worker VERB …` there
//! with a JSON document on stdin and read its acknowledgement lines. `Local` runs the agent
//! as a process on this machine, one root folder per worker (the local stack, the
//! emulator's TPUs, tests); `Ssh` runs it over SSH with host keys pinned. Every argument is a fixed word or a path the transport chose; no
//! job data is ever part of a command line. Errors say whether trying again may help.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One worker of a TPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Zone.
    pub zone: String,
    /// TPU name.
    pub tpu: String,
    /// Worker index.
    pub worker: u32,
}

impl Target {
    /// The worker's host name, as the TPU API names workers (`<tpu>-w-<i>`).
    pub fn host(&self) -> String {
        format!("{}-w-{}", self.tpu, self.worker)
    }
}

/// A call that did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportError {
    /// Trying again later may help (unreachable, timed out); otherwise it will not.
    pub temporary: bool,
    /// What happened.
    pub message: String,
}

/// A way to run the agent on a worker.
pub trait Transport: Send + Sync {
    /// Runs `tpu-runner worker <args…>` on `target` with `stdin`; its stdout. A non-zero
    /// exit is an error carrying its stderr.
    fn run(
        &self,
        target: &Target,
        args: &[&str],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<String, TransportError>;
}

/// Runs `command` with `stdin`, killing it after `timeout` (a temporary failure of `what`).
fn run_to_end(
    command: &mut Command,
    stdin: &[u8],
    timeout: Duration,
    what: &str,
) -> Result<std::process::Output, TransportError> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| TransportError {
            temporary: false,
            message: format!("{what}: cannot start {:?}: {e}", command.get_program()),
        })?;
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(stdin);
    }
    let until = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() >= until => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TransportError {
                    temporary: true,
                    message: format!("{what}: timed out after {timeout:?}"),
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                return Err(TransportError {
                    temporary: true,
                    message: format!("{what}: {e}"),
                });
            }
        }
    }
    child.wait_with_output().map_err(|e| TransportError {
        temporary: true,
        message: format!("{what}: {e}"),
    })
}

/// The agent as a process on this machine: worker `i` of TPU `t` in zone `z` has its root at
/// `BASE/z/t/w-i`, and the objects live in a local folder (or the environment's store). Like
/// the runner user of a fresh TPU VM, the worker has a home of its own (`ROOT/home`): the
/// command's login shell reads that home's profile, never the profile of whoever runs this.
#[derive(Clone, Debug)]
pub struct Local {
    /// Where worker roots are.
    pub base: PathBuf,
    /// The `tpu-runner` binary.
    pub agent: PathBuf,
    /// A local object folder (`--objects`), if not the environment's store.
    pub objects: Option<PathBuf>,
    /// The emulator's TPU VM metadata servers, per project
    /// (`URL/emulator/v1/projects/PROJECT`: each TPU's is below it), whose notices the
    /// agents watch; `None`: no metadata server.
    pub metadata: Option<String>,
}

impl Local {
    /// Ends every agent process under `base` (`base/ZONE/TPU/w-I`), as the TPUs going away
    /// would.
    pub fn stop_all(base: &std::path::Path) {
        let folders = |dir: &std::path::Path| -> Vec<PathBuf> {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect()
        };
        for zone in folders(base) {
            for tpu in folders(&zone) {
                for worker in folders(&tpu) {
                    super::agent::stop_all(&super::agent::Root::new(worker));
                }
            }
        }
    }

    /// The root folder of `target`.
    pub fn root(&self, target: &Target) -> PathBuf {
        self.base
            .join(&target.zone)
            .join(&target.tpu)
            .join(format!("w-{}", target.worker))
    }
}

impl Transport for Local {
    fn run(
        &self,
        target: &Target,
        args: &[&str],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<String, TransportError> {
        let root = self.root(target);
        let home = root.join("home");
        std::fs::create_dir_all(&home).map_err(|e| TransportError {
            temporary: false,
            message: format!("{}: cannot make the worker's home: {e}", target.host()),
        })?;
        let mut command = Command::new(&self.agent);
        command
            .env("HOME", &home)
            .arg("worker")
            .args(args)
            .arg("--root")
            .arg(&root)
            .arg("--host")
            .arg(target.host())
            .arg("--metadata")
            .arg(match &self.metadata {
                Some(project) => format!(
                    "{}/locations/{}/nodes/{}/computeMetadata/v1/",
                    project.trim_end_matches('/'),
                    target.zone,
                    target.tpu
                ),
                None => super::agent::METADATA_OFF.to_owned(),
            });
        if let Some(dir) = &self.objects {
            // The worker's object store is its environment's: the command sees it too.
            command
                .arg("--objects")
                .arg(dir)
                .env("TPU_RUNNER_OBJECTS", dir);
        }
        let out = run_to_end(&mut command, stdin, timeout, &target.host())?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(TransportError {
                temporary: false,
                message: format!(
                    "{}: the agent failed ({}): {}",
                    target.host(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            })
        }
    }
}

/// The agent over SSH (the `ssh` binary: OpenSSH's own host-key checking, connection reuse
/// and key handling, nothing hand-made): the target's address, the controller's key, and
/// host keys pinned per worker — never trusted on first use. The remote command is fixed
/// words and checked names; the launch spec goes over stdin.
#[derive(Debug)]
pub struct Ssh {
    /// Remote user.
    pub user: String,
    /// The controller's private key (a 0600 file).
    pub identity: PathBuf,
    /// The agent's path on the workers.
    pub remote_agent: String,
    /// Where the worker's address is: `(host, port)` by target host name.
    pub addresses: std::sync::Mutex<std::collections::BTreeMap<String, (String, u16)>>,
    /// Pinned host keys (`ssh-ed25519 AAAA…`) by target host name.
    pinned: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
    /// The transport's private folder (known_hosts, connection sockets).
    dir: tempfile::TempDir,
    /// Words added to every agent call (plain words only), e.g. `--require-ready DIR`.
    pub extra_args: Vec<String>,
    /// A `ProxyCommand` by target host name (plain words only: it runs through a shell),
    /// e.g. an IAP tunnel.
    proxies: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

/// A word safe to pass as it is to a remote shell: letters, digits, `-`, `_`, `.`, `/`.
fn plain(word: &str) -> bool {
    !word.is_empty()
        && word.len() <= 253
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

impl Ssh {
    /// A transport as `user` with the key at `identity`, running `remote_agent`.
    pub fn new(user: &str, identity: PathBuf, remote_agent: &str) -> std::io::Result<Ssh> {
        Ok(Ssh {
            user: user.to_owned(),
            identity,
            remote_agent: remote_agent.to_owned(),
            addresses: Default::default(),
            pinned: Default::default(),
            dir: tempfile::Builder::new()
                .prefix("tpu-runner-ssh")
                .tempdir()?,
            extra_args: Vec::new(),
            proxies: Default::default(),
        })
    }

    /// Reaches `target` through `words` as its `ProxyCommand` (`%p`, the port, as OpenSSH
    /// expands it); refused unless every word is plain (letters, digits, `-_./=`).
    pub fn set_proxy(&self, target: &Target, words: &[&str]) -> Result<(), TransportError> {
        // No `%` token but `%p` (OpenSSH expands the others), nothing else a shell reads.
        let word = |w: &str| {
            w == "%p"
                || (!w.is_empty()
                    && w.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b'=')
                    }))
        };
        if !words.iter().all(|w| word(w)) {
            return Err(TransportError {
                temporary: false,
                message: format!(
                    "{}: refusing a proxy command that is not plain words",
                    target.host()
                ),
            });
        }
        self.proxies
            .lock()
            .expect("not poisoned")
            .insert(target.host(), words.join(" "));
        Ok(())
    }

    /// Where `target` is reached.
    pub fn set_address(&self, target: &Target, host: &str, port: u16) {
        self.addresses
            .lock()
            .expect("not poisoned")
            .insert(target.host(), (host.to_owned(), port));
    }

    /// Pins `target`'s host key (`ssh-ed25519 AAAA…`, as its guest attributes publish it).
    pub fn pin(&self, target: &Target, key: &str) {
        self.pinned
            .lock()
            .expect("not poisoned")
            .insert(target.host(), key.trim().to_owned());
    }

    /// The known_hosts file holding exactly the pinned key of `alias`.
    fn known_hosts(&self, alias: &str) -> Result<PathBuf, TransportError> {
        let key = self
            .pinned
            .lock()
            .expect("not poisoned")
            .get(alias)
            .cloned()
            .ok_or_else(|| TransportError {
                temporary: true,
                message: format!("{alias}: no pinned host key yet (never trusted on first use)"),
            })?;
        let path = self.dir.path().join(format!("known_hosts-{alias}"));
        std::fs::write(&path, format!("{alias} {key}\n")).map_err(|e| TransportError {
            temporary: false,
            message: format!("known_hosts: {e}"),
        })?;
        Ok(path)
    }
}

impl Drop for Ssh {
    /// Ends the connection masters this transport opened (`ControlPersist` would keep each
    /// for a minute after its folder is gone).
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.dir.path()) else {
            return;
        };
        for socket in entries.flatten().map(|e| e.path()) {
            if socket
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("cm-"))
            {
                let _ = Command::new("ssh")
                    .arg("-o")
                    .arg(format!("ControlPath={}", socket.display()))
                    .args(["-O", "exit", "controlled"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// Whether an SSH failure may pass (§5.2's temporary texts; never a refusal of access or a
/// host key that does not match).
fn ssh_temporary(stderr: &str) -> bool {
    let text = stderr.to_ascii_lowercase();
    if text.contains("permission denied")
        || text.contains("not authorized")
        || text.contains("host key verification failed")
        || text.contains("remote host identification has changed")
    {
        return false;
    }
    [
        "connection timed out",
        "connection reset",
        "connection refused",
        "ssh: connect",
        "could not resolve",
        "temporary failure",
        "unavailable",
        "timed out",
        "connection closed",
    ]
    .iter()
    .any(|t| text.contains(t))
}

impl Ssh {
    /// Runs `<agent…> worker <args…> <extra…> --host <alias>` on `target` (every word
    /// plain: checked here), e.g. `agent` = `["sudo", "-n", PATH]` for a root helper.
    pub fn call(
        &self,
        target: &Target,
        agent: &[&str],
        extra: &[String],
        args: &[&str],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<String, TransportError> {
        let alias = target.host();
        if !plain(&alias)
            || !args.iter().all(|a| plain(a))
            || !extra.iter().all(|a| plain(a))
            || !agent.iter().all(|a| plain(a))
        {
            return Err(TransportError {
                temporary: false,
                message: format!("{alias}: refusing a remote command that is not plain words"),
            });
        }
        let remote = agent
            .iter()
            .copied()
            .chain(["worker"])
            .chain(args.iter().copied())
            .chain(extra.iter().map(String::as_str))
            .chain(["--host", alias.as_str()])
            .collect::<Vec<_>>()
            .join(" ");
        self.remote(target, &remote, stdin, timeout)
    }

    /// Makes sure the agent at `path` on `target` is the program whose SHA-256 is `sha`
    /// (hex), sending `binary` when it is not; checked on the worker before it replaces
    /// anything. True when it was sent.
    pub fn install(
        &self,
        target: &Target,
        path: &str,
        sha: &str,
        binary: impl FnOnce() -> std::io::Result<Vec<u8>>,
        timeout: Duration,
    ) -> Result<bool, TransportError> {
        let alias = target.host();
        let dir = path.rsplit_once('/').map_or(".", |(d, _)| d);
        if !plain(path)
            || !plain(dir)
            || sha.len() != 64
            || !sha.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(TransportError {
                temporary: false,
                message: format!("{alias}: refusing to install the agent at {path:?}"),
            });
        }
        let check = format!(
            "if test -x {path} && printf '%s  %s\\n' {sha} {path} | sha256sum -c --status; then echo TPU_RUNNER_AGENT_PRESENT; else echo TPU_RUNNER_AGENT_MISSING; fi"
        );
        if self
            .remote(target, &check, b"", timeout)?
            .contains("TPU_RUNNER_AGENT_PRESENT")
        {
            return Ok(false);
        }
        let data = binary().map_err(|e| TransportError {
            temporary: false,
            message: format!("reading the agent to send: {e}"),
        })?;
        let push = format!(
            "set -e; umask 077; mkdir -p {dir}; t=$(mktemp {dir}/.incoming.XXXXXX); trap 'rm -f \"$t\"' EXIT; cat >\"$t\"; \
             if printf '%s  %s\\n' {sha} \"$t\" | sha256sum -c --status; then chmod 0755 \"$t\"; mv -f \"$t\" {path}; \
             for old in {dir}/tpu-runner-*; do [ \"$old\" = {path} ] || rm -f \"$old\"; done; echo TPU_RUNNER_AGENT_INSTALLED; \
             else echo 'the agent received does not match its SHA-256 {sha}' >&2; exit 3; fi"
        );
        let out = self.remote(target, &push, &data, timeout)?;
        if !out.contains("TPU_RUNNER_AGENT_INSTALLED") {
            return Err(TransportError {
                temporary: true,
                message: format!("{alias}: installing the agent said nothing"),
            });
        }
        Ok(true)
    }

    /// Runs the remote command `remote` (built by this transport only) on `target`.
    fn remote(
        &self,
        target: &Target,
        remote: &str,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<String, TransportError> {
        let alias = target.host();
        let refuse = |message: String| TransportError {
            temporary: false,
            message,
        };
        let (host, port) = self
            .addresses
            .lock()
            .expect("not poisoned")
            .get(&alias)
            .cloned()
            .ok_or_else(|| refuse(format!("{alias}: no address known")))?;
        let known_hosts = self.known_hosts(&alias)?;
        let control = self.dir.path().join("cm-%C");
        let mut command = Command::new("ssh");
        command
            .arg("-p")
            .arg(port.to_string())
            .arg("-i")
            .arg(&self.identity)
            .args(["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"])
            .args(["-o", "ConnectTimeout=15", "-o", "StrictHostKeyChecking=yes"])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
            .args(["-o", "GlobalKnownHostsFile=/dev/null"])
            .args([
                "-o",
                "HostKeyAlgorithms=ssh-ed25519",
                "-o",
                "UpdateHostKeys=no",
            ])
            .args(["-o", "CheckHostIP=no", "-o", "LogLevel=ERROR"])
            .arg("-o")
            .arg(format!("HostKeyAlias={alias}"))
            .args(["-o", "ControlMaster=auto", "-o", "ControlPersist=60"])
            .arg("-o")
            .arg(format!("ControlPath={}", control.display()));
        if let Some(proxy) = self.proxies.lock().expect("not poisoned").get(&alias) {
            command.arg("-o").arg(format!("ProxyCommand={proxy}"));
        }
        command
            .arg(format!("{}@{host}", self.user))
            .arg(remote)
            .process_group(0);
        let out = run_to_end(&mut command, stdin, timeout, &alias)?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        match out.status.code() {
            Some(0) => Ok(stdout),
            Some(255) => Err(TransportError {
                temporary: ssh_temporary(&stderr),
                message: format!("{alias}: ssh: {stderr}"),
            }),
            _ => Err(refuse(format!(
                "{alias}: the agent failed ({}): {stderr}",
                out.status
            ))),
        }
    }
}

impl Transport for Ssh {
    fn run(
        &self,
        target: &Target,
        args: &[&str],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<String, TransportError> {
        self.call(
            target,
            &[self.remote_agent.as_str()],
            &self.extra_args,
            args,
            stdin,
            timeout,
        )
    }
}
