/*!
The list of backends, and what is made from it.

[`backends!`] takes one line per backend, `Variant => module::{Kind, Settings}`, and makes:
- the backend's module (a file or a folder beside this one), declared and re-exported;
- [`Backend`], the enum that names the backend (the first line is the default), with its name
  (the module's name: `backend = "slurm"` in the run config, `--backend slurm`, the backend
  column of run.db's `jobs`) and its [`BackendKind`] (`Kind`, a unit struct);
- [`SchedulerConfig`], the `[scheduler]` table, with one field per backend: `[scheduler.slurm]`
  is read by serde into that backend's `Settings` (unknown keys refused, missing ones default),
  so a run's stored config round-trips with no code outside the backend's module.

Everything else about a backend is in its module, behind `Kind`'s hooks. That is why adding a
backend is one module and one line of the list (ARCHITECTURE.md, "How to add a scheduler
backend").

[`Backend`]: super::Backend
[`BackendKind`]: super::BackendKind
[`SchedulerConfig`]: super::SchedulerConfig
*/

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Backend;

/// See the module's doc.
macro_rules! backends {
    ($($(#[$doc:meta])* $variant:ident => $module:ident::{$kind:ident, $settings:ident},)+) => {
        $(mod $module;)+
        $(pub use $module::{$kind, $settings};)+

        /// Which scheduler a run uses: one per line of the list in `scheduler/mod.rs`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Backend {
            $($(#[$doc])* $variant,)+
        }

        impl Backend {
            /// Every backend, in the list's order (the first is the default).
            pub const ALL: &'static [Backend] = &[$(Backend::$variant),+];

            /// Their names, in the same order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($module)),+];

            /// Its name: the name of its module.
            pub fn name(self) -> &'static str {
                match self {
                    $(Backend::$variant => stringify!($module),)+
                }
            }

            /// What makes it different from the others.
            pub fn kind(self) -> &'static dyn $crate::scheduler::BackendKind {
                match self {
                    $(Backend::$variant => &$module::$kind,)+
                }
            }
        }

        /// The `[scheduler]` table of a run config.
        #[derive(Debug, Clone, Default, PartialEq, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct SchedulerConfig {
            /// Which backend: its name (default: the first of the list, `local`).
            pub backend: Backend,
            /// Timeout and retries of every scheduler command.
            pub command: $crate::scheduler::CommandConfig,
            /// The most jobs the run may hold queued or running over all its queues together
            /// (a site's per-user limit; `submit --max-jobs` overrides it).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub max_jobs: Option<u32>,
            $(
                /// That backend's own table, `[scheduler.<its name>]`.
                pub $module: $module::$settings,
            )+
            /// Job script template and its values.
            pub script: $crate::scheduler::ScriptConfig,
        }
    };
}

impl Default for Backend {
    fn default() -> Self {
        Backend::ALL[0]
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Backend::ALL
            .iter()
            .copied()
            .find(|b| b.name() == s)
            .ok_or_else(|| format!("unknown backend `{s}`; use {}", one_of(Backend::NAMES)))
    }
}

impl Serialize for Backend {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse()
            .map_err(|_| D::Error::unknown_variant(&name, Backend::NAMES))
    }
}

/// `a, b or c`.
fn one_of(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

pub(super) use backends;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_an_unknown_one_lists_them_all() {
        for backend in Backend::ALL {
            assert_eq!(backend.name().parse::<Backend>(), Ok(*backend));
            let json = serde_json::to_string(backend).unwrap();
            assert_eq!(json, format!("\"{}\"", backend.name()));
            assert_eq!(serde_json::from_str::<Backend>(&json).unwrap(), *backend);
        }
        assert_eq!(Backend::default(), Backend::Local);
        assert_eq!(
            "lsf".parse::<Backend>().unwrap_err(),
            format!("unknown backend `lsf`; use {}", one_of(Backend::NAMES))
        );
        assert_eq!(one_of(&["local", "slurm", "pbs"]), "local, slurm or pbs");
    }
}
