//! What made a query results file. A results file (and the parts folder of an unfinished one)
//! carries the request it answers: its terms, the collection searched and what that collection
//! held, the search settings and the model. A later `query` into the same file does nothing
//! only for the same request; a different one resumes nothing and overwrites nothing unless
//! told to (`--replace`), and is told what differs.

use embedfleet_core::pin::{Field, Pinned};
use serde::{Deserialize, Serialize};

/// The parquet footer key (and `key.json` of the parts folder) that holds the request.
pub const REQUEST_METADATA_KEY: &str = "embedfleet.query_request";

/// What the query crate cannot know of a request: where the collection is, what it holds, and
/// which model embeds the terms. The caller (the pipeline) fills it from the sink and run.db.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Searched {
    /// The sink's target (`edge:<dir>`, `server:<url>`).
    pub target: String,
    /// The collection's identity marker, where the database keeps one.
    pub marker: Option<String>,
    /// What the collection held, as the run knows it: the release its last complete upload
    /// brought it to, the rows acknowledged, and its point count.
    pub contents: String,
    /// The model's fingerprint (config and weights), and the output dimension.
    pub model: String,
    pub dim: Option<usize>,
}

/// A query request, as stored with its results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryRequest {
    pub format: u32,
    /// How many terms, and one hash of every term with its position.
    pub terms: u64,
    pub terms_digest: String,
    pub collection: String,
    pub target: String,
    pub marker: Option<String>,
    pub contents: String,
    pub k: usize,
    /// The filter and search settings as the search options print them.
    pub search: String,
    pub model: String,
    pub dim: Option<usize>,
    pub instruction: String,
    /// Terms per part: the parts of an unfinished run are only resumed with the same.
    pub part_queries: usize,
}

impl QueryRequest {
    pub fn new(
        terms: &[String],
        collection: &str,
        search: &embedfleet_vectordb::SearchOptions,
        instruction: &str,
        part_queries: usize,
        searched: &Searched,
    ) -> Self {
        Self {
            format: 1,
            terms: terms.len() as u64,
            terms_digest: terms_digest(terms),
            collection: collection.to_string(),
            target: searched.target.clone(),
            marker: searched.marker.clone(),
            contents: searched.contents.clone(),
            k: search.k,
            search: format!(
                "filter {:?}, hnsw_ef {:?}, exact {}",
                search.filter, search.hnsw_ef, search.exact
            ),
            model: searched.model.clone(),
            dim: searched.dim,
            instruction: instruction.to_string(),
            part_queries,
        }
    }

    /// What differs between the request stored with a file (`self`) and `given`, each as
    /// "what: the file's X, here Y"; empty when none does.
    pub fn differences(&self, given: &Self) -> Vec<String> {
        Pinned::differences(self, given)
            .iter()
            .map(|d| format!("{}: the file's {}, here {}", d.name, d.pinned, d.given))
            .collect()
    }
}

impl Pinned for QueryRequest {
    fn fields(&self) -> Vec<Field> {
        let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
        vec![
            Field::shown_as(
                "terms",
                &self.terms_digest,
                format!("{} terms ({})", self.terms, self.terms_digest),
            ),
            Field::new(
                "collection",
                format!("`{}` at {}", self.collection, self.target),
            ),
            Field::new("collection identity", or_none(&self.marker)),
            Field::new("collection contents", &self.contents),
            Field::new("--top-k", self.k),
            Field::new("search", &self.search),
            Field::new("model", &self.model),
            Field::new(
                "--dim",
                self.dim.map_or("the model's own".into(), |d| d.to_string()),
            ),
            Field::new("--instruction", &self.instruction),
            Field::new("terms per part", self.part_queries),
        ]
    }
}

/// One xxh3-64 over the terms, each with its position: the same terms in another order are
/// another request (query ids are positions).
fn terms_digest(terms: &[String]) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (i, t) in terms.iter().enumerate() {
        h.update(&(i as u64).to_le_bytes());
        h.update(&(t.len() as u64).to_le_bytes());
        h.update(t.as_bytes());
    }
    format!("{:016x}", h.digest())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedfleet_vectordb::SearchOptions;

    fn request(terms: &[&str], contents: &str, k: usize) -> QueryRequest {
        let terms: Vec<String> = terms.iter().map(|t| t.to_string()).collect();
        let searched = Searched {
            target: "edge:/r/qdrant".into(),
            marker: Some("m1".into()),
            contents: contents.into(),
            model: "f00d".into(),
            dim: None,
        };
        QueryRequest::new(
            &terms,
            "papers",
            &SearchOptions::new(k),
            "Find papers",
            1024,
            &searched,
        )
    }

    #[test]
    fn the_same_terms_elsewhere_or_in_another_order_are_another_request() {
        let a = request(&["a", "b"], "release 1", 10);
        assert!(a
            .differences(&request(&["a", "b"], "release 1", 10))
            .is_empty());
        let swapped = a.differences(&request(&["b", "a"], "release 1", 10));
        assert_eq!(swapped.len(), 1, "{swapped:?}");
        assert!(
            swapped[0].starts_with("terms: the file's 2 terms"),
            "{swapped:?}"
        );
        // One term split in two is not the same text: lengths are hashed too.
        assert_ne!(
            terms_digest(&["ab".into()]),
            terms_digest(&["a".into(), "b".into()])
        );
        let moved = a.differences(&request(&["a", "b"], "release 2", 5));
        assert_eq!(
            moved,
            [
                "collection contents: the file's release 1, here release 2",
                "--top-k: the file's 10, here 5"
            ]
        );
    }

    #[test]
    fn the_request_round_trips_through_json() {
        let a = request(&["a"], "release 1, 200 rows", 10);
        let back: QueryRequest = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(a, back);
    }
}
