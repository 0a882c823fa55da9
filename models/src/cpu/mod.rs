//! The CPU forward's own kernels, f32: what candle's CPU ops do in several passes, each with a
//! temporary tensor and a scalar `expf`, done here in one pass per row over data already in
//! cache, vectorised, on one thread pool.
//!
//! - [`blas`]: the projections through the machine's OpenBLAS when it has one (loaded at run
//!   time, single-threaded per call, rows split over the pool), candle's GEMM otherwise;
//! - [`attention`]: one tiled kernel for the packed layout: an online softmax over key tiles,
//!   no score matrix beyond a tile, grouped-query heads sharing each K/V tile, causal or not,
//!   with an optional sliding window;
//! - [`rows`]: SwiGLU, the residual add with its RMSNorm, q/k's head norm with the rotary, each
//!   one pass per row; [`gelu`]: GeGLU (the encoders' gated MLPs), likewise;
//! - [`allocator`]: freed buffers kept for the next forward instead of faulted in again.
//!
//! The pool is rayon's global one (sized to the cores, or `RAYON_NUM_THREADS`), which candle's
//! own CPU matmul uses too: one pool, never two fighting for the cores. The hot loops are
//! written once, plainly, and compiled three times ([`Simd`]): for AVX-512, for AVX2 with FMA,
//! and for any x86-64 (or another architecture); the best the CPU has is chosen once.

pub mod allocator;
pub mod attention;
pub mod blas;
pub(crate) mod exp;
pub mod gelu;
pub mod rows;

use std::sync::OnceLock;

/// The instruction set the kernels run with, chosen once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Simd {
    /// AVX-512 (F, VL) with FMA.
    Avx512,
    /// AVX2 with FMA.
    Avx2,
    /// Whatever the target has by default (SSE2 on x86-64).
    Plain,
}

impl Simd {
    /// The best this CPU has (`EMBEDFLEET_SIMD=plain|avx2` caps it, for tests and benchmarks).
    pub fn detect() -> Simd {
        static SIMD: OnceLock<Simd> = OnceLock::new();
        *SIMD.get_or_init(|| {
            let cap = std::env::var("EMBEDFLEET_SIMD").ok();
            let best = best_simd();
            match (cap.as_deref(), best) {
                (Some("plain"), _) => Simd::Plain,
                (Some("avx2"), Simd::Avx512) => Simd::Avx2,
                _ => best,
            }
        })
    }

    /// `avx512`, `avx2` or `plain`, for benchmarks and logs.
    pub fn name(self) -> &'static str {
        match self {
            Simd::Avx512 => "avx512",
            Simd::Avx2 => "avx2",
            Simd::Plain => "plain",
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn best_simd() -> Simd {
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("fma")
    {
        Simd::Avx512
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        Simd::Avx2
    } else {
        Simd::Plain
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn best_simd() -> Simd {
    Simd::Plain
}

/// A kernel compiled three times: `fn name<const FMA: bool>(args) { body }` becomes
/// `fn name(simd: Simd, args)`, which runs the body compiled for that instruction set (a
/// function with the target's features enabled each, the body inlined into it), `FMA` true
/// where it has FMA. Everything the body calls in its hot loops is `#[inline(always)]`, so it is
/// compiled with those features too.
macro_rules! simd_kernel {
    ($(#[$m:meta])* $vis:vis fn $name:ident<const $fma:ident: bool>($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? $body:block) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(simd: $crate::cpu::Simd, $($a: $t),*) $(-> $r)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn generic<const $fma: bool>($($a: $t),*) $(-> $r)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx512($($a: $t),*) $(-> $r)? {
                generic::<true>($($a),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn avx2($($a: $t),*) $(-> $r)? {
                generic::<true>($($a),*)
            }
            match simd {
                // SAFETY: `Simd::detect` chose these only where the CPU has the features.
                #[cfg(target_arch = "x86_64")]
                $crate::cpu::Simd::Avx512 => unsafe { avx512($($a),*) },
                #[cfg(target_arch = "x86_64")]
                $crate::cpu::Simd::Avx2 => unsafe { avx2($($a),*) },
                _ => generic::<false>($($a),*),
            }
        }
    };
}
pub(crate) use simd_kernel;

/// `a·b + c`, fused where the instruction set has FMA (then one rounding, as PyTorch's
/// kernels), a multiply and an add otherwise (libm's `fmaf` would be a call per element).
#[inline(always)]
pub(crate) fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}
