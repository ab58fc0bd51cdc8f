//! The .npy container of view files: format version 1.0 with a fixed 128-byte header.
//!
//! Owns the header bytes for a (dtype, shape) and the file size they imply, so getattr can answer
//! without decoding. A fixed header length lets readers skip it blindly (tf.io.decode_raw on
//! bytes 128..). Must never produce a header numpy would refuse.

/// Total header length, magic included: numpy pads to a multiple of 64; 128 fits every shape
/// prepfs produces.
pub const HEADER_LEN: usize = 128;

/// numpy's description of the element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// Little-endian float32, `<f4`.
    F32,
    /// uint8, `|u1`.
    U8,
}

impl Dtype {
    fn descr(self) -> &'static str {
        match self {
            Dtype::F32 => "<f4",
            Dtype::U8 => "|u1",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::U8 => 1,
        }
    }
}

/// The 128-byte header of a C-order array of `dtype` and `shape`.
pub fn header(dtype: Dtype, shape: &[usize]) -> [u8; HEADER_LEN] {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        dtype.descr()
    );
    let mut out = [b' '; HEADER_LEN];
    out[..6].copy_from_slice(b"\x93NUMPY");
    out[6] = 1;
    out[7] = 0;
    let header_len = (HEADER_LEN - 10) as u16;
    out[8..10].copy_from_slice(&header_len.to_le_bytes());
    let end = (10 + dict.len()).min(HEADER_LEN - 1);
    out[10..end].copy_from_slice(&dict.as_bytes()[..end - 10]);
    out[HEADER_LEN - 1] = b'\n';
    out
}

/// Size of the whole file for `dtype` and `shape`.
pub fn file_size(dtype: Dtype, shape: &[usize]) -> u64 {
    (HEADER_LEN + shape.iter().product::<usize>() * dtype.size()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_numpy_v1_padded_to_128_bytes() {
        let h = header(Dtype::F32, &[3, 224, 224]);
        assert_eq!(&h[..8], b"\x93NUMPY\x01\x00");
        assert_eq!(u16::from_le_bytes([h[8], h[9]]) as usize + 10, HEADER_LEN);
        let text = std::str::from_utf8(&h[10..]).expect("ascii");
        assert!(
            text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 224, 224), }")
        );
        assert!(text.ends_with('\n'));
        assert_eq!(
            file_size(Dtype::F32, &[3, 224, 224]),
            128 + 3 * 224 * 224 * 4
        );
        let u = header(Dtype::U8, &[224, 224, 3]);
        assert!(
            std::str::from_utf8(&u[10..])
                .expect("ascii")
                .contains("'|u1'")
        );
    }
}
