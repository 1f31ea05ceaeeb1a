//! The `tpu-runner` binary: a thin shell around [`tpu_runner::cli::main`].

// mimalloc: the engine and the simulator allocate many small strings per pass; glibc's
// allocator spends up to a third of a large pass consolidating its free lists. Built without
// transparent huge pages (`no_thp`): a long simulation's heap grows and is purged piecemeal,
// and each refault zeroed a 2 MiB page (5-8 % of a 30-day run, and 15 % more memory).
// Version 2 (`v2`): its allocation path is shorter than version 3's (2 % faster on the scale
// scenario, same memory).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tpu_runner::cli::main()
}
