//! Escaping what comes from outside (paper ids, log lines, host and queue names) for the places
//! the report puts it: HTML text and attributes, JSON inside a `<script>` element, Prometheus
//! label values, a trace file's tab-separated fields.

use std::fmt::Write as _;

/// Text for an HTML element or a quoted attribute value.
pub fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON that may stand inside `<script type="application/json">`: `<`, `>` and `&` as `\u`
/// escapes (so no `</script>` or `<!--` can end or change the element), and the two line
/// separators JavaScript once took for line ends. Still the same JSON value.
pub fn json_in_script(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// A Prometheus label value (inside double quotes).
pub fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A trace file's field: no tab or line break may split it; empty is `-` (Nextflow's "none").
pub fn tsv_field(text: &str) -> String {
    if text.is_empty() {
        return "-".into();
    }
    text.chars()
        .map(|c| {
            if c == '\t' || c == '\n' || c == '\r' {
                ' '
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_from_outside_can_open_an_element() {
        assert_eq!(
            html(r#"<script>alert("x")</script>&'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"
        );
        let json = serde_json::to_string(&"</script><script>x()</script>\u{2028}").unwrap();
        let safe = json_in_script(&json);
        assert!(!safe.contains('<') && !safe.contains('>'), "{safe}");
        let back: String = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, "</script><script>x()</script>\u{2028}");
        assert_eq!(label_value("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
        assert_eq!(tsv_field("a\tb\nc"), "a b c");
        assert_eq!(tsv_field(""), "-");
    }
}
