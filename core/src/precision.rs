//! `--precision`: how the model computes a run's vectors. Pinned in the run's output settings
//! beside `--vector-dtype`: vectors of FP8 projections and of the device's own precision are
//! close (cosine ≥ 0.99) but not the same, so one run (and the collection it fills) never holds
//! both.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// The device's own: bf16 on a GPU, f32 on the CPU.
    #[default]
    Native,
    /// The projections in FP8 (E4M3, per-channel and per-token scales) on a GPU of compute
    /// capability 8.9 or newer; attention, norms and the residual stream in bf16.
    Fp8,
}

impl Precision {
    /// Its name on the command line and in files (`native`, `fp8`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Native => "native",
            Precision::Fp8 => "fp8",
        }
    }

    /// The default: files that leave the field out when native read and hash as before it.
    pub fn is_native(&self) -> bool {
        *self == Precision::Native
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settings_file_without_the_field_means_native_and_names_round_trip() {
        #[derive(Deserialize)]
        struct Old {
            #[serde(default)]
            precision: Precision,
        }
        let old: Old = serde_json::from_str("{}").unwrap();
        assert_eq!(old.precision, Precision::Native);
        for p in [Precision::Native, Precision::Fp8] {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.name()));
            assert_eq!(serde_json::from_str::<Precision>(&json).unwrap(), p);
        }
    }
}
