//! Text from other users, made safe for a terminal.
//!
//! Job names, reasons and node names in `storm queue`, `storm history` and `storm nodes` come
//! from whoever submitted or configured them, and they reach every user's terminal. A name
//! holding a newline could forge a line of the listing (`999 root-backup 0 running`), and one
//! holding escape sequences could move the cursor, retitle the window or hide text. [`safe`]
//! shows every such character as a visible escape instead: C0 and C1 controls and DEL as
//! `\n`, `\t`, `\x1b`, `\u{9b}`, and the Unicode characters that reorder or hide text (bidi
//! overrides and isolates, zero-width ones) as `\u{…}`. JSON output needs none of this: the
//! JSON encoder escapes control characters itself.

use std::borrow::Cow;

/// Whether `c` would act on a terminal rather than print.
fn acts(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200b}'..='\u{200f}'      // zero-width spaces and joiners, directional marks
            | '\u{202a}'..='\u{202e}'    // bidi embeddings and overrides
            | '\u{2066}'..='\u{2069}'    // bidi isolates
            | '\u{feff}'                 // zero-width no-break space
        )
}

/// `text` with every character that would act on a terminal shown as an escape.
pub fn safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if acts(c) && (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if acts(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_left_alone() {
        assert!(matches!(safe("job-1 naïve ✓"), Cow::Borrowed(_)));
    }

    #[test]
    fn controls_and_reordering_characters_are_shown_not_acted_on() {
        assert_eq!(
            safe("a\nb\x1b[2Jc\u{9b}d\u{202e}e\u{7f}"),
            "a\\nb\\x1b[2Jc\\x9bd\\u{202e}e\\x7f"
        );
        for c in safe("\x07\x08\r\t\u{2066}\u{200b}").chars() {
            assert!(!acts(c), "{c:?} left in");
        }
    }
}
