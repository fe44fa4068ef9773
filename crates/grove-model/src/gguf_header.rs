//! A GGUF file's header: its metadata and its tensor index. Read here, not by candle's
//! reader, which refuses a whole file for one tensor of a type it cannot dequantize: llama.cpp's
//! IQ4_NL, IQ4_XS and 1- to 3-bit IQ files (IQ3_XXS ... IQ1_M) are multiplied by grove's own
//! kernels, and its ternary ones (TQ1_0, TQ2_0) as Q2_K. The metadata keeps candle's `Value`,
//! which the rest of the loader and the tokenizer read.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use grove_kernels::quant::ternary::{self, Ternary};
use grove_kernels::quant::QuantFormat;

/// A tensor's type, by who reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorType {
    /// A type candle's readers dequantize (F32, F16, BF16, Q4_0 to Q8_1, the K-quants).
    Candle(GgmlDType),
    /// A type only grove's kernels read (IQ4_NL, IQ4_XS, the grid types IQ3_XXS ... IQ1_M).
    Grove(QuantFormat),
    /// A ternary type (TQ1_0, TQ2_0), read as the Q2_K blocks of its values.
    Ternary(Ternary),
}

impl TensorType {
    /// The type of ggml's type id `id` (`enum ggml_type`), or the message for one that no
    /// reader here loads.
    fn from_id(id: u32) -> Result<Self, String> {
        let candle = match id {
            0 => Some(GgmlDType::F32),
            1 => Some(GgmlDType::F16),
            2 => Some(GgmlDType::Q4_0),
            3 => Some(GgmlDType::Q4_1),
            6 => Some(GgmlDType::Q5_0),
            7 => Some(GgmlDType::Q5_1),
            8 => Some(GgmlDType::Q8_0),
            9 => Some(GgmlDType::Q8_1),
            10 => Some(GgmlDType::Q2K),
            11 => Some(GgmlDType::Q3K),
            12 => Some(GgmlDType::Q4K),
            13 => Some(GgmlDType::Q5K),
            14 => Some(GgmlDType::Q6K),
            15 => Some(GgmlDType::Q8K),
            30 => Some(GgmlDType::BF16),
            _ => None,
        };
        if let Some(dtype) = candle {
            return Ok(Self::Candle(dtype));
        }
        if let Some(ternary) = Ternary::from_ggml(id) {
            return Ok(Self::Ternary(ternary));
        }
        match QuantFormat::from_ggml(id) {
            Some(format) => Ok(Self::Grove(format)),
            None => Err(unsupported_type(id)),
        }
    }

    /// The type's name (ggml's, for grove's own types).
    pub fn name(self) -> String {
        match self {
            Self::Candle(dtype) => format!("{dtype:?}"),
            Self::Grove(format) => format.name().to_string(),
            Self::Ternary(ternary) => ternary.name().to_string(),
        }
    }

    /// Weights per block and bytes per block.
    fn block(self) -> (usize, usize) {
        match self {
            Self::Candle(dtype) => (dtype.block_size(), dtype.type_size()),
            Self::Grove(format) => (format.block_weights(), format.block_bytes()),
            Self::Ternary(ternary) => (ternary::BLOCK_WEIGHTS, ternary.block_bytes()),
        }
    }
}

/// The message for a tensor type no reader here loads: the type by ggml's name, and the types
/// grove loads.
fn unsupported_type(id: u32) -> String {
    let name = match id {
        24..=28 => "an integer or f64 type",
        39 => "MXFP4",
        _ => "not a type this reader knows",
    };
    format!(
        "tensor type {id} ({name}) is not supported: grove loads files of F32, F16, BF16, Q8_0, \
         Q5_0, Q5_1, Q4_0, Q4_1, Q2_K-Q6_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, \
         IQ2_S, IQ1_S, IQ1_M, TQ1_0 and TQ2_0 tensors (not MXFP4, the type of MoE models' \
         experts, which grove does not run)"
    )
}

/// One tensor of the index.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub kind: TensorType,
    /// ggml's type id (`enum ggml_type`).
    pub id: u32,
    /// Outermost first, as candle and HF order them (GGUF lists the innermost first).
    pub dims: Vec<usize>,
    /// From the start of the data section.
    pub offset: usize,
    /// Bytes of the tensor's data: whole blocks, inside the file (checked by [`Header::read`]).
    pub bytes: usize,
}

/// A GGUF file's metadata and tensor index.
#[derive(Debug)]
pub struct Header {
    pub metadata: HashMap<String, Value>,
    pub tensors: HashMap<String, TensorInfo>,
    /// Where the data section starts in the file.
    pub data_offset: usize,
}

/// Array nesting deeper than this is refused (files have arrays of strings or numbers).
const MAX_DEPTH: usize = 4;

impl Header {
    /// The header at the start of `file` (a whole GGUF file, version 2 or 3). Every count and
    /// length is checked against the bytes left before anything is allocated for it.
    pub fn read(file: &[u8]) -> Result<Self, String> {
        let mut at = Cursor { file, at: 0 };
        if at.take(4)? != b"GGUF" {
            return Err("not a GGUF file (it does not start with `GGUF`)".into());
        }
        let version = at.u32()?;
        if !(2..=3).contains(&version) {
            return Err(format!(
                "GGUF version {version} is not supported (2 and 3 are)"
            ));
        }
        let (tensor_count, metadata_count) = (at.u64()?, at.u64()?);
        // Each entry takes at least 13 (metadata) or 24 (tensor) bytes.
        at.fits(metadata_count, 13, "metadata entries")?;
        at.fits(tensor_count, 24, "tensors")?;
        let mut metadata = HashMap::new();
        for _ in 0..metadata_count {
            let key = at.string()?;
            let kind = at.u32()?;
            let value = at
                .value(kind, 0)
                .map_err(|e| format!("metadata `{key}`: {e}"))?;
            metadata.insert(key, value);
        }
        let mut tensors = HashMap::new();
        for _ in 0..tensor_count {
            let name = at.string()?;
            let info = at.tensor().map_err(|e| format!("tensor `{name}`: {e}"))?;
            tensors.insert(name, info);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(Value::U32(a)) if *a > 0 => *a as usize,
            Some(other) => return Err(format!("`general.alignment` is {other:?}")),
        };
        let data_offset = at.at.next_multiple_of(alignment);
        for (name, info) in &tensors {
            let end =
                (data_offset.checked_add(info.offset)).and_then(|s| s.checked_add(info.bytes));
            if end.is_none_or(|end| end > file.len()) {
                return Err(format!(
                    "tensor `{name}` ends past the end of the file ({} bytes): truncated?",
                    file.len()
                ));
            }
        }
        Ok(Self {
            metadata,
            tensors,
            data_offset,
        })
    }
}

/// A read position in the file's bytes.
struct Cursor<'a> {
    file: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.file.len());
        let end = end.ok_or_else(|| {
            format!(
                "the header is cut short: {n} bytes wanted at byte {} of {}",
                self.at,
                self.file.len()
            )
        })?;
        let bytes = &self.file[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    /// That `count` items of at least `each` bytes fit in what is left.
    fn fits(&self, count: u64, each: usize, what: &str) -> Result<usize, String> {
        let left = self.file.len() - self.at;
        usize::try_from(count)
            .ok()
            .filter(|&count| count.checked_mul(each).is_some_and(|bytes| bytes <= left))
            .ok_or_else(|| format!("{count} {what} cannot fit in the {left} bytes left"))
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.u64()?;
        let len = self.fits(len, 1, "bytes of a string")?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| "a string is not UTF-8".into())
    }

    /// A metadata value of GGUF type `kind`.
    fn value(&mut self, kind: u32, depth: usize) -> Result<Value, String> {
        Ok(match kind {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(self.array().map(u16::from_le_bytes)?),
            3 => Value::I16(self.array().map(i16::from_le_bytes)?),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(self.array().map(i32::from_le_bytes)?),
            6 => Value::F32(self.array().map(f32::from_le_bytes)?),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("a bool of {b}")),
            },
            8 => Value::String(self.string()?),
            9 if depth < MAX_DEPTH => {
                let kind = self.u32()?;
                let len = self.u64()?;
                // No element takes less than a byte (a string: 8).
                let len = self.fits(len, if kind == 8 { 8 } else { 1 }, "array elements")?;
                let values = (0..len).map(|_| self.value(kind, depth + 1));
                Value::Array(values.collect::<Result<_, _>>()?)
            }
            9 => return Err(format!("arrays nested over {MAX_DEPTH} deep")),
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.array().map(i64::from_le_bytes)?),
            12 => Value::F64(self.array().map(f64::from_le_bytes)?),
            _ => return Err(format!("unknown value type {kind}")),
        })
    }

    /// A tensor's entry after its name.
    fn tensor(&mut self) -> Result<TensorInfo, String> {
        let rank = self.u32()?;
        if rank == 0 || rank > 4 {
            return Err(format!("{rank} dimensions (1 to 4 are)"));
        }
        let mut dims = (0..rank)
            .map(|_| {
                let dim = self.u64()?;
                usize::try_from(dim).map_err(|_| format!("a dimension of {dim}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        dims.reverse();
        let id = self.u32()?;
        let kind = TensorType::from_id(id)?;
        let offset = self.u64()?;
        let offset = usize::try_from(offset).map_err(|_| format!("an offset of {offset}"))?;
        let (weights, block_bytes) = kind.block();
        if dims[dims.len() - 1] % weights != 0 {
            return Err(format!(
                "shape {dims:?} is not whole blocks of {weights} of its type {kind:?}"
            ));
        }
        let bytes = (dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)))
            .and_then(|elements| (elements / weights).checked_mul(block_bytes))
            .ok_or_else(|| format!("shape {dims:?} has more bytes than memory holds"))?;
        Ok(TensorInfo {
            kind,
            id,
            dims,
            offset,
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF header of version `version` with the metadata bytes `metadata` (`count`
    /// entries) and one tensor entry `tensor`.
    fn header(version: u32, count: u64, metadata: &[u8], tensor: &[u8]) -> Vec<u8> {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
        bytes.extend(count.to_le_bytes());
        bytes.extend(metadata);
        bytes.extend(tensor);
        bytes
    }

    fn string(s: &str) -> Vec<u8> {
        let mut bytes = (s.len() as u64).to_le_bytes().to_vec();
        bytes.extend(s.as_bytes());
        bytes
    }

    /// A tensor entry named `w` of GGUF dims `dims` (innermost first) and type `id`.
    fn tensor(dims: &[u64], id: u32, offset: u64) -> Vec<u8> {
        let mut bytes = string("w");
        bytes.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            bytes.extend(d.to_le_bytes());
        }
        bytes.extend(id.to_le_bytes());
        bytes.extend(offset.to_le_bytes());
        bytes
    }

    #[test]
    fn reads_metadata_tensors_and_the_aligned_data_offset() {
        let mut metadata = string("general.alignment");
        metadata.extend(4u32.to_le_bytes());
        metadata.extend(64u32.to_le_bytes());
        metadata.extend(string("names"));
        metadata.extend(9u32.to_le_bytes());
        metadata.extend(8u32.to_le_bytes());
        metadata.extend(2u64.to_le_bytes());
        metadata.extend(string("a"));
        metadata.extend(string("bc"));
        // IQ4_XS: [512, 3] in GGUF's order, [3, 512] in ours.
        let mut bytes = header(3, 2, &metadata, &tensor(&[512, 3], 23, 128));
        let data_offset = bytes.len().next_multiple_of(64);
        bytes.resize(data_offset + 128 + 3 * 2 * 136, 0);
        let header = Header::read(&bytes).expect("a valid header");
        assert_eq!(header.data_offset, data_offset);
        let names = header.metadata["names"].to_vec().expect("an array");
        assert_eq!(names.len(), 2);
        assert_eq!(names[1].to_string().expect("a string"), "bc");
        let w = &header.tensors["w"];
        assert_eq!(w.kind, TensorType::Grove(QuantFormat::Iq4Xs));
        assert_eq!(QuantFormat::from_ggml(w.id), Some(QuantFormat::Iq4Xs));
        assert_eq!(
            (w.dims.as_slice(), w.offset, w.bytes),
            (&[3, 512][..], 128, 3 * 2 * 136)
        );
        // One byte short of the tensor's end.
        let short = Header::read(&bytes[..bytes.len() - 1]).expect_err("refused");
        assert!(
            short.contains("tensor `w` ends past the end of the file"),
            "{short}"
        );
    }

    /// The ternary types, sized by their blocks (TQ1_0: 54 bytes a 256 weights).
    #[test]
    fn reads_ternary_tensors() {
        for (id, ternary) in [(34, Ternary::Tq1_0), (35, Ternary::Tq2_0)] {
            let mut bytes = header(3, 0, &[], &tensor(&[512, 3], id, 0));
            let size = 3 * 2 * ternary.block_bytes();
            bytes.resize(bytes.len().next_multiple_of(32) + size, 0);
            let w = &Header::read(&bytes).expect("a valid header").tensors["w"];
            assert_eq!((w.kind, w.bytes), (TensorType::Ternary(ternary), size));
            let short = Header::read(&bytes[..bytes.len() - 1]).expect_err("refused");
            assert!(short.contains("past the end"), "{short}");
        }
    }

    #[test]
    fn bad_headers_are_refused_with_what_is_wrong() {
        let refused = |bytes: &[u8]| Header::read(bytes).expect_err("refused");
        assert!(refused(b"GGML").contains("not a GGUF file"));
        assert!(refused(&header(1, 0, &[], &[])).contains("version 1"));
        // Cut inside the tensor entry.
        let whole = header(3, 0, &[], &tensor(&[64, 2], 8, 0));
        assert!(refused(&whole[..whole.len() - 3]).contains("cut short"));
        // A count no file could hold.
        let mut huge = header(3, 0, &[], &[]);
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(refused(&huge).contains("cannot fit"));
        // A type without a reader, named.
        let mxfp4 = refused(&header(3, 0, &[], &tensor(&[256, 2], 39, 0)));
        assert!(
            mxfp4.contains("tensor `w`") && mxfp4.contains("MXFP4"),
            "{mxfp4}"
        );
        // Rows that are not whole blocks.
        let partial = refused(&header(3, 0, &[], &tensor(&[100, 2], 20, 0)));
        assert!(partial.contains("whole blocks of 32"), "{partial}");
        // An unknown value type.
        let mut metadata = string("k");
        metadata.extend(99u32.to_le_bytes());
        let unknown = refused(&header(3, 1, &metadata, &tensor(&[32], 0, 0)));
        assert!(
            unknown.contains("metadata `k`: unknown value type 99"),
            "{unknown}"
        );
    }

    /// Every byte of a header set to a few values, and the header cut at every length: read
    /// or refused, never a panic (nor an allocation a count asks for but the file cannot hold).
    #[test]
    fn damaged_headers_never_panic() {
        let mut metadata = string("general.alignment");
        metadata.extend(4u32.to_le_bytes());
        metadata.extend(32u32.to_le_bytes());
        metadata.extend(string("tokens"));
        metadata.extend(9u32.to_le_bytes());
        metadata.extend(8u32.to_le_bytes());
        metadata.extend(3u64.to_le_bytes());
        for token in ["a", "bb", "ccc"] {
            metadata.extend(string(token));
        }
        let mut bytes = header(3, 2, &metadata, &tensor(&[64, 2], 20, 0));
        bytes.resize(bytes.len().next_multiple_of(32) + 2 * 2 * 18, 7);
        assert!(Header::read(&bytes).is_ok());
        let end = bytes.len() - 2 * 2 * 18;
        for at in 0..end {
            for value in [0x00, 0x01, 0x7F, 0x80, 0xFF, bytes[at].wrapping_add(1)] {
                let mut damaged = bytes.clone();
                damaged[at] = value;
                let _ = Header::read(&damaged);
            }
            let _ = Header::read(&bytes[..at]);
        }
    }
}
