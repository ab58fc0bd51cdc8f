//! Fuzzes the view decode path with arbitrary bytes: header probe, decode, ops and .npy output.
//!
//! The first byte picks a pipeline, the next eight the seed; the rest is the "image". Beyond
//! "never panic, never hang, never allocate past the limits", it checks the promise getattr
//! relies on: a render that succeeds has exactly the size announced from the header alone.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prepfs::view::npy::{self, Dtype};
use prepfs::view::{Output, ViewSpec, plan, render};

const PIPELINES: [&str; 6] = [
    "a=decode,random_resized_crop(224),hflip,normalize(imagenet)",
    "b=decode,resize(256),center_crop(224),normalize(imagenet)",
    "c=decode,resize(48),uint8(hwc)",
    "d=decode,center_crop(7, 300),hflip(1),uint8",
    "e=decode,random_resized_crop(32, scale=(0.01, 1), ratio=(0.1, 10)),resize(9)",
    "f=decode",
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
    let spec = &specs()[usize::from(pick) % PIPELINES.len()];
    let announced = render::dimensions(image).ok().and_then(|(w, h)| {
        let (h, w) = plan::output_size(spec, w, h).ok()?;
        let dtype = match spec.output {
            Output::Float32Chw => Dtype::F32,
            Output::Uint8Chw | Output::Uint8Hwc => Dtype::U8,
        };
        Some(npy::file_size(dtype, &spec.shape(h, w)))
    });
    if let Ok(rendered) = render::render(spec, image, u64::from_le_bytes(*seed)) {
        assert_eq!(
            Some(rendered.npy.len() as u64),
            announced,
            "a successful render must have the size announced from the header"
        );
    }
});
