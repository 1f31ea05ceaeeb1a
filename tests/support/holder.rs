//! A process holding a file open (a stand-in for a job holding an accelerator device),
//! for the device-wait and device-probe tests; ended when dropped.

use std::time::{Duration, Instant};

/// A process holding `device` open until it is killed (dropped).
pub struct Holder(pub std::process::Child);

impl Holder {
    pub fn new(device: &std::path::Path) -> Holder {
        let child = std::process::Command::new("bash")
            .arg("-c")
            .arg("exec 3<\"$1\"; exec sleep 600")
            .arg("holder")
            .arg(device)
            .spawn()
            .unwrap();
        // Held once the descriptor shows in /proc.
        let until = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_dir(format!("/proc/{}/fd", child.id()))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == device))
        {
            assert!(Instant::now() < until, "the holder never opened {device:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Holder(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
