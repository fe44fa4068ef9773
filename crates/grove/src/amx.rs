//! Where this machine's AMX tiles multiply, decided at start-up by a trial in a child process
//! (`grove kernel-trial`, [`grove_kernels::quant::amx_trial`]): the child multiplies on the
//! tiles and on the VNNI kernel, checks their bits agree and times both; the parent adopts
//! what it found. A child that faults on its first tile instruction, hangs or prints
//! nonsense leaves the tiles unused and the program running on the VNNI kernel.
//!
//! Only where the kernels run at the AMX level by the CPU's choice: `GROVE_KERNEL=amx` uses
//! the tiles without a trial, a lower level never.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use grove_kernels::cpu::{self, Level};
use grove_kernels::quant::amx_trial::{self, FormatTrial, Plan, Trial};
use grove_kernels::quant::QuantFormat;

/// The hidden subcommand the child runs.
pub const TRIAL_COMMAND: &str = "kernel-trial";

/// How long the child may take (0.4 s on a Xeon family 6 model 207 with AMX).
const TRIAL_TIMEOUT: Duration = Duration::from_secs(60);

/// What start-up found, for reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The trial ran (its plan adopted).
    Tried(Trial),
    /// It could not run or finish: why (no tiles used).
    Failed(String),
}

static OUTCOME: OnceLock<Outcome> = OnceLock::new();

/// What start-up found, where a trial was run.
pub fn outcome() -> Option<&'static Outcome> {
    OUTCOME.get()
}

/// Runs the trial in a child process and adopts its plan, where the kernels run at the AMX
/// level by the CPU's choice; elsewhere nothing.
pub fn settle() {
    if !cpu::allows(Level::Amx) || cpu::forced() || outcome().is_some() {
        return;
    }
    let outcome = match std::env::current_exe() {
        Ok(program) => trial_in_child(&program, &[TRIAL_COMMAND], TRIAL_TIMEOUT),
        Err(error) => Err(format!(
            "cannot find this program to run the trial: {error}"
        )),
    };
    let outcome = match outcome {
        Ok(trial) => {
            tracing::info!("AMX tiles: {}", describe(&trial));
            Outcome::Tried(trial)
        }
        Err(why) => {
            tracing::warn!("AMX tiles unused: {why}");
            Outcome::Failed(why)
        }
    };
    let plan = match &outcome {
        Outcome::Tried(trial) => Plan::from_trial(trial),
        Outcome::Failed(_) => Plan::none(),
    };
    // Settled once per process, before any product: neither can be set already.
    let _ = amx_trial::adopt(plan);
    let _ = OUTCOME.set(outcome);
}

/// The child's part: the trial, as JSON on stdout.
pub fn print_trial() -> anyhow::Result<()> {
    let trial = amx_trial::run().map_err(anyhow::Error::msg)?;
    println!("{}", to_json(&trial));
    Ok(())
}

/// `program args` run as the trial's child: its trial, or why there is none.
pub fn trial_in_child(program: &Path, args: &[&str], timeout: Duration) -> Result<Trial, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the trial: {e}"))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < timeout => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the trial did not finish in {} s",
                    timeout.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for the trial: {e}")),
        }
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    // Both pipes hold the child's little output once it has exited.
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    if !status.success() {
        let last = stderr.lines().last().unwrap_or("").trim();
        return Err(format!("the trial failed ({status}){}", on(last)));
    }
    from_json(stdout.trim())
}

/// `: text` where there is text.
fn on(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

fn to_json(trial: &Trial) -> serde_json::Value {
    let formats: Vec<serde_json::Value> = (trial.formats.iter())
        .map(|t| serde_json::json!({"format": t.format.name(), "times": t.times}))
        .collect();
    serde_json::json!({"agrees": trial.agrees, "formats": formats})
}

fn from_json(text: &str) -> Result<Trial, String> {
    let bad = |why: &str| format!("the trial printed {why}: {text:?}");
    let json: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    let agrees = json["agrees"]
        .as_bool()
        .ok_or_else(|| bad("no \"agrees\""))?;
    let formats = (json["formats"].as_array())
        .ok_or_else(|| bad("no \"formats\""))?
        .iter()
        .map(|entry| {
            let name = entry["format"].as_str().unwrap_or_default();
            let format = (QuantFormat::ALL.into_iter())
                .find(|f| f.name() == name)
                .ok_or_else(|| bad(&format!("an unknown format {name:?}")))?;
            let times: Vec<(usize, f64, f64)> = serde_json::from_value(entry["times"].clone())
                .map_err(|e| bad(&format!("times for {name} that are not [rows, s, s] ({e})")))?;
            Ok(FormatTrial { format, times })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Trial { agrees, formats })
}

/// A trial in words: per format, from how many rows its products take the tiles.
pub fn describe(trial: &Trial) -> String {
    if !trial.agrees {
        return "unused: their sums differ from the VNNI kernel's".into();
    }
    let formats: Vec<String> = (trial.formats.iter())
        .map(|t| match t.tiles_from() {
            Some(rows) => format!("{} from {rows} rows", t.format.name()),
            None => format!("{} not faster", t.format.name()),
        })
        .collect();
    formats.join(", ")
}

/// The tiles' part of the kernels' report: the trial's plan and times, why there is none,
/// or that `GROVE_KERNEL=amx` forced them.
pub fn report() -> Option<serde_json::Value> {
    if cpu::allows(Level::Amx) && cpu::forced() {
        return Some(serde_json::json!({"forced": true, "from_rows": amx_trial::MIN_ROWS}));
    }
    Some(match outcome()? {
        Outcome::Tried(trial) => {
            let mut json = to_json(trial);
            for (entry, t) in json["formats"]
                .as_array_mut()?
                .iter_mut()
                .zip(&trial.formats)
            {
                entry["from_rows"] = t.tiles_from().into();
            }
            json
        }
        Outcome::Failed(why) => serde_json::json!({"error": why}),
    })
}

/// [`report`] in words, for the kernels line.
pub fn report_line() -> Option<String> {
    if cpu::allows(Level::Amx) && cpu::forced() {
        return Some(format!("tiles from {} rows (forced)", amx_trial::MIN_ROWS));
    }
    Some(match outcome()? {
        Outcome::Tried(trial) => format!("tiles {}", describe(trial)),
        Outcome::Failed(why) => format!("tiles unused: {why}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str, timeout: Duration) -> Result<Trial, String> {
        trial_in_child(Path::new("sh"), &["-c", script], timeout)
    }

    #[test]
    fn a_trial_that_faults_hangs_or_babbles_leaves_the_tiles_unused() {
        let faulted = shell(
            "echo 'tile fault' >&2; kill -ILL $$",
            Duration::from_secs(10),
        );
        let why = faulted.unwrap_err();
        assert!(why.contains("signal: 4") && why.contains("SIGILL"), "{why}");
        let hung = shell("sleep 5", Duration::from_millis(100)).unwrap_err();
        assert!(hung.contains("did not finish"), "{hung}");
        let failed = shell("echo 'no AMX here' >&2; exit 3", Duration::from_secs(10));
        let why = failed.unwrap_err();
        assert!(
            why.contains("exit status: 3") && why.ends_with("no AMX here"),
            "{why}"
        );
        let babble = shell("echo '{\"agrees\": true}'", Duration::from_secs(10));
        assert!(babble.unwrap_err().contains("no \"formats\""));
        let unknown = shell(
            "echo '{\"agrees\": true, \"formats\": [{\"format\": \"Q9_9\", \"times\": []}]}'",
            Duration::from_secs(10),
        );
        assert!(unknown.unwrap_err().contains("unknown format \"Q9_9\""));
    }

    #[test]
    fn a_trial_travels_through_its_json() {
        let trial = Trial {
            agrees: true,
            formats: vec![
                FormatTrial {
                    format: QuantFormat::Q8_0,
                    times: vec![(4, 1e-5, 2e-5), (8, 2e-5, 4e-5), (16, 4e-5, 8e-5)],
                },
                FormatTrial {
                    format: QuantFormat::Q6K,
                    times: vec![(4, 3e-5, 2e-5), (8, 5e-5, 4e-5), (16, 9e-5, 8e-5)],
                },
            ],
        };
        let text = to_json(&trial).to_string();
        let script = format!("printf '%s\\n' '{text}'");
        assert_eq!(shell(&script, Duration::from_secs(10)), Ok(trial.clone()));
        assert_eq!(describe(&trial), "Q8_0 from 4 rows, Q6_K not faster");
    }
}
