//! Path reservations: an identity holds paths or globs of a repository for a while, exclusive
//! or shared, so agents editing one checkout do not overwrite each other. The rules that need
//! no store live here: what a pattern may be, when two patterns can name the same path, when
//! two reservations conflict, and whether a path falls under a pattern.
//!
//! Patterns are paths relative to the repository's root, `/`-separated: `*` matches within one
//! segment, `?` one character, and a `**` segment any number of segments (`src/**`,
//! `docs/*.md`, `**/Cargo.toml`). A pattern without wildcards names one path, or, ending in
//! `/`, everything under it.

use crate::InvalidInput;
use serde::{Deserialize, Serialize};

/// Longest pattern, and most patterns in one reservation.
pub const MAX_PATTERN_BYTES: usize = 512;
pub const MAX_PATTERNS: usize = 64;
/// Longest reason and project name.
pub const MAX_REASON_BYTES: usize = 1_000;
pub const MAX_PROJECT_BYTES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub id: String,
    pub holder: String,
    /// Normalised patterns ([`pattern`]).
    pub paths: Vec<String>,
    pub exclusive: bool,
    pub reason: String,
    /// A repository's name or remote; empty: none named.
    pub project: String,
    /// Milliseconds since the epoch.
    pub created_ms: i64,
    pub expires_ms: i64,
    /// Released when the holder goes offline (its presence expires or its session ends).
    pub release_when_offline: bool,
}

/// Every reservation of one project: the unit a grant reads and writes at once, so two grants
/// that could conflict are ordered by one compare-and-set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationSet {
    pub items: Vec<Reservation>,
}

impl Reservation {
    /// Whether this and `other` cannot both be held: different holders, at least one
    /// exclusive, and a path both could name.
    pub fn conflicts_with(&self, other: &Reservation) -> bool {
        self.holder != other.holder
            && (self.exclusive || other.exclusive)
            && self.project == other.project
            && self.paths.iter().any(|a| other.paths.iter().any(|b| overlap(a, b)))
    }

    /// The first of its patterns that `path` falls under.
    pub fn covering(&self, path: &str) -> Option<&str> {
        self.paths.iter().find(|p| matches(p, path)).map(String::as_str)
    }
}

/// A pattern as given, checked and normalised: trimmed, `\` as `/`, no leading `./` or `/`, no
/// empty, `.` or `..` segment; a trailing `/` means everything under it (`dir/**`).
pub fn pattern(raw: &str) -> Result<String, InvalidInput> {
    let invalid = |reason| InvalidInput::Invalid { field: "paths", reason };
    let p = raw.trim().replace('\\', "/");
    if p.len() > MAX_PATTERN_BYTES {
        return Err(InvalidInput::TooLong {
            field: "paths",
            len: p.len(),
            max: MAX_PATTERN_BYTES,
        });
    }
    if p.chars().any(char::is_control) {
        return Err(InvalidInput::ControlChars { field: "paths" });
    }
    let mut p = p.trim_start_matches("./").trim_start_matches('/').to_owned();
    if p.ends_with('/') {
        p.push_str("**");
    }
    if p.is_empty() {
        return Err(invalid("a path must not be empty (use ** for the whole repository)"));
    }
    for seg in p.split('/') {
        match seg {
            "" => return Err(invalid("a path must not have an empty segment (//)")),
            "." | ".." => return Err(invalid("a path must not have . or .. segments")),
            s if s.contains("**") && s != "**" => {
                return Err(invalid("** must be a whole segment (src/**/x.rs, not src/a**)"))
            }
            _ => {}
        }
    }
    Ok(p)
}

/// Whether some path can match both patterns.
pub fn overlap(a: &str, b: &str) -> bool {
    let a: Vec<&str> = a.split('/').collect();
    let b: Vec<&str> = b.split('/').collect();
    intersect(&a, &b, |x: &&str| *x == "**", |x, y| segments_overlap(x, y))
}

/// Whether `path` (a concrete path) falls under `pattern`.
pub fn matches(pattern: &str, path: &str) -> bool {
    match self::pattern(path) {
        Ok(path) => {
            let p: Vec<&str> = pattern.split('/').collect();
            let q: Vec<&str> = path.split('/').collect();
            intersect(&p, &q, |x: &&str| *x == "**", |x, y| segment_matches(x, y))
        }
        Err(_) => false,
    }
}

fn segments_overlap(a: &str, b: &str) -> bool {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    intersect(&a, &b, |c| *c == '*', |x, y| *x == '?' || *y == '?' || x == y)
}

/// A literal segment against a pattern's segment (the path's `*` and `?` are characters).
fn segment_matches(pattern: &str, literal: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let l: Vec<char> = literal.chars().collect();
    let mut memo = vec![vec![None; l.len() + 1]; p.len() + 1];
    fn go(p: &[char], l: &[char], i: usize, j: usize, memo: &mut Vec<Vec<Option<bool>>>) -> bool {
        if let Some(v) = memo[i][j] {
            return v;
        }
        let v = match p.get(i) {
            None => j == l.len(),
            Some('*') => go(p, l, i + 1, j, memo) || (j < l.len() && go(p, l, i, j + 1, memo)),
            Some(c) => j < l.len() && (*c == '?' || *c == l[j]) && go(p, l, i + 1, j + 1, memo),
        };
        memo[i][j] = Some(v);
        v
    }
    go(&p, &l, 0, 0, &mut memo)
}

/// Whether two sequences of pattern items can match one sequence: `star(x)` matches any
/// number of items, `unit(x, y)` says whether two single items can match one. Dynamic
/// programming over positions, so it is linear in the product of the lengths.
fn intersect<T>(a: &[T], b: &[T], star: impl Fn(&T) -> bool, unit: impl Fn(&T, &T) -> bool) -> bool {
    let mut memo = vec![vec![None; b.len() + 1]; a.len() + 1];
    fn go<T>(
        a: &[T],
        b: &[T],
        i: usize,
        j: usize,
        star: &dyn Fn(&T) -> bool,
        unit: &dyn Fn(&T, &T) -> bool,
        memo: &mut Vec<Vec<Option<bool>>>,
    ) -> bool {
        if let Some(v) = memo[i][j] {
            return v;
        }
        let v = match (a.get(i), b.get(j)) {
            (None, None) => true,
            (Some(x), _) if star(x) => {
                go(a, b, i + 1, j, star, unit, memo) || (j < b.len() && go(a, b, i, j + 1, star, unit, memo))
            }
            (_, Some(y)) if star(y) => {
                go(a, b, i, j + 1, star, unit, memo) || (i < a.len() && go(a, b, i + 1, j, star, unit, memo))
            }
            (Some(x), Some(y)) => unit(x, y) && go(a, b, i + 1, j + 1, star, unit, memo),
            _ => false,
        };
        memo[i][j] = Some(v);
        v
    }
    go(a, b, 0, 0, &star, &unit, &mut memo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_normalised_and_checked() {
        assert_eq!(pattern(" ./src/main.rs ").unwrap(), "src/main.rs");
        assert_eq!(pattern("docs/").unwrap(), "docs/**");
        assert_eq!(pattern("/a\\b").unwrap(), "a/b");
        for bad in ["", "  ", "a//b", "../x", "a/./b", "src/a**", &"x".repeat(600)] {
            assert!(pattern(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn overlapping_patterns_are_found_and_disjoint_ones_are_not() {
        let yes = [
            ("src/**", "src/main.rs"),
            ("src/**", "src/a/b/c.rs"),
            ("src/*.rs", "src/m*"),
            ("**", "anything/at/all"),
            ("**/Cargo.toml", "crates/x/Cargo.toml"),
            ("docs/*.md", "docs/README.md"),
            ("a/**/z", "a/b/c/z"),
            ("a/**/z", "a/z"),
            ("src/**", "src"),
            ("*.rs", "?ain.rs"),
        ];
        for (a, b) in yes {
            assert!(overlap(a, b), "{a} and {b} overlap");
            assert!(overlap(b, a), "{b} and {a} overlap");
        }
        let no = [
            ("src/**", "docs/x.md"),
            ("docs/*.md", "docs/a/b.md"),
            ("src/*.rs", "src/a.md"),
            ("a/**/z", "a/b/y"),
            ("src/main.rs", "src/lib.rs"),
            ("*.rs", "a/b.rs"),
        ];
        for (a, b) in no {
            assert!(!overlap(a, b), "{a} and {b} are disjoint");
            assert!(!overlap(b, a), "{b} and {a} are disjoint");
        }
    }

    #[test]
    fn a_path_falls_under_a_pattern() {
        assert!(matches("src/**", "src/a/b.rs"));
        assert!(matches("docs/*.md", "docs/x.md"));
        assert!(!matches("docs/*.md", "docs/sub/x.md"));
        assert!(!matches("src/*.rs", "src/*.rs.bak"));
        assert!(
            matches("src/*.rs", "src/*.rs"),
            "a path's * is a character like any other"
        );
        assert!(!matches("src/main.rs", "src/main.rs/x"));
    }

    #[test]
    fn conflicts_need_two_holders_one_exclusive_and_a_shared_path() {
        let r = |holder: &str, paths: &[&str], exclusive: bool| Reservation {
            id: holder.into(),
            holder: holder.into(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
            exclusive,
            reason: String::new(),
            project: "p".into(),
            created_ms: 0,
            expires_ms: 1,
            release_when_offline: false,
        };
        assert!(r("a", &["src/**"], true).conflicts_with(&r("b", &["src/x.rs"], false)));
        assert!(
            !r("a", &["src/**"], false).conflicts_with(&r("b", &["src/x.rs"], false)),
            "shared ones coexist"
        );
        assert!(
            !r("a", &["src/**"], true).conflicts_with(&r("a", &["src/x.rs"], true)),
            "one's own"
        );
        assert!(!r("a", &["src/**"], true).conflicts_with(&r("b", &["docs/**"], true)));
        let mut other_project = r("b", &["src/**"], true);
        other_project.project = "q".into();
        assert!(!r("a", &["src/**"], true).conflicts_with(&other_project));
    }
}
