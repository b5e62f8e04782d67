//! Holding a claimed job while working on it: the worker renews the job's lease every third of
//! it, so a job that takes longer than one lease is not taken over while its node lives, and a
//! node that dies loses the job one lease after its last renewal.

use std::future::Future;
use std::time::Duration;

use warrant_core::records::Job;

use crate::state::AppState;

/// Runs `work` on `job`, held by `worker`, renewing its lease (`lease` from each renewal)
/// until `work` ends. A renewal that finds the job no longer held stops renewing (another
/// worker took it over; whatever `work` then records is refused by the store as not held).
pub(crate) async fn holding<F: Future>(
    state: &AppState,
    job: &Job,
    worker: &str,
    lease: Duration,
    work: F,
) -> F::Output {
    let renewing = async {
        let every = (lease / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            let until = state.env.now() + lease;
            match state.store.renew_job(&job.job.id, worker, until).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(
                        job = job.job.id,
                        "a job's lease lapsed while it ran; it is no longer this worker's"
                    );
                    return;
                }
                Err(error) => tracing::warn!(job = job.job.id, %error, "a job's lease was not renewed"),
            }
        }
    };
    tokio::pin!(work);
    tokio::select! {
        out = &mut work => return out,
        () = renewing => {}
    }
    work.await
}
