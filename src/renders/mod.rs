//! The render service of the views: every open of a view file gets one render of its image by
//! the view's pipeline, made on the render pool, ahead of the open, or by another job.
//!
//! Owns the render pool, the per-open seed (from the opening job's own open count, kept by
//! `sharing`, which also hands renders between jobs), the sizes of view files (from the spec when
//! it fixes the shape, else from the image header in a bounded prefix of the file) and scheduling
//! renders: each open queues its render on the render pool (sized to the cores) at once, so
//! decoding overlaps the loader's open-to-read gap, and reads wait for it off the FUSE threads.
//! Raw image bytes come through the never-evict cache like any source read; a JPEG's
//! restart-marked copy (which later renders decode only their crop's MCUs of) and the decoded
//! pixels are offered to it too, and a render that finds the pixels cached runs only the ops after
//! the decode. Each render draws its one plan (`view::Plan`: the image's size from its header or
//! its cached pixels, and its seed's crops and flips) once, and every step uses it: the memory
//! it charges, whether it decodes whole, what the decoder reads, the ops and the size check. For
//! the files prefetch predicts, work is done ahead (`ahead`); since an open's seed is a pure
//! function of the view, the path and the open's count, the open that takes a render made ahead
//! gets the bytes it would have rendered, provided the image is still the source version the
//! render was made from (checked by a stat when the open takes it; else the open renders anew). Must never serve part of a render: a render that fails answers EIO for that
//! open, counted by path and logged. Must never read more of a source file than a decode can use: a
//! file over `MAX_ENCODED_BYTES` is refused unread, and never let a render made ahead wait for
//! memory or shed anything to get it. Knows nothing of the views' names and trees (`fs::views`).

mod ahead;
mod sharing;

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::cache::{BlockFetcher, ReadBytes, Unpacked};
use crate::error::FsError;
use crate::inode::{self, Node};
use crate::memory::{Shed, Use, Work};
use crate::source::{Identity, Source, SourceFile};
use crate::view::limits::MAX_ENCODED_BYTES;
use crate::view::metrics::{JobFigures, ViewMetrics};
use crate::view::{Executor, Plan, RenderError, Rgb, ViewSpec, jpeg, plan, render};
use crate::workers::{Active, Permit, Permits, WorkerPool};
use sharing::{Share, Sharing};

/// Extensions shown in views: what the decoder reads (case-insensitive).
const IMAGE_EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];
/// Bytes read first to find an image's dimensions (a JPEG's frame header after its EXIF
/// segment, at most 64 KiB, usually fits).
const HEADER_PROBE: u64 = 64 << 10;
/// Bytes read at most to find them, when the header goes on past `HEADER_PROBE` (XMP, ICC
/// profiles, Photoshop resources before a JPEG's frame header; text chunks before a PNG's
/// pixels): beyond it, getattr answers EIO rather than read more of a file it cannot size.
const HEADER_PROBE_MAX: u64 = 4 << 20;
/// Renders waiting for a render thread at most; beyond it, a file's first read renders it.
const RENDER_QUEUE_DEPTH: usize = 64;
/// How long a render waits for room in the memory budget (other renders finishing, view files
/// being closed) before it fails with EIO.
const RENDER_PATIENCE: Duration = Duration::from_secs(10);
/// How long a render for an open waits for its turn (renders run one per render thread): other
/// renders end within their own patience, so this only bounds a machine far behind.
const RENDER_TURN_PATIENCE: Duration = Duration::from_secs(60);
/// Longest a read of a view file may wait for CPU and memory before its render touches the
/// source: its turn and the render's memory. A read's `--source-timeout` comes on top, so
/// readers queued behind other renders on a busy machine are not answered EIO as if the source
/// had hung.
pub const RENDER_WAIT: Duration = RENDER_TURN_PATIENCE.saturating_add(RENDER_PATIENCE);
/// One view of the mount.
pub struct View {
    /// Its definition.
    pub spec: ViewSpec,
    /// Its counters.
    pub metrics: ViewMetrics,
}

/// The mount's views, their render pool and what renders need: the view service.
pub struct Views {
    list: Vec<View>,
    /// Seed of every view's random augmentation.
    seed: u64,
    executor: Box<dyn Executor>,
    source: Arc<dyn Source>,
    fetcher: Arc<BlockFetcher>,
    /// Runs renders queued at open; started only when there are views.
    pool: Option<WorkerPool>,
    /// Renders queued and not started (the pool's own gauge).
    waiting: Arc<AtomicUsize>,
    /// Renders made ahead of the opens they are for, oldest first (at most `AHEAD_RENDERS`).
    ahead: Mutex<VecDeque<HeldRender>>,
    /// How many `ahead` holds, readable without its lock: an open takes the lock only when a
    /// render is held (a stale zero only makes that open render for itself).
    held: AtomicUsize,
    /// Whether renders make restart-marked copies of the JPEGs they read (`--no-view-copies`).
    copies: bool,
    /// Renders running at once, whichever thread runs them: one per active render thread.
    running: Permits,
    /// Whether users other than the mount's owner may read the mount (`--allow-other`): the
    /// failed files a stats file names are then only those anybody could list.
    read_by_others: bool,
    /// The jobs reading the views: their open counts and the renders held between them.
    sharing: Arc<Sharing<Rendered>>,
}

/// A render made (or being made) for the open that will be view file `ino`'s `count`th (from 0).
struct HeldRender {
    ino: u64,
    count: u64,
    slot: AheadSlot,
    started: Instant,
}

/// A view file opened for reading: rendered once, by the render pool or by its first read.
pub struct ViewOpen {
    view: u16,
    node: Arc<Node>,
    seed: u64,
    rendered: OnceLock<Result<Rendered, FsError>>,
    /// The render made ahead for this open, finished or still running, when one was.
    ahead: Option<AheadSlot>,
    /// Another job's render of this file for the same epoch, finished or still running.
    shared: Option<AheadSlot>,
    /// Where this open's render goes for the other jobs reading the view (filled with `None`
    /// if the open goes away unrendered).
    publish: Option<FillOnDrop>,
}

/// Where a render made ahead lands: `None` when it failed (the open then renders for itself).
type AheadSlot = Arc<OnceLock<Option<Rendered>>>;

/// Fills its slot with `None` when dropped unfilled, so no open waits on a render that ended
/// without a result.
struct FillOnDrop(AheadSlot);

impl Drop for FillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.set(None);
    }
}

/// What a render starts from.
enum Image {
    /// Decoded pixels, and the decode time when they were decoded for this render.
    Decoded(Rgb, Option<Duration>),
    /// The encoded file (or its restart-marked copy, borrowed from the cache), for the render
    /// to decode only what it reads.
    Encoded(ReadBytes),
}

/// What a render starts from: the image, the render's plan, its memory and the source version.
struct Started<'a> {
    image: Image,
    plan: Plan,
    work: Work,
    source: Identity,
    /// The render's turn (`turn`), taken once the source has answered.
    _turn: Permit<'a>,
}

/// A finished render, the source version it was made from, and its charge to the memory budget,
/// held until the file is closed.
#[derive(Clone)]
struct Rendered {
    npy: Arc<Vec<u8>>,
    source: Identity,
    _held: Arc<Work>,
}

impl ViewOpen {
    /// The rendered bytes if the render already ran.
    pub fn ready(&self) -> Option<Result<Arc<Vec<u8>>, FsError>> {
        self.rendered
            .get()
            .map(|r| r.as_ref().map(|r| r.npy.clone()).map_err(|e| *e))
    }
}

/// The size of the encoded image `source`, refused when it is larger than any image a decode
/// could use (`MAX_ENCODED_BYTES`).
fn encoded_size(source: &dyn SourceFile) -> Result<u64, String> {
    let size = source.identity().size;
    if size > MAX_ENCODED_BYTES {
        return Err(RenderError::TooLarge(format!(
            "the file has {size} bytes, over the {MAX_ENCODED_BYTES} an encoded image may have"
        ))
        .to_string());
    }
    Ok(size)
}

/// Whether `name` is an image views show: a JPEG or PNG extension (`IMAGE_EXTENSIONS`).
pub fn is_image(name: &OsStr) -> bool {
    let name = name.as_bytes();
    IMAGE_EXTENSIONS.iter().any(|ext| {
        name.len() > ext.len() + 1
            && name[name.len() - ext.len() - 1] == b'.'
            && name[name.len() - ext.len()..].eq_ignore_ascii_case(ext.as_bytes())
    })
}

impl Views {
    /// Whether views show the source file `path`: an image, by its extension.
    pub fn shows(path: &Path) -> bool {
        path.file_name().is_some_and(is_image)
    }

    /// The views of `specs` (augmentation seeded by `seed`), rendering with `executor` on a pool
    /// of `threads` render threads of which `active()` take work (started only when there are
    /// views; without threads, the first read of a file renders it).
    pub fn start(
        specs: &[ViewSpec],
        seed: u64,
        threads: usize,
        active: Active,
        executor: Box<dyn Executor>,
        source: Arc<dyn Source>,
        fetcher: Arc<BlockFetcher>,
    ) -> Views {
        let list: Vec<View> = specs
            .iter()
            .take(inode::MAX_VIEWS)
            .map(|spec| View {
                spec: spec.clone(),
                metrics: ViewMetrics::default(),
            })
            .collect();
        let pool = if list.is_empty() {
            None
        } else {
            WorkerPool::sized("prepfs-render", threads, RENDER_QUEUE_DEPTH, active.clone())
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "cannot start render threads; rendering on read");
                })
                .ok()
        };
        let waiting = pool
            .as_ref()
            .map_or_else(|| Arc::new(AtomicUsize::new(0)), WorkerPool::queued);
        let budget = fetcher.budget();
        let sharing = Arc::new(Sharing::new(budget.clone()));
        let shed: Arc<dyn Shed> = sharing.clone();
        budget.add_shed(Use::Work, Arc::downgrade(&shed));
        Views {
            list,
            seed,
            executor,
            source,
            fetcher,
            pool,
            waiting,
            ahead: Mutex::new(VecDeque::new()),
            held: AtomicUsize::new(0),
            copies: true,
            running: Permits::new(active),
            read_by_others: false,
            sharing,
        }
    }

    /// These views, sharing renders between the jobs reading one at once or not (`share`).
    pub fn sharing_renders(self, share: bool) -> Views {
        self.sharing.set_enabled(share);
        self
    }

    /// These views, making restart-marked copies of the JPEGs they render or not (`copies`).
    pub fn with_copies(mut self, copies: bool) -> Views {
        self.copies = copies;
        self
    }

    /// These views, in a mount other users may read (`--allow-other`) or not (`read_by_others`).
    pub fn read_by_others(mut self, read_by_others: bool) -> Views {
        self.read_by_others = read_by_others;
        self
    }

    /// The views, in mount order.
    pub fn iter(&self) -> impl Iterator<Item = &View> {
        self.list.iter()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether the mount has none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Renders queued and not started yet.
    pub fn renders_waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// How full the render queue is, 0..=1 (telemetry).
    pub fn render_queue_share(&self) -> f64 {
        self.renders_waiting() as f64 / RENDER_QUEUE_DEPTH as f64
    }

    /// View `index`; `NotFound` past the last.
    pub fn get(&self, index: u16) -> Result<&View, FsError> {
        self.list.get(usize::from(index)).ok_or(FsError::NotFound)
    }

    /// The .npy size of `node` under `spec`: from the spec alone when it fixes the shape, else
    /// from the image header (`probe_size`).
    pub fn file_size(&self, spec: &ViewSpec, node: &Node) -> Result<u64, FsError> {
        let (height, width) = match spec.fixed_size() {
            Some(size) => size,
            None => self.probe_size(spec, node)?,
        };
        Ok(spec.npy_size(height, width))
    }

    /// The output (height, width) of `spec` over `node`'s image, from its header: its cached
    /// restart-marked copy's (the same dimensions; the file itself is no longer cached once the
    /// copy took its place), else the file's (`header`). `EIO` (and a warning) when there is no
    /// usable header or a step of the render would pass the pixel limits.
    fn probe_size(&self, spec: &ViewSpec, node: &Node) -> Result<(u32, u32), FsError> {
        let source = self
            .source
            .open(&node.path)
            .map_err(|e| FsError::from_source(&e))?;
        let copy = (self.fetcher.derived()).peek_marked(&source.identity(), &Unpacked::default());
        let header = match copy {
            Some(copy) => render::dimensions(copy.as_slice()),
            None => self.header(source.as_ref())?,
        };
        header
            .and_then(|(w, h)| plan::output_size(spec, w, h))
            .map_err(|e| {
                tracing::warn!(path = %node.path.display(), error = %e, "view: cannot size the image from its header; EIO");
                FsError::Io
            })
    }

    /// The image's dimensions from the header in the first `HEADER_PROBE` bytes of `source`, or
    /// the first `HEADER_PROBE_MAX` when the header goes on past them.
    fn header(&self, source: &dyn SourceFile) -> Result<Result<(u32, u32), RenderError>, FsError> {
        let mut header = Err(RenderError::NotAnImage("empty file".into()));
        for probe in [HEADER_PROBE, HEADER_PROBE_MAX] {
            let prefix = self.fetcher.read_prefix(source, probe)?;
            header = render::dimensions(&prefix);
            // Only a known format whose header the probe cut short is worth a longer one.
            if !matches!(header, Err(RenderError::Corrupt(_))) || (prefix.len() as u64) < probe {
                break;
            }
        }
        Ok(header)
    }

    /// The whole encoded image `source`, through the cache; refused unread when it is larger
    /// than any image a decode could use (`MAX_ENCODED_BYTES`).
    fn read_image(&self, source: &dyn SourceFile) -> Result<Vec<u8>, String> {
        encoded_size(source)?;
        self.fetcher
            .read_prefix(source, MAX_ENCODED_BYTES)
            .map_err(|e| format!("cannot read the image: {e}"))
    }

    /// Renders `open` unless it already is, or nobody can read it any more (released).
    fn render_once(&self, open: &Arc<ViewOpen>) {
        if Arc::strong_count(open) > 1 {
            open.rendered.get_or_init(|| self.render(open));
        }
    }

    /// The rendered bytes of `open`: rendered now on this thread unless the render pool has
    /// done it or is doing it (then this waits for it). May block: never on a FUSE thread.
    pub fn rendered(&self, open: &ViewOpen) -> Result<Arc<Vec<u8>>, FsError> {
        match open.rendered.get_or_init(|| self.render(open)) {
            Ok(r) => Ok(r.npy.clone()),
            Err(e) => Err(*e),
        }
    }

    /// Room in the memory budget for `bytes` of a render's data: for an open's render, waiting
    /// for it within `RENDER_PATIENCE`; for a render made ahead, only memory free now.
    fn room(&self, bytes: u64, need: Need) -> Result<Work, Unrendered> {
        let budget = self.fetcher.budget();
        match need {
            Need::Open => budget
                .work(bytes, RENDER_PATIENCE)
                .map_err(|e| Unrendered::NoRoom(format!("no memory for the render: {e}"))),
            Need::Ahead => budget
                .try_work(bytes)
                .ok_or_else(|| Unrendered::NoRoom("no memory to spare for a render ahead".into())),
        }
    }

    /// What a render of `node`'s image under `spec` with `seed` starts from, the render's one
    /// plan (drawn once, over the size of the pixels or of the header), its charge to the memory
    /// budget (everything `plan::render_memory` says it holds, and a decode's own
    /// intermediates, `render::decode_overhead`, when it decodes) and the source version it is
    /// of: the cache's decoded pixels; else the encoded file, fetched through the cache, decoded
    /// whole and offered to the cache when it may keep the pixels (`decodes_whole`), or left for
    /// the render to decode only what it reads.
    ///
    /// The render's turn is taken after the source is opened and the encoded image read (or
    /// its pixels found), before the render's memory: a render waiting on a hung source holds
    /// no turn that a healthy image's render needs.
    fn image(
        &self,
        node: &Node,
        spec: &ViewSpec,
        seed: u64,
        need: Need,
    ) -> Result<Started<'_>, Unrendered> {
        let source = self
            .source
            .open(&node.path)
            .map_err(|e| format!("cannot read the image: {}", FsError::from_source(&e)))?;
        let identity = source.identity();
        let memory = |plan: &Plan, decoding: u64| {
            plan::render_memory(spec, plan.size.0, plan.size.1)
                .map_err(|e| Unrendered::Failed(e.to_string()))
                .and_then(|bytes| self.room(bytes + decoding, need))
        };
        let planned = |size| Plan::new(spec, size, seed).map_err(|e| e.to_string());
        // A plan over the cached pixels serves the encoded file too (same size, same seed).
        let mut drawn = None;
        if let Some(bytes) = self
            .fetcher
            .derived()
            .decoded(&identity, &Unpacked::default())
        {
            let plan = planned(Rgb::size_of_bytes(bytes.as_slice()).map_err(|e| e.to_string())?)?;
            if !plan.reads_scaled() {
                let turn = self.turn(need)?;
                let work = memory(&plan, 0)?;
                match Rgb::from_bytes(bytes.as_slice()) {
                    Ok(image) => {
                        return Ok(Started {
                            image: Image::Decoded(image, None),
                            plan,
                            work,
                            source: identity,
                            _turn: turn,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(path = %node.path.display(), error = %e, "cached decoded pixels unusable; decoding again")
                    }
                }
            }
            drawn = Some(plan);
        }
        let _encoded_room = self.room(encoded_size(source.as_ref())?, need)?;
        let (encoded, held) = self.encoded(source.as_ref(), &node.path)?;
        let size = render::dimensions(encoded.as_slice()).map_err(|e| e.to_string())?;
        let plan = match drawn {
            Some(plan) if plan.size == size => plan,
            _ => planned(size)?,
        };
        let turn = self.turn(need)?;
        let work = memory(&plan, render::decode_overhead(encoded.as_slice(), size))?;
        let whole = if self.decodes_whole(&plan, held) {
            self.decode_and_offer(encoded.as_slice(), identity)?
        } else {
            None
        };
        let image = match whole {
            Some((image, decode, _)) => Image::Decoded(image, Some(decode)),
            None => Image::Encoded(encoded),
        };
        Ok(Started {
            image,
            plan,
            work,
            source: identity,
            _turn: turn,
        })
    }

    /// A turn to render: renders start on the render pool, on reads and on prefetch's threads,
    /// and however many ask, only as many run (and hold their memory) as there are render
    /// threads. An open's render waits `RENDER_TURN_PATIENCE` for one; one made ahead takes a
    /// free one or none.
    fn turn(&self, need: Need) -> Result<Permit<'_>, Unrendered> {
        match need {
            Need::Open => self.running.take(RENDER_TURN_PATIENCE),
            Need::Ahead => self.running.try_take(),
        }
        .ok_or_else(|| Unrendered::NoRoom("no render turn free".into()))
    }

    /// The encoded image a render starts from: the cache's restart-marked copy of it when it
    /// holds one (a part then decodes from a cut of it: `view::segments`); else the file, read
    /// through the cache, and (unless `--no-view-copies`) a JPEG's restart-marked copy made from
    /// it and offered to the cache when the cache has room for the copy and the budget has the
    /// memory for making it free now (never waited for). Making it costs about a whole decode
    /// more, once, like filling the cache; each later render of the image decodes about a
    /// quarter less. Also whether the cache held the image before this render as renders keep
    /// it (its copy; for an image that gets none, the file: `held_as_file`).
    fn encoded(&self, source: &dyn SourceFile, path: &Path) -> Result<(ReadBytes, bool), String> {
        let derived = self.fetcher.derived();
        let identity = source.identity();
        if let Some(copy) = derived.marked(&identity, &Unpacked::default()) {
            return Ok((copy, true));
        }
        let cached = derived.has_file(&identity);
        let encoded = self.read_image(source)?;
        let held = self.held_as_file(&encoded, cached);
        if !self.copies
            || !render::is_complete_jpeg(&encoded)
            || !derived.has_room(encoded.len() as u64)
        {
            return Ok((ReadBytes::Owned(encoded), held));
        }
        let Ok((w, h)) = render::dimensions(&encoded) else {
            return Ok((ReadBytes::Owned(encoded), held));
        };
        // libjpeg-turbo holds the whole image's coefficients while it writes the copy (2 bytes
        // a sample, at most 3 samples a pixel), then the copy.
        let making = 6 * u64::from(w) * u64::from(h) + 2 * encoded.len() as u64;
        let Some(_room) = self.fetcher.budget().try_work(making) else {
            return Ok((ReadBytes::Owned(encoded), held));
        };
        match jpeg::restart_marked(&encoded) {
            Ok(copy) => {
                derived.offer_marked(identity, copy.clone());
                Ok((ReadBytes::Owned(copy), held))
            }
            Err(refused) => {
                tracing::debug!(path = %path.display(), error = %refused, "no restart-marked copy");
                Ok((ReadBytes::Owned(encoded), cached))
            }
        }
    }

    /// Whether image `encoded`, not found as a cached copy, was held by the cache as renders
    /// keep it (`Derived::pixels_may_follow`): a JPEG that gets a copy is held once its copy
    /// is; any other image once its file is (`cached`: before this render read it; a view
    /// whose output size needs the header has its lookup read the file through the cache
    /// first, so for those the file counts from the first render).
    fn held_as_file(&self, encoded: &[u8], cached: bool) -> bool {
        cached && !(self.copies && render::is_complete_jpeg(encoded))
    }

    /// Whether a render as `plan` says decodes its whole image and offers the pixels to the
    /// cache: when the cache may keep them (`held`: it held the encoded image before this
    /// render), and the render reads the image at full scale (one that reads it DCT-scaled
    /// renders from the encoded file whatever the cache holds, so its bytes never depend on it).
    /// Otherwise it decodes only the part it reads.
    fn decodes_whole(&self, plan: &Plan, held: bool) -> bool {
        !plan.reads_scaled()
            && self
                .fetcher
                .derived()
                .may_keep_decoded(Rgb::cached_len(plan.size), held)
    }

    /// Decodes `encoded`, image `identity`, and offers the pixels to the cache; the pixels, the
    /// decode time and whether the cache kept them. `None` when the whole image's pixels would
    /// not be those its parts decode to (`Executor::decode_as_parts_do`: a damaged JPEG): the
    /// render then decodes only its part, as it would with no pixels kept, so its bytes never
    /// depend on what the cache holds.
    fn decode_and_offer(
        &self,
        encoded: &[u8],
        identity: Identity,
    ) -> Result<Option<(Rgb, Duration, bool)>, String> {
        let started = Instant::now();
        let decoded = self.executor.decode_as_parts_do(encoded);
        let Some(image) = decoded.map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let decode = started.elapsed();
        let kept = self.fetcher.derived().offer_decoded(
            identity,
            (image.byte_len() as u64, image.row_len()),
            decode,
            || image.to_bytes(),
        );
        Ok(Some((image, decode, kept)))
    }

    /// Whether the stats files may name the image at `path` (the world-readable stats.json is no
    /// way to learn names one could not list): always when only the mount's owner reads the
    /// mount; with `--allow-other`, when every directory from the source root down to it may be
    /// read and searched by anybody. A stat of each, only when a render fails.
    fn may_name(&self, path: &Path) -> bool {
        !self.read_by_others
            || path
                .ancestors()
                .skip(1)
                .filter(|dir| !dir.as_os_str().is_empty())
                .all(|dir| {
                    self.source
                        .stat(dir)
                        .is_ok_and(|meta| meta.perm & 0o005 == 0o005)
                })
    }

    /// Renders `open` for a reader waiting on it, and hands the render to the other jobs when
    /// the open publishes it.
    fn render(&self, open: &ViewOpen) -> Result<Rendered, FsError> {
        let rendered = self.render_unshared(open);
        if let Some(publish) = &open.publish {
            let _ = publish.0.set(rendered.as_ref().ok().cloned());
        }
        rendered
    }

    /// Renders `open` (or takes the render made ahead for it, or another job's for the same
    /// file and epoch): a failure is counted, logged and answered EIO.
    fn render_unshared(&self, open: &ViewOpen) -> Result<Rendered, FsError> {
        let view = self.get(open.view)?;
        if let Some(rendered) = open.ahead.as_ref().and_then(|slot| slot.wait().clone()) {
            if self.is_current(&open.node.path, rendered.source) {
                view.metrics.ahead_used.inc();
                return Ok(rendered);
            }
            tracing::debug!(view = %view.spec.name, path = %open.node.path.display(), "the image changed since its render ahead; rendering it again");
        }
        if let Some(rendered) = open.shared.as_ref().and_then(|slot| slot.wait().clone())
            && self.is_current(&open.node.path, rendered.source)
        {
            view.metrics.shared_hits.inc();
            return Ok(rendered);
        }
        self.render_for(view, open, Need::Open).map_err(|unrendered| {
            let why = unrendered.why();
            let m = &view.metrics;
            m.errors.inc();
            if self.may_name(&open.node.path) {
                m.failed_files
                    .record(&open.node.path.to_string_lossy(), &why);
            }
            tracing::warn!(view = %view.spec.name, path = %open.node.path.display(), error = %why, "view render failed; EIO");
            FsError::Io
        })
    }

    /// Whether the image at `path` is still the source version `identity` (a render made ahead
    /// of an open is that open's only if the image has not changed since; a stat of the source,
    /// once per open that takes one).
    fn is_current(&self, path: &Path, identity: Identity) -> bool {
        self.source
            .stat(path)
            .is_ok_and(|meta| meta.identity == identity)
    }

    /// Renders `open` of `view` with the memory `need` allows; counts what it rendered.
    fn render_for(&self, view: &View, open: &ViewOpen, need: Need) -> Result<Rendered, Unrendered> {
        let started = Instant::now();
        let result = self
            .image(&open.node, &view.spec, open.seed, need)
            .and_then(
                |Started {
                     image,
                     plan,
                     work,
                     source,
                     _turn,
                 }| {
                    // The size getattr announced, from the plan in hand (output sizes never
                    // depend on the seed; no second source read).
                    let expected = match view.spec.fixed_size() {
                        Some((h, w)) => view.spec.npy_size(h, w),
                        None => view.spec.npy_size(plan.draws.size.1, plan.draws.size.0),
                    };
                    let rendered = match image {
                        Image::Decoded(pixels, decode) => self
                            .executor
                            .transform(&view.spec, &pixels, &plan)
                            .map(|mut r| {
                                r.decode = decode.unwrap_or_default();
                                r
                            }),
                        Image::Encoded(encoded) => {
                            self.executor.render(&view.spec, encoded.as_slice(), &plan)
                        }
                    };
                    let rendered = rendered.map_err(|e| e.to_string())?;
                    if rendered.npy.len() as u64 != expected {
                        return Err(format!(
                            "rendered {} bytes where {expected} were announced",
                            rendered.npy.len()
                        )
                        .into());
                    }
                    // What the image costs the cache held encoded or as pixels (telemetry's
                    // working-set fits).
                    view.metrics.image_bytes.add(source.size);
                    view.metrics.pixel_bytes.add(Rgb::cached_len(plan.size));
                    Ok((rendered, work, source))
                },
            );
        let m = &view.metrics;
        m.render_latency.record(started.elapsed());
        let (rendered, mut work, source) = result?;
        tracing::debug!(view = %view.spec.name, path = %open.node.path.display(), seed = open.seed, crops = ?rendered.crops, flipped = rendered.flipped, "view rendered");
        if rendered.decode > Duration::ZERO {
            m.decode_latency.record(rendered.decode);
        }
        m.transform_latency.record(rendered.transform);
        m.renders.inc();
        m.render_rate.tick();
        m.bytes_out.add(rendered.npy.len() as u64);
        // The file stays charged until it is closed; the rest of the render's memory is free now.
        work.shrink_to(rendered.npy.len() as u64);
        Ok(Rendered {
            npy: Arc::new(rendered.npy),
            source,
            _held: Arc::new(work),
        })
    }

    /// The seed of the `count`th open (from 0) of view `view`'s file for the image at `path`: a
    /// pure function of them and the mount's seed, so a render made ahead of an open is the one
    /// the open would make.
    pub fn seed_of(&self, view: &View, path: &Path, count: u64) -> u64 {
        let mut key = Vec::new();
        key.extend_from_slice(&self.seed.to_le_bytes());
        key.extend_from_slice(view.spec.name.as_bytes());
        key.push(0);
        key.extend_from_slice(path.as_os_str().as_bytes());
        key.push(0);
        key.extend_from_slice(&count.to_le_bytes());
        xxhash_rust::xxh3::xxh3_64(&key)
    }

    /// The jobs reading view `view` and the renders held between them, for the stats.
    pub fn job_figures(&self, view: u16) -> JobFigures {
        self.sharing.figures(view, |r| r.npy.len() as u64)
    }
}

/// Why a render produced nothing.
enum Unrendered {
    /// The memory budget had no room for it (now, for a render made ahead).
    NoRoom(String),
    /// The image could not be read, decoded or rendered.
    Failed(String),
}

impl From<String> for Unrendered {
    fn from(why: String) -> Unrendered {
        Unrendered::Failed(why)
    }
}

impl Unrendered {
    /// What to log and count.
    fn why(self) -> String {
        match self {
            Unrendered::NoRoom(why) | Unrendered::Failed(why) => why,
        }
    }
}

/// Whose render asks for memory.
#[derive(Clone, Copy)]
enum Need {
    /// An open's: it waits for room within `RENDER_PATIENCE`.
    Open,
    /// One made ahead of its open: only memory free now, never waiting or shedding.
    Ahead,
}

impl Views {
    /// Whether an open by `pid` finds its job without reading the process's memory through
    /// /proc (`Jobs::knows`).
    pub fn knows_job(&self, pid: u32) -> bool {
        self.sharing.knows_job(pid)
    }

    /// Opens view `index`'s file `node` for the process (or thread) `pid`: the open's
    /// seed is fixed now, from its job's own open count, and its render queued on the pool, or
    /// found made ahead or made by another job.
    pub fn open(
        self: &Arc<Self>,
        index: u16,
        node: Arc<Node>,
        pid: u32,
    ) -> Result<Arc<ViewOpen>, FsError> {
        let view = self.get(index)?;
        view.metrics.opens.inc();
        let opened = self.sharing.open(index, node.ino, &node.path, pid);
        if opened.new_job {
            view.metrics.jobs_seen.inc();
        }
        let count = opened.count;
        let (shared, publish) = match opened.share {
            Share::Alone => (None, None),
            Share::Take(slot) => (Some(slot), None),
            Share::Publish(slot) => (None, Some(FillOnDrop(slot))),
        };
        let ahead = match shared {
            Some(_) => None,
            None => self.take_ahead(node.ino, count),
        };
        // A render made ahead serves the other jobs too: they wait on it, which fills itself,
        // not on this open's first read (which may never come). A job that took the published
        // slot meanwhile finds it empty (`FillOnDrop`) and renders its own.
        let publish = match (&ahead, publish) {
            (Some(slot), Some(publish)) => {
                self.sharing
                    .hold_instead(index, node.ino, count, slot.clone());
                view.metrics.shared_renders.inc();
                drop(publish);
                None
            }
            (_, publish) => publish,
        };
        let open = Arc::new(ViewOpen {
            view: index,
            seed: self.seed_of(view, &node.path, count),
            rendered: OnceLock::new(),
            ahead,
            shared,
            publish,
            node,
        });
        if open.ahead.is_some() || open.shared.is_some() {
            // Its render is made or being made: the first read takes (or waits for) it.
            return Ok(open);
        }
        // Queued at once, so decoding overlaps the loader's open-to-read gap; with the queue full
        // (or no pool) the first read renders it, on its own thread.
        let queued = self.pool.as_ref().is_some_and(|pool| {
            let (views, job) = (self.clone(), open.clone());
            pool.try_submit(move || views.render_once(&job))
        });
        if let Some(publish) = &open.publish {
            if queued {
                view.metrics.shared_renders.inc();
            } else {
                // Rendered only when this open is read, if ever: no other job waits on that.
                let _ = publish.0.set(None);
            }
        }
        Ok(open)
    }
}
