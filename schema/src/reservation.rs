//! Path reservations: an identity holds paths or globs of a repository for a while, exclusive
//! or shared, so agents editing one checkout do not overwrite each other. The rules that need
//! no store live here: what a pattern may be, when two patterns can name the same path, when
//! two reservations conflict, and whether a path falls under a pattern.
//!
//! Patterns are paths relative to the repository's root, `/`-separated: `*` matches within one
//! segment, `?` one character, and a `**` segment any number of segments (`src/**`,
//! `docs/*.md`, `**/Cargo.toml`). A pattern without wildcards names one path, or, ending in
//! `/`, everything under it.
//!
//! Comparing patterns is [`glob`]'s: linear in their lengths, and counted, so that what one
//! request may make the relay compute is bounded ([`MAX_WORK`], and the limits below).

use crate::InvalidInput;
use serde::{Deserialize, Serialize};

mod glob;
pub use glob::{same_pattern, Glob, TooMuchWork, Work};

/// Longest pattern, and most patterns in one reservation.
pub const MAX_PATTERN_BYTES: usize = 512;
pub const MAX_PATTERNS: usize = 64;
/// Most wildcards in one pattern (each `*`, `?` and `**` counts one), and most segments: the
/// comparison's cost grows with neither beyond these (see [`glob`]).
pub const MAX_WILDCARDS: usize = 8;
pub const MAX_SEGMENTS: usize = 32;
/// Most steps ([`Work`]) one request may spend comparing its patterns with those already held
/// in its project: a request that would need more is refused, and nothing is stored.
pub const MAX_WORK: u64 = 20_000_000;
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

crate::stored!(ReservationSet => "reservations");

impl Reservation {
    /// Whether this and `other` could conflict at all: different holders, at least one
    /// exclusive, one project. They do if a path both could name exists too ([`conflicts`]).
    fn may_conflict(&self, other: &Reservation) -> bool {
        self.holder != other.holder && (self.exclusive || other.exclusive) && self.project == other.project
    }
}

/// Each of `held` that cannot be held with `wanted` (different holders, at least one
/// exclusive, one project, and a path both could name), with its patterns that overlap
/// wanted's. Every step counts against `work`; at its limit the answer is [`TooMuchWork`].
pub fn conflicts<'a>(
    wanted: &Reservation,
    held: &'a [Reservation],
    work: &mut Work,
) -> Result<Vec<(&'a Reservation, Vec<&'a str>)>, TooMuchWork> {
    let compile = |p: &str, work: &mut Work| {
        let g = Glob::pattern(p);
        work.spend(g.size()).map(|()| g)
    };
    let mine = wanted
        .paths
        .iter()
        .map(|p| compile(p, work))
        .collect::<Result<Vec<_>, _>>()?;
    let mut found = Vec::new();
    for other in held.iter().filter(|o| wanted.may_conflict(o)) {
        let mut overlapping = Vec::new();
        for p in &other.paths {
            let theirs = compile(p, work)?;
            for m in &mine {
                if theirs.overlaps(m, work)? {
                    overlapping.push(p.as_str());
                    break;
                }
            }
        }
        if !overlapping.is_empty() {
            found.push((other, overlapping));
        }
    }
    Ok(found)
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
    let mut wildcards = 0;
    for (n, seg) in p.split('/').enumerate() {
        match seg {
            "" => return Err(invalid("a path must not have an empty segment (//)")),
            "." | ".." => return Err(invalid("a path must not have . or .. segments")),
            s if s.contains("**") && s != "**" => {
                return Err(invalid("** must be a whole segment (src/**/x.rs, not src/a**)"))
            }
            _ if n == MAX_SEGMENTS => {
                return Err(invalid("a pattern has at most 32 segments (use ** for deeper paths)"))
            }
            "**" => wildcards += 1,
            s => wildcards += s.chars().filter(|c| matches!(c, '*' | '?')).count(),
        }
    }
    if wildcards > MAX_WILDCARDS {
        return Err(invalid(
            "a pattern has at most 8 wildcards (*, ? and ** each count one)",
        ));
    }
    Ok(p)
}

/// Whether some path can match both patterns. One comparison, not counted: the relay's are
/// [`conflicts`]' (this one is the tests' yardstick).
#[cfg(test)]
pub fn overlap(a: &str, b: &str) -> bool {
    Glob::pattern(a)
        .overlaps(&Glob::pattern(b), &mut Work::unlimited())
        .unwrap_or(true)
}

/// Whether `path` (a concrete path, as [`path`] reads it) falls under `pattern`.
pub fn matches(pattern: &str, path: &str) -> bool {
    Glob::pattern(pattern)
        .overlaps(&Glob::path(path), &mut Work::unlimited())
        .unwrap_or(true)
}

/// Why a path cannot be checked against reservations: no pattern could spell it as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    #[error("its name is not UTF-8")]
    NotUtf8,
    #[error("it has a control character ({0:?})")]
    Control(char),
    #[error("it is {0} bytes long; reservation patterns are at most {MAX_PATTERN_BYTES}")]
    TooLong(usize),
    #[error("it has a \\, which reservation patterns read as /")]
    Backslash,
    #[error("it begins or ends with a space, which reservation patterns drop")]
    Spaces,
}

/// A path as git names it (`/`-separated, relative to the repository's root), if it can be
/// checked against reservations as it is: UTF-8, with no control character, at most
/// [`MAX_PATTERN_BYTES`] long, and nothing the pattern rules would rewrite (a `\`, spaces
/// around it). A path deeper than [`MAX_SEGMENTS`], or with `*` or `?` in a name, is checked
/// as it is: those limits bound what comparing two patterns costs the relay.
pub fn path(raw: &[u8]) -> Result<&str, Unfit> {
    let p = std::str::from_utf8(raw).map_err(|_| Unfit::NotUtf8)?;
    if let Some(c) = p.chars().find(|c| c.is_control()) {
        return Err(Unfit::Control(c));
    }
    if p.len() > MAX_PATTERN_BYTES {
        return Err(Unfit::TooLong(p.len()));
    }
    if p.contains('\\') {
        return Err(Unfit::Backslash);
    }
    if p.trim() != p {
        return Err(Unfit::Spaces);
    }
    Ok(p)
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
    fn a_path_that_no_pattern_could_spell_cannot_be_checked() {
        assert_eq!(path(b"src/main.rs"), Ok("src/main.rs"));
        assert_eq!(path(b"src/a*b?.rs"), Ok("src/a*b?.rs"), "checked as it is");
        assert!(path(["d"; 40].join("/").as_bytes()).is_ok(), "deep paths too");
        assert_eq!(path(b"src/a\tb.rs"), Err(Unfit::Control('\t')));
        assert_eq!(path(b"src/\x01.rs"), Err(Unfit::Control('\u{1}')));
        assert_eq!(path(b"src/\xff.rs"), Err(Unfit::NotUtf8));
        assert_eq!(path("x".repeat(762).as_bytes()), Err(Unfit::TooLong(762)));
        assert_eq!(path(b"src\\x.rs"), Err(Unfit::Backslash));
        assert_eq!(path(b"src/x.rs "), Err(Unfit::Spaces));
        assert!(Unfit::Control('\t').to_string().contains("control character ('\\t')"));
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
        let conflict =
            |a: &Reservation, b: Reservation| !conflicts(a, &[b], &mut Work::unlimited()).unwrap().is_empty();
        assert!(conflict(&r("a", &["src/**"], true), r("b", &["src/x.rs"], false)));
        assert!(
            !conflict(&r("a", &["src/**"], false), r("b", &["src/x.rs"], false)),
            "shared ones coexist"
        );
        assert!(
            !conflict(&r("a", &["src/**"], true), r("a", &["src/x.rs"], true)),
            "one's own"
        );
        assert!(!conflict(&r("a", &["src/**"], true), r("b", &["docs/**"], true)));
        let mut other_project = r("b", &["src/**"], true);
        other_project.project = "q".into();
        assert!(!conflict(&r("a", &["src/**"], true), other_project));
        let held = [r("b", &["docs/**", "src/*.rs", "src/a/**"], true)];
        let found = conflicts(&r("a", &["src/x.rs", "src/a/b"], true), &held, &mut Work::unlimited()).unwrap();
        assert_eq!(
            found[0].1,
            ["src/*.rs", "src/a/**"],
            "only the held patterns that overlap are named"
        );
    }

    fn held(holder: &str, paths: Vec<String>) -> Reservation {
        Reservation {
            id: holder.into(),
            holder: holder.into(),
            paths,
            exclusive: true,
            reason: String::new(),
            project: String::new(),
            created_ms: 0,
            expires_ms: 1,
            release_when_offline: false,
        }
    }

    /// The heaviest pairs of patterns the rules allow (found by search over shapes: a long name
    /// against a long piece between two stars, long runs of segments between two `**`), none
    /// of which overlap (an overlap ends a held pattern's comparisons early): each costs under
    /// 5,000 steps, counted, not timed.
    fn heaviest() -> Vec<(String, String)> {
        let a = |n: usize| "a".repeat(n);
        let names = |n: usize, name: &str| vec![name; n].join("/");
        let mut near = vec![a(14); 24];
        near[23] = format!("{}b", a(13));
        vec![
            (a(510), format!("*{}b*", a(507))),
            (format!("{}b", a(509)), format!("*{}c*", a(250))),
            (a(510), format!("a*{}*{}b*a", a(250), a(249))),
            (names(32, &a(14)), format!("**/{}/**", near.join("/"))),
        ]
    }

    #[test]
    fn the_heaviest_pairs_the_rules_allow_are_a_few_thousand_steps() {
        for (x, y) in heaviest() {
            for (a, b) in [(&x, &y), (&y, &x)] {
                assert_eq!(pattern(a).as_ref(), Ok(a), "the rules allow {a}");
                let mut work = Work::unlimited();
                Glob::pattern(a).overlaps(&Glob::pattern(b), &mut work).unwrap();
                let (steps, len) = (work.spent(), (a.len(), b.len()));
                assert!(
                    (1_000..5_000).contains(&steps),
                    "{steps} steps: patterns of {len:?} bytes"
                );
                assert!(!overlap(a, b), "disjoint: patterns of {len:?} bytes");
            }
        }
    }

    /// The worst request: 64 of the heaviest patterns against 64 held by another holder. It is
    /// answered within [`MAX_WORK`]; and a project holding more than that budget's worth is
    /// refused after no more than the budget (plus one step's size), never computed in full.
    #[test]
    fn the_worst_request_is_bounded_work() {
        // The heaviest pair, 64 against 64; and against twenty holders of 64 each.
        for (x, y) in heaviest().into_iter().take(1) {
            let mine = held("a", vec![x.clone(); MAX_PATTERNS]);
            let theirs = [held("b", vec![y.clone(); MAX_PATTERNS])];
            let mut work = Work::new(MAX_WORK);
            let found = conflicts(&mine, &theirs, &mut work).map(|f| f.len());
            let len = (x.len(), y.len());
            assert_eq!(found, Ok(0), "64 against 64 of {len:?} bytes: {} steps", work.spent());
            assert!(
                work.spent() > MAX_WORK / 4,
                "{} steps: the worst case, or near it",
                work.spent()
            );
            let crowded: Vec<Reservation> = (0..20)
                .map(|i| held(&format!("b{i}"), vec![y.clone(); MAX_PATTERNS]))
                .collect();
            let mut work = Work::new(MAX_WORK);
            let found = conflicts(&mine, &crowded, &mut work).map(|f| f.len());
            assert_eq!(found, Err(TooMuchWork), "{len:?}");
            assert!(work.spent() <= MAX_WORK + 10_000, "stopped at {} steps", work.spent());
        }
        // The shape of a reported overlap that took quadratic time (`*a*a…*a` and a suffix, about 500 characters; the rules now
        // refuse more than 8 wildcards, but a record stored before keeps its patterns): two
        // sequences with stars meet or not by their ends alone.
        let star_a = |end: &str| format!("{}{end}", "*a".repeat(245));
        assert!(pattern(&star_a("b.rs")).is_err(), "more than 8 wildcards");
        let mine = held("a", (0..MAX_PATTERNS).map(|i| star_a(&format!("{i}.rs"))).collect());
        let theirs = [held(
            "b",
            (0..MAX_PATTERNS).map(|i| star_a(&format!("{i}.md"))).collect(),
        )];
        let mut work = Work::new(MAX_WORK);
        assert_eq!(conflicts(&mine, &theirs, &mut work).map(|f| f.len()), Ok(0));
        assert!(work.spent() < 200_000, "{} steps", work.spent());
    }

    #[test]
    fn wildcards_and_segments_are_bounded() {
        assert!(pattern("a/*/b?/**/c*d*e").is_ok());
        assert!(pattern("*?*?*?*?").is_ok(), "8 wildcards");
        let e = pattern("*?*?*?*?*").unwrap_err().to_string();
        assert!(e.contains("at most 8 wildcards"), "{e}");
        assert!(pattern(&["a"; 32].join("/")).is_ok());
        let e = pattern(&["a"; 33].join("/")).unwrap_err().to_string();
        assert!(e.contains("at most 32 segments"), "{e}");
    }
}
