//! Where a write runs: inline on the calling task, or in the batch loop.
//!
//! # Group commit
//! `append` updates the in-memory log (readable at once, as openraft requires), encodes the
//! records and hands them with openraft's `LogFlushed` callback to the batch loop. The loop
//! drains everything queued, writes it with one `write`, issues one `fdatasync`, and only
//! then acknowledges every callback. A small operation with nothing queued ahead of it is
//! written and fsynced right away on the calling task instead (see [`INLINE_MAX_BYTES`]: for
//! a lone writer the two thread hand-offs cost more than the thread saves). Note that
//! openraft 0.9 waits for each append's callback before issuing the next append, so on the
//! leader this queue rarely holds more than one append; proposals share fsyncs because the
//! `proposer` packs concurrent commands into one entry. The writer-side batching still
//! matters for records that need no acknowledgement (truncate, purge) and becomes effective
//! as is with an openraft that pipelines log I/O (0.10).
//!
//! # Thread or task
//! On the real disk the batch loop is an OS thread ([`run_thread`]). With an injected disk
//! (the simulation) it is a task on the replica's runtime ([`run_task`]), because no
//! simulation controls an OS thread's timing; the two differ only in how they wait for work
//! (and the task waits out an injected disk's latency before each batch). Both carry a batch
//! out with [`process_queued`], under the same lock the inline path takes, so the inline
//! path, the hand-off rules and the batching are the same code in both worlds.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::writer::{Op, Pending, WalStats, Writer};
use crate::env::LogDisk;

/// Appends up to this size are written and fsynced on the caller's thread (the Raft core
/// task) when nothing is queued for the writer thread; bigger ones go to the thread.
///
/// Why both: handing an append to the thread and its acknowledgement back costs two
/// cross-thread wake-ups, which on this project's 2-vCPU machine were a fifth of a lone
/// client's put latency (p50 0.40 → 0.33 ms inline; etcd 0.38–0.40 ms). Under load the
/// proposer packs many commands into each entry, appends get big, and blocking a runtime
/// worker for the fsync would idle a core the requests need, so those keep the thread. The
/// bound is a few commands' worth: at 8 KiB, 50 lock contenders' batches (≈5 KiB) went
/// inline and held the runtime's only worker through every fsync.
const INLINE_MAX_BYTES: usize = 2 << 10;
/// ... and only while the disk is quick: after an fsync slower than this, appends go to the
/// writer thread until one is quick again, so a stalling disk stalls Raft, not the runtime
/// worker that also serves reads, keep-alives and heartbeats.
const INLINE_MAX_FSYNC: Duration = Duration::from_millis(2);
/// Bounds on one group-commit batch, so a flood of appends cannot starve acknowledgements.
const MAX_BATCH_OPS: usize = 4096;
const MAX_BATCH_BYTES: usize = 32 << 20;

/// The writer as shared by the batch loop and [`Sink`]; `None` once stopped.
pub(super) struct SharedWriter {
    writer: Mutex<Option<Writer>>,
    /// Operations sent to the loop and not yet processed.
    queued: AtomicUsize,
    stats: Arc<WalStats>,
    /// The writer holds writes back on a full disk: nothing runs inline (a retry must not
    /// happen on the Raft core task, and order needs the backlog first).
    stalled: Arc<AtomicBool>,
    /// The writer thread's id (0 until it runs, and always with a task instead of a thread).
    writer_thread: AtomicI32,
    /// Whether the writer thread was put under `SCHED_BATCH` (see
    /// [`SharedWriter::writer_wakeups_do_not_preempt`]).
    writer_calmed: AtomicBool,
}

impl SharedWriter {
    pub(super) fn new(writer: Writer) -> Arc<Self> {
        Arc::new(SharedWriter {
            stats: writer.stats.clone(),
            stalled: writer.stalled.clone(),
            writer: Mutex::new(Some(writer)),
            queued: AtomicUsize::new(0),
            writer_thread: AtomicI32::new(0),
            writer_calmed: AtomicBool::new(false),
        })
    }

    /// Puts the writer thread under `SCHED_BATCH`, once, when the first append leaves for the
    /// followers before its own fsync (`early_append`): the same priority and CPU share, but
    /// waking it no longer preempts the thread that woke it.
    ///
    /// Why: the leader hands such an append to the writer thread and then, on the same
    /// runtime worker, sends the entries to its followers. The kernel often woke the writer
    /// on the worker's own CPU and ran it at once — its `pwrite` and the submission of its
    /// fdatasync, ~50 µs here — while the preempted worker held the AppendEntries back: on
    /// every replicated write's critical path, since a follower's fsync starts when the
    /// entries arrive (the leader's own fsync ends before the first answer either way). Not
    /// preempting, the worker sends first and the writer runs on the other CPU, or when the
    /// worker waits. Measured (3 members, this 2-vCPU machine, alternating runs of this
    /// change and its parent): put with 1 client through the leader 1746–1823
    /// ops/s against 1707–1723 (p50 0.518–0.536 ms against 0.546–0.562; `chrt -b` on the
    /// writer threads of the build without it: the same), through a follower within noise
    /// (1368–1521 against 1387–1462); 100 clients through the leader 32.1k–33.3k against
    /// 29.0k–31.6k. A single member never sends early and keeps the default policy: there
    /// the worker waits for the writer's fsync, and `SCHED_BATCH` cost 100 clients 3–4 % (a
    /// cluster shrunk to one member keeps the policy its writer had).
    fn writer_wakeups_do_not_preempt(&self) {
        if self.writer_calmed.load(Ordering::Relaxed) {
            return;
        }
        let tid = self.writer_thread.load(Ordering::Acquire);
        if tid == 0 || self.writer_calmed.swap(true, Ordering::AcqRel) {
            return;
        }
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler reads the `sched_param` it is given. `tid` is the writer
        // thread's, which clears it as it ends (only at shutdown or on a fatal write error).
        let rc = unsafe { libc::sched_setscheduler(tid, libc::SCHED_BATCH, &param) };
        if rc != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "the raft log writer thread keeps the default scheduling policy"
            );
        }
    }

    /// Whether `op` may run inline now, judged before taking the lock (see
    /// [`INLINE_MAX_BYTES`] and [`INLINE_MAX_FSYNC`]).
    fn inline_allowed(&self, op: &Op) -> bool {
        let small = matches!(
            op,
            Op::Append { .. } | Op::Write { .. } | Op::SaveVote { .. }
        ) && op.len() <= INLINE_MAX_BYTES;
        let last_fsync = Duration::from_nanos(self.stats.last_fsync_nanos.load(Ordering::Relaxed));
        small
            && self.queued.load(Ordering::Acquire) == 0
            && last_fsync <= INLINE_MAX_FSYNC
            && !self.stalled.load(Ordering::Acquire)
    }
}

/// How operations reach the writer: queued for the batch loop, or carried out at once.
/// Order is preserved: an operation runs inline only when nothing is queued ahead of it.
#[derive(Clone)]
pub(super) struct Sink {
    tx: mpsc::UnboundedSender<Op>,
    shared: Arc<SharedWriter>,
}

#[cfg(test)]
impl Sink {
    /// The writer thread's id once it runs (0 before, and with a task).
    pub(super) fn writer_thread(&self) -> i32 {
        self.shared.writer_thread.load(Ordering::Acquire)
    }
}

/// The writer is gone (it stopped after shutdown); kept small so helpers stay cheap to
/// return, converted to openraft's error at the trait boundary.
pub(super) struct WriterStopped;

impl Sink {
    pub(super) fn send(&self, op: Op) -> Result<(), WriterStopped> {
        self.send_with(op, true)
    }

    /// [`Sink::send`], but never inline when `inline_ok` is false: the leader's append whose
    /// entries are on their way to the followers (`early_append`) leaves the runtime worker
    /// free to send them while the writer thread fsyncs (and waking that thread stops
    /// preempting the worker: [`SharedWriter::writer_wakeups_do_not_preempt`]).
    pub(super) fn send_with(&self, op: Op, inline_ok: bool) -> Result<(), WriterStopped> {
        let shared = &self.shared;
        if !inline_ok {
            shared.writer_wakeups_do_not_preempt();
        }
        if inline_ok && shared.inline_allowed(&op) {
            let mut guard = shared.writer.lock();
            if shared.queued.load(Ordering::Acquire) == 0 {
                let w = guard.as_mut().ok_or(WriterStopped)?;
                shared.stats.inline_ops.fetch_add(1, Ordering::Relaxed);
                if w.process(vec![op]) {
                    *guard = None;
                }
                return Ok(());
            }
        }
        shared.queued.fetch_add(1, Ordering::AcqRel);
        self.tx.send(op).map_err(|_| {
            shared.queued.fetch_sub(1, Ordering::AcqRel);
            WriterStopped
        })
    }
}

/// Where the batch loop runs: its own OS thread, or a task (an injected disk).
pub(super) enum LoopJoin {
    Thread(std::thread::JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
}

/// Starts the batch loop for `shared`: on an OS thread, or with `injected` (the simulation's
/// disk) as a task on the current runtime. Returns the sink that feeds it.
pub(super) fn start(
    shared: Arc<SharedWriter>,
    injected: Option<Arc<dyn LogDisk>>,
) -> std::io::Result<(Sink, LoopJoin)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let sink = Sink {
        tx,
        shared: shared.clone(),
    };
    let join = match injected {
        Some(disk) => LoopJoin::Task(tokio::spawn(run_task(shared, rx, disk))),
        None => LoopJoin::Thread(
            std::thread::Builder::new()
                .name("baton-wal".into())
                .spawn(move || run_thread(shared, rx))?,
        ),
    };
    Ok((sink, join))
}

/// The first operation and whatever is queued behind it, up to the batch bounds.
fn drain(first: Op, rx: &mut mpsc::UnboundedReceiver<Op>) -> Vec<Op> {
    let mut bytes = first.len();
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH_OPS && bytes < MAX_BATCH_BYTES {
        match rx.try_recv() {
            Ok(op) => {
                bytes += op.len();
                batch.push(op);
            }
            Err(_) => break,
        }
    }
    batch
}

/// Carries out one batch of the loop under the writer's lock; returns whether the writer
/// stopped (told to, or already gone).
fn process_queued(shared: &SharedWriter, batch: Vec<Op>) -> bool {
    let n = batch.len();
    let mut guard = shared.writer.lock();
    shared.stats.loop_batches.fetch_add(1, Ordering::Relaxed);
    shared.stats.loop_ops.fetch_add(n as u64, Ordering::Relaxed);
    let stopped = guard.as_mut().is_none_or(|w| w.process(batch));
    // Under the lock, so a caller that sees zero knows nothing is queued ahead of it.
    shared.queued.fetch_sub(n, Ordering::AcqRel);
    if stopped {
        *guard = None;
    }
    stopped
}

/// Every sender is gone (node dropped without shutdown): make what we have durable.
fn flush_abandoned(shared: &SharedWriter) {
    if let Some(w) = shared.writer.lock().as_mut() {
        w.commit(Pending::default(), true);
    }
}

/// The batch loop on its own OS thread (the real disk).
fn run_thread(shared: Arc<SharedWriter>, rx: mpsc::UnboundedReceiver<Op>) {
    // SAFETY: gettid has no preconditions.
    shared
        .writer_thread
        .store(unsafe { libc::gettid() }, Ordering::Release);
    run_batches(&shared, rx);
    // Its id may be another thread's from now on.
    shared.writer_thread.store(0, Ordering::Release);
}

fn run_batches(shared: &SharedWriter, mut rx: mpsc::UnboundedReceiver<Op>) {
    while let Some(first) = rx.blocking_recv() {
        if process_queued(shared, drain(first, &mut rx)) {
            return;
        }
    }
    flush_abandoned(shared);
}

/// The same loop as a task on the replica's runtime (an injected disk), so that a
/// simulation schedules it like everything else; a slow disk delays each batch.
async fn run_task(
    shared: Arc<SharedWriter>,
    mut rx: mpsc::UnboundedReceiver<Op>,
    disk: Arc<dyn LogDisk>,
) {
    while let Some(first) = rx.recv().await {
        let batch = drain(first, &mut rx);
        let delay = disk.latency();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if process_queued(&shared, batch) {
            return;
        }
    }
    flush_abandoned(&shared);
}
