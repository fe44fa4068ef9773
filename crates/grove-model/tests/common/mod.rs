//! Helpers shared by the golden tests.

use std::path::PathBuf;

use candle_core::Tensor;

/// The golden reference set: `$GROVE_GOLDEN_DIR`, else `../shared/golden` beside the repo.
pub fn golden_dir() -> PathBuf {
    std::env::var_os("GROVE_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"))
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> anyhow::Result<f32> {
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}
