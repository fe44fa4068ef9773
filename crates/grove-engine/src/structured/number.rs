//! A JSON number read a byte at a time: its grammar's stages, and for an integer held to
//! bounds (`minimum`, `maximum`, their exclusive forms), its sign and digits so far, each digit
//! allowed only if some way of going on still ends within the bounds, so that a number never
//! starts what it cannot finish.

/// Bytes of one number, at most.
const MAX_NUMBER_BYTES: u8 = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumberStage {
    Minus,
    Zero,
    Integer,
    Dot,
    Fraction,
    Exponent,
    ExponentSign,
    ExponentDigits,
}

impl NumberStage {
    fn complete(self) -> bool {
        matches!(
            self,
            Self::Zero | Self::Integer | Self::Fraction | Self::ExponentDigits
        )
    }

    /// The stage after `byte`, if it continues the number.
    fn next(self, byte: u8, integer: bool) -> Option<Self> {
        use NumberStage::*;
        let digit = byte.is_ascii_digit();
        Some(match (self, byte) {
            (Minus, b'0') => Zero,
            (Minus, _) if digit => Integer,
            (Integer, _) if digit => Integer,
            (Zero | Integer, b'.') if !integer => Dot,
            (Dot | Fraction, _) if digit => Fraction,
            (Zero | Integer | Fraction, b'e' | b'E') if !integer => Exponent,
            (Exponent, b'+' | b'-') => ExponentSign,
            (Exponent | ExponentSign | ExponentDigits, _) if digit => ExponentDigits,
            _ => return None,
        })
    }
}

/// What a number's node asks of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NumberKind {
    pub integer: bool,
    /// An integer's least and greatest values, both included.
    pub bounds: Option<(i64, i64)>,
}

/// A number part read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NumberState {
    stage: NumberStage,
    bytes: u8,
    negative: bool,
    /// The integer part's digits so far, as a number (saturating; only bounds read it).
    magnitude: i64,
}

impl NumberState {
    /// A number that begins with `byte`, if one can.
    pub fn start(kind: NumberKind, byte: u8) -> Option<Self> {
        let stage = match byte {
            b'-' => NumberStage::Minus,
            b'0' => NumberStage::Zero,
            b'1'..=b'9' => NumberStage::Integer,
            _ => return None,
        };
        let state = Self {
            stage,
            bytes: 1,
            negative: byte == b'-',
            magnitude: if byte == b'-' {
                0
            } else {
                i64::from(byte - b'0')
            },
        };
        state.feasible(kind).then_some(state)
    }

    /// The number after `byte`, if it continues it: within the byte limit (where it must be
    /// whole: `1e` at the limit could never end) and, for a bounded integer, able to end within
    /// the bounds.
    pub fn next(self, kind: NumberKind, byte: u8) -> Option<Self> {
        let stage = self.stage.next(byte, kind.integer)?;
        let bytes = self.bytes + 1;
        if !(bytes < MAX_NUMBER_BYTES || (bytes == MAX_NUMBER_BYTES && stage.complete())) {
            return None;
        }
        let magnitude = match stage {
            NumberStage::Zero | NumberStage::Integer if byte.is_ascii_digit() => self
                .magnitude
                .saturating_mul(10)
                .saturating_add(i64::from(byte - b'0')),
            _ => self.magnitude,
        };
        let state = Self {
            stage,
            bytes,
            magnitude,
            ..self
        };
        state.feasible(kind).then_some(state)
    }

    /// Whether the number may end here.
    pub fn complete(self, kind: NumberKind) -> bool {
        self.stage.complete()
            && kind
                .bounds
                .is_none_or(|(low, high)| (low..=high).contains(&self.value()))
    }

    fn value(self) -> i64 {
        if self.negative {
            -self.magnitude
        } else {
            self.magnitude
        }
    }

    /// Whether some way of going on ends within the bounds: more digits `j` times over make
    /// magnitudes `m * 10^j ..= m * 10^j + 10^j - 1`, one of which must land in them.
    fn feasible(self, kind: NumberKind) -> bool {
        let Some((low, high)) = kind.bounds else {
            return true;
        };
        let (low, high) = (i128::from(low), i128::from(high));
        let sign = if self.negative { -1 } else { 1 };
        match self.stage {
            // `-0` is 0; every negative integer is to come.
            NumberStage::Minus => low <= 0,
            NumberStage::Zero => low <= 0 && 0 <= high,
            _ => {
                let reach = low.abs().max(high.abs());
                let mut first = i128::from(self.magnitude);
                let mut span = 1i128;
                while first <= reach {
                    let (a, b) = (sign * first, sign * (first + span - 1));
                    if a.min(b) <= high && a.max(b) >= low {
                        return true;
                    }
                    first *= 10;
                    span *= 10;
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(kind: NumberKind, text: &str) -> Option<NumberState> {
        let mut bytes = text.bytes();
        let mut state = NumberState::start(kind, bytes.next()?)?;
        for byte in bytes {
            state = state.next(kind, byte)?;
        }
        Some(state)
    }

    #[test]
    fn bounded_integers_never_start_what_they_cannot_finish() {
        let kind = NumberKind {
            integer: true,
            bounds: Some((-5, 120)),
        };
        for good in ["0", "-5", "-0", "7", "99", "120", "12"] {
            assert!(read(kind, good).is_some_and(|s| s.complete(kind)), "{good}");
        }
        // Refused at the byte that makes it impossible.
        for bad in ["-6", "121", "130", "1000", "-10", "0.5", "1e2"] {
            assert!(read(kind, bad).is_none(), "{bad}");
        }
        // `1` may still become 10..=120; `-` may become -1..=-5.
        assert!(read(kind, "1").is_some() && read(kind, "-").is_some());
        let tens = NumberKind {
            integer: true,
            bounds: Some((10, 20)),
        };
        let one = read(tens, "1").unwrap();
        assert!(!one.complete(tens), "1 is below 10 but may go on");
        assert!(read(tens, "3").is_none() && read(tens, "0").is_none());
        let free = NumberKind {
            integer: false,
            bounds: None,
        };
        assert!(read(free, "-12.5e-3").is_some_and(|s| s.complete(free)));
    }
}
