//! `storm metrics --listen ADDR`: the MM's metrics over HTTP, for a Prometheus server to
//! scrape.
//!
//! Every `GET /metrics` asks the MM afresh over its control socket and answers with what it
//! said, in the Prometheus text format (0.0.4). The MM itself opens no TCP port: this small server runs wherever
//! the operator starts it (usually beside the MM) and needs only to reach the control socket.
//! When the MM cannot be reached the scrape gets `503` with the reason, so Prometheus records
//! the target as down rather than reading stale numbers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use storm_cluster::control::{Client, Reply, Request};

/// The content type of the text the MM encodes: the classic Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The MM's metrics text, or why it could not be had.
pub fn fetch(socket: &Path) -> Result<String, String> {
    let client = Client::connect(socket)?;
    match client.call(&Request::Metrics)? {
        Reply::Metrics(text) => Ok(text),
        Reply::Error(e) => Err(e),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// A bound metrics server.
pub struct MetricsServer {
    server: tiny_http::Server,
    socket: PathBuf,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free port).
    pub fn bind(addr: SocketAddr, socket: PathBuf) -> Result<Self, String> {
        let server =
            tiny_http::Server::http(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        Ok(Self { server, socket })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.server_addr().to_ip()
    }

    /// Answers scrapes until the process ends.
    pub fn serve(self) {
        for request in self.server.incoming_requests() {
            let response = self.answer(request.method(), request.url());
            if let Err(e) = request.respond(response) {
                eprintln!("storm metrics: answering a scrape: {e}");
            }
        }
    }

    fn answer(
        &self,
        method: &tiny_http::Method,
        url: &str,
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
        match (method, path) {
            (tiny_http::Method::Get, "/metrics") => match fetch(&self.socket) {
                Ok(body) => text(200, body, CONTENT_TYPE),
                Err(e) => text(
                    503,
                    format!("the machine manager is unreachable: {e}\n"),
                    plain,
                ),
            },
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
