//! FP8 E4M3 (OCP's `E4M3FN`, NVIDIA's `__nv_fp8_e4m3`): a sign, 4 exponent bits (bias 7) and
//! 3 mantissa bits; no infinities, one NaN code per sign (`S.1111.111`); the largest finite
//! value is 448, the smallest subnormal 2⁻⁹.
//!
//! The encoding here is the one the GPU's conversion makes (`__nv_cvt_float_to_fp8` with
//! `__NV_SATFINITE`): round to nearest, ties to even, and anything past ±448 saturated to ±448
//! (not NaN), so that the CPU's emulation of the FP8 projections quantizes exactly as a GPU does.

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The NaN code with the sign bit clear.
const NAN: u8 = 0x7F;

/// `x` as E4M3: nearest, ties to even, saturated to ±448; NaN stays NaN.
pub fn to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return NAN;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7E;
    }
    // Below the smallest normal (2⁻⁶) values are multiples of 2⁻⁹: the count of them is the code
    // (8 of them is the smallest normal, whose code is 8 too). Scaling by a power of two is exact.
    if a < 2f32.powi(-6) {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // a = 2^e · (1 + f), f in [0, 1): 3 bits of f, rounded; a round up to 8 carries into e.
    let e = ((a.to_bits() >> 23) & 0xFF) as i32 - 127;
    let f = a / 2f32.powi(e) - 1.0;
    let m = (f * 8.0).round_ties_even() as i32;
    let (e, m) = if m == 8 { (e + 1, 0) } else { (e, m) };
    // a < 448 keeps the code at or below 0x7E (448 itself): the largest exponent's mantissas
    // reach 6 at most.
    sign | (((e + 7) as u8) << 3) | m as u8
}

/// The value of an E4M3 code.
pub fn from_e4m3(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> 3) & 0x0F) as i32;
    let m = (code & 0x07) as f32;
    if e == 0x0F && code & 0x07 == 0x07 {
        return f32::NAN;
    }
    let magnitude = if e == 0 {
        m * 2f32.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    sign * magnitude
}

/// Every code's value, for decoding many at once.
pub fn decode_table() -> [f32; 256] {
    std::array::from_fn(|code| from_e4m3(code as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_s_landmarks() {
        assert_eq!(from_e4m3(0x00), 0.0);
        assert_eq!(from_e4m3(0x01), 2f32.powi(-9), "smallest subnormal");
        assert_eq!(from_e4m3(0x07), 7.0 * 2f32.powi(-9), "largest subnormal");
        assert_eq!(from_e4m3(0x08), 2f32.powi(-6), "smallest normal");
        assert_eq!(from_e4m3(0x38), 1.0);
        assert_eq!(from_e4m3(0x7E), 448.0, "largest finite");
        assert!(from_e4m3(0x7F).is_nan());
        assert!(from_e4m3(0xFF).is_nan());
        assert_eq!(from_e4m3(0xB8), -1.0);
    }

    #[test]
    fn every_finite_code_encodes_back_to_itself() {
        for code in 0..=255u8 {
            let value = from_e4m3(code);
            if value.is_nan() {
                continue;
            }
            // Negative zero is its own code (0x80), as on the GPU.
            assert_eq!(to_e4m3(value), code, "code {code:#04x} ({value})");
        }
    }

    #[test]
    fn values_between_codes_round_to_the_nearest_and_ties_to_even() {
        // 1.0 (mantissa 0) and 1.125 (mantissa 1): their midpoint goes to the even one, 1.0.
        assert_eq!(to_e4m3(1.0625), 0x38);
        // 1.125 and 1.25: the midpoint goes to 1.25 (mantissa 2, even).
        assert_eq!(to_e4m3(1.1875), 0x3A);
        assert_eq!(to_e4m3(1.07), 0x39, "past the midpoint rounds up");
        // 1.9375, between 1.875 (mantissa 7, odd) and 2.0: the tie goes to 2.0, carrying into
        // the exponent.
        assert_eq!(from_e4m3(to_e4m3(1.9375)), 2.0);
        assert_eq!(to_e4m3(1.9375), 0x40);
        // A subnormal tie: 1.5 · 2⁻⁹ goes to 2 · 2⁻⁹.
        assert_eq!(to_e4m3(1.5 * 2f32.powi(-9)), 0x02);
        assert_eq!(
            to_e4m3(0.5 * 2f32.powi(-9)),
            0x00,
            "half the smallest goes to zero"
        );
    }

    #[test]
    fn past_the_largest_value_saturates_and_nan_stays_nan() {
        assert_eq!(to_e4m3(448.0), 0x7E);
        assert_eq!(to_e4m3(1e6), 0x7E);
        assert_eq!(to_e4m3(f32::INFINITY), 0x7E);
        assert_eq!(to_e4m3(-1e6), 0xFE);
        assert_eq!(to_e4m3(447.0), 0x7E, "447 is nearer 448 than 416");
        assert!(from_e4m3(to_e4m3(f32::NAN)).is_nan());
    }

    #[test]
    fn the_rounding_error_is_at_most_half_a_step() {
        // Over a sweep of values, the error is at most half the spacing of codes around it:
        // 2^(e-3) / 2 for a normal value, 2⁻¹⁰ below the smallest normal.
        let mut x = 1e-4f32;
        while x < 440.0 {
            let q = from_e4m3(to_e4m3(x));
            let half_step = if x < 2f32.powi(-6) {
                2f32.powi(-10)
            } else {
                2f32.powi(x.log2().floor() as i32 - 3) / 2.0
            };
            assert!((q - x).abs() <= half_step * 1.000_001, "{x} → {q}");
            x *= 1.013;
        }
    }
}
