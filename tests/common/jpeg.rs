//! JPEG test images as cameras and most datasets store them: libjpeg-turbo's encoder at
//! `QUALITY`, with any chroma subsampling, progressive or not (the image crate's encoder writes
//! baseline 4:4:4 only). One copy for the real-mount tests (`common::jpeg`), the decode bench
//! and the unit tests of src/view/jpeg.rs (each includes this file by `#[path]`). Test code: it
//! panics on what a test cannot go on without.

#![allow(dead_code)]

/// Quality of every encoded test image: the synthetic photos' own.
pub const QUALITY: i32 = 90;

/// `img` encoded by libjpeg-turbo at `QUALITY` with `subsampling`, progressive or not.
pub fn encode(
    img: &image::RgbImage,
    subsampling: turbojpeg::Subsamp,
    progressive: bool,
) -> Vec<u8> {
    let (width, height) = (img.width() as usize, img.height() as usize);
    let image = turbojpeg::Image {
        pixels: img.as_raw().as_slice(),
        width,
        pitch: width * 3,
        height,
        format: turbojpeg::PixelFormat::RGB,
    };
    let mut compressor = turbojpeg::Compressor::new().expect("compressor");
    compressor.set_quality(QUALITY).expect("quality");
    compressor.set_subsamp(subsampling).expect("subsampling");
    compressor
        .set_progressive(progressive)
        .expect("progressive");
    compressor.compress_to_vec(image).expect("encodes")
}

/// `img` encoded 4:2:0, baseline.
pub fn encode_420(img: &image::RgbImage) -> Vec<u8> {
    encode(img, turbojpeg::Subsamp::Sub2x2, false)
}

/// `img` mirrored as often as it takes to fill `width` x `height` (a photo's detail at every
/// scale, unlike an upscale).
pub fn mirrored(img: &image::RgbImage, width: u32, height: u32) -> image::RgbImage {
    let (w, h) = img.dimensions();
    let fold = |v: u32, n: u32| {
        let v = v % (2 * n);
        if v < n { v } else { 2 * n - 1 - v }
    };
    image::RgbImage::from_fn(width, height, |x, y| *img.get_pixel(fold(x, w), fold(y, h)))
}
