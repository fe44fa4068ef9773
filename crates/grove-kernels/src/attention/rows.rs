//! How attention reads a layer's K/V rows as the store keeps them: f32 rows where they lie, f16
//! rows widened into the task's buffers first (a piece or a short row at a time), so the
//! kernels run on f32 rows either way and give the bits f32 rows of the same values give.

use std::cell::RefCell;

use half::{bf16, f16};

use super::{prefetch, AHEAD};

/// A layer's key or value rows as the KV store keeps them, `[kv_heads, slots, d]`.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    /// Half precision (what llama.cpp keeps by default): half the bytes a step reads over a
    /// long context. The rows a task reads are widened (exactly) into f32 first, so the
    /// arithmetic and its bits are those of f32 rows holding the same values.
    F16(&'a [f16]),
    /// Bfloat16 (what a bf16 model's cache holds in the frameworks that serve it): f32's
    /// range in half the bytes. Long rows' pieces run in bfloat16 arithmetic where the CPU has
    /// AVX-512 BF16 (`dot.rs`); elsewhere, and for short rows, the rows are widened (exactly)
    /// and the arithmetic is f32's.
    Bf16(&'a [bf16]),
}

impl KvRows<'_> {
    pub fn len(&self) -> usize {
        match self {
            Self::F32(rows) => rows.len(),
            Self::F16(rows) => rows.len(),
            Self::Bf16(rows) => rows.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i`, widened.
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Self::F32(rows) => rows[i],
            Self::F16(rows) => rows[i].to_f32(),
            Self::Bf16(rows) => rows[i].to_f32(),
        }
    }
}

/// An element of a K/V row as the kernels read it: f32, or f16 widened (exactly) as it is
/// loaded, so a piece of a decode row reads its f16 rows where they lie, the reads overlapping
/// the arithmetic, with the bits f32 rows of the same values give.
#[allow(unsafe_code)]
pub(super) trait Element: Copy + Send + Sync + 'static {
    /// The value as f32 (exact).
    fn widen(self) -> f32;

    /// `rows` (each `d` long) as f32 rows: f32 rows as they are, f16 rows widened into
    /// `buffer`.
    fn as_f32<'b, const N: usize>(
        rows: [&'b [Self]; N],
        d: usize,
        buffer: &'b mut Vec<f32>,
    ) -> [&'b [f32]; N];

    /// Eight elements from `p`, widened.
    ///
    /// # Safety
    /// AVX2 and F16C; eight elements readable at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;

    /// Sixteen elements from `p`, widened.
    ///
    /// # Safety
    /// AVX-512 F; sixteen elements readable at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;

    /// Eight rows' elements into `to`, as they are (not widened): element `e` of row `j` at
    /// `to[e * stride + j]` (`across.rs`'s 512-bit tiles, which [`Self::load16`] reads).
    ///
    /// # Safety
    /// AVX-512 F and BW, AVX2 and FMA; `d` (a multiple of 8) elements readable at each row,
    /// and `to` valid for `(d - 1) * stride + 8` elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn transpose8(rows: &[*const Self; 8], d: usize, to: *mut Self, stride: usize);
}

// SAFETY (both impls' loads): as their callers promise (the trait's contract).
#[allow(unsafe_code)]
impl Element for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    #[inline(always)]
    fn as_f32<'b, const N: usize>(
        rows: [&'b [Self]; N],
        d: usize,
        _: &'b mut Vec<f32>,
    ) -> [&'b [f32]; N] {
        rows.map(|row| &row[..d])
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn transpose8(rows: &[*const Self; 8], d: usize, to: *mut Self, stride: usize) {
        super::across::transpose_into(rows, d, to, stride);
    }
}

#[allow(unsafe_code)]
impl Element for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }

    #[inline(always)]
    fn as_f32<'b, const N: usize>(
        rows: [&'b [Self]; N],
        d: usize,
        buffer: &'b mut Vec<f32>,
    ) -> [&'b [f32]; N] {
        if buffer.len() != N * d {
            buffer.resize(N * d, 0.0);
        }
        for (row, to) in rows.iter().zip(buffer.chunks_exact_mut(d.max(1))) {
            widen(&row[..d], to);
        }
        let buffer: &'b [f32] = buffer;
        std::array::from_fn(|i| &buffer[i * d..][..d])
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn transpose8(rows: &[*const Self; 8], d: usize, to: *mut Self, stride: usize) {
        super::across::transpose_halves(rows, d, to, stride);
    }
}

impl<'a> From<&'a [f32]> for KvRows<'a> {
    fn from(rows: &'a [f32]) -> Self {
        Self::F32(rows)
    }
}

impl<'a> From<&'a Vec<f32>> for KvRows<'a> {
    fn from(rows: &'a Vec<f32>) -> Self {
        Self::F32(rows)
    }
}

/// A piece's rows (its keys, or its values), listed once for every pass over them: each pass
/// of the vector kernels called the caller's row function again per row, with its slot
/// lookup and bounds checks, which outnumbered the multiply-adds of a pass over f16 values.
/// The list's buffer is a thread's, kept between pieces; the list borrows the rows.
#[cfg(target_arch = "x86_64")]
pub(super) struct Listed<'a, E> {
    rows: Vec<*const ()>,
    width: usize,
    home: &'static std::thread::LocalKey<RefCell<Vec<*const ()>>>,
    of: std::marker::PhantomData<&'a [E]>,
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    static KEYS_LISTED: RefCell<Vec<*const ()>> = const { RefCell::new(Vec::new()) };
    static VALUES_LISTED: RefCell<Vec<*const ()>> = const { RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
impl<'a, E: Element> Listed<'a, E> {
    /// Keys `0..n`, each checked to be `width` long.
    pub(super) fn keys(n: usize, width: usize, key: &impl Fn(usize) -> &'a [E]) -> Self {
        Self::list(&KEYS_LISTED, n, width, key)
    }

    /// Values `0..n`, each checked to be `width` long.
    pub(super) fn values(n: usize, width: usize, value: &impl Fn(usize) -> &'a [E]) -> Self {
        Self::list(&VALUES_LISTED, n, width, value)
    }

    fn list(
        home: &'static std::thread::LocalKey<RefCell<Vec<*const ()>>>,
        n: usize,
        width: usize,
        row: &impl Fn(usize) -> &'a [E],
    ) -> Self {
        let mut rows = home.take();
        rows.clear();
        rows.extend((0..n).map(|i| {
            let row = row(i);
            assert_eq!(row.len(), width, "a row is not as long as the others");
            row.as_ptr().cast::<()>()
        }));
        Self {
            rows,
            width,
            home,
            of: std::marker::PhantomData,
        }
    }

    /// Each row's first element; [`Self::width`] elements are readable from each.
    pub(super) fn rows(&self) -> &[*const E] {
        // SAFETY: `*const ()` and `*const E` (`E: Sized`) have the same layout, and each was
        // cast from a `*const E`.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.rows.as_ptr().cast::<*const E>(), self.rows.len())
        }
    }

    /// Every row's length.
    pub(super) fn width(&self) -> usize {
        self.width
    }
}

#[cfg(target_arch = "x86_64")]
impl<E> Drop for Listed<'_, E> {
    fn drop(&mut self) {
        self.home.set(std::mem::take(&mut self.rows));
    }
}

/// Rows `first + slots[i]` of `rows` (each `d` long) into `to` as f32, `[n, d]`: f16 rows
/// widened (exactly, so every path gives the same values), f32 rows copied.
pub(super) fn gather_rows(
    rows: KvRows<'_>,
    slots: &[usize],
    first: usize,
    d: usize,
    to: &mut Vec<f32>,
) {
    // Resized only when the length changes: every row is written below.
    if to.len() != slots.len() * d {
        to.resize(slots.len() * d, 0.0);
    }
    for (i, out) in to.chunks_exact_mut(d.max(1)).enumerate() {
        let at = (first + slots[i]) * d;
        // Slots lie wherever a sequence's pages are: ask for the rows ahead.
        let ahead = slots.get(i + AHEAD).map(|&slot| (first + slot) * d);
        match rows {
            KvRows::F16(rows) => {
                if let Some(ahead) = ahead {
                    prefetch(rows[ahead..].as_ptr().cast(), 2 * d);
                }
                widen(&rows[at..][..d], out);
            }
            KvRows::Bf16(rows) => {
                if let Some(ahead) = ahead {
                    prefetch(rows[ahead..].as_ptr().cast(), 2 * d);
                }
                // A shift: the compiler makes it vectors.
                for (to, from) in out.iter_mut().zip(&rows[at..][..d]) {
                    *to = from.to_f32();
                }
            }
            KvRows::F32(rows) => {
                if let Some(ahead) = ahead {
                    prefetch(rows[ahead..].as_ptr().cast(), 4 * d);
                }
                out.copy_from_slice(&rows[at..][..d]);
            }
        }
    }
}

/// `from` widened into `to` (as long): 16 or 8 at a time where the CPU converts in vectors.
fn widen(from: &[f16], to: &mut [f32]) {
    assert_eq!(
        from.len(),
        to.len(),
        "widening into a row of another length"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::allows(crate::cpu::Level::Avx2) {
        // SAFETY: the level includes AVX2 and F16C (and AVX-512 F where chosen), found on
        // this CPU.
        #[allow(unsafe_code)]
        unsafe {
            if crate::cpu::allows(crate::cpu::Level::Avx512) {
                widen_avx512(from, to)
            } else {
                widen_avx2(from, to)
            }
        };
        return;
    }
    for (to, from) in to.iter_mut().zip(from) {
        *to = from.to_f32();
    }
}

/// [`widen`] 16 at a time (`vcvtph2ps`), the rest one by one.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn widen_avx512(from: &[f16], to: &mut [f32]) {
    use std::arch::x86_64::*;
    let whole = from.len() / 16 * 16;
    for at in (0..whole).step_by(16) {
        // SAFETY: `at + 16 <= whole <= from.len() == to.len()` (checked by `widen`).
        let halves = _mm256_loadu_si256(from.as_ptr().add(at).cast());
        _mm512_storeu_ps(to.as_mut_ptr().add(at), _mm512_cvtph_ps(halves));
    }
    for (to, from) in to[whole..].iter_mut().zip(&from[whole..]) {
        *to = from.to_f32();
    }
}

/// [`widen`] 8 at a time, the rest one by one.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_avx2(from: &[f16], to: &mut [f32]) {
    use std::arch::x86_64::*;
    let whole = from.len() / 8 * 8;
    for at in (0..whole).step_by(8) {
        // SAFETY: `at + 8 <= whole <= from.len() == to.len()` (checked by `widen`).
        let halves = _mm_loadu_si128(from.as_ptr().add(at).cast());
        _mm256_storeu_ps(to.as_mut_ptr().add(at), _mm256_cvtph_ps(halves));
    }
    for (to, from) in to[whole..].iter_mut().zip(&from[whole..]) {
        *to = from.to_f32();
    }
}

thread_local! {
    static BUFFERS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// This thread's buffers for widened f16 keys and values, taken out while in use (a task may
/// run another on its thread while it waits) and put back when dropped. Not a closure's
/// argument: a closure in the kernels' `#[inline(always)]` bodies would be compiled without
/// their callers' target features.
pub(super) struct Buffers {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

impl Buffers {
    pub(super) fn take() -> Self {
        let (keys, values) = BUFFERS.take();
        Self { keys, values }
    }

    /// The keys and values of `slots` from row `first` on (a KV head's) gathered into the
    /// buffers as f32, `[n, d]` each ([`gather_rows`]).
    pub(super) fn gather(
        &mut self,
        (keys, values): (KvRows<'_>, KvRows<'_>),
        slots: &[usize],
        first: usize,
        d: usize,
    ) -> (&[f32], &[f32]) {
        gather_rows(keys, slots, first, d, &mut self.keys);
        gather_rows(values, slots, first, d, &mut self.values);
        (&self.keys, &self.values)
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        let taken = (
            std::mem::take(&mut self.keys),
            std::mem::take(&mut self.values),
        );
        BUFFERS.set(taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_half_widens_to_its_value_on_every_path() {
        use crate::cpu::{level, Level};
        let test = "every_half_widens_to_its_value_on_every_path";
        crate::skip_without("avx2", level() >= Level::Avx2, test);
        crate::skip_without("avx512", level() >= Level::Avx512, test);
        // Every bit pattern, in a row whose length is not a whole number of vectors.
        let halves: Vec<f16> = (0..=u16::MAX)
            .map(f16::from_bits)
            .chain([f16::ONE])
            .collect();
        let mut ours = vec![0f32; halves.len()];
        widen(&halves, &mut ours);
        #[cfg(target_arch = "x86_64")]
        let avx2 = (level() >= Level::Avx2).then(|| {
            let mut avx2 = vec![0f32; halves.len()];
            // SAFETY: this CPU has AVX2 and F16C (the level).
            #[allow(unsafe_code)]
            unsafe {
                widen_avx2(&halves, &mut avx2)
            };
            avx2
        });
        #[cfg(not(target_arch = "x86_64"))]
        let avx2: Option<Vec<f32>> = None;
        for (paths, widened) in [Some(&ours), avx2.as_ref()]
            .into_iter()
            .flatten()
            .enumerate()
        {
            for (half, &value) in halves.iter().zip(widened) {
                let exact = half.to_f32();
                if exact.is_nan() {
                    assert!(value.is_nan(), "path {paths}: {:#x}", half.to_bits());
                } else {
                    assert_eq!(value.to_bits(), exact.to_bits(), "path {paths}: {half}");
                }
            }
        }
    }

    #[test]
    fn gathered_rows_are_the_slots_rows_in_list_order() {
        // Two KV heads of 3 slots, d = 2; head 1's rows of slots 2 and 0.
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        let halves: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
        let mut buffer = vec![9.0; 1];
        for layer in [KvRows::F32(&values), KvRows::F16(&halves)] {
            gather_rows(layer, &[2, 0], 3, 2, &mut buffer);
            assert_eq!(buffer, [5.0, 5.5, 3.0, 3.5]);
        }
        let mut buffers = Buffers::take();
        let (keys, values) = (KvRows::F16(&halves), KvRows::F32(&values));
        let (keys, values) = buffers.gather((keys, values), &[1], 0, 2);
        assert_eq!((keys, values), (&[1.0, 1.5][..], &[1.0, 1.5][..]));
    }
}
