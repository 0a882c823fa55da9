/*!
A tiny `{placeholder}` renderer for job scripts.

Rules, chosen so that ordinary shell survives a template unchanged:
- `{name}` with `name` an identifier (`[A-Za-z_][A-Za-z0-9_]*`) is a placeholder; a name that is
  not known is an error naming it and listing the known ones.
- `${...}` is shell parameter expansion and is copied as is; so is any `{` not followed by an
  identifier and `}` (`{ cmd; }`, `{1..4}`).
- `{{` and `}}` are a literal `{` and `}`.
- A line whose placeholders include one with an empty value is dropped when the line is a
  comment (`#SBATCH --account={account}` without an account) or holds nothing but
  placeholders; that is how optional directives disappear.
*/

use std::collections::BTreeMap;

/// A template could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template names a placeholder that does not exist.
    #[error(
        "job script template line {line}: unknown placeholder `{{{name}}}`; known placeholders: {}; \
         write `{{{{` for a literal `{{`",
        known.join(", ")
    )]
    UnknownPlaceholder {
        /// The placeholder's name.
        name: String,
        /// 1-based line number in the template.
        line: usize,
        /// The names that exist, sorted.
        known: Vec<String>,
    },
    /// A value would break the script (a newline in a directive, say).
    #[error("job script value `{name}` = {value:?} is not allowed: {reason}")]
    BadValue {
        /// The placeholder's name.
        name: String,
        /// The offending value.
        value: String,
        /// Why.
        reason: String,
    },
}

enum Piece<'a> {
    Text(&'a str),
    Var(&'a str),
}

/// Renders `template` with `vars`.
pub fn render(template: &str, vars: &BTreeMap<String, String>) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(template.len() + 256);
    for (idx, line) in template.split_inclusive('\n').enumerate() {
        let pieces = parse_line(line);
        let mut rendered = String::with_capacity(line.len());
        let mut any_empty = false;
        let mut only_vars = true;
        for piece in &pieces {
            match piece {
                Piece::Text(t) => {
                    only_vars &= t.trim().is_empty();
                    rendered.push_str(t);
                }
                Piece::Var(name) => {
                    let value =
                        vars.get(*name)
                            .ok_or_else(|| TemplateError::UnknownPlaceholder {
                                name: name.to_string(),
                                line: idx + 1,
                                known: vars.keys().cloned().collect(),
                            })?;
                    any_empty |= value.is_empty();
                    rendered.push_str(value);
                }
            }
        }
        let has_var = pieces.iter().any(|p| matches!(p, Piece::Var(_)));
        let is_comment = line.trim_start().starts_with('#') && !line.starts_with("#!");
        if has_var && any_empty && (is_comment || only_vars) {
            continue;
        }
        out.push_str(&rendered);
    }
    Ok(out)
}

/// The placeholder names a template uses, in order of first use.
pub fn placeholders(template: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for line in template.split_inclusive('\n') {
        for piece in parse_line(line) {
            if let Piece::Var(n) = piece {
                if !names.iter().any(|x| x == n) {
                    names.push(n.to_string());
                }
            }
        }
    }
    names
}

fn parse_line(line: &str) -> Vec<Piece<'_>> {
    let bytes = line.as_bytes();
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'}' if bytes.get(i + 1) == Some(&bytes[i]) => {
                pieces.push(Piece::Text(&line[start..i + 1]));
                i += 2;
                start = i;
            }
            b'{' if i == 0 || bytes[i - 1] != b'$' => match ident_end(bytes, i + 1) {
                Some(end) if bytes.get(end) == Some(&b'}') => {
                    pieces.push(Piece::Text(&line[start..i]));
                    pieces.push(Piece::Var(&line[i + 1..end]));
                    i = end + 1;
                    start = i;
                }
                _ => i += 1,
            },
            _ => i += 1,
        }
    }
    pieces.push(Piece::Text(&line[start..]));
    pieces
}

/// End (exclusive) of an identifier starting at `from`, if one starts there.
fn ident_end(bytes: &[u8], from: usize) -> Option<usize> {
    let first = *bytes.get(from)?;
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return None;
    }
    let mut end = from + 1;
    while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
        end += 1;
    }
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn substitutes_and_keeps_shell_syntax() {
        let t = "#!/bin/bash\necho {a} ${HOME} {1..3} { true; } {{a}} x}y\n";
        let out = render(t, &vars(&[("a", "A")])).unwrap();
        assert_eq!(
            out,
            "#!/bin/bash\necho A ${HOME} {1..3} { true; } {a} x}y\n"
        );
    }

    #[test]
    fn unknown_placeholder_names_it_and_lists_known() {
        let err = render(
            "ok {a}\n#SBATCH --qos={qos}\n",
            &vars(&[("a", "1"), ("b", "2")]),
        )
        .unwrap_err();
        assert_eq!(
            err,
            TemplateError::UnknownPlaceholder {
                name: "qos".into(),
                line: 2,
                known: vec!["a".into(), "b".into()]
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("`{qos}`") && msg.contains("a, b") && msg.contains("line 2"),
            "{msg}"
        );
    }

    #[test]
    fn empty_values_drop_directive_and_placeholder_only_lines() {
        let t = "#!/bin/bash\n#SBATCH --account={acct}\n#SBATCH -J {name}\n{modules}\necho {acct}done\n";
        let out = render(t, &vars(&[("acct", ""), ("name", "j"), ("modules", "")])).unwrap();
        assert_eq!(out, "#!/bin/bash\n#SBATCH -J j\necho done\n");
    }

    #[test]
    fn multi_line_values_are_inserted_whole() {
        let out = render("a\n{block}\nb", &vars(&[("block", "x\ny")])).unwrap();
        assert_eq!(out, "a\nx\ny\nb");
    }

    #[test]
    fn lists_placeholders_in_order() {
        assert_eq!(placeholders("{b} {a}\n${c} {b}"), vec!["b", "a"]);
    }
}
