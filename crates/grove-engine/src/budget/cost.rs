//! What a round costs on this machine: the target's verify time by total rows and the drafter's
//! time by drafted sequences, each per context class (attention grows with the context), as
//! exponential moving averages of measured times. A startup calibration seeds them; every step
//! then folds its own timings in, so a busier machine (or a longer context) moves the table
//! within a few steps.
//!
//! A cell never measured is predicted from its class's measured cells (linear between them),
//! and outside their range from the shape of the nearest class that measured that far, scaled
//! to agree at the class's nearest measured point.

use serde::Serialize;

/// Weight of a new measurement in its cell: more for a faster one, because a shared machine
/// only ever adds time (a slow measurement may be a busy moment; a fast one is what the cell
/// costs), while a lasting slowdown still moves the cell within a few steps.
const EMA: f64 = 0.3;
const EMA_FASTER: f64 = 0.6;

/// Context classes: below 256 tokens, then one per doubling up to 8k and beyond.
pub(crate) const CONTEXT_CLASSES: usize = 7;

/// The class of a mean context of `tokens`.
pub(crate) fn context_class(tokens: usize) -> usize {
    if tokens < 256 {
        0
    } else {
        (1 + (tokens / 256).ilog2() as usize).min(CONTEXT_CLASSES - 1)
    }
}

/// The smallest context of a class (for reports).
fn class_floor(class: usize) -> usize {
    if class == 0 {
        0
    } else {
        256 << (class - 1)
    }
}

/// Measured seconds by a count (rows or sequences), one context class.
#[derive(Debug, Clone, Default)]
struct Curve {
    /// `(count, seconds EMA, observations)`, sorted by count.
    points: Vec<(usize, f64, u64)>,
}

/// A measurement moves its cell at most this factor per step: one stalled step (a page fault,
/// another process's burst) cannot make a cell look many times slower, while a lasting
/// slowdown still gets there within a few steps.
const MAX_STEP_RATIO: f64 = 2.0;

/// `value` moved toward `seconds` by the moving average, the measurement clipped to within
/// [`MAX_STEP_RATIO`] of `value`.
fn moved(value: f64, seconds: f64) -> f64 {
    let seconds = seconds.clamp(value / MAX_STEP_RATIO, value * MAX_STEP_RATIO);
    let weight = if seconds < value { EMA_FASTER } else { EMA };
    value + weight * (seconds - value)
}

impl Curve {
    /// Folds in a measurement; a cell measured for the first time starts from `prior` (what
    /// the table predicted for it) when there is one, as if it had been measured there.
    fn observe(&mut self, count: usize, seconds: f64, prior: Option<f64>) {
        match self.points.binary_search_by_key(&count, |p| p.0) {
            Ok(i) => {
                let point = &mut self.points[i];
                point.1 = moved(point.1, seconds);
                point.2 += 1;
            }
            Err(i) => {
                let value = prior.map_or(seconds, |prior| moved(prior, seconds));
                self.points.insert(i, (count, value, 1));
            }
        }
    }

    fn covers(&self, count: usize) -> bool {
        matches!((self.points.first(), self.points.last()), (Some(a), Some(b)) if a.0 <= count && count <= b.0)
    }

    /// Linear between the measured counts around `count` (which it covers).
    fn interpolate(&self, count: usize) -> f64 {
        let i = self.points.partition_point(|p| p.0 < count);
        let (c1, s1, _) = self.points[i];
        if c1 == count || i == 0 {
            return s1;
        }
        let (c0, s0, _) = self.points[i - 1];
        s0 + (s1 - s0) * (count - c0) as f64 / (c1 - c0) as f64
    }

    /// Beyond the measured range: flat below, and above along the last two points' slope
    /// (never falling: more rows never cost less).
    fn extrapolate(&self, count: usize) -> f64 {
        let n = self.points.len();
        let (first, last) = (self.points[0], self.points[n - 1]);
        if count <= first.0 {
            return first.1;
        }
        let slope = if n >= 2 {
            let before = self.points[n - 2];
            ((last.1 - before.1) / (last.0 - before.0) as f64).max(0.0)
        } else {
            last.1 / last.0 as f64
        };
        last.1 + slope * (count - last.0) as f64
    }

    /// The measured count nearest `count`.
    fn nearest(&self, count: usize) -> usize {
        self.points
            .iter()
            .map(|p| p.0)
            .min_by_key(|&c| c.abs_diff(count))
            .expect("a non-empty curve")
    }
}

/// One quantity (verify or draft time) over context classes.
#[derive(Debug, Clone)]
struct Surface {
    classes: Vec<Curve>,
}

impl Default for Surface {
    fn default() -> Self {
        Self {
            classes: vec![Curve::default(); CONTEXT_CLASSES],
        }
    }
}

impl Surface {
    fn observe(&mut self, class: usize, count: usize, seconds: f64) {
        if count > 0 && seconds.is_finite() && seconds > 0.0 {
            // A new cell between measured ones, or the first of a class where another class
            // measured that count, starts from the prediction; one past the measured range
            // (the startup measurement's) from the measurement alone.
            let own = &self.classes[class];
            let anchored = own.covers(count)
                || (own.points.is_empty() && self.classes.iter().any(|c| c.covers(count)));
            let prior = anchored
                .then(|| self.predict(class, count))
                .flatten()
                .filter(|p| *p > 0.0);
            self.classes[class].observe(count, seconds, prior);
        }
    }

    /// Classes by distance from `class`, `class` first.
    fn nearest_classes(class: usize) -> impl Iterator<Item = usize> {
        (0..CONTEXT_CLASSES)
            .flat_map(move |d| [class.checked_sub(d), Some(class + d)])
            .flatten()
            .filter(|&c| c < CONTEXT_CLASSES)
            .scan(None, |last, c| {
                let fresh = *last != Some(c);
                *last = Some(c);
                Some(fresh.then_some(c))
            })
            .flatten()
    }

    /// A class with nothing measured stands in for by its nearest measured class.
    fn predict(&self, class: usize, count: usize) -> Option<f64> {
        let class = Self::nearest_classes(class).find(|&c| !self.classes[c].points.is_empty())?;
        let own = &self.classes[class];
        if own.covers(count) {
            return Some(own.interpolate(count));
        }
        let shaped = Self::nearest_classes(class)
            .skip(1)
            .map(|c| &self.classes[c])
            .find(|other| other.covers(count));
        Some(match shaped {
            Some(other) => {
                let anchor = own.nearest(count);
                let at_anchor = if other.covers(anchor) {
                    other.interpolate(anchor)
                } else {
                    other.extrapolate(anchor)
                };
                other.interpolate(count) * own.interpolate(anchor) / at_anchor
            }
            None => own.extrapolate(count),
        })
    }
}

/// A cell of the printed table.
#[derive(Debug, Clone, Serialize)]
pub struct CostCell {
    /// Smallest mean context of the class, in tokens.
    pub context: usize,
    /// Rows verified (target) or sequences drafted (drafter) in one step.
    pub count: usize,
    pub ms: f64,
    pub observations: u64,
}

/// The measured cost table; see the module doc.
#[derive(Debug, Clone, Default)]
pub struct CostTable {
    verify: Surface,
    draft: Surface,
    /// Measurements are ignored: the table was given and stays as it is.
    fixed: bool,
}

impl CostTable {
    pub(crate) fn observe_verify(&mut self, context: usize, rows: usize, seconds: f64) {
        if !self.fixed {
            self.verify.observe(context_class(context), rows, seconds);
        }
    }

    pub(crate) fn observe_draft(&mut self, context: usize, sequences: usize, seconds: f64) {
        if !self.fixed {
            self.draft
                .observe(context_class(context), sequences, seconds);
        }
    }

    /// From now on measurements leave the table as it is.
    pub(crate) fn fix(&mut self) {
        self.fixed = true;
    }

    /// Seconds of a verify forward of `rows` rows over a mean context of `context` tokens.
    pub(crate) fn verify(&self, context: usize, rows: usize) -> Option<f64> {
        self.verify.predict(context_class(context), rows)
    }

    /// Seconds of one drafter pass (and tree build) for `sequences` sequences.
    pub(crate) fn draft(&self, context: usize, sequences: usize) -> Option<f64> {
        if sequences == 0 {
            return Some(0.0);
        }
        self.draft.predict(context_class(context), sequences)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.verify.classes.iter().all(|c| c.points.is_empty())
    }

    fn cells(surface: &Surface) -> Vec<CostCell> {
        surface
            .classes
            .iter()
            .enumerate()
            .flat_map(|(class, curve)| {
                curve
                    .points
                    .iter()
                    .map(move |&(count, seconds, n)| CostCell {
                        context: class_floor(class),
                        count,
                        ms: seconds * 1e3,
                        observations: n,
                    })
            })
            .collect()
    }

    /// Every measured verify cell.
    pub fn verify_cells(&self) -> Vec<CostCell> {
        Self::cells(&self.verify)
    }

    /// Every measured draft cell.
    pub fn draft_cells(&self) -> Vec<CostCell> {
        Self::cells(&self.draft)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_double_from_256_tokens() {
        let classes: Vec<usize> = [0, 255, 256, 511, 512, 1023, 1024, 4096, 8191, 8192, 100_000]
            .iter()
            .map(|&t| context_class(t))
            .collect();
        assert_eq!(classes, [0, 0, 1, 1, 2, 2, 3, 5, 5, 6, 6]);
        assert_eq!(class_floor(3), 1024);
    }

    #[test]
    fn measured_cells_interpolate_and_extrapolate_upward() {
        let mut table = CostTable::default();
        table.observe_verify(0, 1, 1.0);
        table.observe_verify(0, 5, 3.0);
        assert_eq!(table.verify(0, 1), Some(1.0));
        assert_eq!(table.verify(0, 3), Some(2.0));
        assert_eq!(table.verify(0, 9), Some(5.0));
        assert_eq!(table.draft(0, 1), None);
        assert_eq!(table.draft(0, 0), Some(0.0));
    }

    #[test]
    fn a_new_measurement_moves_its_cell_by_the_moving_average() {
        let mut table = CostTable::default();
        table.observe_verify(0, 2, 1.0);
        table.observe_verify(0, 2, 2.0);
        let slower = 1.0 + EMA;
        assert!((table.verify(0, 2).unwrap() - slower).abs() < 1e-12);
        table.observe_verify(0, 2, 1.0);
        let faster = slower - EMA_FASTER * (slower - 1.0);
        assert!((table.verify(0, 2).unwrap() - faster).abs() < 1e-12);
        assert_eq!(table.verify_cells()[0].observations, 3);
    }

    #[test]
    fn one_stalled_step_cannot_make_a_cell_many_times_slower() {
        let mut table = CostTable::default();
        table.observe_verify(0, 1, 1.0);
        table.observe_verify(0, 4, 2.0);
        // A stall of 30x in a measured cell, in a new cell between measured ones, and in the
        // first cell of a new context class.
        table.observe_verify(1000, 1, 30.0);
        table.observe_verify(0, 1, 30.0);
        table.observe_verify(0, 2, 30.0);
        let bound = 1.0 + EMA * (MAX_STEP_RATIO - 1.0);
        assert!((table.verify(0, 1).unwrap() - bound).abs() < 1e-12);
        assert!(table.verify(0, 2).unwrap() < 2.0 * 4.0 / 3.0);
        assert!(table.verify(1000, 1).unwrap() <= bound + 1e-12);
        // A lasting slowdown gets there.
        for _ in 0..20 {
            table.observe_verify(0, 1, 30.0);
        }
        assert!(table.verify(0, 1).unwrap() > 29.0);
    }

    #[test]
    fn another_class_lends_its_shape_scaled_to_agree_where_both_measured() {
        let mut table = CostTable::default();
        // Short context: 1 row 1 s, 8 rows 4 s; long context measured at 1 row only, 2 s.
        table.observe_verify(0, 1, 1.0);
        table.observe_verify(0, 8, 4.0);
        // (A new class's first cells start from the other class's prediction: measured a few
        // times, they reach what they measure.)
        for _ in 0..30 {
            table.observe_verify(2048, 1, 2.0);
        }
        assert!((table.verify(2048, 8).unwrap() - 8.0).abs() < 1e-3);
        // A class with nothing measured takes the nearest measured class as it is.
        assert!((table.verify(1500, 8).unwrap() - 8.0).abs() < 1e-3);
        assert_eq!(table.verify(300, 8), Some(4.0));
    }
}
