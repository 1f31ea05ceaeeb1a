//! The shipped list prices of Cloud TPU per chip-hour by family (Spot and on-demand): what
//! the simulator charges by default and what price-ordered policies rank entries by. Plain
//! data, read alike by the engine and the simulator; a scenario's `prices:` overrides it.

/// USD per chip-hour `(family, spot, on-demand)`. From the SkyPilot catalog excerpt in
/// ../shared/data, us-central1: v6e from tpu-v6e-1 (2.70, spot 24 % of it), v5p from
/// tpu-v5p-12288 = 6,144 chips (25,804.80 and 10,321.92 per hour); the others are GCP list
/// prices of the same period.
pub const LIST_PRICES: [(&str, f64, f64); 6] = [
    ("v6e", 0.65, 2.70),
    ("v5e", 0.48, 1.20),
    ("v5p", 1.68, 4.20),
    ("v4", 0.97, 3.22),
    ("v3", 0.88, 2.20),
    ("v2", 0.50, 1.13),
];

/// The list price per chip-hour of `family` (as quota names it: `v5e`, not `v5litepod`),
/// Spot or on-demand; `None` for a family the table does not know.
pub fn per_chip_hour(family: &str, spot: bool) -> Option<f64> {
    LIST_PRICES
        .iter()
        .find(|(f, ..)| *f == family)
        .map(|&(_, s, o)| if spot { s } else { o })
}
