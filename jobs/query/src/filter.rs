//! `--filter` expressions: `year>=2015`, `year<2020`, `year=2019`, `source=s2orc` (repeatable;
//! all must hold).
//!
//! `source=X` follows `plan --source`'s rule: it selects the sources equal to `X` or under it
//! (`s2orc` selects `s2orc/train`). The payload is matched exactly, so the prefix is resolved
//! against the run's own source values (counted at plan time) into the ones it selects; one
//! that selects none is refused with the values there are.

use std::collections::BTreeMap;

use embedfleet_core::rundb::RunDb;
use embedfleet_vectordb::PayloadFilter;

/// `--filter` expressions parsed and their `source=` resolved against the run's sources (see
/// the module docs). A run planned before its sources were counted matches `source=` exactly.
pub fn run_filters(db: &RunDb, exprs: &[String]) -> Result<Option<PayloadFilter>, String> {
    let Some(filter) = parse_filters(exprs)? else {
        return Ok(None);
    };
    let known = db.source_values().map_err(|e| e.to_string())?;
    resolve_sources(filter, known.as_ref()).map(Some)
}

/// `filter` with each source it names replaced by the known sources it selects.
pub fn resolve_sources(
    mut filter: PayloadFilter,
    known: Option<&BTreeMap<String, u64>>,
) -> Result<PayloadFilter, String> {
    let Some(known) = known else {
        return Ok(filter);
    };
    if filter.sources.is_empty() {
        return Ok(filter);
    }
    let mut selected = Vec::new();
    for want in &filter.sources {
        let under: Vec<&String> = known.keys().filter(|s| selects(want, s)).collect();
        if under.is_empty() {
            let values: Vec<String> = known
                .iter()
                .map(|(s, n)| format!("`{s}` ({n} papers)"))
                .collect();
            return Err(format!(
                "filter `source={want}` selects no paper of this run: its sources are {}. `source=X` takes a source or the part before its `/` (`source=s2orc` selects `s2orc/train`), as `plan --source` does",
                if values.is_empty() { "none (no paper has a `source`)".to_string() } else { values.join(", ") }
            ));
        }
        selected.extend(under.into_iter().cloned());
    }
    selected.sort();
    selected.dedup();
    filter.sources = selected;
    Ok(filter)
}

use embedfleet_core::corpus::source_selects as selects;

/// Parses `--filter` expressions into one filter (`None` when there are none).
pub fn parse_filters(exprs: &[String]) -> Result<Option<PayloadFilter>, String> {
    let mut filter = PayloadFilter::default();
    for expr in exprs {
        apply(&mut filter, expr.trim())?;
    }
    Ok((!exprs.is_empty()).then_some(filter))
}

fn apply(filter: &mut PayloadFilter, expr: &str) -> Result<(), String> {
    let ops = [">=", "<=", "=", ">", "<"];
    let (field, op, value) = ops
        .iter()
        .find_map(|op| expr.split_once(op).map(|(f, v)| (f.trim(), *op, v.trim())))
        .ok_or_else(|| {
            format!("filter `{expr}` is not FIELD OP VALUE, e.g. `year>=2015` or `source=s2orc`")
        })?;
    match field {
        "year" => {
            let year: i64 = value
                .parse()
                .map_err(|_| format!("filter `{expr}`: `{value}` is not a year"))?;
            let (min, max) = match op {
                ">=" => (Some(year), None),
                ">" => (Some(year + 1), None),
                "<=" => (None, Some(year)),
                "<" => (None, Some(year - 1)),
                _ => (Some(year), Some(year)),
            };
            if let Some(m) = min {
                filter.year_min = Some(filter.year_min.map_or(m, |old| old.max(m)));
            }
            if let Some(m) = max {
                filter.year_max = Some(filter.year_max.map_or(m, |old| old.min(m)));
            }
            Ok(())
        }
        "source" if op == "=" && !value.is_empty() => {
            if !filter.sources.is_empty() && filter.sources.iter().all(|s| s != value) {
                return Err(format!(
                    "filter `{expr}`: a paper has one source, and another `source=` is given: give one (a prefix such as `s2orc` selects every source under it)"
                ));
            }
            filter.sources = vec![value.to_string()];
            Ok(())
        }
        "source" => Err(format!(
            "filter `{expr}`: source takes `=`, e.g. `source=s2orc`"
        )),
        other => Err(format!(
            "filter `{expr}`: unknown field `{other}` (the payload has `year` and `source`)"
        )),
    }
}

/// True when a paper with this year and source passes `filter` (the exact search's test, the
/// same as the engine's).
pub fn matches(filter: &PayloadFilter, year: Option<i64>, source: Option<&str>) -> bool {
    let year_ok = match (filter.year_min, filter.year_max) {
        (None, None) => true,
        (min, max) => {
            year.is_some_and(|y| min.is_none_or(|m| y >= m) && max.is_none_or(|m| y <= m))
        }
    };
    let source_ok =
        filter.sources.is_empty() || source.is_some_and(|s| filter.sources.iter().any(|f| f == s));
    year_ok && source_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(exprs: &[&str]) -> Result<Option<PayloadFilter>, String> {
        parse_filters(&exprs.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn expressions_combine_into_one_filter() {
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(
            parse(&["year>=2015", "year < 2020", "source=s2orc"]).unwrap(),
            Some(PayloadFilter {
                year_min: Some(2015),
                year_max: Some(2019),
                sources: vec!["s2orc".into()]
            })
        );
        assert_eq!(
            parse(&["year=2019"]).unwrap(),
            Some(PayloadFilter::year(2019))
        );
        for bad in ["year", "year>=x", "title=a", "source>a"] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn matching_follows_the_filter() {
        let f = PayloadFilter::years(2015, 2019);
        assert!(matches(&f, Some(2015), None));
        assert!(!matches(&f, Some(2020), None));
        assert!(
            !matches(&f, None, None),
            "a paper without a year fails a year filter"
        );
        let s = PayloadFilter::source("a");
        assert!(matches(&s, None, Some("a")) && !matches(&s, None, Some("b")));
    }

    #[test]
    fn a_source_resolves_to_the_run_sources_it_selects_as_plan_source_does() {
        let known: BTreeMap<String, u64> = [("s2orc/train", 5), ("s2ag/train", 3), ("s2orcx", 1)]
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect();
        let resolve = |expr: &str| {
            let f = parse(&[expr]).unwrap().unwrap();
            resolve_sources(f, Some(&known))
        };
        assert_eq!(resolve("source=s2orc").unwrap().sources, ["s2orc/train"]);
        assert_eq!(resolve("source=s2orcx").unwrap().sources, ["s2orcx"]);
        assert_eq!(
            resolve("source=s2ag/train").unwrap().sources,
            ["s2ag/train"]
        );
        let err = resolve("source=arxiv").unwrap_err();
        assert!(
            err.contains("selects no paper") && err.contains("`s2orc/train` (5 papers)"),
            "{err}"
        );
        // The same rule as the plan's reader.
        for (want, source) in [
            ("s2orc", "s2orc/train"),
            ("s2orc", "s2orcx"),
            ("s2", "s2orc"),
        ] {
            assert_eq!(
                selects(want, source),
                want == "s2orc" && source == "s2orc/train",
                "{want} {source}"
            );
        }
        // Not known (a run planned before sources were counted): matched as given.
        let f = parse(&["source=s2orc"]).unwrap().unwrap();
        assert_eq!(resolve_sources(f, None).unwrap().sources, ["s2orc"]);
    }
}
