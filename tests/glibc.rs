//! The worker agent runs on TPU VM images (Ubuntu 22.04, glibc 2.35): the binary must not
//! need a newer glibc symbol. Read from its dynamic symbol table with binutils' `objdump`
//! (the build links the same way in every profile, so the test binary's sibling tells for
//! the release one; the README's release build is checked the same way by hand).

use std::process::Command;

/// The newest glibc a TPU VM image has.
const TPU_VM_GLIBC: (u32, u32) = (2, 35);

#[test]
fn the_binary_needs_no_glibc_newer_than_the_tpu_vm_images() {
    let binary = env!("CARGO_BIN_EXE_tpu-runner");
    let out = Command::new("objdump")
        .args(["-T", binary])
        .output()
        .expect("objdump (binutils) is needed to read the binary's symbols");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut newest = (0, 0);
    let mut culprit = String::new();
    for line in text.lines() {
        let Some(at) = line.find("GLIBC_") else {
            continue;
        };
        let version: String = line[at + 6..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut parts = version.split('.').filter_map(|p| p.parse::<u32>().ok());
        let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if v > newest {
            newest = v;
            culprit = line.trim().to_owned();
        }
    }
    assert!(
        newest > (2, 0),
        "no glibc symbols found: is this a dynamic glibc binary?"
    );
    assert!(
        newest <= TPU_VM_GLIBC,
        "the binary needs glibc {}.{} ({culprit}); TPU VM images have {}.{}",
        newest.0,
        newest.1,
        TPU_VM_GLIBC.0,
        TPU_VM_GLIBC.1
    );
}
