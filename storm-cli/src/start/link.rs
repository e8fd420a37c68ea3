//! The link between `storm start`'s front end and a node agent it did not start itself.
//!
//! Under `srun --mpi=pmi2 -N K storm start` the step's own tasks are the node agents: the
//! first task is the front end, and they meet through Slurm's PMI ([`super::bootstrap`]).
//! The front end puts where it listens and a [`Token`] in the step's PMI key-value space,
//! which only the step's own tasks can read; each agent connects there and its first line,
//! [`hello_line`], proves with the token that it is one of them and names its node. After
//! that the link carries what srun's standard streams carry otherwise (the agent's report
//! up, the instance's files down, [`super::report`]), and its end is the instance's end.
//!
//! Attacker: anyone who can reach the front end's port (a local user, a network peer). They
//! do not have the token: their connection is closed after one bounded line, and they cannot
//! take a node's place (each node is linked once) or hold the front end up (a deadline on
//! the line, a bound on links still saying hello).

use std::io::Read;

use thiserror::Error;

const HELLO_TAG: &str = "storm-link";

/// The longest hello line read.
pub const MAX_HELLO: usize = 256;

/// The secret an agent shows the front end: 32 random bytes, in hex.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Why a link or a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LinkError {
    #[error("not a storm-link hello")]
    NotAHello,
    #[error("a wrong token")]
    WrongToken,
    #[error("node index {index} is not one of the instance's {nodes} nodes")]
    NoSuchNode { index: u32, nodes: usize },
    #[error("a token must be 64 hex digits")]
    MalformedToken,
}

impl Token {
    /// A new random token.
    pub fn new() -> Self {
        // ThreadRng: a CSPRNG seeded from the operating system.
        let bytes: [u8; 32] = rand::random();
        Token(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The token written as [`Token::as_str`] gives it.
    pub fn parse(text: &str) -> Result<Self, LinkError> {
        if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(Token(text.to_ascii_lowercase()))
        } else {
            Err(LinkError::MalformedToken)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `other` is this token, in time that does not depend on where they differ.
    fn matches(&self, other: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), other.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
    }
}

impl Default for Token {
    fn default() -> Self {
        Self::new()
    }
}

/// The agent's first line on the link: the token and its node's index.
pub fn hello_line(token: &Token, index: u32) -> String {
    format!("{HELLO_TAG} {} {index}\n", token.as_str())
}

/// The node index a hello line names, if its token is `token` and the index is one of
/// `nodes` nodes.
pub fn check_hello(line: &str, token: &Token, nodes: usize) -> Result<u32, LinkError> {
    let mut words = line.trim_end().split(' ');
    let (Some(HELLO_TAG), Some(shown), Some(index), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(LinkError::NotAHello);
    };
    if !token.matches(shown) {
        return Err(LinkError::WrongToken);
    }
    let index: u32 = index.parse().map_err(|_| LinkError::NotAHello)?;
    if index as usize >= nodes {
        return Err(LinkError::NoSuchNode { index, nodes });
    }
    Ok(index)
}

/// Reads one line of at most [`MAX_HELLO`] bytes from `r`, a byte at a time (nothing past
/// it is consumed); `None` at the end, on an error, or when the line is longer.
pub fn read_hello(r: &mut impl Read) -> Option<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < MAX_HELLO {
        match r.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => return String::from_utf8(line).ok(),
            Ok(1) => line.push(byte[0]),
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a hello with the instance's token and one of its nodes' indices is a link.
    #[test]
    fn a_hello_needs_the_token_and_a_node_of_the_instance() {
        let token = Token::new();
        assert_eq!(check_hello(&hello_line(&token, 2), &token, 4), Ok(2));
        let other = Token::new();
        assert_ne!(token, other, "tokens are random");
        assert_eq!(
            check_hello(&hello_line(&other, 2), &token, 4),
            Err(LinkError::WrongToken)
        );
        assert_eq!(
            check_hello(&hello_line(&token, 4), &token, 4),
            Err(LinkError::NoSuchNode { index: 4, nodes: 4 })
        );
        for bad in [
            "",
            "storm-link",
            "GET / HTTP/1.1",
            &format!("storm-link {} 1 extra", token.as_str()),
            &format!("storm-link {} x", token.as_str()),
        ] {
            assert!(check_hello(bad, &token, 4).is_err(), "{bad:?}");
        }
        // A prefix of the token is not the token.
        let short = format!("storm-link {} 0", &token.as_str()[..63]);
        assert_eq!(check_hello(&short, &token, 4), Err(LinkError::WrongToken));
    }

    #[test]
    fn tokens_parse_back_and_malformed_ones_are_refused() {
        let t = Token::new();
        assert_eq!(Token::parse(t.as_str()), Ok(t));
        assert_eq!(Token::parse("abc"), Err(LinkError::MalformedToken));
        assert_eq!(
            Token::parse(&"g".repeat(64)),
            Err(LinkError::MalformedToken)
        );
    }

    /// A hello is read up to its newline and no further, and a line too long is no hello.
    #[test]
    fn a_hello_is_read_bounded_and_leaves_what_follows() {
        let mut input: &[u8] = b"storm-link abc 1\nnext line\n";
        assert_eq!(read_hello(&mut input).as_deref(), Some("storm-link abc 1"));
        assert_eq!(input, b"next line\n");
        let long = vec![b'a'; MAX_HELLO + 10];
        assert_eq!(read_hello(&mut long.as_slice()), None);
        assert_eq!(read_hello(&mut &b"no newline"[..]), None);
    }
}
