//! A small `time.strftime` for templates' `strftime_now` (UTC clock).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats the current UTC time.
pub fn now(format: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_unix(secs, format)
}

/// Formats `secs` since the epoch (UTC) with the common strftime directives;
/// unknown directives are written as is, like glibc.
pub fn format_unix(secs: i64, format: &str) -> String {
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (tod / 3600, tod / 60 % 60, tod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('B') => write!(out, "{}", MONTHS[month as usize - 1]),
            Some('b') | Some('h') => write!(out, "{}", &MONTHS[month as usize - 1][..3]),
            Some('A') => write!(out, "{}", WEEKDAYS[weekday]),
            Some('a') => write!(out, "{}", &WEEKDAYS[weekday][..3]),
            Some('u') => write!(out, "{}", weekday + 1),
            Some('w') => write!(out, "{}", (weekday + 1) % 7),
            Some('F') => write!(out, "{year}-{month:02}-{day:02}"),
            Some('T') => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            Some('Z') => write!(out, "UTC"),
            Some('z') => write!(out, "+0000"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Howard Hinnant's days → (year, month, day).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        // 2026-11-30T11:46:07Z, a Monday.
        let t = 1_796_039_167;
        assert_eq!(format_unix(t, "%Y-%m-%d %H:%M:%S"), "2026-11-30 11:46:07");
        assert_eq!(
            format_unix(t, "%d %b %Y, %A %j %I%p %%"),
            "30 Nov 2026, Monday 334 11AM %"
        );
        assert_eq!(format_unix(0, "%a %B %e %y %u %w"), "Thu January  1 70 4 4");
        assert_eq!(format_unix(951_782_400, "%F %q"), "2000-02-29 %q");
    }
}
