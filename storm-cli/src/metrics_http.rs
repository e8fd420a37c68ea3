//! `storm metrics --listen [ADDR]`: the MM's metrics over HTTP, for a Prometheus server to
//! scrape.
//!
//! A refresher thread asks the MM over its control socket every `--refresh-ms` (one second
//! by default) and keeps the answer; every `GET /metrics` is served from that snapshot, so a
//! scrape, or a flood of them, costs the MM nothing. The MM itself opens no TCP port: this
//! small server runs wherever the operator starts it (usually beside the MM) and needs only
//! to reach the control socket.
//!
//! It listens on loopback (`127.0.0.1:9464`) unless told otherwise. With `--token-file`,
//! every request must carry `Authorization: Bearer TOKEN` (compared in constant time), or it
//! gets `401`; an address other than loopback is refused without a token, since the metrics
//! tell anyone who can connect what the cluster runs. When the last refresh failed, or the
//! snapshot is older than three refresh periods, a scrape gets `503` with the reason, so
//! Prometheus records the target as down rather than reading stale numbers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use storm_cluster::control::{Client, Reply, Request};

/// The content type of the text the MM encodes: the classic Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Where the exporter listens unless told otherwise: loopback, Prometheus's port for it.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// The MM's metrics text with the per-node series of its nodes' records
/// ([`crate::node_metrics`]), or why it could not be had.
pub fn fetch(socket: &Path) -> Result<String, String> {
    let client = Client::connect(socket)?;
    let mut text = match client.call(&Request::Metrics)? {
        Reply::Metrics(text) => text,
        Reply::Error(e) => return Err(e),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    match client.call(&Request::Nodes)? {
        Reply::Nodes(nodes) => text.push_str(&crate::node_metrics::node_series(&nodes)),
        Reply::Error(e) => return Err(e),
        other => return Err(format!("unexpected reply {other:?}")),
    }
    Ok(text)
}

/// Reads a bearer token from `path`: the file's first line, which must not be empty, in a
/// file other users cannot read.
pub fn read_token(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} can be read by other users (mode {:04o}): run `chmod 600 {}`",
            path.display(),
            meta.mode() & 0o7777,
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(format!("{} holds no token", path.display()));
    }
    Ok(token)
}

/// The last answer of the MM (or why there is none), and when it was asked.
struct Snapshot {
    body: Result<String, String>,
    at: Instant,
}

/// How the exporter serves.
pub struct ExporterOptions {
    pub listen: SocketAddr,
    /// The bearer token every request must carry, if any.
    pub token: Option<String>,
    /// How often the MM is asked.
    pub refresh: Duration,
}

/// A bound metrics server.
pub struct MetricsServer {
    server: tiny_http::Server,
    token: Option<String>,
    refresh: Duration,
    snapshot: Arc<Mutex<Snapshot>>,
}

impl MetricsServer {
    /// Binds `opts.listen` (port 0 picks a free port) and starts refreshing from the MM at
    /// `socket`. A non-loopback address without a token is refused.
    pub fn bind(opts: ExporterOptions, socket: PathBuf) -> Result<Self, String> {
        let addr = opts.listen;
        if !addr.ip().is_loopback() && opts.token.is_none() {
            return Err(format!(
                "refusing to serve the cluster's metrics to anyone who can reach {addr}: give \
                 --token-file (Prometheus's `authorization` credentials), or listen on loopback"
            ));
        }
        if opts.refresh.is_zero() {
            return Err("--refresh-ms must be at least 1".into());
        }
        let server =
            tiny_http::Server::http(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let snapshot = Arc::new(Mutex::new(Snapshot {
            body: fetch(&socket),
            at: Instant::now(),
        }));
        let shared = snapshot.clone();
        let refresh = opts.refresh;
        std::thread::Builder::new()
            .name("metrics-refresh".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(refresh);
                    let body = fetch(&socket);
                    *shared.lock().unwrap_or_else(|e| e.into_inner()) = Snapshot {
                        body,
                        at: Instant::now(),
                    };
                }
            })
            .map_err(|e| format!("cannot start the refreshing thread: {e}"))?;
        Ok(Self {
            server,
            token: opts.token,
            refresh,
            snapshot,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.server_addr().to_ip()
    }

    /// Answers scrapes until the process ends.
    pub fn serve(self) {
        for request in self.server.incoming_requests() {
            let authorized = self.authorized(request.headers());
            let response = self.answer(request.method(), request.url(), authorized);
            if let Err(e) = request.respond(response) {
                eprintln!("storm metrics: answering a scrape: {e}");
            }
        }
    }

    /// Whether the request carries the token (always, without one).
    fn authorized(&self, headers: &[tiny_http::Header]) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let given = headers
            .iter()
            .find(|h| h.field.equiv("Authorization"))
            .and_then(|h| h.value.as_str().strip_prefix("Bearer "))
            .unwrap_or("");
        constant_time_eq(given.as_bytes(), token.as_bytes())
    }

    fn answer(
        &self,
        method: &tiny_http::Method,
        url: &str,
        authorized: bool,
    ) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
        let path = url.split('?').next().unwrap_or("");
        let text = |status: u16, body: String, content_type: &str| {
            let header = tiny_http::Header::from_bytes("Content-Type", content_type)
                .expect("a valid static header");
            tiny_http::Response::from_string(body)
                .with_status_code(status)
                .with_header(header)
        };
        let plain = "text/plain; charset=utf-8";
        if !authorized {
            let challenge = tiny_http::Header::from_bytes("WWW-Authenticate", "Bearer")
                .expect("a valid static header");
            return text(401, "a bearer token is required\n".into(), plain).with_header(challenge);
        }
        match (method, path) {
            (tiny_http::Method::Get, "/metrics") => {
                let snap = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
                let age = snap.at.elapsed();
                match &snap.body {
                    Ok(_) if age > self.refresh * 3 => text(
                        503,
                        format!(
                            "the machine manager's metrics are {} ms old (refreshed every {} ms)\n",
                            age.as_millis(),
                            self.refresh.as_millis()
                        ),
                        plain,
                    ),
                    Ok(body) => text(200, body.clone(), CONTENT_TYPE),
                    Err(e) => text(
                        503,
                        format!("the machine manager is unreachable: {e}\n"),
                        plain,
                    ),
                }
            }
            (tiny_http::Method::Get, "/") => text(
                200,
                "storm metrics exporter: the machine manager's metrics are at /metrics\n".into(),
                plain,
            ),
            (tiny_http::Method::Get, _) => text(404, "not found: try /metrics\n".into(), plain),
            _ => text(405, "only GET is served\n".into(), plain),
        }
    }
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_by_every_byte() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn a_public_address_without_a_token_is_refused() {
        let err = MetricsServer::bind(
            ExporterOptions {
                listen: "0.0.0.0:0".parse().unwrap(),
                token: None,
                refresh: Duration::from_secs(1),
            },
            PathBuf::from("/nonexistent/mm.sock"),
        )
        .err()
        .unwrap();
        assert!(err.contains("--token-file"), "{err}");
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "abc\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_token(&p).unwrap_err().contains("chmod 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_token(&p).unwrap(), "abc");
    }
}
