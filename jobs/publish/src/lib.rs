//! The publish stage: a run's embeddings as a dataset folder (see `publish`).
