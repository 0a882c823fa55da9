//! Unix seconds as UTC dates, `YYYY-MM-DD HH:MM:SS.mmm` (the form of Nextflow's trace times),
//! without a date crate: the civil-from-days conversion of Howard Hinnant's date algorithms.

/// `unix_s` as `YYYY-MM-DD HH:MM:SS.mmm` (UTC).
pub fn utc_millis(unix_s: f64) -> String {
    let ms = (unix_s * 1000.0).round() as i64;
    let (secs, millis) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{millis:03}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// `unix_s` as `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn utc(unix_s: f64) -> String {
    let mut s = utc_millis(unix_s.floor());
    s.truncate(19);
    s
}

/// (year, month, day) of the day `days` after 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_as_the_calendar_has_them() {
        assert_eq!(utc_millis(0.0), "1970-01-01 00:00:00.000");
        assert_eq!(utc_millis(951_825_600.25), "2000-02-29 12:00:00.250");
        assert_eq!(utc(1_796_256_000.9), "2026-12-03 00:00:00");
    }
}
