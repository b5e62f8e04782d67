//! The store conformance suite: every case runs against SQLite, the in-memory store, and
//! PostgreSQL (in a
//! schema of its own, with two connection pools as two nodes). PostgreSQL tests are skipped
//! with a notice when the server is unreachable, unless `WARRANT_REQUIRE_POSTGRES=1` (as in
//! `.ci/run`), which makes an unreachable server a failure.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

mod cases;
mod support;

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let backend = crate::support::sqlite().await;
                    crate::cases::$case(&backend).await;
                    backend.finish().await;
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let backend = crate::support::memory().await;
                    crate::cases::$case(&backend).await;
                    backend.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let Some(backend) = crate::support::postgres().await else { return };
                    crate::cases::$case(&backend).await;
                    backend.finish().await;
                }
            )*
        }
    };
}

conformance! {
    a_read_is_recorded_once_with_its_outcome,
    contracts_are_immutable,
    contracts_are_namespaced_by_tenant,
    a_stored_binding_is_never_replaced,
    tenants_are_created_once,
    ledger_round_trips_and_paginates,
    tenants_are_isolated,
    idempotency_claims_replays_and_refuses,
    idempotency_failures_and_unknowns,
    expired_idempotency_records_are_free_and_purged,
    concurrent_claims_have_one_winner,
    approvals_follow_their_lifecycle,
    lapsed_approvals_read_as_expired,
    concurrent_consumption_happens_once,
    budgets_are_exact_under_concurrency,
    budgets_are_all_or_nothing,
    api_keys_are_stored_hashed_and_revocable,
    jobs_are_claimed_once_retried_and_dead_lettered,
    concurrent_workers_never_share_a_job,
    a_closed_store_fails_closed,
    the_write_ahead_commit_spends_all_or_nothing,
    an_expired_unfinished_record_is_not_taken_over,
    a_record_finished_late_is_kept_a_retention_from_then,
    a_late_commit_corrects_the_ledger,
    a_read_takes_its_budget_when_it_is_recorded,
    unresolved_rows_are_claimed_in_due_order_and_rescheduled,
    concurrent_reconcilers_never_claim_the_same_row,
    overdue_rows_are_marked_once,
    workflows_are_immutable_and_tenant_scoped,
    runs_advance_one_step_at_a_time,
    a_recorded_step_hands_its_job_on,
    a_committed_step_call_records_its_step_with_its_outcome,
    console_sessions_end_and_links_are_taken_once,
    tokens_are_spent_once_and_tasks_end_once,
    a_pending_approval_is_superseded_once,
    an_approval_request_commits_with_its_event,
    webhook_endpoints_and_attempts_are_tenant_scoped,
    a_dead_job_is_replayed_once,
    ledger_lists_by_trace_and_approval,
    approvals_are_paged_newest_first,
    inbound_events_are_accepted_once_with_their_job,
    webhook_only_events_commit_with_their_record_when_subscribed,
    a_write_refused_by_its_budget_notifies_subscribers,
    a_renewed_lease_is_not_taken_over,
    a_run_handed_on_start_ends_with_its_last_tool_step,
    sealed_arguments_are_kept_only_while_a_request_is_live,
}
