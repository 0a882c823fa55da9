//! A fleet of OpenSSH servers on this machine for the ssh backend's tests: one `sshd` per
//! "host" on a loopback address of its own (127.0.0.2, .3, ...), each with its own host key,
//! all taking one generated user key; a known_hosts file of the test's own. Everything lives
//! in a temporary directory and every server (and the sessions it started) is killed at the
//! end. Without `sshd` the test is skipped, or fails where EMBEDFLEET_REQUIRE_SSHD=1 (CI).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

pub struct Host {
    pub name: String,
    pub address: String,
    pub port: u16,
    dir: PathBuf,
    sshd: Option<Child>,
}

pub struct Fleet {
    dir: tempfile::TempDir,
    pub hosts: Vec<Host>,
    /// Each sshd runs in a UTS namespace with the host's name as its host name.
    named_hosts: bool,
}

/// Whether sshd is installed; a missing one fails the test where EMBEDFLEET_REQUIRE_SSHD=1.
pub fn sshd_here(test: &str) -> bool {
    let ok = Path::new(SSHD).exists() && Path::new("/usr/bin/ssh").exists();
    if !ok {
        if std::env::var("EMBEDFLEET_REQUIRE_SSHD").as_deref() == Ok("1") {
            panic!(
                "{test}: no {SSHD} but EMBEDFLEET_REQUIRE_SSHD=1; apt-get install openssh-server"
            );
        }
        eprintln!("skipping {test}: no {SSHD} (apt-get install openssh-server)");
    }
    ok
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn keygen(path: &Path) {
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path));
}

/// A port free on `address` now.
fn free_port(address: &str) -> u16 {
    std::net::TcpListener::bind((address, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Fleet {
    /// `n` hosts named `PREFIX1`... on 127.0.0.2...; `None` (skipped) without sshd. Tests that
    /// may run at once use other prefixes: a host's slots are counted by its name.
    pub fn start(test: &str, prefix: &str, n: usize) -> Option<Self> {
        if !sshd_here(test) {
            return None;
        }
        // sshd's privilege separation directory, when it runs as root.
        let _ = std::fs::create_dir_all("/run/sshd");
        let dir = tempfile::tempdir().unwrap();
        keygen(&dir.path().join("user_key"));
        std::fs::copy(
            dir.path().join("user_key.pub"),
            dir.path().join("authorized_keys"),
        )
        .unwrap();
        let named_hosts = Command::new("unshare")
            .args(["-u", "true"])
            .status()
            .is_ok_and(|s| s.success());
        let mut fleet = Self {
            dir,
            hosts: Vec::new(),
            named_hosts,
        };
        let mut known = String::new();
        for i in 0..n {
            let address = format!("127.0.0.{}", i + 2);
            let host_dir = fleet.dir.path().join(format!("{prefix}{}", i + 1));
            std::fs::create_dir(&host_dir).unwrap();
            keygen(&host_dir.join("host_key"));
            let port = free_port(&address);
            let key = std::fs::read_to_string(host_dir.join("host_key.pub")).unwrap();
            let key: Vec<&str> = key.split_whitespace().take(2).collect();
            known.push_str(&format!("[{address}]:{port} {}\n", key.join(" ")));
            fleet.hosts.push(Host {
                name: format!("{prefix}{}", i + 1),
                address,
                port,
                dir: host_dir,
                sshd: None,
            });
        }
        std::fs::write(fleet.known_hosts(), known).unwrap();
        for i in 0..n {
            fleet.write_config(i, "");
            fleet.up(i);
        }
        Some(fleet)
    }

    /// Whether each host has its own host name (its sshd runs in a UTS namespace).
    pub fn named(&self) -> bool {
        self.named_hosts
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn known_hosts(&self) -> PathBuf {
        self.dir.path().join("known_hosts")
    }

    /// Host `i`'s sshd_config, with `extra` lines (a `ForceCommand`, say). The machine's root
    /// has `pyenv init` in its ~/.bashrc, which every ssh command runs: its rehash waits up to
    /// 60 s for a lock that a login killed mid-way (a host these tests take down) leaves
    /// behind, and every later command would hang that long. The hosts here wait 1 s at most.
    pub fn write_config(&self, i: usize, extra: &str) {
        let h = &self.hosts[i];
        let d = &h.dir;
        let config = format!(
            "ListenAddress {}:{}\nHostKey {}\nAuthorizedKeysFile {}\nPidFile {}\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
             PermitRootLogin prohibit-password\nStrictModes no\nLogLevel ERROR\n\
             MaxStartups 100\nMaxSessions 100\n\
             SetEnv PYENV_REHASH_TIMEOUT=1\n{extra}\n",
            h.address,
            h.port,
            d.join("host_key").display(),
            self.dir.path().join("authorized_keys").display(),
            d.join("sshd.pid").display(),
        );
        std::fs::write(d.join("sshd_config"), config).unwrap();
    }

    /// Starts host `i`'s sshd and waits until it takes connections.
    pub fn up(&mut self, i: usize) {
        let named = self.named_hosts;
        let h = &mut self.hosts[i];
        // Where the test may (as root), the host gets a host name of its own: `unshare -u`
        // execs sshd in place, so the child's pid is sshd's.
        let mut cmd = if named {
            let mut c = Command::new("unshare");
            c.args(["-u", "sh", "-c"])
                .arg(format!("hostname {} && exec \"$0\" \"$@\"", h.name))
                .arg(SSHD);
            c
        } else {
            Command::new(SSHD)
        };
        let child = cmd
            .arg("-D")
            .arg("-f")
            .arg(h.dir.join("sshd_config"))
            .arg("-E")
            .arg(h.dir.join("sshd.log"))
            .stdin(Stdio::null())
            .spawn()
            .expect("sshd starts");
        h.sshd = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let target = (h.address.as_str(), h.port);
        while std::net::TcpStream::connect(target).is_err() {
            assert!(
                Instant::now() < deadline,
                "sshd of {} never listened",
                h.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills host `i`'s sshd and every session it started (its shared connections too); the
    /// jobs it started, detached with setsid, are no longer its descendants and live on.
    pub fn down(&mut self, i: usize) {
        if let Some(mut child) = self.hosts[i].sshd.take() {
            let pid = child.id() as i32;
            let mut tree = descendants(pid);
            tree.push(pid);
            for p in tree {
                // SAFETY: kill only sends a signal.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            let _ = child.wait();
        }
    }

    /// The `[[scheduler.ssh.hosts]]` entry of host `i`, with `extra` lines.
    pub fn host_toml(&self, i: usize, extra: &str) -> String {
        let h = &self.hosts[i];
        format!(
            "[[scheduler.ssh.hosts]]\nname = \"{}\"\naddress = \"{}\"\nport = {}\nidentity = \"{}\"\n\
             known_hosts = \"{}\"\n{extra}\n",
            h.name,
            h.address,
            h.port,
            self.dir.path().join("user_key").display(),
            self.known_hosts().display(),
        )
    }

    /// The run config's `[scheduler]` part for these hosts (`extra[i]` added to host `i`).
    pub fn run_config(&self, extra: &[&str]) -> String {
        let mut text = format!(
            "[scheduler]\nbackend = \"ssh\"\n\n[scheduler.ssh]\ncontrol_dir = \"{}\"\nconnect_timeout_secs = 3\n\n",
            self.dir.path().join("cm").display()
        );
        for i in 0..self.hosts.len() {
            text.push_str(&self.host_toml(i, extra.get(i).copied().unwrap_or("")));
        }
        text
    }
}

impl Drop for Fleet {
    /// Every sshd, and every job the hosts started (detached, they outlive their sshd).
    fn drop(&mut self) {
        for i in 0..self.hosts.len() {
            self.down(i);
        }
        let names: Vec<String> = self
            .hosts
            .iter()
            .map(|h| format!("EMBEDFLEET_SSH_HOST={}", h.name))
            .collect();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let ours = environ
                .split(|b| *b == 0)
                .any(|kv| names.iter().any(|n| kv == n.as_bytes()));
            if ours {
                // SAFETY: kill only sends a signal.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// Every process below `pid`, from /proc's parent links.
fn descendants(pid: i32) -> Vec<i32> {
    let mut parents: Vec<(i32, i32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
        if let Some(ppid) = after.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
            parents.push((p, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}
