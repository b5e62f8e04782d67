//! The gateway over HTTP, end to end, on SQLite and PostgreSQL: proposals decided, approved,
//! executed and recorded; admin routes; tenant isolation; hostile requests; and two nodes on
//! one PostgreSQL database racing one key and one approval.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs,
    reason = "tests"
)]

mod cases;
mod console;
mod support;

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let h = crate::support::Harness::new(crate::support::Kind::Sqlite, 1).await.unwrap();
                    crate::cases::$case(&h).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let Some(h) = crate::support::Harness::new(crate::support::Kind::Postgres, 1).await else { return };
                    crate::cases::$case(&h).await;
                    h.finish().await;
                }
            )*
        }
    };
}

on_every_backend! {
    a_call_is_decided_approved_executed_and_recorded,
    idempotency_statuses_follow_the_draft,
    hostile_requests_get_clear_errors,
    tenants_cannot_reach_each_other,
    admins_register_and_retire_contracts,
    contracts_and_tenants_follow_the_trust_model,
    keys_are_created_and_revoked,
    the_ledger_filters_and_pages,
    health_readiness_and_metrics,
    approvals_are_visible_only_to_their_reviewers_and_keep_no_sensitive_value,
    a_policy_that_cannot_be_evaluated_denies_the_call,
    a_call_outlives_its_client,
    a_submitted_call_runs_though_never_awaited,
    a_call_outlives_its_request_timeout,
    a_rejected_call_is_not_sent_for_review_again,
    admins_publish_only_workflows_the_compiler_accepts,
    runs_execute_tool_branch_and_review_steps_through_the_pipeline,
    model_steps_propose_through_the_strict_parser_and_policy,
    the_workflow_validator_tool_answers_the_compilers_verdict,
    the_console_signs_reviewers_in_and_decides_through_the_pipeline,
    sensitive_values_are_revealed_only_where_policy_lets,
    an_edit_in_the_console_outlives_the_reviewers_request,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_on_one_postgres_race_one_key_and_one_approval() {
    let Some(h) = support::Harness::new(support::Kind::Postgres, 2).await else {
        return;
    };
    cases::two_nodes_race(&h).await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_on_one_postgres_run_each_step_once() {
    let Some(h) = support::Harness::new(support::Kind::Postgres, 2).await else {
        return;
    };
    cases::two_nodes_run_each_step_once(&h).await;
    h.finish().await;
}
