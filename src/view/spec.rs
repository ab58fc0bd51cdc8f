//! `ViewSpec`: the pipeline language of `--view NAME='decode,random_resized_crop(224),...'`.
//!
//! Owns parsing and validating a view definition into typed ops, and what the ops imply before
//! any image is seen (the output shape, given the input's dimensions). Errors name the offending
//! op. Must never decode an image or touch the source.

use std::fmt;

use super::limits::{self, MAX_DECODE_BYTES, MAX_SIDE};

/// ImageNet channel means and standard deviations (torchvision's constants).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// See [`IMAGENET_MEAN`].
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];
/// Longest view name, so names stay usable as directory names.
const NAME_MAX: usize = 64;

/// One step of a view pipeline.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Scale so the shorter side is `short` (torchvision `Resize(int)`), or to exactly (h, w).
    Resize(Size),
    /// Cut the central (h, w) region (torchvision `CenterCrop`).
    CenterCrop { height: u32, width: u32 },
    /// torchvision `RandomResizedCrop(size, scale, ratio)`.
    RandomResizedCrop {
        height: u32,
        width: u32,
        scale: (f64, f64),
        ratio: (f64, f64),
    },
    /// Mirror left-right with probability `p`.
    HorizontalFlip { p: f64 },
    /// (x / 255 - mean) / std per channel; float32 output only.
    Normalize { mean: [f32; 3], std: [f32; 3] },
}

impl Op {
    /// The op's name in the pipeline language.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Resize(_) => "resize",
            Op::CenterCrop { .. } => "center_crop",
            Op::RandomResizedCrop { .. } => "random_resized_crop",
            Op::HorizontalFlip { .. } => "hflip",
            Op::Normalize { .. } => "normalize",
        }
    }
}

/// The target of a resize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// Shorter side to this length, aspect ratio kept.
    Short(u32),
    /// Exactly this (height, width).
    Exact(u32, u32),
}

/// Element type and layout of the .npy files a view serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// float32, channels first (3, H, W): what ToTensor (+ Normalize) gives.
    Float32Chw,
    /// uint8, channels first (3, H, W).
    Uint8Chw,
    /// uint8, channels last (H, W, 3): the decoded image's own layout.
    Uint8Hwc,
}

impl Output {
    /// Bytes per element.
    pub fn element_bytes(self) -> usize {
        match self {
            Output::Float32Chw => 4,
            Output::Uint8Chw | Output::Uint8Hwc => 1,
        }
    }

    /// The .npy element type.
    pub fn dtype(self) -> super::npy::Dtype {
        match self {
            Output::Float32Chw => super::npy::Dtype::F32,
            Output::Uint8Chw | Output::Uint8Hwc => super::npy::Dtype::U8,
        }
    }
}

/// A parsed, validated view.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewSpec {
    /// The directory name under `.prepfs/views/`.
    pub name: String,
    /// The ops after `decode`, in order.
    pub ops: Vec<Op>,
    /// What the files contain.
    pub output: Output,
    /// The definition as given (for logs and stats).
    pub text: String,
}

/// Why a view definition was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

impl ViewSpec {
    /// Parses `NAME=op,op(args),...`.
    pub fn parse(definition: &str) -> Result<ViewSpec, SpecError> {
        let (name, pipeline) = definition.split_once('=').ok_or_else(|| {
            SpecError(format!(
                "view `{definition}`: expected NAME='decode,...' (for example train='decode,random_resized_crop(224),hflip,normalize(imagenet)')"
            ))
        })?;
        let name = name.trim();
        if name.is_empty()
            || name.len() > NAME_MAX
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(SpecError(format!(
                "view name `{name}`: use 1-{NAME_MAX} letters, digits, `_` or `-`"
            )));
        }
        let err = |op: &str, why: String| SpecError(format!("view {name}: `{op}`: {why}"));
        let words = split_top_level(pipeline).map_err(|why| err(pipeline.trim(), why))?;
        let mut words = words.into_iter();
        match words.next() {
            Some(first) if first == "decode" => {}
            Some(first) => return Err(err(&first, "the pipeline must start with `decode`".into())),
            None => return Err(err("", "empty pipeline".into())),
        }
        let mut ops = Vec::new();
        let mut output = None;
        for word in words {
            if let Some(out) = output {
                return Err(err(
                    &word,
                    format!("nothing may follow the output type `{out:?}`"),
                ));
            }
            let (op, args) = parse_call(&word).map_err(|why| err(&word, why))?;
            let parsed = match op.as_str() {
                "resize" => Op::Resize(
                    match positional_ints(&args).map_err(|w| err(&word, w))?[..] {
                        [short] => Size::Short(positive(short).map_err(|w| err(&word, w))?),
                        [h, w] => {
                            let (h, w) = image_size(h, w).map_err(|e| err(&word, e))?;
                            Size::Exact(h, w)
                        }
                        _ => return Err(err(&word, "takes a size or a height and a width".into())),
                    },
                ),
                "center_crop" => {
                    let (height, width) = size_args(&args).map_err(|w| err(&word, w))?;
                    Op::CenterCrop { height, width }
                }
                "random_resized_crop" => {
                    let mut sizes = Vec::new();
                    let (mut scale, mut ratio) = ((0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0));
                    for arg in &args {
                        match arg {
                            Arg::Named(key, value) if key == "scale" => {
                                scale = pair(value).map_err(|w| err(&word, w))?
                            }
                            Arg::Named(key, value) if key == "ratio" => {
                                ratio = pair(value).map_err(|w| err(&word, w))?
                            }
                            Arg::Named(key, _) => {
                                return Err(err(
                                    &word,
                                    format!("unknown argument `{key}` (scale, ratio)"),
                                ));
                            }
                            Arg::Value(v) => sizes.push(Arg::Value(v.clone())),
                        }
                    }
                    let (height, width) = size_args(&sizes).map_err(|w| err(&word, w))?;
                    if !(0.0 < scale.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
                        return Err(err(&word, "scale must satisfy 0 < min <= max <= 1".into()));
                    }
                    if !(0.0 < ratio.0 && ratio.0 <= ratio.1) {
                        return Err(err(&word, "ratio must satisfy 0 < min <= max".into()));
                    }
                    Op::RandomResizedCrop {
                        height,
                        width,
                        scale,
                        ratio,
                    }
                }
                "hflip" => {
                    let p = match &args[..] {
                        [] => 0.5,
                        [Arg::Value(v)] => number(v).map_err(|w| err(&word, w))?,
                        _ => {
                            return Err(err(
                                &word,
                                "takes one probability, e.g. hflip(0.5)".into(),
                            ));
                        }
                    };
                    if !(0.0..=1.0).contains(&p) {
                        return Err(err(&word, "probability must be within 0..1".into()));
                    }
                    Op::HorizontalFlip { p }
                }
                "normalize" => parse_normalize(&args).map_err(|w| err(&word, w))?,
                "float32" | "uint8" => {
                    let layout = match &args[..] {
                        [] => "chw".to_owned(),
                        [Arg::Value(v)] => v.to_ascii_lowercase(),
                        _ => return Err(err(&word, "takes a layout, chw or hwc".into())),
                    };
                    output = Some(match (op.as_str(), layout.as_str()) {
                        ("float32", "chw") => Output::Float32Chw,
                        ("uint8", "chw") => Output::Uint8Chw,
                        ("uint8", "hwc") => Output::Uint8Hwc,
                        _ => {
                            return Err(err(
                                &word,
                                "layouts: float32(chw), uint8(chw), uint8(hwc)".into(),
                            ));
                        }
                    });
                    continue;
                }
                "decode" => return Err(err(&word, "`decode` comes once, first".into())),
                other => {
                    return Err(err(
                        &word,
                        format!(
                            "unknown op `{other}` (resize, center_crop, random_resized_crop, hflip, normalize, float32, uint8)"
                        ),
                    ));
                }
            };
            ops.push(parsed);
        }
        let output = output.unwrap_or(Output::Float32Chw);
        if output != Output::Float32Chw
            && let Some(Op::Normalize { .. }) =
                ops.iter().find(|o| matches!(o, Op::Normalize { .. }))
        {
            return Err(err(
                "normalize",
                "normalized values need float32 output".into(),
            ));
        }
        Ok(ViewSpec {
            name: name.to_owned(),
            ops,
            output,
            text: pipeline.trim().to_owned(),
        })
    }

    /// The output (height, width) for an input of (`width`, `height`) pixels.
    pub fn output_size(&self, width: u32, height: u32) -> (u32, u32) {
        let (mut h, mut w) = (height, width);
        for op in &self.ops {
            (h, w) = match *op {
                Op::Resize(Size::Exact(rh, rw)) => (rh, rw),
                Op::Resize(Size::Short(short)) => short_side(h, w, short),
                Op::CenterCrop { height, width } | Op::RandomResizedCrop { height, width, .. } => {
                    (height, width)
                }
                Op::HorizontalFlip { .. } | Op::Normalize { .. } => (h, w),
            };
        }
        (h, w)
    }

    /// The output (height, width) whatever the input, if the pipeline fixes it.
    pub fn fixed_size(&self) -> Option<(u32, u32)> {
        let a = self.output_size(1000, 700);
        (a == self.output_size(331, 977)).then_some(a)
    }

    /// The shape of the array, in numpy's order.
    pub fn shape(&self, height: u32, width: u32) -> [usize; 3] {
        let (h, w) = (height as usize, width as usize);
        match self.output {
            Output::Float32Chw | Output::Uint8Chw => [3, h, w],
            Output::Uint8Hwc => [h, w, 3],
        }
    }

    /// Bytes of the .npy file of this view's output at `height` x `width`.
    pub fn npy_size(&self, height: u32, width: u32) -> u64 {
        super::npy::file_size(self.output.dtype(), &self.shape(height, width))
    }
}

/// (height, width) after scaling the shorter side of (h, w) to `short`, as torchvision does
/// (the longer side truncated after scaling; saturated at `u32::MAX`, far past any pixel limit).
pub fn short_side(h: u32, w: u32, short: u32) -> (u32, u32) {
    let long = |long: u32, short_in: u32| {
        u32::try_from(u64::from(short) * u64::from(long) / u64::from(short_in.max(1)))
            .unwrap_or(u32::MAX)
    };
    if h <= w {
        (short, long(w, h))
    } else {
        (long(h, w), short)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Arg {
    Value(String),
    Named(String, String),
}

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let (mut depth, mut current) = (0i32, String::new());
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return Err("unbalanced `)`".into());
        }
        if c == ',' && depth == 0 {
            out.push(current.trim().to_owned());
            current.clear();
        } else {
            current.push(c);
        }
    }
    if depth != 0 {
        return Err("unbalanced `(`".into());
    }
    out.push(current.trim().to_owned());
    if out.iter().any(String::is_empty) {
        return Err("empty op (two commas in a row?)".into());
    }
    Ok(out)
}

fn parse_call(word: &str) -> Result<(String, Vec<Arg>), String> {
    let Some(open) = word.find('(') else {
        return Ok((word.to_owned(), Vec::new()));
    };
    let inner = word[open + 1..]
        .strip_suffix(')')
        .ok_or("text after the closing `)`")?;
    let name = word[..open].trim().to_owned();
    if inner.trim().is_empty() {
        return Ok((name, Vec::new()));
    }
    let args = split_top_level(inner)?
        .into_iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) => Arg::Named(k.trim().to_owned(), v.trim().to_owned()),
            None => Arg::Value(a),
        })
        .collect();
    Ok((name, args))
}

fn number(text: &str) -> Result<f64, String> {
    let (num, den) = match text.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (text, None),
    };
    let parse = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| format!("`{text}` is not a number"))
    };
    let value = parse(num)?;
    match den {
        Some(d) => Ok(value / parse(d)?),
        None => Ok(value),
    }
}

fn positive(value: u64) -> Result<u32, String> {
    u32::try_from(value)
        .ok()
        .filter(|v| (1..=MAX_SIDE).contains(v))
        .ok_or_else(|| format!("size {value} is outside 1..{MAX_SIDE}"))
}

/// (height, width) of an image an op makes: each side `positive`, and within the pixel limits
/// of a render (a larger one would fail every file).
fn image_size(height: u64, width: u64) -> Result<(u32, u32), String> {
    let (h, w) = (positive(height)?, positive(width)?);
    if !limits::within_limits(w, h) {
        return Err(format!(
            "{h}x{w} pixels are over the {} MiB of RGB an image may have",
            MAX_DECODE_BYTES >> 20
        ));
    }
    Ok((h, w))
}

fn positional_ints(args: &[Arg]) -> Result<Vec<u64>, String> {
    args.iter()
        .map(|a| match a {
            Arg::Value(v) => v
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("`{v}` is not a whole number")),
            Arg::Named(k, _) => Err(format!("unexpected argument `{k}`")),
        })
        .collect()
}

fn size_args(args: &[Arg]) -> Result<(u32, u32), String> {
    match positional_ints(args)?[..] {
        [s] => image_size(s, s),
        [h, w] => image_size(h, w),
        _ => Err("takes a size or a height and a width".into()),
    }
}

fn tuple(value: &str) -> Result<Vec<f64>, String> {
    let inner = value
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| format!("`{value}`: expected a tuple like (0.08, 1.0)"))?;
    inner.split(',').map(number).collect()
}

fn pair(value: &str) -> Result<(f64, f64), String> {
    match tuple(value)?[..] {
        [a, b] => Ok((a, b)),
        _ => Err(format!("`{value}`: expected two numbers")),
    }
}

fn triple(value: &str) -> Result<[f32; 3], String> {
    match tuple(value)?[..] {
        [a, b, c] => Ok([a as f32, b as f32, c as f32]),
        _ => Err(format!("`{value}`: expected three numbers (R, G, B)")),
    }
}

fn parse_normalize(args: &[Arg]) -> Result<Op, String> {
    match args {
        [Arg::Value(v)] if v == "imagenet" => Ok(Op::Normalize {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }),
        [Arg::Named(a, m), Arg::Named(b, s)] if a == "mean" && b == "std" => {
            let std = triple(s)?;
            if std.iter().any(|v| *v <= 0.0) {
                return Err("std must be positive".into());
            }
            Ok(Op::Normalize {
                mean: triple(m)?,
                std,
            })
        }
        _ => Err("use normalize(imagenet) or normalize(mean=(r,g,b), std=(r,g,b))".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_examples_parse_with_torchvision_defaults() {
        let train =
            ViewSpec::parse("train=decode,random_resized_crop(224),hflip,normalize(imagenet)")
                .expect("parses");
        assert_eq!(train.name, "train");
        assert_eq!(
            train.ops,
            vec![
                Op::RandomResizedCrop {
                    height: 224,
                    width: 224,
                    scale: (0.08, 1.0),
                    ratio: (0.75, 4.0 / 3.0)
                },
                Op::HorizontalFlip { p: 0.5 },
                Op::Normalize {
                    mean: IMAGENET_MEAN,
                    std: IMAGENET_STD
                },
            ]
        );
        assert_eq!(train.output, Output::Float32Chw);
        assert_eq!(train.fixed_size(), Some((224, 224)));
        let val = ViewSpec::parse("val=decode,resize(256),center_crop(224),normalize(imagenet)")
            .expect("parses");
        assert_eq!(val.fixed_size(), Some((224, 224)));
        assert_eq!(val.shape(224, 224), [3, 224, 224]);
    }

    #[test]
    fn arguments_tuples_and_outputs_parse() {
        let v = ViewSpec::parse(
            "small = decode, random_resized_crop(128, 96, scale=(0.5, 1), ratio=(3/4, 4/3)), hflip(0), uint8(hwc)",
        )
        .expect("parses");
        assert_eq!(
            v.ops[0],
            Op::RandomResizedCrop {
                height: 128,
                width: 96,
                scale: (0.5, 1.0),
                ratio: (0.75, 4.0 / 3.0)
            }
        );
        assert_eq!(v.output, Output::Uint8Hwc);
        assert_eq!(v.shape(128, 96), [128, 96, 3]);
        let r = ViewSpec::parse("r=decode,resize(100)").expect("parses");
        assert_eq!(r.fixed_size(), None, "shape follows the image");
        assert_eq!(r.output_size(500, 375), (100, 133));
        assert_eq!(r.output_size(375, 500), (133, 100));
        let big = ViewSpec::parse("b=decode,center_crop(8192, 5461)").expect("128 MiB fits");
        assert_eq!(big.fixed_size(), Some((8192, 5461)));
    }

    #[test]
    fn a_short_side_resize_of_an_extreme_aspect_ratio_saturates_instead_of_wrapping() {
        assert_eq!(short_side(1, 16384, 256), (256, 4_194_304));
        assert_eq!(short_side(16384, 1, 256), (4_194_304, 256));
        assert_eq!(
            short_side(1, 4_194_304 << 8, 16384),
            (16384, u32::MAX),
            "2^44 does not fit"
        );
    }

    #[test]
    fn bad_specs_name_the_offending_op() {
        for (spec, needle) in [
            ("train", "expected NAME="),
            ("bad name=decode", "view name"),
            ("t=resize(3)", "must start with `decode`"),
            ("t=decode,resize(0)", "`resize(0)`"),
            ("t=decode,rotate(3)", "unknown op `rotate`"),
            ("t=decode,center_crop(22x)", "`22x` is not a whole number"),
            (
                "t=decode,random_resized_crop(224, scale=(2, 1))",
                "scale must satisfy",
            ),
            ("t=decode,hflip(1.5)", "within 0..1"),
            ("t=decode,normalize(cifar)", "normalize(imagenet)"),
            ("t=decode,normalize(imagenet),uint8", "need float32"),
            ("t=decode,uint8,hflip", "nothing may follow"),
            ("t=decode,center_crop(2", "unbalanced"),
            ("t=decode,,hflip", "empty op"),
            ("t=decode,resize(16385)", "outside 1..16384"),
            (
                "t=decode,center_crop(16384)",
                "`center_crop(16384)`: 16384x16384 pixels are over",
            ),
            (
                "t=decode,resize(8000, 6000)",
                "`resize(8000, 6000)`: 8000x6000 pixels are over",
            ),
            ("t=decode,random_resized_crop(7000)", "over the 128 MiB"),
        ] {
            let e = ViewSpec::parse(spec).expect_err(spec).0;
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }
}
