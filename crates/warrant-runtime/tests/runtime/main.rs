//! The runtime end to end over SQLite and PostgreSQL: every error code's path against a
//! loopback fault server, retries, unknown outcomes and reconciliation, concurrency, the
//! command, SMTP and fetch adapters, and committed spend.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

mod cases;
mod faults;
mod smtp;
mod support;

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let h = std::sync::Arc::new(crate::support::Harness::new(crate::support::Kind::Sqlite).await.unwrap());
                    crate::cases::$case(&h).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let Some(h) = crate::support::Harness::new(crate::support::Kind::Postgres).await else { return };
                    let h = std::sync::Arc::new(h);
                    crate::cases::$case(&h).await;
                    if let Ok(h) = std::sync::Arc::try_unwrap(h) {
                        h.finish().await;
                    }
                }
            )*
        }
    };
}

on_every_backend! {
    commits_once_and_replays,
    an_outcome_that_cannot_be_recorded_is_unknown,
    an_expired_in_flight_operation_is_reconciled_first,
    a_commit_after_reconciliation_corrects_the_ledger,
    a_key_resolved_after_its_retention_is_kept_from_then,
    a_finished_call_is_replayed_though_its_binding_became_unusable,
    an_abandoned_row_marked_overdue_keeps_its_note,
    every_status_takes_its_path,
    retries_are_capped_and_honour_retry_after,
    a_tool_without_idempotency_is_not_retried,
    lost_answers_are_unknown_and_reconciled,
    a_new_attempt_reconciles_an_unknown_first,
    a_replay_that_finds_no_effect_needs_an_approval_of_its_own,
    a_key_is_kept_as_long_as_its_call_may_run,
    confirmed_duplicates_are_counted_and_recorded,
    stale_attempting_rows_are_reconciled,
    concurrent_executions_make_one_effect,
    command_adapter,
    send_email_reaches_exactly_the_recipients,
    a_send_email_binding_needs_every_recipient_field_guarded,
    structured_data_fetch,
    credentials_reach_only_their_tools_and_origins,
    the_smtp_relay_goes_through_the_outbound_guard,
    a_keyless_read_is_one_ledger_row,
    committed_spend_is_charged,
    the_background_reconciler_resolves_on_its_own,
    a_thousand_unresolvable_rows_do_not_hide_one_behind_them,
    a_pass_asks_only_within_its_lease,
}
