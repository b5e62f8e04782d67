//! When to try again: the retry rule of PRODUCT §5 as pure functions, and exponential backoff
//! with full jitter.

use std::time::Duration;

use rand::RngExt;
use warrant_core::decision::Retryable;
use warrant_core::{Contract, Effect, ToolErrorCode};

use crate::adapter::Failure;

/// Backoff and deadline settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// The first backoff ceiling; it doubles per attempt.
    pub base: Duration,
    /// The largest backoff ceiling.
    pub cap: Duration,
    /// The overall deadline of one call, all attempts and waits included.
    pub deadline: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
            deadline: Duration::from_secs(30),
        }
    }
}

/// Whether a tool may safely be invoked again for the same operation: reads always; others
/// when the tool honours idempotency or the contract tolerates duplicates.
pub fn may_repeat(contract: &Contract) -> bool {
    contract.effect() == Effect::Read
        || contract.idempotency().is_some_and(|i| i.honoured)
        || contract.retry().tolerate_duplicates
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Wait this long, then attempt again with the same idempotency token.
    RetryAfter(Duration),
    /// Stop: the call failed with this code, and no effect happened.
    Fail(ToolErrorCode),
    /// Stop: the effect may have happened; the outcome is `unknown` (this code recorded).
    Unknown(ToolErrorCode),
}

/// The retry rule. `attempt` is the 1-based attempt that just failed, `ambiguous_so_far`
/// whether this or an earlier attempt may have taken effect, `left` what remains of the
/// deadline, `jitter` a uniform sample in `[0, 1)`.
pub fn next(
    contract: &Contract,
    failure: &Failure,
    attempt: u32,
    ambiguous_so_far: bool,
    left: Duration,
    settings: &RetrySettings,
    jitter: f64,
) -> Next {
    // The ceiling is checked again here, whatever the contract says.
    let max = u32::from(
        contract
            .retry()
            .max_attempts()
            .min(warrant_core::contract::RetryPolicy::MAX_ATTEMPTS),
    );
    let read = contract.effect() == Effect::Read;
    let give_up = |code| {
        if ambiguous_so_far && !read {
            Next::Unknown(code)
        } else {
            Next::Fail(code)
        }
    };
    let code = failure.code();
    let due = code.retryable() != Retryable::No && attempt < max;
    if !due {
        return give_up(code);
    }
    if !may_repeat(contract) {
        // A retry was due but the tool could apply the effect twice.
        return if ambiguous_so_far && !read {
            Next::Unknown(code)
        } else {
            Next::Fail(ToolErrorCode::RetryRequiresIdempotency)
        };
    }
    let wait = backoff(attempt, settings, jitter).max(failure.wait().unwrap_or(Duration::ZERO));
    if wait >= left {
        return give_up(code);
    }
    Next::RetryAfter(wait)
}

/// Full jitter: a uniform wait in `[0, min(cap, base · 2^(attempt-1)))`.
pub fn backoff(attempt: u32, settings: &RetrySettings, jitter: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(20);
    let ceiling = settings.base.saturating_mul(1 << exp).min(settings.cap);
    ceiling.mul_f64(jitter.clamp(0.0, 1.0))
}

/// A fresh jitter sample.
pub fn jitter() -> f64 {
    rand::rng().random::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use warrant_core::contract::DocumentFormat;

    fn contract(extra: &str) -> Contract {
        let doc = format!(
            r#"{{"name":"t","version":1,"description":"d","owner":"o",{extra},
            "input":{{"type":"object","additionalProperties":false,"properties":{{}}}},
            "output":{{"type":"object","additionalProperties":false,"properties":{{}}}}}}"#
        );
        Contract::from_text(&doc, DocumentFormat::Json).unwrap()
    }

    fn write(honoured: bool, tolerate: bool, max: u8) -> Contract {
        contract(&format!(
            r#""effect":"write","scopes":[],"approval":"none",
            "idempotency":{{"honoured":{honoured},"retention":"1h"}},
            "retry":{{"max_attempts":{max},"tolerate_duplicates":{tolerate}}}"#
        ))
    }

    const S: RetrySettings = RetrySettings {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(5),
        deadline: Duration::from_secs(30),
    };
    const LEFT: Duration = Duration::from_secs(20);

    #[test]
    fn only_retryable_codes_retry_and_only_while_attempts_remain() {
        let c = write(true, false, 3);
        let unavailable = Failure::new(ToolErrorCode::UpstreamUnavailable, "503");
        assert!(matches!(
            next(&c, &unavailable, 1, false, LEFT, &S, 0.5),
            Next::RetryAfter(_)
        ));
        assert!(matches!(
            next(&c, &unavailable, 2, false, LEFT, &S, 0.5),
            Next::RetryAfter(_)
        ));
        assert_eq!(
            next(&c, &unavailable, 3, false, LEFT, &S, 0.5),
            Next::Fail(ToolErrorCode::UpstreamUnavailable)
        );
        for code in [
            ToolErrorCode::InputInvalid,
            ToolErrorCode::PermissionDenied,
            ToolErrorCode::PermanentFailure,
            ToolErrorCode::Unclassified,
        ] {
            assert_eq!(
                next(&c, &Failure::new(code, ""), 1, false, LEFT, &S, 0.5),
                Next::Fail(code)
            );
        }
    }

    #[test]
    fn a_tool_without_idempotency_is_not_retried() {
        let c = write(false, false, 5);
        assert_eq!(
            next(
                &c,
                &Failure::new(ToolErrorCode::RateLimited, ""),
                1,
                false,
                LEFT,
                &S,
                0.5
            ),
            Next::Fail(ToolErrorCode::RetryRequiresIdempotency)
        );
        // A timeout may have taken effect: unknown, never failed.
        assert_eq!(
            next(
                &c,
                &Failure::ambiguous(ToolErrorCode::Timeout, ""),
                1,
                true,
                LEFT,
                &S,
                0.5
            ),
            Next::Unknown(ToolErrorCode::Timeout)
        );
        // Unless the contract tolerates duplicates.
        let c = write(false, true, 5);
        assert!(matches!(
            next(
                &c,
                &Failure::ambiguous(ToolErrorCode::Timeout, ""),
                1,
                true,
                LEFT,
                &S,
                0.5
            ),
            Next::RetryAfter(_)
        ));
    }

    #[test]
    fn an_ambiguous_attempt_makes_a_later_failure_unknown() {
        let c = write(true, false, 2);
        let answered = Failure::new(ToolErrorCode::UpstreamUnavailable, "503");
        assert_eq!(
            next(&c, &answered, 2, true, LEFT, &S, 0.5),
            Next::Unknown(ToolErrorCode::UpstreamUnavailable)
        );
    }

    #[test]
    fn retry_after_is_honoured_and_the_deadline_bounds_waits() {
        let c = write(true, false, 3);
        let limited =
            Failure::new(ToolErrorCode::RateLimited, "429").retry_after(Some(Duration::from_secs(2)));
        assert_eq!(
            next(&c, &limited, 1, false, LEFT, &S, 0.0),
            Next::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(
            next(&c, &limited, 1, false, Duration::from_secs(1), &S, 0.0),
            Next::Fail(ToolErrorCode::RateLimited)
        );
    }

    #[test]
    fn backoff_is_full_jitter_under_an_exponential_cap() {
        assert_eq!(backoff(1, &S, 0.0), Duration::ZERO);
        assert_eq!(backoff(1, &S, 0.5), Duration::from_millis(50));
        assert_eq!(backoff(3, &S, 0.5), Duration::from_millis(200));
        assert_eq!(backoff(30, &S, 1.0), Duration::from_secs(5));
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j));
        }
    }
}
