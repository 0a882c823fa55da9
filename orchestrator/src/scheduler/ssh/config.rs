/*!
The `[scheduler.ssh]` table: the fleet's hosts (each a queue), their slots (one job per device
group), and how to reach them with OpenSSH.

```toml
[scheduler]
backend = "ssh"

[[scheduler.ssh.hosts]]
name = "gpu-a"                  # the queue's name; ssh's destination unless `address` is set
slots = ["cuda:0,1", "cuda:2,3"] # two jobs at once, each with two GPUs
embedfleet = "/opt/embedfleet/bin/embedfleet"
env = { HF_HOME = "/scratch/hf" }

[[scheduler.ssh.hosts]]
name = "gpu-b"
address = "10.0.0.12"
user = "embed"
port = 2222
identity = "~/.ssh/id_fleet"
known_hosts = "~/.ssh/known_hosts_fleet"
```
*/

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::super::{seconds_problem, ProgramConfig};

/// The `[scheduler.ssh]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SshConfig {
    /// The `ssh` program and arguments given to every call (`extra_args`, e.g.
    /// `["-F", "/path/ssh_config"]`).
    pub ssh: ProgramConfig,
    /// The hosts, each a queue of `slots.len()` jobs at once.
    pub hosts: Vec<HostConfig>,
    /// Seconds ssh waits for a host to answer (`ConnectTimeout`).
    pub connect_timeout_secs: f64,
    /// Seconds a host's shared connection stays open after its last use (`ControlPersist`).
    pub control_persist_secs: f64,
    /// Where the shared connections' sockets live (default `/tmp/embedfleet-ssh-UID`, made
    /// readable by its owner only): a local directory, never the shared filesystem.
    pub control_dir: Option<PathBuf>,
    /// Seconds between SIGTERM and SIGKILL when a job is cancelled.
    pub grace_secs: f64,
}

impl Default for SshConfig {
    fn default() -> Self {
        Self {
            ssh: ProgramConfig::default(),
            hosts: Vec::new(),
            connect_timeout_secs: 10.0,
            control_persist_secs: 60.0,
            control_dir: None,
            grace_secs: 10.0,
        }
    }
}

/// One host of the fleet: `[[scheduler.ssh.hosts]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostConfig {
    /// The queue's name (letters, digits, `-_.@`); ssh's destination unless `address` is set.
    pub name: String,
    /// Where ssh connects (a host name, an address, or an alias of `~/.ssh/config`).
    pub address: Option<String>,
    /// The login name there (`ssh -l`).
    pub user: Option<String>,
    /// The port (`ssh -p`).
    pub port: Option<u16>,
    /// The private key to log in with (`ssh -i`, with `IdentitiesOnly=yes`).
    pub identity: Option<PathBuf>,
    /// The known_hosts file that holds the host's key (`UserKnownHostsFile`).
    pub known_hosts: Option<PathBuf>,
    /// More ssh arguments for this host, before embedfleet's own (`["-o", "ProxyJump=gw"]`).
    pub options: Vec<String>,
    /// One entry per job the host runs at once, each its devices: `cuda` (every GPU),
    /// `cuda:0,1` (those GPUs: `CUDA_VISIBLE_DEVICES=0,1`), or `cpu` (no GPU).
    pub slots: Vec<String>,
    /// The embedfleet binary there (default: `[scheduler.script] embedfleet`, else the owner's
    /// own path, which fits a binary on the shared filesystem).
    pub embedfleet: Option<String>,
    /// Environment of this host's jobs, added to `[scheduler.script] env` (both go into the
    /// job script, readable by its owner only; never onto a command line).
    pub env: BTreeMap<String, String>,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            address: None,
            user: None,
            port: None,
            identity: None,
            known_hosts: None,
            options: Vec::new(),
            slots: vec!["cuda".to_string()],
            embedfleet: None,
            env: BTreeMap::new(),
        }
    }
}

/// The devices of one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Slot {
    /// Every GPU of the host (`CUDA_VISIBLE_DEVICES` left as it is).
    AllGpus,
    /// These GPUs (`CUDA_VISIBLE_DEVICES`).
    Gpus(Vec<u32>),
    /// No GPU (`CUDA_VISIBLE_DEVICES` empty).
    Cpu,
}

impl Slot {
    /// `cuda`, `cuda:0,1` or `cpu`.
    pub(super) fn parse(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        match spec {
            "cuda" => return Ok(Self::AllGpus),
            "cpu" => return Ok(Self::Cpu),
            _ => {}
        }
        let list = spec
            .strip_prefix("cuda:")
            .ok_or_else(|| format!("slot `{spec}`: use `cuda`, `cuda:0,1` or `cpu`"))?;
        let gpus: Result<Vec<u32>, _> = list.split(',').map(|g| g.trim().parse()).collect();
        match gpus {
            Ok(gpus) if !gpus.is_empty() => Ok(Self::Gpus(gpus)),
            _ => Err(format!(
                "slot `{spec}`: GPU numbers separated by commas, as in `cuda:0,1`"
            )),
        }
    }

    /// What the job's `CUDA_VISIBLE_DEVICES` is set to (`None`: left as it is).
    pub(super) fn visible_devices(&self) -> Option<String> {
        match self {
            Self::AllGpus => None,
            Self::Cpu => Some(String::new()),
            Self::Gpus(gpus) => Some(
                gpus.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        }
    }

    /// The GPUs a host must have for this slot (`AllGpus`: at least the first).
    pub(super) fn needed_gpus(&self) -> Vec<u32> {
        match self {
            Self::AllGpus => vec![0],
            Self::Cpu => Vec::new(),
            Self::Gpus(gpus) => gpus.clone(),
        }
    }
}

impl HostConfig {
    /// ssh's destination.
    pub(super) fn address(&self) -> &str {
        self.address.as_deref().unwrap_or(&self.name)
    }

    /// The slots, parsed (a spec that does not parse is one of [`SshConfig::problems`]).
    pub(super) fn parsed_slots(&self) -> Vec<Slot> {
        self.slots
            .iter()
            .filter_map(|s| Slot::parse(s).ok())
            .collect()
    }

    /// The host's address as the user would type it after `ssh`, for messages.
    pub(super) fn describe(&self) -> String {
        let mut text = match &self.user {
            Some(user) => format!("{user}@{}", self.address()),
            None => self.address().to_string(),
        };
        if let Some(port) = self.port {
            text.push_str(&format!(" port {port}"));
        }
        text
    }
}

impl SshConfig {
    /// The host named `name`.
    pub(super) fn host(&self, name: &str) -> Option<&HostConfig> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// Values that parse but cannot work, each naming its key. `in_use`: the run's backend
    /// is ssh, so a fleet without hosts is one too.
    pub(super) fn problems(&self, in_use: bool) -> Vec<String> {
        let key = "[scheduler.ssh]";
        let mut problems: Vec<String> = [
            ("connect_timeout_secs", self.connect_timeout_secs, false),
            ("control_persist_secs", self.control_persist_secs, true),
            ("grace_secs", self.grace_secs, true),
        ]
        .into_iter()
        .filter_map(|(k, v, zero_ok)| seconds_problem(&format!("{key} {k}"), v, zero_ok))
        .collect();
        if in_use && self.hosts.is_empty() {
            problems.push(format!(
                "{key} hosts: the ssh backend needs at least one host ([[scheduler.ssh.hosts]] \
                 name = \"gpu-a\", see docs/cluster.md)"
            ));
        }
        let mut seen = BTreeSet::new();
        for host in &self.hosts {
            problems.extend(host_problems(host));
            if !seen.insert(host.name.as_str()) {
                problems.push(format!(
                    "{key} hosts: `{}` is listed twice; give each host one entry",
                    host.name
                ));
            }
        }
        problems
    }
}

fn host_problems(host: &HostConfig) -> Vec<String> {
    let key = format!("[scheduler.ssh] host `{}`", host.name);
    let mut problems = Vec::new();
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
    };
    if !word(&host.name) {
        problems.push(format!(
            "{key}: a host's name is its queue's name: letters, digits and `-_.@` (put \
             anything else in `address`)"
        ));
    }
    if host.slots.is_empty() {
        problems.push(format!(
            "{key} slots: give it at least one, e.g. [\"cuda\"]"
        ));
    }
    for spec in &host.slots {
        if let Err(why) = Slot::parse(spec) {
            problems.push(format!("{key} slots: {why}"));
        }
    }
    for name in host.env.keys() {
        let ok = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            problems.push(format!(
                "{key} env: `{name}`: variable names are letters, digits and `_`"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_read_as_device_groups() {
        assert_eq!(Slot::parse("cuda"), Ok(Slot::AllGpus));
        assert_eq!(Slot::parse("cpu"), Ok(Slot::Cpu));
        assert_eq!(Slot::parse("cuda:0,1"), Ok(Slot::Gpus(vec![0, 1])));
        assert_eq!(Slot::Gpus(vec![2, 3]).visible_devices().unwrap(), "2,3");
        assert_eq!(Slot::Cpu.visible_devices().unwrap(), "");
        assert_eq!(Slot::AllGpus.visible_devices(), None);
        assert!(Slot::parse("cuda:").is_err());
        assert!(Slot::parse("gpu0").unwrap_err().contains("`cuda:0,1`"));
    }

    #[test]
    fn a_fleet_reads_from_toml_and_its_mistakes_are_named() {
        let config: SshConfig = toml::from_str(
            r#"
            hosts = [
              { name = "gpu-a", slots = ["cuda:0,1", "cuda:2,3"], env = { HF_HOME = "/x" } },
              { name = "gpu-b", address = "10.0.0.2", port = 2222, user = "me" },
            ]
            "#,
        )
        .unwrap();
        assert_eq!(config.hosts[0].parsed_slots().len(), 2);
        assert_eq!(config.hosts[1].slots, vec!["cuda"]);
        assert_eq!(config.hosts[1].describe(), "me@10.0.0.2 port 2222");
        assert!(config.problems(true).is_empty(), "{:?}", config.problems(true));
        assert!(SshConfig::default().problems(false).is_empty());
        assert!(SshConfig::default().problems(true)[0].contains("at least one host"));
        let bad: SshConfig = toml::from_str(
            r#"
            grace_secs = -1
            hosts = [
              { name = "a b", slots = ["gpu"] },
              { name = "c", slots = [], env = { "1X" = "y" } },
              { name = "c" },
            ]
            "#,
        )
        .unwrap();
        let problems = bad.problems(true).join("\n");
        for part in [
            "grace_secs",
            "its queue's name",
            "slot `gpu`",
            "at least one, e.g.",
            "`1X`",
            "`c` is listed twice",
        ] {
            assert!(problems.contains(part), "{part}: {problems}");
        }
        let typo = toml::from_str::<SshConfig>("hosts = [{ name = \"a\", slot = [] }]");
        assert!(typo.unwrap_err().to_string().contains("slot"));
    }
}
