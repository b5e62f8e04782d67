//! Budget planning: which counters a call must fit into, from the contract's budget and the
//! tenant's cost budget. The store reserves them atomically (all or none).

use std::collections::BTreeMap;

use time::{Date, Duration, OffsetDateTime};

use crate::authority::Principal;
use crate::contract::Contract;
use crate::records::BudgetReservation;

/// How long a cost budget lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetPeriod {
    /// A UTC calendar day.
    Day,
    /// A UTC calendar month.
    Month,
}

/// Cost units a tenant may spend per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostBudget {
    /// Units per period.
    pub units: u64,
    /// The period.
    pub period: BudgetPeriod,
}

/// Tenant budget configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetConfig {
    /// Applies to tenants without their own entry.
    pub default_cost: Option<CostBudget>,
    /// Per-tenant cost budgets.
    pub tenants: BTreeMap<String, CostBudget>,
}

impl BudgetConfig {
    fn cost_for(&self, tenant: &str) -> Option<CostBudget> {
        self.tenants.get(tenant).copied().or(self.default_cost)
    }
}

/// The counters one call of `contract` must fit into.
pub fn plan(
    config: &BudgetConfig,
    contract: &Contract,
    principal: &Principal,
    run_id: Option<&str>,
    now: OffsetDateTime,
) -> Vec<BudgetReservation> {
    let mut out = Vec::new();
    let today = now.date();
    let budget = contract.budget();
    if let (Some(limit), Some(run)) = (budget.calls_per_run, run_id) {
        out.push(BudgetReservation {
            key: format!("calls_per_run:{run}:{}", contract.name()),
            amount: 1,
            limit,
            expires_at: now + Duration::days(30),
        });
    }
    if let Some(limit) = budget.calls_per_day {
        out.push(BudgetReservation {
            key: format!("calls_per_day:{}:{}:{today}", principal.id(), contract.name()),
            amount: 1,
            limit,
            expires_at: end_of(today, BudgetPeriod::Day) + Duration::days(1),
        });
    }
    if let Some(cost) = config.cost_for(principal.tenant())
        && contract.cost_per_call() > 0
    {
        let label = match cost.period {
            BudgetPeriod::Day => today.to_string(),
            BudgetPeriod::Month => format!("{}-{:02}", today.year(), u8::from(today.month())),
        };
        out.push(BudgetReservation {
            key: format!("cost_units:{label}"),
            amount: contract.cost_per_call(),
            limit: cost.units,
            expires_at: end_of(today, cost.period) + Duration::days(1),
        });
    }
    out
}

fn end_of(day: Date, period: BudgetPeriod) -> OffsetDateTime {
    let last = match period {
        BudgetPeriod::Day => day,
        BudgetPeriod::Month => {
            let mut d = day;
            while let Some(next) = d.next_day().filter(|n| n.month() == day.month()) {
                d = next;
            }
            d
        }
    };
    last.next_day().unwrap_or(last).midnight().assume_utc()
}
