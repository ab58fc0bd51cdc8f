//! Restart segments: entering a JPEG's entropy-coded data in the middle.
//!
//! A baseline JPEG's MCUs are Huffman-coded as one bit stream, so decoding any of them means
//! decoding every MCU before it; even a cropped libjpeg-turbo decode reads every column of every
//! row down to the crop's bottom edge (a third of a view's render). A copy of the JPEG with a
//! restart marker every few MCUs (made losslessly by `jpeg::restart_marked`, its interval chosen
//! here by `interval_for` so that a whole number of segments spans each MCU row) can be entered
//! at any segment: each starts byte-aligned with its DC predictions reset. `Segments::cut` builds
//! the smaller JPEG that holds only the MCU rows and segment columns around a region (the same
//! headers with the frame's size patched, the chosen segments renumbered): decoding it gives the
//! region's pixels exactly as decoding the whole image does, for about the Huffman work of the
//! region alone. libjpeg-turbo decodes any JPEG with restart markers on its slower Huffman path:
//! a 320x240 crop decodes in 0.56 ms with them and 0.52 without (BENCHMARKS.md), so a cut spliced
//! without them (first DC codes re-coded, bits shifted) would save ~0.04 ms less the splice.
//!
//! Owns parsing a JPEG's marker structure (bounded: every length is checked against the bytes;
//! anything it does not expect is `None`, and the caller decodes the file the ordinary way; a
//! file whose restart markers are out of turn is told apart, `Restarts::OutOfTurn`, since no
//! part of it may be decoded alone), the segment table a copy carries so that renders need not
//! scan it (`with_index`), and the cut. Must never decode (libjpeg-turbo does, in `jpeg`) nor be
//! trusted for validity: a cut is only ever handed to libjpeg-turbo, which checks everything
//! again.

use std::ops::Range;

/// Width in pixels a segment should span: narrow enough that a crop's columns cost little more
/// than themselves, wide enough that the ~3 bytes a restart marker adds (alignment, the marker,
/// DC predictions coded afresh) stay a few percent of the data.
const SEGMENT_WIDTH: u32 = 48;
/// The widest segment `interval_for` accepts before giving each MCU row one segment. Narrow
/// ones are kept: even segments of one MCU decode faster than whole rows (measured).
const SEGMENT_WIDTH_MAX: u32 = 128;

/// The APP15 segment in which `with_index` records a copy's segment table: this signature, then
/// each segment's length in bytes (its restart marker not counted), u16 little-endian.
const INDEX_SIGNATURE: &[u8] = b"prepfs segments\0";
/// The marker code of an APP15 segment.
const APP15: u8 = 0xEF;

/// `jpeg`, a restart-marked copy `Segments::find` can read, with its segment table recorded in an
/// APP15 segment after SOI (decoders skip it), so that `find` reads the table instead of scanning
/// the data for markers on every render; `jpeg` as it is when it has no segments to record, a
/// table already, a segment of 64 KiB or more, or more segments than one APP segment holds
/// (32,751).
pub fn with_index(jpeg: Vec<u8>) -> Vec<u8> {
    let table = match Segments::find(&jpeg) {
        Some(found) if found.index.is_none() => {
            let mut table = INDEX_SIGNATURE.to_vec();
            for segment in &found.segments {
                let Ok(len) = u16::try_from(segment.len()) else {
                    return jpeg;
                };
                table.extend_from_slice(&len.to_le_bytes());
            }
            table
        }
        _ => return jpeg,
    };
    let Ok(length) = u16::try_from(table.len() + 2) else {
        return jpeg;
    };
    let mut out = Vec::with_capacity(jpeg.len() + 4 + table.len());
    out.extend_from_slice(&jpeg[..2]);
    out.extend_from_slice(&[0xFF, APP15]);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(&table);
    out.extend_from_slice(&jpeg[2..]);
    out
}

/// The restart interval (in MCUs) that splits each row of `mcus_per_row` MCUs of `mcu_width`
/// pixels into equal segments about `SEGMENT_WIDTH` pixels wide: the divisor of the row nearest
/// it, or the whole row when no divisor is narrow enough.
pub fn interval_for(mcus_per_row: u32, mcu_width: u32) -> u32 {
    (1..=mcus_per_row)
        .filter(|k| mcus_per_row.is_multiple_of(*k))
        .filter(|k| k * mcu_width <= SEGMENT_WIDTH_MAX)
        .min_by_key(|k| (k * mcu_width).abs_diff(SEGMENT_WIDTH))
        .unwrap_or(mcus_per_row.max(1))
}

/// The restart-segment structure of a JPEG whose every MCU row is a whole number of segments.
#[derive(Debug)]
pub struct Segments<'a> {
    encoded: &'a [u8],
    /// Where the headers (SOI up to the end of the scan header) end and entropy data begins.
    scan_start: usize,
    /// Where the segment table (`with_index`) lies among the headers, when there is one.
    index: Option<Range<usize>>,
    /// Offset in `encoded` of the frame header's height field (width follows it).
    frame_size_at: usize,
    /// (width, height) of the image in pixels.
    size: (u32, u32),
    /// (width, height) of an MCU in pixels.
    mcu: (u32, u32),
    /// MCUs a cut keeps around a region (horizontally, vertically): 1 where a component is
    /// subsampled that way (its upsampling reads the next chroma sample), else 0.
    margin: (u32, u32),
    /// MCUs per row.
    mcus_per_row: u32,
    /// MCUs per segment (the restart interval).
    interval: u32,
    /// Each segment's entropy-coded bytes, row by row, left to right (markers excluded).
    segments: Vec<Range<usize>>,
}

/// What `Segments` reads from a frame header.
struct Frame {
    /// Offset in the file of its height field (width follows it).
    size_at: usize,
    /// (width, height) of the image in pixels.
    size: (u32, u32),
    /// (width, height) of an MCU in pixels.
    mcu: (u32, u32),
    /// See `Segments::margin`.
    margin: (u32, u32),
    /// Components in the frame.
    components: u8,
}

/// A JPEG cut to a rectangle of another's MCUs.
#[derive(Debug)]
pub struct Cut {
    /// The JPEG holding the rectangle.
    pub jpeg: Vec<u8>,
    /// Where its top-left pixel lies in the original image.
    pub origin: (u32, u32),
}

/// What a JPEG's headers say about its restart markers (`headers`).
struct Headers<'a> {
    frame: Frame,
    /// The restart interval in MCUs (0: none).
    interval: u32,
    /// The segment table (`with_index`) and where it lies, when there is one.
    index: Option<(Range<usize>, &'a [u8])>,
    /// Where the entropy-coded data begins.
    scan_start: usize,
}

/// How a JPEG's restart markers bear on decoding a part of it.
#[derive(Debug)]
pub enum Restarts<'a> {
    /// Its segments, from which `Segments::cut` makes the smaller JPEG of a part.
    Segments(Segments<'a>),
    /// A restart marker out of turn (RST0, RST1, ... RST7, RST0, ... is the turn), or another
    /// marker amid the data: libjpeg-turbo skips data to resynchronise where it meets one, with
    /// a warning, so a part whose decode stops before it (or a cut, renumbered) would differ
    /// from the whole decode; a part must be decoded as the whole is.
    OutOfTurn,
    /// Nothing a part can use: no restart markers, or a structure `Segments` does not handle.
    Unknown,
}

impl<'a> Restarts<'a> {
    /// How the restart markers of `encoded` lie, when it is a baseline (or extended sequential)
    /// Huffman JPEG with one scan holding every component (the only kind libjpeg-turbo decodes
    /// as it reads, so the only kind a part's decode stops early in); `Unknown` otherwise. Scans
    /// the entropy-coded data for markers unless a segment table matches it.
    pub fn of(encoded: &'a [u8]) -> Restarts<'a> {
        let Some(headers) = Segments::headers(encoded) else {
            return Restarts::Unknown;
        };
        let Headers {
            frame,
            interval,
            index,
            scan_start,
        } = headers;
        if interval == 0 {
            return Restarts::Unknown;
        }
        let mcus_per_row = frame.size.0.div_ceil(frame.mcu.0);
        let rows = frame.size.1.div_ceil(frame.mcu.1);
        if !mcus_per_row.is_multiple_of(interval) {
            return if in_turn(encoded, scan_start) {
                Restarts::Unknown
            } else {
                Restarts::OutOfTurn
            };
        }
        let expected = (mcus_per_row / interval) as usize * rows as usize;
        // A table that does not match the data is not trusted: the data is scanned.
        let segments = match index
            .as_ref()
            .and_then(|(_, table)| Segments::from_table(encoded, scan_start, table, expected))
        {
            Some(segments) => segments,
            None => match Segments::split(encoded, scan_start, expected) {
                Some(segments) => segments,
                None if in_turn(encoded, scan_start) => return Restarts::Unknown,
                None => return Restarts::OutOfTurn,
            },
        };
        Restarts::Segments(Segments {
            encoded,
            scan_start,
            index: index.map(|(range, _)| range),
            frame_size_at: frame.size_at,
            size: frame.size,
            mcu: frame.mcu,
            margin: frame.margin,
            mcus_per_row,
            interval,
            segments,
        })
    }
}

/// Whether every restart marker in the entropy-coded data of `encoded` from `start` comes in
/// turn (the first RST0, then RST1, ... RST7, RST0, ...); false too when the data holds another
/// marker before EOI or no EOI.
fn in_turn(encoded: &[u8], start: usize) -> bool {
    let mut next = 0u8;
    let mut at = start;
    loop {
        let Some(found) = encoded
            .get(at..)
            .and_then(|rest| memchr::memchr(0xFF, rest))
        else {
            return false;
        };
        at += found;
        match encoded.get(at + 1) {
            Some(0x00) => at += 2,
            Some(0xFF) => at += 1,
            Some(&code @ 0xD0..=0xD7) if code == 0xD0 + next => {
                next = (next + 1) % 8;
                at += 2;
            }
            Some(0xD9) => return true,
            _ => return false,
        }
    }
}

impl<'a> Segments<'a> {
    /// The segment structure of `encoded`, when it is a baseline (or extended sequential)
    /// Huffman JPEG with one scan holding every component and a restart interval that divides
    /// its MCU rows, its restart markers in turn; `None` otherwise.
    pub fn find(encoded: &'a [u8]) -> Option<Segments<'a>> {
        match Restarts::of(encoded) {
            Restarts::Segments(segments) => Some(segments),
            Restarts::OutOfTurn | Restarts::Unknown => None,
        }
    }

    /// The headers of `encoded` up to its first scan's data, when it is a baseline (or extended
    /// sequential) Huffman JPEG whose first scan holds every component; `None` otherwise.
    fn headers(encoded: &'a [u8]) -> Option<Headers<'a>> {
        if !encoded.starts_with(&[0xFF, 0xD8]) {
            return None;
        }
        let mut at = 2;
        let mut frame: Option<Frame> = None;
        let mut interval = 0u32;
        let mut index: Option<(Range<usize>, &[u8])> = None;
        let scan_start = loop {
            // A marker: 0xFF, optional 0xFF fill bytes, the code, a 2-byte length.
            if *encoded.get(at)? != 0xFF {
                return None;
            }
            while *encoded.get(at + 1)? == 0xFF {
                at += 1;
            }
            let code = encoded[at + 1];
            let length = usize::from(u16::from_be_bytes([
                *encoded.get(at + 2)?,
                *encoded.get(at + 3)?,
            ]));
            let body = encoded.get(at + 4..(at + 2 + length).max(at + 4))?;
            if length < 2 {
                return None;
            }
            match code {
                // SOF0, SOF1: baseline or extended sequential, Huffman-coded.
                0xC0 | 0xC1 => frame = Some(Self::frame(body, at + 5)?),
                // Every other frame type (progressive, lossless, arithmetic) and DNL.
                0xC2..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF | 0xDC => return None,
                0xDD => interval = u32::from(u16::from_be_bytes([*body.first()?, *body.get(1)?])),
                APP15 if body.starts_with(INDEX_SIGNATURE) => {
                    index = Some((at..at + 2 + length, &body[INDEX_SIGNATURE.len()..]));
                }
                0xDA => {
                    let components = *body.first()?;
                    if frame.as_ref().is_none_or(|f| f.components != components) {
                        return None;
                    }
                    break at + 2 + length;
                }
                // Standalone markers cannot appear among the headers.
                0x01 | 0xD0..=0xD9 => return None,
                _ => {}
            }
            at += 2 + length;
        };
        Some(Headers {
            frame: frame?,
            interval,
            index,
            scan_start,
        })
    }

    /// The frame header `body`, whose size field is at `size_at` in the file.
    fn frame(body: &[u8], size_at: usize) -> Option<Frame> {
        let height = u32::from(u16::from_be_bytes([*body.get(1)?, *body.get(2)?]));
        let width = u32::from(u16::from_be_bytes([*body.get(3)?, *body.get(4)?]));
        let components = *body.get(5)?;
        if width == 0 || height == 0 || components == 0 {
            return None;
        }
        let sampling = body.get(6..6 + 3 * usize::from(components))?;
        let factors = |shift: u8| sampling.chunks(3).map(move |c| (c[1] >> shift) & 0x0F);
        let (h, v) = (factors(4).max()?, factors(0).max()?);
        if !(1..=4).contains(&h) || !(1..=4).contains(&v) {
            return None;
        }
        let subsampled = |shift: u8, max: u8| u32::from(factors(shift).any(|f| f < max));
        // A single component's scan is not interleaved: its MCU is one 8x8 block.
        let (mcu, margin) = if components == 1 {
            ((8, 8), (0, 0))
        } else {
            (
                (8 * u32::from(h), 8 * u32::from(v)),
                (subsampled(4, h), subsampled(0, v)),
            )
        };
        Some(Frame {
            size_at,
            size: (width, height),
            mcu,
            margin,
            components,
        })
    }

    /// The `expected` segments of the entropy-coded data starting at `start`: split at restart
    /// markers numbered in turn, ended by EOI; `None` when anything else appears (a marker out
    /// of turn too) or the count differs.
    fn split(encoded: &[u8], start: usize, expected: usize) -> Option<Vec<Range<usize>>> {
        // `expected` comes from header fields; each segment ends in a 2-byte marker, so the data
        // itself bounds how many there can be.
        let possible = encoded.len().saturating_sub(start) / 2 + 1;
        let mut segments = Vec::with_capacity(expected.min(possible));
        let (mut begin, mut at) = (start, start);
        loop {
            at += memchr::memchr(0xFF, encoded.get(at..)?)?;
            match *encoded.get(at + 1)? {
                // Stuffed 0xFF in the data, or fill bytes before a marker.
                0x00 => at += 2,
                0xFF => at += 1,
                code @ 0xD0..=0xD7 if usize::from(code - 0xD0) == segments.len() % 8 => {
                    segments.push(begin..at);
                    at += 2;
                    begin = at;
                }
                0xD9 => {
                    segments.push(begin..at);
                    break;
                }
                _ => return None,
            }
            if segments.len() > expected {
                return None;
            }
        }
        (segments.len() == expected).then_some(segments)
    }

    /// The `expected` segments of the entropy-coded data starting at `start`, from the lengths in
    /// `table`: each must be followed by a restart marker (numbered in turn), the last by EOI at
    /// the end of `encoded`; `None` otherwise.
    fn from_table(
        encoded: &[u8],
        start: usize,
        table: &[u8],
        expected: usize,
    ) -> Option<Vec<Range<usize>>> {
        if table.len() != 2 * expected {
            return None;
        }
        let mut segments = Vec::with_capacity(expected);
        let mut begin = start;
        for (n, len) in table.chunks_exact(2).enumerate() {
            let end = begin + usize::from(u16::from_le_bytes([len[0], len[1]]));
            let marker = match n + 1 == expected {
                true => [0xFF, 0xD9],
                false => [0xFF, 0xD0 + (n % 8) as u8],
            };
            if encoded.get(end..end + 2)? != marker {
                return None;
            }
            segments.push(begin..end);
            begin = end + 2;
        }
        (begin == encoded.len()).then_some(segments)
    }

    /// (width, height) of the image.
    pub fn size(&self) -> (u32, u32) {
        self.size
    }

    /// The JPEG holding the pixels `x0..x1` x `y0..y1` of the image, with one MCU around them
    /// in each direction its chroma is subsampled (where the image has it: what upsampling
    /// reads beyond a pixel), its columns widened to whole segments; `None` when that is the
    /// whole image or nothing.
    pub fn cut(&self, (x0, y0, x1, y1): (u32, u32, u32, u32)) -> Option<Cut> {
        if x1 <= x0 || y1 <= y0 {
            return None;
        }
        let (mw, mh) = self.mcu;
        let (mx, my) = self.margin;
        let rows = self.size.1.div_ceil(mh);
        let row0 = (y0 / mh).saturating_sub(my);
        let row1 = (y1.div_ceil(mh) + my).min(rows);
        let per_row = self.mcus_per_row / self.interval;
        let column = |mcu: u32| mcu / self.interval;
        let seg0 = column((x0 / mw).saturating_sub(mx));
        let seg1 = (column(
            (x1.div_ceil(mw) + mx)
                .min(self.mcus_per_row)
                .saturating_sub(1),
        ) + 1)
            .min(per_row);
        if row0 >= row1
            || seg0 >= seg1
            || (row0 == 0 && row1 == rows && seg0 == 0 && seg1 == per_row)
        {
            return None;
        }
        let origin = (seg0 * self.interval * mw, row0 * mh);
        let width = if seg1 == per_row {
            self.size.0 - origin.0
        } else {
            (seg1 - seg0) * self.interval * mw
        };
        let height = (row1 * mh).min(self.size.1) - origin.1;
        let chosen = (row0..row1).flat_map(|row| {
            let first = (row * per_row + seg0) as usize;
            first..first + (seg1 - seg0) as usize
        });
        let data: usize = chosen.clone().map(|s| self.segments[s].len() + 2).sum();
        // The headers without the segment table (it describes the whole image, not the cut).
        let skip = self.index.clone().unwrap_or(0..0);
        let mut jpeg = Vec::with_capacity(self.scan_start + data);
        jpeg.extend_from_slice(&self.encoded[..skip.start]);
        jpeg.extend_from_slice(&self.encoded[skip.end..self.scan_start]);
        let size_at = self.frame_size_at
            - if self.frame_size_at > skip.start {
                skip.len()
            } else {
                0
            };
        let [h0, h1] = (height as u16).to_be_bytes();
        let [w0, w1] = (width as u16).to_be_bytes();
        jpeg[size_at..size_at + 4].copy_from_slice(&[h0, h1, w0, w1]);
        for (n, s) in chosen.enumerate() {
            if n > 0 {
                jpeg.extend_from_slice(&[0xFF, 0xD0 + (n - 1) as u8 % 8]);
            }
            jpeg.extend_from_slice(&self.encoded[self.segments[s].clone()]);
        }
        jpeg.extend_from_slice(&[0xFF, 0xD9]);
        Some(Cut { jpeg, origin })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::jpeg::{restart_marked, tests::encoded};

    #[test]
    fn segment_widths_divide_the_row_near_the_target() {
        // 640 px of 8-px MCUs: 80 MCUs; 6 (48 px) does not divide 80, 5 (40 px) is nearest.
        assert_eq!(interval_for(80, 8), 5);
        // 504 px: 63 MCUs, 7 per segment (56 px).
        assert_eq!(interval_for(63, 8), 7);
        // 4:2:0, 40 MCUs of 16 px: 3 (48 px) does not divide 40, 2 (32 px) and 4 (64 px) tie.
        assert_eq!(40 % interval_for(40, 16), 0);
        // A prime number of MCUs: segments of 1 MCU, unless even those are too wide.
        assert_eq!(interval_for(61, 8), 1);
        assert_eq!(interval_for(31, 16), 1);
        assert_eq!(interval_for(7, 160), 7);
    }

    #[test]
    fn a_copy_carries_its_segment_table_and_a_wrong_table_is_not_trusted() {
        use turbojpeg::Subsamp::*;
        for subsampling in [Sub2x2, None, Gray] {
            let copy = restart_marked(&encoded(305, 217, subsampling, false)).expect("copy");
            let found = Segments::find(&copy).expect("segments");
            assert!(
                found.index.is_some(),
                "{subsampling:?}: the copy has its table"
            );
            assert!(
                found.interval < found.mcus_per_row,
                "rows of several segments"
            );
            // The same segments as scanning the copy without its table.
            let index = found.index.clone().expect("table");
            let bare: Vec<u8> = [&copy[..index.start], &copy[index.end..]].concat();
            let scanned = Segments::find(&bare).expect("segments");
            assert!(scanned.index.is_none());
            let shift = index.len();
            let moved: Vec<Range<usize>> = found
                .segments
                .iter()
                .map(|r| r.start - shift..r.end - shift)
                .collect();
            assert_eq!(moved, scanned.segments, "{subsampling:?}");
            // A cut leaves the table out.
            let cut = found.cut((40, 40, 90, 90)).expect("a cut");
            assert!(Segments::find(&cut.jpeg).is_some_and(|c| c.index.is_none()));
            // Empty regions cut nothing, a one-pixel column little; regions past the image are
            // clipped to it.
            assert!(found.cut((0, 0, 0, 0)).is_none());
            assert!(
                found
                    .cut((50, 50, 51, 90))
                    .is_some_and(|c| c.jpeg.len() < copy.len() / 2)
            );
            let edge = found.cut((200, 150, 9_999, 9_999)).expect("a cut");
            assert!(Segments::find(&edge.jpeg).is_some_and(|c| {
                let (w, h) = c.size();
                edge.origin.0 + w == 305 && edge.origin.1 + h == 217
            }));
            // An offset moved by one no longer lands after a marker: the data is scanned.
            let mut damaged = copy.clone();
            let entry = index.start + 4 + INDEX_SIGNATURE.len() + 2 * 3;
            damaged[entry] = damaged[entry].wrapping_add(1);
            let rescanned = Segments::find(&damaged).expect("segments");
            assert_eq!(rescanned.segments, found.segments);
        }
    }
}
