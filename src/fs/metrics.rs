//! The file system's figures: requests by op, what reads returned and how long they took, how
//! long readers waited, and how requests the source did not answer in time were answered.
//!
//! Owns: these figures' definitions (path, Prometheus name, meaning) and their counters. Must
//! never count another module's figure: the cache, prefetch, views and memory own theirs.

use std::time::Instant;

use crate::metrics::{Counter, Histogram, Metric, Samples};

/// The filesystem operations counted per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Name lookup.
    Lookup,
    /// Attribute query.
    Getattr,
    /// Symlink target query.
    Readlink,
    /// File open.
    Open,
    /// File read.
    Read,
    /// File release (last close).
    Release,
    /// Directory open.
    Opendir,
    /// Directory listing.
    Readdir,
    /// Directory release.
    Releasedir,
    /// Filesystem capacity query.
    Statfs,
    /// Extended attribute query or listing.
    Xattr,
    /// Any attempt to modify the mount (answered EROFS).
    Modify,
}

impl Op {
    /// Every op, in rendering order.
    pub const ALL: [Op; 12] = [
        Op::Lookup,
        Op::Getattr,
        Op::Readlink,
        Op::Open,
        Op::Read,
        Op::Release,
        Op::Opendir,
        Op::Readdir,
        Op::Releasedir,
        Op::Statfs,
        Op::Xattr,
        Op::Modify,
    ];

    /// The op's name in both stats files.
    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Readlink => "readlink",
            Op::Open => "open",
            Op::Read => "read",
            Op::Release => "release",
            Op::Opendir => "opendir",
            Op::Readdir => "readdir",
            Op::Releasedir => "releasedir",
            Op::Statfs => "statfs",
            Op::Xattr => "xattr",
            Op::Modify => "modify",
        }
    }
}

/// Seconds since the mount became ready.
pub const UPTIME: Metric = Metric::gauge(
    "uptime_seconds",
    "uptime_seconds",
    "Seconds since the mount became ready.",
);
/// Bytes returned by reads the daemon answered.
pub const BYTES_SERVED: Metric = Metric::counter(
    "bytes_served",
    "bytes_served_total",
    "Bytes returned by reads answered by the daemon (passthrough reads bypass it).",
);
/// Read latency, arrival to reply.
pub const READ_LATENCY: Metric = Metric::latency(
    "read_latency_us",
    "read_latency_microseconds",
    "Latency of a read request answered by the daemon, microseconds.",
);
/// Load latency of an item, open to release.
pub const LOAD_LATENCY: Metric = Metric::latency(
    "load_latency_us",
    "load_latency_microseconds",
    "Time from the open of an item (a source file or a view tensor) to its release, microseconds: what a loader waits for a sample, and its own reading of it.",
);
/// Opens of items.
pub const ITEM_OPENS: Metric = Metric::counter(
    "item_opens",
    "item_opens_total",
    "Opens of items (source files and view tensors; not control files or directories).",
);
/// Opens served by kernel passthrough.
pub const PASSTHROUGH_OPENS: Metric = Metric::counter(
    "cache.passthrough_opens",
    "passthrough_opens_total",
    "Opens served by kernel passthrough from a fully cached file.",
);
/// Passthrough opens to the backing file of the file's live passthrough opens.
pub const PASSTHROUGH_PINNED: Metric = Metric::counter(
    "cache.passthrough_pinned_opens",
    "passthrough_pinned_opens_total",
    "Opens served by passthrough to the backing file of the file's live passthrough opens (the kernel takes one per file).",
);
/// Opens of whole cached files served by the daemon beside a daemon-served open of the file.
pub const PASSTHROUGH_DECLINED: Metric = Metric::counter(
    "cache.passthrough_declined_opens",
    "passthrough_declined_opens_total",
    "Opens of fully cached files served by the daemon because another open of the file is (it may be mmapped).",
);
/// Names the kernel was asked to forget because metadata outgrew the memory budget.
pub const FORGET_ASKS: Metric = Metric::counter(
    "inode_forget_asks",
    "inode_forget_asks_total",
    "Dataset files' names the kernel was asked to forget because metadata outgrew the memory budget.",
);
/// Opens answered from the cache alone.
pub const UNANSWERED_OPENS: Metric = Metric::counter(
    "source.unanswered_opens",
    "source_unanswered_opens_total",
    "Opens of fully cached files served from the cache because the source did not answer.",
);
/// Opens checked against a local source on the kernel's thread.
pub const OPENS_AT_ONCE: Metric = Metric::counter(
    "source.opens_at_once",
    "source_opens_at_once_total",
    "Opens of fully cached files whose source check ran on the kernel's thread: a local filesystem, no mount crossed.",
);
/// Requests answered EIO after their deadline.
pub const REQUESTS_EXPIRED: Metric = Metric::counter(
    "requests.expired",
    "requests_expired_total",
    "Requests that waited on the source past --source-timeout; answered EIO.",
);
/// Requests refused because the queue was full.
pub const REQUESTS_REFUSED: Metric = Metric::counter(
    "requests.refused",
    "requests_refused_total",
    "Requests answered EIO at once: the queue of requests waiting on the source was full.",
);
/// Seconds dataset reads waited on the source.
pub const FETCH_STALL: Metric = Metric::counter(
    "stall.fetch_seconds",
    "stall_fetch_seconds_total",
    "Seconds demand reads of dataset files waited on the source (fetch stall).",
);
/// Seconds view reads waited for their render.
pub const PREP_STALL: Metric = Metric::counter(
    "stall.prep_seconds",
    "stall_prep_seconds_total",
    "Seconds view reads waited for their render (preprocessing stall, fetch included).",
);
/// Open handles.
pub const OPEN_HANDLES: Metric = Metric::gauge(
    "open_handles",
    "open_handles",
    "Open file and directory handles.",
);
/// Inodes known.
pub const INODES: Metric = Metric::gauge(
    "inodes",
    "inodes",
    "Inodes known to the mount (created lazily).",
);
/// Requests by op.
pub const OP_REQUESTS: Metric = Metric::counter(
    "ops.*.requests",
    "requests_total",
    "Requests received, by op.",
)
.by("op");
/// Errors by op.
pub const OP_ERRORS: Metric = Metric::counter(
    "ops.*.errors",
    "errors_total",
    "Requests answered with an error, by op.",
)
.by("op");

/// Requests and errors of one op.
#[derive(Debug, Default)]
pub struct OpCounters {
    /// Requests received.
    pub requests: Counter,
    /// Requests answered with an error.
    pub errors: Counter,
}

/// The file system's counters. Request paths hold an `Arc<FsMetrics>` and only add.
#[derive(Debug)]
pub struct FsMetrics {
    started: Instant,
    ops: [OpCounters; Op::ALL.len()],
    /// See `BYTES_SERVED`.
    pub bytes_served: Counter,
    /// See `READ_LATENCY`.
    pub read_latency: Histogram,
    /// See `LOAD_LATENCY`.
    pub load_latency: Histogram,
    /// See `ITEM_OPENS`.
    pub item_opens: Counter,
    /// See `PASSTHROUGH_OPENS`.
    pub passthrough_opens: Counter,
    /// See `PASSTHROUGH_PINNED`.
    pub passthrough_pinned: Counter,
    /// See `PASSTHROUGH_DECLINED`.
    pub passthrough_declined: Counter,
    /// See `FORGET_ASKS`.
    pub forget_asks: Counter,
    /// See `UNANSWERED_OPENS`.
    pub unanswered_opens: Counter,
    /// See `OPENS_AT_ONCE`.
    pub opens_at_once: Counter,
    /// See `REQUESTS_EXPIRED`.
    pub requests_expired: Counter,
    /// See `REQUESTS_REFUSED`.
    pub requests_refused: Counter,
    /// Nanoseconds of `FETCH_STALL`.
    pub fetch_stall_ns: Counter,
    /// Nanoseconds of `PREP_STALL`.
    pub prep_stall_ns: Counter,
}

impl Default for FsMetrics {
    fn default() -> Self {
        FsMetrics {
            started: Instant::now(),
            ops: Default::default(),
            bytes_served: Counter::default(),
            read_latency: Histogram::default(),
            load_latency: Histogram::default(),
            item_opens: Counter::default(),
            passthrough_opens: Counter::default(),
            passthrough_pinned: Counter::default(),
            passthrough_declined: Counter::default(),
            forget_asks: Counter::default(),
            unanswered_opens: Counter::default(),
            opens_at_once: Counter::default(),
            requests_expired: Counter::default(),
            requests_refused: Counter::default(),
            fetch_stall_ns: Counter::default(),
            prep_stall_ns: Counter::default(),
        }
    }
}

/// The file system's own figures now, for the control files.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Open file and directory handles.
    pub open_handles: u64,
    /// Inodes the kernel holds.
    pub inodes: u64,
}

impl FsMetrics {
    /// Counts one request of `op`, and an error if `failed`.
    pub fn record(&self, op: Op, failed: bool) {
        let c = &self.ops[op as usize];
        c.requests.inc();
        if failed {
            c.errors.inc();
        }
    }

    /// Counters of `op`.
    pub fn op(&self, op: Op) -> &OpCounters {
        &self.ops[op as usize]
    }

    /// The samples of these figures, with `now`'s.
    pub fn samples(&self, now: &Figures, out: &mut Samples) {
        out.put(&UPTIME, self.started.elapsed().as_secs_f64());
        out.count(&BYTES_SERVED, &self.bytes_served);
        out.count(&PASSTHROUGH_OPENS, &self.passthrough_opens);
        out.count(&PASSTHROUGH_PINNED, &self.passthrough_pinned);
        out.count(&PASSTHROUGH_DECLINED, &self.passthrough_declined);
        out.count(&FORGET_ASKS, &self.forget_asks);
        out.count(&UNANSWERED_OPENS, &self.unanswered_opens);
        out.count(&OPENS_AT_ONCE, &self.opens_at_once);
        out.count(&REQUESTS_EXPIRED, &self.requests_expired);
        out.count(&REQUESTS_REFUSED, &self.requests_refused);
        out.seconds(&FETCH_STALL, &self.fetch_stall_ns);
        out.seconds(&PREP_STALL, &self.prep_stall_ns);
        out.latency(&READ_LATENCY, &self.read_latency);
        out.latency(&LOAD_LATENCY, &self.load_latency);
        out.count(&ITEM_OPENS, &self.item_opens);
        out.put(&OPEN_HANDLES, now.open_handles as f64);
        out.put(&INODES, now.inodes as f64);
        for op in Op::ALL {
            let c = self.op(op);
            out.put_for(&OP_REQUESTS, op.name(), c.requests.get() as f64);
            out.put_for(&OP_ERRORS, op.name(), c.errors.get() as f64);
        }
    }
}
