//! Reading crosstalk's `/metrics` (Prometheus text): histogram buckets, and the bucket that
//! holds a quantile of what was recorded between two scrapes. The peer has no `/metrics`.

use crate::client::Conn;
use std::net::SocketAddr;

/// The whole scrape, or `None` when the server has no `/metrics`.
pub async fn scrape(addr: SocketAddr) -> Option<String> {
    let reply = Conn::connect(addr).await.ok()?.get("/metrics").await.ok()?;
    reply
        .status
        .is_success()
        .then(|| String::from_utf8_lossy(&reply.body).into_owned())
}

/// `(le, cumulative count)` of histogram `name` whose labels contain `labels` (e.g.
/// `reader="wait"`; empty for none), in the order scraped (ascending `le`).
pub fn buckets(text: &str, name: &str, labels: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter(|l| l.contains(labels))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            let count = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect()
}

/// The upper bound (seconds) of the bucket holding quantile `q` of what was recorded between
/// the `before` and `after` scrapes; `None` when nothing was.
pub fn quantile_bound(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before.iter().find(|(b, _)| b == le).map_or(0.0, |(_, c)| *c);
            (*le, n - was)
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    delta.iter().find(|(_, n)| *n >= q * total).map(|(le, _)| *le)
}

/// Quantile 0.99 of histogram `name` (with `labels`) between two scrapes, as text: "≤ x ms",
/// the bound of its bucket, or "-" when nothing was recorded.
pub fn p99_text(before: &str, after: &str, name: &str, labels: &str) -> String {
    quantile_bound(&buckets(before, name, labels), &buckets(after, name, labels), 0.99)
        .map_or("-".to_owned(), |b| format!("≤ {:.2} ms", b * 1e3))
}

/// `(sum, count)` of histogram `name` (unlabelled), or `None` when the scrape has none.
pub fn sum_count(text: &str, name: &str) -> Option<(f64, f64)> {
    let value = |suffix: &str| {
        let key = format!("{name}_{suffix} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    Some((value("sum")?, value("count")?))
}

/// The mean of what histogram `name` recorded between the `before` and `after` scrapes, and
/// how many it recorded; `None` when nothing was.
pub fn mean_between(before: &str, after: &str, name: &str) -> Option<(f64, f64)> {
    let (sum, count) = sum_count(after, name)?;
    let (was_sum, was_count) = sum_count(before, name).unwrap_or((0.0, 0.0));
    let n = count - was_count;
    (n > 0.0).then(|| ((sum - was_sum) / n, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_buckets_and_quantiles() {
        let text = "x_bucket{reader=\"wait\",le=\"0.001\"} 90\nx_bucket{reader=\"wait\",le=\"0.01\"} 99\n\
                    x_bucket{reader=\"wait\",le=\"+Inf\"} 100\nx_bucket{reader=\"sse\",le=\"0.001\"} 5\n";
        let b = buckets(text, "x", "reader=\"wait\"");
        assert_eq!(b.len(), 3);
        assert_eq!(quantile_bound(&[], &b, 0.5), Some(0.001));
        assert_eq!(quantile_bound(&[], &b, 0.99), Some(0.01));
        let before = [(0.001, 90.0), (0.01, 90.0), (f64::INFINITY, 90.0)];
        assert_eq!(quantile_bound(&before, &b, 0.9), Some(0.01));
        assert_eq!(quantile_bound(&b, &b, 0.5), None);
    }

    #[test]
    fn reads_means_between_scrapes() {
        let before = "y_sum 2\ny_count 4\ny_bucket{le=\"1\"} 4\n";
        let after = "y_sum 11\ny_count 7\nyy_sum 100\nyy_count 1\n";
        assert_eq!(sum_count(after, "y"), Some((11.0, 7.0)));
        assert_eq!(mean_between(before, after, "y"), Some((3.0, 3.0)));
        assert_eq!(mean_between("", after, "yy"), Some((100.0, 1.0)));
        assert_eq!(mean_between(after, after, "y"), None);
        assert_eq!(mean_between(before, after, "z"), None);
    }
}
