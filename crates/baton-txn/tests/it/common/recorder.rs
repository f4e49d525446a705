//! A metrics recorder for tests: installed once per test binary as the global recorder, it
//! keeps the last value of every gauge and counter and the number of values each histogram
//! recorded, by `name{label=value,…}` (labels sorted).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Counts a histogram's values.
struct Observations(Arc<AtomicU64>);

impl metrics::HistogramFn for Observations {
    fn record(&self, _value: f64) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
pub struct Recorded(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Recorded {
    fn slot(&self, key: &metrics::Key) -> Arc<AtomicU64> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.0.lock().unwrap().entry(name).or_default().clone()
    }

    /// How many values a histogram recorded.
    pub fn observations(&self, name: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(name)
            .map(|s| s.load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    /// The last value of a gauge (or a counter's count as bits), by `name{label=value,…}`.
    pub fn gauge(&self, name: &str) -> Option<f64> {
        let slot = self.0.lock().unwrap().get(name).cloned()?;
        Some(f64::from_bits(slot.load(Ordering::SeqCst)))
    }
}

impl metrics::Recorder for &'static Recorded {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.slot(key))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(self.slot(key))
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::from_arc(Arc::new(Observations(self.slot(key))))
    }
}

pub fn recorded() -> &'static Recorded {
    static R: OnceLock<&'static Recorded> = OnceLock::new();
    R.get_or_init(|| {
        let r: &'static Recorded = Box::leak(Box::default());
        metrics::set_global_recorder(r).expect("the only recorder of this test binary");
        r
    })
}
