//! Which target a shipped drafter was trained for (`grove-drafter.json` beside its weights),
//! so `generate`, `serve` and `bench` pick the right drafter on their own and refuse one made
//! for another target. z-lab drafters carry no manifest and load as before.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Model, ModelError, TextTokenizer};

pub const MANIFEST_FILE: &str = "grove-drafter.json";

/// What identifies a target for a drafter: its family and shape, and its vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetFingerprint {
    /// Family, layer count and widths, vocabulary size.
    pub shape: String,
    /// [`TextTokenizer::vocabulary_hash`], when the target has a tokenizer.
    pub vocabulary: Option<String>,
}

impl TargetFingerprint {
    pub fn of(model: &dyn Model, tokenizer: Option<&TextTokenizer>) -> Self {
        let c = model.config();
        Self {
            shape: format!(
                "{:?} layers={} hidden={} heads={}/{} head_dim={} intermediate={} vocab={}",
                c.family,
                c.num_layers,
                c.hidden_size,
                c.num_heads,
                c.num_kv_heads,
                c.head_dim,
                c.intermediate_size,
                c.vocab_size
            ),
            vocabulary: tokenizer.map(TextTokenizer::vocabulary_hash),
        }
    }

    /// What differs between a drafter's target (`self`) and `actual`, in words; empty when
    /// they match. A side without a tokenizer hash does not compare vocabularies.
    pub fn differences(&self, actual: &Self) -> Vec<String> {
        let mut differences = Vec::new();
        if self.shape != actual.shape {
            differences.push(format!(
                "trained for a target of shape `{}`, this target is `{}`",
                self.shape, actual.shape
            ));
        }
        if let (Some(trained), Some(here)) = (&self.vocabulary, &actual.vocabulary) {
            if trained != here {
                differences.push(format!(
                    "trained for vocabulary hash {trained}, this target's tokenizer hashes to {here}"
                ));
            }
        }
        differences
    }
}

/// A drafter's manifest: its target and how it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrafterManifest {
    pub target: TargetFingerprint,
    /// The target file's name when trained (informational).
    pub target_name: String,
    /// The command that trained it (informational).
    pub command: String,
    /// `"q8_0"`: the drafter's float matrices run as Q8_0 products (its drafts then differ
    /// from the stored weights' by rounding only; what is accepted is the target's choice
    /// either way). Absent: as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub products: Option<String>,
}

impl DrafterManifest {
    /// The manifest in `dir`, if it has one.
    pub fn read(dir: &Path) -> Result<Option<Self>, ModelError> {
        let path = dir.join(MANIFEST_FILE);
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| ModelError::Config {
                path,
                message: e.to_string(),
            })
    }

    /// Whether the manifest in `dir` asks for Q8_0 products; an unknown format is an error
    /// naming the field.
    pub fn q8_0_products(dir: &Path) -> Result<bool, ModelError> {
        let Some(manifest) = Self::read(dir)? else {
            return Ok(false);
        };
        match manifest.products.as_deref() {
            None => Ok(false),
            Some("q8_0") => Ok(true),
            Some(other) => Err(ModelError::Config {
                path: dir.join(MANIFEST_FILE),
                message: format!("`products` is {other:?}; the one format known is \"q8_0\""),
            }),
        }
    }

    pub fn write(&self, dir: &Path) -> Result<(), ModelError> {
        let path = dir.join(MANIFEST_FILE);
        std::fs::write(&path, serde_json::to_string_pretty(self).expect("json"))
            .map_err(|source| ModelError::Io { path, source })
    }

    /// Refuses a drafter in `dir` whose manifest names another target.
    pub fn check(dir: &Path, actual: &TargetFingerprint) -> Result<(), ModelError> {
        let Some(manifest) = Self::read(dir)? else {
            return Ok(());
        };
        let differences = manifest.target.differences(actual);
        if differences.is_empty() {
            return Ok(());
        }
        Err(ModelError::IncompatibleDrafter {
            path: dir.to_owned(),
            message: format!(
                "it was trained for {}: {}",
                manifest.target_name,
                differences.join("; ")
            ),
        })
    }
}

/// The drafter directory under `root` (one directory per drafter) whose manifest matches
/// `actual`, the first by name when several do.
pub fn find_drafter(root: &Path, actual: &TargetFingerprint) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    dirs.into_iter().find(|dir| {
        matches!(DrafterManifest::read(dir), Ok(Some(m))
            if m.target.vocabulary.is_some() && m.target.differences(actual).is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(shape: &str, vocabulary: Option<&str>) -> TargetFingerprint {
        TargetFingerprint {
            shape: shape.into(),
            vocabulary: vocabulary.map(str::to_owned),
        }
    }

    fn manifest(target: TargetFingerprint) -> DrafterManifest {
        DrafterManifest {
            target,
            target_name: "target.gguf".into(),
            command: "grove train-drafter".into(),
            products: None,
        }
    }

    #[test]
    fn differences_name_the_shape_and_the_vocabulary() {
        let trained = fingerprint("Qwen2 layers=24", Some("aa"));
        assert!(trained.differences(&trained.clone()).is_empty());
        assert!(trained
            .differences(&fingerprint("Qwen2 layers=24", None))
            .is_empty());
        let both = trained.differences(&fingerprint("Qwen2 layers=28", Some("bb")));
        assert_eq!(both.len(), 2);
        assert!(
            both[0].contains("layers=28") && both[1].contains("bb"),
            "{both:?}"
        );
    }

    #[test]
    fn the_matching_drafter_is_found_and_a_mismatched_one_refused() {
        let root = tempfile::tempdir().unwrap();
        let here = fingerprint("Qwen2 layers=24", Some("aa"));
        for (name, target) in [
            ("a-other", fingerprint("Qwen2 layers=28", Some("bb"))),
            ("b-match", here.clone()),
        ] {
            let dir = root.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            manifest(target).write(&dir).unwrap();
        }
        std::fs::create_dir_all(root.path().join("c-no-manifest")).unwrap();
        assert_eq!(
            find_drafter(root.path(), &here),
            Some(root.path().join("b-match"))
        );
        assert_eq!(
            find_drafter(root.path(), &fingerprint("Llama layers=16", Some("aa"))),
            None
        );
        assert!(DrafterManifest::check(&root.path().join("b-match"), &here).is_ok());
        assert!(DrafterManifest::check(&root.path().join("c-no-manifest"), &here).is_ok());
        let message = DrafterManifest::check(&root.path().join("a-other"), &here)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("trained for target.gguf") && message.contains("layers=28"),
            "{message}"
        );
    }
}
