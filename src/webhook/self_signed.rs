//! `webhook --self-signed`: the webhook keeps its own CA and serving certificate in a Secret
//! ([`crate::certs::cluster::Renewer`], decisions in [`crate::certs::rotation`]) and serves
//! what the Secret holds.
//!
//! Every replica runs the same loop: a first check before serving (retried with backoff until
//! it succeeds), then one every `interval` (sooner when something falls due before; with
//! backoff after a failure). Each check brings the Secret up to date (the replicas agree
//! through the Secret's `resourceVersion`: no leader), sets the `caBundle` and installs the
//! files; the server reloads them ([`super::tls::ReloadingCert`]). The metrics say when the CAs
//! expire and how the checks go.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt as _;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::metrics::Metrics;
use super::{Error, ServeOptions, Webhook, serve};
use crate::certs::cluster::{Renewer, Report};
use crate::retry::Backoff;

/// The shortest wait between two checks (unless `interval` is shorter): a check that finds the
/// `caBundle` not yet holding the next CA looks again after it.
const MIN_WAIT: Duration = Duration::from_secs(1);

/// How long to wait for the next check: until `until` (Unix seconds) when that comes first, at
/// least [`MIN_WAIT`] (or `interval` when shorter), at most `interval`. Pure.
pub fn next_wait(interval: Duration, until: i64, now: SystemTime) -> Duration {
    let at = UNIX_EPOCH + Duration::from_secs(u64::try_from(until).unwrap_or(0));
    // Certificate times are whole seconds: just after `until`, the step is due.
    let left = at
        .duration_since(now)
        .map(|d| d + Duration::from_millis(50))
        .unwrap_or(Duration::ZERO);
    left.clamp(MIN_WAIT.min(interval), interval)
}

fn backoff(interval: Duration) -> Backoff {
    Backoff::new(MIN_WAIT.min(interval), interval)
}

fn record(metrics: &Metrics, report: &Report) {
    metrics.renewal_check_succeeded(report.ca_not_after, report.next_ca_not_after);
}

/// Serves like [`serve`], with the certificates `renewer` keeps: the first check must succeed
/// before anything is served (it is retried until it does, or until `shutdown`), later checks
/// run every `interval` until the server stops. `options.tls_cert`/`tls_key` are replaced by the
/// renewer's files.
pub async fn serve_self_signed(
    https: TcpListener,
    health: TcpListener,
    webhook: Arc<Webhook>,
    mut options: ServeOptions,
    renewer: Renewer,
    interval: Duration,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    let shutdown = Box::pin(shutdown).shared();
    let metrics = webhook.metrics().clone();
    let mut retry = backoff(interval);
    let first = loop {
        let result = tokio::select! {
            () = shutdown.clone() => return Ok(()),
            result = renewer.step() => result,
        };
        match result {
            Ok(report) => break report,
            Err(e) => {
                metrics.renewal_check_failed();
                let delay = retry.advance();
                tracing::warn!(
                    error = %e,
                    retry_in_s = delay.as_secs_f64(),
                    "cannot set up the webhook's certificates yet; retrying"
                );
                tokio::select! {
                    () = shutdown.clone() => return Ok(()),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    };
    record(&metrics, &first);
    let (cert, key) = renewer.tls_files();
    options.tls_cert = cert;
    options.tls_key = key;

    let (stop_tx, stop_rx) = watch::channel(false);
    let checks = tokio::spawn(keep_checking(
        renewer,
        metrics,
        interval,
        first.wait_until,
        stop_rx,
    ));
    let served = serve(https, health, webhook, options, shutdown).await;
    let _ = stop_tx.send(true);
    let _ = checks.await;
    served
}

/// Checks every `interval` (or sooner, see [`next_wait`]) until `stop` says so.
async fn keep_checking(
    renewer: Renewer,
    metrics: Arc<Metrics>,
    interval: Duration,
    first_until: i64,
    mut stop: watch::Receiver<bool>,
) {
    let mut retry = backoff(interval);
    let mut wait = next_wait(interval, first_until, SystemTime::now());
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let result = tokio::select! {
            _ = stop.changed() => return,
            result = renewer.step() => result,
        };
        wait = match result {
            Ok(report) => {
                record(&metrics, &report);
                retry.reset();
                next_wait(interval, report.wait_until, SystemTime::now())
            }
            Err(e) => {
                metrics.renewal_check_failed();
                let delay = retry.advance();
                tracing::warn!(
                    error = %e,
                    retry_in_s = delay.as_secs_f64(),
                    "certificate check failed; the certificates in use stay"
                );
                delay
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_check_is_at_most_an_interval_away_and_never_a_spin() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let minute = Duration::from_secs(60);
        assert_eq!(next_wait(minute, 1_000_000, now), minute);
        assert_eq!(
            next_wait(minute, 1_010, now),
            Duration::from_millis(10_050),
            "due in 10 s: just after"
        );
        assert_eq!(
            next_wait(minute, 1_000, now),
            MIN_WAIT,
            "due now: not at once"
        );
        assert_eq!(next_wait(minute, 0, now), MIN_WAIT);
        assert_eq!(next_wait(minute, -5, now), MIN_WAIT);
        let short = Duration::from_millis(200);
        assert_eq!(
            next_wait(short, 1_000, now),
            short,
            "an interval below the floor wins"
        );
        assert_eq!(next_wait(short, 1_000_000, now), short);
    }
}
