//! The grid formats: llama.cpp's 1- to 3-bit "importance" quantizations (IQ3_XXS, IQ3_S,
//! IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M). In each, a super-block of 256 weights is a sequence
//! of points of a grid (4 or 8 weights a point: ggml's `iq3xxs_grid` ... `iq1s_grid` in
//! `ggml-common.h`), each weight a small signed magnitude (or, in IQ1, -1, 0 or 1 plus a
//! shift of an eighth), times `d` times an odd scale `2 s + 1` of its 32 (or 16) weights. So
//! each weight is one of at most 16 values: the kernels keep it as an index into them
//! ([`Codebook`]; IQ3's 16 values 4 bits, IQ2's and IQ1's 6 values 3 bits) in IQ4_XS's layout
//! (per-32 scales) or with Q6_K's 16 scales a super-block, and IQ4_XS's arithmetic with
//! another table of values (`columns.rs`).
//!
//! The grids are llama.cpp's numbers (the formats' definition): each point here as its
//! weights' digits, the first weight's in the lowest bits (IQ3: four magnitude ranks of 3
//! bits; IQ2: eight of 2 bits, ranks of 8, 25 and 43; IQ1: eight of 2 bits, -1, 0 and 1 plus
//! 1). The formats' blocks are in [`iq3`], [`iq2`] and [`iq1`].

mod iq1;
mod iq2;
mod iq3;
mod tables;

use std::sync::OnceLock;

use super::QuantFormat;

/// A 4-bit-index format's 16 values (ascending; a format with fewer repeats its ends) and
/// what multiplies `d` besides a sub-block's scale.
#[derive(Debug)]
pub struct Codebook {
    pub values: [i8; 16],
    pub d_factor: f32,
}

/// IQ4_NL's and IQ4_XS's (ggml's `kvalues_iq4nl`).
pub const IQ4: Codebook = Codebook {
    values: super::IQ4_VALUES,
    d_factor: 1.0,
};

/// IQ3_XXS's magnitudes, signed; a quarter of `d`.
pub const IQ3_XXS: Codebook = Codebook {
    values: [
        -62, -52, -44, -36, -28, -20, -12, -4, 4, 12, 20, 28, 36, 44, 52, 62,
    ],
    d_factor: 0.25,
};

/// IQ3_S's odd magnitudes, signed.
pub const IQ3_S: Codebook = Codebook {
    values: [-15, -13, -11, -9, -7, -5, -3, -1, 1, 3, 5, 7, 9, 11, 13, 15],
    d_factor: 1.0,
};

/// IQ2's magnitudes 8, 25 and 43, signed, at the places [`index`] gives them (below 8: a
/// 3-bit index); an eighth of `d` (ggml's `d * (0.5 + s) * 0.25`).
pub const IQ2: Codebook = Codebook {
    values: [
        -43, -25, -8, 8, 25, 43, 43, 43, 43, 43, 43, 43, 43, 43, 43, 43,
    ],
    d_factor: 0.125,
};

/// IQ1's eight times `g + delta` (`g` in {-1, 0, 1}, `delta` an eighth either way) at index
/// `2 (g + 1) + (delta > 0)`; an eighth of `d`.
pub const IQ1: Codebook = Codebook {
    values: [-9, -7, -1, 1, 7, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],
    d_factor: 0.125,
};

/// A super-block as the kernels' units hold it: `d`'s f16 bits, the scales `2 s + 1` of its
/// 16-weight pieces (alike in pairs where the format scales 32 weights) and each weight's
/// index into its [`Codebook`]'s values.
pub(super) struct Decoded {
    pub d: u16,
    pub scales: [u8; 16],
    pub indices: [u8; 256],
}

/// A GGUF super-block of grid format `format` decoded.
pub(super) fn decode(format: QuantFormat, block: &[u8]) -> Decoded {
    match format {
        QuantFormat::Iq3Xxs | QuantFormat::Iq3S => iq3::decode(format, block),
        QuantFormat::Iq2Xxs | QuantFormat::Iq2Xs | QuantFormat::Iq2S => iq2::decode(format, block),
        QuantFormat::Iq1S | QuantFormat::Iq1M => iq1::decode(format, block),
        _ => unreachable!("{} is not a grid format", format.name()),
    }
}

/// [`decode`]'s inverse: `decoded` (from a block of `format`) as its GGUF bytes in `block`.
pub(super) fn encode(format: QuantFormat, decoded: &Decoded, block: &mut [u8]) {
    block.fill(0);
    match format {
        QuantFormat::Iq3Xxs | QuantFormat::Iq3S => iq3::encode(format, decoded, block),
        QuantFormat::Iq2Xxs | QuantFormat::Iq2Xs | QuantFormat::Iq2S => {
            iq2::encode(format, decoded, block)
        }
        QuantFormat::Iq1S | QuantFormat::Iq1M => iq1::encode(format, decoded, block),
        _ => unreachable!("{} is not a grid format", format.name()),
    }
}

/// A super-block whose 32-weight sub-blocks are 4 points of 8 weights and 2 scales `s` of 16
/// weights each (IQ2, IQ1), decoded: `sub_block(j)` gives sub-block `j`'s points and scales,
/// `index(j, l, i, digit)` the index of weight `i` of its point `l`, whose digit is `digit`.
fn decode_eights(
    d: u16,
    grid: Grid,
    sub_block: impl Fn(usize) -> ([usize; 4], [u8; 2]),
    index: impl Fn(usize, usize, usize, u8) -> u8,
) -> Decoded {
    let mut out = Decoded {
        d,
        scales: [0; 16],
        indices: [0; 256],
    };
    for j in 0..8 {
        let (points, scales) = sub_block(j);
        out.scales[2 * j..2 * j + 2].copy_from_slice(&scales.map(|s| 2 * s + 1));
        for (l, &point) in points.iter().enumerate() {
            for (i, digit) in grid.digits(point).enumerate() {
                out.indices[32 * j + 8 * l + i] = index(j, l, i, digit);
            }
        }
    }
    out
}

/// The index of a weight of magnitude rank `rank` (below `ranks`) and sign `negative` in a
/// codebook of `ranks` magnitudes each way: the negative values first, largest magnitude
/// first, the positive ones from `ranks` (IQ3: 8; IQ2: 3, so that its indices fit 3 bits).
fn index(rank: u8, negative: bool, ranks: u8) -> u8 {
    if negative {
        ranks - 1 - rank
    } else {
        ranks + rank
    }
}

/// The magnitude rank and sign of index `q` (the inverse of [`index`]).
fn rank_of(q: u8, ranks: u8) -> (u8, bool) {
    if q < ranks {
        (ranks - 1 - q, true)
    } else {
        (q - ranks, false)
    }
}

/// Sign index `i` (7 bits) as 8 weights' signs: the eighth set where the first seven hold an
/// odd count, so that every 8 hold an even count (ggml's `ksigns_iq2xs`).
fn even_signs(i: u8) -> u8 {
    i | ((i.count_ones() % 2) as u8) << 7
}

/// 8 weights' signs (bit `i` weight `i`) as a sign index, the inverse of [`even_signs`].
fn sign_index(signs: u8) -> u8 {
    debug_assert!(
        signs.count_ones().is_multiple_of(2),
        "an odd count of signs: {signs:#010b}"
    );
    signs & 127
}

/// The bits of a super-block's weights of sub-block `j` (32 weights) that `negative` says,
/// in bytes of 8.
fn signs_of(indices: &[u8], negative: impl Fn(u8) -> bool) -> [u8; 4] {
    std::array::from_fn(|l| {
        (0..8).fold(0, |bits, i| {
            bits | u8::from(negative(indices[8 * l + i])) << i
        })
    })
}

/// One of the formats' grids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grid {
    Iq3Xxs,
    Iq3S,
    Iq2Xxs,
    Iq2Xs,
    Iq2S,
    Iq1S,
}

impl Grid {
    const ALL: [Self; 6] = [
        Self::Iq3Xxs,
        Self::Iq3S,
        Self::Iq2Xxs,
        Self::Iq2Xs,
        Self::Iq2S,
        Self::Iq1S,
    ];

    fn points(self) -> &'static [u16] {
        match self {
            Self::Iq3Xxs => &iq3::IQ3XXS_GRID,
            Self::Iq3S => &iq3::IQ3S_GRID,
            Self::Iq2Xxs => &tables::IQ2XXS_GRID,
            Self::Iq2Xs => &tables::IQ2XS_GRID,
            Self::Iq2S => &tables::IQ2S_GRID,
            Self::Iq1S => &tables::IQ1S_GRID,
        }
    }

    /// Bits of a weight's digit: 3 for IQ3's 4 weights a point, 2 for the others' 8.
    fn bits(self) -> usize {
        match self {
            Self::Iq3Xxs | Self::Iq3S => 3,
            _ => 2,
        }
    }

    fn weights(self) -> usize {
        if self.bits() == 3 {
            4
        } else {
            8
        }
    }

    /// Point `point`'s digits, one a weight.
    fn digits(self, point: usize) -> impl Iterator<Item = u8> {
        let (packed, bits) = (self.points()[point], self.bits());
        (0..self.weights()).map(move |i| ((packed >> (bits * i)) & ((1 << bits) - 1)) as u8)
    }

    /// The point whose digits are `digits`, from a table of every packed digit sequence's
    /// point (made once per grid).
    fn point_of(self, digits: impl Iterator<Item = u8>) -> usize {
        static INVERSES: [OnceLock<Vec<u16>>; 6] = [const { OnceLock::new() }; 6];
        let slot = Self::ALL
            .iter()
            .position(|&grid| grid == self)
            .expect("a grid");
        let inverse = INVERSES[slot].get_or_init(|| {
            let mut inverse = vec![u16::MAX; 1 << (self.bits() * self.weights())];
            for (i, &point) in self.points().iter().enumerate() {
                inverse[usize::from(point)] = i as u16;
            }
            inverse
        });
        let bits = self.bits();
        let key = digits.enumerate().fold(0usize, |key, (i, digit)| {
            key | usize::from(digit) << (bits * i)
        });
        let point = inverse[key];
        assert!(
            point != u16::MAX,
            "not a point of {self:?}'s grid: {key:#x}"
        );
        usize::from(point)
    }
}
