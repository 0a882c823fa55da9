//! What a collection's vectors are, carried in its identity marker after the marker's own id:
//! `<uuid> vectors=model:<fingerprint>,precision:<native|fp8>,pooling:<pooling>`, from the
//! output settings of the run that made it. Vectors of another model, precision or pooling
//! cannot be compared with them even at the same width, so a second run (another run
//! directory loading into the same collection) whose vectors differ is refused before it writes.
//! A marker written before this existed carries none: nothing to compare, as before.

use embedfleet_core::handoff::OutputSettings;
use embedfleet_core::rundb::RunDb;

use crate::error::UploadError;

const TAG: &str = " vectors=";

/// This run's vectors, from its pinned output settings; `None` before its first job fixed them.
pub fn of_run(db: &RunDb) -> Option<String> {
    let settings = OutputSettings::read(&db.layout()).ok()??;
    Some(format!(
        "model:{},precision:{},pooling:{}",
        settings.model, settings.precision, settings.pooling
    ))
}

/// The vectors a marker says, if it says any.
pub fn in_marker(marker: &str) -> Option<&str> {
    marker.split_once(TAG).map(|(_, vectors)| vectors)
}

/// A new marker `id`, with `vectors` after it where the run knows them.
pub fn marker(id: String, vectors: Option<&str>) -> String {
    match vectors {
        Some(v) => format!("{id}{TAG}{v}"),
        None => id,
    }
}

/// Refuses `collection` when its marker says other vectors than `ours`.
pub fn check(collection: &str, found: Option<&str>, ours: Option<&str>) -> Result<(), UploadError> {
    match (found.and_then(in_marker), ours) {
        (Some(theirs), Some(ours)) if theirs != ours => Err(UploadError::OtherVectors {
            collection: collection.to_string(),
            theirs: words(theirs),
            ours: words(ours),
        }),
        _ => Ok(()),
    }
}

/// `model:ab12,precision:fp8,pooling:mean` in a message's words.
fn words(vectors: &str) -> String {
    vectors.replace(':', " ").replace(',', ", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_carries_its_vectors_and_another_run_s_are_refused() {
        let ours = "model:ab12,precision:native,pooling:last_token";
        let m = marker("0f6c-uuid".into(), Some(ours));
        assert_eq!(in_marker(&m), Some(ours));
        assert!(check("papers", Some(&m), Some(ours)).is_ok());
        let fp8 = ours.replace("native", "fp8");
        let err = check("papers", Some(&m), Some(&fp8))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("precision native") && err.contains("precision fp8"),
            "{err}"
        );
        // A marker from before (no vectors) and a run not yet pinned compare nothing.
        assert!(check("papers", Some("0f6c-uuid"), Some(&fp8)).is_ok());
        assert!(check("papers", Some(&m), None).is_ok());
        assert_eq!(marker("id".into(), None), "id");
    }
}
