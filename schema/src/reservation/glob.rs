//! Reservation patterns compiled for comparison, and the two questions asked of them: can two
//! patterns name one path ([`Glob::overlaps`]: the relay, granting a reservation), and does a
//! pattern cover a path (the same question with a [`Glob::path`]: `crosstalk guard`). Each
//! answer takes time linear in the two patterns' lengths, times a small factor, and every step
//! of it is counted against a [`Work`] limit, so no input makes one comparison (or the many
//! of one request) expensive.
//!
//! Letters are compared without regard to case ([`fold`]): a checkout on macOS or Windows
//! cannot hold two paths that differ only in case, so no reservation may tell them apart.
//!
//! A pattern is a sequence of segments, among which `**` is a star (any number of segments);
//! a segment is a sequence of characters, among which `*` is a star (any number of characters)
//! and `?` any one character. Both levels are answered by one rule about sequences with stars:
//!
//! - Neither has a star: they meet if they are as long and meet item by item.
//! - Both have a star: they always meet in the middle (each one's star takes what the other
//!   needs there), so only their ends are compared: their heads (before the first star) item
//!   by item as far as the shorter goes, and their tails (after the last star) likewise from
//!   the end. Linear.
//! - One has none (a fixed length): the other's head is laid at its start, its tail at its end,
//!   and each piece between two stars at the first place it fits after the previous piece (the
//!   earliest place leaves the most room for the rest, so it is never worse). Among characters
//!   a piece is found by a bit-parallel search (Shift-And: one 64-bit word per 64 characters
//!   of the piece, for each character searched); among segments by trying each place, which
//!   the limit on segments in a pattern keeps small.

use std::collections::HashMap;

/// Work a comparison did, counted in steps against a limit. A step is one comparison of two
/// characters, one place tried for a piece of segments, or one 64-bit word of the
/// bit-parallel search.
#[derive(Debug, Clone)]
pub struct Work {
    spent: u64,
    limit: u64,
}

/// A comparison stopped at its [`Work`] limit, unanswered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooMuchWork;

impl Work {
    pub fn new(limit: u64) -> Work {
        Work { spent: 0, limit }
    }

    /// No limit: for one comparison whose size the caller bounds (`crosstalk guard`, tests).
    pub fn unlimited() -> Work {
        Work::new(u64::MAX)
    }

    /// Steps spent so far.
    pub fn spent(&self) -> u64 {
        self.spent
    }

    pub(crate) fn spend(&mut self, steps: usize) -> Result<(), TooMuchWork> {
        self.spent = self.spent.saturating_add(steps as u64);
        if self.spent > self.limit {
            Err(TooMuchWork)
        } else {
            Ok(())
        }
    }
}

/// A character as it is compared: its lowercase, where that is one character (`L` as `l`,
/// `Ä` as `ä`), so that `LIB/X.RS` and `lib/x.rs` are one path, as they are on the default
/// file systems of macOS and Windows. A letter whose lowercase is longer (`İ`) is compared as
/// it is, and so are spellings that differ in more than case (`ß` and `SS`, or `é` as one
/// character or as `e` and an accent).
fn fold(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    let mut lower = c.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(l), None) => l,
        _ => c,
    }
}

/// Whether two patterns are one pattern as they are compared (differing in case only).
pub fn same_pattern(a: &str, b: &str) -> bool {
    a.chars().map(fold).eq(b.chars().map(fold))
}

/// One character of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Char(char),
    /// `?`: any one character.
    One,
    /// `*`: any number of characters (a star).
    Any,
}

/// One segment of a pattern.
#[derive(Debug, Clone)]
enum Seg {
    /// `**`: any number of segments (a star).
    Deep,
    Name(Vec<Unit>),
}

/// A pattern (or a path) compiled for comparison.
#[derive(Debug, Clone)]
pub struct Glob {
    segs: Vec<Seg>,
    /// Characters and segments: what compiling it cost.
    size: usize,
}

impl Glob {
    /// A normalised pattern ([`super::pattern`]): `*`, `?` and a `**` segment are wildcards.
    pub fn pattern(p: &str) -> Glob {
        Glob::compile(p, |c| match c {
            '*' => Unit::Any,
            '?' => Unit::One,
            c => Unit::Char(fold(c)),
        })
    }

    /// A concrete path: every character stands for itself, `*` and `?` too.
    pub fn path(p: &str) -> Glob {
        let glob = Glob::compile(p, |c| Unit::Char(fold(c)));
        Glob {
            // A directory literally named `**` is a name like any other.
            segs: glob
                .segs
                .into_iter()
                .map(|s| match s {
                    Seg::Deep => Seg::Name(vec![Unit::Char('*'), Unit::Char('*')]),
                    name => name,
                })
                .collect(),
            size: glob.size,
        }
    }

    fn compile(p: &str, unit: impl Fn(char) -> Unit) -> Glob {
        let segs: Vec<Seg> = p
            .split('/')
            .map(|s| match s {
                "**" => Seg::Deep,
                s => Seg::Name(s.chars().map(&unit).collect()),
            })
            .collect();
        Glob {
            size: p.len() + segs.len(),
            segs,
        }
    }

    /// What compiling it cost, in steps: its bytes and segments.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether some path can match both.
    pub fn overlaps(&self, other: &Glob, work: &mut Work) -> Result<bool, TooMuchWork> {
        meet(&self.segs, &other.segs, work, &SEGMENTS)
    }
}

/// Where a piece (items without a star) first fits in a window of a sequence without a
/// star: the index just past it.
type Place<T> = fn(&[T], &[T], &mut Work) -> Result<Option<usize>, TooMuchWork>;

/// How one level (segments, or a segment's characters) is compared.
struct Level<T: 'static> {
    star: fn(&T) -> bool,
    /// Whether two items that are not stars can be one item.
    unit: fn(&T, &T, &mut Work) -> Result<bool, TooMuchWork>,
    place: Place<T>,
}

const SEGMENTS: Level<Seg> = Level {
    star: |s| matches!(s, Seg::Deep),
    unit: |a, b, work| match (a, b) {
        (Seg::Name(a), Seg::Name(b)) => meet(a, b, work, &CHARACTERS),
        _ => Ok(true),
    },
    place: place_segments,
};

const CHARACTERS: Level<Unit> = Level {
    star: |u| matches!(u, Unit::Any),
    unit: |a, b, work| {
        work.spend(1)?;
        Ok(match (a, b) {
            (Unit::Char(x), Unit::Char(y)) => x == y,
            _ => true,
        })
    },
    place: place_characters,
};

/// Whether two sequences of one level can match one sequence (the rule in the module's
/// documentation).
fn meet<T>(a: &[T], b: &[T], work: &mut Work, level: &Level<T>) -> Result<bool, TooMuchWork> {
    let (mut pa, mut pb) = (a.split(level.star), b.split(level.star));
    // `split` yields one piece for a sequence without a star, and one more per star.
    let (head_a, head_b) = (pa.next().unwrap_or_default(), pb.next().unwrap_or_default());
    match (pa.next_back(), pb.next_back()) {
        (None, None) => {
            if a.len() != b.len() {
                return Ok(false);
            }
            pairwise(a, b, work, level)
        }
        (Some(tail_a), Some(tail_b)) => {
            let h = head_a.len().min(head_b.len());
            let t = tail_a.len().min(tail_b.len());
            Ok(pairwise(&head_a[..h], &head_b[..h], work, level)?
                && pairwise(&tail_a[tail_a.len() - t..], &tail_b[tail_b.len() - t..], work, level)?)
        }
        (Some(tail), None) => fits(b, head_a, pa, tail, work, level),
        (None, Some(tail)) => fits(a, head_b, pb, tail, work, level),
    }
}

fn pairwise<T>(a: &[T], b: &[T], work: &mut Work, level: &Level<T>) -> Result<bool, TooMuchWork> {
    for (x, y) in a.iter().zip(b) {
        if !(level.unit)(x, y, work)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether a sequence without a star (`fixed`) matches one with stars, given as its head, the
/// pieces between its stars, and its tail.
fn fits<'a, T: 'a>(
    fixed: &[T],
    head: &[T],
    pieces: impl Iterator<Item = &'a [T]>,
    tail: &[T],
    work: &mut Work,
    level: &Level<T>,
) -> Result<bool, TooMuchWork> {
    if fixed.len() < head.len() + tail.len()
        || !pairwise(&fixed[..head.len()], head, work, level)?
        || !pairwise(&fixed[fixed.len() - tail.len()..], tail, work, level)?
    {
        return Ok(false);
    }
    let mut window = &fixed[head.len()..fixed.len() - tail.len()];
    for piece in pieces.filter(|p| !p.is_empty()) {
        match (level.place)(window, piece, work)? {
            Some(end) => window = &window[end..],
            None => return Ok(false),
        }
    }
    Ok(true)
}

/// A piece of segments in a window: each place tried in turn. Its cost is the window's
/// length times the piece's, which the limit on segments in a pattern bounds.
fn place_segments(window: &[Seg], piece: &[Seg], work: &mut Work) -> Result<Option<usize>, TooMuchWork> {
    if piece.len() > window.len() {
        return Ok(None);
    }
    for start in 0..=window.len() - piece.len() {
        work.spend(1)?;
        if pairwise(&window[start..start + piece.len()], piece, work, &SEGMENTS)? {
            return Ok(Some(start + piece.len()));
        }
    }
    Ok(None)
}

/// A piece of characters in a window, by Shift-And: bit `j` of the state says the piece's
/// first `j + 1` characters match the window's characters just read. The window's `?` meets
/// every character; the piece's `?` every character of the window.
fn place_characters(window: &[Unit], piece: &[Unit], work: &mut Work) -> Result<Option<usize>, TooMuchWork> {
    let m = piece.len();
    if m > window.len() {
        return Ok(None);
    }
    let words = m.div_ceil(64);
    let bit = |set: &mut Vec<u64>, j: usize| set[j / 64] |= 1 << (j % 64);
    // Where the piece has each character, and where it has `?`.
    let mut at: HashMap<char, Vec<u64>> = HashMap::new();
    let mut any = vec![0u64; words];
    for (j, u) in piece.iter().enumerate() {
        match u {
            Unit::Char(c) => bit(at.entry(*c).or_insert_with(|| vec![0; words]), j),
            _ => bit(&mut any, j),
        }
    }
    work.spend(m + at.len() * words)?;
    let last = (m - 1) / 64;
    let top = 1u64 << ((m - 1) % 64);
    let mut state = vec![0u64; words];
    for (i, u) in window.iter().enumerate() {
        work.spend(words)?;
        let here = match u {
            Unit::Char(c) => at.get(c),
            _ => None,
        };
        let wild = !matches!(u, Unit::Char(_));
        let mut carry = 1u64;
        for (w, s) in state.iter_mut().enumerate() {
            let mask = if wild { !0 } else { here.map_or(0, |h| h[w]) | any[w] };
            let next = *s >> 63;
            *s = ((*s << 1) | carry) & mask;
            carry = next;
        }
        if state[last] & top != 0 {
            return Ok(Some(i + 1));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The previous implementation, exact but quadratic (memoised over every pair of
    /// positions, at both levels): the answer the new rule must give.
    fn oracle(a: &str, b: &str) -> bool {
        fn intersect<T>(a: &[T], b: &[T], star: &dyn Fn(&T) -> bool, unit: &dyn Fn(&T, &T) -> bool) -> bool {
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
            go(a, b, 0, 0, star, unit, &mut vec![vec![None; b.len() + 1]; a.len() + 1])
        }
        let chars = |x: &&str, y: &&str| {
            let (x, y): (Vec<char>, Vec<char>) = (x.chars().collect(), y.chars().collect());
            intersect(&x, &y, &|c| *c == '*', &|x, y| *x == '?' || *y == '?' || x == y)
        };
        let a: Vec<&str> = a.split('/').collect();
        let b: Vec<&str> = b.split('/').collect();
        intersect(&a, &b, &|s| *s == "**", &chars)
    }

    #[test]
    fn the_rule_gives_the_exact_answer_the_quadratic_search_gave() {
        let names = [
            "a", "b", "ab", "?", "*", "a*", "*b", "?a", "a*b*", "*a*", "ab*b", "*?b", "**",
        ];
        let mut patterns: Vec<String> = Vec::new();
        for x in names {
            patterns.push(x.to_owned());
            for y in names {
                patterns.push(format!("{x}/{y}"));
            }
        }
        for x in ["a", "*", "**", "?a"] {
            for y in ["a", "*", "**", "?a"] {
                for z in ["a", "*", "**", "?a"] {
                    patterns.push(format!("{x}/{y}/{z}"));
                }
            }
        }
        let compiled: Vec<Glob> = patterns.iter().map(|p| Glob::pattern(p)).collect();
        let (mut yes, mut no) = (0, 0);
        for (a, ga) in patterns.iter().zip(&compiled) {
            for (b, gb) in patterns.iter().zip(&compiled) {
                let said = ga.overlaps(gb, &mut Work::unlimited()).unwrap();
                assert_eq!(said, oracle(a, b), "{a} and {b}");
                if said {
                    yes += 1;
                } else {
                    no += 1;
                }
            }
        }
        assert!(yes > 1_000 && no > 1_000, "both answers are tried: {yes} yes, {no} no");
    }

    #[test]
    fn a_path_is_covered_or_not() {
        let covers = |p: &str, path: &str| {
            Glob::pattern(p)
                .overlaps(&Glob::path(path), &mut Work::unlimited())
                .unwrap()
        };
        assert!(covers("src/**", "src/a/b.rs"));
        assert!(covers("**/*.rs", "a/b/c.rs"));
        assert!(covers("a/*b*c*/d", "a/xxbyyczz/d"));
        assert!(!covers("a/*b*c*/d", "a/xxcyybzz/d"));
        assert!(!covers("src/*.rs", "src/*.rs.bak"));
        assert!(
            covers("src/*.rs", "src/*.rs"),
            "a path's * is a character like any other"
        );
        assert!(!covers("src/?.rs", "src/**"), "nor is a path's ** a wildcard");
        assert!(covers("src/*", "src/**"));
    }

    #[test]
    fn case_does_not_tell_paths_apart() {
        let overlap = |a: &str, b: &str| {
            Glob::pattern(a)
                .overlaps(&Glob::pattern(b), &mut Work::unlimited())
                .unwrap()
        };
        assert!(overlap("LIB/X.RS", "lib/x.rs"));
        assert!(overlap("Src/**", "src/main.rs"));
        assert!(overlap("*.RS", "main.rs"));
        assert!(overlap("*ÄB*", "xäbx"), "non-ASCII letters too");
        assert!(!overlap("lib/x.rs", "lib/y.rs"));
        assert!(Glob::pattern("docs/*.MD")
            .overlaps(&Glob::path("DOCS/Readme.md"), &mut Work::unlimited())
            .unwrap());
    }

    #[test]
    fn a_long_piece_is_found_across_words() {
        let long = "ab".repeat(100);
        let pattern = format!("*{long}c*");
        assert!(Glob::pattern(&pattern)
            .overlaps(
                &Glob::path(&format!("x{}{long}cx", "ab".repeat(70))),
                &mut Work::unlimited()
            )
            .unwrap());
        assert!(!Glob::pattern(&pattern)
            .overlaps(
                &Glob::path(&format!("x{}{long}x", "ab".repeat(70))),
                &mut Work::unlimited()
            )
            .unwrap());
    }

    #[test]
    fn work_stops_at_its_limit() {
        let a = Glob::pattern(&["a"; 100].join("/"));
        let mut work = Work::new(10);
        assert_eq!(
            a.overlaps(&Glob::pattern(&["a"; 100].join("/")), &mut work),
            Err(TooMuchWork)
        );
        assert!(work.spent() > 10);
    }
}
