//! Job dependencies (`storm-submit --dependency`), as Slurm writes them: `afterok:12:13`,
//! `afterany:12`, `afternotok:12`, `after:12` and `singleton`, joined by `,` (all must hold)
//! or by `?` (any one suffices).
//!
//! The MM holds a job with a dependency out of the queue until [`Dependency::evaluate`] says
//! it is met, and ends it, with the reason, once it says it never can be. What each job it
//! names is doing is the MM's to tell ([`Known`]); this module only parses, prints and judges.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::control::JobRef;
use crate::messages::JobId;

/// Job ids one dependency may name, all terms together: each is looked up every time the
/// MM judges the job, so a request cannot make that arbitrarily long.
pub const MAX_DEPENDENCY_JOBS: usize = 1000;

/// What a term waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Condition {
    /// `after`: each job has started (or ended).
    After,
    /// `afterany`: each job has ended, however it ended.
    AfterAny,
    /// `afterok`: each job has ended with exit code 0.
    AfterOk,
    /// `afternotok`: each job has ended otherwise (failed, cancelled, timed out, node lost).
    AfterNotOk,
    /// `singleton`: every earlier job of the same user with the same name has ended.
    Singleton,
}

impl Condition {
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::After => "after",
            Condition::AfterAny => "afterany",
            Condition::AfterOk => "afterok",
            Condition::AfterNotOk => "afternotok",
            Condition::Singleton => "singleton",
        }
    }
}

/// One `condition:id:id…` term (`singleton` names no job). A job is an id (an array's id:
/// all its elements) or one element of an array (`12_3`); the MM turns each into the ids of
/// the jobs it stands for when it accepts the dependent job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Term {
    pub condition: Condition,
    pub jobs: Vec<JobRef>,
}

/// A job's dependency: its terms, all of which must hold (`,`), or any one of them (`?`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    pub terms: Vec<Term>,
    /// Joined by `?`: one met term suffices.
    pub any: bool,
}

/// What the MM knows of a job a dependency names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// Neither waiting, running nor in the history: it never existed, or ended so long ago
    /// that its record is gone.
    Unknown,
    /// Accepted, not started.
    Waiting,
    /// Its tasks may run.
    Started,
    /// Ended: `ok` when with exit code 0; `how` says how, for reasons ("failed with exit
    /// code 1").
    Ended { ok: bool, how: String },
}

/// Whether a dependency holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Met,
    /// Not yet: why, for `storm queue`.
    Waiting(String),
    /// It never will: why, for the job's end.
    Never(String),
}

impl Dependency {
    /// Every job the dependency names.
    pub fn jobs(&self) -> impl Iterator<Item = JobRef> + '_ {
        self.terms.iter().flat_map(|t| t.jobs.iter().copied())
    }

    /// Whether it has a `singleton` term.
    pub fn has_singleton(&self) -> bool {
        self.terms
            .iter()
            .any(|t| t.condition == Condition::Singleton)
    }

    /// Judges the dependency: `known` tells what each named job is doing; `earlier_namesake`
    /// is an earlier unfinished job of the same user and name, if there is one (for
    /// `singleton`). An element named by index (`12_3`) that was never turned into its job's
    /// id is not known.
    pub fn evaluate(
        &self,
        known: impl Fn(JobId) -> Known,
        earlier_namesake: Option<JobId>,
    ) -> Verdict {
        let verdicts = self
            .terms
            .iter()
            .map(|t| t.evaluate(&known, earlier_namesake));
        if self.any {
            let mut first_wait = None;
            let mut nevers = Vec::new();
            for v in verdicts {
                match v {
                    Verdict::Met => return Verdict::Met,
                    Verdict::Waiting(w) => {
                        first_wait.get_or_insert(w);
                    }
                    Verdict::Never(n) => nevers.push(n),
                }
            }
            match first_wait {
                Some(w) => Verdict::Waiting(w),
                None => Verdict::Never(nevers.join("; ")),
            }
        } else {
            let mut first_wait = None;
            for v in verdicts {
                match v {
                    Verdict::Met => {}
                    Verdict::Waiting(w) => {
                        first_wait.get_or_insert(w);
                    }
                    never @ Verdict::Never(_) => return never,
                }
            }
            first_wait.map_or(Verdict::Met, Verdict::Waiting)
        }
    }
}

impl Term {
    fn evaluate(
        &self,
        known: &impl Fn(JobId) -> Known,
        earlier_namesake: Option<JobId>,
    ) -> Verdict {
        let text = self.to_string();
        if self.condition == Condition::Singleton {
            return match earlier_namesake {
                None => Verdict::Met,
                Some(j) => Verdict::Waiting(format!(
                    "{text}: job {j}, of the same user and name, has not ended"
                )),
            };
        }
        let mut waiting = None;
        for &named in &self.jobs {
            let (job, state) = match named {
                JobRef::Id(id) => (named, known(id)),
                JobRef::Element { .. } => (named, Known::Unknown),
            };
            let outcome = match (self.condition, &state) {
                (Condition::After, Known::Started | Known::Ended { .. }) => Verdict::Met,
                (Condition::After, Known::Waiting) => {
                    Verdict::Waiting(format!("{text}: job {job} has not started"))
                }
                (Condition::AfterAny, Known::Ended { .. }) => Verdict::Met,
                (Condition::AfterOk, Known::Ended { ok: true, .. }) => Verdict::Met,
                (Condition::AfterNotOk, Known::Ended { ok: false, .. }) => Verdict::Met,
                (Condition::AfterOk, Known::Ended { ok: false, how })
                | (Condition::AfterNotOk, Known::Ended { ok: true, how }) => {
                    return Verdict::Never(format!("{text} can never be met: job {job} {how}"));
                }
                // `after` and `afterany` ask only that it be over; a job whose record is gone
                // is.
                (Condition::After | Condition::AfterAny, Known::Unknown) => Verdict::Met,
                (_, Known::Unknown) => {
                    return Verdict::Never(format!(
                        "{text} can never be met: how job {job} ended is no longer known"
                    ));
                }
                (_, Known::Waiting | Known::Started) => {
                    Verdict::Waiting(format!("{text}: job {job} has not ended"))
                }
                (Condition::Singleton, _) => unreachable!("handled above"),
            };
            if let Verdict::Waiting(w) = outcome {
                waiting.get_or_insert(w);
            }
        }
        waiting.map_or(Verdict::Met, Verdict::Waiting)
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.condition.as_str())?;
        for j in &self.jobs {
            write!(f, ":{j}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = if self.any { "?" } else { "," };
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(sep)?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Dependency {
    type Err = String;

    /// Parses Slurm's `--dependency` text. Errors name the part that is wrong.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err(
                "--dependency is empty (examples: afterok:12, afterany:12:13, singleton)".into(),
            );
        }
        if text.contains(',') && text.contains('?') {
            return Err(format!(
                "--dependency {text:?} mixes ',' (all must hold) and '?' (any suffices); use one"
            ));
        }
        let any = text.contains('?');
        let mut terms = Vec::new();
        for part in text.split([',', '?']) {
            terms.push(parse_term(part)?);
        }
        let named: usize = terms.iter().map(|t: &Term| t.jobs.len()).sum();
        if named > MAX_DEPENDENCY_JOBS {
            return Err(format!(
                "--dependency names {named} jobs, over the limit of {MAX_DEPENDENCY_JOBS}"
            ));
        }
        Ok(Dependency { terms, any })
    }
}

fn parse_term(part: &str) -> Result<Term, String> {
    let mut fields = part.split(':');
    let name = fields.next().unwrap_or_default();
    let condition = match name {
        "after" => Condition::After,
        "afterany" => Condition::AfterAny,
        "afterok" => Condition::AfterOk,
        "afternotok" => Condition::AfterNotOk,
        "singleton" => Condition::Singleton,
        "" => return Err(format!("--dependency term {part:?} is empty")),
        other => {
            return Err(format!(
                "unknown --dependency condition {other:?} (expected after, afterany, afterok, \
                 afternotok or singleton)"
            ));
        }
    };
    let mut jobs = Vec::new();
    for f in fields {
        if f.contains('+') {
            return Err(format!(
                "--dependency {part:?}: a delay after a job (+minutes) is not supported"
            ));
        }
        // A job's id (an array's: all its elements), or an array's element (`12_3`).
        let job: JobRef = f
            .parse()
            .map_err(|e| format!("--dependency {part:?}: {e}"))?;
        jobs.push(job);
    }
    match (condition, jobs.is_empty()) {
        (Condition::Singleton, false) => Err(format!(
            "--dependency {part:?}: singleton names no job (it waits for the earlier jobs of \
             the same user and name)"
        )),
        (Condition::Singleton, true) => Ok(Term { condition, jobs }),
        (_, true) => Err(format!(
            "--dependency {part:?} names no job (example: {name}:12)"
        )),
        (_, false) => Ok(Term { condition, jobs }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(s: &str) -> Dependency {
        s.parse().unwrap()
    }

    fn ended(ok: bool) -> Known {
        Known::Ended {
            ok,
            how: if ok {
                "completed".into()
            } else {
                "failed with exit code 1".into()
            },
        }
    }

    #[test]
    fn slurm_texts_parse_and_print_back() {
        for text in [
            "afterok:12",
            "afterok:12:13,afterany:14",
            "afternotok:3?after:4",
            "singleton",
            "afterany:1,singleton",
        ] {
            assert_eq!(dep(text).to_string(), text);
        }
        assert_eq!(
            dep("afterok:12:13_4").jobs().collect::<Vec<_>>(),
            [
                JobRef::Id(12),
                JobRef::Element {
                    array: 13,
                    index: 4
                }
            ]
        );
        assert_eq!(
            dep("afterany:7_0?after:8").to_string(),
            "afterany:7_0?after:8"
        );
        assert!(dep("afterany:1,singleton").has_singleton());
    }

    #[test]
    fn bad_texts_are_refused_with_the_part_named() {
        for (text, says) in [
            ("", "empty"),
            ("afterok", "names no job"),
            ("afterok:x", "\"x\" is not a job id"),
            ("afterok:0", "\"0\" is not a job id"),
            ("before:3", "unknown --dependency condition \"before\""),
            ("singleton:3", "singleton names no job"),
            ("afterok:1,afterany:2?after:3", "mixes"),
            ("after:3+10", "not supported"),
            ("afterok:1,", "empty"),
        ] {
            let e = text.parse::<Dependency>().unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        let many = format!("afterany:{}", vec!["1"; MAX_DEPENDENCY_JOBS + 1].join(":"));
        assert!(
            many.parse::<Dependency>()
                .unwrap_err()
                .contains("over the limit")
        );
    }

    #[test]
    fn each_condition_is_met_waits_or_fails_as_slurm_says() {
        use Known::*;
        let cases: &[(&str, Known, &str)] = &[
            ("after:1", Waiting, "wait"),
            ("after:1", Started, "met"),
            ("after:1", ended(false), "met"),
            ("afterany:1", Started, "wait"),
            ("afterany:1", ended(false), "met"),
            ("afterany:1", Unknown, "met"),
            ("afterok:1", Started, "wait"),
            ("afterok:1", ended(true), "met"),
            ("afterok:1", ended(false), "never"),
            ("afterok:1", Unknown, "never"),
            ("afternotok:1", ended(false), "met"),
            ("afternotok:1", ended(true), "never"),
        ];
        for (text, state, want) in cases {
            let got = dep(text).evaluate(|_| state.clone(), None);
            let kind = match &got {
                Verdict::Met => "met",
                Verdict::Waiting(_) => "wait",
                Verdict::Never(_) => "never",
            };
            assert_eq!(kind, *want, "{text} with job 1 {state:?}: {got:?}");
        }
    }

    #[test]
    fn all_terms_must_hold_with_commas_and_one_suffices_with_question_marks() {
        let known = |j: JobId| match j {
            1 => ended(true),
            2 => Known::Started,
            _ => ended(false),
        };
        assert!(matches!(
            dep("afterok:1,afterany:2").evaluate(known, None),
            Verdict::Waiting(w) if w == "afterany:2: job 2 has not ended"
        ));
        assert_eq!(
            dep("afterok:1?afterany:2").evaluate(known, None),
            Verdict::Met
        );
        // One impossible term dooms an AND, not an OR that can still be met.
        assert!(matches!(
            dep("afterany:2,afterok:3").evaluate(known, None),
            Verdict::Never(n) if n == "afterok:3 can never be met: job 3 failed with exit code 1"
        ));
        assert!(matches!(
            dep("afterok:3?afterany:2").evaluate(known, None),
            Verdict::Waiting(_)
        ));
        assert!(matches!(
            dep("afterok:3?afternotok:1").evaluate(known, None),
            Verdict::Never(_)
        ));
    }

    #[test]
    fn singleton_waits_for_an_earlier_namesake_only() {
        let d = dep("singleton");
        assert_eq!(d.evaluate(|_| Known::Unknown, None), Verdict::Met);
        assert!(matches!(
            d.evaluate(|_| Known::Unknown, Some(7)),
            Verdict::Waiting(w) if w.contains("job 7")
        ));
    }
}
