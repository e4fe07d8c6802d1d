//! TLS for tokio-postgres sessions, over rustls (already the project's TLS;
//! a connector crate would only wrap these few lines). Instances refuse
//! plain text (controller::tls), so every client here speaks TLS:
//! [`verify_full`] as an application following the docs does (the cluster
//! CA, the name dialled checked against the certificate), [`encrypted`]
//! for test and benchmark clients that dial ClusterIPs and only need the
//! channel (libpq's `sslmode=require`).

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// Makes TLS connections for tokio-postgres.
#[derive(Clone)]
pub struct MakeRustls {
    config: Arc<ClientConfig>,
    /// The name checked against the certificate instead of the host the
    /// session dials (a Service name while dialling its ClusterIP).
    name: Option<String>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Verifies the server against `ca_pem` and checks `name` (a Service's DNS
/// name) against its certificate: libpq's `sslmode=verify-full`.
pub fn verify_full(ca_pem: &str, name: &str) -> Result<MakeRustls, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| format!("ca.crt: {e}"))?)
            .map_err(|e| format!("ca.crt: {e}"))?;
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustls {
        config: Arc::new(config),
        name: Some(name.to_string()),
    })
}

/// Encrypts without checking who answers (`sslmode=require`).
pub fn encrypted() -> Result<MakeRustls, String> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_no_client_auth();
    Ok(MakeRustls {
        config: Arc::new(config),
        name: None,
    })
}

/// Accepts any certificate (signatures still checked).
#[derive(Debug)]
struct AnyServer;

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = provider().signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(m, c, d, &algs)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = provider().signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(m, c, d, &algs)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name = self.name.as_deref().unwrap_or(domain).to_string();
        let name = ServerName::try_from(name)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(RustlsConnect {
            config: self.config.clone(),
            name,
        })
    }
}

pub struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let s = tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            Ok(RustlsStream(Box::new(s)))
        })
    }
}

/// A TLS session (no channel binding: SCRAM without `-PLUS`).
pub struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

/// The certificate a PostgreSQL server or PgBouncer at `addr` presents
/// (DER): the protocol's SSLRequest, then a TLS handshake. Shows which
/// certificate a running server has loaded.
pub async fn served_certificate(addr: &str, port: u16) -> io::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((addr, port)).await?;
    // Length 8, code 80877103.
    s.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).await?;
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).await?;
    if answer[0] != b'S' {
        return Err(io::Error::other("the server does not offer TLS"));
    }
    let tls = encrypted().map_err(io::Error::other)?;
    let name = ServerName::try_from("localhost").map_err(io::Error::other)?;
    let s = tokio_rustls::TlsConnector::from(tls.config)
        .connect(name, s)
        .await?;
    let (_, conn) = s.get_ref();
    conn.peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .ok_or_else(|| io::Error::other("no certificate presented"))
}
