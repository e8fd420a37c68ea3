//! The PMI wire protocols on a task's `PMI_FD`: parsing requests and writing replies.
//!
//! * **PMI-1** ("simple PMI"): one `\n`-terminated line per message, space-separated
//!   `key=value` pairs, `cmd=` first (Flux RFC 13). The value of a `put` is the rest of the
//!   line after `value=`.
//! * **PMI-2**: a 6-character decimal length, then `;`-separated `key=value` pairs. A client
//!   still opens with the PMI-1 line `cmd=init pmi_version=2 pmi_subversion=0`.
//!
//! Nothing here does I/O: [`Framer`] cuts messages out of the bytes a socket gave, and the
//! reply builders return the bytes to write.

/// The longest message accepted, in either protocol. MPICH's own limit is 1,024 bytes per
/// PMI-1 line; PMI-2 puts may be longer.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// Which protocol a connection speaks; decided by its first line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    One,
    Two,
}

/// One request: its command and its other pairs, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub cmd: String,
    pub pairs: Vec<(String, String)>,
}

impl Request {
    /// The value of `key`, if the request has it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// What is wrong with bytes a task sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("a PMI message longer than {MAX_MESSAGE} bytes")]
    TooLong,
    #[error("a PMI-2 length prefix {0:?} that is not a number")]
    BadLength(String),
    #[error("a PMI message without a cmd= (or mcmd=) field")]
    NoCommand,
    #[error("a PMI message that is not text")]
    NotText,
}

/// Parses one PMI-1 line (without its `\n`).
pub fn parse_v1(line: &[u8]) -> Result<Request, WireError> {
    let line = std::str::from_utf8(line).map_err(|_| WireError::NotText)?;
    let line = line.trim_end_matches('\r');
    let mut pairs = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        // The value of `value=` (put) runs to the end of the line: it may hold spaces.
        if let Some(value) = rest.strip_prefix("value=") {
            pairs.push(("value".to_string(), value.to_string()));
            break;
        }
        let (word, tail) = rest.split_once(' ').unwrap_or((rest, ""));
        let (k, v) = word.split_once('=').unwrap_or((word, ""));
        pairs.push((k.to_string(), v.to_string()));
        rest = tail.trim_start();
    }
    take_command(pairs)
}

/// Parses the body of one PMI-2 message (after its length prefix).
pub fn parse_v2(body: &[u8]) -> Result<Request, WireError> {
    let body = std::str::from_utf8(body).map_err(|_| WireError::NotText)?;
    let mut pairs = Vec::new();
    // `;;` stands for a literal `;` inside a value (PMI-2 spec); split on single ones.
    let mut current = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ';' {
            if chars.peek() == Some(&';') {
                chars.next();
                current.push(';');
                continue;
            }
            if !current.is_empty() {
                let (k, v) = current.split_once('=').unwrap_or((&current, ""));
                pairs.push((k.to_string(), v.to_string()));
            }
            current.clear();
        } else {
            current.push(c);
        }
    }
    if !current.is_empty() {
        let (k, v) = current.split_once('=').unwrap_or((&current, ""));
        pairs.push((k.to_string(), v.to_string()));
    }
    take_command(pairs)
}

fn take_command(mut pairs: Vec<(String, String)>) -> Result<Request, WireError> {
    let at = pairs
        .iter()
        .position(|(k, _)| k == "cmd" || k == "mcmd")
        .ok_or(WireError::NoCommand)?;
    let (_, cmd) = pairs.remove(at);
    Ok(Request { cmd, pairs })
}

/// A PMI-1 reply line.
pub fn reply_v1(cmd: &str, pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = format!("cmd={cmd}");
    for (k, v) in pairs {
        out.push(' ');
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out.push('\n');
    out.into_bytes()
}

/// A PMI-2 reply: length prefix and `;`-terminated pairs (`;` in values doubled).
pub fn reply_v2(cmd: &str, pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut body = format!("cmd={cmd};");
    for (k, v) in pairs {
        body.push_str(k);
        body.push('=');
        body.push_str(&v.replace(';', ";;"));
        body.push(';');
    }
    let mut out = format!("{:<6}", body.len()).into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// Cuts the messages of one connection out of the bytes it sends.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
    /// `None` until the first line has been seen.
    version: Option<Version>,
}

impl Framer {
    pub fn version(&self) -> Option<Version> {
        self.version
    }

    /// Adds bytes read from the socket.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, if one has arrived. The first message is always a PMI-1
    /// line; its `pmi_version` decides how the following ones are framed.
    pub fn next_request(&mut self) -> Result<Option<Request>, WireError> {
        match self.version {
            None | Some(Version::One) => {
                let Some(end) = self.buf.iter().position(|&b| b == b'\n') else {
                    return if self.buf.len() > MAX_MESSAGE {
                        Err(WireError::TooLong)
                    } else {
                        Ok(None)
                    };
                };
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let req = parse_v1(&line[..end])?;
                if self.version.is_none() {
                    self.version = Some(if req.get("pmi_version") == Some("2") {
                        Version::Two
                    } else {
                        Version::One
                    });
                }
                Ok(Some(req))
            }
            Some(Version::Two) => {
                if self.buf.len() < 6 {
                    return Ok(None);
                }
                let prefix = String::from_utf8_lossy(&self.buf[..6]).into_owned();
                let len: usize = prefix
                    .trim()
                    .parse()
                    .map_err(|_| WireError::BadLength(prefix.clone()))?;
                if len > MAX_MESSAGE {
                    return Err(WireError::TooLong);
                }
                if self.buf.len() < 6 + len {
                    return Ok(None);
                }
                let msg: Vec<u8> = self.buf.drain(..6 + len).collect();
                parse_v2(&msg[6..]).map(Some)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_lines_parse_with_the_put_value_running_to_the_end() {
        let r = parse_v1(b"cmd=put kvsname=storm-1 key=k1 value=a b=c").unwrap();
        assert_eq!(r.cmd, "put");
        assert_eq!(r.get("kvsname"), Some("storm-1"));
        assert_eq!(r.get("key"), Some("k1"));
        assert_eq!(r.get("value"), Some("a b=c"));
        let r = parse_v1(b"cmd=barrier_in").unwrap();
        assert_eq!((r.cmd.as_str(), r.pairs.len()), ("barrier_in", 0));
        assert_eq!(parse_v1(b"key=x"), Err(WireError::NoCommand));
        assert_eq!(parse_v1(&[0xff, b'\n']), Err(WireError::NotText));
    }

    #[test]
    fn the_first_line_decides_the_framing_of_the_rest() {
        let mut f = Framer::default();
        f.push(b"cmd=init pmi_version=2 pmi_subversion=0\n");
        let body = "cmd=kvs-put;key=a;value=x;;y;";
        f.push(format!("{:<6}{body}", body.len()).as_bytes());
        f.push(b"14    cmd=kvs-f");
        assert_eq!(f.next_request().unwrap().unwrap().cmd, "init");
        assert_eq!(f.version(), Some(Version::Two));
        let put = f.next_request().unwrap().unwrap();
        assert_eq!(
            (put.cmd.as_str(), put.get("value")),
            ("kvs-put", Some("x;y"))
        );
        assert_eq!(
            f.next_request().unwrap(),
            None,
            "half a message waits for the rest"
        );
        f.push(b"ence;");
        assert_eq!(f.next_request().unwrap().unwrap().cmd, "kvs-fence");
    }

    #[test]
    fn replies_are_framed_as_their_protocol_asks() {
        assert_eq!(
            reply_v1("get_result", &[("rc", "0"), ("value", "v")]),
            b"cmd=get_result rc=0 value=v\n"
        );
        let r = reply_v2("kvs-get-response", &[("rc", "0"), ("value", "a;b")]);
        assert_eq!(r[..6], *format!("{:<6}", r.len() - 6).as_bytes());
        assert_eq!(&r[6..], b"cmd=kvs-get-response;rc=0;value=a;;b;");
    }

    #[test]
    fn endless_or_garbled_input_is_refused_not_buffered_for_ever() {
        let mut f = Framer::default();
        f.push(&vec![b'a'; MAX_MESSAGE + 1]);
        assert_eq!(f.next_request(), Err(WireError::TooLong));
        let mut f = Framer::default();
        f.push(b"cmd=init pmi_version=2\nabcdefcmd=x;");
        f.next_request().unwrap();
        assert!(matches!(f.next_request(), Err(WireError::BadLength(_))));
        let mut f = Framer::default();
        f.push(b"cmd=init pmi_version=2\n999999");
        f.next_request().unwrap();
        assert_eq!(f.next_request(), Err(WireError::TooLong));
    }
}
