//! Real OpenSSH servers for tests and benches: one `sshd` per simulated worker on 127.0.0.1
//! (its own port, host key and worker root, handed to the agent through `SetEnv`), and
//! ed25519 keys made with `ssh-keygen`.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

pub fn sshd_available() -> bool {
    if Path::new(SSHD).exists() {
        return true;
    }
    assert!(
        std::env::var("TPU_RUNNER_REQUIRE_EMULATORS").as_deref() != Ok("1"),
        "{SSHD} is missing: install openssh-server (.ci/run does)"
    );
    eprintln!("skipped: {SSHD} is missing (apt-get install openssh-server)");
    false
}

pub fn keygen(path: &Path) -> String {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
    let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
    // `ssh-ed25519 AAAA… comment` → the key without its comment.
    public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One worker's sshd: killed when dropped.
pub struct Server {
    child: Child,
    /// Its port.
    pub port: u16,
    /// Its host key (`ssh-ed25519 AAAA…`).
    pub host_key: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts an sshd in `dir` for `client_public`, handing the agent `env` (`SetEnv`). The
/// worker's home is `dir/home`, as a fresh TPU VM's runner user has its own: the command's
/// login shell never reads the profile of whoever runs the tests.
pub fn start_sshd(dir: &Path, client_public: &str, env: &[(&str, String)]) -> Server {
    std::fs::create_dir_all(dir.join("home")).unwrap();
    let host_key = keygen(&dir.join("host_ed25519"));
    std::fs::write(dir.join("authorized_keys"), format!("{client_public}\n")).unwrap();
    let port = free_port();
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_ed25519\nAuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\nPidFile {d}/sshd.pid\nSetEnv {env}\n",
        d = dir.display(),
        env = [("HOME", dir.join("home").display().to_string())]
            .iter()
            .chain(env)
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    std::fs::write(dir.join("sshd_config"), config).unwrap();
    std::fs::create_dir_all("/run/sshd").ok();
    let child = Command::new(SSHD)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stderr(std::fs::File::create(dir.join("sshd.log")).unwrap())
        .spawn()
        .unwrap();
    // Ready when it accepts connections.
    let until = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < until,
            "sshd on {port} did not start: {}",
            std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Server {
        child,
        port,
        host_key,
    }
}

/// The controller's side: a fresh key at `dir/controller_ed25519` and an SSH transport using
/// it as this user, running the `agent` binary on the workers. Returns the transport and the
/// public key to authorise.
pub fn controller(
    dir: &Path,
    agent: &str,
) -> (std::sync::Arc<tpu_runner::worker::transport::Ssh>, String) {
    let key = dir.join("controller_ed25519");
    let public = keygen(&key);
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let ssh = tpu_runner::worker::transport::Ssh::new(&user, key, agent).expect("transport");
    (std::sync::Arc::new(ssh), public)
}
