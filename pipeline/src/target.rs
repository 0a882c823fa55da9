//! Where points go: a Qdrant server (gRPC, with its API key and the consent to send it in
//! clear text), the in-process engine in a directory (by default the run's own), or a
//! PostgreSQL database with pgvector.

use std::path::{Path, PathBuf};

use embedfleet_core::RunLayout;
use embedfleet_vectordb::{
    ApiKey, IterativeScan, PgConfig, PgIndex, PgVector, QdrantEdge, QdrantServer, ServerConfig,
    Sink,
};

use crate::error::Result;

/// A target as typed.
#[derive(Debug, Clone)]
pub struct TargetFlags {
    /// A server's gRPC URL.
    pub qdrant: Option<String>,
    /// The in-process engine's directory (default: `<run-dir>/qdrant`).
    pub edge: Option<PathBuf>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub allow_insecure: bool,
    /// A PostgreSQL database with pgvector (its URL).
    pub postgres: Option<String>,
    /// What to build there: the index, how filtered searches scan, the memory of a build.
    pub pg_index: PgIndex,
    pub pg_iterative_scan: IterativeScan,
    pub pg_maintenance_mem: Option<u64>,
}

impl Default for TargetFlags {
    fn default() -> Self {
        let pg = PgConfig::new("");
        Self {
            qdrant: None,
            edge: None,
            api_key_env: None,
            api_key_file: None,
            allow_insecure: false,
            postgres: None,
            pg_index: pg.index,
            pg_iterative_scan: pg.iterative_scan,
            pg_maintenance_mem: pg.maintenance_mem_mb,
        }
    }
}

impl TargetFlags {
    /// How to reach the server at `url` with this target's API key and insecure-key consent.
    pub fn server_config(&self, url: &str) -> ServerConfig {
        let api_key = match (&self.api_key_env, &self.api_key_file) {
            (Some(var), _) => ApiKey::Env(var.clone()),
            (None, Some(path)) => ApiKey::File(path.clone()),
            (None, None) => ApiKey::None,
        };
        ServerConfig {
            api_key,
            allow_insecure: self.allow_insecure,
            ..ServerConfig::new(url)
        }
    }

    /// The PostgreSQL database at `url` with this target's pgvector settings.
    pub fn pg_config(&self, url: &str) -> PgConfig {
        PgConfig {
            index: self.pg_index,
            iterative_scan: self.pg_iterative_scan,
            maintenance_mem_mb: self.pg_maintenance_mem,
            ..PgConfig::new(url)
        }
    }

    /// The Qdrant server at `url` itself, for what only a server does (the snapshot load).
    pub fn open_server(&self, url: &str) -> Result<QdrantServer> {
        Ok(QdrantServer::connect(self.server_config(url))?)
    }

    /// The sink of this target for the run in `run_dir`: the one place a sink is made.
    pub fn open(&self, run_dir: &Path) -> Result<Box<dyn Sink>> {
        if let Some(url) = &self.postgres {
            let sink = PgVector::connect(self.pg_config(url))?;
            return Ok(Box::new(sink));
        }
        if let Some(url) = &self.qdrant {
            return Ok(Box::new(self.open_server(url)?));
        }
        let dir = self
            .edge
            .clone()
            .unwrap_or_else(|| RunLayout::new(run_dir).edge_dir());
        Ok(Box::new(QdrantEdge::open(dir)?))
    }
}
