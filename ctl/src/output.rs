//! Human output: aligned tables and unit formatting. JSON output is serde's.

use std::io::Write;

/// A table printed with columns padded to their widest cell.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    /// Columns aligned right (numbers).
    right: Vec<bool>,
}

impl Table {
    /// Headers ending in `>` are right-aligned (the `>` is not printed).
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.trim_end_matches('>')).collect(),
            right: headers.iter().map(|h| h.ends_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
            let mut parts = Vec::new();
            for (i, c) in cells.enumerate() {
                let pad = widths[i].saturating_sub(c.chars().count());
                if self.right[i] {
                    parts.push(format!("{}{c}", " ".repeat(pad)));
                } else if i + 1 == widths.len() {
                    parts.push(c.to_owned());
                } else {
                    parts.push(format!("{c}{}", " ".repeat(pad)));
                }
            }
            out.push_str(parts.join("  ").trim_end());
            out.push('\n');
        };
        line(&mut out, &mut self.headers.iter().copied());
        for r in &self.rows {
            line(&mut out, &mut r.iter().map(String::as_str));
        }
        out
    }
}

/// Writes to stdout, ignoring a closed pipe (`aliasnetctl pods | head`).
pub fn print(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}

/// Prints one JSON document.
pub fn print_json(v: &impl serde::Serialize) {
    let mut s = serde_json::to_string_pretty(v).expect("serialising plain data");
    s.push('\n');
    print(&s);
}

/// `1.5G`, `12.0M`, `900`: SI prefixes, for bytes and bit rates.
pub fn si(v: f64) -> String {
    let (d, p) = if v >= 1e12 {
        (1e12, "T")
    } else if v >= 1e9 {
        (1e9, "G")
    } else if v >= 1e6 {
        (1e6, "M")
    } else if v >= 1e3 {
        (1e3, "k")
    } else {
        return format!("{v:.0}");
    };
    format!("{:.1}{p}", v / d)
}

/// A bit rate, `-` for none.
pub fn rate(bps: Option<u64>) -> String {
    bps.map_or_else(|| "-".to_owned(), |r| format!("{}bit/s", si(r as f64)))
}

/// `3d4h`, `5m12s`, `40s`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns() {
        let mut t = Table::new(&["NAME", "COUNT>", "NOTE"]);
        t.row(vec!["a".into(), "5".into(), "x".into()]);
        t.row(vec!["longer".into(), "12345".into(), "".into()]);
        assert_eq!(
            t.render(),
            "NAME    COUNT  NOTE\na           5  x\nlonger  12345\n"
        );
    }

    #[test]
    fn units() {
        assert_eq!(si(999.0), "999");
        assert_eq!(si(1500.0), "1.5k");
        assert_eq!(si(2_500_000_000.0), "2.5G");
        assert_eq!(rate(Some(10_000_000)), "10.0Mbit/s");
        assert_eq!(rate(None), "-");
        assert_eq!(age(61_000), "1m1s");
        assert_eq!(age(90_061_000), "1d1h");
    }
}
