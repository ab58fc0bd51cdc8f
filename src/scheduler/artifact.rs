//! Policy files: a trained network with its input normalisation and how it was made, versioned
//! and checksummed.
//!
//! Owns: the file format (JSON: `format`, `schema_version`, `checksum`, `payload`) and its
//! checks. The checksum is xxh3-64 of the payload as prepfs serialises it (floats round-trip
//! exactly: serde_json's `float_roundtrip`), so a hand-edited or truncated file is refused rather
//! than half-trusted. Must never make a mount fail: callers turn every error into a warning and the heuristic.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::network::{InvalidNetwork, Network, Normalisation};
use super::state::{RewardWeights, SCHEMA_VERSION};

/// The `format` field of every policy file.
pub const FORMAT: &str = "prepfs-policy";

/// The policy that ships with prepfs (trained by `prepfs policy train`, see policy/README.md).
const SHIPPED: &str = include_str!("../../policy/default.json");

/// What a policy file holds besides its envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Payload {
    /// The actor-critic's weights.
    pub network: Network,
    /// Applied to the state before the network.
    pub normalisation: Normalisation,
    /// Factor on rewards the value head learned under (online fine-tuning keeps it).
    pub reward_scale: f64,
    /// How it was trained.
    pub metadata: Metadata,
}

/// Provenance of a policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// The command that produced it.
    pub command: String,
    /// prepfs version that trained it.
    pub prepfs_version: String,
    /// Reward weights it was trained for.
    pub reward: RewardWeights,
    /// The training configuration (simulator, PPO settings, seed), as the trainer wrote it.
    pub training: serde_json::Value,
    /// Environment steps of training (offline plus online).
    pub steps: u64,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    format: String,
    schema_version: u32,
    checksum: String,
    payload: Payload,
}

/// Why a policy file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read or written.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Not JSON of the expected shape.
    #[error("not a prepfs policy file: {0}")]
    Parse(#[from] serde_json::Error),
    /// Another format.
    #[error("not a prepfs policy file (format {0:?})")]
    Format(String),
    /// Trained for another state/action schema.
    #[error(
        "policy trained on schema {found:08x}, this prepfs's is {SCHEMA_VERSION:08x} (its knobs or state features differ): retrain it with `prepfs policy train`"
    )]
    Schema {
        /// The file's version.
        found: u32,
    },
    /// The payload does not match its checksum.
    #[error("policy checksum mismatch (file corrupt or edited)")]
    Checksum,
    /// Wrong shapes or non-finite weights.
    #[error(transparent)]
    Network(#[from] InvalidNetwork),
    /// Normalisation of the wrong length or with non-finite entries, or a bad reward scale.
    #[error("policy normalisation or reward scale is malformed")]
    Normalisation,
}

fn checksum(payload: &Payload) -> Result<String, PolicyError> {
    let text = serde_json::to_string(payload)?;
    Ok(format!(
        "xxh3:{:016x}",
        xxhash_rust::xxh3::xxh3_64(text.as_bytes())
    ))
}

impl Payload {
    /// Parses and checks a policy file's text.
    pub fn parse(text: &str) -> Result<Payload, PolicyError> {
        let value: serde_json::Value = serde_json::from_str(text)?;
        let format = value["format"].as_str().unwrap_or_default();
        if format != FORMAT {
            return Err(PolicyError::Format(format.to_owned()));
        }
        let found = value["schema_version"].as_u64().unwrap_or(0);
        if found != u64::from(SCHEMA_VERSION) {
            return Err(PolicyError::Schema {
                found: u32::try_from(found).unwrap_or(u32::MAX),
            });
        }
        let envelope: Envelope = serde_json::from_value(value)?;
        if checksum(&envelope.payload)? != envelope.checksum {
            return Err(PolicyError::Checksum);
        }
        let payload = envelope.payload;
        payload.network.validate()?;
        let scale_ok = payload.reward_scale.is_finite() && payload.reward_scale > 0.0;
        if !(payload.normalisation.is_valid() && scale_ok) {
            return Err(PolicyError::Normalisation);
        }
        Ok(payload)
    }

    /// Reads and checks the policy file at `path`.
    pub fn load(path: &Path) -> Result<Payload, PolicyError> {
        Payload::parse(&std::fs::read_to_string(path)?)
    }

    /// The policy shipped inside the binary.
    pub fn shipped() -> Result<Payload, PolicyError> {
        Payload::parse(SHIPPED)
    }

    /// The file text: envelope, checksum and payload, pretty-printed.
    pub fn to_text(&self) -> Result<String, PolicyError> {
        let envelope = Envelope {
            format: FORMAT.to_owned(),
            schema_version: SCHEMA_VERSION,
            checksum: checksum(self)?,
            payload: self.clone(),
        };
        Ok(serde_json::to_string_pretty(&envelope)? + "\n")
    }

    /// Writes the file atomically (temporary file, then rename).
    pub fn save(&self, path: &Path) -> Result<(), PolicyError> {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        let mut tmp = tempfile::NamedTempFile::new_in(dir.unwrap_or(Path::new(".")))?;
        std::io::Write::write_all(&mut tmp, self.to_text()?.as_bytes())?;
        // A policy is not a secret: readable like any file the user writes.
        std::fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::action::LOGITS;
    use crate::scheduler::network::{Dense, HIDDEN};
    use crate::scheduler::state::STATE;

    fn dense(inputs: usize, outputs: usize) -> Dense {
        Dense {
            inputs,
            outputs,
            weight: (0..inputs * outputs)
                .map(|i| (i as f32 * 0.37).sin() * 0.1)
                .collect(),
            bias: vec![0.01; outputs],
        }
    }

    fn payload() -> Payload {
        Payload {
            network: Network {
                l1: dense(STATE, HIDDEN),
                l2: dense(HIDDEN, HIDDEN),
                policy: dense(HIDDEN, LOGITS),
                value: dense(HIDDEN, 1),
            },
            normalisation: Normalisation::identity(),
            reward_scale: 0.5,
            metadata: Metadata {
                command: "test".into(),
                prepfs_version: "0".into(),
                reward: RewardWeights::default(),
                training: serde_json::json!({"seed": 1}),
                steps: 7,
            },
        }
    }

    /// A change to the knobs' or the features' table changes the schema: the shipped policy
    /// must then be trained again (policy/README.md says how).
    #[test]
    fn the_shipped_policy_was_trained_on_this_schema() {
        if let Err(e) = Payload::shipped() {
            panic!("policy/default.json: {e}");
        }
    }

    #[test]
    fn a_saved_policy_loads_back_bit_for_bit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        let p = payload();
        p.save(&path).unwrap();
        assert_eq!(Payload::load(&path).unwrap(), p);
    }

    #[test]
    fn edited_mismatched_or_broken_files_are_refused_with_a_reason() {
        let text = payload().to_text().unwrap();
        let edited = text.replacen("0.01", "0.02", 1);
        assert!(matches!(
            Payload::parse(&edited),
            Err(PolicyError::Checksum)
        ));
        let ours = format!("\"schema_version\": {SCHEMA_VERSION}");
        assert!(text.contains(&ours));
        let newer = text.replace(&ours, "\"schema_version\": 99");
        let err = Payload::parse(&newer).unwrap_err();
        assert!(matches!(err, PolicyError::Schema { found: 99 }), "{err}");
        assert!(err.to_string().contains("schema 00000063"), "{err}");
        let other = text.replace(FORMAT, "something-else");
        assert!(matches!(
            Payload::parse(&other),
            Err(PolicyError::Format(_))
        ));
        assert!(matches!(
            Payload::parse(&text[..text.len() / 2]),
            Err(PolicyError::Parse(_))
        ));
        assert!(matches!(Payload::parse("[]"), Err(PolicyError::Format(_))));
        let mut nan = payload();
        nan.network.l2.bias[3] = f32::NAN;
        // NaN serialises as null and fails to parse back as f32: refused either way.
        assert!(Payload::parse(&nan.to_text().unwrap()).is_err());
        let mut short = payload();
        short.network.l1.weight.pop();
        let err = Payload::parse(&short.to_text().unwrap()).unwrap_err();
        assert!(matches!(err, PolicyError::Network(_)), "{err}");
    }
}
