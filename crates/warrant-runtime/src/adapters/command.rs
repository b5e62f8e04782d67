//! The `command` adapter: runs an executable with the canonical arguments on stdin, in a
//! clean environment holding only its own credential, and reads one JSON result from stdout.
//!
//! ```yaml
//! adapter:
//!   kind: command
//!   program: /opt/warrant/tools/create-credit     # absolute, inside a configured command root
//!   args: ["--live"]                               # optional
//!   credential: CREDITS_API_TOKEN                  # optional; set as that variable for the child
//!   timeout: 10s                                   # per attempt; the process group is killed after it
//!   status: { program: /opt/warrant/tools/credit-status, args: [] }   # optional, for reconcile
//! ```
//!
//! The child sees `PATH=/usr/bin:/bin`, `WARRANT_OPERATION_ID`, `WARRANT_TENANT`,
//! `WARRANT_SCOPES`, `WARRANT_ATTEMPT` and its credential — nothing else of Warrant's
//! environment. Exit codes (sysexits where one fits):
//!
//! | exit | code |
//! |---|---|
//! | 0 with a JSON object on stdout | success |
//! | 64, 65 | `TOOL_INPUT_INVALID` |
//! | 69 | `TOOL_UPSTREAM_UNAVAILABLE` |
//! | 75 | `TOOL_RATE_LIMITED` |
//! | 77 | `TOOL_PERMISSION_DENIED` |
//! | 78 | `TOOL_PERMANENT_FAILURE` |
//! | 124, or killed by our timeout | `TOOL_TIMEOUT` (effect may have happened) |
//! | killed by a signal | `TOOL_UNCLASSIFIED` (effect may have happened) |
//! | anything else | `TOOL_UNCLASSIFIED`; for any effect but `read`, the effect may have happened (`unknown`, reconciled) |
//!
//! Only the sysexits codes above say the program refused before acting; any other exit of a
//! `write`, `irreversible` or `async` tool is treated as "may have happened".
//!
//! The status program receives `{"operation_id": …}` on stdin and prints the status answer of
//! [`super::read_status`].

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warrant_core::{Contract, Effect, ToolErrorCode};

use super::{AdapterConfig, read_status};
use crate::adapter::{Adapter, BindingError, Failure, Inquiry, Invocation, Reconciled};
use crate::binding::Binding;
use crate::secrets::Secret;

/// The largest stdout accepted.
const MAX_OUTPUT: u64 = 1 << 20;
/// The longest per-attempt timeout a binding may ask for.
const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// One program and its arguments.
#[derive(Debug, Clone)]
struct Program {
    path: PathBuf,
    args: Vec<String>,
}

/// The `command` adapter of one contract.
#[derive(Debug)]
pub struct CommandAdapter {
    program: Program,
    status: Option<Program>,
    credential: Option<(String, Secret)>,
    timeout: Duration,
}

impl CommandAdapter {
    /// Builds the adapter from its binding.
    ///
    /// # Errors
    /// A malformed binding, a program outside the configured roots, or a missing credential.
    pub fn from_binding(
        contract: &Contract,
        doc: &Value,
        config: &AdapterConfig,
    ) -> Result<Self, BindingError> {
        let b = Binding::open(
            "command",
            doc,
            &["program", "args", "credential", "timeout", "status"],
        )?;
        let program = Program {
            path: vet_program(&b, b.string("program")?, &config.command_roots)?,
            args: b.strings("args")?.into_iter().map(str::to_owned).collect(),
        };
        let status = match b.object("status")? {
            Some(doc) => {
                let s = Binding::open("command", doc, &["program", "args"])?;
                Some(Program {
                    path: vet_program(&s, s.string("program")?, &config.command_roots)?,
                    args: s.strings("args")?.into_iter().map(str::to_owned).collect(),
                })
            }
            None => None,
        };
        let credential = match b.opt_string("credential")? {
            Some(name) => Some((
                name.to_owned(),
                config.secrets.grant(name, contract)?.secret().clone(),
            )),
            None => None,
        };
        Ok(CommandAdapter {
            program,
            status,
            credential,
            timeout: b.duration("timeout", Duration::from_secs(10), MAX_TIMEOUT)?,
        })
    }
}

/// The program must be an absolute path that, with every link resolved, lies inside one of
/// the operator's command roots.
fn vet_program(b: &Binding<'_>, text: &str, roots: &[PathBuf]) -> Result<PathBuf, BindingError> {
    if roots.is_empty() {
        return Err(BindingError::invalid(
            b.kind(),
            "command adapters are off: the operator has configured no command root",
        ));
    }
    let path = Path::new(text);
    if !path.is_absolute() {
        return Err(BindingError::invalid(
            b.kind(),
            format!("`{text}` must be an absolute path"),
        ));
    }
    let real = path
        .canonicalize()
        .map_err(|e| BindingError::invalid(b.kind(), format!("`{text}`: {e}")))?;
    let inside = roots
        .iter()
        .filter_map(|r| r.canonicalize().ok())
        .any(|root| real.starts_with(root));
    if !inside {
        return Err(BindingError::invalid(
            b.kind(),
            format!("`{text}` is outside the configured command roots"),
        ));
    }
    Ok(real)
}

/// How a child ended.
enum Exit {
    Done { code: Option<i32>, stdout: Vec<u8> },
    TimedOut,
}

impl CommandAdapter {
    async fn run(
        &self,
        program: &Program,
        stdin: &[u8],
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Exit, Failure> {
        let mut cmd = tokio::process::Command::new(&program.path);
        cmd.args(&program.args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        if let Some((name, secret)) = &self.credential {
            cmd.env(name, secret.expose());
        }
        let mut child = cmd.spawn().map_err(|e| {
            Failure::new(
                ToolErrorCode::PermanentFailure,
                format!("cannot start the program: {e}"),
            )
        })?;
        let pid = child.id();
        let mut input = child.stdin.take();
        let mut output = child.stdout.take();
        let stdin = stdin.to_vec();
        let work = async move {
            let feed = async {
                if let Some(mut pipe) = input.take() {
                    // A child that exits without reading its input is its own business.
                    let _ = pipe.write_all(&stdin).await;
                    let _ = pipe.shutdown().await;
                }
            };
            let read = async {
                let mut buf = Vec::new();
                if let Some(pipe) = output.take() {
                    pipe.take(MAX_OUTPUT + 1).read_to_end(&mut buf).await.map(|_| buf)
                } else {
                    Ok(buf)
                }
            };
            let ((), stdout) = tokio::join!(feed, read);
            let status = child.wait().await;
            (status, stdout)
        };
        match tokio::time::timeout(timeout, work).await {
            Ok((status, stdout)) => {
                let status =
                    status.map_err(|e| Failure::ambiguous(ToolErrorCode::Unclassified, e.to_string()))?;
                let stdout =
                    stdout.map_err(|e| Failure::ambiguous(ToolErrorCode::Unclassified, e.to_string()))?;
                Ok(Exit::Done {
                    code: status.code(),
                    stdout,
                })
            }
            Err(_) => {
                // Kill the whole process group, not only the direct child.
                if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                Ok(Exit::TimedOut)
            }
        }
    }
}

#[async_trait]
impl Adapter for CommandAdapter {
    async fn invoke(&self, call: &Invocation<'_>) -> Result<Value, Failure> {
        let scopes = call.scopes.join(" ");
        let attempt = call.attempt.to_string();
        let env = [
            ("WARRANT_OPERATION_ID", call.operation_id.as_str()),
            ("WARRANT_TENANT", call.tenant),
            ("WARRANT_SCOPES", scopes.as_str()),
            ("WARRANT_ATTEMPT", attempt.as_str()),
        ];
        let exit = self
            .run(
                &self.program,
                call.canonical,
                &env,
                self.timeout.min(call.timeout),
            )
            .await?;
        let (code, stdout) = match exit {
            Exit::TimedOut => {
                return Err(Failure::ambiguous(
                    ToolErrorCode::Timeout,
                    "killed after the timeout",
                ));
            }
            Exit::Done { code, stdout } => (code, stdout),
        };
        let failure = |code: ToolErrorCode, n: i32| Failure::new(code, format!("exited with {n}"));
        match code {
            Some(0) => parse_stdout(&stdout)
                .map_err(|why| Failure::ambiguous(ToolErrorCode::OutputInvalid, format!("stdout {why}"))),
            Some(n @ (64 | 65)) => Err(failure(ToolErrorCode::InputInvalid, n)),
            Some(n @ 69) => Err(failure(ToolErrorCode::UpstreamUnavailable, n)),
            Some(n @ 75) => Err(failure(ToolErrorCode::RateLimited, n)),
            Some(n @ 77) => Err(failure(ToolErrorCode::PermissionDenied, n)),
            Some(n @ 78) => Err(failure(ToolErrorCode::PermanentFailure, n)),
            Some(124) => Err(Failure::ambiguous(ToolErrorCode::Timeout, "exited with 124")),
            // An exit code outside sysexits proves nothing about the effect: for anything but
            // a read, the effect may have happened.
            Some(n) if call.contract.effect() == Effect::Read => Err(failure(ToolErrorCode::Unclassified, n)),
            Some(n) => Err(Failure::ambiguous(
                ToolErrorCode::Unclassified,
                format!("exited with {n}"),
            )),
            None => Err(Failure::ambiguous(
                ToolErrorCode::Unclassified,
                "killed by a signal",
            )),
        }
    }

    async fn reconcile(&self, inquiry: &Inquiry<'_>) -> Result<Reconciled, Failure> {
        let Some(status) = &self.status else {
            return Ok(Reconciled::Unknown);
        };
        let input = serde_json::json!({"operation_id": inquiry.operation_id.as_str()}).to_string();
        let env = [
            ("WARRANT_OPERATION_ID", inquiry.operation_id.as_str()),
            ("WARRANT_TENANT", inquiry.tenant),
        ];
        match self.run(status, input.as_bytes(), &env, inquiry.timeout).await? {
            Exit::Done {
                code: Some(0),
                stdout,
            } => {
                let value = parse_stdout(&stdout).map_err(|why| {
                    Failure::new(ToolErrorCode::Unclassified, format!("status stdout {why}"))
                })?;
                read_status(&value)
            }
            Exit::Done { .. } | Exit::TimedOut => Ok(Reconciled::Unknown),
        }
    }
}

fn parse_stdout(stdout: &[u8]) -> Result<Value, &'static str> {
    if stdout.len() as u64 > MAX_OUTPUT {
        return Err("is larger than 1 MiB");
    }
    super::http::parse_body(stdout)
}
