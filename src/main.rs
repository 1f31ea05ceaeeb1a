//! The `tpu-runner` binary: a thin shell around [`tpu_runner::cli::main`].

fn main() -> std::process::ExitCode {
    tpu_runner::cli::main()
}
