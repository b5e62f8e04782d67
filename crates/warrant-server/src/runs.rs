//! Workflow runs: starting one, and the runner that executes their steps as jobs.
//!
//! A run's next step is a job of kind [`STEP_JOB`] in the store, claimed by any node under a
//! lease; a node that dies mid-step loses its lease and another claims the job again. Each step
//! commits with what follows it (`Store::advance_run`: the step's row, the run's next step and
//! that step's job, in one transaction, only while the run expects that step), so a step is
//! recorded once however many nodes try it.
//!
//! **A tool step is a call through `dispatch`** — the pipeline every lane uses — as the
//! principal that started the run, with the run and step ids on its ledger row and an
//! idempotency key derived from the run, the step and its visit (`<run id>.<step id>.<visit>`):
//! a step tried again after a crash replays the stored outcome, or reconciles an unknown one,
//! and never repeats an effect; a bounded loop's next visit is a new operation.
//!
//! A run started on a node that runs a runner is handed to it with its first step's job
//! already claimed and the run's record (`Store::start_run_claimed`); a step recorded with its
//! next step's job hands that job, the run as the record left it and its recorded steps to the
//! same worker, which runs it at once without claiming or reading anything. The record's
//! transaction is where a cancellation is seen (it refuses to record a step of a run that is no
//! longer running): a run cancelled while a step calls its tool takes no further step.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use warrant_core::authority::Principal;
use warrant_core::decision::{Outcome, RejectCode};
use warrant_core::json::Limits;
use warrant_core::pipeline::Call;
use warrant_core::proposal::Envelope;
use warrant_core::records::{
    Advanced, Handoff, Job, JobCompletion, NewJob, ReviewerRule, RunAdvance, RunRecord, RunStatus, RunStep,
    StepFollowUp, WorkflowRecord,
};
use warrant_core::store::StoreError;
use warrant_runtime::model::ModelError;
use warrant_runtime::{Dispatched, OwnedCall, submit};
use warrant_workflow::compile::{Compiled, Found};
use warrant_workflow::definition::{self, EndStatus, StepKind, ToolRef};
use warrant_workflow::run::{Action, action};

use crate::state::AppState;

/// The job kind of a run's next step.
pub const STEP_JOB: &str = "workflow.step";
/// How long a claimed step is a node's before another may take it: longer than the longest
/// step — a tool step's call deadline, or a model step's request — with a margin, so a live
/// node keeps its step and a dead node's step is taken over soon after.
fn lease(state: &AppState) -> Duration {
    let model = state
        .model
        .as_ref()
        .map_or(Duration::ZERO, |m| m.endpoint().timeout);
    state.runtime.settings().retry.deadline.max(model) + Duration::from_secs(10)
}
/// A job is dead after this many attempts (its run is then failed by the dead-letter sweep).
const MAX_ATTEMPTS: u32 = 20;
/// How often an idle runner looks for due steps (steps this node makes due wake it at once:
/// [`AppState::runs_due`]).
const IDLE_POLL: Duration = Duration::from_secs(1);

/// A published workflow compiled for running: its steps resolved to the contracts it pinned.
///
/// # Errors
/// Why it cannot be compiled (a pinned contract no longer readable; never for a definition
/// that was published by this version of the compiler).
pub async fn compiled_for(state: &AppState, record: &WorkflowRecord) -> Result<Arc<Compiled>, String> {
    if let Some(compiled) = cached(state, &record.tenant, &record.digest) {
        return Ok(compiled);
    }
    let definition = definition::from_document(&record.document)
        .map_err(|p| p.first().map_or_else(String::new, ToString::to_string))?;
    let now = state.env.now();
    let mut catalog: std::collections::BTreeMap<ToolRef, Found> = std::collections::BTreeMap::new();
    for step in &definition.steps {
        let tool = match &step.kind {
            StepKind::Tool(t) => &t.tool,
            StepKind::Model(m) => &m.propose,
            _ => continue,
        };
        let Some(pinned) = record.pinned.get(&step.id) else {
            return Err(format!("step `{}` has no pinned contract", step.id));
        };
        let contract = state
            .registry
            .by_id(&record.tenant, pinned, now)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "the pinned contract {pinned} of step `{}` is not registered",
                    step.id
                )
            })?;
        catalog.insert(tool.clone(), Found::Active(contract));
    }
    let compiled = Arc::new(
        warrant_workflow::compile(definition, &catalog)
            .map_err(|v| v.first().map_or_else(String::new, ToString::to_string))?,
    );
    if let Ok(mut c) = state.compiled_workflows.lock() {
        c.insert((record.tenant.clone(), record.digest.clone()), compiled.clone());
    }
    Ok(compiled)
}

/// A workflow this node compiled already, by tenant and definition digest (the same
/// definition pins other contracts in another tenant).
fn cached(state: &AppState, tenant: &str, digest: &str) -> Option<Arc<Compiled>> {
    state
        .compiled_workflows
        .lock()
        .ok()?
        .get(&(tenant.to_owned(), digest.to_owned()))
        .cloned()
}

/// Why a run was not started.
#[derive(Debug)]
pub enum StartRefusal {
    /// The workflow cannot run on this server (code, reason): its pinned contracts are gone
    /// (`WORKFLOW_NOT_RUNNABLE`), or it has model steps and no model endpoint is configured
    /// (`MODEL_NOT_CONFIGURED`).
    NotRunnable(&'static str, String),
    /// The input is not strict JSON.
    Input(String),
    /// The input fails the workflow's input schema.
    Schema(warrant_core::decision::Rejection),
    /// The store failed.
    Store(StoreError),
}

/// Starts a run of `workflow` as `principal` with the input `bytes` (strict JSON held to the
/// workflow's input schema): the run record and its first step's job, in one transaction.
/// Every lane that starts runs (HTTP, MCP) calls this.
///
/// # Errors
/// A [`StartRefusal`]; nothing is recorded then.
pub async fn start(
    state: &AppState,
    principal: &Principal,
    workflow: &WorkflowRecord,
    bytes: &[u8],
) -> Result<RunRecord, StartRefusal> {
    start_with_id(state, principal, workflow, bytes, state.env.new_id("run")).await
}

/// [`start`] with the run's id chosen by the caller (`run_…`): an inbound event derives it from
/// the event, so acting on the event twice finds the run it started (a conflict).
///
/// # Errors
/// A [`StartRefusal`]; `StartRefusal::Store(StoreError::Conflict)` when a run has that id.
pub async fn start_with_id(
    state: &AppState,
    principal: &Principal,
    workflow: &WorkflowRecord,
    bytes: &[u8],
    id: String,
) -> Result<RunRecord, StartRefusal> {
    let compiled = compiled_for(state, workflow)
        .await
        .map_err(|why| StartRefusal::NotRunnable("WORKFLOW_NOT_RUNNABLE", why))?;
    if state.model.is_none()
        && let Some(step) = compiled
            .definition
            .steps
            .iter()
            .find(|s| matches!(s.kind, StepKind::Model(_)))
    {
        return Err(StartRefusal::NotRunnable(
            "MODEL_NOT_CONFIGURED",
            format!(
                "step `{}` asks a chat model, and this server has no model endpoint (`[model]` in warrant.toml)",
                step.id
            ),
        ));
    }
    let input = warrant_core::json::parse(bytes, warrant_core::json::Limits::PROPOSAL)
        .map_err(|e| StartRefusal::Input(format!("the input is not strict JSON: {e}")))?;
    compiled.input.check(&input).map_err(StartRefusal::Schema)?;
    let now = state.env.now();
    let run = RunRecord {
        id,
        tenant: principal.tenant().to_owned(),
        workflow: workflow.name.clone(),
        version: workflow.version,
        digest: workflow.digest.clone(),
        status: RunStatus::Running,
        input,
        principal: principal_snapshot(principal),
        next_step: compiled.definition.steps.first().map(|s| s.id.clone()),
        next_seq: 0,
        cost: 0,
        error: None,
        created_at: now,
        updated_at: now,
    };
    let job = step_job(state, &run, 0, now);
    let local = state.local_runner.lock().ok().and_then(|l| l.clone());
    match local {
        // Handed to this node's runner with its first step claimed: no claim of its own.
        Some(runner) => {
            let claimed = state
                .store
                .start_run_claimed(&run, &job, &runner.worker, now + lease(state))
                .await
                .map_err(StartRefusal::Store)?;
            if runner.handed.send((claimed, run.clone())).is_err() {
                // The runner stopped: the step is taken over by any runner once its lease lapses.
                if let Ok(mut l) = state.local_runner.lock() {
                    *l = None;
                }
            }
        }
        None => {
            state
                .store
                .start_run(&run, &job)
                .await
                .map_err(StartRefusal::Store)?;
            state.runs_due.notify_one();
        }
    }
    metrics::counter!(metric::RUNS, "event" => "started").increment(1);
    Ok(run)
}

/// The principal a run acts as, as it was recorded when the run started.
fn principal_of(run: &RunRecord) -> Option<Principal> {
    let p = &run.principal;
    let strings = |key: &str| -> Vec<String> {
        p.get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let principal = Principal::new(
        p.get("id")?.as_str()?,
        p.get("tenant")?.as_str()?,
        strings("grants"),
    )
    .ok()?;
    principal.with_roles(strings("roles")).ok()
}

/// Whether the principal a run acts for still holds a key that is not revoked.
async fn principal_active(state: &AppState, run: &RunRecord) -> Result<bool, StoreError> {
    let Some(id) = run.principal.get("id").and_then(Value::as_str) else {
        return Ok(false);
    };
    let who = (run.tenant.clone(), id.to_owned());
    let seen = state
        .live_principals
        .lock()
        .ok()
        .and_then(|l| l.get(&who).copied());
    if seen.is_some_and(|at| at.elapsed() < LIVE_FOR) {
        return Ok(true);
    }
    let live = state
        .store
        .list_api_keys(&run.tenant)
        .await?
        .iter()
        .any(|k| k.key.principal == id && k.revoked_at.is_none());
    if let Ok(mut l) = state.live_principals.lock() {
        if live {
            l.insert(who, std::time::Instant::now());
        } else {
            l.remove(&who);
        }
    }
    Ok(live)
}

/// The principal snapshot a run records.
pub fn principal_snapshot(principal: &Principal) -> Value {
    json!({
        "id": principal.id(),
        "tenant": principal.tenant(),
        "grants": principal.grants(),
        "roles": principal.roles(),
    })
}

/// The job of step `seq` of `run`.
pub fn step_job(state: &AppState, run: &RunRecord, seq: u32, at: time::OffsetDateTime) -> NewJob {
    NewJob {
        id: state.env.new_id("job"),
        tenant: run.tenant.clone(),
        kind: STEP_JOB.to_owned(),
        payload: json!({"run_id": run.id, "seq": seq}),
        run_at: at,
        max_attempts: MAX_ATTEMPTS,
    }
}

/// This node's runner, as the runs started on this node reach it.
#[derive(Debug, Clone)]
pub struct LocalRunner {
    /// The runner's worker id (the one its claims hold).
    pub(crate) worker: Arc<str>,
    /// Runs started here, their first step claimed for `worker`.
    pub(crate) handed: tokio::sync::mpsc::UnboundedSender<(Job, RunRecord)>,
}

/// Runs due steps until the task is dropped: the steps it claims, and the runs started on this
/// node, handed to it with their first step claimed.
pub fn spawn_runner(state: Arc<AppState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let worker: Arc<str> = state.env.new_id("runner").into();
        let lease = lease(&state);
        let (handed, mut arrivals) = tokio::sync::mpsc::unbounded_channel::<(Job, RunRecord)>();
        if let Ok(mut l) = state.local_runner.lock() {
            *l = Some(LocalRunner {
                worker: worker.clone(),
                handed,
            });
        }
        // Handed runs start at once, beside the claimed batch (owned by this task: dropping
        // the runner drops them, and their steps are taken over when their leases lapse).
        let mut local = tokio::task::JoinSet::new();
        {
            let (state, worker) = (state.clone(), worker.clone());
            local.spawn(async move {
                let mut started = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        arrival = arrivals.recv() => match arrival {
                            Some((job, run)) => {
                                let (state, worker) = (state.clone(), worker.clone());
                                started.spawn(async move { finish(&state, &worker, lease, &job, Some(run)).await });
                            }
                            None => break,
                        },
                        Some(_) = started.join_next(), if !started.is_empty() => {}
                    }
                }
                while started.join_next().await.is_some() {}
            });
        }
        // Until the gateway shuts down: then nothing more is claimed, the steps running finish,
        // and so do the runs handed here (no more arrive once the handle is withdrawn).
        while !state.stopping.is_cancelled() {
            let now = state.env.now();
            let jobs = match state.store.claim_jobs(&worker, STEP_JOB, CLAIM, lease, now).await {
                Ok(jobs) => jobs,
                Err(error) => {
                    tracing::warn!(%error, "the workflow runner cannot claim steps");
                    tokio::select! {
                        () = tokio::time::sleep(IDLE_POLL * 5) => {}
                        () = state.stopping.cancelled() => {}
                    }
                    continue;
                }
            };
            if jobs.is_empty() {
                // Woken at once by a step this node made due; another node's within the poll.
                tokio::select! {
                    () = state.runs_due.notified() => {}
                    () = tokio::time::sleep(IDLE_POLL) => {}
                    () = state.stopping.cancelled() => {}
                }
                continue;
            }
            // The claimed steps (each of another run) run side by side, each within its lease.
            let mut running = tokio::task::JoinSet::new();
            for job in jobs {
                let (state, worker) = (state.clone(), worker.clone());
                running.spawn(async move { finish(&state, &worker, lease, &job, None).await });
            }
            while running.join_next().await.is_some() {}
        }
        if let Ok(mut l) = state.local_runner.lock() {
            *l = None;
        }
        while local.join_next().await.is_some() {}
    })
}

/// How long a principal seen holding a live key is trusted to still hold it.
const LIVE_FOR: Duration = crate::auth::KEY_CACHE_TTL;
/// The most steps one claim takes.
const CLAIM: u32 = 16;

/// Runs one claimed step and completes its job: done, tried again later with backoff, or dead
/// after its last attempt (its run then fails with the reason rather than wait forever).
async fn finish(state: &AppState, worker: &str, lease: Duration, job: &Job, started: Option<RunRecord>) {
    let mut job = job.clone();
    // A run started here comes with its record and no steps: its first step reads neither.
    let mut steps = started.as_ref().map(|run| (run.id.clone(), Vec::new()));
    let mut run = started;
    loop {
        let hand = Hand {
            handoff: Handoff {
                worker: worker.to_owned(),
                job_id: job.job.id.clone(),
                lease_until: state.env.now() + lease,
            },
            steps: steps.take(),
            run: run.take(),
            outcome: None,
        };
        let (result, outcome, known, known_run) = HAND
            .scope(std::cell::RefCell::new(hand), async {
                let result = crate::jobs::holding(state, &job, worker, lease, run_job(state, &job)).await;
                let (outcome, steps, run) = HAND.with(|h| {
                    let mut h = h.borrow_mut();
                    (h.outcome.take(), h.steps.take(), h.run.take())
                });
                (result, outcome, steps, run)
            })
            .await;
        let completion = match result {
            // Recorded with its step: the job is done, and the next one (if due) is ours.
            Ok(()) if outcome.is_some() => match outcome.and_then(|next| next) {
                Some(next) => {
                    job = *next;
                    steps = known;
                    run = known_run;
                    continue;
                }
                None => return,
            },
            Ok(()) => JobCompletion::Done,
            Err(Retry(error)) if job.attempts >= MAX_ATTEMPTS => {
                abandon(state, &job, &error).await;
                JobCompletion::Dead { error }
            }
            Err(Retry(error)) => {
                // 2 s, 4 s, … up to 30 s: what a step waits for (an unknown outcome's
                // reconciliation, a busy model endpoint) is usually resolved within a minute.
                let wait = Duration::from_secs(2_u64.saturating_pow(job.attempts.min(10)).min(30));
                JobCompletion::Retry {
                    run_at: state.env.now() + wait,
                    error,
                }
            }
        };
        if let Err(error) = state
            .store
            .complete_job(&job.job.id, worker, &completion, state.env.now())
            .await
        {
            tracing::warn!(%error, job = %job.job.id, "a workflow step's job could not be completed");
        }
        return;
    }
}

/// The handoff of the step a task is running (see [`Store::advance_run`]): set by
/// [`finish`] around the step, read by [`record_step`] — a task-local rather than a parameter
/// of every step function, which all end in `record_step`.
struct Hand {
    handoff: Handoff,
    /// The run's recorded steps as this task knows them (the step it records is added):
    /// handed on with the next step's job, so that step need not read them again.
    steps: Option<(String, Vec<RunStep>)>,
    /// The run as this task knows it: as read (or handed) before the step, then as the step's
    /// record left it (the record's transaction checked that the run was still running), so a
    /// step handed on need not read it again.
    run: Option<RunRecord>,
    /// Set when the step was recorded with its handoff: the next step's job, if it was
    /// handed to this worker.
    outcome: Option<Option<Box<Job>>>,
}

tokio::task_local! {
    static HAND: std::cell::RefCell<Hand>;
}

/// Metric names of the authored lane.
pub mod metric {
    /// Runs by event (`started`, `waiting` — parked on a review —, `completed`, `failed`).
    pub const RUNS: &str = "warrant_workflow_runs_total";
    /// Seconds from a step's start to its record, by step kind.
    pub const STEP_SECONDS: &str = "warrant_workflow_step_seconds";
    /// Tokens used by model steps.
    pub const MODEL_TOKENS: &str = "warrant_workflow_model_tokens_total";
}

/// Records a step and what follows it (see `Store::advance_run`), and counts it: the step's
/// time from its claim to its record, by kind, and the run's end.
async fn record_step(
    state: &AppState,
    tenant: &str,
    started: std::time::Instant,
    record: &RunStep,
    next: &RunAdvance,
    now: time::OffsetDateTime,
) -> Result<bool, StoreError> {
    let handoff = handoff();
    let advanced = state
        .store
        .advance_run(tenant, record, next, handoff.as_ref(), now)
        .await?;
    Ok(recorded(state, started, record, next, advanced))
}

/// The handoff of the step this task runs, if any.
fn handoff() -> Option<Handoff> {
    HAND.try_with(|h| h.borrow().handoff.clone()).ok()
}

/// Counts a step the store has recorded (or found stale: `false`) with what follows it, and
/// keeps what the step's task hands on.
fn recorded(
    state: &AppState,
    started: std::time::Instant,
    record: &RunStep,
    next: &RunAdvance,
    advanced: Advanced,
) -> bool {
    let Advanced::Recorded { next: handed } = advanced else {
        return false;
    };
    if HAND.try_with(|_| ()).is_ok() {
        let _ = HAND.try_with(|h| {
            let mut h = h.borrow_mut();
            h.outcome = Some(handed.clone());
            if let Some((_, steps)) = h.steps.as_mut() {
                steps.push(record.clone());
                if let Some(end) = next.end_record(record) {
                    steps.push(end);
                }
            }
            // The run as the record left it, for the step handed on (none: read it again).
            let (status, next_step, error) = next.outcome();
            h.run = h.run.take().filter(|_| handed.is_some()).map(|mut run| {
                run.status = status;
                run.next_step = next_step;
                run.error = error;
                run.next_seq = record.seq.saturating_add(next.steps());
                run.cost = run.cost.saturating_add(record.cost);
                run
            });
        });
    }
    // A next step not handed to this worker (due later, or no handoff) is another claim's.
    if handed.is_none() && matches!(next, RunAdvance::Next { .. }) {
        state.runs_due.notify_one();
    }
    metrics::histogram!(metric::STEP_SECONDS, "kind" => record.kind.clone())
        .record(started.elapsed().as_secs_f64());
    if matches!(next, RunAdvance::Wait { .. }) {
        // Recorded once per review request: a review's polls record nothing until decided.
        metrics::counter!(metric::RUNS, "event" => "waiting").increment(1);
    }
    if let Some(status) = next.ends() {
        metrics::counter!(metric::RUNS, "event" => status.as_str()).increment(1);
        // No listener is not an error.
        let _ = state.runs_ended.send((record.run_id.clone(), status));
    }
    true
}

/// Fails the run of a step job that used its last attempt.
async fn abandon(state: &AppState, job: &Job, error: &str) {
    let Some(run_id) = job.job.payload.get("run_id").and_then(Value::as_str) else {
        return;
    };
    let Ok(Some(run)) = state.store.get_run(&job.job.tenant, run_id).await else {
        return;
    };
    if run.status.is_final() {
        return;
    }
    let step = run.next_step.clone().unwrap_or_default();
    let why = format!("step `{step}` could not finish after {MAX_ATTEMPTS} attempts: {error}");
    if let Err(e) = fail(
        state,
        std::time::Instant::now(),
        &run,
        run.next_seq,
        &step,
        "abandoned",
        why,
    )
    .await
    {
        tracing::warn!(error = %e.0, run = %run.id, "an abandoned run could not be marked failed");
    }
}

/// A step that could not finish now and is tried again later.
struct Retry(String);

impl From<StoreError> for Retry {
    fn from(e: StoreError) -> Self {
        Retry(e.to_string())
    }
}

async fn run_job(state: &AppState, job: &Job) -> Result<(), Retry> {
    let started = std::time::Instant::now();
    let run_id = job
        .job
        .payload
        .get("run_id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let seq = job
        .job
        .payload
        .get("seq")
        .and_then(Value::as_u64)
        .and_then(|s| u32::try_from(s).ok())
        .unwrap_or(u32::MAX);
    // The run as the previous step's record left it, when this step was handed on; else read.
    let handed = HAND
        .try_with(|h| h.borrow_mut().run.take())
        .ok()
        .flatten()
        .filter(|r| r.id == run_id && r.tenant == job.job.tenant && r.next_seq == seq);
    let run = match handed {
        Some(run) => run,
        None => match state.store.get_run(&job.job.tenant, run_id).await? {
            Some(run) => run,
            None => return Ok(()),
        },
    };
    let _ = HAND.try_with(|h| h.borrow_mut().run = Some(run.clone()));
    // A job for a step already recorded (another node finished it), or of an ended run.
    if run.next_seq != seq || run.status.is_final() {
        return Ok(());
    }
    let Some(step_id) = run.next_step.clone() else {
        return Ok(());
    };
    let compiled = match cached(state, &run.tenant, &run.digest) {
        Some(c) => c,
        None => {
            let record = state
                .store
                .get_workflow(&run.tenant, &run.workflow, run.version)
                .await?
                .ok_or_else(|| Retry(format!("workflow {}@{} is not stored", run.workflow, run.version)))?;
            match compiled_for(state, &record).await {
                Ok(c) => c,
                Err(why) => return fail(state, started, &run, seq, &step_id, "definition", why).await,
            }
        }
    };
    // The steps a handed-on job brings (complete when as many as the run has recorded), else
    // the store's.
    let known = HAND
        .try_with(|h| h.borrow_mut().steps.take())
        .ok()
        .flatten()
        .filter(|(id, steps)| *id == run.id && steps.len() == run.next_seq as usize);
    let steps = match known {
        Some((_, steps)) => steps,
        None => state.store.run_steps(&run.tenant, &run.id).await?,
    };
    let _ = HAND.try_with(|h| h.borrow_mut().steps = Some((run.id.clone(), steps.clone())));
    if let Some(max) = compiled
        .definition
        .steps
        .iter()
        .find(|s| s.id == step_id)
        .and_then(|s| s.max_visits)
    {
        // A review's wait is not a visit of its own.
        let visits = steps
            .iter()
            .filter(|s| s.step_id == step_id && s.status != "waiting")
            .count();
        if visits >= max as usize {
            let why = format!("step `{step_id}` would be entered more than its max_visits ({max})");
            return fail(state, started, &run, seq, &step_id, "max_visits", why).await;
        }
    }
    // A step that acts (a call, a proposal, a review's request) acts for the principal that
    // started the run: once every key of that principal is revoked, the run stops.
    let acts = compiled
        .definition
        .steps
        .iter()
        .find(|s| s.id == step_id)
        .is_some_and(|s| {
            matches!(
                s.kind,
                StepKind::Tool(_) | StepKind::Model(_) | StepKind::Review(_)
            )
        });
    if acts && !principal_active(state, &run).await? {
        let why = "every key of the principal that started the run was revoked: the run stops".to_owned();
        return fail(state, started, &run, seq, &step_id, "principal", why).await;
    }
    let scope = scope_of(&run, &steps);
    let now = state.env.now();
    // A review that asked already: look at the decision.
    if let Some(asked) = steps
        .last()
        .filter(|last| last.step_id == step_id && last.kind == "review" && last.status == "waiting")
    {
        // A job made by `wake_for_approval` looks once; the review's own polls go on.
        let woken = job.job.payload.get("wake").is_some_and(|w| w == &json!(true));
        return decision(state, started, &compiled, &run, seq, &step_id, asked, woken).await;
    }
    match action(&compiled, &step_id, &scope) {
        Err(error) => fail(state, started, &run, seq, &step_id, "step", error.to_string()).await,
        Ok(Action::End(status)) => {
            let (status, error) = end_status(status, &step_id);
            let record = step_record(&run, seq, &step_id, "end", "completed", None, None, 0, None, now);
            record_step(
                state,
                &run.tenant,
                started,
                &record,
                &RunAdvance::End { status, error },
                now,
            )
            .await?;
            Ok(())
        }
        Ok(Action::Goto { next, exit }) => {
            let record = step_record(
                &run,
                seq,
                &step_id,
                "branch",
                "completed",
                Some(json!({"exit": exit})),
                None,
                0,
                Some(exit),
                now,
            );
            let advance = RunAdvance::Next {
                step: next,
                job: step_job(state, &run, seq + 1, now),
            };
            record_step(state, &run.tenant, started, &record, &advance, now).await?;
            Ok(())
        }
        Ok(Action::Propose { prompt, next }) => {
            propose(state, started, &compiled, &run, seq, &step_id, &prompt, next).await
        }
        Ok(Action::Review { covers, .. }) => {
            ask(state, started, &compiled, &run, seq, &step_id, &steps, covers).await
        }
        Ok(Action::Call { arguments, next }) => {
            let contract = compiled
                .contracts
                .get(&step_id)
                .cloned()
                .ok_or_else(|| Retry(format!("step `{step_id}` has no contract")))?;
            let visit = steps.iter().filter(|s| s.step_id == step_id).count() + 1;
            let mut key = format!("{}.{step_id}.{visit}", run.id);
            // The approval of the last review that covered this step, bound to this exact call.
            let approved = steps.iter().rev().find_map(|s| {
                (s.kind == "review" && s.status == "approved")
                    .then(|| s.output.as_ref()?.get("approvals")?.get(&step_id).cloned())
                    .flatten()
            });
            let approval = match approved {
                Some(a) => {
                    if let Some(k) = a.get("idempotency_key").and_then(Value::as_str) {
                        key = k.to_owned();
                    }
                    a.get("approval_id").and_then(Value::as_str).map(str::to_owned)
                }
                None => None,
            };
            let required = compiled
                .coverage
                .iter()
                .any(|c| c.step == step_id && c.review_required);
            if required && approval.is_none() {
                let why = format!("step `{step_id}` needs the approval of a covering review, and has none");
                return fail(state, started, &run, seq, &step_id, "tool", why).await;
            }
            let after = advance_to(state, &compiled, &run, seq, next);
            call(
                state, started, &run, seq, &step_id, &contract, arguments, after, key, approval,
            )
            .await
        }
    }
}

/// How a run ends at an `end` step: its status and, for `failed`, why.
fn end_status(status: EndStatus, step_id: &str) -> (RunStatus, Option<String>) {
    match status {
        EndStatus::Completed => (RunStatus::Completed, None),
        EndStatus::Failed => (RunStatus::Failed, Some(format!("ended at `{step_id}`"))),
    }
}

/// What follows a tool step that goes on to `next`: the next step's job or — when `next` is an
/// `end` step — the run's end, recorded with the tool step in the same transaction (no job, no
/// claim and no write of its own for the `end`).
fn advance_to(state: &AppState, compiled: &Compiled, run: &RunRecord, seq: u32, next: String) -> RunAdvance {
    let end = compiled
        .definition
        .steps
        .iter()
        .find(|s| s.id == next)
        .and_then(|s| match &s.kind {
            StepKind::End(end) => Some(end.status),
            _ => None,
        });
    match end {
        Some(status) => {
            let (status, error) = end_status(status, &next);
            RunAdvance::EndAt {
                step: next,
                status,
                error,
            }
        }
        None => RunAdvance::Next {
            step: next,
            job: step_job(state, run, seq + 1, state.env.now()),
        },
    }
}

/// The run's values: its input and each recorded step's output (the latest visit).
fn scope_of(run: &RunRecord, steps: &[RunStep]) -> Value {
    let mut by_step = Map::new();
    for step in steps {
        match (&step.output, step.kind.as_str()) {
            (Some(output), "tool") => {
                by_step.insert(step.step_id.clone(), json!({ "output": output }));
            }
            (Some(output), "model") => {
                let arguments = output.get("arguments").cloned().unwrap_or(Value::Null);
                by_step.insert(step.step_id.clone(), json!({ "arguments": arguments }));
            }
            _ => {}
        }
    }
    json!({"input": run.input, "steps": by_step})
}

#[allow(clippy::too_many_arguments, reason = "one record's fields")]
fn step_record(
    run: &RunRecord,
    seq: u32,
    step_id: &str,
    kind: &str,
    status: &str,
    output: Option<Value>,
    ledger_id: Option<String>,
    cost: u64,
    detail: Option<String>,
    now: time::OffsetDateTime,
) -> RunStep {
    RunStep {
        run_id: run.id.clone(),
        seq,
        step_id: step_id.to_owned(),
        kind: kind.to_owned(),
        status: status.to_owned(),
        output,
        ledger_id,
        cost,
        detail,
        finished_at: now,
    }
}

/// Ends the run as failed at this step, with the reason.
async fn fail(
    state: &AppState,
    started: std::time::Instant,
    run: &RunRecord,
    seq: u32,
    step_id: &str,
    kind: &str,
    why: String,
) -> Result<(), Retry> {
    let now = state.env.now();
    tracing::info!(run = %run.id, step = step_id, reason = %why, "a workflow run failed");
    let record = step_record(
        run,
        seq,
        step_id,
        kind,
        "failed",
        None,
        None,
        0,
        Some(why.clone()),
        now,
    );
    let advance = RunAdvance::End {
        status: RunStatus::Failed,
        error: Some(why),
    };
    record_step(state, &run.tenant, started, &record, &advance, now).await?;
    Ok(())
}

/// Phase one of a review step: each covered tool step's exact call is proposed through
/// `dispatch` held for review (`OwnedCall::review`), which creates — or finds, when this step
/// is taken again — the approval bound to its payload digest and idempotency key; the run then
/// waits, its step recording the approvals it waits for.
#[allow(clippy::too_many_arguments, reason = "the step's place and its calls")]
async fn ask(
    state: &AppState,
    started: std::time::Instant,
    compiled: &Compiled,
    run: &RunRecord,
    seq: u32,
    step_id: &str,
    steps: &[RunStep],
    covers: Vec<(String, Map<String, Value>)>,
) -> Result<(), Retry> {
    let Some(principal) = principal_of(run) else {
        let why = "the run's principal is not readable".to_owned();
        return fail(state, started, run, seq, step_id, "review", why).await;
    };
    // The approval lives as long as the review's `expires_in` says, and only its `reviewers`
    // (among those policy allows) may decide it.
    let review = review_of(compiled, step_id);
    let ttl = review.and_then(|r| time::Duration::try_from(r.expires_in).ok());
    let reviewers = review.map(|r| match &r.reviewers {
        definition::Reviewers::Role(role) => ReviewerRule::Role(role.clone()),
        definition::Reviewers::Principals(ids) => ReviewerRule::Principals(ids.clone()),
    });
    let mut approvals = Map::new();
    for (tool, arguments) in covers {
        let Some(contract) = compiled.contracts.get(&tool) else {
            return Err(Retry(format!("step `{tool}` has no contract")));
        };
        let visit = steps.iter().filter(|s| s.step_id == tool).count() + 1;
        let key = format!("{}.{tool}.{visit}", run.id);
        let mut owned = tool_call(state, run, step_id, contract, arguments, key.clone(), None, true);
        owned.review_ttl = ttl;
        owned.reviewers.clone_from(&reviewers);
        match submit(
            state.authority.clone(),
            state.runtime.clone(),
            principal.clone(),
            owned,
        )
        .await?
        {
            Dispatched::NeedsApproval { ledger_id, needed } => {
                approvals.insert(
                    tool,
                    json!({
                        "approval_id": needed.request_id,
                        "payload_digest": needed.payload_digest.to_string(),
                        "idempotency_key": key,
                        "expires_at": needed.expires_at.map(crate::routes::rfc3339),
                        "ledger_id": ledger_id,
                    }),
                );
            }
            Dispatched::Rejected { rejection, .. } => {
                let why = format!(
                    "the call `{tool}` would make cannot be reviewed: {} ({})",
                    rejection.code().as_str(),
                    rejection.detail()
                );
                return fail(state, started, run, seq, step_id, "review", why).await;
            }
            Dispatched::Executed(_) => {
                let why = format!("the call of `{tool}` ran before its review");
                return fail(state, started, run, seq, step_id, "review", why).await;
            }
        }
    }
    let now = state.env.now();
    let output = Some(json!({ "approvals": approvals }));
    let record = step_record(run, seq, step_id, "review", "waiting", output, None, 0, None, now);
    let advance = RunAdvance::Wait {
        step: step_id.to_owned(),
        job: step_job(state, run, seq + 1, now + REVIEW_POLL),
    };
    record_step(state, &run.tenant, started, &record, &advance, now).await?;
    Ok(())
}

/// The call a run makes for a tool step, as a lane hands it to the runtime: the pinned
/// contract, the bound arguments, the step's key, the run and step ids for the ledger, and for
/// a reviewed call its approval (`review` holds the call for approval whatever the contract
/// says: `Call::review`).
#[allow(clippy::too_many_arguments, reason = "one call's parts")]
fn tool_call(
    state: &AppState,
    run: &RunRecord,
    step_id: &str,
    contract: &warrant_core::Contract,
    arguments: Map<String, Value>,
    key: String,
    approval: Option<String>,
    review: bool,
) -> OwnedCall {
    let proposal = json!({
        "tool": contract.qualified_name(),
        "contract": contract.id().to_string(),
        "arguments": arguments,
    });
    OwnedCall {
        bytes: proposal.to_string().into_bytes().into(),
        idempotency_key: Some(key),
        approval_id: approval,
        trace_id: state.env.new_id("trace"),
        run_id: Some(run.id.clone()),
        step_id: Some(step_id.to_owned()),
        review,
        review_ttl: None,
        reviewers: None,
        then: None,
        note: None,
    }
}

/// The review step `step_id`, if it is one.
fn review_of<'c>(compiled: &'c Compiled, step_id: &str) -> Option<&'c definition::ReviewStep> {
    compiled
        .definition
        .steps
        .iter()
        .find(|s| s.id == step_id)
        .and_then(|s| match &s.kind {
            StepKind::Review(r) => Some(r),
            _ => None,
        })
}

/// How often a waiting review looks at its approvals.
const REVIEW_POLL: Duration = Duration::from_secs(1);
/// The longest a waiting review goes without looking at its approvals.
const REVIEW_POLL_MAX: Duration = Duration::from_secs(15);

/// Wakes the run an approval belongs to, when it waits for it: a review step's calls carry the
/// key `<run id>.<step>.<visit>`, so a decided approval names its run; the run's review is then
/// looked at now instead of at its next poll. (A key of that shape on another call only makes
/// some waiting run of the same tenant look at its approvals early.)
pub async fn wake_for_approval(state: &AppState, approval: &warrant_core::records::ApprovalRequest) {
    let Some(run_id) = approval
        .request
        .idempotency_key
        .as_deref()
        .and_then(|k| k.split('.').next())
        .filter(|id| id.starts_with(warrant_core::pipeline::RUN_KEY_PREFIX))
    else {
        return;
    };
    let run = match state.store.get_run(&approval.request.tenant, run_id).await {
        Ok(Some(run)) if run.status == RunStatus::Waiting => run,
        Ok(_) => return,
        Err(error) => {
            tracing::warn!(%error, run = run_id, "a decided approval could not wake its run");
            return;
        }
    };
    let now = state.env.now();
    let mut job = step_job(state, &run, run.next_seq, now);
    if let Some(payload) = job.payload.as_object_mut() {
        payload.insert("wake".into(), json!(true));
    }
    match state.store.enqueue_job(&job).await {
        Ok(()) => state.runs_due.notify_one(),
        Err(error) => tracing::warn!(%error, run = run_id, "a decided approval could not wake its run"),
    }
}

/// Phase two of a review step: every approval approved → `on_approve`; any rejected or expired
/// → `on_reject`; otherwise look again later.
#[allow(clippy::too_many_arguments, reason = "the step's place and what it asked")]
async fn decision(
    state: &AppState,
    started: std::time::Instant,
    compiled: &Compiled,
    run: &RunRecord,
    seq: u32,
    step_id: &str,
    asked: &RunStep,
    woken: bool,
) -> Result<(), Retry> {
    use warrant_core::records::ApprovalStatus;
    let review = review_of(compiled, step_id);
    let Some(review) = review else {
        let why = format!("`{step_id}` is not a review");
        return fail(state, started, run, seq, step_id, "review", why).await;
    };
    let approvals = asked
        .output
        .as_ref()
        .and_then(|o| o.get("approvals"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let now = state.env.now();
    let mut all_approved = true;
    let mut refused: Option<String> = None;
    let mut expired = false;
    for (tool, a) in &approvals {
        let id = a.get("approval_id").and_then(Value::as_str).unwrap_or_default();
        let status = state
            .store
            .get_approval(&run.tenant, id, now)
            .await?
            .map(|r| r.status);
        match status {
            Some(ApprovalStatus::Approved | ApprovalStatus::Consumed) => {}
            Some(ApprovalStatus::Pending) => all_approved = false,
            Some(ApprovalStatus::Rejected) => refused = Some(format!("the call of `{tool}` was rejected")),
            Some(ApprovalStatus::Expired) | None => {
                expired = true;
                refused = Some(format!("the approval of `{tool}` expired"));
            }
        }
    }
    if expired && review.on_expiry == definition::OnExpiry::Fail {
        let why = refused.unwrap_or_default();
        return fail(state, started, run, seq, step_id, "review", why).await;
    }
    let (status, next, detail) = match (refused, all_approved) {
        (Some(why), _) => ("rejected", review.on_reject.clone(), Some(why)),
        (None, true) => ("approved", review.on_approve.clone(), None),
        (None, false) if woken => return Ok(()),
        (None, false) => {
            // Still pending: look again later (a new job; this one is done) — soon at first,
            // then less often the longer the review waits (a tenth of the wait so far, at most
            // `REVIEW_POLL_MAX`): a decision made through any node is seen within that, and
            // one made through this node wakes the run at once (`wake_for_approval`).
            let waited = (now - asked.finished_at).unsigned_abs();
            let wait = (waited / 10).clamp(REVIEW_POLL, REVIEW_POLL_MAX);
            state
                .store
                .enqueue_job(&step_job(state, run, seq, now + wait))
                .await?;
            return Ok(());
        }
    };
    let output = Some(json!({ "approvals": approvals }));
    let record = step_record(run, seq, step_id, "review", status, output, None, 0, detail, now);
    let advance = RunAdvance::Next {
        step: next,
        job: step_job(state, run, seq + 1, now),
    };
    record_step(state, &run.tenant, started, &record, &advance, now).await?;
    Ok(())
}

/// A tool step: the call through `dispatch`, then the step's record and what follows.
#[allow(clippy::too_many_arguments, reason = "the step's place and its call")]
async fn call(
    state: &AppState,
    started: std::time::Instant,
    run: &RunRecord,
    seq: u32,
    step_id: &str,
    contract: &warrant_core::Contract,
    arguments: Map<String, Value>,
    after: RunAdvance,
    key: String,
    approval: Option<String>,
) -> Result<(), Retry> {
    let Some(principal) = principal_of(run) else {
        return fail(
            state,
            started,
            run,
            seq,
            step_id,
            "tool",
            "the run's principal is not readable".into(),
        )
        .await;
    };
    let review = approval.is_some();
    let mut owned = tool_call(state, run, step_id, contract, arguments, key, approval, review);
    // The committed step's record and its next step commit with the call's outcome (one
    // durable write for the call's end and the step's); any other outcome is recorded below.
    let now = state.env.now();
    let follow = StepFollowUp {
        tenant: run.tenant.clone(),
        step: step_record(
            run,
            seq,
            step_id,
            "tool",
            "completed",
            None,
            None,
            contract.cost_per_call(),
            None,
            now,
        ),
        advance: after.clone(),
        handoff: handoff(),
    };
    owned.then = Some(Arc::new(follow));
    let then = owned.then.clone();
    let dispatched = submit(state.authority.clone(), state.runtime.clone(), principal, owned).await?;
    if let (Dispatched::Executed(e), Some(then)) = (&dispatched, then)
        && let Some(advanced) = e.followed.clone()
    {
        let record = RunStep {
            output: match &e.result {
                Ok(Outcome::Committed(result)) => Some(result.clone()),
                _ => None,
            },
            ledger_id: Some(e.ledger_id.clone()),
            ..then.step.clone()
        };
        recorded(state, started, &record, &then.advance, advanced);
        return Ok(());
    }
    let now = state.env.now();
    let failed = |code: String, ledger_id: String| {
        step_record(
            run,
            seq,
            step_id,
            "tool",
            "failed",
            None,
            Some(ledger_id),
            0,
            Some(code),
            now,
        )
    };
    let (record, advance) = match dispatched {
        Dispatched::Executed(e) => match e.result {
            Ok(Outcome::Committed(result)) => {
                let record = step_record(
                    run,
                    seq,
                    step_id,
                    "tool",
                    "completed",
                    Some(result),
                    Some(e.ledger_id),
                    contract.cost_per_call(),
                    None,
                    now,
                );
                (record, after)
            }
            // The effect may have happened: try again later with the same key, which replays
            // the outcome once reconciliation knows it.
            Ok(Outcome::Unknown(_)) => {
                return Err(Retry(format!("the outcome of {} is unknown", e.ledger_id)));
            }
            Ok(Outcome::Failed(code)) => {
                let why = match &e.detail {
                    Some(detail) => format!("{step_id} failed: {} ({detail})", code.as_str()),
                    None => format!("{step_id} failed: {}", code.as_str()),
                };
                (
                    failed(code.as_str().to_owned(), e.ledger_id),
                    RunAdvance::End {
                        status: RunStatus::Failed,
                        error: Some(why),
                    },
                )
            }
            Err(rejection) if rejection.code() == RejectCode::IdempotencyInFlight => {
                return Err(Retry(rejection.detail().to_owned()));
            }
            Err(rejection) => {
                let why = format!(
                    "{step_id} refused: {} ({})",
                    rejection.code().as_str(),
                    rejection.detail()
                );
                (
                    failed(rejection.code().as_str().to_owned(), e.ledger_id),
                    RunAdvance::End {
                        status: RunStatus::Failed,
                        error: Some(why),
                    },
                )
            }
        },
        // The same call is still in flight (a node died mid-call and its record has not yet
        // expired or been reconciled): try again later with the same key.
        Dispatched::Rejected { rejection, .. } if rejection.code() == RejectCode::IdempotencyInFlight => {
            return Err(Retry(rejection.detail().to_owned()));
        }
        Dispatched::Rejected { ledger_id, rejection } => {
            let why = format!(
                "{step_id} refused: {} ({})",
                rejection.code().as_str(),
                rejection.detail()
            );
            (
                failed(rejection.code().as_str().to_owned(), ledger_id),
                RunAdvance::End {
                    status: RunStatus::Failed,
                    error: Some(why),
                },
            )
        }
        Dispatched::NeedsApproval { ledger_id, .. } => {
            let why = format!("{step_id} needs an approval, which only a review step gives a run");
            (
                failed("APPROVAL_REQUIRED".into(), ledger_id),
                RunAdvance::End {
                    status: RunStatus::Failed,
                    error: Some(why),
                },
            )
        }
    };
    record_step(state, &run.tenant, started, &record, &advance, now).await?;
    Ok(())
}

/// A model step: the operator's chat model proposes the arguments of the step's contract; the
/// returned argument bytes are untrusted and pass the strict parser and the pipeline's stages
/// up to the guards (`Authority::vet`: contract, schema, policy, scopes, allow-lists) as the
/// run's principal. An accepted proposal is the step's output (`${steps.ID.arguments.…}`); a
/// refused one fails the run with the typed refusal and its ledger row. The tokens used are
/// the step's cost either way.
#[allow(clippy::too_many_arguments, reason = "the step's place and its prompt")]
async fn propose(
    state: &AppState,
    started: std::time::Instant,
    compiled: &Compiled,
    run: &RunRecord,
    seq: u32,
    step_id: &str,
    prompt: &str,
    next: String,
) -> Result<(), Retry> {
    let Some(principal) = principal_of(run) else {
        let why = "the run's principal is not readable".to_owned();
        return fail(state, started, run, seq, step_id, "model", why).await;
    };
    let Some(contract) = compiled.contracts.get(step_id).cloned() else {
        return Err(Retry(format!("step `{step_id}` has no contract")));
    };
    let Some(model) = &state.model else {
        let why = format!(
            "{}: {}",
            ModelError::NotConfigured.code(),
            ModelError::NotConfigured
        );
        return fail(state, started, run, seq, step_id, "model", why).await;
    };
    let proposed = match model.propose(&contract, prompt).await {
        Ok(p) => p,
        Err(e) if e.transient() => return Err(Retry(e.to_string())),
        Err(e) => {
            let why = format!("{step_id}: {} ({e})", e.code());
            return fail(state, started, run, seq, step_id, "model", why).await;
        }
    };
    metrics::counter!(metric::MODEL_TOKENS).increment(proposed.usage.total);
    let envelope = Envelope::for_arguments(
        &contract.qualified_name(),
        contract.id(),
        &proposed.arguments,
        Limits::PROPOSAL,
    );
    let trace_id = state.env.new_id("trace");
    let call = Call {
        bytes: &proposed.arguments,
        trace_id: &trace_id,
        run_id: Some(&run.id),
        step_id: Some(step_id),
        ..Call::default()
    };
    let vetted = state.authority.vet(&principal, envelope, &call).await?;
    let now = state.env.now();
    let usage = json!({
        "prompt_tokens": proposed.usage.prompt,
        "completion_tokens": proposed.usage.completion,
        "total_tokens": proposed.usage.total,
    });
    let (record, advance) = match vetted {
        Ok(proposal) => (
            step_record(
                run,
                seq,
                step_id,
                "model",
                "completed",
                Some(json!({
                    "arguments": proposal.arguments(),
                    "payload_digest": proposal.payload_digest().to_string(),
                    "usage": usage,
                })),
                None,
                proposed.usage.total,
                None,
                now,
            ),
            RunAdvance::Next {
                step: next,
                job: step_job(state, run, seq + 1, now),
            },
        ),
        Err((rejection, ledger_id)) => {
            let why = format!(
                "{step_id}: the model's proposal was refused: {} ({})",
                rejection.code().as_str(),
                rejection.detail()
            );
            (
                step_record(
                    run,
                    seq,
                    step_id,
                    "model",
                    "failed",
                    Some(json!({ "usage": usage })),
                    Some(ledger_id),
                    proposed.usage.total,
                    Some(rejection.code().as_str().to_owned()),
                    now,
                ),
                RunAdvance::End {
                    status: RunStatus::Failed,
                    error: Some(why),
                },
            )
        }
    };
    record_step(state, &run.tenant, started, &record, &advance, now).await?;
    Ok(())
}
