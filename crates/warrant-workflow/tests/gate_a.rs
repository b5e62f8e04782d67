//! Gate A and the compiler's other rules: the shipped example, a table of sneaky bypasses
//! (each refused with its rule and the path that proves it), binding and tool rules, and a
//! property test holding the graph searches to a brute-force enumeration of walks.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::type_complexity,
    reason = "test code: a failed expectation is a panic with its message"
)]

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use warrant_core::Contract;
use warrant_core::contract::DocumentFormat;
use warrant_workflow::compile::{GateA, check_tool};
use warrant_workflow::definition::Exit;
use warrant_workflow::graph::Graph;
use warrant_workflow::{Rule, StaticCatalog, Violation, compile_text};

const CREDIT: &str = include_str!("../../../examples/contracts/create_support_credit.v1.yaml");
const EMAIL: &str = include_str!("../../../examples/contracts/send_email.v1.yaml");
const LOOKUP: &str = include_str!("../../../examples/contracts/lookup_order.v1.yaml");
const EXAMPLE: &str = include_str!("../../../examples/workflows/credit_after_review.yaml");

fn contract(text: &str) -> Arc<Contract> {
    Arc::new(Contract::from_text(text, DocumentFormat::Yaml).unwrap())
}

fn catalog() -> StaticCatalog {
    StaticCatalog::new([contract(CREDIT), contract(EMAIL), contract(LOOKUP)])
}

/// A definition with the example's header and input, and `steps` (YAML, indented two spaces).
fn workflow(steps: &str) -> String {
    format!(
        "name: w\nversion: 1\ndescription: test\ninput:\n  type: object\n  additionalProperties: false\n  \
         required: [customer_id, email, big]\n  properties:\n    customer_id: {{ type: string, maxLength: 36 }}\n    \
         email: {{ type: string, maxLength: 254 }}\n    big: {{ type: boolean }}\n    note: {{ type: string, maxLength: 100 }}\n    \
         count: {{ type: integer, minimum: 1, maximum: 9 }}\nsteps:\n{steps}"
    )
}

fn violations(text: &str) -> Vec<Violation> {
    match compile_text(text, DocumentFormat::Yaml, &catalog()) {
        Ok(_) => panic!("compiled, but should have been refused:\n{text}"),
        Err(v) => v,
    }
}

fn rules(v: &[Violation]) -> BTreeSet<Rule> {
    v.iter().map(|v| v.rule).collect()
}

fn only(text: &str, rule: Rule) -> Violation {
    let v = violations(text);
    assert_eq!(rules(&v), BTreeSet::from([rule]), "{v:#?}");
    v.into_iter().next().unwrap()
}

const CREDIT_STEP: &str = "  - id: credit\n    tool: create_support_credit@1\n    with: { customer_id: \"${input.customer_id}\", amount_cents: 500, reason: goodwill }\n    next: done\n";
const DONE: &str = "  - id: done\n    end: { status: completed }\n";

#[test]
fn the_example_compiles_pinned_with_every_write_reviewed() {
    let compiled = compile_text(EXAMPLE, DocumentFormat::Yaml, &catalog()).unwrap_or_else(|v| {
        panic!(
            "{}",
            v.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
        )
    });
    let pinned = compiled.pinned();
    assert_eq!(pinned["credit"], contract(CREDIT).id());
    assert_eq!(pinned["notify"], contract(EMAIL).id());
    assert_eq!(pinned["draft"], contract(CREDIT).id());
    let coverage: Vec<(&str, bool, Vec<&str>)> = compiled
        .coverage
        .iter()
        .map(|c| {
            (
                c.step.as_str(),
                c.review_required,
                c.reviews.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        coverage,
        vec![
            ("credit", true, vec!["review_credit"]),
            ("notify", true, vec!["review_notice"]),
            ("sorry", true, vec!["review_apology"]),
        ]
    );
}

#[test]
fn a_branch_around_the_review_is_refused_with_its_path() {
    let text = workflow(&format!(
        "  - id: b2\n    branch:\n      cases: [{{ when: \"input.big\", next: review }}]\n      else: credit\n  \
         - id: review\n    review: {{ covers: [credit], reviewers: {{ role: supervisor }} }}\n    on_approve: credit\n    on_reject: done\n\
         {CREDIT_STEP}{DONE}"
    ));
    let v = only(&text, Rule::UnreviewedPath);
    assert_eq!(v.step.as_deref(), Some("credit"));
    assert_eq!(v.path.as_deref(), Some("entry → branch(b2: else) → credit"));
}

#[test]
fn a_review_of_another_step_does_not_cover() {
    let text = workflow(&format!(
        "  - id: review\n    review: {{ covers: [notify], reviewers: {{ role: supervisor }} }}\n    on_approve: credit\n    on_reject: done\n\
         {CREDIT_STEP}  - id: notify\n    tool: send_email@1\n    with: {{ to: [\"${{input.email}}\"], subject: s, body: b }}\n    next: done\n{DONE}"
    ));
    let v = violations(&text);
    let credit = v.iter().find(|v| v.step.as_deref() == Some("credit")).unwrap();
    assert_eq!(credit.rule, Rule::UnreviewedPath);
    assert_eq!(
        credit.path.as_deref(),
        Some("entry → review(review: approve) → credit")
    );
    // `notify` is unreachable, and so refused too.
    assert!(rules(&v).contains(&Rule::Unreachable), "{v:#?}");
}

#[test]
fn a_loop_back_past_the_review_is_refused() {
    let text = workflow(&format!(
        "  - id: review\n    review: {{ covers: [credit], reviewers: {{ role: supervisor }} }}\n    on_approve: credit\n    on_reject: done\n\
         - id: credit\n    max_visits: 3\n    tool: create_support_credit@1\n    with: {{ customer_id: \"${{input.customer_id}}\", amount_cents: 500, reason: goodwill }}\n    next: again\n  \
         - id: again\n    branch:\n      cases: [{{ when: \"input.big\", next: credit }}]\n      else: done\n{DONE}"
    ).replace("\n- id: credit", "\n  - id: credit"));
    let v = only(&text, Rule::ReentryWithoutReview);
    assert_eq!(
        v.path.as_deref(),
        Some("entry → review(review: approve) → credit → branch(again: case 1) → credit")
    );
}

#[test]
fn a_loop_back_through_the_review_is_accepted_when_bounded() {
    let steps = format!(
        "  - id: review\n    max_visits: 3\n    review: {{ covers: [credit], reviewers: {{ role: supervisor }} }}\n    on_approve: credit\n    on_reject: done\n\
         {}  - id: again\n    branch:\n      cases: [{{ when: \"input.big\", next: review }}]\n      else: done\n{DONE}",
        CREDIT_STEP.replace("next: done", "next: again")
    );
    compile_text(&workflow(&steps), DocumentFormat::Yaml, &catalog()).unwrap();
    // The same cycle without a bound is refused, with the cycle.
    let v = only(
        &workflow(&steps.replace("    max_visits: 3\n", "")),
        Rule::UnboundedCycle,
    );
    assert_eq!(
        v.path.as_deref(),
        Some("review(review: approve) → credit → branch(again: case 1) → review")
    );
}

#[test]
fn a_reject_routed_into_the_tool_is_refused() {
    let text = workflow(&format!(
        "  - id: review\n    review: {{ covers: [credit], reviewers: {{ role: supervisor }} }}\n    on_approve: credit\n    on_reject: fallback\n  \
         - id: fallback\n    branch:\n      cases: [{{ when: \"input.big\", next: done }}]\n      else: credit\n{CREDIT_STEP}{DONE}"
    ));
    let v = only(&text, Rule::RejectReachesTool);
    assert_eq!(
        v.path.as_deref(),
        Some("entry → review(review: reject) → branch(fallback: else) → credit")
    );
}

#[test]
fn a_model_step_between_review_and_tool_is_refused() {
    let text = workflow(&format!(
        "  - id: review\n    review: {{ covers: [credit], reviewers: {{ role: supervisor }} }}\n    on_approve: draft\n    on_reject: done\n  \
         - id: draft\n    model: {{ propose: create_support_credit@1, prompt: \"credit for ${{input.customer_id}}\" }}\n    next: credit\n  \
         - id: credit\n    tool: create_support_credit@1\n    with: {{ customer_id: \"${{input.customer_id}}\", amount_cents: \"${{steps.draft.arguments.amount_cents}}\", reason: r }}\n    next: done\n{DONE}"
    ));
    let v = violations(&text);
    assert!(rules(&v).iter().all(|r| *r == Rule::ValueAfterReview), "{v:#?}");
    let after = v
        .iter()
        .find(|v| v.message.contains("runs after review"))
        .unwrap();
    assert_eq!(
        after.path.as_deref(),
        Some("entry → review(review: approve) → draft → credit")
    );
}

#[test]
fn two_reviews_covering_one_tool_on_different_paths_are_accepted() {
    let text = workflow(&format!(
        "  - id: pick\n    branch:\n      cases: [{{ when: \"input.big\", next: senior }}]\n      else: junior\n  \
         - id: senior\n    review: {{ covers: [credit], reviewers: {{ role: director }} }}\n    on_approve: credit\n    on_reject: done\n  \
         - id: junior\n    review: {{ covers: [credit], reviewers: {{ role: supervisor }} }}\n    on_approve: credit\n    on_reject: done\n\
         {CREDIT_STEP}{DONE}"
    ));
    let compiled = compile_text(&text, DocumentFormat::Yaml, &catalog()).unwrap();
    assert_eq!(compiled.coverage[0].reviews, vec!["senior", "junior"]);
}

#[test]
fn a_read_needs_no_review_unless_the_workflow_says_so() {
    let read =
        "  - id: look\n    tool: lookup_order@1\n    with: { order_id: ord_7Hq2Lm9Xv3 }\n    next: done\n";
    compile_text(
        &workflow(&format!("{read}{DONE}")),
        DocumentFormat::Yaml,
        &catalog(),
    )
    .unwrap();
    let strict = workflow(&format!("{read}{DONE}"))
        .replace("steps:\n", "review_required_for: [read, write]\nsteps:\n");
    let v = only(&strict, Rule::UnreviewedPath);
    assert_eq!(v.path.as_deref(), Some("entry → look"));
}

#[test]
fn tools_must_be_registered_current_and_pinned() {
    let steps = |tool: &str| {
        workflow(&format!(
            "  - id: look\n    tool: {tool}\n    with: {{ order_id: ord_7Hq2Lm9Xv3 }}\n    next: done\n{DONE}"
        ))
    };
    assert_eq!(violations(&steps("lookup_order"))[0].rule, Rule::Grammar);
    assert_eq!(
        only(&steps("lookup_order@2"), Rule::UnknownTool).step.as_deref(),
        Some("look")
    );
    let lookup = contract(LOOKUP);
    let retired = StaticCatalog::new([lookup.clone()]).retire(lookup.id());
    let v = compile_text(&steps("lookup_order@1"), DocumentFormat::Yaml, &retired).unwrap_err();
    assert_eq!(rules(&v), BTreeSet::from([Rule::RetiredTool]));
    // Named by content id: the same contract, pinned.
    let by_id = compile_text(&steps(&lookup.id().to_string()), DocumentFormat::Yaml, &catalog()).unwrap();
    assert_eq!(by_id.pinned()["look"], lookup.id());
}

#[test]
fn bindings_are_checked_against_both_schemas() {
    let tool = |with: &str| {
        workflow(&format!(
            "  - id: review\n    review: {{ covers: [credit], reviewers: {{ role: supervisor }} }}\n    on_approve: credit\n    on_reject: done\n  \
             - id: credit\n    tool: create_support_credit@1\n    with: {with}\n    next: done\n{DONE}"
        ))
    };
    let v = only(
        &tool("{ customer_id: \"${input.nope}\", amount_cents: 5, reason: r }"),
        Rule::Binding,
    );
    assert_eq!(v.pointer, "/steps/1/with/customer_id");
    only(
        &tool("{ customer_id: \"${input.customer_id}\", amount_cents: \"${input.email}\", reason: r }"),
        Rule::BindingType,
    );
    // Optional into required.
    only(
        &tool("{ customer_id: \"${input.customer_id}\", amount_cents: \"${input.count}\", reason: r }"),
        Rule::BindingType,
    );
    let v = only(
        &tool("{ customer_id: \"${input.customer_id}\", reason: r }"),
        Rule::UnboundInput,
    );
    assert!(v.message.contains("amount_cents"), "{}", v.message);
    let v = only(
        &tool("{ customer_id: \"${input.customer_id}\", amount_cents: 0, reason: r }"),
        Rule::StaticValue,
    );
    assert_eq!(v.pointer, "/steps/1/with/amount_cents");
    only(
        &tool("{ customer_id: \"${input.customer_id}\", amount_cents: 5, reason: r, memo: x }"),
        Rule::Binding,
    );
    // Text goes only into strings, and interpolates scalars only.
    only(
        &tool("{ customer_id: \"${input.customer_id}\", amount_cents: \"n ${input.count}\", reason: r }"),
        Rule::BindingType,
    );
}

#[test]
fn a_binding_to_a_step_that_may_not_have_run_is_refused() {
    let text = workflow(&format!(
        "  - id: b\n    branch:\n      cases: [{{ when: \"input.big\", next: look }}]\n      else: review\n  \
         - id: look\n    tool: lookup_order@1\n    with: {{ order_id: ord_7Hq2Lm9Xv3 }}\n    next: review\n  \
         - id: review\n    review: {{ covers: [credit], reviewers: {{ role: supervisor }} }}\n    on_approve: credit\n    on_reject: done\n  \
         - id: credit\n    tool: create_support_credit@1\n    with: {{ customer_id: \"${{input.customer_id}}\", amount_cents: 5, reason: \"${{steps.look.output.status}}\" }}\n    next: done\n{DONE}"
    ));
    let v = violations(&text);
    let binding = v.iter().find(|v| v.rule == Rule::Binding).unwrap();
    assert_eq!(
        binding.path.as_deref(),
        Some("entry → branch(b: else) → review(review: approve) → credit")
    );
    // The review could not show the payload either.
    assert!(rules(&v).contains(&Rule::ValueAfterReview), "{v:#?}");
}

#[test]
fn conditions_are_cel_over_known_fields() {
    let branch = |when: &str| {
        workflow(&format!(
            "  - id: b\n    branch:\n      cases: [{{ when: '{when}', next: done }}]\n      else: done\n{DONE}"
        ))
    };
    compile_text(
        &branch("input.big && size(input.email) > 3"),
        DocumentFormat::Yaml,
        &catalog(),
    )
    .unwrap();
    compile_text(
        &branch("[1, 2].exists(x, x > input.count)"),
        DocumentFormat::Yaml,
        &catalog(),
    )
    .unwrap();
    only(&branch("input.big &&"), Rule::Condition);
    only(&branch("input.nope == 1"), Rule::Binding);
    only(&branch("secrets.key == 1"), Rule::Condition);
    only(&branch("steps.ghost.output.x == 1"), Rule::Binding);
}

// ---------------------------------------------------------------------------------------------
// The graph searches against brute force.

/// A random graph with at least one tool step: kinds, and each node's exits. (Drawn freely,
/// a third of small graphs had no tool step; discarding them exhausted proptest's budget of
/// rejects past about 3,000 cases, so one node, drawn too, is made a tool step.)
fn arbitrary_graph() -> impl Strategy<Value = (Vec<&'static str>, Vec<Vec<(Exit, usize)>>)> {
    (2_usize..=6).prop_flat_map(|n| {
        let kind = prop_oneof![
            Just("tool"),
            Just("review"),
            Just("branch"),
            Just("end"),
            Just("model")
        ];
        (
            proptest::collection::vec(kind, n),
            proptest::collection::vec((0..n, 0..n), n),
            0..n,
        )
            .prop_map(|(mut kinds, targets, tool)| {
                kinds[tool] = "tool";
                let edges = kinds
                    .iter()
                    .zip(&targets)
                    .map(|(kind, &(a, b))| match *kind {
                        "tool" | "model" => vec![(Exit::Next, a)],
                        "review" => vec![(Exit::Approve, a), (Exit::Reject, b)],
                        "branch" => vec![(Exit::Case(0), a), (Exit::Else, b)],
                        _ => vec![],
                    })
                    .collect();
                (kinds, edges)
            })
    })
}

/// Every walk from the entry in which no node appears more than `cap` times.
fn walks(graph: &Graph, cap: usize) -> Vec<Vec<(usize, Option<Exit>)>> {
    fn go(
        graph: &Graph,
        cap: usize,
        walk: &mut Vec<(usize, Option<Exit>)>,
        counts: &mut Vec<usize>,
        out: &mut Vec<Vec<(usize, Option<Exit>)>>,
    ) {
        out.push(walk.clone());
        let Some(&(last, _)) = walk.last() else { return };
        for &(exit, next) in graph.exits(last) {
            if counts[next] >= cap {
                continue;
            }
            walk.last_mut().unwrap().1 = Some(exit);
            walk.push((next, None));
            counts[next] += 1;
            go(graph, cap, walk, counts, out);
            counts[next] -= 1;
            walk.pop();
            walk.last_mut().unwrap().1 = None;
        }
    }
    let mut counts = vec![0; graph.len()];
    counts[0] = 1;
    let mut out = Vec::new();
    go(graph, cap, &mut vec![(0, None)], &mut counts, &mut out);
    out
}

/// Gate A on one walk that ends at `tool`, by its definition: the rules it breaks.
fn broken(
    walk: &[(usize, Option<Exit>)],
    tool: usize,
    covering: &BTreeSet<usize>,
    producers: &BTreeSet<usize>,
) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    let end = walk.len() - 1;
    match (0..end).rev().find(|&i| covering.contains(&walk[i].0)) {
        None => {
            out.insert(Rule::UnreviewedPath);
        }
        Some(i) if walk[i].1 == Some(Exit::Reject) => {
            out.insert(Rule::RejectReachesTool);
        }
        Some(i) => {
            for &(node, _) in &walk[i + 1..end] {
                if node == tool {
                    out.insert(Rule::ReentryWithoutReview);
                } else if producers.contains(&node) {
                    out.insert(Rule::ValueAfterReview);
                }
            }
        }
    }
    out
}

proptest! {
    // `PROPTEST_CASES` draws more for a longer search.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    /// For random graphs, tool steps, covering reviews and producers, the rules the graph
    /// searches find are exactly the rules some walk from the entry breaks.
    #[test]
    fn gate_a_agrees_with_brute_force(
        (kinds, edges) in arbitrary_graph(),
        pick in any::<proptest::sample::Index>(),
        cover_mask in any::<u8>(),
        producer_mask in any::<u8>(),
    ) {
        let n = kinds.len();
        let graph = Graph::from_edges(kinds.clone(), edges);
        let tools: Vec<usize> = (0..n).filter(|&i| kinds[i] == "tool").collect();
        let tool = tools[pick.index(tools.len())];
        let covering: BTreeSet<usize> = (0..n).filter(|&i| kinds[i] == "review" && cover_mask & (1 << i) != 0).collect();
        let producers: BTreeSet<usize> = (0..n)
            .filter(|&i| i != tool && matches!(kinds[i], "tool" | "model") && producer_mask & (1 << i) != 0)
            .collect();

        let expected: BTreeSet<Rule> = walks(&graph, 3)
            .iter()
            .filter(|w| w.last().is_some_and(|&(node, _)| node == tool))
            .flat_map(|w| broken(w, tool, &covering, &producers))
            .collect();
        let found: BTreeSet<Rule> = check_tool(&graph, tool, &covering, &producers)
            .iter()
            .filter(|v| !matches!(v, GateA::NotYet { .. }))
            .map(GateA::rule)
            .collect();
        prop_assert_eq!(&found, &expected, "graph {:?}", (0..n).map(|i| (kinds[i], graph.exits(i).to_vec())).collect::<Vec<_>>());

        // Every witness is a real walk from the entry that ends at the tool.
        for v in check_tool(&graph, tool, &covering, &producers) {
            let path = v.path();
            prop_assert_eq!(path.first().map(|h| h.node), Some(0));
            prop_assert_eq!(path.last().map(|h| h.node), Some(if matches!(v, GateA::NotYet { .. }) { path.last().unwrap().node } else { tool }));
            for pair in path.windows(2) {
                let exit = pair[0].exit.unwrap();
                prop_assert_eq!(graph.target(pair[0].node, exit), Some(pair[1].node));
            }
        }
    }
}
