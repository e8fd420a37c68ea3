//! A deterministic mutator: valid inputs (a target's seeds) changed a few edits at a time.
//!
//! Not coverage-guided, so it finds what lies a few edits from a valid message: flipped
//! bits, lengths and counts made huge or zero, truncations, duplicated and spliced ranges,
//! and the target's own tokens inserted (brackets and dashes for hostlists, keys for the
//! cluster file). Seeds are valid encodings, so most mutants get past the first bytes and
//! into the decoder's depths. The same seed number gives the same inputs on every machine.

/// splitmix64: small, fast and good enough to pick edits.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Byte patterns that sit on decoders' edges: bincode's varint markers (251 = u16, 252 =
/// u32, 253 = u64 follow), the largest values of each width, zero, and sign bits.
const EDGES: &[&[u8]] = &[
    &[0],
    &[0xff],
    &[0x7f],
    &[0x80],
    &[250],
    &[251, 0xff, 0xff],
    &[252, 0xff, 0xff, 0xff, 0xff],
    &[253, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    &[253, 0, 0, 0, 0, 0, 0, 0, 0x80],
    &[0xff, 0xff, 0xff, 0xff],
    &[0, 0, 0, 0x80],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
];

/// Makes one input from `base`, with 1 to 4 edits; `others` are spliced from, `dictionary`
/// entries inserted. The result is at most `max_len` bytes.
pub fn mutate(
    rng: &mut Rng,
    base: &[u8],
    others: &[Vec<u8>],
    dictionary: &[&[u8]],
    max_len: usize,
) -> Vec<u8> {
    let mut out = base.to_vec();
    let edits = 1 + rng.below(4);
    for _ in 0..edits {
        edit(rng, &mut out, others, dictionary);
    }
    out.truncate(max_len);
    out
}

fn edit(rng: &mut Rng, out: &mut Vec<u8>, others: &[Vec<u8>], dictionary: &[&[u8]]) {
    let len = out.len();
    match rng.below(10) {
        0 if len > 0 => {
            let i = rng.below(len);
            out[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            out[i] = rng.next_u64() as u8;
        }
        2 => {
            let edge = EDGES[rng.below(EDGES.len())];
            let at = rng.below(len + 1);
            if rng.chance(2) {
                overwrite(out, at, edge);
            } else {
                insert(out, at, edge);
            }
        }
        3 => {
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            insert(out, rng.below(len + 1), &bytes);
        }
        4 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(16));
            out.drain(at..at + n);
        }
        5 if len > 0 => {
            out.truncate(rng.below(len));
        }
        6 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(32));
            let copy = out[at..at + n].to_vec();
            insert(out, rng.below(len + 1), &copy);
        }
        7 if !others.is_empty() => {
            let other = &others[rng.below(others.len())];
            if !other.is_empty() {
                let from = rng.below(other.len());
                let n = 1 + rng.below((other.len() - from).min(64));
                let at = rng.below(len + 1);
                out.truncate(at.max(rng.below(len + 1)));
                insert(out, at.min(out.len()), &other[from..from + n]);
            }
        }
        8 | 9 if !dictionary.is_empty() => {
            let word = dictionary[rng.below(dictionary.len())];
            let at = rng.below(len + 1);
            if rng.chance(3) {
                overwrite(out, at, word);
            } else {
                insert(out, at, word);
            }
        }
        _ => {
            let i = rng.below(len + 1);
            insert(out, i, &[rng.next_u64() as u8]);
        }
    }
}

fn insert(out: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    out.splice(at..at, bytes.iter().copied());
}

fn overwrite(out: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    let end = (at + bytes.len()).min(out.len());
    out.splice(at..end, bytes.iter().copied());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_inputs() {
        let base = b"0-7,12".to_vec();
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..100)
                .map(|_| mutate(&mut rng, &base, &[], &[b"-"], 64))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn mutants_differ_from_their_base_and_respect_the_length_cap() {
        let base = vec![1u8; 40];
        let mut rng = Rng::new(1);
        let mut changed = 0;
        for _ in 0..1000 {
            let m = mutate(&mut rng, &base, &[vec![9u8; 10]], &[b"xyz"], 48);
            assert!(m.len() <= 48);
            changed += usize::from(m != base);
        }
        assert!(
            changed > 900,
            "only {changed} of 1000 mutants differ from the base"
        );
    }
}
