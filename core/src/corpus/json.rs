//! One JSON line to a [`Paper`], in one pass and without building a `serde_json::Value`: the
//! text is the bulk of every record and is moved, never copied twice.

use super::ReadOptions;
use crate::paper::Paper;
use crate::quarantine::QuarantineReason;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

pub(super) enum Parsed {
    Paper(Paper),
    Filtered,
    Bad {
        reason: QuarantineReason,
        detail: String,
        id: Option<String>,
    },
}

pub(super) fn parse_line(line: &[u8], options: &ReadOptions) -> Parsed {
    let text = match std::str::from_utf8(line) {
        Ok(text) => text,
        Err(err) => {
            return Parsed::Bad {
                reason: QuarantineReason::NonUtf8,
                detail: format!("invalid UTF-8 at byte {} of the line", err.valid_up_to()),
                id: None,
            }
        }
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let fields = match (RecordSeed {
        keep: &options.keep_fields,
    })
    .deserialize(&mut de)
    .and_then(|f| {
        de.end()?;
        Ok(f)
    }) {
        Ok(fields) => fields,
        Err(err) => {
            return Parsed::Bad {
                reason: QuarantineReason::InvalidJson,
                detail: err.to_string(),
                id: None,
            }
        }
    };
    match fields.into_paper(options) {
        // A record without the fields every paper needs is most often a corpus that names them
        // otherwise (`paper_id`, `body`): the detail lists the fields it has.
        Parsed::Bad {
            reason: reason @ (QuarantineReason::MissingId | QuarantineReason::MissingText),
            detail,
            id,
        } => Parsed::Bad {
            reason,
            detail: format!("{detail} (its fields: {})", field_names(text)),
            id,
        },
        parsed => parsed,
    }
}

/// The top-level field names of a JSON object, in order, joined by ", " (the first 20).
fn field_names(text: &str) -> String {
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut keys = Vec::new();
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                map.next_value::<IgnoredAny>()?;
                if keys.len() < 20 {
                    keys.push(key.into_owned());
                }
            }
            Ok(keys)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    match de::Deserializer::deserialize_map(&mut de, Keys) {
        Ok(keys) if keys.is_empty() => "none".into(),
        Ok(keys) => keys.join(", "),
        Err(_) => "unreadable".into(),
    }
}

/// A field that should be a string: anything else is remembered as its JSON type name.
enum Field<T> {
    Absent,
    Value(T),
    WrongType(&'static str),
}

#[derive(Default)]
struct Fields<'a> {
    id: Option<Field<String>>,
    text: Option<Field<Cow<'a, str>>>,
    source: Option<String>,
    created: Option<String>,
    added: Option<String>,
    version: Option<String>,
    extra: Vec<(String, Box<RawValue>)>,
}

impl Fields<'_> {
    fn into_paper(self, options: &ReadOptions) -> Parsed {
        let id = match self.id.unwrap_or(Field::Absent) {
            Field::Value(id) if !id.is_empty() => id,
            Field::Value(_) => {
                return bad(QuarantineReason::MissingId, "`id` is empty".into(), None)
            }
            Field::Absent => return bad(QuarantineReason::MissingId, "no `id` field".into(), None),
            Field::WrongType(t) => {
                return bad(
                    QuarantineReason::MissingId,
                    format!("`id` is {t}, not a string or integer"),
                    None,
                )
            }
        };
        let text = match self.text.unwrap_or(Field::Absent) {
            Field::Value(text) => text,
            Field::Absent => {
                return bad(
                    QuarantineReason::MissingText,
                    "no `text` field".into(),
                    Some(id),
                )
            }
            Field::WrongType(t) => {
                return bad(
                    QuarantineReason::MissingText,
                    format!("`text` is {t}, not a string"),
                    Some(id),
                )
            }
        };
        if text.trim().is_empty() {
            let detail = format!("`text` is empty or white space ({} bytes)", text.len());
            return bad(QuarantineReason::EmptyText, detail, Some(id));
        }
        if !options.source_selected(self.source.as_deref()) {
            return Parsed::Filtered;
        }
        Parsed::Paper(Paper {
            id,
            text: text.into_owned(),
            source: self.source,
            created: self.created,
            added: self.added,
            version: self.version,
            extra: extra_object(&self.extra),
        })
    }
}

fn bad(reason: QuarantineReason, detail: String, id: Option<String>) -> Parsed {
    Parsed::Bad { reason, detail, id }
}

fn extra_object(extra: &[(String, Box<RawValue>)]) -> Option<String> {
    if extra.is_empty() {
        return None;
    }
    let mut out = String::from("{");
    for (i, (key, value)) in extra.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(
            &serde_json::to_string(key).expect("a string always serialises. This is a bug."),
        );
        out.push(':');
        out.push_str(value.get());
    }
    out.push('}');
    Some(out)
}

struct RecordSeed<'k> {
    keep: &'k [String],
}

impl<'de> DeserializeSeed<'de> for RecordSeed<'_> {
    type Value = Fields<'de>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RecordSeed<'_> {
    type Value = Fields<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Fields::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "id" => fields.id = Some(map.next_value::<Shape<'de>>()?.into_id()),
                "text" => fields.text = Some(map.next_value::<Shape<'de>>()?.into_text()),
                "source" => fields.source = map.next_value::<Option<Scalar>>()?.map(|s| s.0),
                "created" => fields.created = map.next_value::<Option<Scalar>>()?.map(|s| s.0),
                "added" => fields.added = map.next_value::<Option<Scalar>>()?.map(|s| s.0),
                "version" => fields.version = map.next_value::<Option<Scalar>>()?.map(|s| s.0),
                other if self.keep.iter().any(|k| k == other) => {
                    let value = map.next_value::<Box<RawValue>>()?;
                    fields.extra.push((other.to_owned(), value));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(fields)
    }
}

/// The shape of an `id` or `text` value, read without copying a borrowed string.
enum Shape<'a> {
    Str(Cow<'a, str>),
    Int(String),
    Other(&'static str),
}

impl<'a> Shape<'a> {
    fn into_id(self) -> Field<String> {
        match self {
            Shape::Str(s) => Field::Value(s.into_owned()),
            Shape::Int(i) => Field::Value(i),
            Shape::Other(t) => Field::WrongType(t),
        }
    }
    fn into_text(self) -> Field<Cow<'a, str>> {
        match self {
            Shape::Str(s) => Field::Value(s),
            Shape::Int(_) => Field::WrongType("a number"),
            Shape::Other(t) => Field::WrongType(t),
        }
    }
}

impl<'de> de::Deserialize<'de> for Shape<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor)
    }
}

struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Shape::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Shape::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Shape::Str(Cow::Owned(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Shape::Int(v.to_string()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Shape::Int(v.to_string()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Shape::Other("a float"))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Shape::Other("a boolean"))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Shape::Other("null"))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Shape::Other("an array"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Shape::Other("an object"))
    }
}

/// A metadata value kept as a string: strings as they are, numbers and booleans as written.
struct Scalar(String);

impl<'de> de::Deserialize<'de> for Scalar {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Box::<RawValue>::deserialize(d)?;
        let raw = value.get();
        Ok(Scalar(
            serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_owned()),
        ))
    }
}
