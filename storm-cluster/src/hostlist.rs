//! Hostlist expressions, as Slurm writes them: `node[00-15]`, `rack[1-2]-n[1,3,5-7]`.
//!
//! A bracket holds comma-separated numbers and ranges. A range's lower bound sets the width:
//! `[007-010]` gives `007 008 009 010`. Several brackets multiply out left to right. A bracket
//! whose content is not digits, commas and dashes (an IPv6 address such as `[::1]:7001`) is
//! ordinary text.

/// Most names one expression (and one cluster file) may give: 262,144, above the largest
/// machines' node counts, far below what a typo in a range can ask for.
pub const MAX_EXPANSION: usize = 1 << 18;

/// Why an expression could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("hostlist {expr:?}: {why}")]
    Bad { expr: String, why: String },
}

/// The names `expr` stands for, in order.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    let bad = |why: String| HostlistError::Bad {
        expr: expr.to_string(),
        why,
    };
    let mut out = vec![String::new()];
    let mut rest = expr;
    while !rest.is_empty() {
        let group = rest.match_indices('[').find_map(|(open, _)| {
            let close = open + rest[open..].find(']')?;
            let inner = &rest[open + 1..close];
            is_numeric_group(inner).then_some((open, close, inner))
        });
        let Some((open, close, inner)) = group else {
            for name in &mut out {
                name.push_str(rest);
            }
            break;
        };
        let numbers = parse_group(inner).map_err(bad)?;
        let total = out.len().saturating_mul(numbers.len());
        if total > MAX_EXPANSION {
            return Err(bad(format!("stands for more than {MAX_EXPANSION} names")));
        }
        let prefix = &rest[..open];
        out = out
            .iter()
            .flat_map(|head| numbers.iter().map(move |n| format!("{head}{prefix}{n}")))
            .collect();
        rest = &rest[close + 1..];
    }
    Ok(out)
}

fn is_numeric_group(inner: &str) -> bool {
    !inner.is_empty()
        && inner
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b',' || b == b'-')
}

/// `1,3,5-7` as zero-padded strings.
fn parse_group(inner: &str) -> Result<Vec<String>, String> {
    let mut numbers = Vec::new();
    for part in inner.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let parse = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| format!("{part:?} is not a number or a range a-b"))
        };
        let (first, last) = (parse(lo)?, parse(hi)?);
        if first > last {
            return Err(format!("range {part:?} runs backwards"));
        }
        if numbers.len() as u64 + (last - first) >= MAX_EXPANSION as u64 {
            return Err(format!("stands for more than {MAX_EXPANSION} names"));
        }
        let width = lo.len();
        numbers.extend((first..=last).map(|n| format!("{n:0width$}")));
    }
    Ok(numbers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_lists_and_padding_expand_in_order() {
        assert_eq!(expand("node7").unwrap(), ["node7"]);
        assert_eq!(expand("n[8-11]").unwrap(), ["n8", "n9", "n10", "n11"]);
        assert_eq!(expand("n[008-010]").unwrap(), ["n008", "n009", "n010"]);
        assert_eq!(expand("n[1,3,5-6]x").unwrap(), ["n1x", "n3x", "n5x", "n6x"]);
        assert_eq!(
            expand("r[1-2]-n[0-1]").unwrap(),
            ["r1-n0", "r1-n1", "r2-n0", "r2-n1"]
        );
        assert_eq!(
            expand("10.0.0.[10-11]:7001").unwrap(),
            ["10.0.0.10:7001", "10.0.0.11:7001"]
        );
        let all = expand("node[00000-16383]").unwrap();
        assert_eq!(all.len(), 16_384);
        assert_eq!(
            (all[0].as_str(), all[16_383].as_str()),
            ("node00000", "node16383")
        );
    }

    #[test]
    fn ipv6_brackets_are_text() {
        assert_eq!(expand("[::1]:7001").unwrap(), ["[::1]:7001"]);
        assert_eq!(
            expand("[fd00::[1-2]]:7").unwrap(),
            ["[fd00::1]:7", "[fd00::2]:7"]
        );
    }

    #[test]
    fn mistakes_name_the_expression_and_the_problem() {
        for (expr, says) in [
            ("n[5-2]", "runs backwards"),
            ("n[1-]", "not a number"),
            ("n[,]", "not a number"),
            ("n[0-99999999999]", "more than"),
            ("a[0-1023]b[0-1023]c[0-1]", "more than"),
        ] {
            let e = expand(expr).unwrap_err().to_string();
            assert!(e.contains(expr) && e.contains(says), "{expr}: {e}");
        }
    }
}
