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
//!
//! The HTTP it speaks is the little a scrape needs: one `GET` per connection, its request
//! whole within 5 s and 8 KiB, answered with `Connection: close`. At most
//! [`MAX_CONNECTIONS`] are served at once, [`MAX_CONNECTIONS_PER_SOURCE`] from one address
//! (`storm_cluster::accept_gate`).

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
    listener: std::net::TcpListener,
    shared: Arc<Served>,
    gate: storm_cluster::accept_gate::AcceptGate,
}

/// What every connection's thread reads.
struct Served {
    token: Option<String>,
    refresh: Duration,
    snapshot: Arc<Mutex<Snapshot>>,
}

/// Scrapes being answered at once, in all and from one address: a host that opens
/// connections and says nothing holds a few places, never Prometheus's.
pub const MAX_CONNECTIONS: usize = 64;
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 8;

/// A request must arrive whole within this long, and within [`MAX_REQUEST_BYTES`].
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// A response: status, its reason phrase, content type, body, and whether it asks for a
/// bearer token.
struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
    challenge: bool,
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
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
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
            listener,
            shared: Arc::new(Served {
                token: opts.token,
                refresh,
                snapshot,
            }),
            gate: storm_cluster::accept_gate::AcceptGate::new(
                "the metrics exporter",
                MAX_CONNECTIONS,
                MAX_CONNECTIONS_PER_SOURCE,
            ),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Answers scrapes until the process ends: each connection on a thread of its own, one
    /// request each (`Connection: close`).
    pub fn serve(self) {
        for conn in self.listener.incoming() {
            let tcp = match conn {
                Ok(t) => t,
                Err(_) => {
                    // Out of descriptors or threads: waiting frees some.
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let Some(place) = tcp.peer_addr().ok().and_then(|a| self.gate.admit(a.ip())) else {
                continue;
            };
            let shared = self.shared.clone();
            let gate = self.gate.clone();
            let _ = std::thread::Builder::new()
                .name("metrics-scrape".into())
                .spawn(move || {
                    if let Err(e) = shared.answer_connection(tcp) {
                        gate.log_failure(None, &e);
                    }
                    drop(place);
                });
        }
    }
}

impl Served {
    /// Reads one request from `tcp` (whole within [`REQUEST_DEADLINE`] and
    /// [`MAX_REQUEST_BYTES`]) and answers it.
    fn answer_connection(&self, mut tcp: std::net::TcpStream) -> Result<(), String> {
        use std::io::{Read, Write};
        let deadline = Instant::now() + REQUEST_DEADLINE;
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || buf.len() >= MAX_REQUEST_BYTES {
                return Err("a request did not arrive whole in time, or is too large".into());
            }
            tcp.set_read_timeout(Some(left))
                .map_err(|e| e.to_string())?;
            match tcp.read(&mut chunk) {
                Ok(0) => return Err("the connection closed before its request".into()),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("reading a request: {e}")),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]);
        let mut lines = head.split("\r\n");
        let mut request_line = lines.next().unwrap_or("").split(' ');
        let method = request_line.next().unwrap_or("");
        let url = request_line.next().unwrap_or("");
        let authorization = lines.find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_string())
        });
        let authorized = self.authorized(authorization.as_deref());
        let r = self.answer(method, url, authorized);
        let reason = match r.status {
            200 => "OK",
            401 => "Unauthorized",
            404 => "Not Found",
            405 => "Method Not Allowed",
            _ => "Service Unavailable",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: \
             close\r\n",
            r.status,
            r.content_type,
            r.body.len()
        );
        if r.challenge {
            out.push_str("WWW-Authenticate: Bearer\r\n");
        }
        out.push_str("\r\n");
        let _ = tcp.set_write_timeout(Some(REQUEST_DEADLINE));
        tcp.write_all(out.as_bytes())
            .and_then(|()| tcp.write_all(r.body.as_bytes()))
            .map_err(|e| format!("answering a scrape: {e}"))
    }

    /// Whether a request with this `Authorization` value carries the token (always, without
    /// one).
    fn authorized(&self, authorization: Option<&str>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let given = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        constant_time_eq(given.as_bytes(), token.as_bytes())
    }

    fn answer(&self, method: &str, url: &str, authorized: bool) -> Response {
        let path = url.split('?').next().unwrap_or("");
        let plain = "text/plain; charset=utf-8";
        let text = |status: u16, body: String, content_type: &'static str| Response {
            status,
            content_type,
            body,
            challenge: false,
        };
        if !authorized {
            return Response {
                challenge: true,
                ..text(401, "a bearer token is required\n".into(), plain)
            };
        }
        match (method, path) {
            ("GET", "/metrics") => {
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
            ("GET", "/") => text(
                200,
                "storm metrics exporter: the machine manager's metrics are at /metrics\n".into(),
                plain,
            ),
            ("GET", _) => text(404, "not found: try /metrics\n".into(), plain),
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
