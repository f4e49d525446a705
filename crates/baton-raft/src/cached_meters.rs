//! Metric handles looked up once per call site, for the paths every request takes.
//!
//! Why: `metrics::counter!(…)` and its kin look their handle up in the exporter's registry
//! on every use — a SipHash of the name and labels and a probe of a sharded map — and drop it
//! again. On the write path that was ~44 hashes per put on a leader (callgrind, issue 19). A
//! handle is an `Arc` into the registry's storage for that name and label set, so keeping
//! it records into exactly the same series.
//!
//! Inside baton-raft the macros are in scope by name (`cached_counter!(…)`, `#[macro_use]`
//! in lib.rs); other crates write `baton_raft::cached_counter!(…)`.
//!
//! Only literal names and label values are accepted: a handle cached with a label value
//! computed at run time would record every later value under the first one.
//!
//! The rule this relies on: a process installs its recorder before any code that records
//! runs (`baton serve` installs it before it opens the member). A handle taken before that
//! would stay a no-op for the life of the process; processes without a recorder (tests,
//! `baton snapshot restore`) record nothing either way.

/// A counter handle for a literal name and literal labels, looked up on first use.
#[macro_export]
macro_rules! cached_counter {
    ($name:literal $(, $key:literal => $value:literal)* $(,)?) => {{
        static HANDLE: ::std::sync::OnceLock<::metrics::Counter> = ::std::sync::OnceLock::new();
        HANDLE.get_or_init(|| ::metrics::counter!($name $(, $key => $value)*))
    }};
}

/// A histogram handle for a literal name and literal labels, looked up on first use.
#[macro_export]
macro_rules! cached_histogram {
    ($name:literal $(, $key:literal => $value:literal)* $(,)?) => {{
        static HANDLE: ::std::sync::OnceLock<::metrics::Histogram> =
            ::std::sync::OnceLock::new();
        HANDLE.get_or_init(|| ::metrics::histogram!($name $(, $key => $value)*))
    }};
}

/// A gauge handle for a literal name and literal labels, looked up on first use.
#[macro_export]
macro_rules! cached_gauge {
    ($name:literal $(, $key:literal => $value:literal)* $(,)?) => {{
        static HANDLE: ::std::sync::OnceLock<::metrics::Gauge> = ::std::sync::OnceLock::new();
        HANDLE.get_or_init(|| ::metrics::gauge!($name $(, $key => $value)*))
    }};
}

#[cfg(test)]
mod tests {
    use metrics::{
        Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
        SharedString, Unit,
    };
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    /// Counts registrations and what reaches the handles.
    #[derive(Default)]
    struct Probe {
        registered: Mutex<Vec<String>>,
        value: Arc<AtomicU64>,
    }

    struct Sink(Arc<AtomicU64>);
    impl CounterFn for Sink {
        fn increment(&self, v: u64) {
            self.0.fetch_add(v, Ordering::Relaxed);
        }
        fn absolute(&self, v: u64) {
            self.0.store(v, Ordering::Relaxed);
        }
    }
    impl HistogramFn for Sink {
        fn record(&self, v: f64) {
            self.0.fetch_add(v as u64, Ordering::Relaxed);
        }
    }

    impl Recorder for Probe {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.registered.lock().unwrap().push(format!("{key:?}"));
            Counter::from_arc(Arc::new(Sink(self.value.clone())))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            self.registered.lock().unwrap().push(format!("{key:?}"));
            Histogram::from_arc(Arc::new(Sink(self.value.clone())))
        }
    }

    #[test]
    fn a_call_site_registers_once_and_records_every_time() {
        let probe = Probe::default();
        metrics::with_local_recorder(&probe, || {
            for _ in 0..3 {
                cached_counter!("cached_meters_test_total", "outcome" => "sent").increment(2);
                cached_histogram!("cached_meters_test_seconds").record(10.0);
            }
        });
        let registered = probe.registered.lock().unwrap().clone();
        assert_eq!(
            registered.len(),
            2,
            "one lookup per call site: {registered:?}"
        );
        assert!(
            registered[0].contains("cached_meters_test_total") && registered[0].contains("sent")
        );
        assert_eq!(probe.value.load(Ordering::Relaxed), 3 * 2 + 3 * 10);
    }
}
