//! The side-by-side report: rows of medians with the Baton/etcd ratio and the target each
//! must meet, rendered as markdown (`bench/RESULTS.md`) and as a hand-written SVG bar chart
//! (`bench/results.svg`).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::bench::fmt_ms;
use crate::report::{median, Binary, Disk};
use crate::server::{Kind, Topology};

/// What a row must reach.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "value")]
pub enum Target {
    /// Baton/etcd ≥ x (throughput).
    RatioAtLeast(f64),
    /// Baton/etcd ≤ x (memory).
    RatioAtMost(f64),
    /// Baton's value < x (CPU %).
    BatonBelow(f64),
    /// Baton's value ≤ x (failover ms; etcd's is shown for comparison).
    BatonAtMost(f64),
}

impl Target {
    pub fn text(&self, unit: &str) -> String {
        match *self {
            Target::RatioAtLeast(x) => format!("≥{}×", trim(x)),
            Target::RatioAtMost(x) if (x - 1.0 / 3.0).abs() < 1e-9 => "≤⅓×".into(),
            Target::RatioAtMost(x) => format!("≤{}×", trim(x)),
            Target::BatonBelow(x) => format!("baton <{} {unit}", trim(x)),
            Target::BatonAtMost(x) => format!("baton ≤{} {unit}", trim(x)),
        }
    }

    /// Whether Baton's value or the Baton/etcd ratio meets it.
    pub fn met(&self, baton: Option<f64>, ratio: Option<f64>) -> Option<bool> {
        match *self {
            Target::RatioAtLeast(x) => ratio.map(|r| r >= x),
            Target::RatioAtMost(x) => ratio.map(|r| r <= x),
            Target::BatonBelow(x) => baton.map(|b| b < x),
            Target::BatonAtMost(x) => baton.map(|b| b <= x),
        }
    }

    /// The target as a Baton advantage (×, higher is better) for the chart, if it is a ratio.
    fn advantage(&self) -> Option<f64> {
        match *self {
            Target::RatioAtLeast(x) => Some(x),
            Target::RatioAtMost(x) => Some(1.0 / x),
            _ => None,
        }
    }
}

fn trim(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

/// One measurement of one row on one server in one round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sample {
    pub topology: Topology,
    /// The row's id, e.g. `put-100`.
    pub row: String,
    pub server: Kind,
    pub round: usize,
    /// The row's metric.
    pub value: f64,
    /// Latency p50 / p99 (ms) where the row has one.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The full run, where the row is a client run (not for RSS or failover).
    pub run: Option<crate::engine::RunResult>,
    /// Share of all CPU time the hypervisor stole during the run, in percent (client runs;
    /// see [`crate::steal`]). Absent in results written before it was recorded.
    #[serde(default)]
    pub steal_pct: Option<f64>,
}

/// What a row is: how to label it and read it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RowSpec {
    pub id: String,
    pub label: String,
    /// e.g. `ops/s`, `MiB`, `% of a core`, `ms`.
    pub unit: String,
    pub lower_is_better: bool,
    pub target: Option<Target>,
}

/// One line of a table: medians over rounds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub topology: Topology,
    #[serde(flatten)]
    pub spec: RowSpec,
    pub etcd: Option<f64>,
    pub baton: Option<f64>,
    pub etcd_p50_ms: Option<f64>,
    pub baton_p50_ms: Option<f64>,
    pub etcd_p99_ms: Option<f64>,
    pub baton_p99_ms: Option<f64>,
    /// Baton / etcd.
    pub ratio: Option<f64>,
    pub met: Option<bool>,
    pub rounds: usize,
}

impl Row {
    /// Medians of `samples` (all of this row and topology).
    pub fn from_samples(topology: Topology, spec: RowSpec, samples: &[&Sample]) -> Row {
        let med = |kind: Kind, f: &dyn Fn(&Sample) -> Option<f64>| {
            let v: Vec<f64> = samples
                .iter()
                .filter(|s| s.server == kind)
                .filter_map(|s| f(s))
                .collect();
            (!v.is_empty()).then(|| median(v.into_iter()))
        };
        let etcd = med(Kind::Etcd, &|s| Some(s.value));
        let baton = med(Kind::Baton, &|s| Some(s.value));
        let ratio = match (etcd, baton) {
            (Some(e), Some(b)) if e > 0.0 => Some(b / e),
            _ => None,
        };
        let met = spec.target.and_then(|t| t.met(baton, ratio));
        let rounds = samples.iter().map(|s| s.round + 1).max().unwrap_or(0);
        Row {
            topology,
            etcd,
            baton,
            etcd_p50_ms: med(Kind::Etcd, &|s| s.p50_ms),
            baton_p50_ms: med(Kind::Baton, &|s| s.p50_ms),
            etcd_p99_ms: med(Kind::Etcd, &|s| s.p99_ms),
            baton_p99_ms: med(Kind::Baton, &|s| s.p99_ms),
            ratio,
            met,
            rounds,
            spec,
        }
    }

    /// How much better Baton is (×, higher is better whatever the metric): the ratio, or its
    /// inverse for lower-is-better metrics.
    pub fn advantage(&self) -> Option<f64> {
        let r = self.ratio?;
        if self.spec.lower_is_better {
            (r > 0.0).then(|| 1.0 / r)
        } else {
            Some(r)
        }
    }
}

/// Where and with what the benchmark ran.
#[derive(Debug, Serialize, Deserialize)]
pub struct Meta {
    /// When the report was made: the end of the run.
    pub date_utc: String,
    /// `git rev-parse --short HEAD`, with `-dirty` if tracked files differ from it.
    pub commit: String,
    pub nproc: usize,
    pub cpu_model: Option<String>,
    pub mem_total_bytes: Option<u64>,
    pub load_average: Option<String>,
    /// Share of all CPU time the hypervisor stole over the whole benchmark, in percent.
    #[serde(default)]
    pub steal_pct: Option<f64>,
    pub disk: Disk,
    pub etcd: Option<Binary>,
    pub baton: Option<Binary>,
    /// Free text: the settings both servers got, durations, rounds.
    pub settings: Vec<String>,
    pub command: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub meta: Meta,
    pub rows: Vec<Row>,
    /// Things the reader must know (runs that failed, skipped parts).
    pub notes: Vec<String>,
    pub samples: Vec<Sample>,
}

/// A value in a table cell: integers for big numbers, more digits for small ones.
pub fn fmt_value(v: f64, unit: &str) -> String {
    if unit == "ms" && v < 100.0 {
        return fmt_ms(v);
    }
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "–".into())
}

impl Report {
    pub fn markdown(&self, svg_name: Option<&str>) -> String {
        let m = &self.meta;
        let mut out = String::new();
        let _ = writeln!(out, "# Benchmark results: Baton vs etcd\n");
        let _ = writeln!(
            out,
            "Produced by `{}` (see [README.md](README.md)). Ratios are Baton/etcd from this \
             one run, servers run alternately on the same machine with the same client. \
             Medians over rounds.\n",
            m.command
        );
        // Taken when the report is written: the run's end, not its start.
        let _ = writeln!(out, "- date: {} (the end of the run)", m.date_utc);
        let _ = writeln!(out, "- commit: {}", m.commit);
        let mem = m
            .mem_total_bytes
            .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_else(|| "unknown".into());
        let _ = writeln!(
            out,
            "- machine: nproc {}, {}, {mem} memory; servers and the client share these cores{}",
            m.nproc,
            m.cpu_model.as_deref().unwrap_or("unknown CPU"),
            m.load_average
                .as_deref()
                .map(|l| format!(" (load average at the start: {l})"))
                .unwrap_or_default()
        );
        if let Some(steal) = m.steal_pct {
            let _ = writeln!(
                out,
                "- CPU time stolen by the hypervisor over the whole run: {steal:.1} % (runs \
                 with {:.0} % or more are named in the notes)",
                crate::steal::NOTABLE_STEAL_PCT
            );
        }
        let d = &m.disk;
        let _ = writeln!(
            out,
            "- disk: data in {} on {} ({}, {}); fdatasync of 4 KiB: p50 {} µs, p99 {} µs",
            d.data_root.display(),
            d.device.as_deref().unwrap_or("?"),
            d.fstype.as_deref().unwrap_or("?"),
            match d.rotational {
                Some(true) => "rotational",
                Some(false) => "non-rotational",
                None => "rotational?",
            },
            opt(d.fdatasync_p50_us, |v| format!("{v:.0}")),
            opt(d.fdatasync_p99_us, |v| format!("{v:.0}")),
        );
        for (name, bin) in [("etcd", &m.etcd), ("baton", &m.baton)] {
            if let Some(bin) = bin {
                let _ = writeln!(
                    out,
                    "- {name}: `{}` ({})",
                    bin.path.display(),
                    bin.version.as_deref().unwrap_or("version unknown")
                );
            }
        }
        for s in &m.settings {
            let _ = writeln!(out, "- {s}");
        }
        let _ = writeln!(out);
        if let Some(svg) = svg_name {
            let _ = writeln!(out, "![Baton/etcd per workload]({svg})\n");
        }
        for topology in [Topology::Single, Topology::Cluster] {
            let rows: Vec<&Row> = self
                .rows
                .iter()
                .filter(|r| r.topology == topology)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(out, "## {}\n", heading(topology));
            let _ = writeln!(
                out,
                "| workload | unit | etcd | baton | baton/etcd | target | met | etcd p50 / p99 ms | baton p50 / p99 ms |"
            );
            let _ = writeln!(out, "|---|---|--:|--:|--:|---|---|--:|--:|");
            for r in rows {
                let unit = &r.spec.unit;
                let lat = |p50: Option<f64>, p99: Option<f64>| match (p50, p99) {
                    (Some(a), Some(b)) => format!("{} / {}", fmt_ms(a), fmt_ms(b)),
                    _ => "–".into(),
                };
                let _ = writeln!(
                    out,
                    "| {} | {unit} | {} | {} | {} | {} | {} | {} | {} |",
                    r.spec.label,
                    opt(r.etcd, |v| fmt_value(v, unit)),
                    opt(r.baton, |v| fmt_value(v, unit)),
                    opt(r.ratio, |v| format!("{v:.2}")),
                    r.spec
                        .target
                        .map(|t| t.text(unit))
                        .unwrap_or_else(|| "–".into()),
                    match r.met {
                        Some(true) => "met",
                        Some(false) => "**not met**",
                        None => "–",
                    },
                    lat(r.etcd_p50_ms, r.etcd_p99_ms),
                    lat(r.baton_p50_ms, r.baton_p99_ms),
                );
            }
            let _ = writeln!(out);
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out, "Notes:\n");
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
            let _ = writeln!(out);
        }
        out
    }

    /// A horizontal bar chart of Baton's advantage per row (the ratio, inverted for
    /// lower-is-better rows so longer is always better), log scale, with each row's target
    /// as a tick and 1× as a line.
    pub fn svg(&self) -> String {
        let rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.advantage().is_some())
            .collect();
        let bar_h = 18.0;
        let gap = 6.0;
        // Room for the longest label at ~6.6 px per character of 12 px sans-serif.
        let label_w = rows
            .iter()
            .map(|r| r.spec.label.chars().count() + 12)
            .max()
            .unwrap_or(20) as f64
            * 6.6
            + 10.0;
        let plot_w = 420.0;
        let top = 40.0;
        let height = top + rows.len() as f64 * (bar_h + gap) + 40.0;
        let width = label_w + plot_w + 90.0;
        // Log scale from 0.1× to the largest advantage or target (at least 10×).
        let max = rows
            .iter()
            .flat_map(|r| [r.advantage(), r.spec.target.and_then(|t| t.advantage())])
            .flatten()
            .fold(10.0f64, f64::max);
        let (lo, hi) = (0.1f64.log10(), max.log10() + 0.1);
        let x = |v: f64| label_w + (v.max(0.1).log10() - lo) / (hi - lo) * plot_w;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            s,
            r##"<rect width="100%" height="100%" fill="#ffffff"/>
<text x="10" y="20" font-size="14" font-weight="bold">Baton vs etcd: Baton's advantage (×, log scale; lower-is-better metrics inverted)</text>"##
        );
        // grid: 0.1, 1, 10, 100 …
        let mut g = 0.1;
        while g <= max * 1.01 {
            let gx = x(g);
            let (stroke, w) = if (g - 1.0f64).abs() < 1e-9 {
                ("#333333", 1.5)
            } else {
                ("#dddddd", 1.0)
            };
            let _ = writeln!(
                s,
                r##"<line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{:.1}" stroke="{stroke}" stroke-width="{w}"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle" fill="#555555">{}×</text>"##,
                top - 8.0,
                height - 30.0,
                height - 14.0,
                trim(g)
            );
            g *= 10.0;
        }
        for (i, r) in rows.iter().enumerate() {
            let y = top + i as f64 * (bar_h + gap);
            let adv = r.advantage().expect("filtered");
            let color = match r.met {
                Some(true) => "#2e7d32",
                Some(false) => "#c62828",
                None => "#1565c0",
            };
            let topo = match r.topology {
                Topology::Single => "1 node",
                Topology::Cluster => "3 members",
            };
            let (x0, x1) = (x(1.0).min(x(adv)), x(1.0).max(x(adv)));
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{} ({topo})</text>"#,
                label_w - 8.0,
                y + bar_h * 0.75,
                xml_escape(&r.spec.label)
            );
            let _ = writeln!(
                s,
                r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{bar_h}" fill="{color}"/>"#,
                (x1 - x0).max(1.0)
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}">{adv:.2}×</text>"#,
                x(adv).max(x(1.0)) + 4.0,
                y + bar_h * 0.75
            );
            if let Some(t) = r.spec.target.and_then(|t| t.advantage()) {
                let tx = x(t);
                let _ = writeln!(
                    s,
                    r##"<line x1="{tx:.1}" y1="{:.1}" x2="{tx:.1}" y2="{:.1}" stroke="#000000" stroke-width="2" stroke-dasharray="3,2"/>"##,
                    y - 2.0,
                    y + bar_h + 2.0
                );
            }
        }
        let _ = writeln!(
            s,
            r##"<text x="10" y="{:.1}" fill="#555555">green: target met, red: not met, blue: no ratio target; dashed tick: the target</text>"##,
            height - 2.0
        );
        s.push_str("</svg>\n");
        s
    }
}

fn heading(t: Topology) -> &'static str {
    match t {
        Topology::Single => "Single node",
        Topology::Cluster => "3 members on loopback",
    }
}

pub fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(server: Kind, round: usize, value: f64) -> Sample {
        Sample {
            topology: Topology::Single,
            row: "put-100".into(),
            server,
            round,
            value,
            p50_ms: Some(1.0),
            p99_ms: Some(value / 100.0),
            run: None,
            steal_pct: None,
        }
    }

    fn spec(lower: bool, target: Option<Target>) -> RowSpec {
        RowSpec {
            id: "put-100".into(),
            label: "put, 100 clients / 10 conns".into(),
            unit: if lower { "MiB" } else { "ops/s" }.into(),
            lower_is_better: lower,
            target,
        }
    }

    #[test]
    fn rows_take_medians_and_ratios() {
        let samples = [
            sample(Kind::Etcd, 0, 100.0),
            sample(Kind::Baton, 0, 300.0),
            sample(Kind::Etcd, 1, 200.0),
            sample(Kind::Baton, 1, 500.0),
            sample(Kind::Etcd, 2, 150.0),
            sample(Kind::Baton, 2, 450.0),
        ];
        let refs: Vec<&Sample> = samples.iter().collect();
        let row = Row::from_samples(
            Topology::Single,
            spec(false, Some(Target::RatioAtLeast(3.0))),
            &refs,
        );
        assert_eq!(row.etcd, Some(150.0));
        assert_eq!(row.baton, Some(450.0));
        assert_eq!(row.ratio, Some(3.0));
        assert_eq!(row.met, Some(true));
        assert_eq!(row.rounds, 3);
        assert_eq!(row.etcd_p99_ms, Some(1.5));
        assert_eq!(row.advantage(), Some(3.0));
    }

    #[test]
    fn targets() {
        assert_eq!(Target::RatioAtLeast(2.0).met(None, Some(1.9)), Some(false));
        assert_eq!(
            Target::RatioAtMost(1.0 / 3.0).met(None, Some(0.3)),
            Some(true)
        );
        assert_eq!(Target::RatioAtMost(1.0 / 3.0).text("MiB"), "≤⅓×");
        assert_eq!(Target::BatonBelow(5.0).met(Some(4.0), None), Some(true));
        assert_eq!(
            Target::BatonBelow(5.0).text("% of a core"),
            "baton <5 % of a core"
        );
        assert_eq!(
            Target::BatonAtMost(1000.0).met(Some(1100.0), None),
            Some(false)
        );
        assert_eq!(
            Target::BatonAtMost(1000.0).met(Some(800.0), None),
            Some(true)
        );
        assert_eq!(Target::BatonAtMost(1000.0).met(None, None), None);
        assert_eq!(Target::RatioAtLeast(1.5).text("ops/s"), "≥1.5×");
    }

    #[test]
    fn lower_is_better_rows_invert_for_the_chart() {
        let samples = [sample(Kind::Etcd, 0, 300.0), sample(Kind::Baton, 0, 100.0)];
        let refs: Vec<&Sample> = samples.iter().collect();
        let row = Row::from_samples(
            Topology::Single,
            spec(true, Some(Target::RatioAtMost(1.0 / 3.0))),
            &refs,
        );
        assert!((row.ratio.unwrap() - 1.0 / 3.0).abs() < 1e-12);
        assert!((row.advantage().unwrap() - 3.0).abs() < 1e-9);
    }

    fn report(rows: Vec<Row>) -> Report {
        Report {
            meta: Meta {
                date_utc: "2026-11-30 10:00:00 UTC".into(),
                commit: "abc1234-dirty".into(),
                nproc: 2,
                cpu_model: Some("Test CPU".into()),
                mem_total_bytes: Some(4 << 30),
                load_average: Some("0.10 0.20 0.30".into()),
                steal_pct: Some(3.5),
                disk: Disk {
                    data_root: "/d".into(),
                    device: Some("/dev/vda".into()),
                    fstype: Some("ext4".into()),
                    rotational: Some(false),
                    fdatasync_p50_us: Some(250.0),
                    fdatasync_p99_us: Some(900.0),
                },
                etcd: None,
                baton: None,
                settings: vec!["fsync on".into()],
                command: "scripts/bench --quick".into(),
            },
            rows,
            notes: vec!["a note".into()],
            samples: vec![],
        }
    }

    #[test]
    fn markdown_has_header_tables_and_targets() {
        let samples = [
            sample(Kind::Etcd, 0, 1000.0),
            sample(Kind::Baton, 0, 2500.0),
        ];
        let refs: Vec<&Sample> = samples.iter().collect();
        let row = Row::from_samples(
            Topology::Single,
            spec(false, Some(Target::RatioAtLeast(3.0))),
            &refs,
        );
        let md = report(vec![row]).markdown(Some("results.svg"));
        assert!(md.contains("- commit: abc1234-dirty\n"), "{md}");
        assert!(
            md.contains("- CPU time stolen by the hypervisor over the whole run: 3.5 %"),
            "{md}"
        );
        assert!(
            md.contains("fdatasync of 4 KiB: p50 250 µs, p99 900 µs"),
            "{md}"
        );
        assert!(
            md.contains("![Baton/etcd per workload](results.svg)"),
            "{md}"
        );
        assert!(md.contains("## Single node"), "{md}");
        assert!(!md.contains("## 3 members"), "{md}");
        assert!(
            md.contains("| put, 100 clients / 10 conns | ops/s | 1000 | 2500 | 2.50 | ≥3× | **not met** | 1.00 / 10.00 | 1.00 / 25.00 |"),
            "{md}"
        );
        assert!(md.contains("- a note"), "{md}");
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let samples = [
            sample(Kind::Etcd, 0, 1000.0),
            sample(Kind::Baton, 0, 4000.0),
        ];
        let refs: Vec<&Sample> = samples.iter().collect();
        let mut row = Row::from_samples(
            Topology::Cluster,
            spec(false, Some(Target::RatioAtLeast(3.0))),
            &refs,
        );
        row.spec.label = "a <b> & c".into();
        let svg = report(vec![row]).svg();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &lt;b&gt; &amp; c (3 members)"));
        assert!(svg.contains("4.00×"));
        assert!(svg.contains("#2e7d32"), "met → green");
        assert!(svg.contains("stroke-dasharray"), "target tick");
        // Every opened element is closed (all are self-closing or have a closing tag).
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }
}
