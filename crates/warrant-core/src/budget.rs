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
            key: key(&["calls_per_run:", run, ":", contract.name()], None),
            amount: 1,
            limit,
            expires_at: now + Duration::days(30),
        });
    }
    if let Some(limit) = budget.calls_per_day {
        out.push(BudgetReservation {
            key: day_key(principal.id(), contract.name(), today),
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

/// A counter key: `parts`, then `date` as `YYYY-MM-DD` (as `Date`'s `Display` writes it).
/// Built by hand: it is made on every call, and the formatting machinery costs more than the
/// rest of the budget stage's planning.
/// The counter of `principal`'s calls of the contract `name` on `day` (`calls_per_day`).
pub fn day_key(principal: &str, name: &str, day: Date) -> String {
    key(&["calls_per_day:", principal, ":", name, ":"], Some(day))
}

fn key(parts: &[&str], date: Option<Date>) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum::<usize>() + 10);
    for part in parts {
        out.push_str(part);
    }
    if let Some(date) = date {
        push_date(&mut out, date);
    }
    out
}

fn push_date(out: &mut String, date: Date) {
    let year = date.year();
    if !(0..=9999).contains(&year) {
        out.push_str(&date.to_string());
        return;
    }
    let digits = |out: &mut String, value: u32, width: u32| {
        for position in (0..width).rev() {
            let digit = value / 10u32.pow(position) % 10;
            out.push(char::from_digit(digit, 10).unwrap_or('0'));
        }
    };
    digits(out, year.unsigned_abs(), 4);
    out.push('-');
    digits(out, u32::from(u8::from(date.month())), 2);
    out.push('-');
    digits(out, u32::from(date.day()), 2);
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

/// The budget counters this node saw refuse a call, so that later calls the same counter
/// cannot admit are refused at the decision instead of after they ran (a read without
/// idempotency key reserves its budget in the commit that records it, after the call).
///
/// A counter is remembered with its limit and the smallest amount it refused, until its
/// window ends: a call asking at least that much of the same counter at the same limit is
/// refused. A contract version with another limit, or a smaller amount, still goes to the
/// store, which decides. Another node learns on its own first refusal. Bounded: when full,
/// it forgets everything (the store stays the authority).
#[derive(Debug, Default)]
pub struct ExhaustedBudgets {
    seen: std::sync::Mutex<std::collections::HashMap<RefusedCounter, (u64, OffsetDateTime)>>,
}

/// A counter that refused: tenant, key and limit.
type RefusedCounter = (String, String, u64);

/// How many refused counters a node remembers at most.
const EXHAUSTED_CAP: usize = 10_000;

impl ExhaustedBudgets {
    /// Remembers that `tenant`'s counter of `reservation` had no room for its amount.
    pub fn note(&self, tenant: &str, reservation: &BudgetReservation) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        if seen.len() >= EXHAUSTED_CAP {
            seen.clear();
        }
        let slot = seen
            .entry((tenant.to_owned(), reservation.key.clone(), reservation.limit))
            .or_insert((reservation.amount, reservation.expires_at));
        slot.0 = slot.0.min(reservation.amount);
    }

    /// The key of the first planned counter known to refuse its amount at `now`, if any.
    pub fn refuses(
        &self,
        tenant: &str,
        planned: &[BudgetReservation],
        now: OffsetDateTime,
    ) -> Option<String> {
        if planned.is_empty() {
            return None;
        }
        let seen = self.seen.lock().ok()?;
        if seen.is_empty() {
            return None;
        }
        planned.iter().find_map(|r| {
            let (amount, until) = seen.get(&(tenant.to_owned(), r.key.clone(), r.limit))?;
            (r.amount >= *amount && now < *until).then(|| r.key.clone())
        })
    }
}

/// The rejection of a call a budget counter had no room for, naming the budget by the
/// counter's kind (never its key: the key names principals and dates).
pub fn exhausted(key: &str) -> crate::decision::Rejection {
    let which = key.split(':').next().unwrap_or("budget");
    crate::decision::Rejection::new(
        crate::decision::RejectCode::BudgetExhausted,
        format!("the `{which}` budget is exhausted"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spell_dates_as_display_does() {
        for (y, m, d) in [
            (2026, 11, 29),
            (1, 1, 1),
            (0, 12, 31),
            (9999, 2, 3),
            (10_000, 1, 1),
            (-5, 6, 7),
        ] {
            let Ok(date) = Date::from_calendar_date(y, time::Month::try_from(m).unwrap(), d) else {
                continue;
            };
            assert_eq!(key(&["a:", "b"], Some(date)), format!("a:b{date}"));
        }
    }
}
