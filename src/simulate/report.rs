//! Reports of simulated runs: an aligned table (mean ± spread over seeds), JSON records with
//! a documented schema, and a directory of SVG plots tied together by an HTML page. Pure
//! formatting except `write_dir`, which writes the report files.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::harness::{RunResult, Sample};
use super::metrics::Metrics;

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
    crate::cli::table(&header, &rows)
}

/// One line of a plot: legend, colour, points.
type Line<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

fn plot_lines(path: &Path, title: &str, y_label: &str, series: &[Line<'_>]) -> Result<(), String> {
    let x_max = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|(x, _)| *x))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let y_max = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|(_, y)| *y))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;
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
    chart
        .configure_mesh()
        .x_desc("hours")
        .y_desc(y_label)
        .draw()
        .map_err(|e| err(&e))?;
    for (name, color, points) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
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

fn plots_for(dir: &Path, stem: &str, samples: &[Sample]) -> Result<Vec<String>, String> {
    let chips = dir.join(format!("{stem}-chips.svg"));
    plot_lines(
        &chips,
        "chips allocated and busy",
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
        ],
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
    )?;
    let zones: Vec<String> = samples
        .first()
        .map(|s| s.capacity_by_zone.keys().cloned().collect())
        .unwrap_or_default();
    let capacity = dir.join(format!("{stem}-capacity.svg"));
    let series: Vec<Line<'_>> = zones
        .iter()
        .take(PALETTE.len())
        .enumerate()
        .map(|(i, z)| {
            (
                z.as_str(),
                PALETTE[i],
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
    plot_lines(
        &capacity,
        "spot capacity the fleet could use, per zone (chips)",
        "chips",
        &series,
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

/// Writes SVG plots for every run and an `index.html` tying them together, after removing
/// an earlier report's pages and plots from `dir`.
pub fn write_dir(dir: &Path, results: &[RunResult]) -> Result<(), String> {
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
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>tpu-runner simulation report</title>\n<style>body{font-family:sans-serif;margin:2em;max-width:1000px}pre{background:#f6f6f6;padding:1em;overflow:auto}</style></head><body>\n<h1>tpu-runner simulation report</h1>\n",
    );
    let _ = writeln!(html, "<pre>{}</pre>", escape(&table(results)));
    for r in results {
        let stem = format!(
            "{}-{}-seed{}",
            crate::spec::names::slug(&r.scenario),
            r.policy,
            r.seed
        );
        let files = plots_for(dir, &stem, &r.series)?;
        let _ = writeln!(
            html,
            "<h2>{} · {} · seed {}</h2>",
            escape(&r.scenario),
            escape(&r.policy),
            r.seed
        );
        let m = &r.metrics;
        let _ = writeln!(
            html,
            "<p>utilisation {:.2}, goodput ratio {:.2}, efficiency {:.2} of the bound ({:.0} of {:.0} chip-hours); {} succeeded, {} failed, {} unfinished; cost ${:.0}</p>",
            m.utilization,
            m.goodput_ratio,
            m.efficiency,
            m.goodput_chip_hours,
            m.bound_goodput_chip_hours,
            m.jobs_succeeded,
            m.jobs_failed,
            m.jobs_unfinished,
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
