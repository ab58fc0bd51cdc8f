//! nvJPEG, loaded at run time: the few calls prepfs needs to decode batches of JPEGs into
//! interleaved RGB in device memory, on the JPEG hardware engine where the GPU has one.
//!
//! Owns the C binding (function types and enum values from nvjpeg.h, CUDA 12/13), the handles,
//! and nvJPEG's device allocations, which go through `Budget` so they count against
//! `--gpu-mem`. Must never be called for an image the caller has not checked (a complete JPEG
//! within the pixel limits), and never be used from two threads at once (one decode thread owns
//! it).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, LazyLock};

use libloading::Library;
use parking_lot::Mutex;

use super::budget::Budget;
use super::libs::{self, Candidate, Lib};

type Status = c_int;
type Handle = *mut c_void;
type State = *mut c_void;
type Stream = *mut c_void;
type JpegStream = *mut c_void;

/// `NVJPEG_STATUS_SUCCESS`.
const SUCCESS: Status = 0;
/// `NVJPEG_BACKEND_DEFAULT`.
const BACKEND_DEFAULT: c_int = 0;
/// `NVJPEG_BACKEND_HARDWARE`: the A100/H100-class JPEG engine (batched decode only).
const BACKEND_HARDWARE: c_int = 3;
/// `NVJPEG_OUTPUT_RGBI`: interleaved RGB, one plane.
const OUTPUT_RGBI: c_int = 5;
/// `NVJPEG_CSS_UNKNOWN`.
const CSS_UNKNOWN: c_int = -1;
/// `NVJPEG_MAX_COMPONENT`.
const MAX_COMPONENT: usize = 4;

/// `nvjpegImage_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Image {
    /// Plane pointers (device memory); RGBI uses the first.
    pub channel: [*mut u8; MAX_COMPONENT],
    /// Row pitch of each plane, bytes.
    pub pitch: [usize; MAX_COMPONENT],
}

/// `nvjpegDevAllocator_t`.
#[repr(C)]
struct DevAllocator {
    dev_malloc: extern "C" fn(*mut *mut c_void, usize) -> c_int,
    dev_free: extern "C" fn(*mut c_void) -> c_int,
}

type CreateEx =
    unsafe extern "C" fn(c_int, *mut DevAllocator, *mut c_void, c_uint, *mut Handle) -> Status;
type Destroy = unsafe extern "C" fn(Handle) -> Status;
type StateCreate = unsafe extern "C" fn(Handle, *mut State) -> Status;
type StateDestroy = unsafe extern "C" fn(State) -> Status;
type GetImageInfo = unsafe extern "C" fn(
    Handle,
    *const u8,
    usize,
    *mut c_int,
    *mut c_int,
    *mut c_int,
    *mut c_int,
) -> Status;
type Decode =
    unsafe extern "C" fn(Handle, State, *const u8, usize, c_int, *mut Image, Stream) -> Status;
type BatchedInit = unsafe extern "C" fn(Handle, State, c_int, c_int, c_int) -> Status;
type Batched = unsafe extern "C" fn(
    Handle,
    State,
    *const *const u8,
    *const usize,
    *mut Image,
    Stream,
) -> Status;
type StreamCreate = unsafe extern "C" fn(Handle, *mut JpegStream) -> Status;
type StreamParse =
    unsafe extern "C" fn(Handle, *const u8, usize, c_int, c_int, JpegStream) -> Status;
type StreamDestroy = unsafe extern "C" fn(JpegStream) -> Status;
type BatchedSupported = unsafe extern "C" fn(Handle, JpegStream, *mut c_int) -> Status;

/// The resolved entry points (the library stays loaded while they are used).
struct Api {
    create_ex: CreateEx,
    destroy: Destroy,
    state_create: StateCreate,
    state_destroy: StateDestroy,
    get_image_info: GetImageInfo,
    decode: Decode,
    batched_init: BatchedInit,
    batched: Batched,
    stream_create: StreamCreate,
    stream_parse: StreamParse,
    stream_destroy: StreamDestroy,
    batched_supported: BatchedSupported,
    _lib: Library,
}

impl Api {
    fn load(lib: Library) -> Result<Api, String> {
        // SAFETY: the symbols are nvjpeg.h's, with the signatures declared above.
        unsafe {
            macro_rules! sym {
                ($name:literal) => {
                    *lib.get(concat!($name, "\0").as_bytes())
                        .map_err(|e| format!("{}: {e}", $name))?
                };
            }
            Ok(Api {
                create_ex: sym!("nvjpegCreateEx"),
                destroy: sym!("nvjpegDestroy"),
                state_create: sym!("nvjpegJpegStateCreate"),
                state_destroy: sym!("nvjpegJpegStateDestroy"),
                get_image_info: sym!("nvjpegGetImageInfo"),
                decode: sym!("nvjpegDecode"),
                batched_init: sym!("nvjpegDecodeBatchedInitialize"),
                batched: sym!("nvjpegDecodeBatched"),
                stream_create: sym!("nvjpegJpegStreamCreate"),
                stream_parse: sym!("nvjpegJpegStreamParse"),
                stream_destroy: sym!("nvjpegJpegStreamDestroy"),
                batched_supported: sym!("nvjpegDecodeBatchedSupported"),
                _lib: lib,
            })
        }
    }
}

/// Live allocations by address: bytes, and the budget they were charged to.
type Charges = HashMap<usize, (usize, Arc<Budget>)>;

/// The budget new nvJPEG device allocations are charged to: the last backend opened (a C
/// callback has no context pointer).
static BUDGET: Mutex<Option<Arc<Budget>>> = Mutex::new(None);
/// nvJPEG's live allocations: size and the budget charged, credited back on free.
static LIVE: LazyLock<Mutex<Charges>> = LazyLock::new(Default::default);

extern "C" fn dev_malloc(ptr: *mut *mut c_void, size: usize) -> c_int {
    const FAILED: c_int = 2; // cudaErrorMemoryAllocation
    let Some(budget) = BUDGET.lock().clone() else {
        return FAILED;
    };
    if ptr.is_null() || !budget.take(size as u64) {
        return FAILED;
    }
    // SAFETY: nvJPEG calls this on its decoding thread, with the context current.
    match unsafe { cudarc::driver::result::malloc_sync(size.max(1)) } {
        Ok(p) => {
            LIVE.lock().insert(p as usize, (size, budget));
            // SAFETY: `ptr` is nvJPEG's out-parameter, checked non-null above.
            unsafe { *ptr = p as *mut c_void };
            0
        }
        Err(_) => {
            budget.give(size as u64);
            FAILED
        }
    }
}

extern "C" fn dev_free(ptr: *mut c_void) -> c_int {
    if ptr.is_null() {
        return 0;
    }
    let charged = LIVE.lock().remove(&(ptr as usize));
    // SAFETY: `ptr` came from `dev_malloc`.
    let freed = unsafe { cudarc::driver::result::free_sync(ptr as u64) };
    if let Some((size, budget)) = charged {
        budget.give(size as u64);
    }
    if freed.is_ok() { 0 } else { 1 }
}

/// An image's header as nvJPEG reads it.
#[derive(Debug, Clone, Copy)]
pub struct Info {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// A loaded nvJPEG with its handles: `batched` on the hardware engine when present, `single`
/// on the default backend for what the engine does not take.
pub struct Nvjpeg {
    api: Api,
    batched: (Handle, State),
    single: (Handle, State),
    hardware: bool,
    stream: JpegStream,
    /// Where the library was loaded from.
    pub path: String,
}

// SAFETY: the handles are used by one thread at a time (the decode thread owns `Nvjpeg`).
unsafe impl Send for Nvjpeg {}

fn check(what: &str, status: Status) -> Result<(), String> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: nvJPEG status {status}"))
    }
}

impl Nvjpeg {
    /// Loads nvJPEG by the documented search order and creates its handles, charging its
    /// device memory to `budget`.
    pub fn open(explicit: Option<&std::path::Path>, budget: Arc<Budget>) -> Result<Nvjpeg, String> {
        let candidates = libs::candidates(Lib::Nvjpeg, explicit, &libs::python_envs_from_env());
        let mut tried = Vec::new();
        let (lib, path) = candidates
            .iter()
            .find_map(|c| {
                let name = match c {
                    Candidate::Path(p) => p.as_os_str().to_owned(),
                    Candidate::Name(n) => n.into(),
                };
                // SAFETY: loading nvJPEG runs its initialisers, which only set up the library.
                match unsafe { Library::new(&name) } {
                    Ok(lib) => Some((lib, c.to_string())),
                    Err(e) => {
                        tried.push(format!("{c}: {e}"));
                        None
                    }
                }
            })
            .ok_or_else(|| format!("nvJPEG not found; tried {}", tried.join("; ")))?;
        let api = Api::load(lib)?;
        *BUDGET.lock() = Some(budget);
        let mut allocator = DevAllocator {
            dev_malloc,
            dev_free,
        };
        let create =
            |backend: c_int, allocator: &mut DevAllocator| -> Result<(Handle, State), String> {
                let mut handle: Handle = std::ptr::null_mut();
                let mut state: State = std::ptr::null_mut();
                // SAFETY: out-parameters are valid; the allocator outlives the call (nvJPEG copies it).
                unsafe {
                    check(
                        "nvjpegCreateEx",
                        (api.create_ex)(backend, allocator, std::ptr::null_mut(), 0, &mut handle),
                    )?;
                    if let Err(e) = check(
                        "nvjpegJpegStateCreate",
                        (api.state_create)(handle, &mut state),
                    ) {
                        (api.destroy)(handle);
                        return Err(e);
                    }
                }
                Ok((handle, state))
            };
        let single = create(BACKEND_DEFAULT, &mut allocator)?;
        let (batched, hardware) = match create(BACKEND_HARDWARE, &mut allocator) {
            Ok(h) => (h, true),
            Err(e) => {
                tracing::info!(error = %e, "no JPEG hardware engine; nvJPEG decodes on the GPU's cores");
                (create(BACKEND_DEFAULT, &mut allocator)?, false)
            }
        };
        let mut stream: JpegStream = std::ptr::null_mut();
        // SAFETY: valid handle and out-parameter.
        check("nvjpegJpegStreamCreate", unsafe {
            (api.stream_create)(batched.0, &mut stream)
        })?;
        Ok(Nvjpeg {
            api,
            batched,
            single,
            hardware,
            stream,
            path,
        })
    }

    /// "hardware" when the JPEG engine decodes batches, else "default".
    pub fn backend(&self) -> &'static str {
        if self.hardware { "hardware" } else { "default" }
    }

    /// The dimensions of `data`, or why nvJPEG will not take it.
    pub fn info(&self, data: &[u8]) -> Result<Info, String> {
        let (mut n, mut css) = (0 as c_int, 0 as c_int);
        let (mut widths, mut heights) = ([0 as c_int; MAX_COMPONENT], [0 as c_int; MAX_COMPONENT]);
        // SAFETY: the arrays have NVJPEG_MAX_COMPONENT entries, as the call requires.
        check("nvjpegGetImageInfo", unsafe {
            (self.api.get_image_info)(
                self.single.0,
                data.as_ptr(),
                data.len(),
                &mut n,
                &mut css,
                widths.as_mut_ptr(),
                heights.as_mut_ptr(),
            )
        })?;
        if css == CSS_UNKNOWN || !(1..=4).contains(&n) || widths[0] <= 0 || heights[0] <= 0 {
            return Err(format!(
                "unsupported JPEG ({n} components, subsampling {css})"
            ));
        }
        Ok(Info {
            width: widths[0] as u32,
            height: heights[0] as u32,
        })
    }

    /// Whether the batched handle takes `data` (always, without the hardware engine).
    pub fn batchable(&self, data: &[u8]) -> bool {
        if !self.hardware {
            return true;
        }
        let mut unsupported: c_int = 1;
        // SAFETY: valid handle and stream; `data` outlives the calls (save_stream = 0 copies
        // nothing we keep).
        unsafe {
            (self.api.stream_parse)(self.batched.0, data.as_ptr(), data.len(), 0, 0, self.stream)
                == SUCCESS
                && (self.api.batched_supported)(self.batched.0, self.stream, &mut unsupported)
                    == SUCCESS
                && unsupported == 0
        }
    }

    /// Decodes `images` (data, destination) as one batch on `stream`; the caller synchronises.
    ///
    /// # Safety
    /// Each destination must point to device memory of `pitch * height` bytes for its image's
    /// `info`, valid until `stream` completes.
    pub unsafe fn decode_batch(
        &self,
        images: &[(&[u8], Image)],
        stream: Stream,
    ) -> Result<(), String> {
        let data: Vec<*const u8> = images.iter().map(|(d, _)| d.as_ptr()).collect();
        let lengths: Vec<usize> = images.iter().map(|(d, _)| d.len()).collect();
        let mut out: Vec<Image> = images.iter().map(|(_, i)| *i).collect();
        let (handle, state) = self.batched;
        // SAFETY: the arrays hold `images.len()` entries; destinations per the contract.
        unsafe {
            check(
                "nvjpegDecodeBatchedInitialize",
                (self.api.batched_init)(handle, state, images.len() as c_int, 1, OUTPUT_RGBI),
            )?;
            check(
                "nvjpegDecodeBatched",
                (self.api.batched)(
                    handle,
                    state,
                    data.as_ptr(),
                    lengths.as_ptr(),
                    out.as_mut_ptr(),
                    stream,
                ),
            )
        }
    }

    /// Decodes one image on the default backend, on `stream`.
    ///
    /// # Safety
    /// As `decode_batch`.
    pub unsafe fn decode_one(
        &self,
        data: &[u8],
        mut image: Image,
        stream: Stream,
    ) -> Result<(), String> {
        // SAFETY: per the contract.
        check("nvjpegDecode", unsafe {
            (self.api.decode)(
                self.single.0,
                self.single.1,
                data.as_ptr(),
                data.len(),
                OUTPUT_RGBI,
                &mut image,
                stream,
            )
        })
    }
}

impl Drop for Nvjpeg {
    fn drop(&mut self) {
        // SAFETY: the handles were created by `open` and are no longer used.
        unsafe {
            (self.api.stream_destroy)(self.stream);
            for (handle, state) in [self.batched, self.single] {
                (self.api.state_destroy)(state);
                (self.api.destroy)(handle);
            }
        }
    }
}
