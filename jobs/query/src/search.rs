//! Searches in batches with K requests in flight: the query workload's, eval's and tune's one
//! way of talking to a collection (the uploader's K-in-flight pattern, for reads).

use embedfleet_vectordb::{Hit, QueryRequest, SearchOptions, Sink, UploadError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a batched search came to.
#[derive(Debug, Default)]
pub struct BatchedSearch {
    /// One result list per query vector, in order.
    pub hits: Vec<Vec<Hit>>,
    /// The latency of each search request (one per batch of `batch_size` queries).
    pub batch_latencies: Vec<Duration>,
    /// Wall time of the whole search.
    pub elapsed: Duration,
}

/// One request's answers and its latency.
type BatchAnswer = (Vec<Vec<Hit>>, Duration);

/// Searches `vectors` in requests of `batch_size` queries, `in_flight` requests at once (one
/// thread each, sharing `sink`). The first failed request stops the search and is returned.
pub fn search_batched(
    sink: &dyn Sink,
    collection: &str,
    vectors: &[Vec<f32>],
    options: &SearchOptions,
    batch_size: usize,
    in_flight: usize,
) -> Result<BatchedSearch, UploadError> {
    let started = Instant::now();
    let chunks: Vec<&[Vec<f32>]> = vectors.chunks(batch_size.max(1)).collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<BatchAnswer>>> =
        Mutex::new((0..chunks.len()).map(|_| None).collect());
    let failed: Mutex<Option<UploadError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..in_flight.clamp(1, chunks.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= chunks.len() || lock(&failed).is_some() {
                    return;
                }
                let sent = Instant::now();
                let request = QueryRequest::new(collection, chunks[i], options.clone());
                match sink.query(request) {
                    Ok(hits) => lock(&results)[i] = Some((hits, sent.elapsed())),
                    Err(e) => {
                        lock(&failed).get_or_insert(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let mut out = BatchedSearch {
        elapsed: started.elapsed(),
        ..BatchedSearch::default()
    };
    for (hits, latency) in results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|r| r.expect("every batch has a result when none failed. This is a bug."))
    {
        out.hits.extend(hits);
        out.batch_latencies.push(latency);
    }
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub use embedfleet_core::eval_tables::Percentiles;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let p = Percentiles::of(&samples);
        assert_eq!((p.p50_ms, p.p95_ms, p.p99_ms), (50.0, 95.0, 99.0));
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
        let one = Percentiles::of(&[Duration::from_millis(7)]);
        assert_eq!((one.p50_ms, one.p99_ms), (7.0, 7.0));
    }
}
