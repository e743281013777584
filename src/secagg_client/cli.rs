//! `gpu-ops secagg-client`: one client of a round from the command line, its input a
//! JSON file or standard input, its outcome one line of JSON.

use super::{participate, Connection, DropBefore, Outcome};
use serde_json::json;
use std::time::Duration;

/// `gpu-ops secagg-client`: one client of a round, from the command line.
#[derive(clap::Args, Debug)]
pub struct CliArgs {
    /// The server's base URL.
    #[arg(long, env = "GPU_OPS_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// The round's id (`sar_…`).
    #[arg(long)]
    pub round: String,
    /// A JSON array of `vector_length` numbers; `-` reads standard input.
    #[arg(long)]
    pub input: std::path::PathBuf,
    /// Sent as `Authorization: Bearer …` where the server has --api-keys-file.
    #[arg(long, env = "GPU_OPS_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Stop before this step, as a client that drops out would (demonstrations, tests).
    #[arg(long, value_enum)]
    pub drop_before: Option<DropBefore>,
    /// How long to wait for each stage to close.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub stage_timeout: Duration,
}

/// Runs the CLI client; the outcome as one line of JSON.
pub fn run_cli(args: &CliArgs) -> Result<String, String> {
    let text = if args.input.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("stdin: {e}"))?
    } else {
        std::fs::read_to_string(&args.input)
            .map_err(|e| format!("{}: {e}", args.input.display()))?
    };
    let values: Vec<f32> = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a JSON array of numbers: {e}", args.input.display()))?;
    let mut conn = Connection::new(&args.server);
    conn.api_key = args.api_key.clone();
    conn.stage_timeout = args.stage_timeout;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let outcome = runtime
        .block_on(participate(&conn, &args.round, &values, args.drop_before))
        .map_err(|e| e.to_string())?;
    Ok(match outcome {
        Outcome::Done { client_id } => json!({"client_id": client_id, "outcome": "done"}),
        Outcome::Dropped { client_id } => json!({"client_id": client_id, "outcome": "dropped"}),
        Outcome::LeftBehind { client_id, stage } => {
            json!({"client_id": client_id, "outcome": "left_behind", "stage": stage})
        }
    }
    .to_string())
}
