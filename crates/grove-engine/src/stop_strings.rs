//! Stop strings over streamed text. Text that could still be the start of a stop string is
//! held back until it is either completed (generation stops, the stop string is not emitted)
//! or ruled out (the text is released).

#[derive(Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    pending: String,
}

/// What the matcher decided for a chunk of text.
#[derive(Debug, PartialEq, Eq)]
pub enum StopScan {
    /// Text that is safe to emit now.
    Continue(String),
    /// A stop string matched: emit this text, then stop.
    Stopped(String),
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> StopScan {
        self.pending.push_str(text);
        let first_match = self
            .stops
            .iter()
            .filter_map(|stop| self.pending.find(stop.as_str()))
            .min();
        if let Some(at) = first_match {
            let emitted = self.pending[..at].to_owned();
            self.pending.clear();
            return StopScan::Stopped(emitted);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let hold = self
            .stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len())
                    .filter(|&n| stop.is_char_boundary(n) && self.pending.ends_with(&stop[..n]))
                    .max()
            })
            .max()
            .unwrap_or(0);
        let release = self.pending.len() - hold;
        let emitted = self.pending[..release].to_owned();
        self.pending.drain(..release);
        StopScan::Continue(emitted)
    }

    /// Releases held-back text when generation ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_split_across_chunks_is_caught_and_not_emitted() {
        let mut stops = StopStrings::new(vec!["###".into()]);
        assert_eq!(stops.push("abc#"), StopScan::Continue("abc".into()));
        assert_eq!(stops.push("#"), StopScan::Continue(String::new()));
        assert_eq!(stops.push("#tail"), StopScan::Stopped(String::new()));
    }

    #[test]
    fn held_back_text_is_released_when_ruled_out() {
        let mut stops = StopStrings::new(vec!["END".into()]);
        assert_eq!(stops.push("the E"), StopScan::Continue("the ".into()));
        assert_eq!(stops.push("nd"), StopScan::Continue("End".into()));
        assert_eq!(stops.push("x EN"), StopScan::Continue("x ".into()));
        assert_eq!(stops.flush(), "EN");
    }
}
