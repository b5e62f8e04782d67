//! What a step does with the values a run holds — pure, so every node computes the same thing
//! from the same recorded steps. The I/O (the store, `dispatch`) is the runner's, in
//! `warrant-server`.
//!
//! A run's values are one JSON scope: `{"input": …, "steps": {ID: {"output": …, "arguments":
//! …}}}`, the latest visit of each step.

use serde_json::{Map, Value};

use crate::compile::Compiled;
use crate::definition::{Arg, EndStatus, Exit, StepKind};
use crate::template::Reference;

/// What the runner does for a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Call the step's tool with these arguments (then go to `next`).
    Call {
        /// The arguments, bound.
        arguments: Map<String, Value>,
        /// Where the run goes after the call commits.
        next: String,
    },
    /// Ask the chat model to propose the arguments of the step's contract (then go to `next`).
    Propose {
        /// The prompt, bound.
        prompt: String,
        /// Where the run goes once the proposal is recorded.
        next: String,
    },
    /// Go to another step (a branch's choice), noting the exit taken.
    Goto {
        /// The next step.
        next: String,
        /// The exit taken (`case 1`, `else`).
        exit: String,
    },
    /// Ask for the review of the exact calls of the covered tool steps, then wait for the
    /// decision.
    Review {
        /// Each covered tool step and its arguments, bound now (Gate A: nothing between this
        /// review and the tool changes them).
        covers: Vec<(String, Map<String, Value>)>,
        /// Where an approval leads.
        on_approve: String,
        /// Where a rejection or expiry leads.
        on_reject: String,
    },
    /// End the run.
    End(EndStatus),
}

/// Why a step cannot act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepError {
    /// No step of that id (a definition changed under a run: never, as published versions
    /// are immutable).
    NoSuchStep(String),
    /// A bound value is absent from the run's scope.
    Unbound(String),
    /// A branch condition failed to evaluate, or did not yield a boolean.
    Condition(String),
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::NoSuchStep(id) => write!(f, "the workflow has no step `{id}`"),
            StepError::Unbound(r) => write!(f, "`${{{r}}}` has no value in this run"),
            StepError::Condition(e) => write!(f, "a branch condition failed: {e}"),
        }
    }
}

/// What step `id` does with `scope`.
///
/// # Errors
/// A [`StepError`].
pub fn action(compiled: &Compiled, id: &str, scope: &Value) -> Result<Action, StepError> {
    let step = compiled
        .definition
        .steps
        .iter()
        .find(|s| s.id == id)
        .ok_or_else(|| StepError::NoSuchStep(id.to_owned()))?;
    match &step.kind {
        StepKind::Tool(tool) => {
            let mut arguments = Map::new();
            for (field, arg) in &tool.with {
                arguments.insert(field.clone(), bind(arg, scope)?);
            }
            Ok(Action::Call {
                arguments,
                next: tool.next.clone(),
            })
        }
        StepKind::Branch(branch) => {
            for (i, case) in branch.cases.iter().enumerate() {
                if condition(&case.when, scope)? {
                    return Ok(Action::Goto {
                        next: case.next.clone(),
                        exit: format!("case {}", i + 1),
                    });
                }
            }
            Ok(Action::Goto {
                next: branch.otherwise.clone(),
                exit: "else".to_owned(),
            })
        }
        StepKind::End(end) => Ok(Action::End(end.status)),
        StepKind::Model(model) => Ok(Action::Propose {
            prompt: model
                .prompt
                .render(scope)
                .map_err(|r| StepError::Unbound(r.to_string()))?,
            next: model.next.clone(),
        }),
        StepKind::Review(review) => {
            let mut covers = Vec::with_capacity(review.covers.len());
            for covered in &review.covers {
                match action(compiled, covered, scope)? {
                    Action::Call { arguments, .. } => covers.push((covered.clone(), arguments)),
                    _ => return Err(StepError::NoSuchStep(covered.clone())),
                }
            }
            Ok(Action::Review {
                covers,
                on_approve: review.on_approve.clone(),
                on_reject: review.on_reject.clone(),
            })
        }
    }
}

/// The exit label a step's `exit` is written with (for records).
pub fn exit_label(exit: Exit) -> String {
    match exit {
        Exit::Next => "next".to_owned(),
        Exit::Approve => "approve".to_owned(),
        Exit::Reject => "reject".to_owned(),
        Exit::Case(i) => format!("case {}", i + 1),
        Exit::Else => "else".to_owned(),
    }
}

fn value_of(reference: &Reference, scope: &Value) -> Result<Value, StepError> {
    reference
        .lookup(scope)
        .cloned()
        .ok_or_else(|| StepError::Unbound(reference.to_string()))
}

fn bind(arg: &Arg, scope: &Value) -> Result<Value, StepError> {
    match arg {
        Arg::Static(v) => Ok(v.clone()),
        Arg::Bound(r) => value_of(r, scope),
        Arg::Text(t) => t
            .render(scope)
            .map(Value::String)
            .map_err(|r| StepError::Unbound(r.to_string())),
        Arg::List(items) => items
            .iter()
            .map(|a| bind(a, scope))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
    }
}

/// Evaluates a CEL condition over the run's `input` and `steps`.
///
/// # Errors
/// A condition that does not parse, fails, or yields something other than a boolean.
pub fn condition(when: &str, scope: &Value) -> Result<bool, StepError> {
    let program = cel::Program::compile(when).map_err(|e| StepError::Condition(e.to_string()))?;
    let mut context = cel::Context::default();
    for name in ["input", "steps"] {
        let value = scope.get(name).cloned().unwrap_or(Value::Object(Map::new()));
        let value = cel::to_value(value).map_err(|e| StepError::Condition(e.to_string()))?;
        context.add_variable_from_value(name, value);
    }
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(StepError::Condition(format!(
            "`{when}` yields {other:?}, not a boolean"
        ))),
        Err(e) => Err(StepError::Condition(format!("`{when}`: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_read_the_scope_and_must_be_boolean() {
        let scope = json!({"input": {"amount": 20000}, "steps": {"look": {"output": {"status": "paid"}}}});
        assert_eq!(condition("input.amount > 10000", &scope), Ok(true));
        assert_eq!(
            condition("steps.look.output.status == 'refunded'", &scope),
            Ok(false)
        );
        assert!(matches!(
            condition("input.amount", &scope),
            Err(StepError::Condition(_))
        ));
        assert!(matches!(
            condition("input.missing > 1", &scope),
            Err(StepError::Condition(_))
        ));
        assert_eq!(condition("has(input.missing)", &scope), Ok(false));
    }
}
