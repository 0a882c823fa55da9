//! Exact top-k throughput: `eval`'s brute-force path (blocks of 4,096 rows, candle's GEMM, a
//! top-k scan split by query) over N random unit vectors, with the same data written as .npy
//! files for the numpy peer (`benches/exact.sh` runs both in one go):
//!
//! `cargo run --release -p embedfleet-query --example exact_bench -- DIR POINTS QUERIES DIM K`

use embedfleet_query::exact::{gemm_backend, top_k_block, TopK};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

fn arg(args: &[String], i: usize) -> usize {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        eprintln!("usage: exact_bench DIR POINTS QUERIES DIM K");
        std::process::exit(2)
    })
}

/// Seeded random unit vectors, row after row.
fn unit_vectors(n: usize, dim: usize, mut x: u64) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let row: Vec<f32> = (0..dim)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        let norm = row.iter().map(|a| a * a).sum::<f32>().sqrt();
        out.extend(row.iter().map(|a| a / norm));
    }
    out
}

/// A little-endian f32 matrix as a .npy file (format 1.0).
fn write_npy(path: &Path, data: &[f32], rows: usize, cols: usize) -> std::io::Result<()> {
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for v in data {
        f.write_all(&v.to_le_bytes())?;
    }
    f.flush()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = Path::new(args.first().map(String::as_str).unwrap_or("."));
    let (points, queries, dim, k) = (arg(&args, 1), arg(&args, 2), arg(&args, 3), arg(&args, 4));
    std::fs::create_dir_all(dir)?;
    let x = unit_vectors(points, dim, 0x2545_F491_4F6C_DD1D);
    let q = unit_vectors(queries, dim, 0x9E37_79B9_7F4A_7C15);
    write_npy(&dir.join("points.npy"), &x, points, dim)?;
    write_npy(&dir.join("queries.npy"), &q, queries, dim)?;
    let mut best = f64::MAX;
    let mut tops = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        tops = vec![TopK::new(k); queries];
        for (b, block) in x.chunks(4096 * dim).enumerate() {
            top_k_block(&q, block, dim, b * 4096, &|_| true, &mut tops)?;
        }
        best = best.min(started.elapsed().as_secs_f64());
    }
    let first: Vec<usize> = tops[0].best().iter().map(|b| b.1).collect();
    println!(
        "{{\"impl\": \"embedfleet\", \"gemm\": \"{}\", \"points\": {points}, \"queries\": {queries}, \"dim\": {dim}, \"k\": {k}, \"secs\": {best:.4}, \"queries_per_s\": {:.1}, \"first_query_top\": {first:?}}}",
        gemm_backend(),
        queries as f64 / best
    );
    Ok(())
}
