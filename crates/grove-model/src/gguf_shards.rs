//! The files of a GGUF model: one, or the shards llama.cpp's `gguf-split` cuts a large model
//! into (publishers split files over a few GB: a 7B's 8-bit file comes as two). Each shard is a
//! GGUF file of its own with `split.no` (from 0) and `split.count` in its metadata and
//! `PREFIX-NNNNN-of-MMMMM.gguf` as its name (numbered from 1); the first holds the model's
//! metadata (and, as `gguf-split --no-tensor-in-metadata` writes it, perhaps no tensors), the
//! others only their tensors. Any shard's path opens the whole model.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::Value;

use crate::gguf_header::Header;
use crate::ModelError;

/// One mapped file of the model and its header.
pub(crate) struct Shard {
    pub path: PathBuf,
    pub map: Arc<memmap2::Mmap>,
    pub header: Header,
}

/// The model's files, first shard first: `path` alone when it is a whole model.
pub(crate) fn open(path: &Path) -> Result<Vec<Shard>, ModelError> {
    let given = open_one(path)?;
    let Some((no, count)) = split_of(&given)? else {
        return Ok(vec![given]);
    };
    let prefix = prefix_of(path, no, count).ok_or_else(|| {
        error(
            path,
            format!(
                "shard {} of {count} of a split GGUF model (`split.no`, `split.count`), but not \
                 named as llama.cpp's gguf-split names shards (`PREFIX-{:05}-of-{count:05}.gguf`), \
                 so the others cannot be found",
                no + 1,
                no + 1
            ),
        )
    })?;
    let mut given = Some(given);
    let mut shards = Vec::with_capacity(count);
    for i in 0..count {
        let shard = if i == no {
            given.take().expect("the given shard, once")
        } else {
            let path = shard_path(&prefix, i, count);
            if !path.is_file() {
                return Err(error(
                    &path,
                    format!(
                        "missing: shard {} of {count} of the split model {} (every shard must \
                         lie beside the first)",
                        i + 1,
                        shard_path(&prefix, 0, count).display()
                    ),
                ));
            }
            open_one(&path)?
        };
        if split_of(&shard)? != Some((i, count)) {
            return Err(error(
                &shard.path,
                format!(
                    "its `split.no` and `split.count` do not say shard {} of {count}: a shard of \
                     another split?",
                    i + 1
                ),
            ));
        }
        shards.push(shard);
    }
    check_tensor_count(&shards)?;
    Ok(shards)
}

fn open_one(path: &Path) -> Result<Shard, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let map = grove_kernels::memory::map_read_only(&file).map_err(io)?;
    let header =
        Header::read(&map).map_err(|e| error(path, format!("not a readable GGUF file: {e}")))?;
    Ok(Shard {
        path: path.to_owned(),
        map: Arc::new(map),
        header,
    })
}

/// `(split.no, split.count)` of a shard of a split model; `None` for a whole file (no
/// `split.count`, or a count of 1).
fn split_of(shard: &Shard) -> Result<Option<(usize, usize)>, ModelError> {
    let number = |key: &str| -> Result<Option<usize>, ModelError> {
        let Some(value) = shard.header.metadata.get(key) else {
            return Ok(None);
        };
        integer(value)
            .map(Some)
            .ok_or_else(|| error(&shard.path, format!("metadata `{key}` is {value:?}")))
    };
    let Some(count) = number("split.count")?.filter(|&count| count > 1) else {
        return Ok(None);
    };
    let no = number("split.no")?.unwrap_or(0);
    if no >= count {
        return Err(error(
            &shard.path,
            format!("`split.no` is {no}, past `split.count` {count}"),
        ));
    }
    Ok(Some((no, count)))
}

/// A non-negative integer of any of GGUF's integer types (gguf-split writes u16 and i32).
fn integer(value: &Value) -> Option<usize> {
    let wide = match *value {
        Value::U8(v) => i128::from(v),
        Value::I8(v) => i128::from(v),
        Value::U16(v) => i128::from(v),
        Value::I16(v) => i128::from(v),
        Value::U32(v) => i128::from(v),
        Value::I32(v) => i128::from(v),
        Value::U64(v) => i128::from(v),
        Value::I64(v) => i128::from(v),
        _ => return None,
    };
    usize::try_from(wide).ok()
}

/// The path without its `-NNNNN-of-MMMMM.gguf` ending, if its name ends so for shard `no`.
fn prefix_of(path: &Path, no: usize, count: usize) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let ending = format!("-{:05}-of-{count:05}.gguf", no + 1);
    let stem = name
        .len()
        .checked_sub(ending.len())
        .filter(|&at| name.is_char_boundary(at) && name[at..].eq_ignore_ascii_case(&ending))
        .map(|at| &name[..at])
        .filter(|stem| !stem.is_empty())?;
    Some(path.with_file_name(stem))
}

/// Shard `i`'s path (from 0), as gguf-split names it.
fn shard_path(prefix: &Path, i: usize, count: usize) -> PathBuf {
    let mut name = prefix
        .file_name()
        .expect("a prefix names a file")
        .to_owned();
    name.push(format!("-{:05}-of-{count:05}.gguf", i + 1));
    prefix.with_file_name(name)
}

/// The shards hold as many tensors as the first says the model has (`split.tensors.count`,
/// where written), each once.
fn check_tensor_count(shards: &[Shard]) -> Result<(), ModelError> {
    let mut seen = std::collections::HashMap::new();
    for (i, shard) in shards.iter().enumerate() {
        for name in shard.header.tensors.keys() {
            if let Some(before) = seen.insert(name.as_str(), i) {
                return Err(error(
                    &shard.path,
                    format!(
                        "tensor `{name}` is in shard {} and again in shard {}",
                        before + 1,
                        i + 1
                    ),
                ));
            }
        }
    }
    let first = &shards[0];
    if let Some(value) = first.header.metadata.get("split.tensors.count") {
        let stated = integer(value).ok_or_else(|| {
            error(
                &first.path,
                format!("metadata `split.tensors.count` is {value:?}"),
            )
        })?;
        if stated != seen.len() {
            return Err(error(
                &first.path,
                format!(
                    "`split.tensors.count` says {stated} tensors; the {} shards hold {}",
                    shards.len(),
                    seen.len()
                ),
            ));
        }
    }
    Ok(())
}

fn error(path: &Path, message: String) -> ModelError {
    ModelError::Weights {
        path: path.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_are_gguf_splits() {
        let path = Path::new("/m/qwen2.5-7b-q8_0-00002-of-00003.gguf");
        let prefix = prefix_of(path, 1, 3).unwrap();
        assert_eq!(prefix, Path::new("/m/qwen2.5-7b-q8_0"));
        assert_eq!(
            shard_path(&prefix, 0, 3),
            Path::new("/m/qwen2.5-7b-q8_0-00001-of-00003.gguf")
        );
        // The name must say the shard its metadata says.
        assert_eq!(prefix_of(path, 0, 3), None);
        assert_eq!(prefix_of(path, 1, 4), None);
        assert_eq!(prefix_of(Path::new("/m/-00002-of-00003.gguf"), 1, 3), None);
        assert_eq!(prefix_of(Path::new("/m/model.gguf"), 1, 3), None);
    }

    #[test]
    fn split_numbers_are_any_integer_type() {
        assert_eq!(integer(&Value::U16(3)), Some(3));
        assert_eq!(integer(&Value::I32(291)), Some(291));
        assert_eq!(integer(&Value::I32(-1)), None);
        assert_eq!(integer(&Value::String("3".into())), None);
    }
}
