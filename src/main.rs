//! The `warrant` command line: the gateway (`serve`), offline audits (`check`), contract tooling
//! (`contract lint|hash`, and `register|list|retire|export` on a server),
//! canonical JSON (`canon`), the durable store (`store check`) and reconciliation
//! (`reconcile`).
//!
//! Exit codes: 0 success or ALLOW, 1 lint problems, 2 usage or I/O errors, 3 REJECT,
//! 4 NEEDS_APPROVAL.

mod check;
mod client;
mod contract;
mod io;
mod logfmt;
mod mcp;
mod reconcile;
mod serve;
mod store;
mod workflow;

use std::process::ExitCode;

/// mimalloc: the decision path allocates many small, short-lived values (parsed JSON, policy
/// entities); in `benches/decision.rs` it took about 7% off a decision against glibc malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};

/// Typed authority for AI tool calls.
#[derive(Debug, Parser)]
#[command(name = "warrant", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway: the HTTP API over the decision pipeline and the runtime.
    Serve(serve::ServeArgs),
    /// Serve MCP over stdin/stdout as one API key's principal (for desktop agents).
    Mcp(mcp::McpArgs),
    /// Audit one proposal offline: parse, resolve, validate, digest, scopes, idempotency, approval.
    Check(check::CheckArgs),
    /// Tool contracts: lint and hash files; register, list, retire and export on a running server.
    #[command(subcommand)]
    Contract(contract::ContractCommand),
    /// Print the RFC 8785 canonical form of a JSON document (or, with --digest, its SHA-256).
    Canon(contract::CanonArgs),
    /// Open the durable store (creating and migrating it) and report its state.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Resolve unknown outcomes and abandoned attempts by asking each tool what happened.
    Reconcile(reconcile::ReconcileArgs),
    /// Approval requests on a running server: list, approve, reject.
    Approvals {
        #[command(flatten)]
        server: client::ServerArgs,
        #[command(subcommand)]
        command: client::ApprovalsCommand,
    },
    /// The ledger on a running server: tail, show.
    Ledger {
        #[command(flatten)]
        server: client::ServerArgs,
        #[command(subcommand)]
        command: client::LedgerCommand,
    },
    /// Outbound webhook endpoints on a running server: add, list, rotate, disable, enable,
    /// deliveries, the dead-letter queue and replay.
    Webhooks {
        #[command(flatten)]
        server: client::ServerArgs,
        #[command(subcommand)]
        command: client::WebhooksCommand,
    },
    /// Inbound webhook sources on a running server: add, list, rotate, disable, enable, and
    /// the events each received.
    Inbound {
        #[command(flatten)]
        server: client::ServerArgs,
        #[command(subcommand)]
        command: client::InboundCommand,
    },
    /// API keys on a running server: list, create, revoke.
    Keys {
        #[command(flatten)]
        server: client::ServerArgs,
        #[command(subcommand)]
        command: client::KeysCommand,
    },
    /// Workflows: compile a definition offline (grammar, tools, bindings, Gate A); publish,
    /// list, show and run them on a running server.
    #[command(subcommand)]
    Workflow(workflow::WorkflowCommand),
    /// Workflow runs on a running server: list, show, cancel.
    #[command(subcommand)]
    Runs(workflow::RunsCommand),
    /// The reviewer console: a one-time sign-in link.
    Console {
        #[command(flatten)]
        server: client::ServerArgs,
        #[command(subcommand)]
        command: client::ConsoleCommand,
    },
    /// Tenants on a running server (the platform operator): create, list.
    Tenants {
        #[command(flatten)]
        server: client::ServerArgs,
        #[command(subcommand)]
        command: client::TenantsCommand,
    },
}

#[derive(Debug, Subcommand)]
enum StoreCommand {
    /// Open the store named by --database or --data-dir, apply migrations, and report.
    Check(store::StoreArgs),
}

/// Outcome of a command, mapped onto the documented exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    Ok = 0,
    Problems = 1,
    Usage = 2,
    Reject = 3,
    NeedsApproval = 4,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(&args),
        Command::Mcp(args) => mcp::run(&args),
        Command::Check(args) => check::run(&args),
        Command::Contract(command) => match command {
            contract::ContractCommand::Remote(remote) => client::contracts(&remote),
            local => contract::run(&local),
        },
        Command::Canon(args) => contract::canon(&args),
        Command::Store(StoreCommand::Check(args)) => store::check(&args),
        Command::Reconcile(args) => reconcile::run(&args),
        Command::Approvals { server, command } => client::approvals(&server, &command),
        Command::Ledger { server, command } => client::ledger(&server, &command),
        Command::Keys { server, command } => client::keys(&server, &command),
        Command::Webhooks { server, command } => client::webhooks(&server, &command),
        Command::Inbound { server, command } => client::inbound(&server, &command),
        Command::Tenants { server, command } => client::tenants(&server, &command),
        Command::Console { server, command } => client::console(&server, &command),
        Command::Workflow(command) => workflow::run(&command),
        Command::Runs(command) => client::runs(&command),
    };
    match result {
        Ok(exit) => ExitCode::from(exit as u8),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(Exit::Usage as u8)
        }
    }
}
