//! TLS to PostgreSQL as libpq's `sslmode` says, through rustls (ring, as tonic's).
//!
//! | sslmode | TLS | server certificate checked |
//! |---|---|---|
//! | `disable` | never | - |
//! | `allow`, `prefer` (the default) | when the server offers it | no |
//! | `require` | always | no; as `verify-ca` when a root certificate file exists (libpq's rule) |
//! | `verify-ca` | always | chain to a root certificate |
//! | `verify-full` | always | chain, and the host name |
//!
//! Root certificates: `sslrootcert` (the URL's, else `PGSSLROOTCERT`), else
//! `~/.postgresql/root.crt`; `sslrootcert=system` takes the system's. libpq's `allow` (plain
//! first) is taken as `prefer` (TLS first): the client has no plain-first mode. Client
//! certificates (`sslcert`, `sslkey`) are refused by the URL check.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};

use crate::error::{UploadError, UploadResult};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub(super) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "disable" => Self::Disable,
            "allow" | "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            _ => return None,
        })
    }

    /// What the client negotiates; the certificate checks are the verifier's.
    pub(super) fn client_mode(self) -> postgres::config::SslMode {
        match self {
            Self::Disable => postgres::config::SslMode::Disable,
            Self::Prefer => postgres::config::SslMode::Prefer,
            _ => postgres::config::SslMode::Require,
        }
    }
}

fn tls_err(url: &str, reason: String) -> UploadError {
    UploadError::PgUrl {
        url: url.to_owned(),
        reason,
    }
}

/// The rustls config of `mode` with the root certificates `root` names (`None`: libpq's
/// default file); `None` for `disable`.
pub(super) fn client_config(
    mode: SslMode,
    root: Option<&str>,
    url: &str,
) -> UploadResult<Option<ClientConfig>> {
    if mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let default_file = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".postgresql/root.crt"))
        .filter(|p| p.exists());
    let roots = match root {
        Some("system") => Some(system_roots(url)?),
        Some(path) => Some(file_roots(&PathBuf::from(path), url)?),
        None => match (&default_file, mode) {
            (Some(path), SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull) => {
                Some(file_roots(path, url)?)
            }
            (None, SslMode::VerifyCa | SslMode::VerifyFull) => {
                return Err(tls_err(url, "sslmode verify-ca and verify-full check the server against root certificates, and ~/.postgresql/root.crt does not exist: give sslrootcert=PATH (or sslrootcert=system) in the URL".into()))
            }
            _ => None,
        },
    };
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(url, e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, roots) {
        (SslMode::Prefer, _) | (SslMode::Require, None) => Arc::new(Unchecked(provider)),
        (_, Some(roots)) => {
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| tls_err(url, format!("root certificates: {e}")))?;
            if mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
        (_, None) => unreachable!("verify modes have roots or were refused above"),
    };
    Ok(Some(
        builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth(),
    ))
}

fn file_roots(path: &PathBuf, url: &str) -> UploadResult<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err(url, format!("sslrootcert {}: {e}", path.display())))?;
    for cert in certs {
        let cert =
            cert.map_err(|e| tls_err(url, format!("sslrootcert {}: {e}", path.display())))?;
        roots
            .add(cert)
            .map_err(|e| tls_err(url, format!("sslrootcert {}: {e}", path.display())))?;
    }
    if roots.is_empty() {
        return Err(tls_err(
            url,
            format!("sslrootcert {} holds no certificate", path.display()),
        ));
    }
    Ok(roots)
}

fn system_roots(url: &str) -> UploadResult<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(tls_err(
            url,
            "sslrootcert=system: this machine has no root certificates (install ca-certificates)"
                .into(),
        ));
    }
    Ok(roots)
}

/// `verify-ca`: the chain is checked, the host name is not.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a root certificate: encrypted, the server not authenticated
/// (libpq's behaviour; the handshake's signatures are still checked).
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
