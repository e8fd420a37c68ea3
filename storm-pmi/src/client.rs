//! The PMI-1 wire protocol from the task's side, over any byte stream: one request line out,
//! one reply line back (lock-step), as MPICH's simple PMI client speaks it.

use std::io::{self, Read, Write};

/// Why a PMI call failed.
#[derive(Debug)]
pub enum Error {
    Io(io::Error),
    /// The server answered `rc` other than 0.
    Refused {
        cmd: String,
        msg: String,
    },
    /// The server's reply was not the one expected.
    Malformed(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "the PMI socket failed: {e}"),
            Error::Refused { cmd, msg } => write!(f, "the PMI server refused {cmd}: {msg}"),
            Error::Malformed(what) => write!(f, "a malformed PMI reply: {what}"),
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// The longest reply line accepted.
const MAX_REPLY: usize = 64 * 1024;

/// One reply's `key=value` pairs, `cmd` included. A `value=` runs to the end of the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply(Vec<(String, String)>);

impl Reply {
    pub fn parse(line: &str) -> Result<Self, Error> {
        let mut pairs = Vec::new();
        let mut rest = line.trim_end_matches(['\n', '\r']).trim_start();
        while !rest.is_empty() {
            if let Some(value) = rest.strip_prefix("value=") {
                pairs.push(("value".to_string(), value.to_string()));
                break;
            }
            let (word, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let (k, v) = word
                .split_once('=')
                .ok_or_else(|| Error::Malformed(format!("{word:?} in {line:?}")))?;
            pairs.push((k.to_string(), v.to_string()));
            rest = tail.trim_start();
        }
        Ok(Reply(pairs))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, key: &str) -> Result<i32, Error> {
        self.get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::Malformed(format!("no number {key}= in {:?}", self.0)))
    }
}

/// What the server said at `init`, and the stream to it.
pub struct Client<S> {
    stream: S,
    /// Bytes read past the last reply's end.
    pending: Vec<u8>,
    pub rank: i32,
    pub size: i32,
    pub appnum: i32,
    pub universe_size: i32,
    pub kvsname: String,
    pub kvsname_max: i32,
    pub key_max: i32,
    pub value_max: i32,
}

impl<S: Read + Write> Client<S> {
    /// Opens PMI-1 on `stream` for `rank` of `size` and asks what a client needs to know.
    pub fn init(stream: S, rank: i32, size: i32) -> Result<Self, Error> {
        let mut c = Client {
            stream,
            pending: Vec::new(),
            rank,
            size,
            appnum: 0,
            universe_size: size,
            kvsname: String::new(),
            kvsname_max: 256,
            key_max: 64,
            value_max: 1024,
        };
        c.call(
            "cmd=init pmi_version=1 pmi_subversion=1",
            "response_to_init",
        )?;
        let maxes = c.call("cmd=get_maxes", "maxes")?;
        c.kvsname_max = maxes.number("kvsname_max")?;
        c.key_max = maxes.number("keylen_max")?;
        c.value_max = maxes.number("vallen_max")?;
        c.appnum = c.call("cmd=get_appnum", "appnum")?.number("appnum")?;
        c.universe_size = c
            .call("cmd=get_universe_size", "universe_size")?
            .number("size")?;
        c.kvsname = c
            .call("cmd=get_my_kvsname", "my_kvsname")?
            .get("kvsname")
            .ok_or_else(|| Error::Malformed("no kvsname".into()))?
            .to_string();
        Ok(c)
    }

    pub fn put(&mut self, key: &str, value: &str) -> Result<(), Error> {
        check_word("key", key)?;
        if value.contains('\n') {
            return Err(Error::Malformed("a value with a newline".into()));
        }
        let kvs = self.kvsname.clone();
        self.call(
            &format!("cmd=put kvsname={kvs} key={key} value={value}"),
            "put_result",
        )
        .map(drop)
    }

    /// The value of `key` after the last barrier, or `None` if no rank put it.
    pub fn get(&mut self, key: &str) -> Result<Option<String>, Error> {
        check_word("key", key)?;
        let kvs = self.kvsname.clone();
        match self.call(&format!("cmd=get kvsname={kvs} key={key}"), "get_result") {
            Ok(reply) => Ok(Some(reply.get("value").unwrap_or("").to_string())),
            Err(Error::Refused { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits until every rank of the job is in the barrier; every put before it is then
    /// visible to every rank's `get`.
    pub fn barrier(&mut self) -> Result<(), Error> {
        self.call("cmd=barrier_in", "barrier_out").map(drop)
    }

    pub fn finalize(&mut self) -> Result<(), Error> {
        self.call("cmd=finalize", "finalize_ack").map(drop)
    }

    /// Asks the server to end the job with `code`; no reply comes.
    pub fn abort(&mut self, code: i32, msg: &str) -> Result<(), Error> {
        // A PMI-1 value other than put's runs to the next space.
        let msg: String = msg
            .chars()
            .map(|c| if c.is_whitespace() { '_' } else { c })
            .collect();
        let line = format!("cmd=abort exitcode={code} msg={msg}\n");
        self.stream.write_all(line.as_bytes())?;
        Ok(())
    }

    fn call(&mut self, request: &str, expect: &str) -> Result<Reply, Error> {
        self.stream.write_all(format!("{request}\n").as_bytes())?;
        let line = self.read_line()?;
        let reply = Reply::parse(&line)?;
        if reply.get("cmd") != Some(expect) {
            return Err(Error::Malformed(format!("{line:?} answering {request:?}")));
        }
        match reply.get("rc") {
            Some("0") | None => Ok(reply),
            Some(_) => Err(Error::Refused {
                cmd: expect.to_string(),
                msg: reply.get("msg").unwrap_or("no reason given").to_string(),
            }),
        }
    }

    fn read_line(&mut self) -> Result<String, Error> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return String::from_utf8(line)
                    .map_err(|_| Error::Malformed("a reply that is not text".into()));
            }
            if self.pending.len() > MAX_REPLY {
                return Err(Error::Malformed(format!(
                    "a reply longer than {MAX_REPLY} bytes"
                )));
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(Error::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }
}

/// PMI-1 separates fields by spaces: a key may hold neither spaces nor `=`.
fn check_word(what: &str, word: &str) -> Result<(), Error> {
    if word.is_empty() || word.contains([' ', '=', '\n']) {
        return Err(Error::Malformed(format!(
            "the {what} {word:?} is empty or holds a space, '=' or newline"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixStream;

    /// A scripted server: answers each request line with the next reply.
    fn serve(
        script: Vec<(&'static str, &'static str)>,
    ) -> (UnixStream, std::thread::JoinHandle<()>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let handle = std::thread::spawn(move || {
            let mut reader = BufReader::new(theirs.try_clone().unwrap());
            let mut w = theirs;
            for (want, reply) in script {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                assert_eq!(line.trim_end(), want);
                if !reply.is_empty() {
                    w.write_all(reply.as_bytes()).unwrap();
                }
            }
        });
        (ours, handle)
    }

    const INIT: [(&str, &str); 5] = [
        (
            "cmd=init pmi_version=1 pmi_subversion=1",
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
        ),
        (
            "cmd=get_maxes",
            "cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n",
        ),
        ("cmd=get_appnum", "cmd=appnum rc=0 appnum=0\n"),
        ("cmd=get_universe_size", "cmd=universe_size rc=0 size=4\n"),
        (
            "cmd=get_my_kvsname",
            "cmd=my_kvsname rc=0 kvsname=storm-9\n",
        ),
    ];

    #[test]
    fn a_client_speaks_the_pmi1_lines_and_reads_the_replies() {
        let mut script = INIT.to_vec();
        script.extend([
            (
                "cmd=put kvsname=storm-9 key=card-1 value=tcp://x y",
                "cmd=put_result rc=0\n",
            ),
            ("cmd=barrier_in", "cmd=barrier_out rc=0\n"),
            (
                "cmd=get kvsname=storm-9 key=card-0",
                "cmd=get_result rc=0 value=a b=c\n",
            ),
            (
                "cmd=get kvsname=storm-9 key=nope",
                "cmd=get_result rc=-1 msg=key_not_found\n",
            ),
            ("cmd=finalize", "cmd=finalize_ack rc=0\n"),
        ]);
        let (stream, server) = serve(script);
        let mut c = Client::init(stream, 1, 4).unwrap();
        assert_eq!(
            (c.kvsname.as_str(), c.universe_size, c.value_max),
            ("storm-9", 4, 1024)
        );
        c.put("card-1", "tcp://x y").unwrap();
        c.barrier().unwrap();
        assert_eq!(c.get("card-0").unwrap().as_deref(), Some("a b=c"));
        assert_eq!(c.get("nope").unwrap(), None);
        c.finalize().unwrap();
        server.join().unwrap();
    }

    #[test]
    fn refusals_and_bad_replies_are_errors_naming_them() {
        let mut script = INIT[..1].to_vec();
        script.push(("cmd=get_maxes", "cmd=something_else rc=0\n"));
        let (stream, server) = serve(script);
        let err = Client::init(stream, 0, 1).err().unwrap().to_string();
        assert!(err.contains("something_else"), "{err}");
        server.join().unwrap();

        let (stream, server) = serve(vec![(
            "cmd=init pmi_version=1 pmi_subversion=1",
            "cmd=response_to_init rc=-1 msg=this_job_serves_PMI-2_only\n",
        )]);
        let err = Client::init(stream, 0, 1).err().unwrap().to_string();
        assert!(err.contains("PMI-2_only"), "{err}");
        server.join().unwrap();

        let (stream, server) = serve(INIT.to_vec());
        let mut c = Client::init(stream, 0, 1).unwrap();
        assert!(c.put("a key", "v").is_err(), "a key with a space");
        server.join().unwrap();
        drop(c);
    }
}
