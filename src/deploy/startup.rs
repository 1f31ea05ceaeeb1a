//! The TPU VM startup script (§5.1) `deploy` uploads to `<runner bucket>/artifacts/startup.sh`
//! and every managed TPU runs as root at boot (`startup-script-url`): it fetches the worker
//! agent from the runner bucket with the VM's own token, checks its SHA-256 against the
//! digest written into the script at deploy (a changed object in the bucket is refused), installs
//! it, fetches the controller's public key, and hands over to `tpu-runner worker prepare`.
//! Every value it carries is checked to be plain before it is written into the script.

/// Renders the script for the runner bucket `bucket` (a name) and the agent's `sha256`.
pub fn render(bucket: &str, sha256: &str) -> Result<String, String> {
    if bucket.is_empty()
        || !bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
    {
        return Err(format!("`{bucket}` is not a plain bucket name"));
    }
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("`{sha256}` is not a SHA-256"));
    }
    Ok(format!(
        r#"#!/bin/bash
# tpu-runner startup script, written by `tpu-runner deploy`: installs the worker agent (its
# SHA-256 checked) and prepares this TPU VM worker. Runs as root at every boot.
set -euo pipefail
bucket='{bucket}'
want='{sha256}'
md=http://metadata.google.internal/computeMetadata/v1
token=$(curl -sf --retry 10 -H 'Metadata-Flavor: Google' "$md/instance/service-accounts/default/token" \
  | sed -n 's/.*"access_token" *: *"\([^"]*\)".*/\1/p')
fetch() {{
  curl -sf --retry 10 -H "Authorization: Bearer $token" -o "$2" \
    "https://storage.googleapis.com/storage/v1/b/$bucket/o/$1?alt=media"
}}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fetch artifacts%2Ftpu-runner "$tmp/tpu-runner"
if ! echo "$want  $tmp/tpu-runner" | sha256sum --check --status; then
  echo "tpu-runner: the agent in gs://$bucket/artifacts/tpu-runner does not have SHA-256 $want; not installed" >&2
  exit 1
fi
install -m 0755 "$tmp/tpu-runner" /usr/local/bin/tpu-runner
fetch artifacts%2Fssh-key.pub "$tmp/controller.pub"
/usr/local/bin/tpu-runner worker prepare --authorized-key-file "$tmp/controller.pub"
"#
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_valid_bash_and_refuses_what_is_not_plain() {
        let script = render("my-runner-bucket", &"ab".repeat(32)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("startup.sh");
        std::fs::write(&path, &script).unwrap();
        let check = std::process::Command::new("bash")
            .arg("-n")
            .arg(&path)
            .status()
            .unwrap();
        assert!(check.success());
        assert!(script.contains(&format!("want='{}'", "ab".repeat(32))));
        assert!(render("b'; rm -rf /; '", &"ab".repeat(32)).is_err());
        assert!(render("bucket", "$(id)").is_err());
    }
}
