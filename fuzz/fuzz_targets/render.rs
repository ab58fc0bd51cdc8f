//! Fuzzes the view decode path with arbitrary bytes: header probe, the plan's draws, the
//! libjpeg-turbo part decode (region and DCT scale), the whole decode, ops and .npy output, and
//! the restart-marked copy (`jpeg::restart_marked`) with the cuts parts are decoded from.
//!
//! The first byte picks a pipeline, the next eight the seed; the rest is the "image". Beyond
//! "never panic, never hang, never allocate past the limits", it checks two promises: a render
//! that succeeds has exactly the size announced from the header alone (getattr relies on it),
//! and a part decoded at full scale, from the image or cut from its restart-marked copy, equals
//! the whole decode over the region it holds (renders from cached whole pixels, from parts and
//! from copies give the same bytes).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prepfs::view::jpeg::{self, Jpeg};
use prepfs::view::npy::{self, Dtype};
use prepfs::view::{Output, ViewSpec, plan, render};

const PIPELINES: [&str; 7] = [
    "a=decode,random_resized_crop(224),hflip,normalize(imagenet)",
    "b=decode,resize(256),center_crop(224),normalize(imagenet)",
    "c=decode,resize(48),uint8(hwc)",
    "d=decode,center_crop(7, 300),hflip(1),uint8",
    "e=decode,random_resized_crop(32, scale=(0.01, 1), ratio=(0.1, 10)),resize(9)",
    "f=decode",
    "g=decode,random_resized_crop(8, scale=(0.5, 1)),uint8(hwc)",
];

fn specs() -> &'static [ViewSpec] {
    static SPECS: OnceLock<Vec<ViewSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        PIPELINES
            .iter()
            .map(|p| ViewSpec::parse(p).expect("the fuzz pipelines are valid"))
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Some((seed, image)) = rest.split_first_chunk::<8>() else {
        return;
    };
    let (spec, seed) = (&specs()[usize::from(pick) % PIPELINES.len()], u64::from_le_bytes(*seed));
    let size = render::dimensions(image).ok();
    let announced = size.and_then(|(w, h)| {
        let (h, w) = plan::output_size(spec, w, h).ok()?;
        let dtype = match spec.output {
            Output::Float32Chw => Dtype::F32,
            Output::Uint8Chw | Output::Uint8Hwc => Dtype::U8,
        };
        Some(npy::file_size(dtype, &spec.shape(h, w)))
    });
    if let Ok(rendered) = render::render(spec, image, seed) {
        assert_eq!(
            Some(rendered.npy.len() as u64),
            announced,
            "a successful render must have the size announced from the header"
        );
    }
    // The part the render's draws read, at full scale and at theirs, against the whole decode.
    let Some((w, h)) = size else {
        return;
    };
    let Ok(draws) = plan::draw(spec, w, h, seed) else {
        return;
    };
    let read = draws.first_read(w, h);
    let Ok(mut jpeg) = Jpeg::open(image) else {
        return;
    };
    if jpeg.size() != (w, h) {
        return;
    }
    let scaled = jpeg.part(read.region, read.shrink);
    let (sw, sh) = (w.div_ceil(read.shrink), h.div_ceil(read.shrink));
    assert!(scaled.origin.0 + scaled.size.0 <= sw && scaled.origin.1 + scaled.size.1 <= sh);
    if let Ok(pixels) = jpeg.decode(&scaled) {
        assert_eq!(pixels.len(), scaled.size.0 as usize * scaled.size.1 as usize * 3);
    }
    let everything = jpeg.part((0, 0, w, h), 1);
    let Ok(whole) = jpeg.decode(&everything) else {
        return;
    };
    let (left, top, rw, rh) = read.region;
    let row = |y: u32, x: u32, width: u32| (y as usize * width as usize + x as usize) * 3;
    let check = |jpeg: &mut Jpeg, what: &str| {
        let part = jpeg.part(read.region, 1);
        let Ok(pixels) = jpeg.decode(&part) else {
            return;
        };
        let (x0, y0) = part.origin;
        for y in top..top + rh {
            let mine = &pixels[row(y - y0, left - x0, part.size.0)..][..rw as usize * 3];
            let theirs = &whole[row(y, left, w)..][..rw as usize * 3];
            assert!(mine == theirs, "row {y} of the {what} differs from the whole decode");
        }
    };
    check(&mut jpeg, "part");
    // The restart-marked copy decodes to the same pixels, its parts through a cut of it.
    if let Ok(copy) = jpeg::restart_marked(image) {
        let mut marked = Jpeg::open(&copy).expect("libjpeg-turbo reads the copy it wrote");
        assert_eq!(marked.size(), (w, h));
        check(&mut marked, "part cut from the restart-marked copy");
    }
});
