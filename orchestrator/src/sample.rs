//! `embedfleet sample-corpus`: a deterministic synthetic peS2o-like corpus for the README,
//! the tests and the benchmarks. Papers have a title, an abstract and sections of generated
//! scientific-sounding prose; lengths are log-normal with a long tail, and a few papers (one in
//! [`LONG_EVERY`]) are longer than a 32,768-token model context.

use flate2::write::GzEncoder;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// One paper in this many is longer than the model context (160,000–220,000 characters).
pub const LONG_EVERY: u64 = 500;
/// The longest ordinary paper.
pub const MAX_CHARS: f64 = 150_000.0;

#[derive(Debug, Clone)]
pub struct SampleOptions {
    pub papers: u64,
    pub seed: u64,
    /// Mean characters of an ordinary paper.
    pub mean_chars: u64,
    /// Files to spread the papers over; >1 makes `out` a directory of `part-NNNN.jsonl.gz`.
    pub files: u32,
}

/// SplitMix64: tiny, fast and good enough for synthetic text (and the routing simulator's
/// queues); fixed so corpora never change between versions.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.unit().max(1e-12), self.unit());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

const STEMS: &[&str] = &[
    "protein",
    "neural",
    "quantum",
    "catalyst",
    "genome",
    "lattice",
    "climate",
    "enzyme",
    "signal",
    "cortex",
    "polymer",
    "sensor",
    "entropy",
    "vector",
    "plasma",
    "isotope",
    "network",
    "receptor",
    "tensor",
    "cell",
    "model",
    "spectral",
    "thermal",
    "kinetic",
    "optical",
    "binding",
    "sequence",
    "diffusion",
    "membrane",
    "graph",
    "manifold",
    "soil",
    "carbon",
    "photon",
    "ligand",
    "antibody",
    "fluid",
    "crystal",
    "variance",
];
const SUFFIXES: &[&str] = &[
    "", "s", "ation", "ic", "al", "ity", "ing", "ed", "ome", "ized",
];
const GLUE: &[&str] = &[
    "the", "of", "and", "in", "we", "a", "for", "with", "to", "is", "by", "that", "on", "are",
];
const SECTIONS: &[&str] = &[
    "Introduction",
    "Related Work",
    "Methods",
    "Results",
    "Discussion",
    "Conclusion",
];
const SOURCES: &[&str] = &["s2orc/train", "s2orc/train", "s2orc/train", "s2ag/train"];
const UNICODE: &[&str] = &[
    "α-helix",
    "β-sheet",
    "Δt",
    "µm",
    "≈",
    "Schrödinger",
    "Ångström",
    "naïve",
    "±",
];

fn sentence(rng: &mut Rng, out: &mut String) {
    let words = 8 + rng.below(18);
    for i in 0..words {
        if i > 0 {
            out.push(' ');
        }
        match rng.below(10) {
            0..=4 => out.push_str(GLUE[rng.below(GLUE.len())]),
            5 if rng.below(8) == 0 => out.push_str(UNICODE[rng.below(UNICODE.len())]),
            _ => {
                out.push_str(STEMS[rng.below(STEMS.len())]);
                out.push_str(SUFFIXES[rng.below(SUFFIXES.len())]);
            }
        }
    }
    out.push_str(". ");
}

fn paper_length(rng: &mut Rng, index: u64, mean: u64) -> usize {
    if index % LONG_EVERY == LONG_EVERY - 1 {
        return 160_000 + rng.below(60_000);
    }
    // Log-normal with sigma 0.8: mean = median * exp(sigma^2 / 2).
    let sigma = 0.8;
    let median = mean as f64 / (sigma * sigma / 2.0f64).exp();
    (median * (sigma * rng.normal()).exp()).clamp(200.0, MAX_CHARS) as usize
}

/// The most papers one corpus may have: its ids give the index ten digits.
const MAX_PAPERS: u64 = 10_000_000_000;

/// A paper's id: numeric like peS2o's, the seed's digits then the index in ten, so corpora of
/// two seeds share no id (a second release made with another seed is all new papers) and the
/// same seed gives the same ids. Ten digits hold any corpus this generator can write.
fn paper_id(seed: u64, index: u64) -> String {
    debug_assert!(index < MAX_PAPERS);
    format!("{seed}{index:010}")
}

/// The `index`-th paper as one JSON line (with its newline).
fn paper_line(seed: u64, index: u64, mean: u64) -> String {
    let mut rng = Rng(seed ^ index.wrapping_mul(0xA24B_AED4_963E_E407));
    let target = paper_length(&mut rng, index, mean);
    let mut text = String::with_capacity(target + 256);
    sentence(&mut rng, &mut text);
    text.truncate(text.trim_end().len().saturating_sub(1));
    text.push_str("\n\nAbstract\n");
    for _ in 0..3 + rng.below(4) {
        sentence(&mut rng, &mut text);
    }
    let mut section = 0;
    while text.len() < target {
        text.push_str(&format!("\n\n{}\n", SECTIONS[section % SECTIONS.len()]));
        section += 1;
        let end = (text.len() + 1500 + rng.below(6000)).min(target.max(text.len() + 1));
        while text.len() < end {
            sentence(&mut rng, &mut text);
        }
    }
    let year = 1990 + rng.below(34);
    let record = serde_json::json!({
        "id": paper_id(seed, index),
        "text": text,
        "source": SOURCES[rng.below(SOURCES.len())],
        "created": format!("{year}-{:02}-{:02}T00:00:00.000Z", 1 + rng.below(12), 1 + rng.below(28)),
        "added": "2023-06-15T00:00:00.000Z",
        "version": "v3-fos",
    });
    let mut line = record.to_string();
    line.push('\n');
    line
}

/// Writes the corpus; returns the files written.
pub fn write(out: &Path, options: &SampleOptions) -> io::Result<Vec<PathBuf>> {
    if options.papers > MAX_PAPERS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--papers {} is over the generator's {MAX_PAPERS} (ids hold ten digits of index); use fewer", options.papers),
        ));
    }
    let files = options.files.max(1) as u64;
    let targets: Vec<PathBuf> = if files == 1 {
        vec![out.to_path_buf()]
    } else {
        std::fs::create_dir_all(out)?;
        (0..files)
            .map(|i| out.join(format!("part-{i:04}.jsonl.gz")))
            .collect()
    };
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .enumerate()
            .map(|(f, path)| {
                let range =
                    (options.papers * f as u64 / files)..(options.papers * (f as u64 + 1) / files);
                scope.spawn(move || write_file(path, range, options))
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a sample writer panicked. This is a bug."))
    })?;
    Ok(targets)
}

fn write_file(path: &Path, range: std::ops::Range<u64>, options: &SampleOptions) -> io::Result<()> {
    embedfleet_core::atomic::or_discard(path, || {
        let file = embedfleet_core::atomic::create_tmp(path)?;
        let mut out: Box<dyn Write> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(GzEncoder::new(
                BufWriter::new(file),
                flate2::Compression::new(6),
            ))
        } else {
            Box::new(BufWriter::new(file))
        };
        for index in range {
            out.write_all(paper_line(options.seed, index, options.mean_chars).as_bytes())?;
        }
        drop(out);
        embedfleet_core::atomic::commit(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_deterministic_and_has_a_long_tail() {
        let a: Vec<String> = (0..600).map(|i| paper_line(7, i, 4000)).collect();
        let b: Vec<String> = (0..600).map(|i| paper_line(7, i, 4000)).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], paper_line(8, 0, 4000), "the seed changes the corpus");
    }

    #[test]
    fn seeds_share_no_paper_id() {
        // Seeds equal modulo 7 once gave the same ids (7 and 0, 49 and 42).
        let ids: std::collections::HashSet<String> = [0, 7, 42, 49, 4, 420]
            .iter()
            .flat_map(|&seed| (0..100).map(move |i| paper_id(seed, i)))
            .collect();
        assert_eq!(ids.len(), 600);
        let line: serde_json::Value = serde_json::from_str(&paper_line(42, 3, 4000)).unwrap();
        assert_eq!(line["id"], "420000000003");
        assert!(
            line["id"].as_str().unwrap().parse::<u64>().is_ok(),
            "numeric, as peS2o's"
        );
    }

    #[test]
    fn long_tail_and_mean_length() {
        let a: Vec<String> = (0..600).map(|i| paper_line(7, i, 4000)).collect();
        let lens: Vec<usize> = a
            .iter()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                    .as_str()
                    .unwrap()
                    .chars()
                    .count()
            })
            .collect();
        assert!(
            lens[LONG_EVERY as usize - 1] > 150_000,
            "one paper in {LONG_EVERY} is over the context"
        );
        let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
        assert!(mean > 3000.0 && mean < 6000.0, "mean {mean}");
    }
}
