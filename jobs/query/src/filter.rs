//! `--filter` expressions: `year>=2015`, `year<2020`, `year=2019`, `source=s2orc` (repeatable;
//! all must hold).

use embedfleet_upload::PayloadFilter;

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
            filter.source = Some(value.to_string());
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
    let source_ok = filter.source.as_deref().is_none_or(|s| source == Some(s));
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
                source: Some("s2orc".into())
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
}
