//! Reports of simulated runs: an aligned table (mean ± spread over seeds), JSON records with
//! a documented schema, and a directory of SVG plots tied together by an HTML page. Pure
//! formatting except `write_dir`, which writes the report files.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::element::DashedPathElement;
use plotters::prelude::*;
use serde::Serialize;

use super::harness::{RunResult, Sample};
use super::metrics::{Interval, Metrics};
use crate::spec::FleetSpec;
use crate::spec::fleet::QuotaKey;

/// Version of the JSON report schema (docs/simulate-json.md).
pub const JSON_SCHEMA_VERSION: u32 = 1;

#[derive(Serialize)]
struct Record<'a> {
    scenario: &'a str,
    policy: &'a str,
    seed: u64,
    event_hash: String,
    metrics: &'a Metrics,
}

/// The JSON document of a set of runs.
pub fn json(results: &[RunResult]) -> String {
    let records: Vec<Record<'_>> = results
        .iter()
        .map(|r| Record {
            scenario: &r.scenario,
            policy: &r.policy,
            seed: r.seed,
            event_hash: format!("{:016x}", r.event_hash),
            metrics: &r.metrics,
        })
        .collect();
    let doc = serde_json::json!({ "schema_version": JSON_SCHEMA_VERSION, "records": records });
    serde_json::to_string_pretty(&doc).expect("report serialises") + "\n"
}

fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

fn fmt_stat(values: &[f64], digits: usize) -> String {
    let (mean, sd) = mean_sd(values);
    if values.len() > 1 {
        format!("{mean:.digits$} ±{sd:.digits$}")
    } else {
        format!("{mean:.digits$}")
    }
}

fn fmt_duration(values: &[f64]) -> String {
    let (mean, _) = mean_sd(values);
    if mean >= 3600.0 {
        format!("{:.1}h", mean / 3600.0)
    } else if mean >= 60.0 {
        format!("{:.0}m", mean / 60.0)
    } else {
        format!("{mean:.0}s")
    }
}

/// One row per scenario × policy (mean ± standard deviation over seeds).
pub fn table(results: &[RunResult]) -> String {
    let mut groups: BTreeMap<(&str, &str), Vec<&RunResult>> = BTreeMap::new();
    let mut order: Vec<(&str, &str)> = Vec::new();
    for r in results {
        let key = (r.scenario.as_str(), r.policy.as_str());
        if !groups.contains_key(&key) {
            order.push(key);
        }
        groups.entry(key).or_default().push(r);
    }
    let header = [
        "SCENARIO",
        "POLICY",
        "SEEDS",
        "JOBS OK/FAIL/LEFT",
        "UTIL",
        "GOODPUT",
        "EFFICIENCY",
        "WAIT p50",
        "JCT p50",
        "PREEMPT",
        "COST $",
        "SIM h",
        "WALL s",
    ];
    let rows: Vec<Vec<String>> = order
        .iter()
        .map(|key| {
            let runs = &groups[key];
            let m = |f: &dyn Fn(&Metrics) -> f64| {
                runs.iter().map(|r| f(&r.metrics)).collect::<Vec<f64>>()
            };
            vec![
                key.0.to_owned(),
                key.1.to_owned(),
                runs.len().to_string(),
                format!(
                    "{}/{}/{}",
                    fmt_stat(&m(&|m| m.jobs_succeeded as f64), 0),
                    fmt_stat(&m(&|m| m.jobs_failed as f64), 0),
                    fmt_stat(&m(&|m| m.jobs_unfinished as f64), 0)
                ),
                fmt_stat(&m(&|m| m.utilization), 2),
                fmt_stat(&m(&|m| m.goodput_ratio), 2),
                fmt_stat(&m(&|m| m.efficiency), 2),
                fmt_duration(&m(&|m| m.queue_wait_s.p50)),
                fmt_duration(&m(&|m| m.jct_s.p50)),
                fmt_stat(&m(&|m| m.preemptions as f64), 0),
                fmt_stat(&m(&|m| m.cost_usd), 0),
                fmt_stat(&m(&|m| m.simulated_s / 3600.0), 0),
                fmt_stat(&m(&|m| m.wall_s), 2),
            ]
        })
        .collect();
    crate::table::table(&header, &rows)
}

/// One line of a plot: legend, colour, points.
type Line<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

/// A level drawn as a dashed line across a plot: legend, colour, value.
type Level = (String, RGBColor, f64);

/// What a run's plots draw as limits: the most chips its fleet may hold at once (each quota
/// key's chips at its `chip_limit`, or all its declared chips where it declares fewer), and
/// each zone's chip limits (summed over the zone's quota keys).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChipLimits {
    /// Chips the whole fleet may hold.
    pub fleet: u64,
    /// Chip limits by zone.
    pub by_zone: BTreeMap<String, u64>,
}

impl ChipLimits {
    /// The limits of `fleet`.
    pub fn of(fleet: &FleetSpec) -> ChipLimits {
        let mut declared: BTreeMap<QuotaKey, u64> = BTreeMap::new();
        for e in &fleet.tpus {
            *declared.entry(e.quota_key()).or_default() += e.declared_chips();
        }
        let mut limits = ChipLimits::default();
        for (key, limit) in fleet.chip_limits() {
            let chips = declared.get(&key).copied().unwrap_or(0);
            limits.fleet += chips.min(u64::from(limit));
            *limits.by_zone.entry(key.zone).or_default() += u64::from(limit);
        }
        limits
    }
}

/// Draws `series` (wider first, so lines lying on one another stay visible), `levels` as
/// dashed lines across (limits), `markers` as small red triangles on the x axis
/// (preemptions), integer ticks, and the legend above the data (the y range has headroom
/// for it).
fn plot_lines(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[Line<'_>],
    levels: &[Level],
    markers: &[f64],
) -> Result<(), String> {
    let x_max = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|(x, _)| *x))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let data_max = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|(_, y)| *y))
        .chain(levels.iter().map(|(_, _, y)| *y))
        .fold(0.0f64, f64::max)
        .max(1.0);
    // Headroom above the data for the legend: one row per series and level.
    let rows = series.len() + levels.len();
    let y_max = (data_max * (1.15 + 0.09 * rows as f64)).ceil();
    let root = SVGBackend::new(path, (900, 320)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    let integer = |v: &f64| format!("{v:.0}");
    chart
        .configure_mesh()
        .x_desc("hours")
        .y_desc(y_label)
        .y_label_formatter(&integer)
        .x_label_formatter(&|v: &f64| {
            if x_max >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        })
        .draw()
        .map_err(|e| err(&e))?;
    let n = series.len();
    for (i, (name, color, points)) in series.iter().enumerate() {
        let color = *color;
        let width = 2 + 2 * (n - 1 - i).min(3) as u32;
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.mix(0.85).stroke_width(width),
            ))
            .map_err(|e| err(&e))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(3))
            });
    }
    for (name, color, y) in levels {
        let style = color.stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new([(0.0, *y), (x_max, *y)], 8, 5, style))
            .map_err(|e| err(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| DashedPathElement::new(vec![(x, y), (x + 16, y)], 5, 3, style));
    }
    if !markers.is_empty() {
        let size = y_max / 40.0;
        chart
            .draw_series(
                markers
                    .iter()
                    .map(|&x| TriangleMarker::new((x, size), 7, RGBColor(214, 39, 40).filled())),
            )
            .map_err(|e| err(&e))?
            .label("preemption")
            .legend(|(x, y)| TriangleMarker::new((x + 8, y), 5, RGBColor(214, 39, 40).filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Writes the three plots of one run (`limits`: its fleet's, drawn as dashed levels; none
/// when unknown); their file names.
fn plots_for(
    dir: &Path,
    stem: &str,
    samples: &[Sample],
    limits: &ChipLimits,
) -> Result<Vec<String>, String> {
    let chips = dir.join(format!("{stem}-chips.svg"));
    // The fleet's ceiling, when its limits are known.
    let ceiling: Vec<Level> = (limits.fleet > 0)
        .then(|| {
            (
                format!(
                    "fleet ceiling: {} chips under its chip limits",
                    limits.fleet
                ),
                BLACK,
                limits.fleet as f64,
            )
        })
        .into_iter()
        .collect();
    // When the cloud preempted: the samples where the count rose.
    let preempted: Vec<f64> = samples
        .windows(2)
        .filter(|w| w[1].preemptions > w[0].preemptions)
        .map(|w| w[1].hours)
        .collect();
    plot_lines(
        &chips,
        "chips allocated, busy and idle (allocated, not running a command)",
        "chips",
        &[
            (
                "allocated",
                PALETTE[0],
                samples
                    .iter()
                    .map(|s| (s.hours, s.allocated_chips as f64))
                    .collect(),
            ),
            (
                "busy",
                PALETTE[2],
                samples
                    .iter()
                    .map(|s| (s.hours, s.busy_chips as f64))
                    .collect(),
            ),
            (
                "idle",
                PALETTE[7],
                samples
                    .iter()
                    .map(|s| {
                        (
                            s.hours,
                            s.allocated_chips.saturating_sub(s.busy_chips) as f64,
                        )
                    })
                    .collect(),
            ),
        ],
        &ceiling,
        &preempted,
    )?;
    let queue = dir.join(format!("{stem}-queue.svg"));
    plot_lines(
        &queue,
        "jobs pending and running",
        "jobs",
        &[
            (
                "pending",
                PALETTE[1],
                samples.iter().map(|s| (s.hours, s.queue as f64)).collect(),
            ),
            (
                "running",
                PALETTE[2],
                samples
                    .iter()
                    .map(|s| (s.hours, s.running as f64))
                    .collect(),
            ),
        ],
        &[],
        &[],
    )?;
    let zones: Vec<String> = samples
        .first()
        .map(|s| s.capacity_by_zone.keys().cloned().collect())
        .unwrap_or_default();
    let capacity = dir.join(format!("{stem}-capacity.svg"));
    // Every zone (colours repeat past eight, a zone per line all the same).
    let series: Vec<Line<'_>> = zones
        .iter()
        .enumerate()
        .map(|(i, z)| {
            (
                z.as_str(),
                PALETTE[i % PALETTE.len()],
                samples
                    .iter()
                    .map(|s| {
                        (
                            s.hours,
                            s.capacity_by_zone.get(z).copied().unwrap_or(0) as f64,
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    // Each zone's stated chip limit, dashed in the zone's colour.
    let levels: Vec<Level> = zones
        .iter()
        .enumerate()
        .filter_map(|(i, z)| {
            let limit = *limits.by_zone.get(z)?;
            Some((
                format!("{z} chip_limit {limit}"),
                PALETTE[i % PALETTE.len()],
                limit as f64,
            ))
        })
        .collect();
    plot_lines(
        &capacity,
        "spot capacity the fleet could use, per zone (chips)",
        "chips",
        &series,
        &levels,
        &preempted,
    )?;
    Ok(vec![chips, queue, capacity]
        .into_iter()
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The file that marks a folder as a report tpu-runner wrote (so it may be rewritten).
const MARKER: &str = ".tpu-runner-report";

/// Checks that `dir` can take a report: absent, an empty folder, or one an earlier report
/// wrote (unless `force`); never a file or a device.
pub fn check_dir(dir: &Path, force: bool) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot use `{}`: {e}", dir.display())),
        Ok(m) if !m.is_dir() => Err(format!(
            "`{}` is not a folder: the report needs a directory (it writes index.html and SVG plots into it)",
            dir.display()
        )),
        Ok(_) => {
            let mut entries = std::fs::read_dir(dir)
                .map_err(|e| format!("cannot read `{}`: {e}", dir.display()))?;
            if force || dir.join(MARKER).is_file() || entries.next().is_none() {
                Ok(())
            } else {
                Err(format!(
                    "`{}` holds other files and no earlier report: pass a new or empty folder, or --force",
                    dir.display()
                ))
            }
        }
    }
}

/// What the report page says about how it was made.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The command that ran (`tpu-runner simulate …`).
    pub command: String,
    /// When (RFC 3339).
    pub generated_at: String,
    /// Each scenario's description, by name.
    pub descriptions: BTreeMap<String, String>,
    /// Each scenario's fleet limits, by name (drawn on its plots).
    pub chip_limits: BTreeMap<String, ChipLimits>,
}

/// The comparison of one scenario's policies, over their seeds: a row per policy with the
/// mean ± standard deviation of each metric; the best mean of each column in bold.
/// A metric policies are compared on: name, value, digits shown, whether higher is better.
type Metric = (&'static str, fn(&Metrics) -> f64, usize, bool);

/// What policies are compared on, in the HTML report and the paired comparisons.
const METRICS: [Metric; 7] = [
    ("utilisation", |m| m.utilization, 2, true),
    ("goodput", |m| m.goodput_ratio, 2, true),
    ("efficiency", |m| m.efficiency, 2, true),
    ("wait p50 (min)", |m| m.queue_wait_s.p50 / 60.0, 1, false),
    ("JCT p50 (min)", |m| m.jct_s.p50 / 60.0, 1, false),
    ("jobs done", |m| m.jobs_succeeded as f64, 0, true),
    ("cost $", |m| m.cost_usd, 0, false),
];

/// Each distinct value once, in the order first seen (scenarios and policies as they ran).
fn first_seen<'r>(values: impl Iterator<Item = &'r str>) -> Vec<&'r str> {
    let mut out: Vec<&str> = Vec::new();
    for v in values {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// Each scenario's policies compared pairwise with the first, on the seeds both ran (common
/// random numbers: the same cloud and workload for both): per metric the mean difference
/// with its 95 % confidence interval, which policy is better where the interval leaves out
/// zero, and a verdict. Empty when no scenario ran two policies.
pub fn paired_comparisons(results: &[RunResult]) -> String {
    let scenarios = first_seen(results.iter().map(|r| r.scenario.as_str()));
    let mut out = String::new();
    for scenario in scenarios {
        let runs: Vec<&RunResult> = results.iter().filter(|r| r.scenario == scenario).collect();
        let policies = first_seen(runs.iter().map(|r| r.policy.as_str()));
        let Some((base, others)) = policies.split_first() else {
            continue;
        };
        for other in others {
            let mut pairs: Vec<(&Metrics, &Metrics)> = Vec::new();
            for a in runs.iter().filter(|r| r.policy == *base) {
                if let Some(b) = runs.iter().find(|r| r.policy == *other && r.seed == a.seed) {
                    pairs.push((&a.metrics, &b.metrics));
                }
            }
            if pairs.is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                "\n{other} − {base} on {scenario}, {} seed{} paired:",
                pairs.len(),
                if pairs.len() == 1 { "" } else { "s" }
            );
            let (mut better, mut worse, mut same) = (Vec::new(), Vec::new(), 0);
            for (name, f, digits, higher_is_better) in METRICS {
                let a: Vec<f64> = pairs.iter().map(|(a, _)| f(a)).collect();
                let b: Vec<f64> = pairs.iter().map(|(_, b)| f(b)).collect();
                let p = Interval::paired(&a, &b);
                let verdict = if !p.half_width.is_finite() {
                    "one run: no interval".to_owned()
                } else if !p.significant() {
                    same += 1;
                    "no significant difference".to_owned()
                } else if (p.mean > 0.0) == higher_is_better {
                    better.push(name);
                    format!("{other} better")
                } else {
                    worse.push(name);
                    format!("{base} better")
                };
                let interval = if p.half_width.is_finite() {
                    format!(
                        " [{:+.digits$}, {:+.digits$}]",
                        p.mean - p.half_width,
                        p.mean + p.half_width
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "  {name:<15} {:+.digits$}{interval}  {verdict}",
                    p.mean
                );
            }
            if pairs.len() < 2 {
                let _ = writeln!(
                    out,
                    "  verdict: one seed cannot tell policies apart (run more: --seeds 1..=10)"
                );
            } else {
                let _ = writeln!(
                    out,
                    "  verdict: {other} is better on {}, {base} on {}; {same} without a significant difference",
                    if better.is_empty() {
                        "nothing".to_owned()
                    } else {
                        better.join(", ")
                    },
                    if worse.is_empty() {
                        "nothing".to_owned()
                    } else {
                        worse.join(", ")
                    },
                );
            }
        }
    }
    out
}

/// A column of `simulate --compare`: header, value, digits.
type Compared = (&'static str, fn(&Metrics) -> f64, usize);

/// What `simulate --compare` shows of each policy.
const COMPARED: [Compared; 7] = [
    ("goodput chip-h", |m| m.goodput_chip_hours, 0),
    ("goodput ratio", |m| m.goodput_ratio, 2),
    ("efficiency", |m| m.efficiency, 2),
    ("cost $", |m| m.cost_usd, 0),
    ("of which egress $", |m| m.egress_usd, 0),
    ("wait p50 (min)", |m| m.queue_wait_s.p50 / 60.0, 1),
    ("wait p95 (min)", |m| m.queue_wait_s.p95 / 60.0, 1),
];

/// The paired differences `simulate --compare` shows.
const COMPARED_PAIRED: [Compared; 2] = [
    ("goodput chip-h", |m| m.goodput_chip_hours, 2),
    ("goodput ratio", |m| m.goodput_ratio, 3),
];

/// `a ±h`: a mean and the half-width of its 95 % interval (the mean alone for one run).
fn fmt_interval(i: Interval, digits: usize) -> String {
    if i.half_width.is_finite() {
        format!("{:.digits$} ±{:.digits$}", i.mean, i.half_width)
    } else {
        format!("{:.digits$}", i.mean)
    }
}

/// One Markdown table per scenario comparing its policies over their seeds (`simulate
/// --compare`): each metric's mean with its 95 % confidence interval, and each policy's
/// paired difference in goodput from the first policy on the seeds both ran, with whether
/// it is higher, lower or the same within its interval.
pub fn compare(results: &[RunResult]) -> String {
    let scenarios = first_seen(results.iter().map(|r| r.scenario.as_str()));
    let mut out = String::new();
    for scenario in scenarios {
        let runs: Vec<&RunResult> = results.iter().filter(|r| r.scenario == scenario).collect();
        let policies = first_seen(runs.iter().map(|r| r.policy.as_str()));
        let first = policies[0];
        let seeds = runs.iter().filter(|r| r.policy == first).count();
        let _ = writeln!(
            out,
            "{}**{scenario}**, {seeds} seed{}: mean ±95 % confidence interval; Δ: the paired difference from `{first}` on the same seeds [95 % interval]\n",
            if out.is_empty() { "" } else { "\n" },
            if seeds == 1 { "" } else { "s" },
        );
        out.push_str("| policy |");
        for (name, ..) in COMPARED {
            let _ = write!(out, " {name} |");
        }
        for (name, ..) in COMPARED_PAIRED {
            let _ = write!(out, " Δ {name} |");
        }
        out.push_str("\n|---|");
        out.push_str(&"---:|".repeat(COMPARED.len() + COMPARED_PAIRED.len()));
        out.push('\n');
        for policy in &policies {
            let mine: Vec<&RunResult> = runs
                .iter()
                .copied()
                .filter(|r| r.policy == *policy)
                .collect();
            let _ = write!(out, "| {policy} |");
            for (_, f, digits) in COMPARED {
                let values: Vec<f64> = mine.iter().map(|r| f(&r.metrics)).collect();
                let _ = write!(out, " {} |", fmt_interval(Interval::of(&values), digits));
            }
            let pairs: Vec<(&Metrics, &Metrics)> = runs
                .iter()
                .filter(|r| r.policy == first)
                .filter_map(|a| {
                    mine.iter()
                        .find(|b| b.seed == a.seed)
                        .map(|b| (&a.metrics, &b.metrics))
                })
                .collect();
            for (_, f, digits) in COMPARED_PAIRED {
                if *policy == first {
                    out.push_str(" — |");
                    continue;
                }
                let a: Vec<f64> = pairs.iter().map(|(a, _)| f(a)).collect();
                let b: Vec<f64> = pairs.iter().map(|(_, b)| f(b)).collect();
                let p = Interval::paired(&a, &b);
                if !p.half_width.is_finite() {
                    let _ = write!(out, " {:+.digits$} |", p.mean);
                } else {
                    let word = if !p.significant() {
                        "same"
                    } else if p.mean > 0.0 {
                        "higher"
                    } else {
                        "lower"
                    };
                    let _ = write!(
                        out,
                        " {:+.digits$} [{:+.digits$}, {:+.digits$}] {word} |",
                        p.mean,
                        p.mean - p.half_width,
                        p.mean + p.half_width
                    );
                }
            }
            out.push('\n');
        }
    }
    out
}

fn comparison(scenario: &str, results: &[&RunResult]) -> String {
    let mut policies: Vec<&str> = results.iter().map(|r| r.policy.as_str()).collect();
    policies.dedup();
    let rows: Vec<(&str, Vec<(f64, f64)>)> = policies
        .iter()
        .map(|p| {
            let runs: Vec<&Metrics> = results
                .iter()
                .filter(|r| r.policy == *p)
                .map(|r| &r.metrics)
                .collect();
            let stats = METRICS
                .iter()
                .map(|(_, f, _, _)| mean_sd(&runs.iter().map(|m| f(m)).collect::<Vec<_>>()))
                .collect();
            (*p, stats)
        })
        .collect();
    let seeds = results.iter().filter(|r| r.policy == policies[0]).count();
    let mut html = format!(
        "<table class=\"compare\"><caption>{} — policies side by side, mean ± standard deviation over {seeds} seed{}</caption>\n<tr><th>policy</th>",
        escape(scenario),
        if seeds == 1 { "" } else { "s" }
    );
    for (name, ..) in METRICS {
        let _ = write!(html, "<th>{name}</th>");
    }
    html.push_str("</tr>\n");
    for (policy, stats) in &rows {
        let _ = write!(html, "<tr><th>{}</th>", escape(policy));
        for (k, (mean, sd)) in stats.iter().enumerate() {
            let (_, _, digits, higher_is_better) = METRICS[k];
            let best = rows.len() > 1
                && rows.iter().all(|(_, o)| {
                    if higher_is_better {
                        o[k].0 <= *mean
                    } else {
                        o[k].0 >= *mean
                    }
                });
            let cell = format!("{mean:.digits$} ± {sd:.digits$}");
            if best {
                let _ = write!(html, "<td><b>{cell}</b></td>");
            } else {
                let _ = write!(html, "<td>{cell}</td>");
            }
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</table>\n");
    html
}

/// For a scenario run under several policies: its chips allocated and its queue over time,
/// one line per policy on the same axes, on the first seed they all ran. Returns the files
/// written (none for a single policy).
fn policies_on_the_same_axes(
    dir: &Path,
    scenario: &str,
    runs: &[&RunResult],
) -> Result<Vec<String>, String> {
    let policies = first_seen(runs.iter().map(|r| r.policy.as_str()));
    let seed = runs.iter().map(|r| r.seed).find(|s| {
        policies
            .iter()
            .all(|p| runs.iter().any(|r| r.policy == *p && r.seed == *s))
    });
    let (true, Some(seed)) = (policies.len() > 1, seed) else {
        return Ok(Vec::new());
    };
    let of = |p: &str| {
        runs.iter()
            .find(|r| r.policy == p && r.seed == seed)
            .expect("ran")
    };
    let stem = crate::spec::names::slug(scenario);
    let mut files = Vec::new();
    for (what, label, value) in [
        (
            "chips",
            "chips allocated",
            (|s: &Sample| s.allocated_chips as f64) as fn(&Sample) -> f64,
        ),
        ("queue", "jobs waiting", |s: &Sample| s.queue as f64),
    ] {
        let lines: Vec<Line<'_>> = policies
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let points = of(p).series.iter().map(|s| (s.hours, value(s))).collect();
                (*p, PALETTE[(2 * i) % PALETTE.len()], points)
            })
            .collect();
        let name = format!("{stem}-policies-{what}.svg");
        plot_lines(
            &dir.join(&name),
            &format!("{label}, each policy on seed {seed}"),
            label,
            &lines,
            &[],
            &[],
        )?;
        files.push(name);
    }
    Ok(files)
}

/// Writes SVG plots for every run and an `index.html` tying them together (how it was
/// made, a comparison of the policies of each scenario, the table, then every run's plots,
/// with a table of contents when there are several), after removing an earlier report's
/// pages and plots from `dir`.
pub fn write_dir(dir: &Path, results: &[RunResult], context: &Context) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    // An earlier report's pages and plots go first: none of them may outlive this run.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let ours = path.extension().is_some_and(|x| x == "svg")
                || path.file_name().is_some_and(|n| n == "index.html");
            if ours && path.is_file() {
                std::fs::remove_file(&path)
                    .map_err(|e| format!("cannot remove the old `{}`: {e}", path.display()))?;
            }
        }
    }
    std::fs::write(
        dir.join(MARKER),
        "a report written by tpu-runner simulate\n",
    )
    .map_err(|e| format!("cannot write in `{}`: {e}", dir.display()))?;
    let mut html = String::from(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>tpu-runner simulation report</title>\n<style>\nbody{font-family:sans-serif;margin:1em 2em;line-height:1.4}\npre{background:#f6f6f6;padding:1em;overflow-x:auto}\n.wide{overflow-x:auto}\ntable.compare{border-collapse:collapse;margin:1em 0}\ntable.compare th,table.compare td{border:1px solid #ccc;padding:.3em .6em;text-align:right;white-space:nowrap}\ntable.compare caption{text-align:left;font-weight:bold;padding:.3em 0}\nimg{max-width:100%;height:auto}\n@media (max-width:600px){body{margin:.5em}}\n</style></head><body>\n<h1>tpu-runner simulation report</h1>\n",
    );
    let _ = writeln!(
        html,
        "<p class=\"made\">Made by <code>{}</code> at {}.</p>",
        escape(&context.command),
        escape(&context.generated_at)
    );
    let mut scenarios: Vec<&str> = results.iter().map(|r| r.scenario.as_str()).collect();
    scenarios.dedup();
    html.push_str("<h2 id=\"comparison\">Policies compared</h2>\n");
    for scenario in &scenarios {
        if let Some(d) = context.descriptions.get(*scenario) {
            let _ = writeln!(html, "<p><b>{}</b>: {}</p>", escape(scenario), escape(d));
        }
        let runs: Vec<&RunResult> = results.iter().filter(|r| r.scenario == *scenario).collect();
        let _ = writeln!(
            html,
            "<div class=\"wide\">{}</div>",
            comparison(scenario, &runs)
        );
        for f in policies_on_the_same_axes(dir, scenario, &runs)? {
            let _ = writeln!(html, "<img src=\"{f}\" alt=\"{f}\" width=\"900\"><br>");
        }
    }
    let paired = paired_comparisons(results);
    if !paired.is_empty() {
        let _ = writeln!(
            html,
            "<h3>Paired on the same seeds, with 95 % confidence intervals</h3>\n<pre>{}</pre>",
            escape(paired.trim_start())
        );
    }
    html.push_str("<h2 id=\"table\">Every scenario and policy</h2>\n");
    let _ = writeln!(html, "<pre>{}</pre>", escape(&table(results)));
    let anchor = |r: &RunResult| {
        format!(
            "{}-{}-seed{}",
            crate::spec::names::slug(&r.scenario),
            r.policy,
            r.seed
        )
    };
    if results.len() > 1 {
        html.push_str("<h2 id=\"runs\">Runs</h2>\n<ul class=\"toc\">\n");
        for r in results {
            let _ = writeln!(
                html,
                "<li><a href=\"#{}\">{} · {} · seed {}</a></li>",
                anchor(r),
                escape(&r.scenario),
                escape(&r.policy),
                r.seed
            );
        }
        html.push_str("</ul>\n");
    }
    let no_limits = ChipLimits::default();
    for r in results {
        let stem = anchor(r);
        let limits = context.chip_limits.get(&r.scenario).unwrap_or(&no_limits);
        let files = plots_for(dir, &stem, &r.series, limits)?;
        let _ = writeln!(
            html,
            "<h3 id=\"{stem}\">{} · {} · seed {}</h3>",
            escape(&r.scenario),
            escape(&r.policy),
            r.seed
        );
        let m = &r.metrics;
        let _ = writeln!(
            html,
            "<p>utilisation {:.2}, goodput ratio {:.2}, efficiency {:.2} of the bound ({:.0} of {:.0} chip-hours); {} succeeded, {} failed, {} unfinished; {} preemptions; cost ${:.0}</p>",
            m.utilization,
            m.goodput_ratio,
            m.efficiency,
            m.goodput_chip_hours,
            m.bound_goodput_chip_hours,
            m.jobs_succeeded,
            m.jobs_failed,
            m.jobs_unfinished,
            m.preemptions,
            m.cost_usd
        );
        for f in files {
            let _ = writeln!(html, "<img src=\"{f}\" alt=\"{f}\" width=\"900\"><br>");
        }
    }
    html.push_str("</body></html>\n");
    std::fs::write(dir.join("index.html"), html)
        .map_err(|e| format!("cannot write the report: {e}"))?;
    std::fs::write(dir.join("results.json"), json(results))
        .map_err(|e| format!("cannot write the report: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chip_limits_cap_each_quota_key_and_are_drawn_per_zone() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scenarios/fleets/trc-mixed.yaml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let fleet = crate::spec::fleet::parse_fleet(path, &text).unwrap();
        let limits = ChipLimits::of(&fleet);
        // Two adopted on-demand v4-32 (16 chips each: a v4 name counts cores; limit 32), v6e
        // in us-east1-d (96 declared, limit 96), v6e in europe-west4-a (64, limit 64), v5e in
        // us-central1-a (64, limit 64), v5e in europe-west4-b (32, limit 32).
        assert_eq!(limits.fleet, 32 + 96 + 64 + 64 + 32);
        assert_eq!(
            limits.by_zone,
            BTreeMap::from([
                ("europe-west4-a".to_owned(), 64),
                ("europe-west4-b".to_owned(), 32),
                ("us-central1-a".to_owned(), 64),
                ("us-central2-b".to_owned(), 32),
                ("us-east1-d".to_owned(), 96),
            ])
        );
        // A limit above what the entries declare caps nothing: the fleet holds what it
        // declares.
        let mut roomy = fleet.clone();
        roomy.tpus.iter_mut().for_each(|e| e.chip_limit *= 2);
        assert_eq!(ChipLimits::of(&roomy).fleet, limits.fleet);
    }
}
