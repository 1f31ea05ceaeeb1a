//! A deterministic discrete-event model of the Google Cloud TPU API (queued resources, nodes,
//! capacity, preemptions). It knows nothing of tpu-runner's policies and never reads the wall
//! clock or an unseeded RNG.
