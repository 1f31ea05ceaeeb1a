//! Runs one scenario once (development aid).
fn main() {
    let path = std::env::args().nth(1).expect("scenario path");
    let scenario = tpu_runner::simulate::scenario::load(std::path::Path::new(&path)).unwrap_or_else(|e| panic!("{e}"));
    let r = tpu_runner::simulate::harness::run(&scenario, "classic", 1, Default::default(), Default::default()).unwrap_or_else(|v| panic!("{v:?}"));
    println!("{}", serde_json::to_string_pretty(&r.metrics).unwrap());
}
