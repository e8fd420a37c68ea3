//! `storm nodes --where 'cpu>0.5,mem_avail<4G'`: which nodes' last samples match, with
//! Fountain's operators.
//!
//! A filter is clauses separated by commas, all of which must hold. Each clause is a field,
//! an operator and a value: `cpu>0.5`, `mem_avail lt 4G`, `name like node1*`. The operators
//! are Fountain's words `eq ne lt gt le ge like` or the symbols `= == != < > <= >=`.
//!
//! | field | what | unit |
//! | --- | --- | --- |
//! | `cpu` | CPU utilization over the last sample period (Fountain's `--cpu`) | 0.0 to 1.0 |
//! | `load`, `load5`, `load15` | load averages | |
//! | `mem_avail`, `mem_total`, `swap_used`, `spool_free`, `state_free` | memory and disk | bytes; `K M G T` (and `KB`…, powers of 1024) |
//! | `nm_cpu` | the NM's own CPU | fraction of one CPU |
//! | `jobs` | jobs on the node (the MM's count) | |
//! | `name` | the node's name | text (`like`: `*` and `?` wildcards) |
//! | `state` | `idle`, `allocated`, `down`, `drained`… | text |
//!
//! A node whose sample is stale (its NM stopped sampling: frozen, down or cut off) or missing
//! matches no clause on its figures: its last figures are not what it does now.

use storm_cluster::control::NodeInfo;
use storm_cluster::sample::NodeSample;

/// How a clause compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
    Like,
}

/// One clause: `field op value`.
#[derive(Debug, Clone, PartialEq)]
struct Clause {
    field: Field,
    op: Op,
    value: Value,
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Number(f64),
    Text(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Cpu,
    Load,
    Load5,
    Load15,
    MemAvail,
    MemTotal,
    SwapUsed,
    SpoolFree,
    StateFree,
    NmCpu,
    Jobs,
    Name,
    State,
}

const FIELDS: &[(&str, Field)] = &[
    ("cpu", Field::Cpu),
    ("load", Field::Load),
    ("load5", Field::Load5),
    ("load15", Field::Load15),
    ("mem_avail", Field::MemAvail),
    ("mem_total", Field::MemTotal),
    ("swap_used", Field::SwapUsed),
    ("spool_free", Field::SpoolFree),
    ("state_free", Field::StateFree),
    ("nm_cpu", Field::NmCpu),
    ("jobs", Field::Jobs),
    ("name", Field::Name),
    ("state", Field::State),
];

impl Field {
    fn is_text(self) -> bool {
        matches!(self, Field::Name | Field::State)
    }

    /// The figure of a fresh sample, `None` for a text field.
    fn figure(self, s: &NodeSample) -> Option<f64> {
        Some(match self {
            Field::Cpu => s.cpu_util as f64,
            Field::Load => s.load[0] as f64,
            Field::Load5 => s.load[1] as f64,
            Field::Load15 => s.load[2] as f64,
            Field::MemAvail => s.mem_avail as f64,
            Field::MemTotal => s.mem_total as f64,
            Field::SwapUsed => s.swap_used as f64,
            Field::SpoolFree => s.spool_free as f64,
            Field::StateFree => s.state_free as f64,
            Field::NmCpu => s.nm_cpu as f64,
            Field::Jobs | Field::Name | Field::State => return None,
        })
    }
}

/// A parsed `--where` filter.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeFilter {
    clauses: Vec<Clause>,
}

/// Splits a clause at its operator: (field, op, value).
fn split_clause(text: &str) -> Option<(&str, Op, &str)> {
    // Words first (`mem_avail gt 4G`), then symbols, longest first.
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.len() == 3 {
        let op = match words[1] {
            "eq" => Some(Op::Eq),
            "ne" => Some(Op::Ne),
            "lt" => Some(Op::Lt),
            "gt" => Some(Op::Gt),
            "le" => Some(Op::Le),
            "ge" => Some(Op::Ge),
            "like" => Some(Op::Like),
            _ => None,
        };
        if let Some(op) = op {
            return Some((words[0], op, words[2]));
        }
    }
    for (sym, op) in [
        (">=", Op::Ge),
        ("<=", Op::Le),
        ("!=", Op::Ne),
        ("==", Op::Eq),
        (">", Op::Gt),
        ("<", Op::Lt),
        ("=", Op::Eq),
    ] {
        if let Some((f, v)) = text.split_once(sym) {
            return Some((f.trim(), op, v.trim()));
        }
    }
    None
}

/// A number with an optional size suffix (`4G`, `512MB`, `1.5T`: powers of 1024).
fn number(text: &str) -> Option<f64> {
    let t = text.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (digits, scale) = match t.chars().last()? {
        'k' | 'K' => (&t[..t.len() - 1], 1024f64),
        'm' | 'M' => (&t[..t.len() - 1], 1024f64.powi(2)),
        'g' | 'G' => (&t[..t.len() - 1], 1024f64.powi(3)),
        't' | 'T' => (&t[..t.len() - 1], 1024f64.powi(4)),
        _ => (t, 1.0),
    };
    let v: f64 = digits.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v * scale)
}

/// Whether `text` matches the glob `pattern` (`*` any run, `?` one character).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

impl NodeFilter {
    /// Parses `cpu>0.5,mem_avail<4G`; the error names the clause and what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut clauses = Vec::new();
        for raw in text.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            let Some((name, op, value)) = split_clause(raw) else {
                return Err(format!(
                    "--where {raw:?}: a clause is FIELD OP VALUE, OP one of eq ne lt gt le ge \
                     like or = != < > <= >="
                ));
            };
            let Some(&(_, field)) = FIELDS.iter().find(|(n, _)| *n == name) else {
                let known: Vec<&str> = FIELDS.iter().map(|(n, _)| *n).collect();
                return Err(format!(
                    "--where {raw:?}: no field {name:?} (fields: {})",
                    known.join(", ")
                ));
            };
            let value = if field.is_text() {
                if !matches!(op, Op::Eq | Op::Ne | Op::Like) {
                    return Err(format!(
                        "--where {raw:?}: {name} is text: compare it with eq, ne or like"
                    ));
                }
                Value::Text(value.to_string())
            } else {
                if op == Op::Like {
                    return Err(format!("--where {raw:?}: like compares text, not {name}"));
                }
                match number(value) {
                    Some(v) => Value::Number(v),
                    None => {
                        return Err(format!(
                            "--where {raw:?}: {value:?} is not a number (sizes take K, M, G, T)"
                        ));
                    }
                }
            };
            clauses.push(Clause { field, op, value });
        }
        if clauses.is_empty() {
            return Err("--where: no clause".into());
        }
        Ok(Self { clauses })
    }

    /// Whether node `n` matches every clause.
    pub fn matches(&self, n: &NodeInfo) -> bool {
        let fresh = n.fresh_sample();
        self.clauses.iter().all(|c| {
            let (have, want) = match (&c.value, c.field) {
                (Value::Text(want), Field::Name) => {
                    return text_holds(c.op, &n.name, want);
                }
                (Value::Text(want), _) => return text_holds(c.op, n.state.as_str(), want),
                (Value::Number(want), Field::Jobs) => (Some(n.jobs.len() as f64), *want),
                (Value::Number(want), f) => (fresh.and_then(|s| f.figure(s)), *want),
            };
            let Some(have) = have else {
                return false;
            };
            match c.op {
                Op::Eq => have == want,
                Op::Ne => have != want,
                Op::Lt => have < want,
                Op::Gt => have > want,
                Op::Le => have <= want,
                Op::Ge => have >= want,
                Op::Like => false,
            }
        })
    }
}

fn text_holds(op: Op, have: &str, want: &str) -> bool {
    match op {
        Op::Eq => have == want,
        Op::Ne => have != want,
        Op::Like => glob(want, have),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use storm_cluster::control::NodeState;
    use storm_cluster::sample::NodeRecords;

    fn node(name: &str, cpu: f32, mem_avail: u64, stale: bool) -> NodeInfo {
        NodeInfo {
            id: 0,
            name: name.into(),
            state: NodeState::Idle,
            jobs: vec![],
            reason: None,
            records: Some(NodeRecords {
                sample: Some(NodeSample {
                    seq: 1,
                    cpu_util: cpu,
                    mem_total: 64 << 30,
                    mem_avail,
                    ..Default::default()
                }),
                stale,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn fountains_operators_and_sizes() {
        let f = NodeFilter::parse("cpu>0.5,mem_avail<4G").unwrap();
        assert!(f.matches(&node("n1", 0.9, 1 << 30, false)));
        assert!(!f.matches(&node("n1", 0.9, 8 << 30, false)));
        assert!(!f.matches(&node("n1", 0.1, 1 << 30, false)));
        let words = NodeFilter::parse("mem_avail gt 1GB, cpu le 0.5").unwrap();
        assert!(words.matches(&node("n1", 0.5, 2 << 30, false)));
        assert!(!words.matches(&node("n1", 0.5, 512 << 20, false)));
        let like = NodeFilter::parse("name like node1*").unwrap();
        assert!(like.matches(&node("node12", 0.0, 0, false)));
        assert!(!like.matches(&node("node2", 0.0, 0, false)));
        assert!(
            NodeFilter::parse("state eq idle")
                .unwrap()
                .matches(&node("a", 0.0, 0, true))
        );
        assert!(
            NodeFilter::parse("jobs=0")
                .unwrap()
                .matches(&node("a", 0.0, 0, false))
        );
    }

    #[test]
    fn a_stale_sample_matches_no_clause_on_its_figures() {
        let busy_then = node("n1", 0.9, 1 << 30, true);
        assert!(!NodeFilter::parse("cpu>0.5").unwrap().matches(&busy_then));
        assert!(!NodeFilter::parse("cpu<0.5").unwrap().matches(&busy_then));
        let mut never = node("n2", 0.0, 0, false);
        never.records = None;
        assert!(!NodeFilter::parse("cpu<0.5").unwrap().matches(&never));
    }

    #[test]
    fn bad_filters_name_the_problem() {
        let e = NodeFilter::parse("cpux>1").unwrap_err();
        assert!(e.contains("no field \"cpux\""), "{e}");
        let e = NodeFilter::parse("cpu>lots").unwrap_err();
        assert!(e.contains("not a number"), "{e}");
        let e = NodeFilter::parse("name>3").unwrap_err();
        assert!(e.contains("is text"), "{e}");
        let e = NodeFilter::parse("cpu").unwrap_err();
        assert!(e.contains("FIELD OP VALUE"), "{e}");
        assert!(NodeFilter::parse(" , ").is_err());
        assert!(NodeFilter::parse("cpu like 1").is_err());
    }

    #[test]
    fn globs() {
        assert!(glob("n*3", "node3"));
        assert!(glob("n?de*", "node12"));
        assert!(!glob("n?de", "nodes"));
        assert!(glob("*", ""));
    }
}
