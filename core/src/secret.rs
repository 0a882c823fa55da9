//! Secrets a user may type where a URL goes (`postgresql://me:PASSWORD@host/db`,
//! `...?password=PASSWORD`), kept out of every message, log line, status and recorded command
//! line: the password is replaced by `***` wherever text that may hold one is printed.

/// `text` with every password of a URL's user part (`scheme://user:PASSWORD@`) and every
/// `password=` parameter's value replaced by `***`. Text without either comes back unchanged.
pub fn redact(text: &str) -> String {
    redact_parameters(&redact_userinfo(text))
}

/// `scheme://user:secret@host` → `scheme://user:***@host`, for each URL in `text`.
fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority ends at the first of these; its user part at its last `@`.
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.split_once(':') {
                    Some((user, secret)) if !secret.is_empty() => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    _ => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `password=secret` (a URL's query, a libpq keyword string) → `password=***`.
fn redact_parameters(text: &str) -> String {
    const KEY: &str = "password=";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.to_ascii_lowercase().find(KEY) {
        let starts_word = at == 0
            || !rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        out.push_str(&rest[..at + KEY.len()]);
        let tail = &rest[at + KEY.len()..];
        let end = tail
            .find(|c: char| c == '&' || c == '#' || c.is_whitespace() || c == '`' || c == '\'')
            .unwrap_or(tail.len());
        if starts_word && end > 0 {
            out.push_str("***");
            rest = &tail[end..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_in_urls_and_parameters_are_replaced() {
        assert_eq!(
            redact("cannot use `postgresql://me:s3cr3t@db.example:5432/papers`: no"),
            "cannot use `postgresql://me:***@db.example:5432/papers`: no"
        );
        assert_eq!(
            redact("postgresql://me@h/db?sslmode=require&password=hunter2&x=1"),
            "postgresql://me@h/db?sslmode=require&password=***&x=1"
        );
        assert_eq!(
            redact("host=h PASSWORD=abc user=me"),
            "host=h PASSWORD=*** user=me"
        );
        // An `@` in the password: the user part ends at the authority's last `@`.
        assert_eq!(
            redact("postgres://u:p@ss@h/d and https://k:v@q:6334"),
            "postgres://u:***@h/d and https://k:***@q:6334"
        );
    }

    #[test]
    fn text_without_a_secret_is_unchanged() {
        for text in [
            "postgresql://me@h:5432/db",
            "http://127.0.0.1:6334",
            "no url here: a:b@c",
            "set old_password=; x",
            "",
        ] {
            assert_eq!(redact(text), text);
        }
        // `keep_password=1` is another parameter, not `password=`.
        assert_eq!(redact("keep_password=1"), "keep_password=1");
    }
}
