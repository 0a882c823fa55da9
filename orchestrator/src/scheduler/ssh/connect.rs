/*!
Running a script on a host with OpenSSH: `BatchMode=yes` (never a prompt), a connect timeout,
strict host key checking, and one shared connection per host (`ControlMaster`), whose socket
lives in a local directory readable by its owner only. The script goes on stdin to `bash -s`.

A failure of ssh itself (exit status 255) is told apart from the script's: a host that does not
answer, a refused login and an unknown host key each get words that say what to do.
*/

use std::ffi::OsString;
use std::path::PathBuf;

use super::super::{
    Call, CommandOutput, CommandRunner, RetryOn, SchedulerError, SchedulerResult,
};
use super::config::{HostConfig, SshConfig};

/// ssh's exit status when ssh itself failed (not the remote command).
const SSH_FAILED: i32 = 255;

/// Why ssh could not run anything on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Unreachable {
    /// The host key is unknown or changed.
    HostKey,
    /// The login was refused (no key it accepts).
    Login,
    /// No answer, or no such host.
    NoAnswer,
}

/// What ssh printed when it could not get in, if it could not.
pub(super) fn unreachable(stderr: &str) -> Option<Unreachable> {
    let s = stderr.to_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| s.contains(w));
    if any(&[
        "host key verification failed",
        "host key is known",
        "remote host identification has changed",
    ]) {
        Some(Unreachable::HostKey)
    } else if any(&["permission denied", "too many authentication failures"]) {
        Some(Unreachable::Login)
    } else if any(&[
        "connection refused",
        "connection timed out",
        "operation timed out",
        "no route to host",
        "could not resolve",
        "name or service not known",
        "network is unreachable",
        "connection closed by",
        "connection reset",
        "kex_exchange_identification",
    ]) {
        Some(Unreachable::NoAnswer)
    } else {
        None
    }
}

/// True when the output is ssh's own failure to get in (nothing ran there).
pub(super) fn could_not_connect(out: &CommandOutput) -> bool {
    out.status.code() == Some(SSH_FAILED) && unreachable(&out.stderr).is_some()
}

/// The user's words for an [`Unreachable`] host.
pub(super) fn explain(why: &Unreachable, host: &HostConfig, stderr: &str) -> String {
    let target = host.describe();
    let port = host.port.map(|p| format!("-p {p} ")).unwrap_or_default();
    let known = host
        .known_hosts
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "~/.ssh/known_hosts".to_string());
    match why {
        Unreachable::HostKey => format!(
            "ssh refused the host key of {target}: it is not in {known}, or it changed. Check \
             its fingerprint with the host's administrator, then add it (`ssh-keyscan {port}{} \
             >> {known}`, or log in once by hand); embedfleet never turns host key checking off",
            host.address()
        ),
        Unreachable::Login => format!(
            "ssh could not log in to {target} without a prompt ({}): install a key there \
             (`ssh-copy-id`) and name it in the host's `identity`, or load it into ssh-agent",
            first_line(stderr)
        ),
        Unreachable::NoAnswer => format!(
            "{target} does not answer ssh ({})",
            first_line(stderr)
        ),
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no message")
        .to_string()
}

/// How a call treats failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// Queries: repeat failures, but not a host that does not let us in (the next poll asks
    /// again).
    UnlessUnreachable,
    /// Launches: never repeat (a timed-out or broken launch may have started the job).
    Never,
}

/// Runs scripts on the hosts of one fleet.
#[derive(Debug)]
pub(super) struct Ssh {
    config: SshConfig,
    runner: CommandRunner,
}

impl Ssh {
    pub(super) fn new(config: SshConfig, runner: CommandRunner) -> Self {
        Self { config, runner }
    }

    /// Runs `script` with `bash -s` on `host`; an accepted output is one where the script
    /// exited 0, or with a status `accept` takes.
    pub(super) fn run(
        &self,
        host: &HostConfig,
        script: &str,
        retry: Retry,
        accept: &dyn Fn(&CommandOutput) -> bool,
    ) -> SchedulerResult<CommandOutput> {
        let args = self.args(host)?;
        let permanent = |o: &CommandOutput| match retry {
            Retry::Never => true,
            Retry::UnlessUnreachable => could_not_connect(o),
        };
        let call = Call::new(args)
            .stdin(script.as_bytes())
            .accept(accept)
            .permanent(&permanent)
            .retry(match retry {
                Retry::Never => RetryOn::FailureNotTimeout,
                Retry::UnlessUnreachable => RetryOn::AnyFailure,
            });
        self.runner.run(&self.config.ssh, "ssh", call)
    }

    /// ssh's arguments for `host`: the user's first (ssh takes the first value of an option),
    /// then embedfleet's, the destination and `bash -s`.
    fn args(&self, host: &HostConfig) -> SchedulerResult<Vec<OsString>> {
        let control = self.control_dir()?;
        let mut args: Vec<OsString> = host.options.iter().map(OsString::from).collect();
        let mut opt = |o: String| args.extend(["-o".into(), OsString::from(o)]);
        opt("BatchMode=yes".into());
        opt("StrictHostKeyChecking=yes".into());
        opt(format!(
            "ConnectTimeout={}",
            self.config.connect_timeout_secs.ceil().max(1.0) as u64
        ));
        opt("ServerAliveInterval=15".into());
        opt("ServerAliveCountMax=3".into());
        opt("ControlMaster=auto".into());
        opt(format!("ControlPath={}/%C", control.display()));
        opt(format!(
            "ControlPersist={}",
            self.config.control_persist_secs.ceil().max(0.0) as u64
        ));
        if let Some(file) = &host.known_hosts {
            opt(format!("UserKnownHostsFile={}", file.display()));
        }
        if let Some(identity) = &host.identity {
            opt("IdentitiesOnly=yes".into());
            args.extend(["-i".into(), identity.into()]);
        }
        if let Some(port) = host.port {
            args.extend(["-p".into(), port.to_string().into()]);
        }
        if let Some(user) = &host.user {
            args.extend(["-l".into(), user.into()]);
        }
        args.extend(["--".into(), host.address().into(), "bash -s".into()]);
        Ok(args)
    }

    /// The shared connections' directory, made (mode 0700) if missing; one another user owns
    /// is refused (they could listen on our sockets).
    fn control_dir(&self) -> SchedulerResult<PathBuf> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        // SAFETY: getuid only reads this process's user id.
        let uid = unsafe { libc::getuid() };
        let dir = self
            .config
            .control_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/tmp/embedfleet-ssh-{uid}")));
        let io = |source| SchedulerError::Io {
            action: "make the ssh control directory",
            path: dir.clone(),
            cause: source,
        };
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
        let meta = std::fs::metadata(&dir).map_err(io)?;
        if meta.uid() != uid {
            return Err(io(std::io::Error::other(
                "another user owns it; set [scheduler.ssh] control_dir to a directory of yours",
            )));
        }
        Ok(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_failures_are_named_and_the_fix_is_said() {
        let host = HostConfig {
            name: "gpu-a".into(),
            address: Some("10.0.0.2".into()),
            port: Some(2222),
            ..HostConfig::default()
        };
        let key = "No ED25519 host key is known for [10.0.0.2]:2222 and you have requested \
                   strict checking.\nHost key verification failed.";
        assert_eq!(unreachable(key), Some(Unreachable::HostKey));
        let text = explain(&Unreachable::HostKey, &host, key);
        assert!(
            text.contains("ssh-keyscan -p 2222 10.0.0.2 >> ~/.ssh/known_hosts"),
            "{text}"
        );
        assert!(text.contains("never turns host key checking off"), "{text}");
        let login = "me@10.0.0.2: Permission denied (publickey).";
        assert_eq!(unreachable(login), Some(Unreachable::Login));
        let refused = "ssh: connect to host 10.0.0.2 port 2222: Connection refused";
        assert_eq!(unreachable(refused), Some(Unreachable::NoAnswer));
        assert!(explain(&Unreachable::NoAnswer, &host, refused).contains("Connection refused"));
        assert_eq!(unreachable("bash: line 3: oops"), None);
    }

    #[test]
    fn user_options_come_first_and_host_key_checking_stays_on() {
        let dir = tempfile::tempdir().unwrap();
        let config = SshConfig {
            control_dir: Some(dir.path().join("cm")),
            ..SshConfig::default()
        };
        let host = HostConfig {
            name: "h".into(),
            options: vec!["-o".into(), "ProxyJump=gw".into()],
            identity: Some("/k/id".into()),
            known_hosts: Some("/k/known".into()),
            port: Some(2200),
            user: Some("me".into()),
            ..HostConfig::default()
        };
        let ssh = Ssh::new(config, CommandRunner::new(Default::default()));
        let args: Vec<String> = ssh
            .args(&host)
            .unwrap()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(args[..2], ["-o", "ProxyJump=gw"]);
        for part in [
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            "UserKnownHostsFile=/k/known",
            "IdentitiesOnly=yes",
        ] {
            assert!(args.iter().any(|a| a == part), "{part}: {args:?}");
        }
        let tail = ["-i", "/k/id", "-p", "2200", "-l", "me", "--", "h", "bash -s"];
        assert_eq!(args[args.len() - tail.len()..], tail[..]);
    }
}
