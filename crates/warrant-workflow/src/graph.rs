//! The step graph: nodes are steps (index 0 is the entry), edges are their exits. The
//! questions Gate A asks — can this step be reached while avoiding those, which path, does
//! this step dominate that one, is there a cycle — are breadth-first searches over a few
//! hundred nodes at most, answered with the path that proves them.

use std::collections::VecDeque;

use crate::definition::{Exit, Step};

/// A step graph with resolved edges.
#[derive(Debug, Clone)]
pub struct Graph {
    ids: Vec<String>,
    kinds: Vec<&'static str>,
    edges: Vec<Vec<(Exit, usize)>>,
}

/// One hop of a path: a step and the exit taken out of it (`None` for the last step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The step's index.
    pub node: usize,
    /// How the path left it.
    pub exit: Option<Exit>,
}

impl Graph {
    /// The graph of `steps`, or the exits that name no step (step index, exit, target).
    ///
    /// # Errors
    /// Every exit whose target is not a step id.
    pub fn of(steps: &[Step]) -> Result<Graph, Vec<(usize, Exit, String)>> {
        let index = |id: &str| steps.iter().position(|s| s.id == id);
        let mut missing = Vec::new();
        let mut edges = Vec::with_capacity(steps.len());
        for (i, step) in steps.iter().enumerate() {
            let mut out = Vec::new();
            for (exit, target) in step.exits() {
                match index(target) {
                    Some(t) => out.push((exit, t)),
                    None => missing.push((i, exit, target.to_owned())),
                }
            }
            edges.push(out);
        }
        if !missing.is_empty() {
            return Err(missing);
        }
        Ok(Graph {
            ids: steps.iter().map(|s| s.id.clone()).collect(),
            kinds: steps.iter().map(|s| s.kind.name()).collect(),
            edges,
        })
    }

    /// A graph from raw edges (for tests and generators): node `i` is named `s<i>`.
    pub fn from_edges(kinds: Vec<&'static str>, edges: Vec<Vec<(Exit, usize)>>) -> Graph {
        Graph {
            ids: (0..kinds.len()).map(|i| format!("s{i}")).collect(),
            kinds,
            edges,
        }
    }

    /// The number of steps.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no steps.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// A step's id.
    pub fn id(&self, node: usize) -> &str {
        self.ids.get(node).map_or("?", String::as_str)
    }

    /// A step's exits.
    pub fn exits(&self, node: usize) -> &[(Exit, usize)] {
        self.edges.get(node).map_or(&[], Vec::as_slice)
    }

    /// The target of `node`'s `exit`.
    pub fn target(&self, node: usize, exit: Exit) -> Option<usize> {
        self.exits(node).iter().find(|(e, _)| *e == exit).map(|(_, t)| *t)
    }

    /// A shortest path from `from` to `to` that enters no node for which `blocked` holds
    /// (`from` itself must not be blocked; `to` may be reached even if blocked). With
    /// `min_one_edge`, `from == to` needs a cycle back to it.
    pub fn path(
        &self,
        from: usize,
        to: usize,
        min_one_edge: bool,
        blocked: &dyn Fn(usize) -> bool,
    ) -> Option<Vec<Hop>> {
        if blocked(from) {
            return None;
        }
        if from == to && !min_one_edge {
            return Some(vec![Hop {
                node: from,
                exit: None,
            }]);
        }
        let n = self.len();
        // parent[v] = (u, exit) for the first discovery of v from `from`'s exits.
        let mut parent: Vec<Option<(usize, Exit)>> = vec![None; n];
        let mut seen = vec![false; n];
        let mut queue = VecDeque::new();
        queue.push_back(from);
        while let Some(u) = queue.pop_front() {
            for &(exit, v) in self.exits(u) {
                if v == to {
                    // Rebuild u's path back to `from`, then add the last hop.
                    let mut hops = vec![
                        Hop { node: to, exit: None },
                        Hop {
                            node: u,
                            exit: Some(exit),
                        },
                    ];
                    let mut at = u;
                    while at != from {
                        let Some((p, e)) = parent.get(at).copied().flatten() else {
                            break;
                        };
                        hops.push(Hop {
                            node: p,
                            exit: Some(e),
                        });
                        at = p;
                    }
                    hops.reverse();
                    return Some(hops);
                }
                if v != from
                    && !blocked(v)
                    && let Some(slot) = seen.get_mut(v)
                    && !*slot
                {
                    *slot = true;
                    if let Some(p) = parent.get_mut(v) {
                        *p = Some((u, exit));
                    }
                    queue.push_back(v);
                }
            }
        }
        None
    }

    /// Whether `to` can be reached from `from` without entering a blocked node (see [`path`](Self::path)).
    pub fn reaches(
        &self,
        from: usize,
        to: usize,
        min_one_edge: bool,
        blocked: &dyn Fn(usize) -> bool,
    ) -> bool {
        self.path(from, to, min_one_edge, blocked).is_some()
    }

    /// The nodes reachable from the entry.
    pub fn reachable(&self) -> Vec<bool> {
        let mut seen = vec![false; self.len()];
        if self.is_empty() {
            return seen;
        }
        let mut stack = vec![0];
        if let Some(s) = seen.get_mut(0) {
            *s = true;
        }
        while let Some(u) = stack.pop() {
            for &(_, v) in self.exits(u) {
                if let Some(s) = seen.get_mut(v)
                    && !*s
                {
                    *s = true;
                    stack.push(v);
                }
            }
        }
        seen
    }

    /// Whether every path from the entry to `node` passes through `dominator` (a node
    /// dominates itself; an unreachable node is dominated by everything).
    pub fn dominates(&self, dominator: usize, node: usize) -> bool {
        dominator == node || !self.reaches(0, node, false, &|v| v == dominator)
    }

    /// A cycle among the nodes for which `counted` holds and that are reachable from the
    /// entry, as a path from one of its nodes back to itself.
    pub fn cycle(&self, counted: &dyn Fn(usize) -> bool) -> Option<Vec<Hop>> {
        let reachable = self.reachable();
        (0..self.len())
            .filter(|&v| reachable.get(v).copied().unwrap_or(false) && counted(v))
            .find_map(|v| self.path(v, v, true, &|u| !counted(u)))
    }

    /// The path written for people: `entry → draft → branch(b2: else) → review(r: reject) → sorry`.
    pub fn render(&self, hops: &[Hop], from_entry: bool) -> String {
        let mut out = Vec::with_capacity(hops.len() + 1);
        if from_entry {
            out.push("entry".to_owned());
        }
        for hop in hops {
            let id = self.id(hop.node);
            let kind = self.kinds.get(hop.node).copied().unwrap_or("");
            out.push(match (kind, hop.exit) {
                ("branch", Some(Exit::Case(i))) => format!("branch({id}: case {})", i + 1),
                ("branch", Some(Exit::Else)) => format!("branch({id}: else)"),
                ("review", Some(Exit::Approve)) => format!("review({id}: approve)"),
                ("review", Some(Exit::Reject)) => format!("review({id}: reject)"),
                _ => id.to_owned(),
            });
        }
        out.join(" → ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line() -> Graph {
        // s0 → s1 → s2, s1 → s0 (a branch)
        Graph::from_edges(
            vec!["tool", "branch", "end"],
            vec![
                vec![(Exit::Next, 1)],
                vec![(Exit::Case(0), 0), (Exit::Else, 2)],
                vec![],
            ],
        )
    }

    #[test]
    fn paths_avoid_blocked_nodes_and_render() {
        let g = line();
        let p = g.path(0, 2, false, &|_| false).unwrap();
        assert_eq!(g.render(&p, true), "entry → s0 → branch(s1: else) → s2");
        assert!(g.path(0, 2, false, &|v| v == 1).is_none());
        let cycle = g.path(0, 0, true, &|_| false).unwrap();
        assert_eq!(g.render(&cycle, false), "s0 → branch(s1: case 1) → s0");
        assert!(g.dominates(1, 2));
        assert!(!g.dominates(2, 1));
        assert!(g.cycle(&|_| true).is_some());
        assert!(g.cycle(&|v| v != 1).is_none());
    }
}
