//! `decide` end to end over every store backend: the stage table, approvals, tenant
//! isolation, concurrency and hostile input.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

mod cases;
mod metrics;
mod support;

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let h = std::sync::Arc::new(crate::support::Harness::new(crate::support::Kind::Memory).await.unwrap());
                    crate::cases::$case(&h).await;
                }
            )*
        }
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
    stage_table,
    a_replay_is_answered_whatever_the_budget,
    approvals_end_to_end,
    tenants_cannot_reach_each_other,
    an_approval_is_consumed_once_under_concurrency,
    budgets_hold_under_concurrency,
    contracts_resolve_exactly,
    reloading_reuses_compiled_contracts,
    a_fresh_listing_answers_misses_without_the_store,
    the_registry_caches_the_stored_binding,
    hostile_proposals_stop_where_they_fail,
    an_unrequired_approval_id_is_not_echoed,
}
