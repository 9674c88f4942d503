//! `ringlog`: the one binary. `server` runs a node; `ctl` talks to its
//! control socket; `produce` and `consume` are a command-line client; `sim` replays
//! simulator seeds.

mod cluster_cmd;
mod ctl;
mod groups;
mod io_cmds;
mod server_cmd;
mod sim_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ringlog",
    version,
    about = "ringlog: a partitioned append-only log server (single node today)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node (single node: ./data, 127.0.0.1:7420 by default).
    Server(Box<server_cmd::ServerArgs>),
    /// Query or steer a running node through its control socket.
    Ctl(ctl::CtlArgs),
    /// Append records: lines from stdin, or generated with --count/--size.
    Produce(io_cmds::ProduceArgs),
    /// Read records of every partition (or one) from a start position.
    Consume(io_cmds::ConsumeArgs),
    /// Start or stop a local cluster on 127.0.0.1 (`cluster up --nodes 3`).
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCmd),
    /// Replay seeds of the deterministic cluster simulator.
    Sim(sim_cmd::SimArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Server(a) => server_cmd::run(*a),
        Command::Ctl(a) => ctl::run(a),
        Command::Produce(a) => io_cmds::produce(a),
        Command::Consume(a) => io_cmds::consume(a),
        Command::Cluster(c) => cluster_cmd::run(c),
        Command::Sim(a) => sim_cmd::run(a),
    };
    std::process::exit(code);
}
