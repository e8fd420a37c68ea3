//! The four relations COMPARE-AND-WRITE can test (paper Sec. 2.4.1).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// `global_var REL value`, evaluated on every node of a COMPARE-AND-WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Relation {
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `=`
    Eq,
    /// `!=`
    Ne,
}

impl Relation {
    /// Whether `var REL value` holds.
    pub fn holds(self, var: u64, value: u64) -> bool {
        match self {
            Relation::Ge => var >= value,
            Relation::Lt => var < value,
            Relation::Eq => var == value,
            Relation::Ne => var != value,
        }
    }

    pub const ALL: [Relation; 4] = [Relation::Ge, Relation::Lt, Relation::Eq, Relation::Ne];

    pub fn symbol(self) -> &'static str {
        match self {
            Relation::Ge => ">=",
            Relation::Lt => "<",
            Relation::Eq => "=",
            Relation::Ne => "!=",
        }
    }
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

impl FromStr for Relation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            ">=" => Ok(Relation::Ge),
            "<" => Ok(Relation::Lt),
            "=" | "==" => Ok(Relation::Eq),
            "!=" => Ok(Relation::Ne),
            other => Err(format!(
                "{other:?} is not a relation (expected one of >=, <, =, !=)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relations_compare_the_variable_to_the_value() {
        assert!(Relation::Ge.holds(5, 5) && Relation::Ge.holds(6, 5) && !Relation::Ge.holds(4, 5));
        assert!(Relation::Lt.holds(4, 5) && !Relation::Lt.holds(5, 5));
        assert!(Relation::Eq.holds(5, 5) && !Relation::Eq.holds(4, 5));
        assert!(Relation::Ne.holds(4, 5) && !Relation::Ne.holds(5, 5));
        for r in Relation::ALL {
            assert_eq!(r.symbol().parse::<Relation>(), Ok(r));
        }
        assert!(
            "<=".parse::<Relation>()
                .unwrap_err()
                .contains(">=, <, =, !=")
        );
    }
}
