//! f32 matrix products through the machine's OpenBLAS, when it has one: `libopenblas.so.0`
//! (e.g. Debian's libopenblas0-pthread) is loaded at run time, nothing links against it, so a
//! machine without it builds and runs the same binary with candle's GEMM. Its AVX-512 kernels
//! run the projections at about twice the speed of candle's (which has AVX2 only on stable
//! Rust): 190 GFLOPS on the 2-core machine of BENCHMARKS.md, against PyTorch's MKL at 160–180.
//! `EMBEDFLEET_BLAS=off` forces candle's.
//!
//! OpenBLAS runs single-threaded here (`openblas_set_num_threads(1)`, once): a product's rows
//! are split over rayon's pool, each part one call on its own thread. One pool for the whole
//! forward: OpenBLAS's own threads would spin between calls while the attention's tasks want
//! the cores.

use std::sync::OnceLock;

use rayon::prelude::*;

type CblasSgemm = unsafe extern "C" fn(
    layout: i32,
    trans_a: i32,
    trans_b: i32,
    m: i32,
    n: i32,
    k: i32,
    alpha: f32,
    a: *const f32,
    lda: i32,
    b: *const f32,
    ldb: i32,
    beta: f32,
    c: *mut f32,
    ldc: i32,
);

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

/// The loaded `cblas_sgemm`.
pub struct Sgemm(CblasSgemm);

/// Rows of a product below which it is not split (a call per thread costs more than it saves).
const ROWS_PER_PART: usize = 64;

impl Sgemm {
    /// `out = a · bᵀ` for row-major `a` (`m × k`, rows `lda` apart) and `b` (`n × k`, rows `ldb`
    /// apart), `out` `m × n` (rows `n` apart), on this thread.
    #[allow(clippy::too_many_arguments)]
    fn a_bt_here(
        &self,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        m: usize,
        n: usize,
        k: usize,
        out: &mut [f32],
    ) {
        if m == 0 || n == 0 {
            return;
        }
        assert!(k <= lda && k <= ldb, "leading dimensions below k");
        assert!(a.len() >= (m - 1) * lda + k && b.len() >= (n - 1) * ldb + k);
        assert!(out.len() >= m * n);
        let d = |x: usize| i32::try_from(x).expect("a product's sides fit in i32. This is a bug.");
        // SAFETY: the slices hold the m×k, n×k (with their leading dimensions) and m×n elements
        // the call reads and writes (checked above); cblas_sgemm keeps no pointer after it
        // returns.
        unsafe {
            (self.0)(
                ROW_MAJOR,
                NO_TRANS,
                TRANS,
                d(m),
                d(n),
                d(k),
                1.0,
                a.as_ptr(),
                d(lda),
                b.as_ptr(),
                d(ldb),
                0.0,
                out.as_mut_ptr(),
                d(n),
            );
        }
    }

    /// `out = a · bᵀ` (see [`Sgemm::a_bt_here`]), `a`'s rows split over rayon's pool.
    #[allow(clippy::too_many_arguments)]
    pub fn a_bt(
        &self,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        m: usize,
        n: usize,
        k: usize,
        out: &mut [f32],
    ) {
        let threads = rayon::current_num_threads().max(1);
        let parts = (m / ROWS_PER_PART).clamp(1, threads);
        if parts == 1 {
            return self.a_bt_here(a, lda, b, ldb, m, n, k, out);
        }
        let per = m.div_ceil(parts);
        out[..m * n]
            .par_chunks_mut(per * n)
            .enumerate()
            .for_each(|(i, part)| {
                let rows = part.len() / n;
                let first = i * per;
                self.a_bt_here(&a[first * lda..], lda, b, ldb, rows, n, k, part);
            });
    }
}

/// The loaded OpenBLAS, once per process; `None` where the machine has none (or
/// `EMBEDFLEET_BLAS=off`).
pub fn sgemm() -> Option<&'static Sgemm> {
    static SGEMM: OnceLock<Option<Sgemm>> = OnceLock::new();
    SGEMM.get_or_init(load).as_ref()
}

/// `openblas` or `candle`: which one runs the f32 products.
pub fn backend() -> &'static str {
    if sgemm().is_some() {
        "openblas"
    } else {
        "candle"
    }
}

fn load() -> Option<Sgemm> {
    if std::env::var("EMBEDFLEET_BLAS").is_ok_and(|v| v == "off") {
        return None;
    }
    // SAFETY: dlopen/dlsym with NUL-terminated names; the library stays loaded for the life of
    // the process (never dlclosed), so the function pointers stay valid; cblas_sgemm has the
    // C signature declared above (the CBLAS standard's), openblas_set_num_threads takes an int.
    unsafe {
        let lib = libc::dlopen(
            c"libopenblas.so.0".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if lib.is_null() {
            return None;
        }
        let sym = libc::dlsym(lib, c"cblas_sgemm".as_ptr());
        if sym.is_null() {
            return None;
        }
        let threads = libc::dlsym(lib, c"openblas_set_num_threads".as_ptr());
        if !threads.is_null() {
            let set: unsafe extern "C" fn(i32) = std::mem::transmute(threads);
            set(1);
        }
        Some(Sgemm(std::mem::transmute::<*mut libc::c_void, CblasSgemm>(
            sym,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_whole_products_equal_the_naive_one() {
        let Some(blas) = sgemm() else {
            eprintln!("no OpenBLAS here: nothing to check");
            return;
        };
        let (m, n, k) = (301, 17, 40);
        let lda = 48;
        let a: Vec<f32> = (0..m * lda).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..n * k).map(|i| ((i * 3) % 11) as f32 - 5.0).collect();
        let naive: Vec<f32> = (0..m)
            .flat_map(|r| {
                let (a, b) = (&a, &b);
                (0..n).map(move |c| (0..k).map(|d| a[r * lda + d] * b[c * k + d]).sum())
            })
            .collect();
        let mut out = vec![f32::NAN; m * n];
        blas.a_bt(&a, lda, &b, k, m, n, k, &mut out);
        assert_eq!(out, naive);
        let mut here = vec![f32::NAN; m * n];
        blas.a_bt_here(&a, lda, &b, k, m, n, k, &mut here);
        assert_eq!(here, naive);
    }
}
