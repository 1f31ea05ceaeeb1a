//! The `tpu-runner` binary: a thin shell around [`tpu_runner::cli::main`].

// mimalloc: the engine and the simulator allocate many small strings per pass; glibc's
// allocator spends up to a third of a large pass consolidating its free lists.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tpu_runner::cli::main()
}
